//! The client side of one message, to be counted by callgrind: one variant,
//! `MESSAGES` messages one after another on a single-threaded runtime, after
//! a warm-up. `scripts/count-instructions` runs it under
//! `valgrind --tool=callgrind` at two message counts and divides the
//! difference, so that what the process does once (start-up, connecting,
//! preparing statements) drops out: what is left is what a message costs
//! this process, in instructions, the same on a busy machine as on a quiet
//! one.
//!
//! ```text
//! count_instructions <variant> <messages>
//! ```
//!
//! The variants come in threes, a path's bare work, the same work with
//! one more statement or round trip (what the record needs at the least,
//! the limit the benchmarks compare idem with), and idem:
//!
//! * `pg-bare`: `BEGIN; UPDATE` one of 10,000 stock rows `; COMMIT`, the
//!   business transaction of `bench_postgres`;
//! * `pg-extra`: the same with one more prepared `INSERT` (of the message
//!   id and a text, into a table of its own) before the `COMMIT`;
//! * `pg-idem`: the same body in a transaction-mode `#[idempotent]`
//!   handler on a `PgStore` with its defaults for a server on loopback;
//! * `pgbatch-raw`: one `INSERT ... SELECT ... FROM unnest(...)` of a batch
//!   of 100 rows as idem writes them (status, outcome, times) into a copy
//!   of idem's table, the limit of `bench_batch_postgres`;
//! * `pgbatch-idem`: a transaction-mode batch handler with an empty body
//!   over the same 100 messages (figures are a message's, a hundredth of a
//!   batch);
//! * `redis-raw`: `SET key 1 NX PX ttl`, the dedup step written by hand;
//! * `redis-two`: that and a second `SET key <outcome> XX PX ttl`, two
//!   round trips;
//! * `redis-idem`: a lease-mode `#[idempotent]` handler with an empty body
//!   on a `RedisStore`;
//! * `http-bare`: a `POST` of a payment handed to an axum `Router` in the
//!   process (`Service::call`: no socket, so that what the count sees is
//!   the route's work, not hyper's), whose handler runs `BEGIN; INSERT ...
//!   RETURNING id; COMMIT` and answers `201` with the payment as JSON, the
//!   `bare` route of `bench_http`; the response's body is read whole;
//! * `http-extra`: the same with one more prepared `INSERT` (of the
//!   payment's id and a text, into a table of its own) before the
//!   `COMMIT`;
//! * `http-idem`: the same `INSERT` through the request's `RequestTx`
//!   behind the `Idempotency-Key` layer in transaction mode, with the
//!   claim last (`ClaimOrder::Last`, `bench_http`'s default), a fresh key
//!   a request.
//!
//! Every message is fresh. The tables and keys are the program's own
//! (`count_*`, `count:*`), made at its start and removed at its end.
//! `DATABASE_URL` and `REDIS_URL` name the servers (loopback by default).

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::routing::post;
use idem_examples::payments::{App, Extra, account_of, pay_bare, pay_extra, pay_idem};
use idem_runtime::http::Idempotency;
use idem_runtime::{ClaimOrder, Outcome, PgStore, PgTx, RedisStore, idempotent};
use serde::Deserialize;
use sqlx::postgres::PgPoolOptions;
use sqlx::{AssertSqlSafe, Executor as _, PgPool};
use tower_service::Service as _;

#[derive(Debug, Clone, Deserialize)]
struct Deduct {
    message_id: i64,
    sku: i64,
}

async fn deduct(conn: &mut sqlx::PgConnection, sku: i64) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE count_inventory SET stock = stock - 1 WHERE sku = $1")
        .bind(sku)
        .execute(conn)
        .await?;
    Ok(())
}

#[idempotent(
    key = "message_id",
    ttl = "24h",
    store = "postgres",
    name = "count_deduct"
)]
async fn deduct_idem(tx: &mut PgTx<'_>, msg: &Deduct) -> Result<i64, sqlx::Error> {
    deduct(tx, msg.sku).await?;
    Ok(msg.sku)
}

