//! What an error tells the consumer and the operator: the right kind (so the
//! consumer's ack/nack/dead-letter decision is right), the table or setting
//! at fault, a redelivery hint worth obeying, and the key as the message
//! holds it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_runtime::{
    Error, Key, MemoryStore, PgStore, RedisStore, SqliteStore, SqliteTx, StoreError, idempotent,
};
use idem_tests::{
    DeleteKeys, DropTables, or_skip, pg_pool, pg_url, redis_store, redis_url, unique_table,
};
use sqlx::sqlite::SqliteConnectOptions;
use tokio::sync::Semaphore;

#[derive(Debug)]
struct Order {
    id: String,
}

impl Order {
    fn new(id: &str) -> Self {
        Order { id: id.into() }
    }
}

#[idempotent(key = "id", ttl = "1h", store = "sqlite", name = "err_sqlite_tx")]
async fn sqlite_tx(tx: &mut SqliteTx<'_>, msg: &Order) -> Result<u32, sqlx::Error> {
    sqlx::query("SELECT 1").execute(&mut **tx).await?;
    Ok(msg.id.len() as u32)
}

#[idempotent(key = "id", ttl = "1h", store = "sqlite", name = "err_sqlite_lease")]
async fn sqlite_lease(msg: &Order) -> Result<u32, sqlx::Error> {
    Ok(msg.id.len() as u32)
}

#[idempotent(key = "id", ttl = "1h", store = "postgres", name = "err_pg_lease")]
async fn pg_lease(msg: &Order) -> Result<u32, sqlx::Error> {
    Ok(msg.id.len() as u32)
}

fn assert_missing_table<E: std::fmt::Debug + std::fmt::Display>(err: Error<E>, table: &str) {
    let text = format!("{err}");
    match err {
        Error::Store {
            source: StoreError::MissingTable { table: t },
            key: Some(_),
            ..
        } => assert_eq!(t, table),
        other => panic!("expected a missing table, got {other:?}"),
    }
    assert!(text.contains(&format!("`{table}`")), "{text}");
    assert!(text.contains("migrate()"), "{text}");
    assert!(
        !text.contains("line "),
        "a server's source line leaked: {text}"
    );
}

#[tokio::test]
async fn a_forgotten_migrate_names_the_table_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("idem.db"))
        .await
        .unwrap()
        .with_table("orders_dedup")
        .unwrap();
    let msg = Order::new("o-1");
    assert_missing_table(sqlite_tx(&store, &msg).await.unwrap_err(), "orders_dedup");
    assert_missing_table(
        sqlite_lease(&store, &msg).await.unwrap_err(),
        "orders_dedup",
    );
    let key = Key::from_parts(&[&"o-1"]).unwrap();
    assert!(matches!(
        store.record("err_sqlite_tx", &key).await,
        Err(StoreError::MissingTable { table }) if table == "orders_dedup"
    ));
}

#[tokio::test]
async fn a_forgotten_migrate_names_the_table_on_postgres() {
    let pool = or_skip!(pg_pool(2).await);
    let table = unique_table("never_migrated");
    let _drop = DropTables::new(&[&table]);
    let store = PgStore::from_pool(pool).with_table(&table).unwrap();
    assert_missing_table(
        pg_lease(&store, &Order::new("o-1")).await.unwrap_err(),
        &table,
    );
}

#[tokio::test]
async fn sqlite_busy_reports_the_timeout_the_options_set() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.db");
    let options = |busy| {
        SqliteConnectOptions::new()
            .filename(&path)
            .create_if_missing(true)
            .busy_timeout(busy)
    };
    let holder = SqliteStore::connect_with(options(Duration::from_secs(5)))
        .await
        .unwrap();
    holder.migrate().await.unwrap();
    let store = SqliteStore::connect_with(options(Duration::from_millis(250)))
        .await
        .unwrap();

    // Another process holds SQLite's one write lock.
    let mut lock = holder.pool().begin_with("BEGIN IMMEDIATE").await.unwrap();
    sqlx::query("SELECT 1").execute(&mut *lock).await.unwrap();
    let started = Instant::now();
    let err = sqlite_tx(&store, &Order::new("o-1")).await.unwrap_err();
    let waited = started.elapsed();
    match &err {
        Error::Store {
            source: StoreError::Timeout(t),
            ..
        } => assert_eq!(*t, Duration::from_millis(250), "{err}"),
        other => panic!("expected a busy timeout, got {other:?}"),
    }
    assert!(err.to_string().contains("250ms"), "{err}");
    assert!(waited < Duration::from_secs(3), "waited {waited:?}");

    // A store made from the application's pool, never migrated by this
    // process, learns the timeout too.
    let pool = sqlx::SqlitePool::connect_with(options(Duration::from_millis(300)))
        .await
        .unwrap();
    let shared = SqliteStore::from_pool(pool);
    match sqlite_tx(&shared, &Order::new("o-2")).await.unwrap_err() {
        Error::Store {
            source: StoreError::Timeout(t),
            ..
        } => assert_eq!(t, Duration::from_millis(300)),
        other => panic!("expected a busy timeout, got {other:?}"),
    }
    lock.rollback().await.unwrap();
    assert!(
        sqlite_tx(&store, &Order::new("o-1"))
            .await
            .unwrap()
            .is_executed()
    );
}

