//! Requests per second through an axum server on loopback: the same
//! payment `INSERT` on PostgreSQL, bare and behind the `Idempotency-Key`
//! layer in transaction mode, and the layer's answer to a key already
//! recorded.
//!
//! ```text
//! cargo run --release -p idem-examples --features http,postgres --example bench_http
//! ROUNDS=7 SECS=3 TASKS=8 CLAIM=checked cargo run --release -p idem-examples --features http,postgres --example bench_http
//! ```
//!
//! Five `POST` routes, each answering `201` with the payment as JSON and
//! its `Location`:
//!
//! * `bare`: the handler opens a transaction of its own, inserts the
//!   payment (`BEGIN; INSERT ... RETURNING id; COMMIT`), no idempotency;
//! * `idempotent`: the same `INSERT` through the request's [`RequestTx`],
//!   behind `Idempotency::scoped_by(..).transaction(store)`, every request
//!   with a fresh key;
//! * `replay`: the same handler behind a layer of its own, every request
//!   with a key recorded before the rounds (with its request's body):
//!   each one is answered with the recorded response, `idempotent-replayed:
//!   true`. With `CLAIM=last` (the bench's default; `ClaimOrder::Last`) its
//!   handler runs and its `INSERT` is rolled back when the commit finds the
//!   key; `CLAIM=checked` (the store's default) reads the key's record
//!   first, `CLAIM=first` claims it first (both answer a settled key before
//!   the handler);
//! * the limits, `bare` with one more prepared statement in its
//!   transaction, no layer (`payments::pay_extra`): `limit: + narrow row`
//!   (the payment's id and a short text) and `limit: + layer's row` (the
//!   row the layer records for a fresh request, written by hand into a
//!   table of the store's migration: the response as the layer stores it,
//!   a fingerprint as long as the layer's).
//!
//! `TASKS` clients (default 8), each a hyper client with its connection kept
//! alive, send one request after another for `SECS` seconds (default 3) per
//! variant; the server, the clients and PostgreSQL share the machine. Keys
//! are scoped by an `x-account` header, one account a client. `ROUNDS`
//! rounds (default 5) run the variants interleaved, in an order
//! rotated each round, after a warm-up second of each. The database is
//! `DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/test`), on a
//! pool of `TASKS` connections shared by the handlers and the store; the
//! run's tables are its own (named after its process id) and dropped at the
//! end. Each round prints its rates and the CPU's busy, idle and steal
//! shares (from `/proc/stat`, all processes), marked `STOLEN` above 5 %
//! steal (see `examples/src/cpu.rs`); then each variant's medians: its
//! rate, and the CPU time a request cost this process (the server and the
//! clients, from `/proc/self/stat`) and the rest of the machine (the
//! database, and anything else running); the statements each request
//! sent, the bytes of a row of the layer's table and of the limits', the
//! CPU over the run, the ratios over all rounds and over the unmarked
//! ones, the limits' ratios and idempotent's to each, and, on the last
//! line, the ratios of the medians: `idempotent/bare` and `replay/fresh`
//! (replay over idempotent). The limits add one statement, as the layer
//! does claiming last; with `CLAIM=checked` or `first` it sends two. Every answer is checked (status, the replay marker),
//! and at the end the payments table must hold exactly one row per fresh
//! request answered `201`: the replays inserted nothing.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::routing::post;
use idem_examples::cpu::{Cpu, Rounds, Watch, load_average, process_seconds};
use idem_examples::http::Client;
use idem_examples::payments::{App, Extra, account_of, pay_bare, pay_extra, pay_idem};
use idem_examples::{env, median, row_bytes, statement_log};
use idem_runtime::http::Idempotency;
use idem_runtime::{ClaimOrder, PgStore};
use sqlx::postgres::PgPoolOptions;
use sqlx::{AssertSqlSafe, PgPool};
use tower_service::Service;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Variant {
    Bare,
    Idem,
    Replay,
    Extra,
    Row,
}

