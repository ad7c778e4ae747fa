//! What an idempotent MySQL/MariaDB handler costs against the same business
//! transaction without idem, as ratios measured in one run, beside the cost
//! of one extra prepared statement on the same server.
//!
//! ```text
//! cargo run --release -p idem-examples --features mysql --example bench_mysql
//! MYSQL_URL=mysql://root@127.0.0.1:3306/test SECS=5 ROUNDS=5 TASKS=8 cargo run --release -p idem-examples --features mysql --example bench_mysql
//! DELAY_US=250 cargo run --release -p idem-examples --features mysql --example bench_mysql
//! ```
//!
//! With `DELAY_US` above 0 every variant connects through a
//! [`DelayProxy`](idem_examples::delay_proxy::DelayProxy) that delays every
//! chunk by that many microseconds in each direction, as a database across
//! a network (see `bench_postgres`, which runs several delays in one run).
//!
//! The business transaction deducts one unit from one of 10,000 stock rows
//! (`BEGIN; UPDATE ...; COMMIT`). Seven variants run interleaved, round
//! after round, each for `SECS` seconds with `TASKS` concurrent consumers on
//! a pool of as many connections:
//!
//! * `bare`: the business transaction alone;
//! * `bare + 1 statement`: the same with one more prepared `INSERT` of the
//!   message id in the transaction, the least a dedup record can cost: the
//!   ceiling idem is judged against;
//! * `idem, claim last`: the same body in an `#[idempotent]` handler on
//!   [`MySqlStore`] claiming last (`ClaimOrder::Last`), the dedup row a
//!   prepared statement of its own (`RoundTrips::Separate`, the store's
//!   default);
//! * `idem, claim last, merged`: the same, the dedup row riding with the
//!   `COMMIT` (`RoundTrips::Merged`);
//! * `idem, checked`: the store's defaults (`ClaimOrder::Checked`): a read
//!   of the key's record before the body, the cost of turning a settled
//!   key's duplicate away before its body;
//! * `idem, checked, merged`: the same with `RoundTrips::Merged`, where the
//!   read rides in the message of the store's session statement (`SET
//!   autocommit = 0, ...`), its values written in: no round trip more than
//!   claiming last;
//! * `bare, idem's session`: the bare business transaction opened and ended
//!   as the MySQL store opens and ends a transaction-mode call's (autocommit
//!   off for the call, and back on at its end; see `BEGIN` and `END` in
//!   `idem-runtime/src/store/sql/mysql.rs`): what that alone costs.
//!
//! Every message is fresh (a new message id). Each round prints every
//! variant's rate and what the machine did meanwhile (busy, idle and steal
//! shares from `/proc/stat`, marked `STOLEN` above 5 % steal; see
//! `examples/src/cpu.rs`). It prints each variant's median throughput and
//! its ratio to `bare` (and that ratio over the unmarked rounds), counts the statements a fresh message
//! and a duplicate cost, and ends with the line `idem/bare: <ratio>` for
//! the store's defaults (`idem, checked`).

use std::net::ToSocketAddrs;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use idem_examples::cpu::{Rounds, Watch};
use idem_examples::delay_proxy::{DelayProxy, added_round_trip, own_latency};
use idem_examples::{env, messages_per_second, statement_log};
use idem_runtime::{ClaimOrder, MySqlStore, MySqlTx, RoundTrips, idempotent};
use serde::Deserialize;
use sqlx::MySqlPool;
use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};

/// Drops the bench's tables, before and after it.
const DROP_TABLES: &str = "DROP TABLE IF EXISTS bench_my_inventory, bench_my_extra, bench_my_idem, bench_my_idem_merged, bench_my_idem_checked, bench_my_idem_checked_merged, bench_my_idem_outbox, bench_my_idem_merged_outbox, bench_my_idem_checked_outbox, bench_my_idem_checked_merged_outbox";

#[derive(Debug, Deserialize)]
struct Deduct {
    message_id: i64,
    sku: i64,
}

