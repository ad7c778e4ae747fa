//! The transaction suite's scenarios about batch handlers: the batch's
//! records read when it begins, one body run over its fresh messages in
//! the batch's transaction, every dedup row written with its outcome at the
//! commit. Run on every SQL store with the rest of the suite (see
//! [`suite!`](super::tx::suite)); the handler is in
//! [`handlers!`](super::tx::handlers).

use std::collections::HashMap;
use std::sync::Arc;

use idem_runtime::{Error, Outcome, Status};
use idem_tests::or_skip;

use super::tx::{Batched, Open, OrderPlaced, StoreKind, TxFixture, TxHandlers};
use super::{AppError, Probe, together};

/// An order id the batch body answers one value short for.
pub(crate) const SHORT: &str = "answer-one-short";

/// The body of `deduct_batch`: a ledger row per fresh message through the
/// transaction; then fails the whole batch if a message says so, and
/// answers one value too few when the batch holds [`SHORT`].
pub(crate) async fn deduct_batch_body<F: TxFixture>(
    conn: &mut F::Conn,
    msgs: &[OrderPlaced],
    probe: &Probe,
    db: &F,
) -> Result<Vec<i64>, AppError> {
    probe.hit();
    let mut values = Vec::with_capacity(msgs.len());
    for msg in msgs {
        probe.see(msg.order_id.clone());
        db.add_ledger_in(conn, &msg.order_id, msg.qty).await?;
        values.push(msg.qty);
    }
    if let Some(msg) = msgs.iter().find(|m| m.fail) {
        return Err(AppError::Refused(format!("order {} refused", msg.order_id)));
    }
    if msgs.iter().any(|m| m.order_id == SHORT) {
        values.pop();
    }
    Ok(values)
}

/// Each message's value, or the kind of its error.
fn shown(results: &Batched<i64>) -> Vec<String> {
    match results {
        Ok(results) => results
            .iter()
            .map(|r| match r {
                Ok(Outcome::Executed(v)) => format!("executed {v}"),
                Ok(Outcome::Duplicate(v)) => format!("duplicate {v}"),
                Err(e) => e.kind().to_owned(),
            })
            .collect(),
        Err(e) => vec![format!("batch: {}", e.kind())],
    }
}

fn order(id: &str, qty: i64) -> OrderPlaced {
    OrderPlaced::new(id, "apple", qty)
}

pub(crate) async fn a_batch_commits_each_fresh_message_with_its_writes_in_input_order<
    F: TxHandlers,
>(
    kind: StoreKind,
) {
    let db = or_skip!(F::open(kind, Open::Plain).await);
    let probe = Probe::new();
    let first = db
        .deduct_batch(db.store(), &[order("o-2", 2)], &probe)
        .await;
    assert_eq!(shown(&first), ["executed 2"]);

    let batch = [
        order("o-1", 1),
        order("o-2", 20),
        // The same key again, with another quantity: a duplicate of the first.
        order("o-1", 99),
        order("o-3", 3),
    ];
    let results = db.deduct_batch(db.store(), &batch, &probe).await;
    assert_eq!(
        shown(&results),
        ["executed 1", "duplicate 2", "duplicate 1", "executed 3"]
    );
    assert_eq!(probe.runs(), 2);
    assert_eq!(probe.seen(), ["o-2", "o-1", "o-3"]);
    for id in ["o-1", "o-2", "o-3"] {
        assert_eq!(db.ledger_rows(id).await, 1, "{id}");
    }
    let rec = db
        .record(F::DEDUCT_BATCH, &order("o-3", 0).key())
        .await
        .expect("o-3 is recorded");
    assert_eq!(rec.status, Status::Completed);
    assert_eq!(rec.outcome.as_deref(), Some("3"));

    let again = db.deduct_batch(db.store(), &batch, &probe).await;
    assert_eq!(
        shown(&again),
        ["duplicate 1", "duplicate 2", "duplicate 1", "duplicate 3"]
    );
    assert_eq!(probe.runs(), 2, "nothing fresh: the body does not run");
    assert_eq!(db.ledger_len().await, 3);
}