#[tokio::test]
async fn pg_connect_to_a_port_where_nothing_listens_fails_at_once_with_the_cause() {
    // A port that was free a moment ago: nothing listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("postgres://postgres@127.0.0.1:{port}/test");
    let started = Instant::now();
    let err = PgStore::connect(&url).await.unwrap_err();
    let took = started.elapsed();
    assert!(took < Duration::from_secs(5), "took {took:?}: {err}");
    let text = err.to_string();
    assert!(
        text.to_lowercase().contains("refused"),
        "the cause is missing: {text}"
    );
    assert!(!text.contains("timed out"), "{text}");
    // The same store on the real server connects (the URL shape is right).
    let real = pg_url();
    if pg_pool(1).await.is_some() {
        PgStore::connect(&real)
            .await
            .expect("connect to the real server");
    }
}

#[tokio::test]
async fn a_bad_redis_prefix_is_an_invalid_prefix_not_a_schema_error() {
    let prefix = idem_tests::unique_prefix("err_prefix");
    let _cleanup = DeleteKeys::new(&redis_url(), &prefix);
    let store: RedisStore = or_skip!(redis_store(&prefix).await);
    for bad in ["", "{billing}", "a}b"] {
        match store.clone().with_prefix(bad) {
            Err(StoreError::InvalidPrefix { prefix }) => assert_eq!(prefix, bad),
            other => panic!("{bad:?}: {other:?}"),
        }
    }
}

// --- the redelivery hint of a key in progress --------------------------------

/// A body that is fast, but the first delivery of each message waits at a
/// gate (after saying it started, so after its claim), so that duplicates
/// arrive while it is in progress.
#[derive(Debug)]
struct Burst {
    id: String,
    gate: Arc<Semaphore>,
    started: Arc<tokio::sync::Notify>,
}

impl Burst {
    fn new(id: String, gate: &Arc<Semaphore>, started: &Arc<tokio::sync::Notify>) -> Self {
        Burst {
            id,
            gate: Arc::clone(gate),
            started: Arc::clone(started),
        }
    }
}

async fn fast_body(msg: &Burst) -> Result<u32, std::io::Error> {
    msg.started.notify_one();
    let _permit = msg.gate.acquire().await.expect("gate");
    Ok(7)
}

#[idempotent(
    key = "id",
    ttl = "1h",
    store = "memory",
    lease = "30s",
    name = "err_hint_memory"
)]
async fn hint_memory(msg: &Burst) -> Result<u32, std::io::Error> {
    fast_body(msg).await
}

#[idempotent(
    key = "id",
    ttl = "1h",
    store = "redis",
    lease = "30s",
    name = "err_hint_redis"
)]
async fn hint_redis(msg: &Burst) -> Result<u32, std::io::Error> {
    fast_body(msg).await
}

#[idempotent(
    key = "id",
    ttl = "1h",
    store = "sqlite",
    lease = "30s",
    name = "err_hint_sqlite"
)]
async fn hint_sqlite(msg: &Burst) -> Result<u32, std::io::Error> {
    fast_body(msg).await
}

#[idempotent(
    key = "id",
    ttl = "1h",
    store = "postgres",
    lease = "30s",
    name = "err_hint_pg"
)]
async fn hint_pg(msg: &Burst) -> Result<u32, std::io::Error> {
    fast_body(msg).await
}

/// Every call is bounded, so a mistake fails the test instead of hanging it.
async fn bounded<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(20), f)
        .await
        .expect("the call finished within 20 s")
}

