//! PostgreSQL: lock timeouts, deadlocks and serialization failures in the
//! body, the error types that show contention, and a batch that meets it.

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use idem_runtime::{Contention, Error, Outcome, PgStore, PgTx, StoreError, idempotent};
use idem_tests::{DropTables, or_skip, pg_url, unavailable, unique_table};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{AssertSqlSafe, Connection as _, PgPool};

use super::{AppError, Credit, Fixture, Queue, Scene, key, settles_once, until};

/// A PostgreSQL store on a dedup table of its own whose pool waits at most
/// `lock_timeout` on a lock, beside the scene's business tables.
struct PgFx {
    store: PgStore,
    pool: PgPool,
    scene: Arc<Scene>,
    _drop: DropTables,
}

impl PgFx {
    async fn open(name: &str, lock_timeout: Duration) -> Option<PgFx> {
        PgFx::open_with(name, lock_timeout, None).await
    }

    /// As [`open`](PgFx::open), every transaction of the pool's (the
    /// store's included) at `isolation` (`default_transaction_isolation`)
    /// when given.
    async fn open_with(
        name: &str,
        lock_timeout: Duration,
        isolation: Option<&str>,
    ) -> Option<PgFx> {
        let url = pg_url();
        let mut options = PgConnectOptions::from_str(&url)
            .expect("a PostgreSQL URL")
            .options([("lock_timeout", format!("{}ms", lock_timeout.as_millis()))]);
        if let Some(isolation) = isolation {
            options = options.options([("default_transaction_isolation", isolation)]);
        }
        let connect = PgPoolOptions::new()
            .max_connections(8)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(options);
        let pool = match tokio::time::timeout(Duration::from_secs(10), connect).await {
            Ok(Ok(pool)) => pool,
            Ok(Err(e)) => return unavailable("PostgreSQL", &url, e),
            Err(_) => return unavailable("PostgreSQL", &url, "connect timed out"),
        };
        let dedup = unique_table(&format!("idem_busy_{name}"));
        let scene = Scene {
            rows: format!("{dedup}_rows"),
            effects: format!("{dedup}_effects"),
            ..Scene::default()
        };
        let drop = DropTables::new(&[&dedup, &scene.rows, &scene.effects]);
        let store = PgStore::from_pool(pool.clone())
            .with_table(&dedup)
            .expect("a valid table name")
            .with_lock_timeout(lock_timeout);
        store.migrate().await.expect("migrate");
        sqlx::raw_sql(AssertSqlSafe(format!(
            "CREATE TABLE {rows} (id TEXT PRIMARY KEY, n BIGINT NOT NULL);
             INSERT INTO {rows} VALUES ('hot', 0), ('a', 0), ('b', 0);
             CREATE TABLE {effects} (id TEXT NOT NULL);",
            rows = scene.rows,
            effects = scene.effects
        )))
        .execute(&pool)
        .await
        .expect("the business tables");
        Some(PgFx {
            store,
            pool,
            scene: Arc::new(scene),
            _drop: drop,
        })
    }

    /// `n` of row `id`.
    async fn n(&self, id: &str) -> i64 {
        sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT n FROM {} WHERE id = $1",
            self.scene.rows
        )))
        .bind(id)
        .fetch_one(&self.pool)
        .await
        .expect("read a row")
    }

    /// A transaction of its own that holds row `id` locked until it is
    /// rolled back.
    async fn lock(&self, id: &str) -> sqlx::Transaction<'static, sqlx::Postgres> {
        let mut holder = self.pool.begin().await.expect("a transaction");
        sqlx::query(AssertSqlSafe(format!(
            "SELECT n FROM {} WHERE id = $1 FOR UPDATE",
            self.scene.rows
        )))
        .bind(id)
        .execute(&mut *holder)
        .await
        .expect("lock the row");
        holder
    }
}

impl Fixture for PgFx {
    fn scene(&self) -> &Scene {
        &self.scene
    }

    async fn effects(&self) -> HashMap<String, i64> {
        sqlx::query_as(AssertSqlSafe(format!(
            "SELECT id, count(*) FROM {} GROUP BY id",
            self.scene.effects
        )))
        .fetch_all(&self.pool)
        .await
        .expect("read the effects")
        .into_iter()
        .collect()
    }

