//! The transaction suite's scenarios about a claim and its duplicates: the
//! first delivery, duplicates, a failed body's rollback and retry,
//! concurrent deliveries and consumers, and a delivery waiting on an open
//! first delivery.

use std::sync::Arc;
use std::time::Duration;

use idem_runtime::{Contention, Error, Outcome, Status, StoreError};
use idem_tests::or_skip;

use super::{Deducted, Open, OrderPlaced, StoreKind, TxHandlers, Waited, deliver_together};
use crate::common::{AppError, Probe, Tally};

pub(crate) async fn first_delivery_executes_and_commits_claim_outcome_and_business_writes<
    F: TxHandlers,
>(
    kind: StoreKind,
) {
    let db = or_skip!(F::open(kind, Open::Plain).await);
    db.stock_up("apple", 10).await;
    let probe = Probe::new();
    let msg = OrderPlaced::new("o-1", "apple", 3);

    let out = db.deduct(db.store(), &msg, &probe).await.unwrap();

    let expected = Deducted {
        order_id: "o-1".into(),
        stock_left: 7,
    };
    assert_eq!(out, Outcome::Executed(expected.clone()));
    assert_eq!(probe.runs(), 1);
    assert_eq!(db.stock("apple").await, 7);
    assert_eq!(db.ledger_rows("o-1").await, 1);

    let rec = db
        .record(F::DEDUCT, &msg.key())
        .await
        .expect("a record after the commit");
    assert_eq!(rec.status, Status::Completed);
    assert_eq!(rec.attempts, 1);
    let stored: Deducted = serde_json::from_str(rec.outcome.as_deref().unwrap()).unwrap();
    assert_eq!(stored, expected);
    assert_eq!(rec.handler, F::DEDUCT);
    assert_eq!(rec.key, "3:o-1|5:apple");
    assert!(rec.expires_at_ms >= rec.updated_at_ms + 3_600_000);
}

pub(crate) async fn duplicate_returns_recorded_outcome_and_applies_nothing_again<F: TxHandlers>(
    kind: StoreKind,
) {
    let db = or_skip!(F::open(kind, Open::Plain).await);
    db.stock_up("apple", 10).await;
    let probe = Probe::new();
    let msg = OrderPlaced::new("o-2", "apple", 4);
    let first = db.deduct(db.store(), &msg, &probe).await.unwrap();
    assert!(first.is_executed());

    for _ in 0..5 {
        let again = db.deduct(db.store(), &msg, &probe).await.unwrap();
        assert_eq!(again, Outcome::Duplicate(first.value().clone()));
    }
    // The redelivery carries another quantity: still the recorded result,
    // and still no second deduction.
    let changed = OrderPlaced::new("o-2", "apple", 9);
    let again = db.deduct(db.store(), &changed, &probe).await.unwrap();
    assert_eq!(again, Outcome::Duplicate(first.value().clone()));

    // SQLite and claim-first: the body ran once. Claim-last: the six
    // duplicates ran their bodies too, and rolled them back.
    assert_eq!(probe.runs(), kind.body_runs(1, 6), "{kind:?}");
    assert_eq!(db.stock("apple").await, 6);
    assert_eq!(db.ledger_rows("o-2").await, 1);
    assert_eq!(db.records().await, 1);
}

pub(crate) async fn body_error_rolls_back_claim_and_business_writes_and_the_retry_executes<
    F: TxHandlers,
