//! What an idempotent Postgres handler costs against the same business
//! transaction without idem, as ratios measured in one run.
//!
//! ```text
//! cargo run --release -p idem-examples --example bench_postgres
//! DATABASE_URL=postgres://... SECS=5 ROUNDS=5 TASKS=8 cargo run --release -p idem-examples --example bench_postgres
//! ```
//!
//! The business transaction is the one of `shared/bench/pg-limit`: deduct one
//! unit from one of 10,000 stock rows (`BEGIN; UPDATE ...; COMMIT`). Three
//! variants run interleaved, round after round, each for `SECS` seconds with
//! `TASKS` concurrent consumers on a pool of as many connections:
//!
//! * `bare`: the business transaction alone;
//! * `idem (claim last)`: the same body in an `#[idempotent]` handler that
//!   records its outcome, the store's default order;
//! * `idem (claim first)`: the same with `ClaimOrder::First`;
//! * `idem + fingerprint`: claim last, with `fingerprint = "sku"`: the cost
//!   of a payload fingerprint (a digest per message, one more column);
//! * `idem + max_attempts`: with `max_attempts = 5`, which claims first and
//!   takes a savepoint after the claim: the cost of counting failures.
//!
//! Every message is fresh (a new message id). It prints each variant's median
//! throughput and its ratio to `bare`, then counts the statements a fresh
//! message and a duplicate cost, and ends with the line `idem/bare: <ratio>`
//! for the default order.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use idem_examples::{env, median, messages_per_second, statement_log};
use idem_runtime::ClaimOrder;
use idem_runtime::{PgStore, PgTx, idempotent};
use serde::Deserialize;
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

#[derive(Debug, Deserialize)]
struct Deduct {
    message_id: i64,
    sku: i64,
}

async fn deduct(conn: &mut sqlx::PgConnection, sku: i64) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE bench_inventory SET stock = stock - 1 WHERE sku = $1")
        .bind(sku)
        .execute(conn)
        .await?;
    Ok(())
}

#[idempotent(
    key = "message_id",
    ttl = "24h",
    store = "postgres",
    name = "bench_deduct"
)]
async fn deduct_idem(tx: &mut PgTx<'_>, msg: &Deduct) -> Result<i64, sqlx::Error> {
    deduct(tx, msg.sku).await?;
    Ok(msg.sku)
}

#[idempotent(
    key = "message_id",
    ttl = "24h",
    store = "postgres",
    name = "bench_deduct_fingerprinted",
    fingerprint = "sku"
)]
async fn deduct_fingerprinted(tx: &mut PgTx<'_>, msg: &Deduct) -> Result<i64, sqlx::Error> {
    deduct(tx, msg.sku).await?;
    Ok(msg.sku)
}

#[idempotent(
    key = "message_id",
    ttl = "24h",
    store = "postgres",
    name = "bench_deduct_counted",
    max_attempts = 5
)]
async fn deduct_counted(tx: &mut PgTx<'_>, msg: &Deduct) -> Result<i64, sqlx::Error> {
    deduct(tx, msg.sku).await?;
    Ok(msg.sku)
}

async fn deduct_bare(pool: &PgPool, msg: &Deduct) -> Result<(), sqlx::Error> {
    let mut tx = pool.begin().await?;
    deduct(&mut tx, msg.sku).await?;
    tx.commit().await
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Variant {
    Bare,
    Idem(ClaimOrder),
    Fingerprinted,
    Counted,
}

impl Variant {
    fn label(self) -> &'static str {
        match self {
            Variant::Bare => "bare",
            Variant::Idem(ClaimOrder::Last) => "idem (claim last)",
            Variant::Idem(ClaimOrder::First) => "idem (claim first)",
            Variant::Fingerprinted => "idem + fingerprint",
            Variant::Counted => "idem + max_attempts",
        }
    }
}

/// Runs one variant for `secs` with `tasks` consumers; returns messages/s.
async fn run(
    variant: Variant,
    pool: &PgPool,
    stores: &[PgStore; 2],
    secs: f64,
    tasks: usize,
    next_id: &Arc<AtomicU64>,
) -> f64 {
    messages_per_second(secs, tasks, |t, round| {
        let (pool, next_id) = (pool.clone(), next_id.clone());
        let store = match variant {
            Variant::Idem(ClaimOrder::First) => stores[1].clone(),
            _ => stores[0].clone(),
        };
        async move {
            let mut sku = (t as i64 * 1237) % 10_000;
            while round.going() {
                let msg = Deduct {
                    message_id: next_id.fetch_add(1, Ordering::Relaxed) as i64,
                    sku: sku + 1,
                };
                sku = (sku + 7919) % 10_000;
                match variant {
                    Variant::Bare => deduct_bare(&pool, &msg)
                        .await
                        .map(|_| ())
                        .map_err(|e| e.to_string()),
                    Variant::Idem(_) => deduct_idem(&store, &msg)
                        .await
                        .map(|_| ())
                        .map_err(|e| e.to_string()),
                    Variant::Fingerprinted => deduct_fingerprinted(&store, &msg)
                        .await
                        .map(|_| ())
                        .map_err(|e| e.to_string()),
                    Variant::Counted => deduct_counted(&store, &msg)
                        .await
                        .map(|_| ())
                        .map_err(|e| e.to_string()),
                }
                .unwrap_or_else(|e| panic!("{}: {e}", variant.label()));
                round.handled();
            }
        }
    })
    .await
}