    async fn record(&self, handler: &str, id: &str) -> idem_runtime::Record {
        self.store
            .record(handler, &key(id))
            .await
            .expect("read the record")
            .unwrap_or_else(|| panic!("{id}: no record"))
    }
}

/// Adds a hit to row `hot`, and records the effect.
async fn pg_hot(
    tx: &mut sqlx::PgConnection,
    msg: &Credit,
    scene: &Scene,
) -> Result<u32, sqlx::Error> {
    scene.ran(&msg.id);
    sqlx::query(AssertSqlSafe(format!(
        "UPDATE {} SET n = n + 1 WHERE id = 'hot'",
        scene.rows
    )))
    .execute(&mut *tx)
    .await?;
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO {} (id) VALUES ($1)",
        scene.effects
    )))
    .bind(&msg.id)
    .execute(&mut *tx)
    .await?;
    Ok(1)
}

#[idempotent(
    key = "msg.id",
    ttl = "1h",
    store = "postgres",
    max_attempts = 2,
    name = "busy_pg_credit"
)]
async fn pg_credit(tx: &mut PgTx<'_>, msg: &Credit, scene: &Scene) -> Result<u32, AppError> {
    Ok(pg_hot(tx, msg, scene).await?)
}

/// Another transaction holds the row every body updates, for longer than
/// three lock timeouts: each delivery's body gives up waiting (55P03), past
/// the handler's and the consumer's limit of two failed attempts. Once the
/// lock is gone, every message takes effect once; none is dead-lettered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_lock_timeouts_in_the_body_are_retried_not_dead_lettered() {
    let pg = or_skip!(PgFx::open("pg_lock", Duration::from_millis(200)).await);
    let queue = or_skip!(Queue::open("busy_pg_lock").await);
    let holder = pg.lock("hot").await;
    let ids = ["m-1", "m-2", "m-3"];
    for id in ids {
        queue.publish(id).await;
    }
    let running = {
        let (store, scene) = (pg.store.clone(), Arc::clone(&pg.scene));
        queue.start(move |msg: Credit| {
            let (store, scene) = (store.clone(), Arc::clone(&scene));
            async move { pg_credit(&store, &msg, &scene).await }
        })
    };
    // Each body waits on the lock three times at least, or a message is
    // dead-lettered (which fails the test below).
    until(Duration::from_secs(30), || async {
        ids.iter().all(|id| pg.scene.runs(id) >= 3) || queue.dead_letters().await > 0
    })
    .await;
    holder.rollback().await.expect("release the lock");
    settles_once(&queue, running, &ids, &pg, "busy_pg_credit").await;
    assert_eq!(pg.n("hot").await, 3);
}

/// Updates row `b`, then row `a`.
#[idempotent(
    key = "msg.id",
    ttl = "1h",
    store = "postgres",
    max_attempts = 2,
    name = "busy_pg_cross"
)]
async fn pg_cross(tx: &mut PgTx<'_>, msg: &Credit, scene: &Scene) -> Result<u32, AppError> {
    scene.ran(&msg.id);
    for row in ["b", "a"] {
        sqlx::query(AssertSqlSafe(format!(
            "UPDATE {} SET n = n + 1 WHERE id = $1",
            scene.rows
        )))
        .bind(row)
        .execute(&mut **tx)
        .await?;
        if row == "b" {
            scene.holds_first.notify_one();
        }
    }
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO {} (id) VALUES ($1)",
        scene.effects
    )))
    .bind(&msg.id)
    .execute(&mut **tx)
    .await?;
    Ok(2)
}

