//! What an idempotent Postgres handler costs against the same business
//! transaction without idem, as ratios measured in one run, with the
//! database on loopback and behind a network's latency.
//!
//! ```text
//! cargo run --release -p idem-examples --features postgres --example bench_postgres
//! DELAYS_US=0,125,250 SECS=5 ROUNDS=5 TASKS=8 cargo run --release -p idem-examples --features postgres --example bench_postgres
//! DATABASE_URL=postgres://... DELAYS_US=0 SECS=3 cargo run --release -p idem-examples --features postgres --example bench_postgres
//! ```
//!
//! The business transaction is the one of `examples/pgbench-ceiling`: deduct one
//! unit from one of 10,000 stock rows (`BEGIN; UPDATE ...; COMMIT`). These
//! variants run with `TASKS` concurrent consumers on a pool of as many
//! connections:
//!
//! * `bare`: the business transaction alone;
//! * `idem, claim checked, merged`: the same body in an `#[idempotent]`
//!   handler that records its outcome, as the store does by default for a
//!   server across a network: a read of the key's record before the body
//!   (`ClaimOrder::Checked`), and the dedup row with the outcome in the
//!   `COMMIT`'s message (`RoundTrips::Merged`);
//! * `idem, claim checked, separate`: the same with the dedup row as a
//!   prepared statement of its own (`RoundTrips::Separate`), the default for
//!   a server on the consumer's host (the proxy listens on loopback too, so
//!   every variant says which it takes);
//! * `idem, claim last, merged` and `separate`: `ClaimOrder::Last`, no read
//!   before the body: what the read costs;
//! * `idem, claim first`: the same with `ClaimOrder::First` (the claim and
//!   the outcome's `UPDATE` statements of their own, whatever `RoundTrips`
//!   says);
//! * `idem + fingerprint`: claim last, merged, with `fingerprint = "sku"`:
//!   the cost of a payload fingerprint (a digest per message, one more
//!   column);
//! * `idem + max_attempts`: with `max_attempts = 5`, which claims first and
//!   takes a savepoint after the claim: the cost of counting failures.
//!
//! * the limits, the business transaction with statements of a dedup
//!   record written by hand, no idem in the call ([`Limit`]): `+ narrow
//!   row` (one more prepared statement, the narrow row of
//!   `examples/pgbench-ceiling/end.sql`), `+ idem's row` (one more: the
//!   row idem's claim-last writes, into a table of the store's migration)
//!   and `+ read + row` (two more: the read `ClaimOrder::Checked` sends
//!   first, then that row).
//!
//! The idem variants are the entries of [`IDEM`] (a handler, a table, the
//! store's options); the first is the default whose ratio ends the output.
//!
//! Each variant runs under every network setting of `DELAYS_US` (default
//! `0,125,250`): `0` connects directly, any other value connects through a
//! [`DelayProxy`] that delays every chunk by that many microseconds in each
//! direction (less its own latency, measured at start), so a round trip
//! costs twice that more. Each setting has its
//! own pool, and the idem stores use it too. Every (setting, variant) pair
//! runs for `SECS` seconds per round, interleaved, `ROUNDS` rounds, in an
//! order rotated each round.
//!
//! Every message is fresh (a new message id). Before the rounds it prints
//! what each proxy adds to a ping-pong (its precision on this machine). Each
//! round prints the default variant's ratio to `bare` in every setting and
//! what the machine did meanwhile (busy, idle and steal shares from
//! `/proc/stat`, marked `STOLEN` above 5 % steal; see
//! `examples/src/cpu.rs`). It prints a table per setting: each variant's median throughput, its ratio
//! to `bare` under the same setting and to itself connected directly,
//! that ratio to `bare` over the unmarked rounds only, and the CPU a
//! message cost (medians, in µs): this process (the consumers), the pool's
//! PostgreSQL backends (`pg_backend_pid()`, `/proc/<pid>/stat`) and the
//! rest of the machine. Then
//! it counts the statements (round trips) a fresh message and a duplicate
//! cost; prints, connected directly, claiming last and claiming checked
//! (separate) each against the limit of its own statements and against the
//! narrow row, and the bytes of a row of each table; and ends with the line
//! `idem/bare at 250us: <ratio>` for the default variant (at the largest
//! delay when 250 is not among `DELAYS_US`).

