//! Stock deduction on MySQL/MariaDB, in transaction mode.
//!
//! ```text
//! DATABASE_URL=mysql://root@127.0.0.1:3306/test cargo run -p idem-examples --features mysql --example stock_mysql
//! ```
//!
//! Three consumers each receive every order line at once (three deliveries of
//! each line); the stock is deducted once per line. The claim, the stock
//! update and the recorded outcome commit in one InnoDB transaction. The
//! business table and the dedup table are created for the run and dropped at
//! its end.

use idem_runtime::{Error, MySqlStore, MySqlTx, Outcome, idempotent};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Deserialize)]
struct OrderLine {
    order_id: i64,
    sku: String,
    qty: i64,
}

#[derive(Debug, Serialize, Deserialize)]
struct StockLeft(i64);

#[idempotent(key = "order_id + sku", ttl = "24h", store = "mysql")]
async fn deduct_stock(tx: &mut MySqlTx<'_>, line: &OrderLine) -> Result<StockLeft, sqlx::Error> {
    sqlx::query("UPDATE example_my_inventory SET stock = stock - ? WHERE sku = ?")
        .bind(line.qty)
        .bind(&line.sku)
        .execute(&mut **tx)
        .await?;
    // The row is locked by the update until the commit: this reads our own.
    let left = sqlx::query_scalar("SELECT stock FROM example_my_inventory WHERE sku = ?")
        .bind(&line.sku)
        .fetch_one(&mut **tx)
        .await?;
    Ok(StockLeft(left))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL")
        .ok()
        .filter(|u| u.starts_with("mysql:") || u.starts_with("mariadb:"))
        .unwrap_or_else(|| "mysql://root@127.0.0.1:3306/test".into());
    let store = MySqlStore::connect(&url)
        .await?
        .with_table("example_my_idem_keys")?;
    store.migrate().await?;
    for statement in [
        "DROP TABLE IF EXISTS example_my_inventory",
        "CREATE TABLE example_my_inventory (sku VARCHAR(32) PRIMARY KEY, stock BIGINT NOT NULL) ENGINE = InnoDB",
        "INSERT INTO example_my_inventory VALUES ('apple', 1000), ('pear', 1000)",
        "TRUNCATE example_my_idem_keys",
    ] {
        sqlx::raw_sql(statement).execute(store.pool()).await?;
    }

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
    for _ in 0..3 {
        let (store, lines) = (store.clone(), lines.clone());
        consumers.push(tokio::spawn(async move {
            let (mut executed, mut duplicates) = (0, 0);
            for line in lines {
                loop {
                    match deduct_stock(&store, &line).await {
                        Ok(Outcome::Executed(_)) => executed += 1,
                        Ok(Outcome::Duplicate(_)) => duplicates += 1,
                        // Another consumer holds the line: redeliver later.
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
            Ok::<_, Error<sqlx::Error>>((executed, duplicates))
        }));
    }
    let (mut executed, mut duplicates) = (0, 0);
    for c in consumers {
        let (e, d) = c.await??;
        executed += e;
        duplicates += d;
    }
    let stock: Vec<(String, i64)> =
        sqlx::query_as("SELECT sku, stock FROM example_my_inventory ORDER BY sku")
            .fetch_all(store.pool())
            .await?;
    println!(
        "{} deliveries: {executed} executed, {duplicates} duplicates",
        lines.len() * 3
    );
    println!("stock: {stock:?} (apple 1000 - 50 x 2, pear 1000 - 50 x 1)");
    sqlx::raw_sql("DROP TABLE example_my_inventory, example_my_idem_keys")
        .execute(store.pool())
        .await?;
    assert_eq!(stock, vec![("apple".into(), 900), ("pear".into(), 950)]);
    assert_eq!((executed, duplicates), (100, 200));
    Ok(())
}
