//! The lease suite's scenarios about failures and payloads (payload
//! fingerprints, attempt limits, final errors), with their handlers; listed
//! in [`scenarios!`](super::lease::scenarios) with the others, so they run
//! on every lease store.

use std::sync::Arc;
use std::time::Duration;

use idem_runtime::store::Status;
use idem_runtime::{Error, Outcome, idempotent};

use super::lease::{Effects, LeaseFixture};
use super::ops::{Ends, OpsError, Reserve, Settled, redeliver, two_payloads};
use super::{Probe, together};

/// The body of the handlers below: counts its run, waits a little (so that
/// concurrent deliveries overlap), applies the effect, and returns `qty`.
async fn reserve_body(
    msg: &Reserve,
    probe: &Probe,
    effects: &dyn Effects,
) -> Result<i64, OpsError> {
    probe.hit();
    tokio::time::sleep(Duration::from_millis(20)).await;
    effects.apply(&msg.order_id).await?;
    Ok(msg.qty)
}

#[idempotent(
    key = "msg.order_id",
    ttl = "1h",
    lease = "1h",
    store = "memory",
    name = "lease_reserve",
    fingerprint = "msg.sku + msg.qty + msg.price + msg.note"
)]
pub(crate) async fn reserve(
    msg: &Reserve,
    probe: &Probe,
    effects: &dyn Effects,
) -> Result<i64, OpsError> {
    reserve_body(msg, probe, effects).await
}

#[idempotent(
    key = "order_id",
    ttl = "1h",
    lease = "1h",
    store = "memory",
    name = "lease_reserve_whole",
    fingerprint = "*"
)]
pub(crate) async fn reserve_whole(msg: &Reserve) -> Result<i64, OpsError> {
    Ok(msg.qty)
}

/// A body that always fails with an error that may pass.
#[idempotent(
    key = "msg.order_id",
    ttl = "1h",
    lease = "1h",
    store = "memory",
    name = "lease_flaky",
    max_attempts = 5
)]
pub(crate) async fn flaky(msg: &Reserve, probe: &Probe) -> Result<i64, OpsError> {
    let run = probe.hit();
    tokio::time::sleep(Duration::from_millis(2)).await;
    Err(OpsError::Unavailable(format!(
        "run {run} for {}",
        msg.order_id
    )))
}

/// A body whose error text is as long as a whole HTTP response.
#[idempotent(
    key = "msg.order_id",
    ttl = "1h",
    lease = "1h",
    store = "memory",
    name = "lease_verbose",
    max_attempts = 2
)]
pub(crate) async fn verbose(msg: &Reserve, probe: &Probe) -> Result<i64, OpsError> {
    probe.hit();
    Err(OpsError::Unavailable(format!(
        "{} said: {}",
        msg.order_id,
        "é".repeat(50_000)
    )))
}

/// A handler allowed one attempt (its claims are taken by hand below).
#[idempotent(
    key = "order_id",
    ttl = "1h",
    lease = "1h",
    store = "memory",
    name = "lease_once",
    max_attempts = 1
)]
pub(crate) async fn once(msg: &Reserve) -> Result<i64, OpsError> {
    Ok(msg.qty)
}

/// A body that refuses its SKU for good, and fails otherwise (the error
/// is final only for `sku == "ghost"`).
#[idempotent(
    key = "msg.order_id",
    ttl = "1h",
    lease = "1h",
    store = "memory",
    name = "lease_unknown"
)]
pub(crate) async fn unknown_sku(msg: &Reserve, probe: &Probe) -> Result<i64, OpsError> {
    probe.hit();
    if msg.sku == "ghost" {
        Err(OpsError::UnknownSku(msg.sku.clone()))
    } else {
        Err(OpsError::Unavailable("try later".into()))
    }
}

/// Concurrent deliveries of one key, half with another payload: the body
/// runs once; deliveries with the first payload get its outcome, the
/// others `PayloadMismatch`, never the outcome and never a run.
pub(crate) async fn deliveries_with_another_payload_are_mismatches_and_run_nothing<
    F: LeaseFixture,
