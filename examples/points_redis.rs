//! Loyalty points keyed by the message id, on Redis (lease mode).
//!
//! ```text
//! REDIS_URL=redis://127.0.0.1:6379 cargo run -p idem-examples --features redis --example points_redis
//! ```
//!
//! The points ledger lives outside Redis (here, a map standing in for the
//! loyalty service), so the handler runs in lease mode: Redis holds the claim
//! with a fencing token and then the recorded balance. Redeliveries and
//! producer retries of the same message id are answered from Redis.

use std::collections::HashMap;
use std::sync::Mutex;

use idem_runtime::{Outcome, RedisStore, idempotent};
use serde::Deserialize;

#[derive(Debug, Deserialize)]
struct PointsEarned {
    message_id: String,
    member: String,
    points: i64,
}

/// The loyalty service: balances by member.
#[derive(Default)]
struct Loyalty {
    balances: Mutex<HashMap<String, i64>>,
}

#[derive(Debug, thiserror::Error)]
#[error("loyalty service unavailable")]
struct Unavailable;

impl Loyalty {
    #[idempotent(
        key = "message_id",
        ttl = "7d",
        store = "redis",
        name = "example_grant_points"
    )]
    async fn grant(&self, msg: &PointsEarned) -> Result<i64, Unavailable> {
        let mut balances = self.balances.lock().map_err(|_| Unavailable)?;
        let balance = balances.entry(msg.member.clone()).or_insert(0);
        *balance += msg.points;
        Ok(*balance)
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    // A prefix of its own, so the example starts clean and leaves its keys apart.
    let prefix = format!("idem-example-{}", std::process::id());
    let store = RedisStore::connect(&url).await?.with_prefix(&prefix)?;
    let loyalty = Loyalty::default();

    let grant = |id: &str, member: &str, points| PointsEarned {
        message_id: id.into(),
        member: member.into(),
        points,
    };
    let stream = [
        grant("p-1", "ada", 50),
        grant("p-2", "ada", 20),
        grant("p-1", "ada", 50), // redelivered
        grant("p-3", "bob", 5),
        grant("p-2", "ada", 20), // producer retry
        grant("p-3", "bob", 5),  // redelivered
    ];
    for msg in &stream {
        match loyalty.grant(&store, msg).await? {
            Outcome::Executed(balance) => println!(
                "{}: executed, {} now has {balance}",
                msg.message_id, msg.member
            ),
            Outcome::Duplicate(balance) => {
                println!("{}: duplicate, recorded balance {balance}", msg.message_id)
            }
        }
    }
    let balances = loyalty.balances.lock().map_err(|_| "poisoned")?.clone();
    println!("balances: ada {}, bob {}", balances["ada"], balances["bob"]);
    idem_examples::delete_redis_prefix(&url, &prefix).await?;
    assert_eq!((balances["ada"], balances["bob"]), (70, 5));
    Ok(())
}
