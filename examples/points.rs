//! Loyalty points keyed by the message id, in transaction mode.
//!
//! ```text
//! cargo run -p idem-examples --example points
//! ```
//!
//! A stream of point grants with producer retries (the same message id sent
//! again) and consumer redeliveries; the balance counts each message once.

use idem_examples::TempDb;
use idem_runtime::{SqliteStore, SqliteTx, idempotent};
use serde::Deserialize;

#[derive(Debug, Clone, Deserialize)]
struct PointsEarned {
    message_id: String,
    member: String,
    points: i64,
}

#[idempotent(key = "message_id", ttl = "7d", store = "sqlite")]
async fn grant_points(tx: &mut SqliteTx<'_>, msg: &PointsEarned) -> Result<i64, sqlx::Error> {
    sqlx::query("INSERT INTO ledger (message_id, member, points) VALUES (?, ?, ?)")
        .bind(&msg.message_id)
        .bind(&msg.member)
        .bind(msg.points)
        .execute(&mut **tx)
        .await?;
    sqlx::query_scalar(
        "INSERT INTO balance (member, points) VALUES (?1, ?2)
         ON CONFLICT (member) DO UPDATE SET points = points + ?2 RETURNING points",
    )
    .bind(&msg.member)
    .bind(msg.points)
    .fetch_one(&mut **tx)
    .await
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let db = TempDb::new("points");
    let store = SqliteStore::open(db.path()).await?;
    store.migrate().await?;
    sqlx::raw_sql(
        "CREATE TABLE ledger (message_id TEXT NOT NULL, member TEXT NOT NULL, points INTEGER NOT NULL);
         CREATE TABLE balance (member TEXT PRIMARY KEY, points INTEGER NOT NULL);",
    )
    .execute(store.pool())
    .await?;

    let grant = |id: &str, member: &str, points| PointsEarned {
        message_id: id.into(),
        member: member.into(),
        points,
    };
    // m-2 is retried by its producer, m-1 and m-3 are redelivered by the broker.
    let stream = [
        grant("m-1", "ada", 50),
        grant("m-2", "ada", 20),
        grant("m-2", "ada", 20),
        grant("m-1", "ada", 50),
        grant("m-3", "bob", 5),
        grant("m-3", "bob", 5),
        grant("m-3", "bob", 5),
    ];
    let (mut executed, mut duplicates) = (0, 0);
    for msg in &stream {
        let outcome = grant_points(&store, msg).await?;
        if outcome.is_executed() {
            executed += 1;
        } else {
            duplicates += 1;
        }
        println!(
            "{} -> {:<9} {} has {} points",
            msg.message_id,
            if outcome.is_executed() {
                "executed"
            } else {
                "duplicate"
            },
            msg.member,
            outcome.into_inner()
        );
    }
    let ledger_rows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM ledger")
        .fetch_one(store.pool())
        .await?;
    let ada: i64 = sqlx::query_scalar("SELECT points FROM balance WHERE member = 'ada'")
        .fetch_one(store.pool())
        .await?;
    let bob: i64 = sqlx::query_scalar("SELECT points FROM balance WHERE member = 'bob'")
        .fetch_one(store.pool())
        .await?;
    println!(
        "{} deliveries: {executed} executed, {duplicates} duplicates; ledger rows {ledger_rows}; ada {ada}, bob {bob}",
        stream.len()
    );
    assert_eq!((ledger_rows, ada, bob), (3, 70, 5));
    Ok(())
}