const VARIANTS: [Variant; 5] = [
    Variant::Bare,
    Variant::Idem,
    Variant::Replay,
    Variant::Extra,
    Variant::Row,
];

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::Bare => "bare",
            Variant::Idem => "idempotent",
            Variant::Replay => "replay",
            Variant::Extra => "limit: + narrow row",
            Variant::Row => "limit: + layer's row",
        }
    }
}

/// What the clients share: the key counter, the replay keys, and the
/// count of payments the server answered `201` for as fresh.
struct Load {
    next_key: AtomicU64,
    replay_keys: u64,
    created: AtomicU64,
}

impl Load {
    /// A client's `i`-th request of `variant`: its path, key and body (the
    /// replay keys are the same for every account, each its own in its scope).
    fn request(&self, variant: Variant, i: u64) -> (&'static str, Option<String>, String) {
        let amount = format!("{{\"amount\":{}}}", i % 1000 + 1);
        match variant {
            Variant::Bare => ("/bare", None, amount),
            Variant::Extra => ("/extra", None, amount),
            Variant::Row => ("/row", None, amount),
            Variant::Idem => {
                let k = self.next_key.fetch_add(1, Ordering::Relaxed);
                ("/idem", Some(format!("\"k{k}\"")), amount)
            }
            Variant::Replay => {
                let r = i % self.replay_keys;
                (
                    "/replay",
                    Some(format!("\"r{r}\"")),
                    format!("{{\"amount\":{}}}", r + 1),
                )
            }
        }
    }
}

/// Sends one request and checks its answer.
async fn send(
    client: &Client,
    load: &Load,
    variant: Variant,
    t: usize,
    i: u64,
) -> Result<(), String> {
    let (path, key, body) = load.request(variant, i);
    let account = format!("acct-{t}");
    let mut headers = vec![
        ("x-account", account.as_str()),
        ("content-type", "application/json"),
    ];
    if let Some(key) = &key {
        headers.push(("idempotency-key", key.as_str()));
    }
    let reply = client
        .send("POST", path, &headers, body)
        .await
        .map_err(|e| format!("{}: {e}", variant.name()))?;
    let replayed = reply.header("idempotent-replayed");
    let expected = match variant {
        Variant::Bare | Variant::Idem | Variant::Extra | Variant::Row => {
            reply.status == 201 && replayed.is_none()
        }
        Variant::Replay => reply.status == 201 && replayed == Some("true"),
    };
    if !expected {
        return Err(format!(
            "{} request {i} of client {t}: {} (idempotent-replayed: {replayed:?}) {}",
            variant.name(),
            reply.status,
            reply.text()
        ));
    }
    if variant != Variant::Replay {
        load.created.fetch_add(1, Ordering::Relaxed);
    }
    Ok(())
}

/// One variant's run: its rate, and the CPU a request cost this process
/// (the server and the clients) and the rest of the machine (PostgreSQL,
/// and whatever else runs).
#[derive(Clone, Copy, Debug)]
struct Sample {
    rate: f64,
    process_us: f64,
    rest_us: f64,
}

/// Runs `variant` for `secs` with one task a client.
async fn run(
    variant: Variant,
    secs: f64,
    clients: &[Client],
    load: &Arc<Load>,
) -> Result<Sample, BoxError> {
    let (machine, process) = (Cpu::now()?, process_seconds()?);
    let start = Instant::now();
    let until = start + Duration::from_secs_f64(secs);
    let tasks: Vec<_> = clients
        .iter()
        .enumerate()
        .map(|(t, client)| {
            let (client, load) = (client.clone(), Arc::clone(load));
            tokio::spawn(async move {
                let mut i = 0;
                while Instant::now() < until {
                    send(&client, &load, variant, t, i).await?;
                    i += 1;
                }
                Ok::<u64, String>(i)
            })
        })
        .collect();
    let mut done = 0;
    for task in tasks {
        done += task.await??;
    }
    let elapsed = start.elapsed().as_secs_f64();
    let busy = Cpu::now()?.busy_seconds_since(machine);
    let own = process_seconds()? - process;
    let per = |seconds: f64| seconds * 1e6 / done.max(1) as f64;
    Ok(Sample {
        rate: done as f64 / elapsed,
        process_us: per(own),
        rest_us: per(busy - own),
    })
}

