//! The transaction suite's scenarios about failures and payloads (payload
//! fingerprints, attempt limits, final errors); listed in
//! [`suite!`](super::tx::suite) with the others, so they run on every SQL
//! store and claim order. The handlers are in [`handlers!`](super::tx::handlers).

use std::sync::Arc;

use idem_runtime::{Error, Outcome, Status};
use idem_tests::or_skip;

use super::ops::{Ends, OpsError, Reserve, redeliver, two_payloads};
use super::tx::{Open, StoreKind, TxHandlers};
use super::{Probe, together};

/// Concurrent deliveries of one key, half with another payload: one
/// commits its ledger row; deliveries with its payload get its outcome, the
/// others `PayloadMismatch`. Claiming last, every delivery's body runs and
/// all but one roll back; claiming first, only one body runs.
pub(crate) async fn deliveries_with_another_payload_are_mismatches<F: TxHandlers>(kind: StoreKind) {
    const N: usize = 16;
    let db = Arc::new(or_skip!(F::open(kind, Open::Plain).await));
    let probe = Probe::new();
    let payload = two_payloads;
    let results = together(N, |i| {
        let (db, probe, msg) = (Arc::clone(&db), Arc::clone(&probe), payload(i));
        async move {
            let store = db.store().clone();
            (
                i,
                redeliver(false, || db.reserve(&store, &msg, &probe)).await,
            )
        }
    })
    .await;
    let winner = results
        .iter()
        .find(|(_, r)| matches!(r, Ok(Outcome::Executed(_))))
        .map(|(i, _)| i % 2)
        .expect("one delivery executed");
    let record = db.record(F::RESERVE, &payload(0).key()).await.unwrap();
    assert_eq!(record.status, Status::Completed);
    let recorded_fingerprint = record.fingerprint.clone().expect("a fingerprint");
    for (i, r) in &results {
        match r {
            Ok(Outcome::Executed(2) | Outcome::Duplicate(2)) if i % 2 == winner => {}
            Err(Error::PayloadMismatch {
                recorded, given, ..
            }) if i % 2 != winner => {
                assert_eq!(recorded, &recorded_fingerprint);
                assert_ne!(given, recorded);
            }
            other => panic!("{kind:?}: delivery {i} (payload {}): {other:?}", i % 2),
        }
    }
    let ends = Ends::of(results.into_iter().map(|(_, r)| r));
    assert_eq!(
        (ends.executed, ends.duplicate, ends.mismatch),
        (1, N / 2 - 1, N / 2),
        "{kind:?}: {ends:?}"
    );
    assert_eq!(db.ledger_rows("r-1").await, 1, "{kind:?}");
    assert!(
        kind.racing_body_runs(1, N - 1).contains(&probe.runs()),
        "{kind:?}: {} body runs",
        probe.runs()
    );
}

/// Deliveries that come once a key is settled, one by one: the same
/// payload gets the outcome, another payload `PayloadMismatch`, and a key
/// settled by a final error gets it back. Whether their bodies ran is what
/// the store's claim order says (only `ClaimOrder::Last` runs them, and
/// rolls them back), and no error's message claims otherwise.
pub(crate) async fn a_settled_key_runs_no_body_but_claiming_last<F: TxHandlers>(kind: StoreKind) {
    let db = or_skip!(F::open(kind, Open::Plain).await);
    let probe = Probe::new();
    let first = Reserve::new("s-1", "apple", 2, 9.5);
    let out = db.reserve(db.store(), &first, &probe).await.unwrap();
    assert!(out.is_executed(), "{kind:?}: {out:?}");
    assert!(
        db.reserve(db.store(), &first, &probe)
            .await
            .unwrap()
            .is_duplicate()
    );
    assert_eq!(probe.runs(), kind.body_runs(1, 1), "{kind:?}: a duplicate");

    let other = Reserve::new("s-1", "apple", 2, 9.75);
    let err = db.reserve(db.store(), &other, &probe).await.unwrap_err();
    assert!(
        matches!(err, Error::PayloadMismatch { .. }),
        "{kind:?}: {err:?}"
    );
    assert_eq!(probe.runs(), kind.body_runs(1, 2), "{kind:?}: a mismatch");
    let text = err.to_string();
    assert!(!text.contains("did not run"), "{kind:?}: {text}");
    assert!(
        text.contains("nothing of this delivery was committed"),
        "{text}"
    );

    let ghost = Reserve::new("s-2", "ghost", 1, 1.0);
    let failed = |r: Result<Outcome<i64>, Error<OpsError>>| match r {
        Err(Error::Failed { replayed, .. }) => replayed,
        other => panic!("{kind:?}: a final error: {other:?}"),
    };
    assert!(!failed(db.unknown_sku(db.store(), &ghost, &probe).await));
    assert!(failed(db.unknown_sku(db.store(), &ghost, &probe).await));
    assert_eq!(
        probe.runs(),
        kind.body_runs(1, 2) + kind.body_runs(1, 1),
        "{kind:?}: a replayed final error"
    );
    // Whatever ran, nothing of the turned-away deliveries was committed.
    assert_eq!(db.ledger_rows("s-1").await, 1);
    assert_eq!(db.ledger_rows("s-2").await, 0);
}

