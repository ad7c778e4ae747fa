//! Keys per second through a batch handler on Redis, against the same keys
//! one call at a time and against the limit, a raw pipeline of `SET NX`,
//! as ratios measured in one run.
//!
//! ```text
//! cargo run --release -p idem-examples --features redis --example bench_batch_redis
//! REDIS_URL=redis://... SECS=3 ROUNDS=5 TASKS=4 BATCH=1000 cargo run --release -p idem-examples --features redis --example bench_batch_redis
//! ```
//!
//! Every key is fresh. `TASKS` consumers share one multiplexed connection
//! per variant; the variants take turns round after round, each run
//! starting without the keys of the runs before (deleted between runs,
//! outside the timing):
//!
//! * `raw pipeline`: the limit, `BATCH` `SET key 1 NX PX ttl` commands in
//!   one pipeline (one round trip, no recorded outcome, no lease);
//! * `idem batch`: a lease-mode batch handler with an empty body over
//!   `BATCH` messages: the claims in one pipeline, the outcomes in another;
//! * `idem one call at a time`: a lease-mode handler called once per
//!   message (two round trips each).
//!
//! Each round prints every variant's keys per second and what the machine
//! did meanwhile (busy, idle and steal shares from `/proc/stat`, marked
//! `STOLEN` above 5 % steal; see `examples/src/cpu.rs`). Then each
//! variant's median keys per second and its ratio to the raw pipeline,
//! over all rounds and over the unmarked ones, and the CPU a key cost:
//! this process (the client, `/proc/self/stat`) and Redis (`INFO cpu`;
//! other clients of the same server add to it). It ends with `idem
//! batch/raw pipeline: <ratio>` (over all rounds).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use idem_examples::cpu::{Rounds, Watch, process_seconds};
use idem_examples::{env, messages_per_second};
use idem_runtime::{RedisStore, idempotent};
use serde::Deserialize;

#[derive(Debug, Clone, Deserialize)]
struct Msg {
    id: u64,
}

#[idempotent(key = "id", ttl = "10m", store = "redis", name = "bench_batch_redis")]
async fn batch(msgs: &[Msg]) -> Result<Vec<u64>, std::io::Error> {
    Ok(msgs.iter().map(|m| m.id).collect())
}

#[idempotent(
    key = "id",
    ttl = "10m",
    store = "redis",
    name = "bench_batch_redis_single"
)]
async fn single(msg: &Msg) -> Result<u64, std::io::Error> {
    Ok(msg.id)
}

const VARIANTS: [&str; 3] = ["raw pipeline", "idem batch", "idem one call at a time"];

#[allow(clippy::too_many_arguments)]
async fn run(
    variant: usize,
    store: &RedisStore,
    raw: &redis::aio::ConnectionManager,
    prefix: &str,
    secs: f64,
    tasks: usize,
    size: usize,
    next: &Arc<AtomicU64>,
) -> f64 {
    messages_per_second(secs, tasks, |_, round| {
        let (store, mut raw, next) = (store.clone(), raw.clone(), next.clone());
        let prefix = prefix.to_owned();
        async move {
            while round.going() {
                let first = next.fetch_add(size as u64, Ordering::Relaxed);
                let msgs: Vec<Msg> = (first..first + size as u64).map(|id| Msg { id }).collect();
                match variant {
                    0 => {
                        let mut pipe = redis::pipe();
                        for m in &msgs {
                            pipe.cmd("SET")
                                .arg(format!("{prefix}:raw:{}", m.id))
                                .arg(1)
                                .arg("NX")
                                .arg("PX")
                                .arg(600_000);
                        }
                        let set: Vec<Option<String>> =
                            pipe.query_async(&mut raw).await.expect("raw pipeline");
                        assert!(set.iter().all(Option::is_some));
                    }
                    1 => {
                        let results = batch(&store, &msgs).await.expect("batch call");
                        assert!(
                            results
                                .iter()
                                .all(|r| matches!(r, Ok(o) if o.is_executed()))
                        );
                    }
                    _ => {
                        for msg in &msgs {
                            if !round.going() {
                                break;
                            }
                            assert!(single(&store, msg).await.expect("call").is_executed());
                            round.handled();
                        }
                        continue;
                    }
                }
                round.handled_many(size);
            }
        }
    })
    .await
}