#[idempotent(
    key = "message_id",
    ttl = "24h",
    store = "postgres",
    name = "count_batch"
)]
async fn batch_idem(tx: &mut PgTx<'_>, msgs: &[Deduct]) -> Result<Vec<i64>, sqlx::Error> {
    let _ = tx;
    Ok(msgs.iter().map(|m| m.message_id).collect())
}

/// Messages a batch: `MESSAGES` and the warm-up are counted in messages,
/// and run as batches of this many.
const BATCH: u64 = 100;

#[derive(Debug, Deserialize)]
struct Ping {
    id: u64,
}

#[idempotent(key = "id", ttl = "10m", store = "redis", name = "count_ping")]
async fn ping(msg: &Ping) -> Result<u64, std::io::Error> {
    Ok(msg.id)
}

/// How many messages run before the counted ones start to matter: enough
/// for the pool, the statement caches and the allocator to settle.
const WARM_UP: u64 = 200;

type Failure = Box<dyn std::error::Error>;

/// One connection to `DATABASE_URL`, kept.
async fn pg_pool() -> Result<PgPool, Failure> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test?sslmode=disable".into());
    Ok(PgPoolOptions::new()
        .max_connections(1)
        .min_connections(1)
        .test_before_acquire(false)
        // No reaper: a task that wakes by the clock would add to the count
        // with the run's length, which valgrind stretches.
        .idle_timeout(None)
        .max_lifetime(None)
        .connect(&url)
        .await?)
}

async fn postgres(variant: &str, messages: u64) -> Result<(), Failure> {
    let pool = pg_pool().await?;
    let suffix = std::process::id();
    let (extra, dedup) = (
        format!("count_extra_{suffix}"),
        format!("count_idem_{suffix}"),
    );
    // One inventory for every run: its rows only ever lose stock.
    pool.execute(
        "CREATE TABLE IF NOT EXISTS count_inventory (sku BIGINT PRIMARY KEY, stock BIGINT NOT NULL);
         INSERT INTO count_inventory SELECT g, 1000000000 FROM generate_series(1, 10000) g
         ON CONFLICT DO NOTHING",
    )
    .await?;
    pool.execute(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE {extra} (id BIGINT PRIMARY KEY, note TEXT NOT NULL)"
    )))
    .await?;
    let store = PgStore::from_pool(pool.clone()).with_table(&dedup)?;
    store.migrate().await?;
    let rows = format!("count_rows_{suffix}");
    pool.execute(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE {rows} (LIKE {dedup} INCLUDING ALL)"
    )))
    .await?;
    let insert = format!("INSERT INTO {extra} (id, note) VALUES ($1, $2)");
    let insert_rows = format!(
        "INSERT INTO {rows} (handler, key, status, outcome, attempts, failures, created_at,
                             updated_at, expires_at)
         SELECT 'count_batch', k, 'completed', o, 1, 0, 1, 1, 86400001
         FROM unnest($1::text[], $2::text[]) AS r(k, o) ON CONFLICT DO NOTHING"
    );
    let step = if variant.starts_with("pgbatch") {
        BATCH
    } else {
        1
    };
    let result = async {
        let mut before = None;
        for i in (0..WARM_UP + messages).step_by(step as usize) {
            if i == WARM_UP {
                before = Some(server(&pool, &[&extra, &dedup, &rows]).await?);
            }
            let msg = Deduct {
                message_id: i as i64,
                sku: (i as i64 * 7919) % 10_000 + 1,
            };
            match variant {
                "pg-bare" => {
                    let mut tx = pool.begin().await?;
                    deduct(&mut tx, msg.sku).await?;
                    tx.commit().await?;
                }
                "pg-extra" => {
                    let mut tx = pool.begin().await?;
                    deduct(&mut tx, msg.sku).await?;
                    sqlx::query(sqlx::AssertSqlSafe(insert.as_str()))
                        .bind(msg.message_id)
                        .bind("42")
                        .execute(&mut *tx)
                        .await?;
                    tx.commit().await?;
                }
                "pg-idem" => {
                    let outcome = deduct_idem(&store, &msg).await?;
                    assert_eq!(outcome, Outcome::Executed(msg.sku));
                }
                "pgbatch-raw" => {
                    let keys: Vec<String> = (i..i + step).map(|id| format!("m-{id}")).collect();
                    let outcomes: Vec<String> = (i..i + step).map(|id| id.to_string()).collect();
                    sqlx::query(sqlx::AssertSqlSafe(insert_rows.as_str()))
                        .bind(&keys)
                        .bind(&outcomes)
                        .execute(&pool)
                        .await?;
                }
                "pgbatch-idem" => {
                    let msgs: Vec<Deduct> = (i..i + step)
                        .map(|id| Deduct {
                            message_id: id as i64,
                            sku: 1,
                        })
                        .collect();
                    for answer in batch_idem(&store, &msgs).await? {
                        assert!(answer?.is_executed());
                    }
                }
                other => return Err(format!("unknown variant {other}").into()),
            }
        }
        if let Some(before) = before {
            let after = server(&pool, &[&extra, &dedup, &rows]).await?;
            let per = |a: i64, b: i64| (a - b) as f64 / messages as f64;
            // What the server wrote for a message: on stderr, which the
            // counting script reads back.
            eprintln!(
                "server: {:.0} WAL bytes, {:.2} rows inserted, {:.2} updated ({:.2} of them HOT), {:.2} index entries a message",
                per(after.wal, before.wal),
                per(after.inserted, before.inserted),
                per(after.updated, before.updated),
                per(after.hot, before.hot),
                per(after.index_entries, before.index_entries),
            );
        }
        Ok::<(), Failure>(())
    }
    .await;
    pool.execute(sqlx::AssertSqlSafe(format!(
        "DROP TABLE IF EXISTS {extra}, {rows}, {dedup}, {dedup}_outbox"
    )))
    .await?;
    result
}