>(
    fx: Arc<F>,
) {
    const N: usize = 24;
    let probe = Probe::new();
    let payload = two_payloads;
    let results = together(N, |i| {
        let (fx, probe, msg) = (Arc::clone(&fx), Arc::clone(&probe), payload(i));
        async move {
            let settled: Settled<i64> =
                redeliver(false, || reserve(fx.store(), &msg, &probe, &*fx)).await;
            (i, settled)
        }
    })
    .await;
    assert_eq!(probe.runs(), 1, "the body ran once");
    assert_eq!(fx.effects("r-1").await, 1);
    let record = fx.record("lease_reserve", &payload(0).key()).await.unwrap();
    assert_eq!(record.status, Status::Completed);
    let winner_fingerprint = record
        .fingerprint
        .clone()
        .expect("the record holds its payload's fingerprint");
    let winner = results
        .iter()
        .find(|(_, r)| matches!(r, Ok(Outcome::Executed(_))))
        .map(|(i, _)| i % 2)
        .expect("one delivery executed");
    for (i, r) in &results {
        match r {
            Ok(Outcome::Executed(2)) | Ok(Outcome::Duplicate(2)) if i % 2 == winner => {}
            Err(Error::PayloadMismatch {
                handler,
                key,
                recorded,
                given,
            }) if i % 2 != winner => {
                assert_eq!((*handler, key.as_str()), ("lease_reserve", "3:r-1"));
                assert_eq!(recorded, &winner_fingerprint);
                assert_ne!(given, recorded);
            }
            other => panic!("delivery {i} (payload {}): {other:?}", i % 2),
        }
    }
    let ends = Ends::of(results.into_iter().map(|(_, r)| r));
    assert_eq!(
        (ends.executed, ends.duplicate, ends.mismatch),
        (1, N / 2 - 1, N / 2),
        "{ends:?}"
    );

    // A `None` part is a value of the fingerprint like any other.
    let mut noted = Reserve::new("r-1", "apple", 2, 9.5);
    noted.note = Some("gift".into());
    let expected_mismatch = winner == 0;
    let out = reserve(fx.store(), &noted, &probe, &*fx).await;
    assert!(matches!(out, Err(Error::PayloadMismatch { .. })), "{out:?}");
    assert!(expected_mismatch || probe.runs() == 1);

    // The whole message as the fingerprint.
    let whole = Reserve::new("r-2", "pear", 1, 3.0);
    assert_eq!(
        reserve_whole(fx.store(), &whole).await.unwrap(),
        Outcome::Executed(1)
    );
    assert_eq!(
        reserve_whole(fx.store(), &whole).await.unwrap(),
        Outcome::Duplicate(1)
    );
    let mut changed = whole.clone();
    changed.note = Some("changed".into());
    assert!(matches!(
        reserve_whole(fx.store(), &changed).await,
        Err(Error::PayloadMismatch { .. })
    ));
}

/// Sixteen consumers deliver one key whose body always fails, each
/// redelivering until it is told to stop: the body runs exactly
/// `max_attempts` times, every consumer ends with `Exhausted`, and the
/// record holds the count and the last error. A later delivery does not
/// run the body either.
pub(crate) async fn failures_are_counted_exactly_under_16_concurrent_consumers<F: LeaseFixture>(
    fx: Arc<F>,
) {
    const CONSUMERS: usize = 16;
    let probe = Probe::new();
    let msg = Reserve::new("f-1", "apple", 1, 1.0);
    let results = together(CONSUMERS, |_| {
        let (fx, probe, msg) = (Arc::clone(&fx), Arc::clone(&probe), msg.clone());
        async move { redeliver(true, || flaky(fx.store(), &msg, &probe)).await }
    })
    .await;
    assert_eq!(probe.runs(), 5, "the body ran max_attempts times");
    for r in &results {
        match r {
            Err(Error::Exhausted {
                handler,
                failures,
                last_error,
                ..
            }) => {
                assert_eq!((*handler, *failures), ("lease_flaky", 5));
                assert_eq!(
                    last_error.as_deref(),
                    Some("warehouse unavailable: run 5 for f-1")
                );
            }
            other => panic!("every consumer is told the key is exhausted: {other:?}"),
        }
    }
    let record = fx.record("lease_flaky", &msg.key()).await.unwrap();
    assert_eq!(
        (record.status, record.failures, record.attempts),
        (Status::Retry, 5, 5),
        "{record:?}"
    );
    // The record keeps the handler's limit: an operator's tool tells the
    // key is exhausted without the handler.
    assert_eq!(record.max_attempts, Some(5), "{record:?}");
    assert_eq!(
        record.last_error.as_deref(),
        Some("warehouse unavailable: run 5 for f-1")
    );
    let again = flaky(fx.store(), &msg, &probe).await;
    assert!(
        matches!(again, Err(Error::Exhausted { failures: 5, .. })),
        "{again:?}"
    );
    assert_eq!(probe.runs(), 5);
}

