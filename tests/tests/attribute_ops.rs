//! What `fingerprint` and `max_attempts` do at run time, and what a
//! `FinalError` does: each scenario runs on the in-memory store and on a
//! SQLite file of its own (lease mode), and the attempts and fingerprint in
//! transaction mode on SQLite. Every body counts its runs, so each test
//! checks that a refused delivery did not run it.
//!
//! Each handler is called by one test only: its run counter is that test's.

use std::sync::atomic::{AtomicUsize, Ordering};

use idem_runtime::store::LeaseStore;
use idem_runtime::{
    Error, FinalError, MemoryStore, Outcome, SqliteStore, SqliteTx, fingerprint, idempotent,
};
use tempfile::TempDir;

#[derive(Debug, Clone, serde::Serialize)]
struct Order {
    order_id: u64,
    qty: u32,
    price: f64,
    coupon: Option<String>,
}

fn order(order_id: u64, qty: u32, price: f64, coupon: Option<&str>) -> Order {
    Order {
        order_id,
        qty,
        price,
        coupon: coupon.map(str::to_owned),
    }
}

#[derive(Debug, thiserror::Error)]
#[error("warehouse unreachable (attempt {0})")]
struct Unreachable(usize);

/// A SQLite store in a directory of its own, migrated.
async fn sqlite() -> (SqliteStore, TempDir) {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = SqliteStore::open(dir.path().join("idem.db"))
        .await
        .expect("open sqlite store");
    store.migrate().await.expect("migrate");
    (store, dir)
}

/// The key of a message keyed by `order_id`, as errors carry it.
fn key_of(order_id: u64) -> String {
    format!("{}:{order_id}", order_id.to_string().len())
}

// ---------------------------------------------------------------------------
// fingerprint = "qty + price"

static PRICED_RUNS: AtomicUsize = AtomicUsize::new(0);

#[idempotent(
    key = "order_id",
    ttl = "1h",
    store = "memory",
    fingerprint = "qty + price"
)]
async fn priced(msg: &Order) -> Result<f64, Unreachable> {
    PRICED_RUNS.fetch_add(1, Ordering::SeqCst);
    Ok(f64::from(msg.qty) * msg.price)
}

async fn parts_compared(store: &impl LeaseStore, order_id: u64) {
    let runs = PRICED_RUNS.load(Ordering::SeqCst);
    let first = order(order_id, 2, 9.5, None);
    assert_eq!(
        priced(store, &first).await.unwrap(),
        Outcome::Executed(19.0)
    );
    // the same payload is a duplicate, and so is a change outside the parts
    assert_eq!(
        priced(store, &first).await.unwrap(),
        Outcome::Duplicate(19.0)
    );
    let coupon = order(order_id, 2, 9.5, Some("SPRING"));
    assert_eq!(
        priced(store, &coupon).await.unwrap(),
        Outcome::Duplicate(19.0)
    );
    // another price under the same key is another payload
    let repriced = order(order_id, 2, 9.75, None);
    match priced(store, &repriced).await {
        Err(Error::PayloadMismatch {
            handler,
            key,
            recorded,
            given,
        }) => {
            assert_eq!(handler, "priced");
            assert_eq!(key.as_str(), key_of(order_id));
            // the digest of the tuple of the parts, as `fingerprint` makes it
            assert_eq!(recorded, fingerprint(&(2u32, 9.5f64)));
            assert_eq!(given, fingerprint(&(2u32, 9.75f64)));
        }
        other => panic!("expected PayloadMismatch, got {other:?}"),
    }
    // the record is left as it was: the first payload is still a duplicate
    assert_eq!(
        priced(store, &first).await.unwrap(),
        Outcome::Duplicate(19.0)
    );
    assert_eq!(PRICED_RUNS.load(Ordering::SeqCst) - runs, 1);
}

#[tokio::test]
async fn fingerprint_parts_refuse_another_payload() {
    parts_compared(&MemoryStore::new(), 1).await;
    let (store, _dir) = sqlite().await;
    parts_compared(&store, 22).await;
}

// ---------------------------------------------------------------------------
// fingerprint = "*"

static WHOLE_RUNS: AtomicUsize = AtomicUsize::new(0);

#[idempotent(key = "order_id", ttl = "1h", store = "memory", fingerprint = "*")]
async fn whole(msg: &Order) -> Result<u32, Unreachable> {
    WHOLE_RUNS.fetch_add(1, Ordering::SeqCst);
    Ok(msg.qty)
}

async fn message_compared(store: &impl LeaseStore, order_id: u64) {
    let runs = WHOLE_RUNS.load(Ordering::SeqCst);
    let first = order(order_id, 3, 1.25, Some("SPRING"));
    assert_eq!(whole(store, &first).await.unwrap(), Outcome::Executed(3));
    assert_eq!(whole(store, &first).await.unwrap(), Outcome::Duplicate(3));
    // any field counts, the coupon too
    let other = order(order_id, 3, 1.25, None);
    match whole(store, &other).await {
        Err(Error::PayloadMismatch {
            handler,
            key,
            recorded,
            given,
        }) => {
            assert_eq!(handler, "whole");
            assert_eq!(key.as_str(), key_of(order_id));
            assert_eq!(recorded, fingerprint(&first));
            assert_eq!(given, fingerprint(&other));
        }
        other => panic!("expected PayloadMismatch, got {other:?}"),
    }
    assert_eq!(WHOLE_RUNS.load(Ordering::SeqCst) - runs, 1);
}

