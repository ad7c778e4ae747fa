//! Stock deduction in transaction mode, keyed `order_id + sku`.
//!
//! ```text
//! cargo run -p idem-examples --example stock
//! ```
//!
//! An order with two lines is delivered three times, one line of another
//! order fails for lack of stock (its deduction rolls back with its claim)
//! and succeeds when redelivered after a restock.

use idem_examples::TempDb;
use idem_runtime::{Error, Outcome, SqliteStore, SqliteTx, idempotent};
use serde::{Deserialize, Serialize};

#[derive(Debug, Deserialize)]
struct OrderLine {
    order_id: u64,
    sku: String,
    qty: i64,
}

#[derive(Debug, Serialize, Deserialize)]
struct StockLeft(i64);

#[derive(Debug, thiserror::Error)]
enum StockError {
    #[error("not enough {sku}: {left} left")]
    OutOfStock { sku: String, left: i64 },
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

#[idempotent(key = "order_id + sku", ttl = "24h", store = "sqlite")]
async fn deduct_stock(tx: &mut SqliteTx<'_>, line: &OrderLine) -> Result<StockLeft, StockError> {
    let left: i64 =
        sqlx::query_scalar("UPDATE inventory SET stock = stock - ? WHERE sku = ? RETURNING stock")
            .bind(line.qty)
            .bind(&line.sku)
            .fetch_one(&mut **tx)
            .await?;
    if left < 0 {
        // The UPDATE above and the claim roll back together.
        return Err(StockError::OutOfStock {
            sku: line.sku.clone(),
            left: left + line.qty,
        });
    }
    Ok(StockLeft(left))
}

async fn stock(store: &SqliteStore, sku: &str) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("SELECT stock FROM inventory WHERE sku = ?")
        .bind(sku)
        .fetch_one(store.pool())
        .await
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let db = TempDb::new("stock");
    let store = SqliteStore::open(db.path()).await?;
    store.migrate().await?;
    sqlx::query("CREATE TABLE inventory (sku TEXT PRIMARY KEY, stock INTEGER NOT NULL)")
        .execute(store.pool())
        .await?;
    sqlx::query("INSERT INTO inventory VALUES ('apple', 10), ('pear', 2)")
        .execute(store.pool())
        .await?;

    let order = [
        OrderLine {
            order_id: 7,
            sku: "apple".into(),
            qty: 4,
        },
        OrderLine {
            order_id: 7,
            sku: "pear".into(),
            qty: 1,
        },
    ];
    // The broker redelivers the whole order three times.
    for round in 1..=3 {
        for line in &order {
            let outcome = deduct_stock(&store, line).await?;
            let verb = if outcome.is_executed() {
                "executed "
            } else {
                "duplicate"
            };
            println!(
                "round {round}: order {} {:<5} {verb} -> stock left {}",
                line.order_id,
                line.sku,
                outcome.into_inner().0
            );
        }
    }

    // Order 8 wants more pears than there are: the body fails, nothing is kept.
    let big = OrderLine {
        order_id: 8,
        sku: "pear".into(),
        qty: 5,
    };
    match deduct_stock(&store, &big).await {
        Err(Error::Handler { error, key, .. }) => {
            println!(
                "order 8 pear: failed ({error}); key {} not recorded, stock still {}",
                key.shown(),
                stock(&store, "pear").await?
            )
        }
        other => return Err(format!("expected a handler error, got {other:?}").into()),
    }
    sqlx::query("UPDATE inventory SET stock = stock + 10 WHERE sku = 'pear'")
        .execute(store.pool())
        .await?;
    // Redelivered after the restock: now it runs, once.
    for _ in 0..2 {
        match deduct_stock(&store, &big).await? {
            Outcome::Executed(left) => println!(
                "order 8 pear after restock: executed -> stock left {}",
                left.0
            ),
            Outcome::Duplicate(left) => println!(
                "order 8 pear after restock: duplicate -> stock left {}",
                left.0
            ),
        }
    }

    let (apple, pear) = (stock(&store, "apple").await?, stock(&store, "pear").await?);
    println!("final stock: apple {apple} (10 - 4), pear {pear} (2 - 1 + 10 - 5)");
    assert_eq!((apple, pear), (6, 6));
    Ok(())
}
