//! Stock deduction on PostgreSQL, in transaction mode.
//!
//! ```text
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/test cargo run -p idem-examples --features postgres --example stock_postgres
//! ```
//!
//! Eight consumers receive the same order lines, each line three times, at
//! once; the stock is deducted once per line. The business table and the
//! dedup table are created for the run and dropped at its end.

use idem_runtime::{Error, Outcome, PgStore, PgTx, idempotent};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Deserialize)]
struct OrderLine {
    order_id: i64,
    sku: String,
    qty: i64,
}

#[derive(Debug, Serialize, Deserialize)]
struct StockLeft(i64);

#[idempotent(key = "order_id + sku", ttl = "24h", store = "postgres")]
async fn deduct_stock(tx: &mut PgTx<'_>, line: &OrderLine) -> Result<StockLeft, sqlx::Error> {
    let left = sqlx::query_scalar(
        "UPDATE example_inventory SET stock = stock - $1 WHERE sku = $2 RETURNING stock",
    )
    .bind(line.qty)
    .bind(&line.sku)
    .fetch_one(&mut **tx)
    .await?;
    Ok(StockLeft(left))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let store = PgStore::connect(&url)
        .await?
        .with_table("example_idem_keys")?;
    store.migrate().await?;
    sqlx::raw_sql(
        "DROP TABLE IF EXISTS example_inventory;
         CREATE TABLE example_inventory (sku TEXT PRIMARY KEY, stock BIGINT NOT NULL);
         INSERT INTO example_inventory VALUES ('apple', 1000), ('pear', 1000);
         TRUNCATE example_idem_keys;",
    )
    .execute(store.pool())
    .await?;

    let lines: Vec<OrderLine> = (1..=50)
        .flat_map(|order_id| {
            [
                OrderLine {
                    order_id,
                    sku: "apple".into(),
                    qty: 2,
                },
                OrderLine {
                    order_id,
                    sku: "pear".into(),
                    qty: 1,
                },
            ]
        })
        .collect();
    let mut consumers = Vec::new();
    for c in 0..8 {
        let (store, lines) = (store.clone(), lines.clone());
        consumers.push(tokio::spawn(async move {
            let (mut executed, mut duplicates) = (0, 0);
            // Consumers 0-2 each get every line: three deliveries of each.
            if c >= 3 {
                return Ok::<_, Error<sqlx::Error>>((executed, duplicates));
            }
            for line in lines {
                loop {
                    match deduct_stock(&store, &line).await {
                        Ok(Outcome::Executed(_)) => executed += 1,
                        Ok(Outcome::Duplicate(_)) => duplicates += 1,
                        Err(Error::InProgress { retry_after, .. }) => {
                            tokio::time::sleep(
                                retry_after.min(std::time::Duration::from_millis(20)),
                            )
                            .await;
                            continue;
                        }
                        Err(e) => return Err(e),
                    }
                    break;
                }
            }
            Ok((executed, duplicates))
        }));
    }
    let (mut executed, mut duplicates) = (0, 0);
    for c in consumers {
        let (e, d) = c.await??;
        executed += e;
        duplicates += d;
    }
    let stock: Vec<(String, i64)> =
        sqlx::query_as("SELECT sku, stock FROM example_inventory ORDER BY sku")
            .fetch_all(store.pool())
            .await?;
    println!(
        "{} deliveries: {executed} executed, {duplicates} duplicates",
        lines.len() * 3
    );
    println!("stock: {stock:?} (apple 1000 - 50 x 2, pear 1000 - 50 x 1)");
    sqlx::raw_sql("DROP TABLE example_inventory, example_idem_keys")
        .execute(store.pool())
        .await?;
    assert_eq!(stock, vec![("apple".into(), 900), ("pear".into(), 950)]);
    Ok(())
}