#[tokio::test]
async fn fingerprint_of_the_whole_message() {
    message_compared(&MemoryStore::new(), 3).await;
    let (store, _dir) = sqlite().await;
    message_compared(&store, 44).await;
}

// ---------------------------------------------------------------------------
// An `Option` part that is `None` is a value, not a missing key

static COUPON_RUNS: AtomicUsize = AtomicUsize::new(0);

#[idempotent(
    key = "order_id",
    ttl = "1h",
    store = "memory",
    fingerprint = "qty + coupon"
)]
async fn couponed(msg: &Order) -> Result<bool, Unreachable> {
    COUPON_RUNS.fetch_add(1, Ordering::SeqCst);
    Ok(msg.coupon.is_some())
}

async fn none_compared(store: &impl LeaseStore, order_id: u64) {
    let runs = COUPON_RUNS.load(Ordering::SeqCst);
    let without = order(order_id, 1, 2.0, None);
    assert_eq!(
        couponed(store, &without).await.unwrap(),
        Outcome::Executed(false)
    );
    assert_eq!(
        couponed(store, &without).await.unwrap(),
        Outcome::Duplicate(false)
    );
    let with = order(order_id, 1, 2.0, Some("SPRING"));
    match couponed(store, &with).await {
        Err(Error::PayloadMismatch {
            recorded, given, ..
        }) => {
            assert_eq!(recorded, fingerprint(&(1u32, None::<String>)));
            assert_eq!(given, fingerprint(&(1u32, Some("SPRING"))));
        }
        other => panic!("expected PayloadMismatch, got {other:?}"),
    }
    assert_eq!(COUPON_RUNS.load(Ordering::SeqCst) - runs, 1);
}

#[tokio::test]
async fn fingerprint_option_part_that_is_none() {
    none_compared(&MemoryStore::new(), 5).await;
    let (store, _dir) = sqlite().await;
    none_compared(&store, 66).await;
}

// ---------------------------------------------------------------------------
// max_attempts = 2

static FLAKY_RUNS: AtomicUsize = AtomicUsize::new(0);

#[idempotent(key = "order_id", ttl = "1h", store = "memory", max_attempts = 2)]
async fn flaky(msg: &Order) -> Result<u32, Unreachable> {
    let run = FLAKY_RUNS.fetch_add(1, Ordering::SeqCst) + 1;
    let _ = msg;
    Err(Unreachable(run))
}

async fn attempts_counted(store: &impl LeaseStore, order_id: u64) {
    let runs = FLAKY_RUNS.load(Ordering::SeqCst);
    let msg = order(order_id, 1, 1.0, None);
    for attempt in 1..=2 {
        match flaky(store, &msg).await {
            Err(Error::Handler {
                handler,
                key,
                error,
            }) => {
                assert_eq!(handler, "flaky");
                assert_eq!(key.as_str(), key_of(order_id));
                assert_eq!(error.0, runs + attempt);
            }
            other => panic!("attempt {attempt}: expected Handler, got {other:?}"),
        }
    }
    // the third delivery and every later one are refused without running
    for _ in 0..2 {
        match flaky(store, &msg).await {
            Err(Error::Exhausted {
                handler,
                key,
                failures,
                last_error,
            }) => {
                assert_eq!(handler, "flaky");
                assert_eq!(key.as_str(), key_of(order_id));
                assert_eq!(failures, 2);
                assert_eq!(
                    last_error.as_deref(),
                    Some(format!("warehouse unreachable (attempt {})", runs + 2).as_str())
                );
            }
            other => panic!("expected Exhausted, got {other:?}"),
        }
    }
    assert_eq!(FLAKY_RUNS.load(Ordering::SeqCst) - runs, 2);
}

#[tokio::test]
async fn max_attempts_then_exhausted() {
    attempts_counted(&MemoryStore::new(), 7).await;
    let (store, _dir) = sqlite().await;
    attempts_counted(&store, 88).await;
}

// ---------------------------------------------------------------------------
// A final error is recorded and replayed

#[derive(Debug, PartialEq, thiserror::Error, serde::Serialize, serde::Deserialize)]
enum StockError {
    #[error("unknown SKU {0}")]
    UnknownSku(String),
    #[error("warehouse unreachable")]
    Unreachable,
}

impl FinalError for StockError {
    fn is_final(&self) -> bool {
        matches!(self, StockError::UnknownSku(_))
    }
}

#[derive(serde::Serialize)]
struct Reserve {
    order_id: u64,
    sku: String,
}

static RESERVE_RUNS: AtomicUsize = AtomicUsize::new(0);

