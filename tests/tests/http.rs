//! The Idempotency-Key layer over real HTTP on loopback: the HTTP suite
//! (`common/http_suite.rs`) on every store, in each mode the store has (on
//! PostgreSQL in each claim order), and what
//! is not a store's: a store that cannot be reached, and a route named as
//! an `#[idempotent]` handler.

use crate::common;

use std::str::FromStr;
use std::time::Duration;

use common::http_suite::{self as suite, LeaseFx, TxFx};
use common::tx::StoreKind;
use common::{Db, MemoryFx, MySqlDb, PgDb, RedisFx};
use idem_runtime::http::Idempotency;
use idem_runtime::{ClaimOrder, MemoryStore, PgStore, RoundTrips, idempotent};
use idem_tests::{HttpClient, Server, free_port, or_skip, pg_url};

suite::tx_fixture!(Db, StoreKind::Sqlite);
suite::tx_fixture!(PgDb, StoreKind::Pg(ClaimOrder::Last, RoundTrips::Separate));
suite::tx_fixture!(
    MySqlDb,
    StoreKind::MySql(ClaimOrder::Last, RoundTrips::Separate)
);

/// PostgreSQL claiming in the order the HTTP docs recommend.
struct Checked;
suite::tx_fixture!(
    PgDb,
    StoreKind::Pg(ClaimOrder::Checked, RoundTrips::Separate),
    Checked
);

/// PostgreSQL claiming first: a racing retry waits on the key's row.
struct First;
suite::tx_fixture!(
    PgDb,
    StoreKind::Pg(ClaimOrder::First, RoundTrips::Separate),
    First
);

mod tx_sqlite {
    use super::*;
    suite::suite!(TxFx<Db>);
}

mod tx_postgres {
    use super::*;
    suite::suite!(TxFx<PgDb>);
}

/// `ClaimOrder::Checked`: a retry of a recorded key runs no handler, one
/// racing the first request may run it and roll back.
mod tx_postgres_checked {
    use super::*;
    suite::suite!(TxFx<PgDb, Checked>);
}

/// `ClaimOrder::First`: a retry racing the first request waits on the key's
/// row and gets the replay once the first commits (or `409` past the lock
/// timeout); no retry runs the handler.
mod tx_postgres_first {
    use super::*;
    suite::suite!(TxFx<PgDb, First>);
}

mod tx_mysql {
    use super::*;
    suite::suite!(TxFx<MySqlDb>);
}

mod lease_memory {
    use super::*;
    suite::suite!(LeaseFx<MemoryFx>);
}

mod lease_redis {
    use super::*;
    suite::suite!(LeaseFx<RedisFx>);
}

mod lease_sqlite {
    use super::*;
    suite::suite!(LeaseFx<Db>);
}

mod lease_postgres {
    use super::*;
    suite::suite!(LeaseFx<PgDb>);
}

/// A store whose server cannot be reached answers 503 before the handler
/// runs, with a `Retry-After`.
#[tokio::test]
async fn an_unreachable_store_answers_503_and_runs_nothing() {
    // Reachable first, so that a missing server skips rather than passes.
    let _pool = or_skip!(idem_tests::pg_pool(1).await);
    let options = sqlx::postgres::PgConnectOptions::from_str(&pg_url())
        .expect("DATABASE_URL")
        .host("127.0.0.1")
        .port(free_port().expect("a free port"));
    let pool = sqlx::postgres::PgPoolOptions::new()
        .acquire_timeout(Duration::from_millis(300))
        .connect_lazy_with(options);
    let layer = Idempotency::unscoped("http_down", Duration::from_secs(60))
        .transaction(PgStore::from_pool(pool))
        .expect("a name of its own");
    let ran = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = std::sync::Arc::clone(&ran);
    let router = axum::Router::new().route(
        "/pay",
        axum::routing::post(move || {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async { "paid" }
        })
        .route_layer(layer),
    );
    let server = Server::start(router).await;
    let r = HttpClient::new(server.addr)
        .post("/pay", "k-down", &serde_json::json!({}))
        .await;
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.header("retry-after"), Some("1"));
    assert_eq!(ran.load(std::sync::atomic::Ordering::SeqCst), 0);
}

