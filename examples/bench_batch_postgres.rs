//! Keys per second through a batch handler on PostgreSQL, against the same
//! keys one call at a time and against the limit, a raw multi-row insert,
//! as ratios measured in one run.
//!
//! ```text
//! cargo run --release -p idem-examples --features postgres --example bench_batch_postgres
//! DATABASE_URL=postgres://... SECS=3 ROUNDS=5 TASKS=4 BATCH=1000 cargo run --release -p idem-examples --features postgres --example bench_batch_postgres
//! ```
//!
//! Every key is fresh. `TASKS` consumers, each with a connection of its
//! own, run one variant at a time; the variants take turns round after
//! round (`ROUNDS` rounds of `SECS` seconds each):
//!
//! * `raw insert`: the limit, `INSERT INTO t (key) SELECT * FROM
//!   unnest($1::text[]) ON CONFLICT DO NOTHING` of `BATCH` keys in one
//!   statement, the dedup step a batch consumer writes by hand (no recorded
//!   outcome, no transaction around a body);
//! * `raw insert, idem's rows`: the same statement writing the rows idem
//!   writes (status, outcome, times, expiry index) into a copy of its table:
//!   what of the gap is the wider row;
//! * `idem batch (tx)`: a transaction-mode batch handler with an empty
//!   body over `BATCH` messages: `BEGIN`, one read of the batch's records,
//!   one insert of the dedup rows with their outcomes, `COMMIT`;
//! * `idem batch (lease)`: the same handler in lease mode: one insert of
//!   the claims, one update recording the outcomes;
//! * `idem one call at a time`: a transaction-mode handler called once per
//!   message.
//!
//! Each round prints every variant's keys per second and what the machine
//! did meanwhile (busy, idle and steal shares from `/proc/stat`, marked
//! `STOLEN` above 5 % steal; see `examples/src/cpu.rs`). Then each
//! variant's median keys per second and its ratio to the raw insert, over
//! all rounds and over the unmarked ones, and the CPU a key cost: this
//! process (the client, `/proc/self/stat`) and the PostgreSQL backends of
//! its pool's connections (`/proc/<pid>/stat`, PostgreSQL on this host). It ends with `idem batch/raw insert: <ratio>`
//! (over all rounds).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use idem_examples::cpu::{Rounds, Watch, pids_seconds, process_seconds};
use idem_examples::{env, messages_per_second, pg_backends};
use idem_runtime::{PgStore, PgTx, idempotent};
use serde::Deserialize;
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

#[derive(Debug, Clone, Deserialize)]
struct Msg {
    id: u64,
}

#[idempotent(key = "id", ttl = "24h", store = "postgres", name = "bench_batch_tx")]
async fn batch_tx(tx: &mut PgTx<'_>, msgs: &[Msg]) -> Result<Vec<u64>, sqlx::Error> {
    let _ = tx;
    Ok(msgs.iter().map(|m| m.id).collect())
}

#[idempotent(
    key = "id",
    ttl = "24h",
    store = "postgres",
    name = "bench_batch_lease"
)]
async fn batch_lease(msgs: &[Msg]) -> Result<Vec<u64>, sqlx::Error> {
    Ok(msgs.iter().map(|m| m.id).collect())
}

#[idempotent(
    key = "id",
    ttl = "24h",
    store = "postgres",
    name = "bench_batch_single"
)]
async fn single(tx: &mut PgTx<'_>, msg: &Msg) -> Result<u64, sqlx::Error> {
    let _ = tx;
    Ok(msg.id)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Variant {
    Raw,
    RawRows,
    BatchTx,
    BatchLease,
    Single,
}

const VARIANTS: [Variant; 5] = [
    Variant::Raw,
    Variant::RawRows,
    Variant::BatchTx,
    Variant::BatchLease,
    Variant::Single,
];

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::Raw => "raw insert",
            Variant::RawRows => "raw insert, idem's rows",
            Variant::BatchTx => "idem batch (tx)",
            Variant::BatchLease => "idem batch (lease)",
            Variant::Single => "idem one call at a time",
        }
    }
}

/// The store's dedup table.
const TABLE: &str = "bench_batch_keys";

async fn drop_tables(pool: &PgPool) -> Result<(), sqlx::Error> {
    sqlx::query("DROP TABLE IF EXISTS bench_batch_raw, bench_batch_raw_rows, bench_batch_keys, bench_batch_keys_outbox")
        .execute(pool)
        .await?;
    Ok(())
}