use std::net::{SocketAddr, ToSocketAddrs};
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use idem_examples::cpu::{Cpu, Medians, Rounds, Watch, pids_seconds, process_seconds};
use idem_examples::delay_proxy::{DelayProxy, added_round_trip, own_latency};
use idem_examples::{env, median, messages_per_second, pg_backends, row_bytes, statement_log};
use idem_runtime::{ClaimOrder, Outcome, PgStore, PgTx, RoundTrips, idempotent};
use serde::Deserialize;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{AssertSqlSafe, PgPool};

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

/// The key as idem stores it (`Key`'s length-prefixed parts), written by
/// hand so that the limits' rows are as wide as idem's.
fn stored_key(message_id: i64) -> String {
    let id = message_id.to_string();
    format!("{}:{id}", id.len())
}

/// A limit: the bare business transaction and, in it, statements of a
/// dedup record written by hand, with no idem in the call. What idem
/// cannot go above with the same statements.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Limit {
    /// One more prepared statement, the narrow row of
    /// `examples/pgbench-ceiling/end.sql` (a key, a status, an outcome, an
    /// expiry; one index): the one-extra-statement ceiling.
    Narrow,
    /// One more prepared statement: the row idem's claim-last writes, the
    /// same columns and values, into a table of the store's own migration
    /// (its primary key and its expiry index), by a plain `INSERT ... ON
    /// CONFLICT DO NOTHING`.
    Row,
    /// Two more: the read of the key's record that `ClaimOrder::Checked`
    /// sends before the body, then `Row`'s insert.
    ReadRow,
}

impl Limit {
    const ALL: [Limit; 3] = [Limit::Narrow, Limit::Row, Limit::ReadRow];
    /// The tables: the narrow one of its own; `Row`'s made by a store's
    /// migration (both row limits write it: their keys are fresh).
    const NARROW_TABLE: &str = "bench_limit_narrow";
    const ROW_TABLE: &str = "bench_limit_row";

    fn label(self) -> &'static str {
        match self {
            Limit::Narrow => "limit: + narrow row",
            Limit::Row => "limit: + idem's row",
            Limit::ReadRow => "limit: + read + row",
        }
    }

    async fn call(self, pool: &PgPool, msg: &Deduct) -> Result<(), sqlx::Error> {
        let key = stored_key(msg.message_id);
        let mut tx = pool.begin().await?;
        if self == Limit::ReadRow {
            sqlx::query(
                "SELECT status, outcome, attempts, created_at, updated_at, expires_at, failures, \
                 last_error, fingerprint, token, max_attempts, traceparent, \
                 (extract(epoch from statement_timestamp()) * 1000)::bigint \
                 FROM bench_limit_row WHERE handler = $1 AND key = $2",
            )
            .bind("bench_deduct")
            .bind(&key)
            .fetch_optional(&mut *tx)
            .await?;
        }
        deduct(&mut tx, msg.sku).await?;
        let inserted = match self {
            Limit::Narrow => sqlx::query(
                "INSERT INTO bench_limit_narrow (handler, key, status, outcome, expires_at) \
                 VALUES ($1, $2, 1, $3, now() + interval '24 hours') \
                 ON CONFLICT DO NOTHING RETURNING status",
            )
            .bind("bench_deduct")
            .bind(&key)
            .bind(msg.sku.to_string().into_bytes())
            .fetch_optional(&mut *tx)
            .await?
            .is_some(),
            Limit::Row | Limit::ReadRow => sqlx::query(
                "INSERT INTO bench_limit_row (handler, key, status, outcome, attempts, failures, \
                 created_at, updated_at, expires_at) VALUES ($1, $2, 'completed', $3, 1, 0, \
                 (extract(epoch from statement_timestamp()) * 1000)::bigint, \
                 (extract(epoch from statement_timestamp()) * 1000)::bigint, \
                 (extract(epoch from statement_timestamp()) * 1000)::bigint + $4) \
                 ON CONFLICT (handler, key) DO NOTHING",
            )
            .bind("bench_deduct")
            .bind(&key)
            .bind(msg.sku.to_string())
            .bind(86_400_000_i64)
            .execute(&mut *tx)
            .await?
            .rows_affected()
                == 1,
        };
        if !inserted {
            return Err(sqlx::Error::Protocol(format!(
                "{}: message {} was a duplicate",
                self.label(),
                msg.message_id
            )));
        }
        tx.commit().await
    }
}