#[idempotent(key = "order_id", ttl = "1h", store = "memory")]
async fn reserve(msg: &Reserve) -> Result<u32, StockError> {
    RESERVE_RUNS.fetch_add(1, Ordering::SeqCst);
    if msg.sku == "down" {
        return Err(StockError::Unreachable);
    }
    Err(StockError::UnknownSku(msg.sku.clone()))
}

async fn finals_replayed(store: &impl LeaseStore, order_id: u64) {
    let runs = RESERVE_RUNS.load(Ordering::SeqCst);
    let msg = Reserve {
        order_id,
        sku: "pear-9".into(),
    };
    for replay in [false, true, true] {
        match reserve(store, &msg).await {
            Err(Error::Failed {
                handler,
                key,
                error,
                replayed,
            }) => {
                assert_eq!(handler, "reserve");
                assert_eq!(key.as_str(), key_of(order_id));
                assert_eq!(error, StockError::UnknownSku("pear-9".into()));
                assert_eq!(replayed, replay);
            }
            other => panic!("expected Failed, got {other:?}"),
        }
    }
    assert_eq!(RESERVE_RUNS.load(Ordering::SeqCst) - runs, 1);
    // an error that is not final is not recorded: the body runs again
    let down = Reserve {
        order_id: order_id + 1,
        sku: "down".into(),
    };
    for _ in 0..2 {
        match reserve(store, &down).await {
            Err(Error::Handler { error, .. }) => assert_eq!(error, StockError::Unreachable),
            other => panic!("expected Handler, got {other:?}"),
        }
    }
    assert_eq!(RESERVE_RUNS.load(Ordering::SeqCst) - runs, 3);
}

#[tokio::test]
async fn final_error_recorded_and_replayed() {
    finals_replayed(&MemoryStore::new(), 10).await;
    let (store, _dir) = sqlite().await;
    finals_replayed(&store, 20).await;
}

// ---------------------------------------------------------------------------
// Transaction mode: both arguments, and the body's writes

static BOOK_RUNS: AtomicUsize = AtomicUsize::new(0);

#[idempotent(
    key = "order_id",
    ttl = "1h",
    store = "sqlite",
    fingerprint = "qty + price",
    max_attempts = 2
)]
async fn book(tx: &mut SqliteTx<'_>, msg: &Order) -> Result<i64, sqlx::Error> {
    BOOK_RUNS.fetch_add(1, Ordering::SeqCst);
    sqlx::query("INSERT INTO ledger (order_id, qty) VALUES (?, ?)")
        .bind(msg.order_id as i64)
        .bind(i64::from(msg.qty))
        .execute(&mut **tx)
        .await?;
    if msg.qty == 0 {
        // rolled back with the claim
        return Err(sqlx::Error::Protocol("no quantity".into()));
    }
    sqlx::query_scalar("SELECT count(*) FROM ledger")
        .fetch_one(&mut **tx)
        .await
}

#[tokio::test]
async fn transaction_mode_fingerprint_and_attempts() {
    let (store, _dir) = sqlite().await;
    sqlx::query("CREATE TABLE ledger (order_id INTEGER NOT NULL, qty INTEGER NOT NULL)")
        .execute(store.pool())
        .await
        .expect("ledger");
    let first = order(1, 2, 9.5, None);
    assert_eq!(book(&store, &first).await.unwrap(), Outcome::Executed(1));
    assert_eq!(book(&store, &first).await.unwrap(), Outcome::Duplicate(1));
    match book(&store, &order(1, 3, 9.5, None)).await {
        Err(Error::PayloadMismatch {
            handler,
            key,
            recorded,
            given,
        }) => {
            assert_eq!(handler, "book");
            assert_eq!(key.as_str(), key_of(1));
            assert_eq!(recorded, fingerprint(&(2u32, 9.5f64)));
            assert_eq!(given, fingerprint(&(3u32, 9.5f64)));
        }
        other => panic!("expected PayloadMismatch, got {other:?}"),
    }
    assert_eq!(BOOK_RUNS.load(Ordering::SeqCst), 1);

    let empty = order(2, 0, 9.5, None);
    for _ in 0..2 {
        match book(&store, &empty).await {
            Err(Error::Handler { handler, error, .. }) => {
                assert_eq!(handler, "book");
                assert_eq!(
                    error.to_string(),
                    "encountered unexpected or invalid data: no quantity"
                );
            }
            other => panic!("expected Handler, got {other:?}"),
        }
    }
    match book(&store, &empty).await {
        Err(Error::Exhausted {
            key,
            failures,
            last_error,
            ..
        }) => {
            assert_eq!(key.as_str(), key_of(2));
            assert_eq!(failures, 2);
            assert_eq!(
                last_error.as_deref(),
                Some("encountered unexpected or invalid data: no quantity")
            );
        }
        other => panic!("expected Exhausted, got {other:?}"),
    }
    assert_eq!(BOOK_RUNS.load(Ordering::SeqCst), 3);
    // the failed bodies' writes rolled back: only the first order's row
    let rows: Vec<(i64, i64)> = sqlx::query_as("SELECT order_id, qty FROM ledger")
        .fetch_all(store.pool())
        .await
        .expect("ledger rows");
    assert_eq!(rows, vec![(1, 2)]);
}