/// Sixteen consumers deliver one key whose body writes a ledger row and
/// fails, each redelivering until told to stop: the body runs exactly
/// `max_attempts` times (whatever the store's claim order: such a handler
/// claims first), every failed body's writes are rolled back, every
/// consumer ends with `Exhausted`, and the record holds the count and the
/// last error.
pub(crate) async fn failures_are_counted_exactly_under_16_concurrent_consumers<F: TxHandlers>(
    kind: StoreKind,
) {
    const CONSUMERS: usize = 16;
    let db = Arc::new(or_skip!(F::open(kind, Open::Plain).await));
    let probe = Probe::new();
    let msg = Reserve::new("f-1", "apple", 1, 1.0);
    let results = together(CONSUMERS, |_| {
        let (db, probe, msg) = (Arc::clone(&db), Arc::clone(&probe), msg.clone());
        async move {
            let store = db.store().clone();
            redeliver(true, || db.flaky(&store, &msg, &probe)).await
        }
    })
    .await;
    assert_eq!(probe.runs(), 5, "{kind:?}: the body ran max_attempts times");
    for r in &results {
        match r {
            Err(Error::Exhausted {
                failures,
                last_error,
                ..
            }) => {
                assert_eq!(*failures, 5);
                assert_eq!(
                    last_error.as_deref(),
                    Some("warehouse unavailable: run 5 for f-1")
                );
            }
            other => panic!("{kind:?}: every consumer is told the key is exhausted: {other:?}"),
        }
    }
    assert_eq!(
        db.ledger_rows("f-1").await,
        0,
        "{kind:?}: every failure rolled back"
    );
    let record = db.record(F::FLAKY, &msg.key()).await.unwrap();
    assert_eq!(
        (
            record.status,
            record.failures,
            record.attempts,
            record.max_attempts
        ),
        (Status::Retry, 5, 5, Some(5)),
        "{kind:?}: {record:?}"
    );
    let again = db.flaky(db.store(), &msg, &probe).await;
    assert!(
        matches!(again, Err(Error::Exhausted { failures: 5, .. })),
        "{again:?}"
    );
    assert_eq!(probe.runs(), 5);
}

/// A final error rolls the body's writes back and is recorded like an
/// outcome; every later delivery gets it back, decoded. An error that may
/// pass records nothing and the redelivery runs.
pub(crate) async fn a_final_error_rolls_back_and_is_replayed<F: TxHandlers>(kind: StoreKind) {
    const REPLAYS: usize = 8;
    let db = Arc::new(or_skip!(F::open(kind, Open::Plain).await));
    let probe = Probe::new();
    let ghost = Reserve::new("u-1", "ghost", 1, 1.0);
    match db.unknown_sku(db.store(), &ghost, &probe).await {
        Err(Error::Failed {
            error, replayed, ..
        }) => {
            assert_eq!(error, OpsError::UnknownSku("ghost".into()));
            assert!(!replayed);
        }
        other => panic!("{kind:?}: a final error: {other:?}"),
    }
    assert_eq!(db.ledger_rows("u-1").await, 0, "{kind:?}: rolled back");
    let record = db.record(F::UNKNOWN, &ghost.key()).await.unwrap();
    assert_eq!(
        (record.status, record.outcome.as_deref(), record.failures),
        (Status::Failed, Some(r#"{"UnknownSku":"ghost"}"#), 1),
        "{kind:?}"
    );
    assert_eq!(record.last_error.as_deref(), Some("unknown SKU ghost"));

    let replays = together(REPLAYS, |_| {
        let (db, probe, msg) = (Arc::clone(&db), Arc::clone(&probe), ghost.clone());
        async move {
            let store = db.store().clone();
            redeliver(false, || db.unknown_sku(&store, &msg, &probe)).await
        }
    })
    .await;
    for r in replays {
        match r {
            Err(Error::Failed {
                error, replayed, ..
            }) => {
                assert_eq!(error, OpsError::UnknownSku("ghost".into()));
                assert!(replayed, "{kind:?}");
            }
            other => panic!("{kind:?}: the recorded error comes back: {other:?}"),
        }
    }
    assert_eq!(probe.runs(), kind.body_runs(1, REPLAYS), "{kind:?}");
    assert_eq!(db.ledger_rows("u-1").await, 0);

    // Not final: nothing recorded, the redelivery runs.
    let busy = Reserve::new("u-2", "apple", 1, 1.0);
    let before = probe.runs();
    for run in 1..=2 {
        assert!(matches!(
            db.unknown_sku(db.store(), &busy, &probe).await,
            Err(Error::Handler { .. })
        ));
        assert_eq!(probe.runs(), before + run);
    }
    assert!(db.record(F::UNKNOWN, &busy.key()).await.is_none());
    assert_eq!(db.ledger_rows("u-2").await, 0);
}