/// The `#[idempotent]` handler an idem variant calls.
#[derive(Clone, Copy, Debug)]
enum Handler {
    /// `deduct_idem`: the outcome recorded, nothing more.
    Plain,
    /// `deduct_fingerprinted`: with `fingerprint = "sku"`.
    Fingerprinted,
    /// `deduct_counted`: with `max_attempts = 5`.
    Counted,
}

impl Handler {
    async fn call(self, store: &PgStore, msg: &Deduct) -> Result<Outcome<i64>, String> {
        match self {
            Handler::Plain => deduct_idem(store, msg).await,
            Handler::Fingerprinted => deduct_fingerprinted(store, msg).await,
            Handler::Counted => deduct_counted(store, msg).await,
        }
        .map_err(|e| e.to_string())
    }
}

/// One idem variant: a handler on a store of its own table and options.
struct IdemVariant {
    label: &'static str,
    handler: Handler,
    table: &'static str,
    /// The store's options, applied to a store on the setting's pool.
    options: fn(PgStore) -> PgStore,
}

/// The idem variants; the first is the default, whose ratio ends the output.
/// A new store option is one more entry here.
const IDEM: &[IdemVariant] = &[
    IdemVariant {
        label: "idem, claim checked, merged",
        handler: Handler::Plain,
        table: "bench_idem_checked_merged",
        options: |store| {
            store
                .with_claim_order(ClaimOrder::Checked)
                .with_round_trips(RoundTrips::Merged)
        },
    },
    IdemVariant {
        label: "idem, claim checked, separate",
        handler: Handler::Plain,
        table: "bench_idem_checked",
        options: |store| {
            store
                .with_claim_order(ClaimOrder::Checked)
                .with_round_trips(RoundTrips::Separate)
        },
    },
    IdemVariant {
        label: "idem, claim last, merged",
        handler: Handler::Plain,
        table: "bench_idem_last_merged",
        options: |store| {
            store
                .with_claim_order(ClaimOrder::Last)
                .with_round_trips(RoundTrips::Merged)
        },
    },
    IdemVariant {
        label: "idem, claim last, separate",
        handler: Handler::Plain,
        table: "bench_idem_last",
        options: |store| {
            store
                .with_claim_order(ClaimOrder::Last)
                .with_round_trips(RoundTrips::Separate)
        },
    },
    IdemVariant {
        label: "idem, claim first",
        handler: Handler::Plain,
        table: "bench_idem_first",
        options: |store| store.with_claim_order(ClaimOrder::First),
    },
    IdemVariant {
        label: "idem + fingerprint",
        handler: Handler::Fingerprinted,
        table: "bench_idem_fingerprint",
        options: |store| {
            store
                .with_claim_order(ClaimOrder::Last)
                .with_round_trips(RoundTrips::Merged)
        },
    },
    IdemVariant {
        label: "idem + max_attempts",
        handler: Handler::Counted,
        table: "bench_idem_counted",
        options: |store| store,
    },
];

/// A variant: `bare`, or an entry of [`IDEM`] by index.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Variant {
    Bare,
    Idem(usize),
    Limit(Limit),
}

impl Variant {
    fn all() -> Vec<Variant> {
        std::iter::once(Variant::Bare)
            .chain((0..IDEM.len()).map(Variant::Idem))
            .chain(Limit::ALL.map(Variant::Limit))
            .collect()
    }

