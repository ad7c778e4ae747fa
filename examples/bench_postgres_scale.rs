//! Claim latency against the size of the dedup table: 100,000 rows against
//! 10,000,000 rows, measured interleaved in one run.
//!
//! ```text
//! cargo run --release -p idem-examples --features postgres --example bench_postgres_scale
//! DATABASE_URL=postgres://... BIG=10000000 SMALL=100000 CALLS=2000 ROUNDS=5 cargo run --release ...
//! ```
//!
//! Both tables are filled with rows of the shape idem writes (random keys, a
//! one-day expiry), then a lease-mode handler with an empty body claims and
//! completes fresh random keys in each, alternating batches. It prints the
//! median claim latency (the `idem_claim_seconds` histogram's samples) of
//! each table and ends with `big/small: <ratio>`. Filling ten million rows
//! takes a minute or two; the tables are dropped at the end.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_examples::{env, median};
use idem_runtime::{PgStore, idempotent};
use serde::Deserialize;
use sqlx::postgres::PgPoolOptions;

#[derive(Debug, Deserialize)]
struct Ping {
    id: String,
}

#[idempotent(key = "id", ttl = "24h", store = "postgres", name = "scale_ping")]
async fn ping(msg: &Ping) -> Result<(), std::io::Error> {
    let _ = &msg.id;
    Ok(())
}

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

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let big: i64 = env("BIG", 10_000_000);
    let small: i64 = env("SMALL", 100_000);
    let calls: usize = env("CALLS", 2_000);
    let rounds: usize = env("ROUNDS", 5);

    let samples = Arc::new(Mutex::new(Vec::new()));
    metrics::set_global_recorder(recorder::ClaimRecorder(samples.clone()))?;

    let pool = PgPoolOptions::new()
        .max_connections(2)
        .connect(&url)
        .await?;
    let mut stores = Vec::new();
    for (table, rows) in [("scale_small", small), ("scale_big", big)] {
        let store = PgStore::from_pool(pool.clone()).with_table(table)?;
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP TABLE IF EXISTS {table}")))
            .execute(&pool)
            .await?;
        store.migrate().await?;
        let started = std::time::Instant::now();
        // Rows as idem writes them: random keys, completed, expiring in a day.
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {table} (handler, key, status, token, outcome, attempts, created_at, updated_at, expires_at)
             SELECT 'scale_ping', '36:' || gen_random_uuid()::text, 'completed', NULL, 'null', 1, $2, $2, $2 + 86400000 + g
             FROM generate_series(1, $1) g"
        )))
        .bind(rows)
        .bind(idem_runtime::clock::Clock::now_millis(&idem_runtime::clock::SystemClock))
        .execute(&pool)
        .await?;
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("VACUUM ANALYZE {table}")))
            .execute(&pool)
            .await?;
        println!(
            "{table}: {rows} rows in {:.1} s",
            started.elapsed().as_secs_f64()
        );
        stores.push(store);
    }

    let mut medians: Vec<Vec<f64>> = vec![Vec::new(), Vec::new()];
    for round in 0..=rounds {
        for (i, store) in stores.iter().enumerate() {
            if let Ok(mut s) = samples.lock() {
                s.clear();
            }
            for _ in 0..calls {
                let msg = Ping {
                    id: uuid::Uuid::new_v4().to_string(),
                };
                assert!(ping(store, &msg).await?.is_executed());
            }
            let taken = samples.lock().map(|s| s.clone()).unwrap_or_default();
            // Round 0 warms caches and is not counted.
            if round > 0 {
                medians[i].push(median(taken));
            }
        }
    }
    let small_ms = median(medians[0].clone()) * 1e3;
    let big_ms = median(medians[1].clone()) * 1e3;
    println!(
        "median claim latency: {small} rows {small_ms:.3} ms, {big} rows {big_ms:.3} ms ({rounds} rounds of {calls} claims each)"
    );
    sqlx::raw_sql("DROP TABLE IF EXISTS scale_small, scale_big")
        .execute(&pool)
        .await?;
    tokio::time::sleep(Duration::from_millis(10)).await;
    println!("big/small: {:.3}", big_ms / small_ms);
    Ok(())
}