/// redis-server's user + system CPU so far, in seconds (`INFO cpu`).
async fn server_seconds(
    admin: &mut redis::aio::ConnectionManager,
) -> Result<f64, redis::RedisError> {
    let info: String = redis::cmd("INFO").arg("cpu").query_async(admin).await?;
    Ok(info
        .lines()
        .filter_map(|l| l.split_once(':'))
        .filter(|(name, _)| matches!(*name, "used_cpu_sys" | "used_cpu_user"))
        .filter_map(|(_, v)| v.trim().parse::<f64>().ok())
        .sum())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let secs: f64 = env("SECS", 3.0);
    let rounds: usize = env("ROUNDS", 5);
    let tasks: usize = env("TASKS", 4);
    let size: usize = env("BATCH", 1000);
    let prefix = format!("idem-bench-batch-{}", std::process::id());
    let store = RedisStore::connect(&url).await?.with_prefix(&prefix)?;
    let raw = redis::Client::open(url.as_str())?
        .get_connection_manager()
        .await?;
    let next = Arc::new(AtomicU64::new(1));

    let mut admin = raw.clone();
    println!(
        "{tasks} consumers, batches of {size}, {rounds} rounds of {secs} s per variant, interleaved; load average {}",
        idem_examples::cpu::load_average()
    );
    for v in 0..VARIANTS.len() {
        run(v, &store, &raw, &prefix, 0.5, tasks, size, &next).await;
    }
    let n = VARIANTS.len();
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); n];
    // Per variant: keys, this process's CPU seconds, the server's.
    let mut costs = vec![(0.0, 0.0, 0.0); n];
    let mut marks = Rounds::default();
    for round in 0..rounds {
        let watch = Watch::start()?;
        for i in 0..n {
            let v = (i + round) % n;
            let (client, server) = (process_seconds()?, server_seconds(&mut admin).await?);
            let rate = run(v, &store, &raw, &prefix, secs, tasks, size, &next).await;
            costs[v].0 += rate * secs;
            costs[v].1 += process_seconds()? - client;
            costs[v].2 += server_seconds(&mut admin).await? - server;
            rates[v].push(rate);
            // Every run starts on the same server: without the keys of the
            // runs before (millions), which would make the later runs pay
            // for a bigger keyspace (and its rehashing).
            idem_examples::delete_redis_prefix(&url, &prefix).await?;
        }
        let cpu = marks.push(watch.stop()?);
        let line: Vec<String> = (0..n)
            .map(|v| format!("{} {:.0}", VARIANTS[v], rates[v][round]))
            .collect();
        println!("round {}: {} keys/s ({cpu})", round + 1, line.join(", "));
    }
    println!("{}", marks.summary());
    let medians: Vec<_> = rates.iter().map(|r| marks.medians(r)).collect();
    println!(
        "{:<24} {:>28} {:>24}   CPU a key: client + Redis",
        "variant", "median keys/s", "/raw pipeline"
    );
    for (i, name) in VARIANTS.iter().enumerate() {
        let (keys, client, server) = costs[i];
        println!(
            "{name:<24} {:>28} {:>24}   {:.2} + {:.2} us",
            medians[i].to_string(),
            format!("{:.3}", medians[i].ratio(&medians[0])),
            client * 1e6 / keys,
            server * 1e6 / keys,
        );
    }
    println!(
        "idem batch / one call at a time: {:.1}x",
        medians[1].all / medians[2].all
    );
    if let Some(quiet) = medians[1].ratio(&medians[0]).quiet {
        println!("idem batch/raw pipeline over unmarked rounds: {quiet:.3}");
    }
    idem_examples::delete_redis_prefix(&url, &prefix).await?;
    println!(
        "idem batch/raw pipeline: {:.3}",
        medians[1].all / medians[0].all
    );
    Ok(())
}