/// The statements (= round trips) one request of `variant` sends (their
/// summaries), with sqlx's statement log and the `BEGIN` its Postgres
/// driver sends outside it: the request is served in this task, where the
/// log listens.
async fn statements(
    router: &Router,
    load: &Load,
    variant: Variant,
) -> Result<Vec<String>, BoxError> {
    let (path, key, body) = load.request(variant, 0);
    let mut request = Request::post(path)
        .header("x-account", "acct-0")
        .header("content-type", "application/json");
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    let request = request.body(Body::from(body))?;
    let mut service = router.clone();
    let mut status = None;
    let seen = statement_log::statements_of(async {
        status = service.call(request).await.ok().map(|r| r.status());
    })
    .await;
    if status != Some(StatusCode::CREATED) {
        return Err(format!("{}: answered {status:?}", variant.name()).into());
    }
    if variant != Variant::Replay {
        load.created.fetch_add(1, Ordering::Relaxed);
    }
    Ok(statement_log::with_begin(seen))
}

/// `CLAIM`: the store's claim order (`last`, the bench's default;
/// `checked`, the store's; `first`).
fn claim_order() -> Result<ClaimOrder, BoxError> {
    match std::env::var("CLAIM").as_deref() {
        Err(_) | Ok("last") => Ok(ClaimOrder::Last),
        Ok("checked") => Ok(ClaimOrder::Checked),
        Ok("first") => Ok(ClaimOrder::First),
        Ok(other) => Err(format!("CLAIM={other}: last, checked or first").into()),
    }
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let secs: f64 = env("SECS", 3.0);
    let rounds: usize = env("ROUNDS", 5);
    let tasks: usize = env("TASKS", 8);
    let replay_keys: u64 = env("REPLAY_KEYS", 100);
    let claim = claim_order()?;

    let pool = PgPoolOptions::new()
        .max_connections(tasks as u32)
        .min_connections(tasks as u32)
        // No liveness ping before each transaction: no variant pays it.
        .test_before_acquire(false)
        .connect(&url)
        .await?;
    let run_id = format!("bench_http_{}", std::process::id());
    let (payments, dedup) = (format!("{run_id}_payments"), format!("{run_id}_keys"));
    let (notes, rows) = (format!("{run_id}_notes"), format!("{run_id}_rows"));
    sqlx::raw_sql(AssertSqlSafe(format!(
        "CREATE TABLE {payments} (id BIGSERIAL PRIMARY KEY, account TEXT NOT NULL, amount BIGINT NOT NULL);
         CREATE TABLE {notes} (id BIGINT PRIMARY KEY, note TEXT NOT NULL)"
    )))
    .execute(&pool)
    .await?;
    let result = bench(
        &pool,
        Tables {
            payments: &payments,
            dedup: &dedup,
            notes: &notes,
            rows: &rows,
        },
        claim,
        (secs, rounds, tasks, replay_keys),
    )
    .await;
    sqlx::raw_sql(AssertSqlSafe(format!(
        "DROP TABLE IF EXISTS {payments}, {dedup}, {dedup}_outbox, {notes}, {rows}, {rows}_outbox"
    )))
    .execute(&pool)
    .await?;
    result
}

/// The run's tables: the payments, the layer's dedup table, and the
/// limits' (a narrow one, and one of the store's migration).
#[derive(Clone, Copy)]
struct Tables<'a> {
    payments: &'a str,
    dedup: &'a str,
    notes: &'a str,
    rows: &'a str,
}

