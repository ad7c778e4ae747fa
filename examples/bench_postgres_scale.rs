//! The dedup table at volume: a plain table against one partitioned by day
//! (`PgStore::with_partitions`), grown side by side to 20 million rows,
//! with claim latency, table size and the cost of expiry at each size.
//!
//! ```text
//! cargo run --release -p idem-examples --features postgres --example bench_postgres_scale
//! STAGES=1000000,5000000,10000000,20000000 CALLS=2000 ROUNDS=3 TASKS=4 cargo run --release ...
//! ```
//!
//! Both tables hold what a consumer with a 7-day ttl leaves: completed
//! rows expiring 7 days after they were written, seven eighths of them
//! written over the last 7 days (live) and, at each size, an eighth of the
//! rows added written on a day of their own more than 7 days ago
//! (expired). The partitioned table has a partition a day (made by the
//! benchmark for the past days, by `migrate` for today and ahead). The rows are inserted in
//! bulk with SQL (the partitioned table's insert trigger off meanwhile:
//! the keys are fresh), then `VACUUM ANALYZE`d, as autovacuum would.
//!
//! Two more tables, one of each layout, stay at the first size (1 million
//! rows) as references: at each size, `ROUNDS` rounds of `CALLS` fresh
//! claims by `TASKS` concurrent tasks run on the four tables in turn,
//! through a lease-mode handler with an empty body (a claim and a
//! completion), so that a grown table and its reference are measured
//! under the same load. Each table's claim latency (the
//! `idem_claim_seconds` samples): the median and the 99th percentile,
//! medians over the rounds, and the grown table's 99th percentile over its
//! reference's, with the machine's busy and stolen CPU during the rounds
//! (each round's too: one whose steal passed 5 % is marked `!` and taken
//! again, at most `ROUNDS` times a size); then the tables' sizes (heap and
//! indexes, every partition's). Then, at each size, the expiry of that
//! size's expired rows: the sweeper's `sweep_expired(10_000)` until it is
//! done, on each table, with a stream of claims running beside it: the
//! seconds per million rows removed, the claims' 99th percentile
//! meanwhile, and the size after. The last line gives the ratios at the
//! largest size. The tables are dropped at the end; at 20 million rows
//! they take about 9 GB on disk.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem_examples::cpu::{Cpu, STEAL_MARK, load_average};
use idem_examples::{env, median};
use idem_runtime::store::sql::Partitions;
use idem_runtime::{PgStore, idempotent};
use sqlx::postgres::PgPoolOptions;
use sqlx::{AssertSqlSafe, PgPool};

#[derive(Debug)]
struct Ping {
    id: String,
}

#[idempotent(key = "id", ttl = "7d", store = "postgres", name = "scale_ping")]
async fn ping(msg: &Ping) -> Result<(), std::io::Error> {
    let _ = &msg.id;
    Ok(())
}

const DAY_MS: i64 = 86_400_000;

const PLAIN: &str = "scale_plain";
const PARTED: &str = "scale_parted";
const PLAIN_REF: &str = "scale_plain_ref";
const PARTED_REF: &str = "scale_parted_ref";

/// Collects the claim-latency histogram samples the runtime records.
mod recorder {
    use std::sync::{Arc, Mutex};

    use metrics::{
        Counter, Gauge, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder, SharedString,
        Unit,
    };

    pub(crate) struct Samples(pub(crate) Arc<Mutex<Vec<f64>>>);

    impl HistogramFn for Samples {
        fn record(&self, value: f64) {
            if let Ok(mut v) = self.0.lock() {
                v.push(value);
            }
        }
    }

    pub(crate) struct ClaimRecorder(pub(crate) Arc<Mutex<Vec<f64>>>);

    impl Recorder for ClaimRecorder {
        fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn register_counter(&self, _: &Key, _: &Metadata<'_>) -> Counter {
            Counter::noop()
        }
        fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
            Gauge::noop()
        }
        fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
            if key.name() == idem_runtime::metric::CLAIM_SECONDS {
                Histogram::from_arc(Arc::new(Samples(self.0.clone())))
            } else {
                Histogram::noop()
            }
        }
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The `q`-quantile of `samples`, in ms.
fn quantile_ms(samples: &mut [f64], q: f64) -> f64 {
    if samples.is_empty() {
        return f64::NAN;
    }
    samples.sort_by(f64::total_cmp);
    let at = ((samples.len() - 1) as f64 * q).round() as usize;
    samples[at] * 1e3
}