>(
    kind: StoreKind,
) {
    let db = or_skip!(F::open(kind, Open::Plain).await);
    db.stock_up("pear", 10).await;
    let probe = Probe::new();
    let failing = OrderPlaced {
        fail: true,
        ..OrderPlaced::new("o-3", "pear", 2)
    };

    let err = db.deduct(db.store(), &failing, &probe).await.unwrap_err();
    assert_eq!(err.handler(), F::DEDUCT);
    assert_eq!(err.key(), Some(&failing.key()));
    match err {
        Error::Handler {
            error: AppError::Refused(m),
            ..
        } => assert_eq!(m, "order o-3 refused"),
        other => panic!("expected Error::Handler, got {other:?}"),
    }
    assert_eq!(probe.runs(), 1);
    // The body had updated inventory and inserted a ledger row: both gone,
    // and so is the claim.
    assert_eq!(db.stock("pear").await, 10);
    assert_eq!(db.ledger_len().await, 0);
    assert_eq!(db.records().await, 0);
    assert!(db.record(F::DEDUCT, &failing.key()).await.is_none());

    // The redelivery (now succeeding) runs the body again and commits.
    let retry = OrderPlaced::new("o-3", "pear", 2);
    let out = db.deduct(db.store(), &retry, &probe).await.unwrap();
    assert_eq!(
        out,
        Outcome::Executed(Deducted {
            order_id: "o-3".into(),
            stock_left: 8
        })
    );
    assert_eq!(probe.runs(), 2);
    assert_eq!(db.stock("pear").await, 8);
    assert_eq!(db.ledger_rows("o-3").await, 1);
    let rec = db.record(F::DEDUCT, &retry.key()).await.unwrap();
    assert_eq!((rec.status, rec.attempts), (Status::Completed, 1));
}

pub(crate) async fn concurrent_deliveries_of_one_message_execute_exactly_once<F: TxHandlers>(
    kind: StoreKind,
) {
    const N: usize = 64;
    let db = Arc::new(or_skip!(F::open(kind, Open::Plain).await));
    db.stock_up("plum", 1_000).await;
    let probe = Probe::new();
    let msg = OrderPlaced::new("o-4", "plum", 5);

    let results = deliver_together(&db, &probe, N, |_| (db.store().clone(), msg.clone())).await;

    let values: Vec<Deducted> = results
        .iter()
        .filter_map(|r| r.as_ref().ok().map(|o| o.value().clone()))
        .collect();
    let tally = Tally::of(results);
    eprintln!(
        "{kind:?}: {N} concurrent deliveries of one message: {tally:?}, {} body runs",
        probe.runs()
    );
    assert_eq!(tally.executed, 1, "{tally:?}");
    assert_eq!(tally.duplicate, N - 1, "{tally:?}");
    assert_eq!(tally.total(), N);
    // Every caller got the one recorded result.
    assert_eq!(values.len(), N);
    assert!(values.iter().all(|v| v.stock_left == 995), "{values:?}");
    assert!(
        kind.racing_body_runs(1, N - 1).contains(&probe.runs()),
        "{kind:?}: {} body runs",
        probe.runs()
    );
    assert_eq!(db.stock("plum").await, 995);
    assert_eq!(db.ledger_rows("o-4").await, 1);
    assert_eq!(db.records().await, 1);
}

pub(crate) async fn concurrent_distinct_messages_each_execute_exactly_once<F: TxHandlers>(
    kind: StoreKind,
) {
    const MESSAGES: usize = 32;
    const COPIES: usize = 2;
    let db = Arc::new(or_skip!(F::open(kind, Open::Plain).await));
    db.stock_up("fig", 10_000).await;
    let probe = Probe::new();

    let results = deliver_together(&db, &probe, MESSAGES * COPIES, |i| {
        let msg = OrderPlaced::new(&format!("m-{}", i % MESSAGES), "fig", 1);
        (db.store().clone(), msg)
    })
    .await;

    let tally = Tally::of(results);
    eprintln!(
        "{kind:?}: {MESSAGES} messages x {COPIES} concurrent copies: {tally:?}, {} body runs",
        probe.runs()
    );
    assert_eq!(tally.executed, MESSAGES, "{tally:?}");
    assert_eq!(tally.duplicate, MESSAGES * (COPIES - 1), "{tally:?}");
    assert!(tally.other.is_empty(), "{tally:?}");
    assert!(
        kind.racing_body_runs(MESSAGES, MESSAGES * (COPIES - 1))
            .contains(&probe.runs()),
        "{kind:?}: {} body runs",
        probe.runs()
    );
    assert_eq!(db.stock("fig").await, 10_000 - MESSAGES as i64);
    assert_eq!(db.ledger_len().await, MESSAGES as i64);
    for m in 0..MESSAGES {
        assert_eq!(db.ledger_rows(&format!("m-{m}")).await, 1, "message m-{m}");
    }
    assert_eq!(db.records().await, MESSAGES as i64);
}