async fn bench(
    pool: &PgPool,
    tables: Tables<'_>,
    claim: ClaimOrder,
    (secs, rounds, tasks, replay_keys): (f64, usize, usize, u64),
) -> Result<(), BoxError> {
    let Tables {
        payments, dedup, ..
    } = tables;
    let store = PgStore::from_pool(pool.clone())
        .with_table(dedup)?
        .with_claim_order(claim);
    store.migrate().await?;
    PgStore::from_pool(pool.clone())
        .with_table(tables.rows)?
        .migrate()
        .await?;
    let ttl = Duration::from_secs(3600);
    let fresh =
        Idempotency::scoped_by("bench_http_pay", ttl, account_of).transaction(store.clone())?;
    let replayed =
        Idempotency::scoped_by("bench_http_replay", ttl, account_of).transaction(store.clone())?;
    let app = App::new(pool.clone(), payments);
    let router = Router::new()
        .route("/bare", post(pay_bare))
        .merge(
            Router::new()
                .route("/idem", post(pay_idem))
                .route_layer(fresh),
        )
        .merge(
            Router::new()
                .route("/replay", post(pay_idem))
                .route_layer(replayed),
        )
        .with_state(app.clone())
        .merge(
            Router::new()
                .route("/extra", post(pay_extra))
                .with_state(Extra::note(app.clone(), tables.notes)),
        )
        .merge(
            Router::new()
                .route("/row", post(pay_extra))
                .with_state(Extra::record(app, tables.rows)),
        );

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let served = router.clone();
    let server = tokio::spawn(async move { axum::serve(listener, served).await });
    let result = rounds_of(
        &router,
        addr,
        (secs, rounds, tasks, replay_keys),
        claim,
        pool,
        tables,
    )
    .await;
    server.abort();
    result
}