/// Whether `table` is one of the partitioned tables.
fn is_partitioned(table: &str) -> bool {
    table == PARTED || table == PARTED_REF
}

/// Makes the partition of `day` (days since the epoch) of the partitioned
/// `table`, named as its sweep names it, if it is missing.
async fn day_partition(pool: &PgPool, table: &str, day: i64) -> Result<(), BoxError> {
    sqlx::raw_sql(AssertSqlSafe(format!(
        "CREATE TABLE IF NOT EXISTS {table}_p{day} PARTITION OF {table}
         FOR VALUES FROM ({day}) TO ({})",
        day + 1
    )))
    .execute(pool)
    .await?;
    Ok(())
}

/// Heap and indexes of `table`, every partition's included, in MB.
async fn size_mb(pool: &PgPool, table: &str) -> Result<f64, BoxError> {
    let bytes: i64 = sqlx::query_scalar(
        "SELECT COALESCE(sum(pg_total_relation_size(relid)),
                         pg_total_relation_size(to_regclass($1)))::bigint
         FROM pg_partition_tree(to_regclass($1))",
    )
    .bind(table)
    .fetch_one(pool)
    .await?;
    Ok(bytes as f64 / 1e6)
}

/// Adds `rows` rows as a 7-day ttl leaves them: seven eighths written at
/// random over the 7 days before `now_ms`, live, and an eighth written on
/// day `expired_day` (days since the epoch, more than 7 days ago), expired
/// (each, in a partitioned table, in the partition of its day).
async fn fill(
    pool: &PgPool,
    table: &str,
    rows: i64,
    now_ms: i64,
    expired_day: i64,
) -> Result<(), BoxError> {
    let (part, day) = if is_partitioned(table) {
        (", part", format!(", t / {DAY_MS}"))
    } else {
        ("", String::new())
    };
    // In slices, so that no one statement holds millions of rows' locks.
    let slice = 1_000_000;
    let mut done = 0;
    while done < rows {
        let n = slice.min(rows - done);
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {table} (handler, key, status, token, outcome, attempts,
                                  created_at, updated_at, expires_at{part})
             SELECT 'scale_ping', '36:' || gen_random_uuid()::text, 'completed', NULL, 'null', 1,
                    t, t, t + 7 * {DAY_MS}{day}
             FROM (SELECT CASE WHEN g % 8 = 0
                               THEN $3 * {DAY_MS} + (random() * {DAY_MS})::bigint
                               ELSE $2 - (random() * 7 * {DAY_MS})::bigint END AS t
                   FROM generate_series(1, $1) AS g) AS g"
        )))
        .bind(n)
        .bind(now_ms)
        .bind(expired_day)
        .execute(pool)
        .await?;
        done += n;
    }
    Ok(())
}

/// [`fill`]s `table` with `rows` more rows, as fast as it goes (a
/// partitioned table's insert trigger off: the keys are fresh), then
/// `VACUUM ANALYZE`s it as autovacuum would.
async fn fill_bulk(
    pool: &PgPool,
    table: &str,
    rows: i64,
    now_ms: i64,
    expired_day: i64,
) -> Result<(), BoxError> {
    let parted = is_partitioned(table);
    if parted {
        sqlx::raw_sql(AssertSqlSafe(format!(
            "ALTER TABLE {table} DISABLE TRIGGER idem_bring"
        )))
        .execute(pool)
        .await?;
    }
    fill(pool, table, rows, now_ms, expired_day).await?;
    if parted {
        sqlx::raw_sql(AssertSqlSafe(format!(
            "ALTER TABLE {table} ENABLE TRIGGER idem_bring"
        )))
        .execute(pool)
        .await?;
    }
    // A statement of its own: VACUUM runs outside a transaction.
    sqlx::raw_sql(AssertSqlSafe(format!("VACUUM ANALYZE {table}")))
        .execute(pool)
        .await?;
    Ok(())
}