#[idempotent(key = "id", ttl = "1h", store = "memory")]
async fn http_clash(msg: &Clash) -> Result<u32, std::io::Error> {
    Ok(msg.id)
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Clash {
    id: u32,
}

/// A route may not take a name an `#[idempotent]` handler has: their keys
/// would share a namespace.
#[tokio::test]
async fn a_route_named_as_a_handler_is_refused() {
    let refused =
        Idempotency::unscoped("http_clash", Duration::from_secs(60)).lease(MemoryStore::new());
    let err = refused.expect_err("the name is a handler's");
    assert!(err.to_string().contains("http_clash"), "{err}");
    // The handler itself still runs.
    let store = MemoryStore::new();
    assert!(http_clash(&store, &Clash { id: 1 }).await.is_ok());
}

/// On a route whose key is optional, a request without one reaches the
/// handler with no key and no transaction: a handler that takes them is
/// answered `400` (the client can send a key), one that takes an `Option`
/// of them serves both kinds of request.
#[tokio::test]
async fn a_keyless_request_to_a_handler_that_needs_its_key_gets_400() {
    use idem_runtime::http::{IdempotencyKey, RequestTx};
    use idem_runtime::{SqliteStore, SqliteTx};

    let dir = tempfile::tempdir().expect("a directory");
    let store = SqliteStore::open(dir.path().join("keyless.db"))
        .await
        .expect("a SQLite store");
    store.migrate().await.expect("the dedup table");
    let needs_key = Idempotency::unscoped("http_keyless_needs", Duration::from_secs(60))
        .required(false)
        .lease(MemoryStore::new())
        .expect("a name of its own");
    let takes_option = Idempotency::unscoped("http_keyless_option", Duration::from_secs(60))
        .required(false)
        .lease(MemoryStore::new())
        .expect("a name of its own");
    let needs_tx = Idempotency::unscoped("http_keyless_tx", Duration::from_secs(60))
        .required(false)
        .transaction(store.clone())
        .expect("a name of its own");
    let tx_option = Idempotency::unscoped("http_keyless_tx_option", Duration::from_secs(60))
        .required(false)
        .transaction(store)
        .expect("a name of its own");
    let router = axum::Router::new()
        .route(
            "/needs-key",
            axum::routing::post(|key: IdempotencyKey| async move { key.sent().to_owned() })
                .route_layer(needs_key),
        )
        .route(
            "/takes-option",
            axum::routing::post(|key: Option<IdempotencyKey>| async move {
                key.map_or_else(|| "no key".to_owned(), |k| k.sent().to_owned())
            })
            .route_layer(takes_option),
        )
        .route(
            "/needs-tx",
            axum::routing::post(|_tx: RequestTx<SqliteStore>| async { "in a transaction" })
                .route_layer(needs_tx),
        )
        .route(
            "/tx-option",
            axum::routing::post(|tx: Option<RequestTx<SqliteStore>>| async move {
                match tx {
                    Some(tx) => {
                        let mut tx = tx.lock().await.expect("the request's transaction");
                        let tx: &mut SqliteTx<'static> = &mut tx;
                        let one: i64 = sqlx::query_scalar("SELECT 1")
                            .fetch_one(&mut **tx)
                            .await
                            .expect("a query in the request's transaction");
                        format!("in a transaction: {one}")
                    }
                    None => "no transaction".to_owned(),
                }
            })
            .route_layer(tx_option),
        );
    let server = Server::start(router).await;
    let c = HttpClient::new(server.addr);
    let keyless = |path: &'static str| {
        let c = &c;
        async move { c.send("POST", path, &[], "{}").await.expect("an answer") }
    };
    for path in ["/needs-key", "/needs-tx"] {
        let r = keyless(path).await;
        assert_eq!(r.status, 400, "{path}: {}", r.text());
        assert_eq!(
            r.header("content-type"),
            Some("application/problem+json"),
            "{path}"
        );
        assert_eq!(r.json()["title"], "Idempotency-Key is missing", "{path}");
    }
    let r = keyless("/takes-option").await;
    assert_eq!((r.status, r.text().as_str()), (200, "no key"));
    let r = keyless("/tx-option").await;
    assert_eq!((r.status, r.text().as_str()), (200, "no transaction"));
    // With a key, each gets what the layer made for it.
    let r = c.post("/needs-key", "k-1", &serde_json::json!({})).await;
    assert_eq!((r.status, r.text().as_str()), (200, "k-1"));
    let r = c.post("/takes-option", "k-2", &serde_json::json!({})).await;
    assert_eq!((r.status, r.text().as_str()), (200, "k-2"));
    let r = c.post("/needs-tx", "k-3", &serde_json::json!({})).await;
    assert_eq!((r.status, r.text().as_str()), (200, "in a transaction"));
    let r = c.post("/tx-option", "k-4", &serde_json::json!({})).await;
    assert_eq!((r.status, r.text().as_str()), (200, "in a transaction: 1"));
}

