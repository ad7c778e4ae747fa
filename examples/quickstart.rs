//! The quick start: one message delivered five times deducts stock once.
//!
//! ```text
//! cargo run -p idem-examples --example quickstart
//! ```
//!
//! Runs on the embedded SQLite store; nothing needs to be installed.

use idem_examples::TempDb;
use idem_runtime::{Outcome, SqliteStore, SqliteTx, idempotent};
use serde::{Deserialize, Serialize};

/// The message a broker delivers (at least once).
#[derive(Debug, Deserialize)]
struct OrderPlaced {
    order_id: u64,
    sku: String,
    qty: i64,
}

/// What the handler returns; recorded, and handed back to duplicates.
#[derive(Debug, Serialize, Deserialize)]
struct StockLeft(i64);

/// Deducts stock for one order line, once per `order_id + sku`.
///
/// The claim row, this UPDATE and the recorded `StockLeft` commit in one
/// SQLite transaction.
#[idempotent(key = "order_id + sku", ttl = "24h", store = "sqlite")]
async fn deduct_stock(tx: &mut SqliteTx<'_>, msg: &OrderPlaced) -> Result<StockLeft, sqlx::Error> {
    let left =
        sqlx::query_scalar("UPDATE inventory SET stock = stock - ? WHERE sku = ? RETURNING stock")
            .bind(msg.qty)
            .bind(&msg.sku)
            .fetch_one(&mut **tx)
            .await?;
    Ok(StockLeft(left))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let db = TempDb::new("quickstart");
    let store = SqliteStore::open(db.path()).await?;
    store.migrate().await?;
    sqlx::query("CREATE TABLE inventory (sku TEXT PRIMARY KEY, stock INTEGER NOT NULL)")
        .execute(store.pool())
        .await?;
    sqlx::query("INSERT INTO inventory VALUES ('apple', 100)")
        .execute(store.pool())
        .await?;

    let msg = OrderPlaced {
        order_id: 1001,
        sku: "apple".into(),
        qty: 3,
    };
    println!(
        "stock before: 100; delivering order {} ({} x {}) five times",
        msg.order_id, msg.qty, msg.sku
    );
    for delivery in 1..=5 {
        match deduct_stock(&store, &msg).await? {
            Outcome::Executed(StockLeft(left)) => {
                println!("delivery {delivery}: executed, stock left {left}")
            }
            Outcome::Duplicate(StockLeft(left)) => {
                println!("delivery {delivery}: duplicate, recorded result: stock left {left}")
            }
        }
    }
    let stock: i64 = sqlx::query_scalar("SELECT stock FROM inventory WHERE sku = 'apple'")
        .fetch_one(store.pool())
        .await?;
    println!("stock after: {stock} (deducted once)");
    assert_eq!(stock, 97, "the message must take effect exactly once");
    Ok(())
}