async fn deduct(conn: &mut sqlx::MySqlConnection, sku: i64) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE bench_my_inventory SET stock = stock - 1 WHERE sku = ?")
        .bind(sku)
        .execute(conn)
        .await?;
    Ok(())
}

#[idempotent(
    key = "message_id",
    ttl = "24h",
    store = "mysql",
    name = "bench_deduct"
)]
async fn deduct_idem(tx: &mut MySqlTx<'_>, msg: &Deduct) -> Result<i64, sqlx::Error> {
    deduct(tx, msg.sku).await?;
    Ok(msg.sku)
}

async fn deduct_bare(pool: &MySqlPool, msg: &Deduct) -> Result<(), sqlx::Error> {
    let mut tx = pool.begin().await?;
    deduct(&mut tx, msg.sku).await?;
    tx.commit().await
}

/// How the MySQL store opens a transaction-mode call's transaction, and
/// commits it (its dialect's `BEGIN` and `END.commit`).
const SESSION_BEGIN: &str = "SET autocommit = 0, completion_type = 'RELEASE'; START TRANSACTION";
const SESSION_COMMIT: &str = "SET autocommit = 1, completion_type = 'NO_CHAIN'";

async fn deduct_session(pool: &MySqlPool, msg: &Deduct) -> Result<(), sqlx::Error> {
    let mut tx = pool.begin_with(SESSION_BEGIN).await?;
    deduct(&mut tx, msg.sku).await?;
    // As the store does: sqlx still counts the transaction open, and queues
    // its `ROLLBACK` of nothing, sent with the pool's release ping.
    sqlx::raw_sql(SESSION_COMMIT).execute(&mut *tx).await?;
    Ok(())
}

async fn deduct_extra(pool: &MySqlPool, msg: &Deduct) -> Result<(), sqlx::Error> {
    let mut tx = pool.begin().await?;
    deduct(&mut tx, msg.sku).await?;
    sqlx::query("INSERT INTO bench_my_extra (message_id) VALUES (?)")
        .bind(msg.message_id)
        .execute(&mut *tx)
        .await?;
    tx.commit().await
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Variant {
    Bare,
    Extra,
    Idem,
    IdemMerged,
    IdemChecked,
    IdemCheckedMerged,
    BareSession,
}

impl Variant {
    fn label(self) -> &'static str {
        match self {
            Variant::Bare => "bare",
            Variant::Extra => "bare + 1 statement",
            Variant::Idem => "idem, claim last",
            Variant::IdemMerged => "idem, claim last, merged",
            Variant::IdemChecked => "idem, checked",
            Variant::IdemCheckedMerged => "idem, checked, merged",
            Variant::BareSession => "bare, idem's session",
        }
    }
}

