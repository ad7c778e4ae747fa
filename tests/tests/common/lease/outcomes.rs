//! The lease suite's scenarios about what is recorded and derived: an
//! outcome that no longer decodes, one that cannot be recorded, a key part
//! that is `None`, the key the body reads.

use std::sync::Arc;
use std::time::Duration;

use idem_runtime::store::{Claim, LeaseStore as _, Status};
use idem_runtime::{Error, Key, Outcome};

use super::{
    Job, LOPSIDED, LeaseFixture, POINTS, RATIO, SMS, Sms, assert_expires_in, grant_lopsided,
    grant_points, grant_ratio, send_sms,
};
use crate::common::{Probe, together};

/// A recorded outcome that no longer decodes into the return type (an
/// earlier deployment's, written here through the store's own claim and
/// completion) is a `Codec` error naming the key; the body does not run.
pub(crate) async fn stored_outcome_that_no_longer_decodes_is_a_codec_error<F: LeaseFixture>(
    fx: Arc<F>,
) {
    let probe = Probe::new();
    let msg = Job::new("j-11", 6);
    let spec = idem_runtime::registry::find(POINTS).expect("registered");
    let key = msg.key();
    let Claim::Fresh { token } = fx.store().claim(spec, &key, None).await.unwrap() else {
        panic!("a fresh key")
    };
    let completed = fx.store().complete(spec, &key, &token, "\"points-v1\"");
    assert!(completed.await.unwrap());

    let err = grant_points(fx.store(), &msg, &probe).await.unwrap_err();
    assert!(
        matches!(&err, Error::Codec { handler: POINTS, key, .. } if *key == msg.key()),
        "{err:?}"
    );
    assert!(err.to_string().contains(POINTS), "{err}");
    assert_eq!(probe.runs(), 0, "a codec failure must not run the body");
    let rec = fx.record(POINTS, &msg.key()).await.unwrap();
    assert_eq!(
        rec.outcome.as_deref(),
        Some("\"points-v1\""),
        "left as it was"
    );
}

/// The body succeeded, so its effect happened, but its value cannot be
/// recorded (it would not read back; a NaN float): the call is
/// `Unrecordable` naming what serde said, and the key is settled as failed
/// for the ttl with the reason, so no delivery runs the body again: each
/// gets `Unrecordable` from the record, with the same reason, though the
/// handler's error type has no final errors. Once the ttl is over, the key
/// runs again.
pub(crate) async fn an_unrecordable_result_settles_the_key_and_deliveries_get_unrecordable<
    F: LeaseFixture,
>(
    fx: Arc<F>,
) {
    let probe = Probe::new();
    let msg = Job::new("j-13", 6);
    let err = grant_lopsided(fx.store(), &msg, &probe).await.unwrap_err();
    let reason = match &err {
        Error::Unrecordable {
            handler: LOPSIDED,
            key,
            source,
        } => {
            assert_eq!(*key, msg.key());
            let reason = source.to_string();
            assert!(reason.contains("would not read back"), "{reason}");
            reason
        }
        other => panic!("expected Unrecordable, got {other:?}"),
    };
    let rec = fx.record(LOPSIDED, &msg.key()).await.expect("a record");
    assert_eq!((rec.status, rec.failures), (Status::Failed, 1), "{rec:?}");
    assert_eq!(rec.unrecordable().as_deref(), Some(reason.as_str()));
    assert_eq!(
        rec.last_error,
        Some(format!(
            "the body took effect, but its result cannot be recorded: {reason}"
        ))
    );
    assert_expires_in(&*fx, &rec, Duration::from_secs(3_600)).await;
    let again = together(8, |_| {
        let (fx, probe, msg) = (Arc::clone(&fx), Arc::clone(&probe), msg.clone());
        async move { grant_lopsided(fx.store(), &msg, &probe).await }
    })
    .await;
    for r in again {
        match r {
            Err(Error::Unrecordable {
                handler: LOPSIDED,
                key,
                source,
            }) => {
                assert_eq!(key, msg.key());
                assert_eq!(source.to_string(), reason, "the recorded reason");
            }
            other => panic!("expected Unrecordable from the record, got {other:?}"),
        }
    }
    assert_eq!(probe.runs(), 1, "no delivery ran the body again");

    // A NaN, with a ttl of a second: settled, then free again after it.
    let nan = Job::new("j-14", 0);
    for run in 1..=2 {
        let first = match grant_ratio(fx.store(), &nan, &probe).await {
            Err(Error::Unrecordable { source, .. }) => source.to_string(),
            other => panic!("expected Unrecordable, got {other:?}"),
        };
        assert!(first.contains("NaN"), "{first}");
        match grant_ratio(fx.store(), &nan, &probe).await {
            Err(Error::Unrecordable { source, .. }) => assert_eq!(source.to_string(), first),
            other => panic!("expected Unrecordable from the record, got {other:?}"),
        }
        assert_eq!(probe.runs(), 1 + run, "the body ran once per window");
        let rec = fx.record(RATIO, &nan.key()).await.expect("a record");
        assert_eq!(rec.status, Status::Failed, "{rec:?}");
        assert!(
            rec.unrecordable().is_some_and(|why| why.contains("NaN")),
            "{rec:?}"
        );
        fx.advance(Duration::from_secs(1) + fx.slack()).await;
    }
}

/// A `None` key part: `KeyMissing`, no body, nothing written; with the part
/// present the handler runs once.
pub(crate) async fn none_key_part_is_key_missing_and_the_body_does_not_run<F: LeaseFixture>(
    fx: Arc<F>,
) {
    let probe = Probe::new();
    let msg = Sms {
        phone: None,
        template: "welcome",
    };
    let err = send_sms(fx.store(), &msg, &probe).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::KeyMissing {
                handler: SMS,
                part: "msg.phone"
            }
        ),
        "{err:?}"
    );
    assert!(err.key().is_none());
    assert!(err.to_string().contains("msg.phone"), "{err}");
    assert_eq!(probe.runs(), 0);
    assert_eq!(fx.records().await, 0);

    let msg = Sms {
        phone: Some("+200".into()),
        ..msg
    };
    assert!(
        send_sms(fx.store(), &msg, &probe)
            .await
            .unwrap()
            .is_executed()
    );
    assert!(
        send_sms(fx.store(), &msg, &probe)
            .await
            .unwrap()
            .is_duplicate()
    );
    assert_eq!(probe.runs(), 1);
}

/// The body reads its own derived key (to pass on to an external call); it
/// is the key the record is stored under.
pub(crate) async fn body_reads_its_own_key<F: LeaseFixture>(fx: Arc<F>) {
    let probe = Probe::new();
    let msg = Sms {
        phone: Some("+100".into()),
        template: "welcome",
    };
    let key = Key::from_parts(&[&"sms", &"welcome", &"+100"]).unwrap();
    assert_eq!(
        send_sms(fx.store(), &msg, &probe).await.unwrap(),
        Outcome::Executed("sent welcome".to_owned())
    );
    assert_eq!(probe.seen(), [key.as_str()]);
    let rec = fx.record(SMS, &key).await.expect("recorded under that key");
    assert_eq!(rec.key, key.as_str());
    assert!(
        send_sms(fx.store(), &msg, &probe)
            .await
            .unwrap()
            .is_duplicate()
    );
    assert_eq!(probe.runs(), 1);
}