/// A transaction of the test's own holds row `a`; once the body holds `b`
/// (and goes on to `a`), the test's transaction asks for `b`: a deadlock,
/// which PostgreSQL detects in the body's session (its `deadlock_timeout`
/// of 1 s runs out first: the test's session waits 30 s before it looks)
/// and ends with 40P01 there. Three rounds, one more than the handler's
/// and the consumer's limit; then the message takes effect once, and is
/// not dead-lettered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_deadlocks_in_the_body_are_retried_not_dead_lettered() {
    let pg = or_skip!(PgFx::open("pg_cycle", Duration::from_secs(5)).await);
    let queue = or_skip!(Queue::open("busy_pg_cycle").await);
    let options = PgConnectOptions::from_str(&pg_url())
        .unwrap()
        .options([("deadlock_timeout", "30s")]);
    let mut rival = sqlx::PgConnection::connect_with(&options)
        .await
        .expect("the rival's connection");
    queue.publish("d-1").await;
    let running = {
        let (store, scene) = (pg.store.clone(), Arc::clone(&pg.scene));
        queue.start(move |msg: Credit| {
            let (store, scene) = (store.clone(), Arc::clone(&scene));
            async move { pg_cross(&store, &msg, &scene).await }
        })
    };
    let rows = pg.scene.rows.clone();
    let lock = |id: &'static str| {
        sqlx::query(AssertSqlSafe(format!(
            "SELECT n FROM {rows} WHERE id = '{id}' FOR UPDATE"
        )))
    };
    let mut rounds = 0;
    for _ in 0..3 {
        let mut tx = rival.begin().await.expect("the rival's transaction");
        lock("a").execute(&mut *tx).await.expect("lock a");
        let holds = pg.scene.holds_first.notified();
        if tokio::time::timeout(Duration::from_secs(15), holds)
            .await
            .is_err()
        {
            // No body came again (on a dead-lettered message).
            break;
        }
        lock("b")
            .execute(&mut *tx)
            .await
            .expect("the rival gets b once the body is the victim");
        tx.rollback().await.expect("the rival lets go");
        rounds += 1;
    }
    settles_once(&queue, running, &["d-1"], &pg, "busy_pg_cross").await;
    assert_eq!(rounds, 3, "the body was the deadlock victim three times");
    assert_eq!((pg.n("a").await, pg.n("b").await), (1, 1));
}

/// When the body of [`pg_serial`] updates row `hot`: after the test has
/// updated it from a session of its own.
#[derive(Default)]
struct Race {
    /// The body waits for `updated` (on its first run only).
    armed: std::sync::atomic::AtomicBool,
    /// The body read row `hot`: its transaction's snapshot is taken.
    read: tokio::sync::Notify,
    /// The test's update of row `hot` is committed.
    updated: tokio::sync::Notify,
}

/// Reads row `hot` (at `REPEATABLE READ` the transaction's snapshot is
/// taken by then, if the claim did not take it), waits while the test
/// updates the row and commits, then adds a hit to it: PostgreSQL refuses
/// to update a row version newer than the snapshot (40001), the first time.
async fn pg_serial(
    tx: &mut sqlx::PgConnection,
    msg: &Credit,
    scene: &Scene,
    race: &Race,
) -> Result<u32, sqlx::Error> {
    // `pg_hot` counts the run.
    let _: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT n FROM {} WHERE id = 'hot'",
        scene.rows
    )))
    .fetch_one(&mut *tx)
    .await?;
    race.read.notify_one();
    if race.armed.swap(false, std::sync::atomic::Ordering::SeqCst) {
        race.updated.notified().await;
    }
    pg_hot(tx, msg, scene).await
}

/// Counts failures (`max_attempts`), so claims first.
#[idempotent(
    key = "msg.id",
    ttl = "1h",
    store = "postgres",
    max_attempts = 2,
    name = "busy_pg_serial_counted"
)]
async fn pg_serial_counted(
    tx: &mut PgTx<'_>,
    msg: &Credit,
    scene: &Scene,
    race: &Race,
) -> Result<u32, AppError> {
    Ok(pg_serial(tx, msg, scene, race).await?)
}

/// Claims in the store's order (last).
#[idempotent(
    key = "msg.id",
    ttl = "1h",
    store = "postgres",
    name = "busy_pg_serial"
)]
async fn pg_serial_plain(
    tx: &mut PgTx<'_>,
    msg: &Credit,
    scene: &Scene,
    race: &Race,
) -> Result<u32, AppError> {
    Ok(pg_serial(tx, msg, scene, race).await?)
}