/// What the server has written so far: its WAL position, and the rows
/// and index entries written in the inventory and `tables`.
struct Written {
    wal: i64,
    inserted: i64,
    updated: i64,
    hot: i64,
    index_entries: i64,
}

async fn server(pool: &PgPool, tables: &[&str]) -> Result<Written, Failure> {
    // The statistics of this session's transactions, flushed now rather
    // than at the next idle second.
    sqlx::query("SELECT pg_stat_force_next_flush()")
        .execute(pool)
        .await?;
    let mut names = vec!["count_inventory".to_owned()];
    names.extend(tables.iter().map(|t| t.to_string()));
    let (wal, inserted, updated, hot): (i64, i64, i64, i64) = sqlx::query_as(
        "SELECT (pg_current_wal_insert_lsn() - '0/0')::bigint,
                COALESCE(SUM(n_tup_ins), 0)::bigint, COALESCE(SUM(n_tup_upd), 0)::bigint,
                COALESCE(SUM(n_tup_hot_upd), 0)::bigint
         FROM pg_stat_user_tables WHERE relname = ANY($1)",
    )
    .bind(&names)
    .fetch_one(pool)
    .await?;
    // Index entries: each insert adds one to every index of its table; a
    // HOT update adds none, another update one to every index.
    let (index_entries,): (i64,) = sqlx::query_as(
        "SELECT COALESCE(SUM((t.n_tup_ins + t.n_tup_upd - t.n_tup_hot_upd)
                              * (SELECT COUNT(*) FROM pg_index i WHERE i.indrelid = t.relid)), 0)::bigint
         FROM pg_stat_user_tables t WHERE t.relname = ANY($1)",
    )
    .bind(&names)
    .fetch_one(pool)
    .await?;
    Ok(Written {
        wal,
        inserted,
        updated,
        hot,
        index_entries,
    })
}

