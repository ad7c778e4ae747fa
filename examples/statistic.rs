//! A statistic keyed by message id plus aggregation key, in transaction mode.
//!
//! ```text
//! cargo run -p idem-examples --example statistic
//! ```
//!
//! Orders are counted per region and day. The key is the message id plus the
//! aggregation key, so a redelivered event is not counted twice, while the
//! same event may still feed several aggregates, each once.

use idem_examples::TempDb;
use idem_runtime::{SqliteStore, SqliteTx, idempotent};
use serde::Deserialize;

#[derive(Debug, Deserialize)]
struct OrderEvent {
    message_id: String,
    region: String,
    day: String,
}

#[idempotent(
    key = "message_id + region + day",
    ttl = "2d",
    store = "sqlite",
    name = "orders_per_region_day"
)]
async fn count_order(tx: &mut SqliteTx<'_>, event: &OrderEvent) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(
        "INSERT INTO orders_per_day (region, day, orders) VALUES (?1, ?2, 1)
         ON CONFLICT (region, day) DO UPDATE SET orders = orders + 1 RETURNING orders",
    )
    .bind(&event.region)
    .bind(&event.day)
    .fetch_one(&mut **tx)
    .await
}

/// A second aggregate fed by the same events: per day only.
#[idempotent(
    key = "message_id + 'all' + day",
    ttl = "2d",
    store = "sqlite",
    name = "orders_per_day"
)]
async fn count_order_all(tx: &mut SqliteTx<'_>, event: &OrderEvent) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(
        "INSERT INTO orders_per_day (region, day, orders) VALUES ('*', ?1, 1)
         ON CONFLICT (region, day) DO UPDATE SET orders = orders + 1 RETURNING orders",
    )
    .bind(&event.day)
    .fetch_one(&mut **tx)
    .await
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let db = TempDb::new("statistic");
    let store = SqliteStore::open(db.path()).await?;
    store.migrate().await?;
    sqlx::query("CREATE TABLE orders_per_day (region TEXT NOT NULL, day TEXT NOT NULL, orders INTEGER NOT NULL, PRIMARY KEY (region, day))")
        .execute(store.pool())
        .await?;

    let ev = |id: &str, region: &str| OrderEvent {
        message_id: id.into(),
        region: region.into(),
        day: "2026-11-29".into(),
    };
    // Six distinct orders; the stream carries eleven deliveries.
    let stream = [
        ev("e1", "north"),
        ev("e2", "north"),
        ev("e1", "north"),
        ev("e3", "south"),
        ev("e4", "south"),
        ev("e3", "south"),
        ev("e5", "north"),
        ev("e6", "west"),
        ev("e6", "west"),
        ev("e2", "north"),
        ev("e5", "north"),
    ];
    let mut counted = 0;
    for event in &stream {
        if count_order(&store, event).await?.is_executed() {
            counted += 1;
        }
        let _total = count_order_all(&store, event).await?.into_inner();
    }
    let rows: Vec<(String, i64)> =
        sqlx::query_as("SELECT region, orders FROM orders_per_day ORDER BY region")
            .fetch_all(store.pool())
            .await?;
    println!("{} deliveries, {counted} counted", stream.len());
    for (region, orders) in &rows {
        println!("  2026-11-29 {region:<6} {orders} orders");
    }
    assert_eq!(
        rows,
        vec![
            ("*".into(), 6),
            ("north".into(), 3),
            ("south".into(), 2),
            ("west".into(), 1)
        ]
    );
    Ok(())
}