/// Delivers one message (its body held at a gate) and 127 duplicates while it
/// runs, under a 30 s lease: every duplicate must be told to come back soon.
/// Round 0 runs before any body of the handler finished in this process (the
/// hint is then the claim's age); round 1 after twenty fast bodies (the hint
/// is then the floor, or the claim's age once it outlives them).
async fn duplicates_of_a_fast_body_are_told_to_retry_soon<F, Fut>(store: &str, call: F)
where
    F: Fn(Burst) -> Fut,
    Fut: std::future::Future<Output = Result<idem_runtime::Outcome<u32>, Error<std::io::Error>>>
        + Send
        + 'static,
{
    let open = Arc::new(Semaphore::new(Semaphore::MAX_PERMITS));
    let ignored = Arc::new(tokio::sync::Notify::new());
    for round in 0..2 {
        if round == 1 {
            for i in 0..20 {
                let fast = Burst::new(format!("{store}-fast-{i}"), &open, &ignored);
                assert!(bounded(call(fast)).await.unwrap().is_executed());
            }
        }
        let (gate, started) = (
            Arc::new(Semaphore::new(0)),
            Arc::new(tokio::sync::Notify::new()),
        );
        let id = format!("{store}-burst-{round}");
        let first = tokio::spawn(call(Burst::new(id.clone(), &gate, &started)));
        bounded(started.notified()).await;
        let claimed = std::time::Instant::now();
        let mut hints = Vec::new();
        for _ in 0..127 {
            match bounded(call(Burst::new(id.clone(), &gate, &started))).await {
                Err(Error::InProgress { retry_after, .. }) => hints.push(retry_after),
                other => panic!("{store}: expected InProgress, got {other:?}"),
            }
        }
        let held = claimed.elapsed();
        gate.add_permits(1);
        assert!(bounded(first).await.unwrap().unwrap().is_executed());
        let longest = hints.iter().max().copied().unwrap();
        let shortest = hints.iter().min().copied().unwrap();
        println!(
            "{store} round {round}: retry_after from {shortest:?} to {longest:?}, claim held {held:?}"
        );
        // At most the claim's age (plus the time a claim takes to answer),
        // never the 30 s lease.
        assert!(
            longest <= held.max(Duration::from_millis(10)) + Duration::from_millis(250),
            "{store}: a duplicate of a fast body was told to wait {longest:?} (held {held:?})"
        );
        assert!(
            shortest >= Duration::from_millis(10),
            "{store}: {shortest:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_hint_on_memory() {
    let store = MemoryStore::new();
    duplicates_of_a_fast_body_are_told_to_retry_soon("memory", |b| {
        let store = store.clone();
        async move { hint_memory(&store, &b).await }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_hint_on_redis() {
    let prefix = idem_tests::unique_prefix("err_hint");
    let _cleanup = DeleteKeys::new(&redis_url(), &prefix);
    let store: RedisStore = or_skip!(redis_store(&prefix).await);
    duplicates_of_a_fast_body_are_told_to_retry_soon("redis", |b| {
        let store = store.clone();
        async move { hint_redis(&store, &b).await }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_hint_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("idem.db")).await.unwrap();
    store.migrate().await.unwrap();
    duplicates_of_a_fast_body_are_told_to_retry_soon("sqlite", |b| {
        let store = store.clone();
        async move { hint_sqlite(&store, &b).await }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_hint_on_postgres() {
    let pool = or_skip!(pg_pool(4).await);
    let table = unique_table("err_hint");
    let _drop = DropTables::new(&[&table]);
    let store = PgStore::from_pool(pool).with_table(&table).unwrap();
    store.migrate().await.unwrap();
    duplicates_of_a_fast_body_are_told_to_retry_soon("postgres", |b| {
        let store = store.clone();
        async move { hint_pg(&store, &b).await }
    })
    .await;
}

// --- keys as people read them -----------------------------------------------

#[derive(Debug)]
struct Refund {
    order_id: String,
    line: u32,
    note: String,
}

#[idempotent(
    key = "order_id + line + note",
    ttl = "1h",
    store = "memory",
    name = "err_refund"
)]
async fn refund(msg: &Refund) -> Result<u32, String> {
    Err(format!("no refund for line {}", msg.line))
}

#[tokio::test]
async fn errors_show_the_key_as_the_message_holds_it() {
    let store = MemoryStore::new();
    let msg = Refund {
        order_id: "p-1".into(),
        line: 3,
        note: "late delivery".into(),
    };
    let err = refund(&store, &msg).await.unwrap_err();
    let text = err.to_string();
    assert!(text.contains(r#"key p-1 + 3 + "late delivery""#), "{text}");
    assert!(
        !text.contains("3:p-1"),
        "the storage encoding leaked: {text}"
    );

    let long = Refund {
        order_id: "p-".repeat(100),
        line: 4,
        note: String::new(),
    };
    let err = refund(&store, &long).await.unwrap_err();
    let key = err.key().unwrap().clone();
    assert!(key.as_str().starts_with("#sha256:"));
    let text = err.to_string();
    assert!(text.contains(&format!("[#{}]", key.digest())), "{text}");
    assert!(text.contains(r#"… + 4 + """#), "{text}");
}