/// The claims of one round on `store`: `calls` fresh keys by `tasks`
/// tasks; the claim-latency samples.
async fn round(
    store: &PgStore,
    samples: &Arc<Mutex<Vec<f64>>>,
    calls: usize,
    tasks: usize,
) -> Result<Vec<f64>, BoxError> {
    if let Ok(mut s) = samples.lock() {
        s.clear();
    }
    let mut joins = Vec::new();
    for _ in 0..tasks {
        let store = store.clone();
        joins.push(tokio::spawn(async move {
            for _ in 0..calls / tasks {
                let msg = Ping {
                    id: uuid::Uuid::new_v4().to_string(),
                };
                assert!(ping(&store, &msg).await?.is_executed());
            }
            Ok::<_, BoxError>(())
        }));
    }
    for j in joins {
        j.await??;
    }
    Ok(samples.lock().map(|s| s.clone()).unwrap_or_default())
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let stages: Vec<i64> = std::env::var("STAGES")
        .unwrap_or_else(|_| "1000000,5000000,10000000,20000000".into())
        .split(',')
        .map(|s| s.trim().parse())
        .collect::<Result<_, _>>()?;
    let calls: usize = env("CALLS", 2_000);
    let rounds: usize = env("ROUNDS", 3);
    let tasks: usize = env("TASKS", 4);

    let samples = Arc::new(Mutex::new(Vec::new()));
    metrics::set_global_recorder(recorder::ClaimRecorder(samples.clone()))
        .map_err(|e| e.to_string())?;
    let pool = PgPoolOptions::new()
        .max_connections(tasks as u32 + 2)
        .connect(&url)
        .await?;
    let mut cleanup = String::new();
    for parted in [PARTED, PARTED_REF] {
        cleanup.push_str(&format!(
            "DROP TABLE IF EXISTS {parted} CASCADE;
             DROP FUNCTION IF EXISTS {parted}_idem_bring() CASCADE;
             DROP FUNCTION IF EXISTS {parted}_idem_maintain(bigint, bigint);"
        ));
    }
    cleanup.push_str(&format!("DROP TABLE IF EXISTS {PLAIN}, {PLAIN_REF};"));
    sqlx::raw_sql(AssertSqlSafe(cleanup.clone()))
        .execute(&pool)
        .await?;
    let now_ms: i64 =
        sqlx::query_scalar("SELECT (extract(epoch from statement_timestamp()) * 1000)::bigint")
            .fetch_one(&pool)
            .await?;
    let today = now_ms / DAY_MS;
    // The grown tables first, then their references.
    let mut stores = Vec::new();
    for table in [PLAIN, PARTED, PLAIN_REF, PARTED_REF] {
        let store = PgStore::from_pool(pool.clone()).with_table(table)?;
        let store = if is_partitioned(table) {
            let store = store.with_partitions(Partitions::daily());
            store.migrate().await?;
            // the last 7 days, live, and the day of the reference's expired rows
            for day in today - 9..today {
                day_partition(&pool, table, day).await?;
            }
            store
        } else {
            store.migrate().await?;
            store
        };
        stores.push((table, store));
    }
    println!(
        "plain `{PLAIN}` against `{PARTED}`, partitioned by day ({} partitions), each beside a reference of the first size; {rounds} rounds of {calls} claims by {tasks} tasks on each at each size; load average {}",
        9 + Partitions::daily().ahead(),
        load_average()
    );
    println!(
        "{:>10} | {:>9} {:>9} {:>7} {:>7} | {:>9} {:>9} {:>7} {:>7} | {:>6} {:>6}",
        "rows",
        "plain p50",
        "p99",
        "/ref",
        "MB",
        "parts p50",
        "p99",
        "/ref",
        "MB",
        "busy%",
        "steal%"
    );
    let reference = stages.first().copied().unwrap_or(0);
    for (table, _) in &stores[2..] {
        fill_bulk(&pool, table, reference, now_ms, today - 9).await?;
    }

    let mut filled = 0;
    let mut last = (0.0, 0.0, 0.0, 0.0);
    let mut sweeps = Vec::new();
    for (k, &stage) in stages.iter().enumerate() {
        let started = Instant::now();
        // This size's expired rows in a day of their own, the oldest first,
        // whose partition is made now: a sweep drops an old partition
        // once it is empty.
        let expired_day = today - 9 - (stages.len() - k) as i64;
        day_partition(&pool, PARTED, expired_day).await?;
        for (table, _) in &stores[..2] {
            fill_bulk(&pool, table, stage - filled, now_ms, expired_day).await?;
        }
        filled = stage;
        let fill_s = started.elapsed().as_secs_f64();

        // p50 and p99 of each table, per round; a round over the steal
        // mark (`cpu::STEAL_MARK`, 5 %) is marked `!` and taken again, at
        // most `rounds` times a size
        let mut p: Vec<[Vec<f64>; 2]> = vec![[Vec::new(), Vec::new()]; 4];
        let cpu = Cpu::now()?;
        let mut conditions = Vec::new();
        let mut marked = 0;
        for r in 0..=rounds {
            let mut again = true;
            while again {
                let before = Cpu::now()?;
                let mut taken = Vec::new();
                for (_, store) in &stores {
                    let mut s = round(store, &samples, calls, tasks).await?;
                    taken.push([quantile_ms(&mut s, 0.5), quantile_ms(&mut s, 0.99)]);
                }
                let (busy, steal) = Cpu::now()?.since(before);
                conditions.push(format!("{busy:.0}/{steal:.1}"));
                again = steal > STEAL_MARK && marked < rounds;
                if steal > STEAL_MARK {
                    marked += 1;
                    if let Some(c) = conditions.last_mut() {
                        c.push('!');
                    }
                }
                // Round 0 warms the caches and is not counted, nor a round
                // repeated for its steal.
                if r > 0 && !again {
                    for (i, [p50, p99]) in taken.into_iter().enumerate() {
                        p[i][0].push(p50);
                        p[i][1].push(p99);
                    }
                }
            }
        }
        let (busy, steal) = Cpu::now()?.since(cpu);
        let [p50, p99] = p[0].clone().map(median);
        let [q50, q99] = p[1].clone().map(median);
        let plain_ref = median(p[2][1].clone());
        let parted_ref = median(p[3][1].clone());
        let plain_mb = size_mb(&pool, PLAIN).await?;
        let parted_mb = size_mb(&pool, PARTED).await?;
        let (plain_x, parted_x) = (p99 / plain_ref, q99 / parted_ref);
        println!(
            "{stage:>10} | {p50:>9.3} {p99:>9.3} {plain_x:>7.3} {plain_mb:>7.0} | {q50:>9.3} {q99:>9.3} {parted_x:>7.3} {parted_mb:>7.0} | {busy:>6.1} {steal:>6.1}   (filled in {fill_s:.0} s; rounds' busy/steal % {})",
            conditions.join(" ")
        );
        last = (plain_x, parted_x, plain_mb, parted_mb);

        // Expiry: this size's expired rows.
        for (name, store) in &stores[..2] {
            let name = *name;
            let going = Arc::new(std::sync::atomic::AtomicBool::new(true));
            if let Ok(mut s) = samples.lock() {
                s.clear();
            }
            let mut joins = Vec::new();
            for _ in 0..tasks {
                let (store, going) = (store.clone(), going.clone());
                joins.push(tokio::spawn(async move {
                    while going.load(std::sync::atomic::Ordering::Relaxed) {
                        let msg = Ping {
                            id: uuid::Uuid::new_v4().to_string(),
                        };
                        assert!(ping(&store, &msg).await?.is_executed());
                    }
                    Ok::<_, BoxError>(())
                }));
            }
            let cpu = Cpu::now()?;
            let started = Instant::now();
            let mut removed = 0u64;
            loop {
                let n = store.sweep_expired(10_000).await?;
                removed += n;
                if n < 10_000 {
                    break;
                }
            }
            let took = started.elapsed().as_secs_f64();
            going.store(false, std::sync::atomic::Ordering::Relaxed);
            for j in joins {
                j.await??;
            }
            let (busy, steal) = Cpu::now()?.since(cpu);
            let mut s = samples.lock().map(|s| s.clone()).unwrap_or_default();
            let p99 = quantile_ms(&mut s, 0.99);
            let mb = size_mb(&pool, name).await?;
            let per_million = took / (removed.max(1) as f64 / 1e6);
            println!(
                "{:>10}   sweep of {name}: {removed} expired rows in {took:.2} s ({per_million:.3} s per million), claims' p99 meanwhile {p99:.3} ms over {} claims, {mb:.0} MB after; busy {busy:.1} %, steal {steal:.1} %",
                "",
                s.len()
            );
            sweeps.push((per_million, p99, mb));
        }
    }
    sqlx::raw_sql(AssertSqlSafe(cleanup)).execute(&pool).await?;
    tokio::time::sleep(Duration::from_millis(10)).await;

    let (plain_x, parted_x, plain_mb, parted_mb) = last;
    let largest = stages.last().copied().unwrap_or(0);
    println!(
        "p99 at {largest} / at {reference}: plain {plain_x:.3}, partitioned {parted_x:.3}; size at {largest} partitioned/plain {:.3}; sweep per million partitioned/plain {:.4}; size after the sweep partitioned/plain {:.3}",
        parted_mb / plain_mb,
        sweeps[sweeps.len() - 1].0 / sweeps[sweeps.len() - 2].0,
        sweeps[sweeps.len() - 1].2 / sweeps[sweeps.len() - 2].2,
    );
    Ok(())
}