pub(crate) async fn two_consumers_on_one_database_execute_a_message_once<F: TxHandlers>(
    kind: StoreKind,
) {
    const N: usize = 32;
    let db = Arc::new(or_skip!(F::open(kind, Open::Plain).await));
    db.stock_up("lemon", 100).await;
    // A second consumer with its own pool on the same database, as another
    // process would have.
    let other = db.second_consumer().await;
    let probe = Probe::new();
    let msg = OrderPlaced::new("o-11", "lemon", 7);

    let results = deliver_together(&db, &probe, N, |i| {
        let store = if i % 2 == 0 { db.store() } else { &other };
        (store.clone(), msg.clone())
    })
    .await;

    let tally = Tally::of(results);
    eprintln!("{kind:?}: {N} deliveries over two consumers: {tally:?}");
    assert_eq!(tally.executed, 1, "{tally:?}");
    assert_eq!(tally.duplicate, N - 1, "{tally:?}");
    assert!(
        kind.racing_body_runs(1, N - 1).contains(&probe.runs()),
        "{kind:?}: {} body runs",
        probe.runs()
    );
    assert_eq!(db.stock("lemon").await, 93);
    assert_eq!(db.ledger_rows("o-11").await, 1);
}

pub(crate) async fn delivery_waiting_on_an_open_first_delivery_gives_up_at_the_lock_timeout<
    F: TxHandlers,
>(
    kind: StoreKind,
) {
    // A 200 ms lock timeout instead of the default 5 s, to keep the test
    // fast (MySQL: 1 s, its shortest).
    let timeout = kind.lock_timeout(Duration::from_millis(200));
    let db = Arc::new(or_skip!(F::open(kind, Open::LockTimeout(timeout)).await));
    db.stock_up("yuzu", 10).await;
    let probe = Probe::new();

    // The first delivery holds its transaction open in the body.
    let first = {
        let (db, probe) = (Arc::clone(&db), Arc::clone(&probe));
        tokio::spawn(async move {
            let msg = OrderPlaced {
                park: true,
                ..OrderPlaced::new("o-10", "yuzu", 1)
            };
            db.deduct(db.store(), &msg, &probe).await
        })
    };
    probe.wait_parked().await;

    let msg = OrderPlaced::new("o-10", "yuzu", 1);
    let started = std::time::Instant::now();
    let second = db.deduct(db.store(), &msg, &probe).await;
    eprintln!("{kind:?}: second delivery while the first holds its transaction: {second:?}");
    assert!(started.elapsed() >= timeout / 2, "it did not wait");
    // Either way the consumer nacks and redelivers; see `Waited`.
    let waiter_runs = match (kind.waited(), &second) {
        (
            Waited::StoreTimeout,
            Err(Error::Store {
                source: StoreError::Timeout(_),
                handler,
                key: Some(k),
            }),
        ) if *handler == F::DEDUCT => {
            assert_eq!(k, &msg.key());
            0
        }
        (
            Waited::InProgress,
            Err(Error::InProgress {
                retry_after,
                handler,
                key: k,
            }),
        ) if *handler == F::DEDUCT => {
            assert_eq!(k, &msg.key());
            assert_eq!(*retry_after, timeout);
            0
        }
        (
            Waited::BodyLockTimeout,
            Err(Error::Store {
                source:
                    StoreError::Contention {
                        kind: Contention::LockTimeout,
                        error,
                    },
                handler,
                key: Some(k),
            }),
        ) if *handler == F::DEDUCT => {
            assert_eq!(k, &msg.key());
            assert!(kind.is_lock_timeout(error), "{kind:?}: {error}");
            1
        }
        (waited, other) => panic!("{kind:?}: expected {waited:?}, got {other:?}"),
    };
    assert_eq!(
        probe.runs(),
        1 + waiter_runs,
        "the waiting delivery ran its body"
    );
    // Nothing of the waiting delivery stands.
    assert_eq!(db.records().await, 0);

    probe.open_gate();
    assert!(first.await.unwrap().unwrap().is_executed());
    let out = db.deduct(db.store(), &msg, &probe).await.unwrap();
    assert!(out.is_duplicate());
    assert_eq!(probe.runs(), kind.body_runs(1, 1) + waiter_runs);
    assert_eq!(db.stock("yuzu").await, 9);
    assert_eq!(db.ledger_rows("o-10").await, 1);
}