/// Every transaction at `REPEATABLE READ`: the body reads row `hot`, the
/// test's own session updates the row and commits, and the body's update
/// of it fails with a real serialization failure (40001). The call fails
/// as the store's contention (`Contention::Serialization`), not as the
/// body's error: nothing recorded, no failure counted, no effect; the
/// redelivery executes as a first attempt. Claiming first (a handler that
/// counts failures) and last.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_serialization_failures_in_the_body_are_the_stores() {
    let pg = or_skip!(
        PgFx::open_with("pg_serial", Duration::from_secs(5), Some("repeatable read")).await
    );
    let level: String = sqlx::query_scalar("SHOW transaction_isolation")
        .fetch_one(&pg.pool)
        .await
        .expect("read the isolation level");
    assert_eq!(level, "repeatable read", "the pool's transactions");
    let rows = pg.scene.rows.clone();
    macro_rules! round {
        ($handler:ident, $name:literal, $id:literal) => {{
            let race = Arc::new(Race::default());
            race.armed.store(true, std::sync::atomic::Ordering::SeqCst);
            let call = {
                let (store, scene, race) =
                    (pg.store.clone(), Arc::clone(&pg.scene), Arc::clone(&race));
                tokio::spawn(async move {
                    $handler(&store, &Credit { id: $id.into() }, &scene, &race).await
                })
            };
            tokio::time::timeout(Duration::from_secs(10), race.read.notified())
                .await
                .expect("the body reads row hot");
            sqlx::query(AssertSqlSafe(format!(
                "UPDATE {rows} SET n = n + 10 WHERE id = 'hot'"
            )))
            .execute(&pg.pool)
            .await
            .expect("the test's update commits: the body only read the row");
            race.updated.notify_one();
            match call.await.expect("the call's task") {
                Err(
                    e @ Error::Store {
                        source:
                            StoreError::Contention {
                                kind: Contention::Serialization,
                                ..
                            },
                        ..
                    },
                ) => assert!(
                    e.to_string().contains("serialization failure"),
                    "{}: {e}",
                    $name
                ),
                other => panic!(
                    "{}: the store's serialization failure, not {other:?}",
                    $name
                ),
            }
            assert!(
                pg.store.record($name, &key($id)).await.unwrap().is_none(),
                "{}: nothing recorded, no failure counted",
                $name
            );
            assert_eq!(pg.effects().await.get($id), None, "{}: rolled back", $name);
            // The redelivery runs alone: a first attempt, applied once.
            let again = $handler(&pg.store, &Credit { id: $id.into() }, &pg.scene, &race).await;
            assert!(
                matches!(again, Ok(Outcome::Executed(1))),
                "{}: {again:?}",
                $name
            );
            let record = pg.record($name, $id).await;
            assert_eq!(
                (record.status, record.failures),
                (idem_runtime::Status::Completed, 0),
                "{}",
                $name
            );
            assert_eq!(pg.effects().await.get($id), Some(&1), "{}", $name);
            assert_eq!(pg.scene.runs($id), 2, "{}", $name);
        }};
    }
    round!(pg_serial_counted, "busy_pg_serial_counted", "s-1");
    round!(pg_serial_plain, "busy_pg_serial", "s-2");
    assert_eq!(pg.n("hot").await, 22, "two updates of the test's, two hits");
}

// ---------------------------------------------------------------------------
// What the runtime sees of a body's error, by its type (PostgreSQL)

/// An error that is sqlx's, seen through: `#[error(transparent)]`, whose
/// `source` is the database error sqlx's holds.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
struct Transparent(#[from] sqlx::Error);

/// An error that holds another one, as `anyhow::Error` does: `AsRef` of
/// the error it holds, not an `Error` itself.
#[derive(Debug)]
struct Holder(Box<dyn std::error::Error + Send + Sync>);

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "held: {}", self.0)
    }
}

impl AsRef<dyn std::error::Error + Send + Sync> for Holder {
    fn as_ref(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        self.0.as_ref()
    }
}

macro_rules! pg_hot_handler {
    ($($name:ident -> $err:ty, $into:expr;)*) => {$(
        #[idempotent(key = "msg.id", ttl = "1h", store = "postgres", max_attempts = 2)]
        async fn $name(tx: &mut PgTx<'_>, msg: &Credit, scene: &Scene) -> Result<u32, $err> {
            let into: fn(sqlx::Error) -> $err = $into;
            pg_hot(tx, msg, scene).await.map_err(into)
        }
    )*};
}