/// Runs one variant for `secs` with `tasks` consumers; returns messages/s.
async fn run(
    variant: Variant,
    pool: &MySqlPool,
    stores: &[MySqlStore; 4],
    secs: f64,
    tasks: usize,
    next_id: &Arc<AtomicU64>,
) -> f64 {
    messages_per_second(secs, tasks, |t, round| {
        let (pool, next_id) = (pool.clone(), next_id.clone());
        let store = match variant {
            Variant::IdemMerged => stores[1].clone(),
            Variant::IdemChecked => stores[2].clone(),
            Variant::IdemCheckedMerged => stores[3].clone(),
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
                    Variant::Bare => deduct_bare(&pool, &msg).await.map_err(|e| e.to_string()),
                    Variant::Extra => deduct_extra(&pool, &msg).await.map_err(|e| e.to_string()),
                    Variant::BareSession => {
                        deduct_session(&pool, &msg).await.map_err(|e| e.to_string())
                    }
                    Variant::Idem
                    | Variant::IdemMerged
                    | Variant::IdemChecked
                    | Variant::IdemCheckedMerged => deduct_idem(&store, &msg)
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

/// The statements a fresh message `id` costs on `store`, then its duplicate.
async fn fresh_and_duplicate(store: &MySqlStore, id: i64) -> ((usize, String), (usize, String)) {
    let msg = Deduct {
        message_id: id,
        sku: 1,
    };
    let fresh = statements_of(async {
        let outcome = deduct_idem(store, &msg).await.expect("fresh");
        assert!(outcome.is_executed());
    })
    .await;
    let duplicate = statements_of(async {
        let outcome = deduct_idem(store, &msg).await.expect("duplicate");
        assert!(outcome.is_duplicate());
    })
    .await;
    (fresh, duplicate)
}

/// The statements one call sends: their number, and their first words.
async fn statements_of<F: std::future::Future>(call: F) -> (usize, String) {
    let seen = statement_log::with_begin(statement_log::statements_of(call).await);
    (seen.len(), seen.join(", "))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url =
        std::env::var("MYSQL_URL").unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into());
    let secs: f64 = env("SECS", 5.0);
    let rounds: usize = env("ROUNDS", 5);
    let tasks: usize = env("TASKS", 8);

    let delay_us: u64 = env("DELAY_US", 0);
    let mut options = MySqlConnectOptions::from_str(&url)?;
    let _proxy = if delay_us > 0 {
        let upstream = (options.get_host(), options.get_port())
            .to_socket_addrs()?
            .next()
            .ok_or("MYSQL_URL: the host resolves to no address")?;
        let own = tokio::task::spawn_blocking(|| own_latency(1000)).await??;
        let delay = Duration::from_micros(delay_us);
        let check =
            tokio::task::spawn_blocking(move || added_round_trip(delay, own, 1000)).await??;
        println!("proxy check: {check}");
        let proxy = DelayProxy::start_compensated(upstream, delay, own)?;
        options = options
            .host(&proxy.addr().ip().to_string())
            .port(proxy.addr().port());
        Some(proxy)
    } else {
        None
    };
    let pool = MySqlPoolOptions::new()
        .max_connections(tasks as u32)
        .min_connections(tasks as u32)
        // No liveness ping before each transaction: no variant pays it.
        .test_before_acquire(false)
        .connect_with(options)
        .await?;
    for statement in [
        DROP_TABLES,
        "CREATE TABLE bench_my_inventory (sku BIGINT PRIMARY KEY, stock BIGINT NOT NULL) ENGINE = InnoDB",
        "CREATE TABLE bench_my_extra (message_id BIGINT PRIMARY KEY) ENGINE = InnoDB",
        "INSERT INTO bench_my_inventory (sku, stock)
         SELECT seq, 1000000000 FROM seq_1_to_10000",
    ] {
        sqlx::raw_sql(statement).execute(&pool).await?;
    }
    let store = MySqlStore::from_pool(pool.clone())
        .with_table("bench_my_idem")?
        .with_claim_order(ClaimOrder::Last);
    store.migrate().await?;
    let merged = MySqlStore::from_pool(pool.clone())
        .with_table("bench_my_idem_merged")?
        .with_claim_order(ClaimOrder::Last)
        .with_round_trips(RoundTrips::Merged);
    merged.migrate().await?;
    let checked = MySqlStore::from_pool(pool.clone())
        .with_table("bench_my_idem_checked")?
        .with_claim_order(ClaimOrder::Checked);
    checked.migrate().await?;
    let checked_merged = MySqlStore::from_pool(pool.clone())
        .with_table("bench_my_idem_checked_merged")?
        .with_claim_order(ClaimOrder::Checked)
        .with_round_trips(RoundTrips::Merged);
    checked_merged.migrate().await?;
    let stores = [store.clone(), merged, checked, checked_merged];
    let next_id = Arc::new(AtomicU64::new(1));

    let variants = [
        Variant::Bare,
        Variant::Extra,
        Variant::Idem,
        Variant::IdemMerged,
        Variant::IdemChecked,
        Variant::IdemCheckedMerged,
        Variant::BareSession,
    ];
    println!(
        "{tasks} consumers, {rounds} rounds of {secs} s per variant, interleaved, {}",
        if delay_us == 0 {
            "direct".to_owned()
        } else {
            format!("{delay_us} us each way")
        }
    );
    // Warm-up: connections, prepared statements, buffer pool.
    for v in variants {
        run(v, &pool, &stores, 1.0, tasks, &next_id).await;
    }
    let mut tps: Vec<Vec<f64>> = vec![Vec::new(); variants.len()];
    let mut marks = Rounds::default();
    for round in 1..=rounds {
        let watch = Watch::start()?;
        // Rotate the order each round so drift does not favour one variant.
        for i in 0..variants.len() {
            let k = (i + round) % variants.len();
            let t = run(variants[k], &pool, &stores, secs, tasks, &next_id).await;
            tps[k].push(t);
        }
        let cpu = marks.push(watch.stop()?);
        let line: Vec<String> = variants
            .iter()
            .zip(&tps)
            .map(|(v, t)| format!("{} {:.0}", v.label(), t[round - 1]))
            .collect();
        println!("round {round}: {} msg/s ({cpu})", line.join(", "));
    }
    println!("{}", marks.summary());
    let bare = marks.medians(&tps[0]);
    println!(
        "{:<20} {:>12} {:>8} {:>10}   rounds",
        "variant", "median msg/s", "/bare", "unmarked"
    );
    for (v, t) in variants.iter().zip(&tps) {
        let m = marks.medians(t);
        let rounds: Vec<String> = t.iter().map(|x| format!("{x:.0}")).collect();
        println!(
            "{:<20} {:>12.0} {:>8.3} {:>10.3}   {}",
            v.label(),
            m.all,
            m.all / bare.all,
            m.ratio(&bare).quiet.unwrap_or(f64::NAN),
            rounds.join(" ")
        );
    }

    // Statements a message costs (BEGIN counted; see `statements_of`).
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
    let extra_n = statements_of(async {
        deduct_extra(&pool, &fresh(id + 1)).await.expect("extra");
    })
    .await;
    let mut counted = Vec::new();
    for (label, store) in [
        ("idem, claim last", &stores[0]),
        ("idem, checked", &stores[2]),
        ("idem, checked, merged", &stores[3]),
    ] {
        let id = next_id.fetch_add(1, Ordering::Relaxed) as i64;
        let (fresh_n, dup_n) = fresh_and_duplicate(store, id).await;
        counted.push((format!("{label}, fresh"), fresh_n));
        counted.push((format!("{label}, duplicate"), dup_n));
    }
    drop(_guard);
    println!("statements (= round trips) per message:");
    let bare_counts = [
        ("bare".to_owned(), bare_n),
        ("bare + 1 statement".to_owned(), extra_n),
    ];
    for (what, (n, seen)) in bare_counts.into_iter().chain(counted) {
        println!("  {what}: {n} ({seen})");
    }
    println!(
        "one extra statement costs: {:.3} of bare",
        marks.median(&tps[1]) / bare.all
    );
    println!(
        "idem, claim last, merged/bare: {:.3}",
        marks.median(&tps[3]) / bare.all
    );
    println!(
        "idem, checked/bare: {:.3} (of claim last: {:.3})",
        marks.median(&tps[4]) / bare.all,
        marks.median(&tps[4]) / marks.median(&tps[2])
    );
    println!(
        "idem, checked, merged/bare: {:.3} (of claim last, merged: {:.3})",
        marks.median(&tps[5]) / bare.all,
        marks.median(&tps[5]) / marks.median(&tps[3])
    );
    println!(
        "bare in idem's session/bare: {:.3}",
        marks.median(&tps[6]) / bare.all
    );
    println!(
        "idem, claim last/bare: {:.3}",
        marks.median(&tps[2]) / bare.all
    );
    // The store's defaults (claim checked, separate) end the output.
    let ratio = marks.medians(&tps[4]).ratio(&bare);
    if let Some(quiet) = ratio.quiet {
        println!("idem/bare over unmarked rounds: {quiet:.3}");
    }
    println!("idem/bare: {:.3}", ratio.all);
    sqlx::raw_sql(DROP_TABLES).execute(&pool).await?;
    Ok(())
}