/// A final error is recorded like an outcome and replayed to every later
/// delivery, decoded, without a run; an error that may pass records
/// nothing (the handler counts no failures) and the next delivery runs.
pub(crate) async fn a_final_error_is_recorded_and_replayed<F: LeaseFixture>(fx: Arc<F>) {
    let probe = Probe::new();
    let ghost = Reserve::new("u-1", "ghost", 1, 1.0);
    match unknown_sku(fx.store(), &ghost, &probe).await {
        Err(Error::Failed {
            error, replayed, ..
        }) => {
            assert_eq!(error, OpsError::UnknownSku("ghost".into()));
            assert!(!replayed);
        }
        other => panic!("a final error: {other:?}"),
    }
    let record = fx.record("lease_unknown", &ghost.key()).await.unwrap();
    assert_eq!(
        (record.status, record.outcome.as_deref(), record.failures),
        (Status::Failed, Some(r#"{"UnknownSku":"ghost"}"#), 1)
    );
    assert_eq!(record.last_error.as_deref(), Some("unknown SKU ghost"));
    let replays = together(8, |_| {
        let (fx, probe, msg) = (Arc::clone(&fx), Arc::clone(&probe), ghost.clone());
        async move { unknown_sku(fx.store(), &msg, &probe).await }
    })
    .await;
    for r in replays {
        match r {
            Err(Error::Failed {
                error, replayed, ..
            }) => {
                assert_eq!(error, OpsError::UnknownSku("ghost".into()));
                assert!(replayed);
            }
            other => panic!("the recorded error comes back: {other:?}"),
        }
    }
    assert_eq!(probe.runs(), 1, "replays do not run the body");

    // Not final: nothing recorded, the redelivery runs.
    let busy = Reserve::new("u-2", "apple", 1, 1.0);
    for run in 2..=3 {
        assert!(matches!(
            unknown_sku(fx.store(), &busy, &probe).await,
            Err(Error::Handler { .. })
        ));
        assert_eq!(probe.runs(), run);
    }
    assert!(fx.record("lease_unknown", &busy.key()).await.is_none());
}

/// A claim whose lease ran out (its consumer stopped inside the body)
/// counts as a failure of the key: with `max_attempts = 5`, four failures
/// and one stalled consumer exhaust it.
pub(crate) async fn a_claim_whose_lease_ran_out_counts_as_a_failure<F: LeaseFixture>(fx: Arc<F>) {
    use idem_runtime::store::{Claim, LeaseStore};
    let probe = Probe::new();
    let msg = Reserve::new("s-1", "apple", 1, 1.0);
    for _ in 0..4 {
        assert!(matches!(
            flaky(fx.store(), &msg, &probe).await,
            Err(Error::Handler { .. })
        ));
    }
    // A consumer claims and stops: its lease runs out.
    let spec = idem_runtime::registry::find("lease_flaky").unwrap();
    let Claim::Fresh { .. } = fx.store().claim(spec, &msg.key(), None).await.unwrap() else {
        panic!("the fifth delivery claims the key");
    };
    fx.run_out_lease("lease_flaky", &msg.key()).await;
    match flaky(fx.store(), &msg, &probe).await {
        // The takeover counted the stalled claim: five failures.
        Err(Error::Exhausted {
            failures,
            last_error,
            ..
        }) => {
            assert_eq!(failures, 5);
            assert_eq!(
                last_error.as_deref(),
                Some(idem_runtime::store::LEASE_RAN_OUT)
            );
        }
        // A store that deletes a claim when its lease runs out keeps its
        // count for the ttl instead (Redis): the record says so.
        other => panic!("the stalled claim counts: {other:?}"),
    }
    assert_eq!(probe.runs(), 4);
    let record = fx.record("lease_flaky", &msg.key()).await.unwrap();
    assert_eq!(
        (record.status, record.failures, record.max_attempts),
        (Status::Retry, 5, Some(5)),
        "the stall exhausted the key, and the record says so: {record:?}"
    );

    // A first claim that stalls counts too: the next delivery runs as the
    // second attempt, one failure on record.
    let first = Reserve::new("s-2", "apple", 1, 1.0);
    let Claim::Fresh { .. } = fx.store().claim(spec, &first.key(), None).await.unwrap() else {
        panic!("a fresh key is claimed");
    };
    fx.run_out_lease("lease_flaky", &first.key()).await;
    assert!(matches!(
        flaky(fx.store(), &first, &probe).await,
        Err(Error::Handler { .. })
    ));
    let record = fx.record("lease_flaky", &first.key()).await.unwrap();
    assert_eq!(
        (record.status, record.attempts, record.failures),
        (Status::Retry, 2, 2),
        "the stall and the failed body: {record:?}"
    );
}

/// A stalled claim counted as the last failure allowed keeps its token: if
/// its body finishes after all, its outcome is recorded, not lost.
pub(crate) async fn a_stalled_last_attempt_that_finishes_is_recorded<F: LeaseFixture>(fx: Arc<F>) {
    use idem_runtime::store::{Claim, LeaseStore};
    let msg = Reserve::new("l-1", "apple", 7, 1.0);
    let spec = idem_runtime::registry::find("lease_once").unwrap();
    let Claim::Fresh { token } = fx.store().claim(spec, &msg.key(), None).await.unwrap() else {
        panic!("the only attempt claims the key");
    };
    fx.run_out_lease("lease_once", &msg.key()).await;
    // Another delivery finds the stall, the last failure allowed.
    assert!(matches!(
        once(fx.store(), &msg).await,
        Err(Error::Exhausted { failures: 1, .. })
    ));
    // The stalled body finishes: its outcome is recorded.
    assert!(
        fx.store()
            .complete(spec, &msg.key(), &token, "7")
            .await
            .unwrap()
    );
    assert_eq!(once(fx.store(), &msg).await.unwrap(), Outcome::Duplicate(7));
}

/// An error text as long as a whole HTTP response is cut, not refused by
/// the store, and the failure is counted.
pub(crate) async fn a_huge_error_text_is_cut_and_counted<F: LeaseFixture>(fx: Arc<F>) {
    let probe = Probe::new();
    let msg = Reserve::new("v-1", "apple", 1, 1.0);
    for _ in 0..2 {
        assert!(matches!(
            verbose(fx.store(), &msg, &probe).await,
            Err(Error::Handler { .. })
        ));
    }
    let record = fx.record("lease_verbose", &msg.key()).await.unwrap();
    let text = record.last_error.expect("the last error is kept");
    assert!(text.len() <= 4_096, "{}", text.len());
    assert!(
        text.starts_with("warehouse unavailable: v-1 said: éé"),
        "{text:.40}"
    );
    assert!(text.ends_with('…'));
    assert_eq!((record.status, record.failures), (Status::Retry, 2));
    assert!(matches!(
        verbose(fx.store(), &msg, &probe).await,
        Err(Error::Exhausted { failures: 2, .. })
    ));
    assert_eq!(probe.runs(), 2);
}

/// A settled record (completed, failed for good, waiting for a retry)
/// reads back the same, expiry included, read after read, and it ends a
/// ttl after it was last written: exactly, by the store's clock; on Redis,
/// by the server's (here the same machine's), which the Redis store
/// scenarios check against the key's own expiry.
pub(crate) async fn a_settled_record_reads_back_the_same_expiry_each_time<F: LeaseFixture>(
    fx: Arc<F>,
) {
    let probe = Probe::new();
    let done = super::lease::Job::new("ends-1", 3);
    let out = super::lease::job(fx.store(), &done, &probe, &*fx).await;
    assert_eq!(out.unwrap(), Outcome::Executed(3));
    let ghost = Reserve::new("ends-2", "ghost", 1, 1.0);
    let failed = unknown_sku(fx.store(), &ghost, &probe).await;
    assert!(matches!(failed, Err(Error::Failed { .. })), "{failed:?}");
    let retry = Reserve::new("ends-3", "apple", 1, 1.0);
    let counted = flaky(fx.store(), &retry, &probe).await;
    assert!(matches!(counted, Err(Error::Handler { .. })), "{counted:?}");

    let ttl = 3_600_000;
    for (handler, key, status) in [
        (super::lease::JOB, done.key(), Status::Completed),
        ("lease_unknown", ghost.key(), Status::Failed),
        ("lease_flaky", retry.key(), Status::Retry),
    ] {
        let first = fx.record(handler, &key).await.expect("a record");
        assert_eq!(first.status, status, "{first:?}");
        let off = first.expires_at_ms - (first.updated_at_ms + ttl);
        if F::DELETES_EXPIRED {
            assert!(off.abs() <= 1_000, "the ttl from the last write: {first:?}");
        } else {
            assert_eq!(off, 0, "the ttl from the last write: {first:?}");
        }
        for _ in 0..5 {
            tokio::time::sleep(Duration::from_millis(7)).await;
            let again = fx.record(handler, &key).await.expect("a record");
            assert_eq!(again, first, "two reads of an untouched record");
        }
    }
}
