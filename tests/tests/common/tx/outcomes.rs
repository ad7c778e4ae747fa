//! The transaction suite's scenarios about what is recorded and derived:
//! the ttl running out, an outcome that no longer decodes or does not
//! encode, a key part that is `None`, a store built from the application's
//! pool.

use std::time::Duration;

use idem_runtime::clock::TimeShift;
use idem_runtime::{Error, Outcome, Status};
use idem_tests::or_skip;

use super::{Deducted, Open, OrderPlaced, Refund, StoreKind, TxHandlers};
use crate::common::Probe;

pub(crate) async fn after_the_ttl_the_key_runs_again<F: TxHandlers>(kind: StoreKind) {
    let db = or_skip!(F::open(kind, Open::Shifted(TimeShift::new())).await);
    let shift = db.shift().expect("opened on a shift").clone();
    db.stock_up("kiwi", 100).await;
    let probe = Probe::new();
    let msg = OrderPlaced::new("o-5", "kiwi", 10);

    let before = db.now_ms().await;
    let out = db.deduct(db.store(), &msg, &probe).await.unwrap();
    let after = db.now_ms().await;
    assert!(out.is_executed());
    let rec = db.record(F::DEDUCT, &msg.key()).await.unwrap();
    assert!((before..=after).contains(&rec.created_at_ms), "{rec:?}");
    assert!(
        (rec.created_at_ms..=after).contains(&rec.updated_at_ms),
        "{rec:?}"
    );
    assert_eq!(rec.expires_at_ms, rec.updated_at_ms + 3_600_000);

    // The database's time runs on between the statements: the moments are
    // placed a margin from the ttl's end, not to the millisecond.
    let margin = Duration::from_secs(2);
    // Just before the ttl: still a duplicate.
    let left = u64::try_from(rec.expires_at_ms - db.now_ms().await).unwrap();
    shift.advance(Duration::from_millis(left) - margin);
    let out = db.deduct(db.store(), &msg, &probe).await.unwrap();
    assert!(out.is_duplicate());
    assert_eq!(probe.runs(), kind.body_runs(1, 1));

    // Past the ttl the record stops suppressing the key.
    shift.advance(margin);
    let before = db.now_ms().await;
    let out = db.deduct(db.store(), &msg, &probe).await.unwrap();
    let after = db.now_ms().await;
    assert_eq!(
        out,
        Outcome::Executed(Deducted {
            order_id: "o-5".into(),
            stock_left: 80
        })
    );
    assert_eq!(probe.runs(), kind.body_runs(2, 1));
    assert_eq!(db.stock("kiwi").await, 80);
    assert_eq!(db.ledger_rows("o-5").await, 2);

    // The new window starts now, with one record and a fresh attempt count.
    let rec = db.record(F::DEDUCT, &msg.key()).await.unwrap();
    assert_eq!(rec.status, Status::Completed);
    assert_eq!(rec.attempts, 1);
    assert!((before..=after).contains(&rec.created_at_ms), "{rec:?}");
    assert!(
        (rec.created_at_ms..=after).contains(&rec.updated_at_ms),
        "{rec:?}"
    );
    assert_eq!(rec.expires_at_ms, rec.updated_at_ms + 3_600_000);
    assert_eq!(db.records().await, 1);
    let out = db.deduct(db.store(), &msg, &probe).await.unwrap();
    assert!(out.is_duplicate());
    assert_eq!(probe.runs(), kind.body_runs(2, 2));
    assert_eq!(db.stock("kiwi").await, 80);
}

