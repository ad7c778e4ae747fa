//! Messages per second through an idempotent Redis handler against raw
//! `SET NX PX` round trips at the same concurrency, interleaved in one run.
//!
//! ```text
//! cargo run --release -p idem-examples --example bench_redis
//! REDIS_URL=redis://... SECS=3 ROUNDS=5 TASKS=8 cargo run --release -p idem-examples --example bench_redis
//! ```
//!
//! Both variants use one multiplexed connection and `TASKS` concurrent
//! consumers, every message fresh. `raw` is the bare dedup step many
//! consumers write by hand (`SET key 1 NX PX ttl`, one round trip, no
//! recorded outcome, no lease); `idem` is a lease-mode handler with an empty
//! body (claim with a fencing token, then record the outcome). It then counts
//! the commands a fresh message and a duplicate send, from the server's
//! `INFO commandstats`, and ends with `idem/raw: <ratio>`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use idem_examples::{env, median, messages_per_second};
use idem_runtime::{RedisStore, idempotent};
use serde::Deserialize;

#[derive(Debug, Deserialize)]
struct Msg {
    id: u64,
}

#[idempotent(key = "id", ttl = "10m", store = "redis", name = "bench_redis")]
async fn handle(msg: &Msg) -> Result<u64, std::io::Error> {
    Ok(msg.id)
}

async fn run(
    idem: bool,
    store: &RedisStore,
    raw: &redis::aio::ConnectionManager,
    prefix: &str,
    secs: f64,
    tasks: usize,
    next: &Arc<AtomicU64>,
) -> f64 {
    messages_per_second(secs, tasks, |_, round| {
        let (store, mut raw, next) = (store.clone(), raw.clone(), next.clone());
        let prefix = prefix.to_owned();
        async move {
            while round.going() {
                let id = next.fetch_add(1, Ordering::Relaxed);
                if idem {
                    let outcome = handle(&store, &Msg { id }).await.expect("idem call");
                    assert!(outcome.is_executed());
                } else {
                    let set: Option<String> = redis::cmd("SET")
                        .arg(format!("{prefix}:raw:{id}"))
                        .arg(1)
                        .arg("NX")
                        .arg("PX")
                        .arg(600_000)
                        .query_async(&mut raw)
                        .await
                        .expect("raw SET NX");
                    assert!(set.is_some());
                }
                round.handled();
            }
        }
    })
    .await
}

/// Client commands (round trips) of one call, from the server's statistics:
/// top-level `EVALSHA`/`EVAL` and direct commands, not the ones a script runs.
async fn round_trips<F: std::future::Future>(
    admin: &mut redis::aio::ConnectionManager,
    call: F,
) -> u64 {
    let stats = |info: String| -> u64 {
        info.lines()
            .filter_map(|l| {
                let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
                if matches!(name, "evalsha" | "eval" | "script|load") {
                    rest.split(',')
                        .find_map(|f| f.strip_prefix("calls=")?.parse::<u64>().ok())
                } else {
                    None
                }
            })
            .sum()
    };
    let before: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(admin)
        .await
        .expect("info");
    call.await;
    let after: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(admin)
        .await
        .expect("info");
    stats(after) - stats(before)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let secs: f64 = env("SECS", 3.0);
    let rounds: usize = env("ROUNDS", 5);
    let tasks: usize = env("TASKS", 8);
    let prefix = format!("idem-bench-{}", std::process::id());
    let store = RedisStore::connect(&url).await?.with_prefix(&prefix)?;
    let client = redis::Client::open(url.as_str())?;
    let raw = client.get_connection_manager().await?;
    let next = Arc::new(AtomicU64::new(1));

    println!("{tasks} consumers, {rounds} rounds of {secs} s per variant, interleaved");
    run(false, &store, &raw, &prefix, 1.0, tasks, &next).await;
    run(true, &store, &raw, &prefix, 1.0, tasks, &next).await;
    let (mut raw_tps, mut idem_tps) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        for idem in if round % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        } {
            let t = run(idem, &store, &raw, &prefix, secs, tasks, &next).await;
            if idem {
                idem_tps.push(t)
            } else {
                raw_tps.push(t)
            }
        }
    }
    let (r, i) = (median(raw_tps.clone()), median(idem_tps.clone()));
    println!("raw SET NX  median {r:>8.0} msg/s   rounds {raw_tps:.0?}");
    println!("idem        median {i:>8.0} msg/s   rounds {idem_tps:.0?}");

    let mut admin = raw.clone();
    let id = next.fetch_add(1, Ordering::Relaxed);
    let fresh = round_trips(&mut admin, async {
        assert!(
            handle(&store, &Msg { id })
                .await
                .expect("fresh")
                .is_executed()
        );
    })
    .await;
    let duplicate = round_trips(&mut admin, async {
        assert!(
            handle(&store, &Msg { id })
                .await
                .expect("dup")
                .is_duplicate()
        );
    })
    .await;
    println!(
        "round trips per message: raw 1; idem fresh {fresh}, duplicate {duplicate} (other clients' scripts would add to these)"
    );

    idem_examples::delete_redis_prefix(&url, &prefix).await?;
    println!("idem/raw: {:.3}", i / r);
    Ok(())
}
