//! Messages that come back changed, fail for good, or fail again and again,
//! and the records an operator reads afterwards.
//!
//! ```text
//! cargo run -p idem-examples --example operations               # a temporary database
//! cargo run -p idem-examples --example operations -- ops.db     # keep it, then:
//! cargo run -p idem-cli -- --store sqlite:ops.db list reserve --failed
//! cargo run -p idem-cli -- --store sqlite:ops.db list reserve --status exhausted
//! ```
//!
//! Each run starts afresh, on a kept file too: it forgets `reserve`'s
//! records and puts the stock back together, so that a second run tells
//! the same story as the first (stock and records agree).
//!
//! One handler, `reserve`, keyed by `order_id`, with
//! `fingerprint = "sku + qty"` (a redelivery must carry the same line) and
//! `max_attempts = 3` (a warehouse that keeps failing is given three tries
//! per order). Its error type says which errors are final: an unknown SKU
//! is, an unreachable warehouse is not.

use std::sync::atomic::{AtomicBool, Ordering};

use idem_examples::TempDb;
use idem_runtime::store::{Inspect as _, Query};
use idem_runtime::{Error, FinalError, SqliteStore, SqliteTx, idempotent};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Deserialize)]
struct Reserve {
    order_id: u64,
    sku: String,
    qty: i64,
}

#[derive(Debug, thiserror::Error, Serialize, Deserialize)]
enum ReserveError {
    #[error("unknown SKU {0}")]
    UnknownSku(String),
    #[error("warehouse unreachable")]
    WarehouseDown,
    #[error("database: {0}")]
    Db(String),
}

impl From<sqlx::Error> for ReserveError {
    fn from(e: sqlx::Error) -> Self {
        ReserveError::Db(e.to_string())
    }
}

impl FinalError for ReserveError {
    fn is_final(&self) -> bool {
        matches!(self, ReserveError::UnknownSku(_))
    }
}

/// Whether the warehouse answers (the example turns it off for one order).
static WAREHOUSE_UP: AtomicBool = AtomicBool::new(true);

#[idempotent(
    key = "order_id",
    ttl = "24h",
    store = "sqlite",
    fingerprint = "sku + qty",
    max_attempts = 3
)]
async fn reserve(tx: &mut SqliteTx<'_>, msg: &Reserve) -> Result<i64, ReserveError> {
    let left: Option<i64> =
        sqlx::query_scalar("UPDATE inventory SET stock = stock - ? WHERE sku = ? RETURNING stock")
            .bind(msg.qty)
            .bind(&msg.sku)
            .fetch_optional(&mut **tx)
            .await?;
    let left = left.ok_or_else(|| ReserveError::UnknownSku(msg.sku.clone()))?;
    if !WAREHOUSE_UP.load(Ordering::Relaxed) {
        // The stock update above rolls back with the claim.
        return Err(ReserveError::WarehouseDown);
    }
    Ok(left)
}

fn show(what: &str, result: &Result<idem_runtime::Outcome<i64>, Error<ReserveError>>) {
    let said = match result {
        Ok(outcome) => format!("{outcome:?}"),
        Err(e) => format!("{} ({})", e.kind(), e),
    };
    println!("  {what:<34} -> {said}");
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let temp = TempDb::new("operations");
    let kept = std::env::args().nth(1);
    let path = kept
        .as_deref()
        .map_or_else(|| temp.path().to_owned(), Into::into);
    let store = SqliteStore::open(&path).await?;
    store.migrate().await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS inventory (sku TEXT PRIMARY KEY, stock INTEGER NOT NULL)",
    )
    .execute(store.pool())
    .await?;
    // The records of an earlier run on a kept file go with its stock: a
    // stock put back beside kept records would be deducted by no delivery
    // (each a duplicate) and contradict them.
    for record in store.list("reserve", Query::new().limit(100)).await? {
        store.forget("reserve", &record.key, true).await?;
    }
    sqlx::query("INSERT OR REPLACE INTO inventory VALUES ('apple', 100)")
        .execute(store.pool())
        .await?;

    let line = |order_id, sku: &str, qty| Reserve {
        order_id,
        sku: sku.into(),
        qty,
    };

    println!("order 1: delivered twice, then once more with another quantity");
    show("3 x apple", &reserve(&store, &line(1, "apple", 3)).await);
    show(
        "3 x apple, redelivered",
        &reserve(&store, &line(1, "apple", 3)).await,
    );
    show(
        "5 x apple, same order id",
        &reserve(&store, &line(1, "apple", 5)).await,
    );

    println!("order 2: a SKU that does not exist (a final error)");
    show("1 x pear", &reserve(&store, &line(2, "pear", 1)).await);
    show(
        "1 x pear, redelivered",
        &reserve(&store, &line(2, "pear", 1)).await,
    );

    println!("order 3: the warehouse is down (max_attempts = 3)");
    WAREHOUSE_UP.store(false, Ordering::Relaxed);
    for attempt in 1..=4 {
        show(
            &format!("2 x apple, delivery {attempt}"),
            &reserve(&store, &line(3, "apple", 2)).await,
        );
    }
    WAREHOUSE_UP.store(true, Ordering::Relaxed);
    show(
        "2 x apple, warehouse back",
        &reserve(&store, &line(3, "apple", 2)).await,
    );

    let stock: i64 = sqlx::query_scalar("SELECT stock FROM inventory WHERE sku = 'apple'")
        .fetch_one(store.pool())
        .await?;
    println!("apple stock: {stock} (100 - 3: order 1 only)");
    match kept {
        Some(p) => println!(
            "records kept in {p}: cargo run -p idem-cli -- --store sqlite:{p} list reserve --failed"
        ),
        None => println!(
            "(pass a file name to keep the records for `idem`: --example operations -- ops.db)"
        ),
    }
    Ok(())
}