async fn redis(variant: &str, messages: u64) -> Result<(), Failure> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let prefix = format!("count:{}", std::process::id());
    let store = RedisStore::connect(&url).await?.with_prefix(&prefix)?;
    let client = redis::Client::open(url.as_str())?;
    let mut conn = redis::aio::ConnectionManager::new(client).await?;
    let ttl = Duration::from_secs(600).as_millis() as u64;
    let result = async {
        for i in 0..WARM_UP + messages {
            let key = format!("{prefix}:raw:{i}");
            match variant {
                "redis-raw" | "redis-two" => {
                    let _: Option<String> = redis::cmd("SET")
                        .arg(&key)
                        .arg(1)
                        .arg("NX")
                        .arg("PX")
                        .arg(ttl)
                        .query_async(&mut conn)
                        .await?;
                    if variant == "redis-two" {
                        let _: Option<String> = redis::cmd("SET")
                            .arg(&key)
                            .arg(i)
                            .arg("XX")
                            .arg("PX")
                            .arg(ttl)
                            .query_async(&mut conn)
                            .await?;
                    }
                }
                "redis-idem" => {
                    let outcome = ping(&store, &Ping { id: i }).await?;
                    assert_eq!(outcome, Outcome::Executed(i));
                }
                other => return Err(format!("unknown variant {other}").into()),
            }
        }
        Ok::<(), Failure>(())
    }
    .await;
    // The program's keys (its own, and the store's under the same prefix).
    idem_examples::delete_redis_prefix(&url, &prefix).await?;
    result
}

async fn http(variant: &str, messages: u64) -> Result<(), Failure> {
    let path = match variant {
        "http-bare" => "/bare",
        "http-extra" => "/extra",
        "http-idem" => "/idem",
        other => return Err(format!("unknown variant {other}").into()),
    };
    let pool = pg_pool().await?;
    let suffix = std::process::id();
    let (payments, notes, dedup) = (
        format!("count_payments_{suffix}"),
        format!("count_notes_{suffix}"),
        format!("count_http_{suffix}"),
    );
    pool.execute(AssertSqlSafe(format!(
        "CREATE TABLE {payments} (id BIGSERIAL PRIMARY KEY, account TEXT NOT NULL, amount BIGINT NOT NULL);
         CREATE TABLE {notes} (id BIGINT PRIMARY KEY, note TEXT NOT NULL)"
    )))
    .await?;
    let result = async {
        let store = PgStore::from_pool(pool.clone())
            .with_table(&dedup)?
            .with_claim_order(ClaimOrder::Last);
        store.migrate().await?;
        let layer = Idempotency::scoped_by("count_http", Duration::from_secs(86_400), account_of)
            .transaction(store)?;
        let app = App::new(pool.clone(), &payments);
        let extra = Extra::note(app.clone(), &notes);
        let router: Router = Router::new()
            .route("/bare", post(pay_bare))
            .merge(
                Router::new()
                    .route("/idem", post(pay_idem))
                    .route_layer(layer),
            )
            .with_state(app)
            .merge(
                Router::new()
                    .route("/extra", post(pay_extra))
                    .with_state(extra),
            );
        for i in 0..WARM_UP + messages {
            // The same request on every route: the bare ones ignore the key.
            let request = Request::post(path)
                .header("x-account", "acct-0")
                .header("content-type", "application/json")
                .header("idempotency-key", format!("\"k{i}\""))
                .body(Body::from(format!("{{\"amount\":{}}}", i % 1000 + 1)))?;
            let response = router.clone().call(request).await?;
            if response.status() != StatusCode::CREATED
                || response.headers().contains_key("idempotent-replayed")
            {
                return Err(
                    format!("{variant}: request {i} answered {}", response.status()).into(),
                );
            }
            axum::body::to_bytes(response.into_body(), usize::MAX).await?;
        }
        Ok::<(), Failure>(())
    }
    .await;
    pool.execute(AssertSqlSafe(format!(
        "DROP TABLE IF EXISTS {payments}, {notes}, {dedup}, {dedup}_outbox"
    )))
    .await?;
    result
}

fn main() -> Result<(), Failure> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [variant, messages] = args.as_slice() else {
        return Err("usage: count_instructions <variant> <messages>".into());
    };
    let messages: u64 = messages.parse()?;
    // One thread: callgrind counts every thread of the process, and a
    // single-threaded runtime adds no scheduler of its own to count.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        match variant.split('-').next() {
            Some("pg" | "pgbatch") => postgres(variant, messages).await,
            Some("redis") => redis(variant, messages).await,
            Some("http") => http(variant, messages).await,
            _ => Err(format!("unknown variant {variant}").into()),
        }
    })
}