async fn run(
    variant: Variant,
    store: &PgStore,
    pool: &PgPool,
    secs: f64,
    tasks: usize,
    batch: usize,
    next: &Arc<AtomicU64>,
) -> f64 {
    messages_per_second(secs, tasks, |_, round| {
        let (store, pool, next) = (store.clone(), pool.clone(), next.clone());
        async move {
            while round.going() {
                let first = next.fetch_add(batch as u64, Ordering::Relaxed);
                let msgs: Vec<Msg> = (first..first + batch as u64).map(|id| Msg { id }).collect();
                match variant {
                    Variant::Raw => {
                        let keys: Vec<String> =
                            msgs.iter().map(|m| format!("m-{}", m.id)).collect();
                        sqlx::query(
                            "INSERT INTO bench_batch_raw (key) SELECT * FROM unnest($1::text[])
                             ON CONFLICT DO NOTHING",
                        )
                        .bind(&keys)
                        .execute(&pool)
                        .await
                        .expect("raw insert");
                    }
                    Variant::RawRows => {
                        let keys: Vec<String> =
                            msgs.iter().map(|m| format!("m-{}", m.id)).collect();
                        let outcomes: Vec<String> = msgs.iter().map(|m| m.id.to_string()).collect();
                        sqlx::query(
                            "INSERT INTO bench_batch_raw_rows (handler, key, status, outcome,
                                 attempts, failures, created_at, updated_at, expires_at)
                             SELECT 'h', k, 'completed', o, 1, 0, 1, 1, 86400001
                             FROM unnest($1::text[], $2::text[]) AS r(k, o)
                             ON CONFLICT DO NOTHING",
                        )
                        .bind(&keys)
                        .bind(&outcomes)
                        .execute(&pool)
                        .await
                        .expect("raw insert of rows");
                    }
                    Variant::BatchTx => {
                        let results = batch_tx(&store, &msgs).await.expect("batch call");
                        assert!(
                            results
                                .iter()
                                .all(|r| matches!(r, Ok(o) if o.is_executed()))
                        );
                    }
                    Variant::BatchLease => {
                        let results = batch_lease(&store, &msgs).await.expect("batch call");
                        assert!(
                            results
                                .iter()
                                .all(|r| matches!(r, Ok(o) if o.is_executed()))
                        );
                    }
                    Variant::Single => {
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
                round.handled_many(batch);
            }
        }
    })
    .await
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let secs: f64 = env("SECS", 3.0);
    let rounds: usize = env("ROUNDS", 5);
    let tasks: usize = env("TASKS", 4);
    let batch: usize = env("BATCH", 1000);

    let pool = PgPoolOptions::new()
        .max_connections(u32::try_from(tasks).unwrap_or(4))
        .connect(&url)
        .await?;
    drop_tables(&pool).await?;
    sqlx::query("CREATE TABLE bench_batch_raw (key TEXT PRIMARY KEY)")
        .execute(&pool)
        .await?;
    let store = PgStore::from_pool(pool.clone()).with_table(TABLE)?;
    store.migrate().await?;
    sqlx::query("CREATE TABLE bench_batch_raw_rows (LIKE bench_batch_keys INCLUDING ALL)")
        .execute(&pool)
        .await?;
    let next = Arc::new(AtomicU64::new(1));

    println!(
        "{tasks} consumers, batches of {batch}, {rounds} rounds of {secs} s per variant, interleaved; load average {}",
        idem_examples::cpu::load_average()
    );
    for variant in VARIANTS {
        run(variant, &store, &pool, 0.5, tasks, batch, &next).await;
    }
    let backends = pg_backends(&pool, tasks).await?;
    let n = VARIANTS.len();
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); n];
    // Per variant: keys, this process's CPU seconds, PostgreSQL's.
    let mut costs = vec![(0.0, 0.0, 0.0); n];
    let mut marks = Rounds::default();
    for round in 0..rounds {
        let watch = Watch::start()?;
        for i in 0..n {
            let v = (i + round) % n;
            let (client, server) = (process_seconds()?, pids_seconds(&backends)?);
            let rate = run(VARIANTS[v], &store, &pool, secs, tasks, batch, &next).await;
            costs[v].0 += rate * secs;
            costs[v].1 += process_seconds()? - client;
            costs[v].2 += pids_seconds(&backends)? - server;
            rates[v].push(rate);
        }
        let cpu = marks.push(watch.stop()?);
        let line: Vec<String> = (0..n)
            .map(|v| format!("{} {:.0}", VARIANTS[v].name(), rates[v][round]))
            .collect();
        println!("round {}: {} keys/s ({cpu})", round + 1, line.join(", "));
    }
    println!("{}", marks.summary());
    let medians: Vec<_> = rates.iter().map(|r| marks.medians(r)).collect();
    println!(
        "{:<26} {:>28} {:>24}   CPU a key: client + PostgreSQL",
        "variant", "median keys/s", "/raw insert"
    );
    for (i, variant) in VARIANTS.iter().enumerate() {
        let (keys, client, server) = costs[i];
        println!(
            "{:<26} {:>28} {:>24}   {:.2} + {:.2} us",
            variant.name(),
            medians[i].to_string(),
            format!("{:.3}", medians[i].ratio(&medians[0])),
            client * 1e6 / keys,
            server * 1e6 / keys,
        );
    }
    println!(
        "idem batch (tx) / raw insert, idem's rows: {:.3}; / one call at a time: {:.1}x",
        medians[2].all / medians[1].all,
        medians[2].all / medians[4].all
    );
    if let Some(quiet) = medians[2].ratio(&medians[0]).quiet {
        println!("idem batch/raw insert over unmarked rounds: {quiet:.3}");
    }
    drop_tables(&pool).await?;
    println!(
        "idem batch/raw insert: {:.3}",
        medians[2].all / medians[0].all
    );
    Ok(())
}