/// A route in transaction mode stages what it sends on through the
/// request's transaction: the rows commit with the recorded response, a
/// retry with the key replays the response and stages nothing, and a
/// response the route does not record (a 500) rolls its rows back.
#[tokio::test]
async fn a_route_stages_messages_that_commit_with_its_response() {
    use idem_runtime::SqliteStore;
    use idem_runtime::http::RequestTx;
    use idem_runtime::outbox::Message;

    let dir = tempfile::tempdir().expect("a directory");
    let store = SqliteStore::open(dir.path().join("outbox.db"))
        .await
        .expect("a SQLite store");
    store.migrate().await.expect("the tables");
    let layer = Idempotency::unscoped("http_outbox_orders", Duration::from_secs(60))
        .transaction(store.clone())
        .expect("a name of its own");
    let router = axum::Router::new().route(
        "/orders",
        axum::routing::post(|tx: RequestTx<SqliteStore>, body: String| async move {
            let mut ids = Vec::new();
            for n in 0..2 {
                let m = Message::new("orders.placed", format!("{body}:{n}"));
                ids.push(tx.stage(m).await.expect("staged").to_string());
            }
            if body.contains("fail") {
                return (axum::http::StatusCode::INTERNAL_SERVER_ERROR, ids.join(","));
            }
            (axum::http::StatusCode::OK, ids.join(","))
        })
        .route_layer(layer),
    );
    let server = Server::start(router).await;
    let c = HttpClient::new(server.addr);
    let r = c.post("/orders", "k-1", &serde_json::json!("first")).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let ids: Vec<String> = r.text().split(',').map(str::to_owned).collect();
    let rows = store.outbox_table().list(0, 10).await.expect("rows");
    let stored: Vec<String> = rows.iter().map(|m| m.id.to_string()).collect();
    assert_eq!(stored, ids);
    assert!(rows.iter().all(|m| m.handler == "http_outbox_orders"));
    // the retry replays the recorded response and stages nothing
    let again = c.post("/orders", "k-1", &serde_json::json!("first")).await;
    assert_eq!((again.status, again.text()), (200, r.text()));
    assert_eq!(
        store.outbox_table().list(0, 10).await.expect("rows").len(),
        2
    );
    // another key's ids are its own
    let other = c.post("/orders", "k-2", &serde_json::json!("second")).await;
    assert_eq!(other.status, 200);
    assert!(
        other
            .text()
            .split(',')
            .all(|id| !ids.contains(&id.to_owned()))
    );
    // a 500 is not recorded: its rows roll back with it, and the retry,
    // which runs again, stages the same ids
    let failed = c.post("/orders", "k-3", &serde_json::json!("fail")).await;
    assert_eq!(failed.status, 500, "{}", failed.text());
    let rows = || async { store.outbox_table().list(0, 10).await.expect("rows").len() };
    assert_eq!(rows().await, 4);
    let again = c.post("/orders", "k-3", &serde_json::json!("fail")).await;
    assert_eq!((again.status, again.text()), (500, failed.text()));
    assert_eq!(rows().await, 4);
}
