//! The Idempotency-Key layer through real crashes: a server process of its
//! own (`http_crash_server`, this binary run as a child) is killed with
//! SIGKILL at an exact point of a request, a fresh one is started on the
//! same database, and the client's retry (the same key and request) is
//! checked against the rows the database holds.
//!
//! * Transaction mode (PostgreSQL claiming last and first, SQLite on a
//!   file): the handler inserts one payment row through the request's
//!   transaction and answers 201 with the payment id it generated. Killed
//!   after the layer returned (the commit done) and before the response is
//!   written, the retry gets the recorded response, with the first run's
//!   payment id, and the table holds one row; killed in the handler after
//!   its insert (before the commit), the table holds none, and the retry
//!   runs the handler: one row.
//! * Lease mode (Redis): the handler's effect is an entry in a Redis list,
//!   outside any transaction. Killed after the completion, the retry
//!   replays and the effect stands once; killed in the handler, the effect
//!   stands (nothing undoes it), the retry is `409` while the dead server's
//!   lease holds and runs the handler again once it ran out: what lease
//!   mode promises, and why its handlers pass the key on downstream.
//!
//! The points are chosen by a request header, `x-die: after-commit` (a
//! middleware outside the layer, once the layer's service returned) or
//! `x-die: before-commit` (in the handler), which the fingerprint does not
//! take: the retry goes without it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{Json, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use idem_runtime::http::{Fingerprint, Idempotency, IdempotencyKey, RequestTx};
use idem_runtime::{ClaimOrder, PgStore, SqliteStore};
use idem_tests::{
    ChildTest, DeleteKeys, DropTables, HttpClient, Reply, free_port, or_skip, pg_url, redis_url,
    unique_prefix, unique_table,
};
use serde_json::{Value, json};
use sqlx::AssertSqlSafe;

/// The route's namespace in the store.
const ROUTE: &str = "http_crash_payments";

/// The longest wait for a line of a child's or a request's answer.
const WAIT: Duration = Duration::from_secs(10);

/// Keys a scenario runs, one crash each.
const ROUNDS: usize = 3;

/// The lease of the lease-mode route: short, so that a dead server's keys
/// come free within the test.
const LEASE: Duration = Duration::from_secs(2);

/// The store a scenario's servers share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Pg(ClaimOrder),
    Sqlite,
    Redis,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Pg(ClaimOrder::First) => "pg-first",
            Kind::Pg(_) => "pg-last",
            Kind::Sqlite => "sqlite",
            Kind::Redis => "redis",
        }
    }

    fn parse(name: &str) -> Kind {
        match name {
            "pg-first" => Kind::Pg(ClaimOrder::First),
            "pg-last" => Kind::Pg(ClaimOrder::Last),
            "sqlite" => Kind::Sqlite,
            "redis" => Kind::Redis,
            other => panic!("unknown store {other}"),
        }
    }
}

// ---------------------------------------------------------------------
// The server: a child process.
// ---------------------------------------------------------------------

/// Whether the request asks to die at `point`.
fn dies(headers: &HeaderMap, point: &str) -> bool {
    headers
        .get("x-die")
        .is_some_and(|v| v.as_bytes() == point.as_bytes())
}

/// A fresh payment id: what tells a replay from a second run.
fn payment_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

/// The answer of a payment that ran.
fn created(id: &str, amount: i64) -> Response {
    (
        StatusCode::CREATED,
        Json(json!({ "payment_id": id, "amount": amount })),
    )
        .into_response()
}

/// Outside the idempotency layer: once its service returned (the response
/// committed with the handler's writes, or recorded), a request with
/// `x-die: after-commit` prints `committed <key> <status>` and never
/// answers, so that the parent kills the server before the response is
/// written.
async fn die_after_commit(request: Request, next: Next) -> Response {
    let die = dies(request.headers(), "after-commit");
    let key = request
        .headers()
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .trim_matches('"')
        .to_owned();
    let response = next.run(request).await;
    if die {
        println!("committed {key} {}", response.status().as_u16());
        std::future::pending::<()>().await;
    }
    response
}