    fn label(self) -> &'static str {
        match self {
            Variant::Bare => "bare",
            Variant::Idem(i) => IDEM[i].label,
            Variant::Limit(l) => l.label(),
        }
    }
}

/// A variant ready to call: bare, a limit, or an idem handler on its store.
enum Call {
    Bare,
    Limit(Limit),
    Idem(Handler, PgStore),
}

/// One network setting: its pool (direct or through a proxy) and a store
/// per idem variant on that pool.
struct Network {
    delay_us: u64,
    pool: PgPool,
    stores: Vec<PgStore>,
    /// The PostgreSQL backends of the pool's connections.
    backends: Vec<u32>,
    /// Kept alive while the pool is in use.
    _proxy: Option<DelayProxy>,
}

impl Network {
    fn label(&self) -> String {
        if self.delay_us == 0 {
            "direct".into()
        } else {
            format!("{}us", self.delay_us)
        }
    }

    async fn connect(
        delay_us: u64,
        options: &PgConnectOptions,
        upstream: SocketAddr,
        own: Duration,
        tasks: usize,
    ) -> Result<Network, Box<dyn std::error::Error>> {
        let (options, proxy) = if delay_us == 0 {
            (options.clone(), None)
        } else {
            let proxy =
                DelayProxy::start_compensated(upstream, Duration::from_micros(delay_us), own)?;
            let options = options
                .clone()
                .host(&proxy.addr().ip().to_string())
                .port(proxy.addr().port());
            (options, Some(proxy))
        };
        let pool = PgPoolOptions::new()
            .max_connections(tasks as u32)
            .min_connections(tasks as u32)
            // No liveness ping before each transaction: no variant pays it.
            .test_before_acquire(false)
            .connect_with(options)
            .await?;
        let mut stores = Vec::new();
        for v in IDEM {
            stores.push((v.options)(
                PgStore::from_pool(pool.clone()).with_table(v.table)?,
            ));
        }
        let backends = pg_backends(&pool, tasks)
            .await
            .map_err(|e| format!("the backends' process ids: {e}"))?;
        Ok(Network {
            delay_us,
            pool,
            stores,
            backends,
            _proxy: proxy,
        })
    }
}

/// One variant's round: its rate, and the CPU a message cost this process
/// (the consumers, and the delay proxy's threads under a delay), the
/// setting's PostgreSQL backends, and the rest of the machine (the kernel's
/// loopback, anything else running), in microseconds. The backends are
/// found by their process ids, so the split needs the server on this
/// machine, and its connections open for the run (sqlx closes a
/// connection after 30 minutes, and one idle for 10).
#[derive(Clone, Copy, Debug)]
struct Sample {
    rate: f64,
    process_us: f64,
    server_us: f64,
    rest_us: f64,
}

/// Runs one variant for `secs` with `tasks` consumers.
async fn run(
    variant: Variant,
    net: &Network,
    secs: f64,
    tasks: usize,
    next_id: &Arc<AtomicU64>,
) -> Result<Sample, Box<dyn std::error::Error>> {
    let (machine, process, start) = (Cpu::now()?, process_seconds()?, Instant::now());
    let server = pids_seconds(&net.backends)?;
    let rate = messages_per_second(secs, tasks, |t, round| {
        let (pool, next_id) = (net.pool.clone(), next_id.clone());
        // What a consumer calls: the variant with its store, if any.
        let call = match variant {
            Variant::Bare => Call::Bare,
            Variant::Limit(limit) => Call::Limit(limit),
            Variant::Idem(i) => Call::Idem(IDEM[i].handler, net.stores[i].clone()),
        };
        async move {
            let mut sku = (t as i64 * 1237) % 10_000;
            while round.going() {
                let msg = Deduct {
                    message_id: next_id.fetch_add(1, Ordering::Relaxed) as i64,
                    sku: sku + 1,
                };
                sku = (sku + 7919) % 10_000;
                match &call {
                    Call::Bare => deduct_bare(&pool, &msg).await.map_err(|e| e.to_string()),
                    Call::Limit(limit) => limit.call(&pool, &msg).await.map_err(|e| e.to_string()),
                    Call::Idem(handler, store) => handler.call(store, &msg).await.map(drop),
                }
                .unwrap_or_else(|e| panic!("{}: {e}", variant.label()));
                round.handled();
            }
        }
    })
    .await;
    let messages = rate * start.elapsed().as_secs_f64();
    let busy = Cpu::now()?.busy_seconds_since(machine);
    let own = process_seconds()? - process;
    let server = pids_seconds(&net.backends)? - server;
    let per = |seconds: f64| seconds * 1e6 / messages.max(1.0);
    Ok(Sample {
        rate,
        process_us: per(own),
        server_us: per(server),
        rest_us: per(busy - own - server),
    })
}