pg_hot_handler! {
    hot_sqlx -> sqlx::Error, |e| e;
    hot_app -> AppError, AppError::from;
    hot_transparent -> Transparent, Transparent::from;
    hot_boxed -> Box<dyn std::error::Error + Send + Sync>, |e| Box::new(e);
    hot_held -> Holder, |e| Holder(Box::new(e));
    hot_text -> String, |e| e.to_string();
}

/// The store's contention is found in the body's error whatever carries
/// it: sqlx's error itself, a wrapper whose source it is, a transparent
/// one, a box, an `anyhow`-like holder. An error type that is none of
/// these (a `String`) stays the body's: the runtime cannot look into it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contention_is_found_in_every_error_type_that_shows_it() {
    let pg = or_skip!(PgFx::open("pg_types", Duration::from_millis(100)).await);
    let holder = pg.lock("hot").await;
    let msg = |id: &str| Credit { id: id.to_owned() };
    let (store, scene) = (&pg.store, &*pg.scene);
    let contention = |kind: &str, e: String| {
        assert!(
            e.starts_with("handler `hot_")
                && e.contains("a lock timeout in the body's transaction, rolled back"),
            "{kind}: {e}"
        );
    };
    macro_rules! store_contention {
        ($($handler:ident),*) => {$(
            match $handler(store, &msg(stringify!($handler)), scene).await {
                Err(e @ Error::Store {
                    source: StoreError::Contention { kind: Contention::LockTimeout, .. },
                    ..
                }) => contention(stringify!($handler), e.to_string()),
                other => panic!("{}: {other:?}", stringify!($handler)),
            }
        )*};
    }
    store_contention!(hot_sqlx, hot_app, hot_transparent, hot_boxed, hot_held);
    match hot_text(store, &msg("text"), scene).await {
        Err(Error::Handler { error, .. }) => assert!(error.contains("lock timeout"), "{error}"),
        other => panic!("a `String` error is the body's: {other:?}"),
    }
    holder.rollback().await.unwrap();
    // Nothing was counted: each runs now, as a first attempt.
    for handler in [
        "hot_sqlx",
        "hot_app",
        "hot_transparent",
        "hot_boxed",
        "hot_held",
    ] {
        assert!(
            pg.store
                .record(handler, &key(handler))
                .await
                .unwrap()
                .is_none(),
            "{handler}: nothing recorded"
        );
    }
    assert_eq!(
        hot_sqlx(store, &msg("hot_sqlx"), scene).await.unwrap(),
        Outcome::Executed(1)
    );
    assert_eq!(pg.record("hot_sqlx", "hot_sqlx").await.failures, 0);
    let text = pg.record("hot_text", "text").await;
    assert_eq!(text.failures, 1, "the `String` error was counted");
}

/// Adds a hit to row `hot` per message.
#[idempotent(
    key = "msgs.id",
    ttl = "1h",
    store = "postgres",
    name = "busy_pg_batch"
)]
async fn pg_batch(tx: &mut PgTx<'_>, msgs: &[Credit], scene: &Scene) -> Result<Vec<u32>, AppError> {
    let mut values = Vec::with_capacity(msgs.len());
    for msg in msgs {
        values.push(pg_hot(tx, msg, scene).await?);
    }
    Ok(values)
}

/// A transaction-mode batch whose body meets a lock timeout fails as the
/// store's, and records nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_whose_body_meets_contention_fails_as_the_store() {
    let pg = or_skip!(PgFx::open("pg_batch", Duration::from_millis(100)).await);
    let holder = pg.lock("hot").await;
    let msgs = [Credit { id: "b-1".into() }, Credit { id: "b-2".into() }];
    match pg_batch(&pg.store, &msgs, &pg.scene).await {
        Err(Error::Store {
            source:
                StoreError::Contention {
                    kind: Contention::LockTimeout,
                    error,
                },
            key,
            ..
        }) => {
            assert!(error.starts_with("sql: "), "the body's text: {error}");
            assert_eq!(key, Some(self::key("b-1")));
        }
        other => panic!("{other:?}"),
    }
    holder.rollback().await.unwrap();
    let answers = pg_batch(&pg.store, &msgs, &pg.scene).await.unwrap();
    assert!(
        answers
            .iter()
            .all(|a| matches!(a, Ok(Outcome::Executed(1)))),
        "{answers:?}"
    );
    assert_eq!(pg.n("hot").await, 2);
}