pub(crate) async fn stored_outcome_that_no_longer_decodes_is_a_codec_error<F: TxHandlers>(
    kind: StoreKind,
) {
    let db = or_skip!(F::open(kind, Open::Plain).await);
    db.stock_up("lime", 10).await;
    let probe = Probe::new();
    let msg = OrderPlaced::new("o-6", "lime", 1);
    let out = db.deduct(db.store(), &msg, &probe).await.unwrap();
    assert!(out.is_executed());

    // As if the return type had changed since the record was written.
    let n = db
        .set_outcome(F::DEDUCT, r#"{"sku":"lime","left":9}"#)
        .await;
    assert_eq!(n, 1);

    let err = db.deduct(db.store(), &msg, &probe).await.unwrap_err();
    match &err {
        Error::Codec { handler, key, .. } => {
            assert_eq!(*handler, F::DEDUCT);
            assert_eq!(key, &msg.key());
        }
        other => panic!("expected Error::Codec, got {other:?}"),
    }
    assert!(err.to_string().contains(F::DEDUCT), "{err}");
    // Claim-last finds the record only after the body; its writes rolled
    // back with the transaction.
    assert_eq!(
        probe.runs(),
        kind.body_runs(1, 1),
        "{kind:?}: a codec failure must not run the body (claim-last: must roll it back)"
    );
    assert_eq!(db.stock("lime").await, 9);
    assert_eq!(db.ledger_rows("o-6").await, 1);
}

pub(crate) async fn outcome_that_does_not_encode_rolls_back_and_is_unrecordable<F: TxHandlers>(
    kind: StoreKind,
) {
    let db = or_skip!(F::open(kind, Open::Plain).await);
    let probe = Probe::new();
    let msg = OrderPlaced::new("o-7", "none", 1);

    for run in 1..=2 {
        let err = db.deduct_unencodable(&msg, &probe).await.unwrap_err();
        assert!(matches!(err, Error::Unrecordable { .. }), "{err:?}");
        // Nothing was committed, so the redelivery runs again.
        assert_eq!(probe.runs(), run);
        assert_eq!(db.ledger_len().await, 0);
        assert_eq!(db.records().await, 0);
    }
}

pub(crate) async fn none_key_part_is_key_missing_and_the_body_does_not_run<F: TxHandlers>(
    kind: StoreKind,
) {
    let db = or_skip!(F::open(kind, Open::Plain).await);
    let probe = Probe::new();
    let msg = Refund {
        order_id: "o-8".into(),
        coupon: None,
    };

    let err = db.refund(&msg, &probe).await.unwrap_err();
    match &err {
        Error::KeyMissing { handler, part } => {
            assert_eq!(*handler, F::REFUND);
            assert_eq!(*part, "msg.coupon");
        }
        other => panic!("expected Error::KeyMissing, got {other:?}"),
    }
    assert!(err.to_string().contains("msg.coupon"), "{err}");
    assert_eq!(probe.runs(), 0);
    assert_eq!(db.ledger_len().await, 0);
    assert_eq!(db.records().await, 0);

    let msg = Refund {
        coupon: Some("C-1".into()),
        ..msg
    };
    assert_eq!(
        db.refund(&msg, &probe).await.unwrap(),
        Outcome::Executed(())
    );
    assert_eq!(
        db.refund(&msg, &probe).await.unwrap(),
        Outcome::Duplicate(())
    );
    assert_eq!(probe.runs(), kind.body_runs(1, 1));
    assert_eq!(db.ledger_rows("o-8").await, 1);
}

pub(crate) async fn handler_runs_on_a_store_built_from_the_applications_pool<F: TxHandlers>(
    kind: StoreKind,
) {
    // The application's own pool: business tables and dedup table share it.
    let db = or_skip!(F::open(kind, Open::AppPool).await);
    db.stock_up("date", 5).await;
    let probe = Probe::new();
    let msg = OrderPlaced::new("o-9", "date", 2);
    let out = db.deduct(db.store(), &msg, &probe).await.unwrap();
    assert!(out.is_executed());
    let out = db.deduct(db.store(), &msg, &probe).await.unwrap();
    assert!(out.is_duplicate());
    let stock = db.stock("date").await;
    assert_eq!((probe.runs(), stock), (kind.body_runs(1, 1), 3));
}