/// How many statements one call sends, with sqlx's statement log and the
/// `BEGIN` its Postgres driver sends outside it.
async fn statements_of<F: std::future::Future>(call: F) -> usize {
    statement_log::with_begin(statement_log::statements_of(call).await).len()
}

/// `DELAYS_US`: microseconds each way, comma-separated; 0 is direct.
fn delays() -> Result<Vec<u64>, Box<dyn std::error::Error>> {
    let spec = std::env::var("DELAYS_US").unwrap_or_else(|_| "0,125,250".into());
    let delays = spec
        .split(',')
        .map(|d| d.trim().parse::<u64>())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("DELAYS_US={spec}: {e}"))?;
    if delays.is_empty() {
        return Err("DELAYS_US is empty".into());
    }
    Ok(delays)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let secs: f64 = env("SECS", 5.0);
    let rounds: usize = env("ROUNDS", 5);
    let tasks: usize = env("TASKS", 8);
    let delays = delays()?;

    let options = PgConnectOptions::from_str(&url)?;
    let upstream = (options.get_host(), options.get_port())
        .to_socket_addrs()?
        .next()
        .ok_or("DATABASE_URL: the host resolves to no address")?;

    // The proxy's own latency, which it takes off the delay, and its
    // precision on this machine.
    let own = tokio::task::spawn_blocking(|| own_latency(1000)).await??;
    for &d in delays.iter().filter(|&&d| d > 0) {
        let delay = Duration::from_micros(d);
        let m = tokio::task::spawn_blocking(move || added_round_trip(delay, own, 1000)).await??;
        println!("proxy check: {m}");
    }

    let mut nets = Vec::new();
    for &d in &delays {
        nets.push(Network::connect(d, &options, upstream, own, tasks).await?);
    }
    let direct = delays.iter().position(|&d| d == 0);
    // Set up and count statements without a delay when there is a direct
    // setting.
    let setup = &nets[direct.unwrap_or(0)];
    sqlx::raw_sql(
        "DROP TABLE IF EXISTS bench_inventory;
         CREATE TABLE bench_inventory (sku BIGINT PRIMARY KEY, stock BIGINT NOT NULL);
         INSERT INTO bench_inventory SELECT g, 1000000000 FROM generate_series(1, 10000) g;",
    )
    .execute(&setup.pool)
    .await?;
    for (v, store) in IDEM.iter().zip(&setup.stores) {
        // The tables are the constants of `IDEM`.
        sqlx::raw_sql(AssertSqlSafe(format!("DROP TABLE IF EXISTS {}", v.table)))
            .execute(&setup.pool)
            .await?;
        store.migrate().await?;
    }
    // The limits' tables: the narrow one as pgbench-ceiling's, the row one
    // by the store's own migration.
    sqlx::raw_sql(
        "DROP TABLE IF EXISTS bench_limit_narrow, bench_limit_row, bench_limit_row_outbox;
         CREATE TABLE bench_limit_narrow (handler TEXT NOT NULL, key TEXT NOT NULL,
           status SMALLINT NOT NULL DEFAULT 0, outcome BYTEA, expires_at TIMESTAMPTZ NOT NULL,
           PRIMARY KEY (handler, key));",
    )
    .execute(&setup.pool)
    .await?;
    PgStore::from_pool(setup.pool.clone())
        .with_table(Limit::ROW_TABLE)?
        .migrate()
        .await?;
    let next_id = Arc::new(AtomicU64::new(1));

    let variants = Variant::all();
    // Every (setting, variant) pair, the unit of interleaving.
    let pairs: Vec<(usize, usize)> = (0..nets.len())
        .flat_map(|n| (0..variants.len()).map(move |v| (n, v)))
        .collect();
    let settings: Vec<String> = nets.iter().map(Network::label).collect();
    println!(
        "{tasks} consumers, {rounds} rounds of {secs} s per variant and network setting \
         ({}), interleaved",
        settings.join(", ")
    );
    // Warm-up: connections, prepared statements, caches.
    for &(n, v) in &pairs {
        run(variants[v], &nets[n], 1.0, tasks, &next_id).await?;
    }
    let mut samples: Vec<Vec<Sample>> = vec![Vec::new(); pairs.len()];
    let mut marks = Rounds::default();
    for round in 1..=rounds {
        let watch = Watch::start()?;
        // Rotate the order each round so drift does not favour one pair.
        for i in 0..pairs.len() {
            let k = (i + round) % pairs.len();
            let (n, v) = pairs[k];
            samples[k].push(run(variants[v], &nets[n], secs, tasks, &next_id).await?);
        }
        let cpu = marks.push(watch.stop()?);
        // The default variant against bare, in each setting.
        let line: Vec<String> = (0..nets.len())
            .map(|n| {
                let at = |v: usize| samples[n * variants.len() + v][round - 1].rate;
                format!("{} idem/bare {:.3}", nets[n].label(), at(1) / at(0))
            })
            .collect();
        println!("round {round}: {} ({cpu})", line.join(", "));
    }
    println!("{}", marks.summary());
    let medians: Vec<Medians> = samples
        .iter()
        .map(|s| marks.medians(&s.iter().map(|s| s.rate).collect::<Vec<_>>()))
        .collect();
    let at = |n: usize, v: usize| medians[n * variants.len() + v].all;
    let quiet = |n: usize, v: usize| medians[n * variants.len() + v].quiet.unwrap_or(f64::NAN);

    for (n, net) in nets.iter().enumerate() {
        println!();
        if net.delay_us == 0 {
            println!("direct:");
        } else {
            println!(
                "{} us each way (+{:.2} ms per round trip):",
                net.delay_us,
                2.0 * net.delay_us as f64 / 1000.0
            );
        }
        println!(
            "{:<30} {:>12} {:>8} {:>8} {:>10} {:>23}   rounds",
            "variant", "median msg/s", "/bare", "/direct", "unmarked", "CPU us: own+server+rest"
        );
        for (v, variant) in variants.iter().enumerate() {
            let m = at(n, v);
            let vs_direct = direct.map_or(f64::NAN, |d| m / at(d, v));
            let cpu = &samples[n * variants.len() + v];
            let rounds: Vec<String> = cpu.iter().map(|s| format!("{:.0}", s.rate)).collect();
            let of = |f: fn(&Sample) -> f64| median(cpu.iter().map(f).collect());
            let (own, server, rest) =
                (of(|c| c.process_us), of(|c| c.server_us), of(|c| c.rest_us));
            println!(
                "{:<30} {:>12.0} {:>8.3} {:>8.3} {:>10.3} {:>23}   {}",
                variant.label(),
                m,
                m / at(n, 0),
                vs_direct,
                quiet(n, v) / quiet(n, 0),
                format!("{own:.0} + {server:.0} + {rest:.0}"),
                rounds.join(" ")
            );
        }
    }
    println!();

    // Statements a message costs; the same under every setting.
    let _guard = tracing::subscriber::set_default(statement_log::StatementLog);
    let fresh = |id| Deduct {
        message_id: id,
        sku: 1,
    };
    let id = next_id.fetch_add(10, Ordering::Relaxed) as i64;
    let bare_n = statements_of(async {
        deduct_bare(&setup.pool, &fresh(id)).await.expect("bare");
    })
    .await;
    let mut report = vec![format!("bare {bare_n}")];
    for (v, store) in IDEM.iter().zip(&setup.stores) {
        let id = next_id.fetch_add(1, Ordering::Relaxed) as i64;
        let f = statements_of(async {
            let out = v.handler.call(store, &fresh(id)).await;
            assert!(out.expect("fresh").is_executed());
        })
        .await;
        let d = statements_of(async {
            let out = v.handler.call(store, &fresh(id)).await;
            assert!(out.expect("duplicate").is_duplicate());
        })
        .await;
        report.push(format!("{}: fresh {f}, duplicate {d}", v.label));
    }
    for limit in Limit::ALL {
        let id = next_id.fetch_add(1, Ordering::Relaxed) as i64;
        let n = statements_of(async {
            limit.call(&setup.pool, &fresh(id)).await.expect("a limit");
        })
        .await;
        report.push(format!("{} {n}", limit.label()));
    }
    drop(_guard);
    println!(
        "statements (= round trips) per message: {}",
        report.join("; ")
    );

    // Each idem variant beside the limit of its statements, connected
    // directly: what idem's own work costs, apart from the record's.
    if let Some(d) = direct {
        let of = |v: Variant| {
            let i = variants.iter().position(|&x| x == v).expect("a variant");
            (at(d, i), quiet(d, i))
        };
        let last = IDEM
            .iter()
            .position(|v| v.label == "idem, claim last, separate")
            .expect("claim last, separate");
        let checked = IDEM
            .iter()
            .position(|v| v.label == "idem, claim checked, separate")
            .expect("claim checked, separate");
        for (idem, limit) in [(last, Limit::Row), (checked, Limit::ReadRow)] {
            let (i, iq) = of(Variant::Idem(idem));
            let (l, lq) = of(Variant::Limit(limit));
            let (n, nq) = of(Variant::Limit(Limit::Narrow));
            println!(
                "{} / {}: {:.3} (unmarked {:.3}); / {}: {:.3} (unmarked {:.3})",
                IDEM[idem].label,
                limit.label(),
                i / l,
                iq / lq,
                Limit::Narrow.label(),
                i / n,
                iq / nq
            );
        }
    }
    // The rows' sizes: idem's against its limit's written by hand.
    let last = IDEM
        .iter()
        .find(|v| v.label == "idem, claim last, separate")
        .expect("claim last, separate");
    println!(
        "bytes a row: {} {:.0}, {} {:.0}, {} {:.0}",
        last.label,
        row_bytes(&setup.pool, last.table).await?,
        Limit::Row.label(),
        row_bytes(&setup.pool, Limit::ROW_TABLE).await?,
        Limit::Narrow.label(),
        row_bytes(&setup.pool, Limit::NARROW_TABLE).await?
    );

    // The default variant's ratio under every setting, the key one last:
    // 250 us each way, or the largest delay asked for.
    let key = delays
        .iter()
        .position(|&d| d == 250)
        .unwrap_or_else(|| (0..delays.len()).max_by_key(|&n| delays[n]).unwrap_or(0));
    for n in (0..nets.len()).filter(|&n| n != key).chain([key]) {
        let ratio = at(n, 1) / at(n, 0);
        let unmarked = quiet(n, 1) / quiet(n, 0);
        if delays[n] == 0 {
            println!("idem/bare direct: {ratio:.3} (unmarked rounds {unmarked:.3})");
        } else {
            println!(
                "idem/bare at {}us: {ratio:.3} (unmarked rounds {unmarked:.3})",
                delays[n]
            );
        }
    }

    // Each dedup table, and the outbox table its store's migration makes.
    let mut tables = vec![
        "bench_inventory".to_owned(),
        Limit::NARROW_TABLE.to_owned(),
        Limit::ROW_TABLE.to_owned(),
        format!("{}_outbox", Limit::ROW_TABLE),
    ];
    for v in IDEM.iter() {
        tables.push(v.table.to_owned());
        tables.push(format!("{}_outbox", v.table));
    }
    sqlx::raw_sql(AssertSqlSafe(format!(
        "DROP TABLE IF EXISTS {}",
        tables.join(", ")
    )))
    .execute(&setup.pool)
    .await?;
    Ok(())
}
