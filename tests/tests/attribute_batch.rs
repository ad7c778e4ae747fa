//! What a batch handler does at run time, in lease mode on the in-memory
//! store and in transaction mode on a SQLite file: one answer per message in
//! input order (fresh, repeated within the batch, recorded before, without a
//! key), a body that sees only the fresh messages, a second delivery of the
//! batch that runs nothing, a failing body that records nothing, and a body
//! that returns the wrong number of values.
//!
//! Each handler is called by one test only: what its body saw is that test's.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use idem_runtime::{Error, MemoryStore, Outcome, SqliteStore, SqliteTx, idempotent};
use tempfile::TempDir;

#[derive(Debug, Clone)]
struct Order {
    order_id: u64,
    region: Option<String>,
    qty: u32,
}

fn order(order_id: u64, region: Option<&str>, qty: u32) -> Order {
    Order {
        order_id,
        region: region.map(str::to_owned),
        qty,
    }
}

#[derive(Debug, thiserror::Error)]
enum ShopError {
    #[error("warehouse unreachable")]
    Unreachable,
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

type Answers = Vec<Result<Outcome<u32>, Error<ShopError>>>;

/// A SQLite store in a directory of its own, migrated, with the table the
/// transaction-mode bodies write.
async fn sqlite() -> (SqliteStore, TempDir) {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = SqliteStore::open(dir.path().join("idem.db"))
        .await
        .expect("open sqlite store");
    store.migrate().await.expect("migrate");
    sqlx::query("CREATE TABLE shipped (order_id INTEGER NOT NULL, qty INTEGER NOT NULL)")
        .execute(store.pool())
        .await
        .expect("create table");
    (store, dir)
}

/// The orders the transaction-mode bodies wrote, in order.
async fn shipped(store: &SqliteStore) -> Vec<(i64, i64)> {
    sqlx::query_as("SELECT order_id, qty FROM shipped ORDER BY rowid")
        .fetch_all(store.pool())
        .await
        .expect("read shipped")
}

/// What a body saw: the order ids of each run.
fn saw(seen: &Mutex<Vec<Vec<u64>>>, msgs: &[Order]) {
    seen.lock()
        .unwrap()
        .push(msgs.iter().map(|m| m.order_id).collect());
}

fn runs(seen: &Mutex<Vec<Vec<u64>>>) -> Vec<Vec<u64>> {
    seen.lock().unwrap().clone()
}

/// The batch of the first scenario: two fresh orders, a repeat of the
/// first within the batch, one recorded by an earlier batch (delivered
/// again with another quantity), and one without a region (a `None` key
/// part).
fn mixed() -> Vec<Order> {
    vec![
        order(1, Some("eu"), 2),
        order(2, Some("us"), 3),
        order(1, Some("eu"), 2),
        order(3, Some("eu"), 9),
        order(4, None, 5),
    ]
}

/// The answers to `mixed()` after order 3 was recorded with quantity 7:
/// `first` is whether this is the batch's first delivery.
fn check_mixed(answers: &Answers, first: bool) {
    assert_eq!(answers.len(), 5, "{answers:?}");
    let expect = |value| {
        if first {
            Outcome::Executed(value)
        } else {
            Outcome::Duplicate(value)
        }
    };
    assert_eq!(answers[0].as_ref().unwrap(), &expect(20));
    assert_eq!(answers[1].as_ref().unwrap(), &expect(30));
    assert_eq!(answers[2].as_ref().unwrap(), &Outcome::Duplicate(20));
    assert_eq!(answers[3].as_ref().unwrap(), &Outcome::Duplicate(70));
    match &answers[4] {
        Err(Error::KeyMissing { handler, part }) => {
            assert!(handler.ends_with("reserve"), "{handler}");
            assert_eq!(*part, "region");
        }
        other => panic!("expected KeyMissing, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------
// Lease mode, on the in-memory store

static LEASE_SEEN: Mutex<Vec<Vec<u64>>> = Mutex::new(Vec::new());

#[idempotent(
    key = "order_id + region",
    ttl = "1h",
    store = "memory",
    name = "batch_lease_reserve"
)]
async fn lease_reserve(msgs: &[Order]) -> Result<Vec<u32>, ShopError> {
    saw(&LEASE_SEEN, msgs);
    Ok(msgs.iter().map(|m| m.qty * 10).collect())
}

#[tokio::test]
async fn lease_batch_answers_each_message_in_order() {
    let store = MemoryStore::new();
    let earlier = lease_reserve(&store, &[order(3, Some("eu"), 7)])
        .await
        .unwrap();
    assert_eq!(earlier.len(), 1);
    assert_eq!(earlier[0].as_ref().unwrap(), &Outcome::Executed(70));

    let batch = mixed();
    check_mixed(&lease_reserve(&store, &batch).await.unwrap(), true);
    // the body saw the fresh messages only, in input order
    assert_eq!(runs(&LEASE_SEEN), [vec![3], vec![1, 2]]);

    // delivered again: nothing runs, every recorded outcome is a duplicate
    check_mixed(&lease_reserve(&store, &batch).await.unwrap(), false);
    assert_eq!(runs(&LEASE_SEEN).len(), 2);
}

static LEASE_FAIL: AtomicBool = AtomicBool::new(true);
static LEASE_FAIL_SEEN: Mutex<Vec<Vec<u64>>> = Mutex::new(Vec::new());

#[idempotent(key = "order_id", ttl = "1h", store = "memory")]
async fn lease_failing(msgs: &[Order]) -> Result<Vec<u32>, ShopError> {
    saw(&LEASE_FAIL_SEEN, msgs);
    if LEASE_FAIL.load(Ordering::SeqCst) {
        return Err(ShopError::Unreachable);
    }
    Ok(msgs.iter().map(|m| m.qty).collect())
}

#[tokio::test]
async fn lease_batch_failing_body_records_nothing() {
    let store = MemoryStore::new();
    let batch = [order(10, None, 1), order(11, None, 2)];
    match lease_failing(&store, &batch).await {
        Err(Error::Handler { error, .. }) => assert!(matches!(error, ShopError::Unreachable)),
        other => panic!("expected the body's error, got {other:?}"),
    }
    // nothing was recorded: the redelivery runs both
    LEASE_FAIL.store(false, Ordering::SeqCst);
    let answers = lease_failing(&store, &batch).await.unwrap();
    let values: Vec<Outcome<u32>> = answers.into_iter().map(Result::unwrap).collect();
    assert_eq!(values, [Outcome::Executed(1), Outcome::Executed(2)]);
    assert_eq!(runs(&LEASE_FAIL_SEEN), [vec![10, 11], vec![10, 11]]);
}

#[idempotent(key = "order_id", ttl = "1h", store = "memory")]
async fn lease_short(msgs: &[Order]) -> Result<Vec<u32>, ShopError> {
    Ok(msgs.iter().skip(1).map(|m| m.qty).collect())
}

#[tokio::test]
async fn lease_batch_wrong_number_of_values() {
    let store = MemoryStore::new();
    let batch = [order(20, None, 1), order(21, None, 2)];
    match lease_short(&store, &batch).await {
        Err(Error::OutcomeCount {
            fresh, returned, ..
        }) => assert_eq!((fresh, returned), (2, 1)),
        other => panic!("expected OutcomeCount, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------
// Transaction mode, on SQLite

static TX_SEEN: Mutex<Vec<Vec<u64>>> = Mutex::new(Vec::new());

/// Ships each fresh order in the transaction.
async fn ship(tx: &mut SqliteTx<'_>, msgs: &[Order]) -> Result<(), sqlx::Error> {
    for m in msgs {
        sqlx::query("INSERT INTO shipped (order_id, qty) VALUES (?, ?)")
            .bind(m.order_id as i64)
            .bind(m.qty)
            .execute(&mut **tx)
            .await?;
    }
    Ok(())
}

#[idempotent(key = "order_id + region", ttl = "1h", store = "sqlite")]
async fn tx_reserve(tx: &mut SqliteTx<'_>, msgs: &[Order]) -> Result<Vec<u32>, ShopError> {
    saw(&TX_SEEN, msgs);
    ship(tx, msgs).await?;
    Ok(msgs.iter().map(|m| m.qty * 10).collect())
}

#[tokio::test]
async fn tx_batch_answers_each_message_in_order() {
    let (store, _dir) = sqlite().await;
    let earlier = tx_reserve(&store, &[order(3, Some("eu"), 7)])
        .await
        .unwrap();
    assert_eq!(earlier[0].as_ref().unwrap(), &Outcome::Executed(70));

    let batch = mixed();
    check_mixed(&tx_reserve(&store, &batch).await.unwrap(), true);
    assert_eq!(runs(&TX_SEEN), [vec![3], vec![1, 2]]);
    assert_eq!(shipped(&store).await, [(3, 7), (1, 2), (2, 3)]);

    check_mixed(&tx_reserve(&store, &batch).await.unwrap(), false);
    assert_eq!(runs(&TX_SEEN).len(), 2);
    assert_eq!(shipped(&store).await.len(), 3);
}

static TX_FAIL: AtomicBool = AtomicBool::new(true);
static TX_FAIL_SEEN: Mutex<Vec<Vec<u64>>> = Mutex::new(Vec::new());

#[idempotent(key = "order_id", ttl = "1h", store = "sqlite")]
async fn tx_failing(tx: &mut SqliteTx<'_>, msgs: &[Order]) -> Result<Vec<u32>, ShopError> {
    saw(&TX_FAIL_SEEN, msgs);
    ship(tx, msgs).await?;
    if TX_FAIL.load(Ordering::SeqCst) {
        return Err(ShopError::Unreachable);
    }
    Ok(msgs.iter().map(|m| m.qty).collect())
}

#[tokio::test]
async fn tx_batch_failing_body_records_nothing() {
    let (store, _dir) = sqlite().await;
    let batch = [order(10, None, 1), order(11, None, 2)];
    match tx_failing(&store, &batch).await {
        Err(Error::Handler { error, .. }) => assert!(matches!(error, ShopError::Unreachable)),
        other => panic!("expected the body's error, got {other:?}"),
    }
    // the body's writes rolled back with the batch's claims
    assert!(shipped(&store).await.is_empty());
    TX_FAIL.store(false, Ordering::SeqCst);
    let answers = tx_failing(&store, &batch).await.unwrap();
    let values: Vec<Outcome<u32>> = answers.into_iter().map(Result::unwrap).collect();
    assert_eq!(values, [Outcome::Executed(1), Outcome::Executed(2)]);
    assert_eq!(runs(&TX_FAIL_SEEN), [vec![10, 11], vec![10, 11]]);
    assert_eq!(shipped(&store).await, [(10, 1), (11, 2)]);
}

#[idempotent(key = "order_id", ttl = "1h", store = "sqlite")]
async fn tx_short(tx: &mut SqliteTx<'_>, msgs: &[Order]) -> Result<Vec<u32>, ShopError> {
    ship(tx, msgs).await?;
    Ok(msgs.iter().skip(1).map(|m| m.qty).collect())
}

#[tokio::test]
async fn tx_batch_wrong_number_of_values() {
    let (store, _dir) = sqlite().await;
    let batch = [order(20, None, 1), order(21, None, 2)];
    match tx_short(&store, &batch).await {
        Err(Error::OutcomeCount {
            fresh, returned, ..
        }) => assert_eq!((fresh, returned), (2, 1)),
        other => panic!("expected OutcomeCount, got {other:?}"),
    }
    // rolled back: nothing shipped
    assert!(shipped(&store).await.is_empty());
}