/// How many statements one call sends, with sqlx's statement log and the
/// `BEGIN` its Postgres driver sends outside it.
async fn statements_of<F: std::future::Future>(call: F) -> usize {
    statement_log::with_begin(statement_log::statements_of(call).await).len()
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let secs: f64 = env("SECS", 5.0);
    let rounds: usize = env("ROUNDS", 5);
    let tasks: usize = env("TASKS", 8);

    let pool = PgPoolOptions::new()
        .max_connections(tasks as u32)
        .min_connections(tasks as u32)
        // No liveness ping before each transaction: neither variant pays it.
        .test_before_acquire(false)
        .connect(&url)
        .await?;
    sqlx::raw_sql(
        "DROP TABLE IF EXISTS bench_inventory, bench_idem_last, bench_idem_first;
         CREATE TABLE bench_inventory (sku BIGINT PRIMARY KEY, stock BIGINT NOT NULL);
         INSERT INTO bench_inventory SELECT g, 1000000000 FROM generate_series(1, 10000) g;",
    )
    .execute(&pool)
    .await?;
    let last = PgStore::from_pool(pool.clone()).with_table("bench_idem_last")?;
    let first = PgStore::from_pool(pool.clone())
        .with_table("bench_idem_first")?
        .with_claim_order(ClaimOrder::First);
    last.migrate().await?;
    first.migrate().await?;
    let stores = [last, first];
    let next_id = Arc::new(AtomicU64::new(1));

    let variants = [
        Variant::Bare,
        Variant::Idem(ClaimOrder::Last),
        Variant::Idem(ClaimOrder::First),
        Variant::Fingerprinted,
        Variant::Counted,
    ];
    println!("{tasks} consumers, {rounds} rounds of {secs} s per variant, interleaved");
    // Warm-up: connections, prepared statements, caches.
    for v in variants {
        run(v, &pool, &stores, 1.0, tasks, &next_id).await;
    }
    let mut tps: Vec<Vec<f64>> = vec![Vec::new(); variants.len()];
    for round in 1..=rounds {
        // Rotate the order each round so drift does not favour one variant.
        for i in 0..variants.len() {
            let k = (i + round) % variants.len();
            let t = run(variants[k], &pool, &stores, secs, tasks, &next_id).await;
            tps[k].push(t);
        }
    }
    let bare = median(tps[0].clone());
    println!(
        "{:<20} {:>12} {:>8}   rounds",
        "variant", "median msg/s", "/bare"
    );
    for (v, t) in variants.iter().zip(&tps) {
        let m = median(t.clone());
        let rounds: Vec<String> = t.iter().map(|x| format!("{x:.0}")).collect();
        println!(
            "{:<20} {:>12.0} {:>8.3}   {}",
            v.label(),
            m,
            m / bare,
            rounds.join(" ")
        );
    }

    // Statements a message costs.
    let _guard = tracing::subscriber::set_default(statement_log::StatementLog);
    let fresh = |id| Deduct {
        message_id: id,
        sku: 1,
    };
    let id = next_id.fetch_add(10, Ordering::Relaxed) as i64;
    let bare_n = statements_of(async {
        deduct_bare(&pool, &fresh(id)).await.expect("bare");
    })
    .await;
    let mut report = Vec::new();
    for (store, name) in [(&stores[0], "claim last"), (&stores[1], "claim first")] {
        let id = next_id.fetch_add(1, Ordering::Relaxed) as i64;
        let f = statements_of(async {
            assert!(
                deduct_idem(store, &fresh(id))
                    .await
                    .expect("fresh")
                    .is_executed()
            );
        })
        .await;
        let d = statements_of(async {
            assert!(
                deduct_idem(store, &fresh(id))
                    .await
                    .expect("dup")
                    .is_duplicate()
            );
        })
        .await;
        report.push(format!("{name}: fresh {f}, duplicate {d}"));
    }
    let id = next_id.fetch_add(1, Ordering::Relaxed) as i64;
    let fingerprinted = statements_of(async {
        let out = deduct_fingerprinted(&stores[0], &fresh(id)).await;
        assert!(out.expect("fresh").is_executed());
    })
    .await;
    let id = next_id.fetch_add(1, Ordering::Relaxed) as i64;
    let counted = statements_of(async {
        let out = deduct_counted(&stores[0], &fresh(id)).await;
        assert!(out.expect("fresh").is_executed());
    })
    .await;
    report.push(format!(
        "+ fingerprint: fresh {fingerprinted}; + max_attempts: fresh {counted}"
    ));
    drop(_guard);
    println!(
        "statements (= round trips) per message: bare {bare_n}; {}",
        report.join("; ")
    );
    let ratio = median(tps[1].clone()) / bare;
    println!("idem/bare: {ratio:.3}");
    sqlx::raw_sql("DROP TABLE IF EXISTS bench_inventory, bench_idem_last, bench_idem_first")
        .execute(&pool)
        .await?;
    Ok(())
}