async fn rounds_of(
    router: &Router,
    addr: std::net::SocketAddr,
    (secs, rounds, tasks, replay_keys): (f64, usize, usize, u64),
    claim: ClaimOrder,
    pool: &PgPool,
    tables: Tables<'_>,
) -> Result<(), BoxError> {
    let payments = tables.payments;
    let clients: Vec<Client> = (0..tasks).map(|_| Client::new(addr)).collect();
    let load = Arc::new(Load {
        next_key: AtomicU64::new(0),
        replay_keys: replay_keys.max(1),
        created: AtomicU64::new(0),
    });
    // The replay keys, recorded for every client's account.
    for (t, client) in clients.iter().enumerate() {
        for i in 0..load.replay_keys {
            let (path, key, body) = load.request(Variant::Replay, i);
            let account = format!("acct-{t}");
            let key = key.unwrap_or_default();
            let reply = client
                .send(
                    "POST",
                    path,
                    &[
                        ("x-account", &account),
                        ("content-type", "application/json"),
                        ("idempotency-key", &key),
                    ],
                    body,
                )
                .await?;
            if reply.status != 201 || reply.header("idempotent-replayed").is_some() {
                return Err(format!("recording replay key {i}: {}", reply.status).into());
            }
            load.created.fetch_add(1, Ordering::Relaxed);
        }
    }

    println!(
        "{tasks} clients with keep-alive, {rounds} rounds of {secs} s per variant, interleaved; \
         claim order {claim:?}; {} cores, load average {}",
        std::thread::available_parallelism().map_or(0, usize::from),
        load_average()
    );
    for v in VARIANTS {
        run(v, 1.0, &clients, &load).await?;
    }
    let mut samples: [Vec<Sample>; VARIANTS.len()] = Default::default();
    let start = Watch::start()?;
    let mut marks = Rounds::default();
    for round in 1..=rounds {
        let watch = Watch::start()?;
        let mut line = [0.0; VARIANTS.len()];
        for i in 0..VARIANTS.len() {
            let v = (i + round) % VARIANTS.len();
            let sample = run(VARIANTS[v], secs, &clients, &load).await?;
            line[v] = sample.rate;
            samples[v].push(sample);
        }
        let cpu = marks.push(watch.stop()?);
        let rates: Vec<String> = VARIANTS
            .iter()
            .zip(line)
            .map(|(v, rate)| format!("{} {rate:.0}", v.name()))
            .collect();
        println!("round {round}: {} req/s ({cpu})", rates.join(", "));
    }
    let over_run = start.stop()?;

    let _guard = tracing::subscriber::set_default(statement_log::StatementLog);
    let mut counts = Vec::new();
    for v in VARIANTS {
        let seen = statements(router, &load, v).await?;
        let words: Vec<&str> = seen
            .iter()
            .map(|s| s.split_whitespace().next().unwrap_or(""))
            .collect();
        counts.push(format!("{} {} ({})", v.name(), seen.len(), words.join(" ")));
    }
    drop(_guard);

    let rows: i64 = sqlx::query_scalar(AssertSqlSafe(format!("SELECT count(*) FROM {payments}")))
        .fetch_one(pool)
        .await?;
    let created = load.created.load(Ordering::Relaxed);
    if rows != created as i64 {
        return Err(format!(
            "{rows} payments in the table for {created} fresh requests answered 201"
        )
        .into());
    }

    let of = |v: usize, f: fn(&Sample) -> f64| median(samples[v].iter().map(f).collect());
    let rates = |v: usize| -> Vec<f64> { samples[v].iter().map(|s| s.rate).collect() };
    println!("{}", marks.summary());
    println!(
        "{:<21} {:>10} {:>7}   CPU per request: this process (server, clients) + the rest (PostgreSQL)",
        "variant", "median r/s", "/bare"
    );
    for (v, variant) in VARIANTS.iter().enumerate() {
        println!(
            "{:<21} {:>10.0} {:>7.3}   {:.0} us + {:.0} us",
            variant.name(),
            of(v, |s| s.rate),
            of(v, |s| s.rate) / of(0, |s| s.rate),
            of(v, |s| s.process_us),
            of(v, |s| s.rest_us),
        );
    }
    let [bare, idem, replay, extra, row] = [0, 1, 2, 3, 4].map(|v| of(v, |s| s.rate));
    println!(
        "statements (= round trips) per request: {}",
        counts.join(", ")
    );
    println!(
        "{rows} payments in the table, one per fresh request answered 201: the replays inserted none"
    );
    // The rows' sizes: the layer's record against the one written by hand.
    println!(
        "bytes a row: the layer's {:.0}, {} {:.0}, {} {:.0}",
        row_bytes(pool, tables.dedup).await?,
        Variant::Row.name(),
        row_bytes(pool, tables.rows).await?,
        Variant::Extra.name(),
        row_bytes(pool, tables.notes).await?
    );
    println!(
        "cpu over the run: {over_run}; load average after {}",
        load_average()
    );
    let quiet = |v: usize| marks.medians(&rates(v));
    println!(
        "over all rounds and unmarked ones: idempotent/bare {:.3}, replay/fresh {:.3}, \
         idempotent/(+ layer's row) {:.3}, idempotent/(+ narrow row) {:.3}",
        quiet(1).ratio(&quiet(0)),
        quiet(2).ratio(&quiet(1)),
        quiet(1).ratio(&quiet(4)),
        quiet(1).ratio(&quiet(3))
    );
    println!(
        "limits: (+ narrow row)/bare {:.3}, (+ layer's row)/bare {:.3}; idempotent/(+ layer's row) {:.3}, \
         idempotent/(+ narrow row) {:.3}",
        extra / bare,
        row / bare,
        idem / row,
        idem / extra
    );
    println!(
        "idempotent/bare {:.3}, replay/fresh {:.3}",
        idem / bare,
        replay / idem
    );
    Ok(())
}