pub(crate) async fn a_failing_batch_rolls_back_every_write_and_records_nothing<F: TxHandlers>(
    kind: StoreKind,
) {
    let db = or_skip!(F::open(kind, Open::Plain).await);
    let probe = Probe::new();
    let failing = [
        order("f-1", 1),
        OrderPlaced {
            fail: true,
            ..order("f-2", 2)
        },
    ];
    let results = db.deduct_batch(db.store(), &failing, &probe).await;
    assert!(
        matches!(results, Err(Error::Handler { .. })),
        "{:?}",
        shown(&results)
    );
    assert_eq!(db.ledger_len().await, 0, "the body's writes rolled back");
    assert_eq!(db.records().await, 0, "nothing recorded");

    let redelivered = [order("f-1", 1), order("f-2", 2)];
    let results = db.deduct_batch(db.store(), &redelivered, &probe).await;
    assert_eq!(shown(&results), ["executed 1", "executed 2"]);
    assert_eq!(db.ledger_len().await, 2);
}

pub(crate) async fn a_batch_body_answering_too_few_values_rolls_back<F: TxHandlers>(
    kind: StoreKind,
) {
    let db = or_skip!(F::open(kind, Open::Plain).await);
    let probe = Probe::new();
    let batch = [order("c-1", 1), order(SHORT, 2)];
    let results = db.deduct_batch(db.store(), &batch, &probe).await;
    assert!(
        matches!(
            results,
            Err(Error::OutcomeCount {
                fresh: 2,
                returned: 1,
                ..
            })
        ),
        "{:?}",
        shown(&results)
    );
    assert_eq!(db.ledger_len().await, 0);
    assert_eq!(db.records().await, 0);
}

/// Order ids `0..KEYS`, read by 8 consumers in overlapping windows.
const KEYS: usize = 120;

pub(crate) async fn overlapping_batches_from_8_consumers_commit_every_key_once<F: TxHandlers>(
    kind: StoreKind,
) {
    let db = Arc::new(or_skip!(F::open(kind, Open::Plain).await));
    let probe = Probe::new();
    // Consumer i reads 50 consecutive orders from 15 * i, wrapping: every
    // order is in three or four consumers' batches. Half the consumers
    // have a store of their own, as other processes would.
    let mut stores = Vec::new();
    for i in 0..8 {
        stores.push(if i % 2 == 0 {
            db.store().clone()
        } else {
            db.second_consumer().await
        });
    }
    let answers = together(8, |i| {
        let (db, probe, store) = (Arc::clone(&db), Arc::clone(&probe), stores[i].clone());
        async move {
            let batch: Vec<OrderPlaced> = (0..50)
                .map(|n| {
                    let id = (15 * i + n) % KEYS;
                    order(&format!("o-{id}"), i64::try_from(id).unwrap())
                })
                .collect();
            let results = db
                .deduct_batch(&store, &batch, &probe)
                .await
                .unwrap_or_else(|e| panic!("consumer {i}: {e:?}"));
            batch
                .into_iter()
                .zip(results)
                .map(|(msg, r)| (msg.order_id, r))
                .collect::<Vec<_>>()
        }
    })
    .await;

    let mut executed: HashMap<String, usize> = HashMap::new();
    for (id, result) in answers.into_iter().flatten() {
        let value = match result {
            Ok(Outcome::Executed(v)) => {
                *executed.entry(id.clone()).or_default() += 1;
                v
            }
            Ok(Outcome::Duplicate(v)) => v,
            Err(e) => panic!("{id}: {e:?}"),
        };
        assert_eq!(format!("o-{value}"), id, "the recorded value of {id}");
    }
    assert_eq!(executed.len(), KEYS, "every key executed");
    assert!(executed.values().all(|n| *n == 1), "{executed:?}");
    for id in 0..KEYS {
        assert_eq!(db.ledger_rows(&format!("o-{id}")).await, 1, "o-{id}");
    }
    assert_eq!(db.ledger_len().await, i64::try_from(KEYS).unwrap());
}