/// A transaction-mode handler over `$store`: one payment row inserted
/// through the request's transaction; with `x-die: before-commit` it prints
/// `wrote <key>` after the insert and never returns.
macro_rules! pay_in_tx {
    ($name:ident, $store:ty) => {
        async fn $name(
            State(payments): State<Arc<str>>,
            key: IdempotencyKey,
            headers: HeaderMap,
            tx: RequestTx<$store>,
            Json(body): Json<Value>,
        ) -> Response {
            let amount = body["amount"].as_i64().unwrap_or_default();
            let id = payment_id();
            let sql = format!(
                "INSERT INTO {payments} (idem_key, amount, payment_id) VALUES ($1, $2, $3)"
            );
            {
                let mut tx = match tx.lock().await {
                    Ok(tx) => tx,
                    Err(e) => return e.into_response(),
                };
                let inserted = sqlx::query(AssertSqlSafe(sql))
                    .bind(key.sent())
                    .bind(amount)
                    .bind(&id)
                    .execute(&mut **tx)
                    .await;
                if let Err(e) = inserted {
                    return (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response();
                }
            }
            if dies(&headers, "before-commit") {
                println!("wrote {}", key.sent());
                std::future::pending::<()>().await;
            }
            created(&id, amount)
        }
    };
}

pay_in_tx!(pay_pg, PgStore);
pay_in_tx!(pay_sqlite, SqliteStore);

/// What the lease-mode handler writes its effect with.
#[derive(Clone)]
struct Effects {
    redis: redis::aio::MultiplexedConnection,
    prefix: Arc<str>,
}

/// A lease-mode handler: its effect is the payment id pushed on a Redis
/// list of the key's, outside any transaction; with `x-die: before-commit`
/// it prints `wrote <key>` after the push and never returns.
async fn pay_in_lease(
    State(effects): State<Effects>,
    key: IdempotencyKey,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Response {
    let amount = body["amount"].as_i64().unwrap_or_default();
    let id = payment_id();
    let mut redis = effects.redis.clone();
    let pushed: redis::RedisResult<i64> = redis::cmd("RPUSH")
        .arg(effects_key(&effects.prefix, key.sent()))
        .arg(&id)
        .query_async(&mut redis)
        .await;
    if let Err(e) = pushed {
        return (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response();
    }
    if dies(&headers, "before-commit") {
        println!("wrote {}", key.sent());
        std::future::pending::<()>().await;
    }
    created(&id, amount)
}

/// The Redis list of the effects of `key`'s requests.
fn effects_key(prefix: &str, key: &str) -> String {
    format!("{prefix}:effects:{key}")
}

/// The route over the store the environment names, inside the middleware
/// that dies after the commit.
async fn router(kind: Kind, var: impl Fn(&str) -> String) -> Router {
    let route = Idempotency::unscoped(ROUTE, Duration::from_secs(3_600))
        // The method, path, query and body: not `x-die`.
        .fingerprint(Fingerprint::default());
    let payments: Arc<str> = var("IDEM_HTTP_CRASH_PAYMENTS").into();
    let dedup = var("IDEM_HTTP_CRASH_DEDUP");
    match kind {
        Kind::Pg(order) => {
            let store = PgStore::connect(&pg_url())
                .await
                .expect("PostgreSQL")
                .with_table(&dedup)
                .expect("a table name")
                .with_claim_order(order);
            Router::new()
                .route("/payments", post(pay_pg))
                .route_layer(route.transaction(store).expect("the layer"))
                .route_layer(middleware::from_fn(die_after_commit))
                .with_state(payments)
        }
        Kind::Sqlite => {
            let store = SqliteStore::open(var("IDEM_HTTP_CRASH_SQLITE"))
                .await
                .expect("SQLite")
                .with_table(&dedup)
                .expect("a table name");
            Router::new()
                .route("/payments", post(pay_sqlite))
                .route_layer(route.transaction(store).expect("the layer"))
                .route_layer(middleware::from_fn(die_after_commit))
                .with_state(payments)
        }
        Kind::Redis => {
            let store = idem_tests::redis_store(&dedup).await.expect("Redis");
            let redis = redis::Client::open(redis_url())
                .expect("a Redis URL")
                .get_multiplexed_async_connection()
                .await
                .expect("Redis");
            let effects = Effects {
                redis,
                prefix: dedup.into(),
            };
            Router::new()
                .route("/payments", post(pay_in_lease))
                .route_layer(route.lease_duration(LEASE).lease(store).expect("the layer"))
                .route_layer(middleware::from_fn(die_after_commit))
                .with_state(effects)
        }
    }
}

/// The server: a child process of this binary, serving the payments route
/// over the store of `IDEM_HTTP_CRASH_KIND` on `127.0.0.1:<IDEM_HTTP_CRASH_PORT>`
/// until it is killed. It prints `listening` once bound, and the lines of
/// its die points.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by the crash tests as a child process"]
async fn http_crash_server() {
    let Ok(kind) = std::env::var("IDEM_HTTP_CRASH_KIND") else {
        return;
    };
    let var = |name: &str| std::env::var(name).unwrap_or_default();
    let router = router(Kind::parse(&kind), var).await;
    let port: u16 = var("IDEM_HTTP_CRASH_PORT").parse().expect("a port");
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .expect("bind the port");
    println!("listening");
    axum::serve(listener, router).await.expect("serve");
}

// ---------------------------------------------------------------------
// The tests: the parent.
// ---------------------------------------------------------------------

/// Where the parent reads the effects back.
enum Db {
    Pg(sqlx::PgPool),
    Sqlite(sqlx::SqlitePool),
    Redis(redis::aio::MultiplexedConnection),
}

/// A scenario's store, business table (or list prefix) and the guards that
/// remove them.
struct Fx {
    kind: Kind,
    db: Db,
    dedup: String,
    payments: String,
    sqlite: String,
    _dir: Option<tempfile::TempDir>,
    _tables: Option<DropTables>,
    _keys: Option<DeleteKeys>,
}

/// A running server and a client of it.
struct Server {
    process: ChildTest,
    client: HttpClient,
}

impl Fx {
    /// `None` (after saying why) when the scenario's server is unreachable.
    async fn open(kind: Kind) -> Option<Fx> {
        let dedup = unique_table("http_crash_dedup");
        let payments = unique_table("http_crash_pay");
        let create = format!(
            "CREATE TABLE {payments} (idem_key TEXT NOT NULL, amount BIGINT NOT NULL, payment_id TEXT NOT NULL)"
        );
        let fx = match kind {
            Kind::Pg(_) => {
                let pool = idem_tests::pg_pool(2).await?;
                let tables = DropTables::new(&[&dedup, &payments]);
                let store = PgStore::from_pool(pool.clone())
                    .with_table(&dedup)
                    .expect("a table name");
                store.migrate().await.expect("migrate");
                sqlx::query(AssertSqlSafe(create))
                    .execute(&pool)
                    .await
                    .expect("the payments table");
                Fx {
                    kind,
                    db: Db::Pg(pool),
                    dedup,
                    payments,
                    sqlite: String::new(),
                    _dir: None,
                    _tables: Some(tables),
                    _keys: None,
                }
            }
            Kind::Sqlite => {
                let dir = tempfile::tempdir().expect("a temporary directory");
                let path = dir.path().join("idem.db").display().to_string();
                let store = SqliteStore::open(&path)
                    .await
                    .expect("SQLite")
                    .with_table(&dedup)
                    .expect("a table name");
                store.migrate().await.expect("migrate");
                let pool = store.pool().clone();
                sqlx::query(AssertSqlSafe(create))
                    .execute(&pool)
                    .await
                    .expect("the payments table");
                Fx {
                    kind,
                    db: Db::Sqlite(pool),
                    dedup,
                    payments,
                    sqlite: path,
                    _dir: Some(dir),
                    _tables: None,
                    _keys: None,
                }
            }
            Kind::Redis => {
                let prefix = unique_prefix("http_crash");
                idem_tests::redis_store(&prefix).await?;
                let keys = DeleteKeys::new(&redis_url(), &prefix);
                let redis = redis::Client::open(redis_url())
                    .expect("a Redis URL")
                    .get_multiplexed_async_connection()
                    .await
                    .expect("Redis");
                Fx {
                    kind,
                    db: Db::Redis(redis),
                    dedup: prefix,
                    payments,
                    sqlite: String::new(),
                    _dir: None,
                    _tables: None,
                    _keys: Some(keys),
                }
            }
        };
        Some(fx)
    }

    /// Starts a server on the scenario's store, once it listens.
    async fn serve(&self) -> Server {
        let port = free_port().expect("a free port");
        let mut process = ChildTest::spawn(
            "http_crash::http_crash_server",
            &[
                ("IDEM_HTTP_CRASH_KIND", self.kind.name()),
                ("IDEM_HTTP_CRASH_PORT", &port.to_string()),
                ("IDEM_HTTP_CRASH_DEDUP", &self.dedup),
                ("IDEM_HTTP_CRASH_PAYMENTS", &self.payments),
                ("IDEM_HTTP_CRASH_SQLITE", &self.sqlite),
            ],
        );
        process.line("listening", WAIT).await;
        Server {
            process,
            client: HttpClient::new(SocketAddr::from(([127, 0, 0, 1], port))),
        }
    }

    /// The payment ids the database holds for `key`: one per effect.
    async fn effects(&self, key: &str) -> Vec<String> {
        let sql = format!(
            "SELECT payment_id FROM {} WHERE idem_key = $1 ORDER BY payment_id",
            self.payments
        );
        match &self.db {
            Db::Pg(pool) => sqlx::query_scalar(AssertSqlSafe(sql))
                .bind(key)
                .fetch_all(pool)
                .await
                .expect("read the payments"),
            Db::Sqlite(pool) => sqlx::query_scalar(AssertSqlSafe(sql))
                .bind(key)
                .fetch_all(pool)
                .await
                .expect("read the payments"),
            Db::Redis(redis) => redis::cmd("LRANGE")
                .arg(effects_key(&self.dedup, key))
                .arg(0)
                .arg(-1)
                .query_async(&mut redis.clone())
                .await
                .expect("read the effects"),
        }
    }
}

/// The scenario's request body for `key`'s round.
fn payment(round: usize) -> Value {
    json!({ "amount": 100 + round })
}

/// A key of the scenario's own.
fn key(what: &str, round: usize) -> String {
    format!("{what}-{round}-{}", payment_id())
}

impl Server {
    /// Sends `body` under `key` with `x-die: point`, waits for the server's
    /// `line` (`committed` or `wrote`) for the key, kills the server with
    /// SIGKILL and checks that the request got no response. Returns what
    /// followed the key on the line.
    async fn die(mut self, key: &str, body: &Value, point: &'static str, line: &str) -> String {
        let request = {
            let (client, quoted, body) =
                (self.client.clone(), format!("\"{key}\""), body.to_string());
            tokio::spawn(async move {
                client
                    .send(
                        "POST",
                        "/payments",
                        &[
                            ("idempotency-key", &quoted),
                            ("content-type", "application/json"),
                            ("x-die", point),
                        ],
                        body,
                    )
                    .await
            })
        };
        let said = self.process.line(&format!("{line} {key}"), WAIT).await;
        self.process.kill();
        let answer = tokio::time::timeout(WAIT, request)
            .await
            .expect("the request ends once the server is killed")
            .expect("the request's task");
        assert!(
            answer.is_err(),
            "the killed server answered the request dying {point}: {answer:?}"
        );
        said
    }

    /// The client's retry: the same key and body, without `x-die`.
    async fn retry(&self, key: &str, body: &Value) -> Reply {
        tokio::time::timeout(WAIT, self.client.post("/payments", key, body))
            .await
            .expect("the retry's answer")
    }
}

/// The payment id a response carries.
fn paid(reply: &Reply) -> String {
    reply.json()["payment_id"]
        .as_str()
        .unwrap_or_else(|| panic!("no payment id in {} {}", reply.status, reply.text()))
        .to_owned()
}

/// Killed after the commit, before the response is written: the payment
/// row and the recorded response committed together; the retry on a fresh
/// server gets the recorded response, whose payment id is the row's, and
/// runs nothing.
async fn a_kill_after_the_commit_leaves_the_row_and_the_response(kind: Kind) {
    let fx = or_skip!(Fx::open(kind).await);
    let mut server = fx.serve().await;
    for round in 0..ROUNDS {
        let key = key("after", round);
        let body = payment(round);
        let status = server.die(&key, &body, "after-commit", "committed").await;
        assert_eq!(status, "201", "the layer's answer before the kill");
        let rows = fx.effects(&key).await;
        assert_eq!(rows.len(), 1, "committed before the kill: {rows:?}");

        server = fx.serve().await;
        let retry = server.retry(&key, &body).await;
        assert_eq!(retry.status, 201, "{}", retry.text());
        assert_eq!(retry.header("idempotent-replayed"), Some("true"));
        assert_eq!(
            paid(&retry),
            rows[0],
            "the retry's payment id is the committed row's"
        );
        assert_eq!(retry.json()["amount"], body["amount"]);
        assert_eq!(fx.effects(&key).await, rows, "the retry ran nothing");
    }
}

/// Killed in the handler after its insert, before the commit: the row went
/// with the process; the retry on a fresh server runs the handler (not a
/// replay) and leaves one row, whose payment id it answers; a second retry
/// replays it.
async fn a_kill_before_the_commit_leaves_nothing_and_the_retry_runs(kind: Kind) {
    let fx = or_skip!(Fx::open(kind).await);
    let mut server = fx.serve().await;
    for round in 0..ROUNDS {
        let key = key("before", round);
        let body = payment(round);
        server.die(&key, &body, "before-commit", "wrote").await;
        let rows = fx.effects(&key).await;
        assert!(rows.is_empty(), "the insert outlived its process: {rows:?}");

        server = fx.serve().await;
        let retry = server.retry(&key, &body).await;
        assert_eq!(retry.status, 201, "{}", retry.text());
        assert!(
            !retry.replayed(),
            "nothing was recorded, yet the retry is a replay"
        );
        let rows = fx.effects(&key).await;
        assert_eq!(rows, [paid(&retry)], "one row, the retry's");

        let again = server.retry(&key, &body).await;
        assert_eq!(again.status, 201, "{}", again.text());
        assert!(again.replayed());
        assert_eq!(paid(&again), rows[0]);
        assert_eq!(fx.effects(&key).await, rows);
    }
}

/// Lease mode, killed after the completion: the retry replays the recorded
/// response and the effect stands once.
async fn a_kill_after_the_completion_replays_in_lease_mode(kind: Kind) {
    a_kill_after_the_commit_leaves_the_row_and_the_response(kind).await;
}

/// Lease mode, killed in the handler after its effect: the effect stands
/// (lease mode cannot take it back); the retry is `409` while the dead
/// server's lease holds, then, once it ran out, runs the handler again: a
/// second effect, which a second retry replays.
async fn a_kill_in_the_handler_holds_the_key_for_the_lease_then_runs_again(kind: Kind) {
    let fx = or_skip!(Fx::open(kind).await);
    let key = key("lease", 0);
    let body = payment(0);
    let server = fx.serve().await;
    server.die(&key, &body, "before-commit", "wrote").await;
    let killed = Instant::now();
    let first = fx.effects(&key).await;
    assert_eq!(first.len(), 1, "the effect left before the kill: {first:?}");

    let server = fx.serve().await;
    let mut conflicts = 0;
    let ran = loop {
        let retry = server.retry(&key, &body).await;
        if retry.status != 409 {
            break retry;
        }
        assert!(
            retry.header("retry-after").is_some(),
            "a 409 without Retry-After"
        );
        conflicts += 1;
        assert!(
            killed.elapsed() < LEASE + WAIT,
            "the dead server's lease never ran out"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let held = killed.elapsed();
    assert!(
        conflicts > 0,
        "the first retry ran while the dead server's lease held"
    );
    // Extended every third of its length while the handler ran: at least
    // two thirds of it were left at the kill.
    assert!(
        held >= LEASE / 2,
        "the key came free {held:?} after the kill, before the lease ran out"
    );
    assert_eq!(ran.status, 201, "{}", ran.text());
    assert!(!ran.replayed());
    let effects = fx.effects(&key).await;
    assert_eq!(
        effects.len(),
        2,
        "the dead server's effect and the retry's: {effects:?}"
    );
    assert!(effects.contains(&first[0]) && effects.contains(&paid(&ran)));

    let again = server.retry(&key, &body).await;
    assert_eq!(again.status, 201, "{}", again.text());
    assert!(again.replayed());
    assert_eq!(paid(&again), paid(&ran));
    assert_eq!(fx.effects(&key).await, effects);
}

macro_rules! crash_tests {
    ($($name:ident: $scenario:ident($kind:expr),)*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                $scenario($kind).await;
            }
        )*
    };
}

crash_tests! {
    pg_a_kill_after_the_commit_replays: a_kill_after_the_commit_leaves_the_row_and_the_response(Kind::Pg(ClaimOrder::Last)),
    pg_a_kill_before_the_commit_runs_again: a_kill_before_the_commit_leaves_nothing_and_the_retry_runs(Kind::Pg(ClaimOrder::Last)),
    pg_claim_first_a_kill_after_the_commit_replays: a_kill_after_the_commit_leaves_the_row_and_the_response(Kind::Pg(ClaimOrder::First)),
    pg_claim_first_a_kill_before_the_commit_runs_again: a_kill_before_the_commit_leaves_nothing_and_the_retry_runs(Kind::Pg(ClaimOrder::First)),
    sqlite_a_kill_after_the_commit_replays: a_kill_after_the_commit_leaves_the_row_and_the_response(Kind::Sqlite),
    sqlite_a_kill_before_the_commit_runs_again: a_kill_before_the_commit_leaves_nothing_and_the_retry_runs(Kind::Sqlite),
    redis_lease_a_kill_after_the_completion_replays: a_kill_after_the_completion_replays_in_lease_mode(Kind::Redis),
    redis_lease_a_kill_in_the_handler_runs_again_after_the_lease: a_kill_in_the_handler_holds_the_key_for_the_lease_then_runs_again(Kind::Redis),
}
