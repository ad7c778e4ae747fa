//! A transaction-mode body on MySQL/MariaDB that catches a deadlock and
//! runs its statement again, with real concurrency on the server of
//! `MYSQL_URL`: two bodies lock two rows in opposite order, InnoDB rolls one
//! back as the victim (ending its transaction, the claim included), and the
//! victim's body sends its statement again. That statement must commit or
//! roll back with the call's claim and outcome, not on its own, in every
//! claim order and both round trips; and no connection may go back to the
//! pool with autocommit off, also when the victim's call is dropped in the
//! middle of its body. Each test has tables of its own and drops them.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_runtime::{ClaimOrder, Error, MySqlStore, MySqlTx, Outcome, RoundTrips, idempotent};
use idem_tests::{DropMySqlTables, mysql_pool, or_skip, unique_table};
use sqlx::mysql::MySqlDatabaseError;
use sqlx::{AssertSqlSafe, MySqlPool};
use tokio::sync::{Barrier, Notify};

/// Connections of the store's pool: one per call, and one to spare.
const POOL: u32 = 3;

/// How long a statement waits on a row lock, in seconds.
const LOCK_WAIT_SECS: u32 = 5;

/// A store on a dedup table of its own, beside `rows`, a business table
/// with rows 1 and 2 (`hits` 0).
struct Fx {
    store: MySqlStore,
    pool: MySqlPool,
    rows: String,
    _drop: DropMySqlTables,
}

impl Fx {
    async fn open(name: &str, order: ClaimOrder, trips: RoundTrips) -> Option<Fx> {
        let pool = mysql_pool(POOL, LOCK_WAIT_SECS).await?;
        let dedup = unique_table(&format!("idem_retry_{name}"));
        let rows = format!("{dedup}_rows");
        let drop = DropMySqlTables::new(&[&dedup, &rows]);
        let store = MySqlStore::from_pool(pool.clone())
            .with_table(&dedup)
            .expect("a valid table name")
            .with_lock_timeout(Duration::from_secs(LOCK_WAIT_SECS.into()))
            .with_claim_order(order)
            .with_round_trips(trips);
        store.migrate().await.expect("migrate");
        sqlx::raw_sql(AssertSqlSafe(format!(
            "CREATE TABLE {rows} (id BIGINT PRIMARY KEY, hits BIGINT NOT NULL) ENGINE = InnoDB;
             INSERT INTO {rows} VALUES (1, 0), (2, 0);"
        )))
        .execute(&pool)
        .await
        .expect("the business rows");
        Some(Fx {
            store,
            pool,
            rows,
            _drop: drop,
        })
    }

    /// `hits` of rows 1 and 2.
    async fn hits(&self) -> (i64, i64) {
        let hits: Vec<i64> = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT hits FROM {} ORDER BY id",
            self.rows
        )))
        .fetch_all(&self.pool)
        .await
        .expect("read the rows");
        (hits[0], hits[1])
    }

    /// Every connection the pool holds (as many as it may open, taken at
    /// once) runs with autocommit on and the server's `completion_type`.
    async fn sessions_are_clean(&self) {
        let mut held = Vec::new();
        for _ in 0..POOL {
            let mut conn = tokio::time::timeout(Duration::from_secs(10), self.pool.acquire())
                .await
                .expect("every connection comes back to the pool, or is replaced")
                .expect("a connection");
            let (autocommit, completion): (i64, String) =
                sqlx::query_as("SELECT @@autocommit, CAST(@@completion_type AS CHAR)")
                    .fetch_one(&mut *conn)
                    .await
                    .expect("read the session");
            assert_eq!(
                (autocommit, completion.as_str()),
                (1, "NO_CHAIN"),
                "a pooled connection"
            );
            held.push(conn);
        }
    }
}

/// A message whose body locks row `first`, waits for the other message's
/// body to lock its own, then adds a hit to row `second`.
#[derive(Debug, Clone)]
struct Cross {
    id: &'static str,
    first: i64,
    second: i64,
}

/// What the bodies share.
#[derive(Default)]
struct Scene {
    /// Both bodies hold their first row: met once per message, by its first
    /// run only (a redelivery runs alone).
    both_hold: Option<Barrier>,
    ran: Mutex<HashSet<&'static str>>,
    /// The messages whose body was chosen as the deadlock victim.
    victims: Mutex<Vec<&'static str>>,
    /// A victim's body, its statement sent again, stops there for ever
    /// (until its call is dropped), after saying so on `retried`.
    hang_after_retry: bool,
    retried: Notify,
    /// Runs of the bodies.
    runs: AtomicUsize,
}

impl Scene {
    fn new(hang_after_retry: bool) -> Arc<Scene> {
        Arc::new(Scene {
            both_hold: Some(Barrier::new(2)),
            hang_after_retry,
            ..Scene::default()
        })
    }

    fn victims(&self) -> Vec<&'static str> {
        self.victims.lock().unwrap().clone()
    }
}

fn is_deadlock(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .and_then(|db| db.try_downcast_ref::<MySqlDatabaseError>())
        .is_some_and(|db| db.number() == 1213)
}

/// The body of both handlers, for one message.
async fn cross_one(
    tx: &mut sqlx::MySqlConnection,
    msg: &Cross,
    rows: &str,
    scene: &Scene,
) -> Result<i64, sqlx::Error> {
    scene.runs.fetch_add(1, Ordering::SeqCst);
    let first_run = scene.ran.lock().unwrap().insert(msg.id);
    let _: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT hits FROM {rows} WHERE id = ? FOR UPDATE"
    )))
    .bind(msg.first)
    .fetch_one(&mut *tx)
    .await?;
    if first_run && let Some(both) = &scene.both_hold {
        both.wait().await;
    }
    let bump = format!("UPDATE {rows} SET hits = hits + 1 WHERE id = ?");
    match sqlx::query(AssertSqlSafe(bump.clone()))
        .bind(msg.second)
        .execute(&mut *tx)
        .await
    {
        Ok(_) => {}
        Err(e) if is_deadlock(&e) => {
            scene.victims.lock().unwrap().push(msg.id);
            // InnoDB rolled this transaction back and ended it; the body
            // sends its statement again.
            sqlx::query(AssertSqlSafe(bump))
                .bind(msg.second)
                .execute(&mut *tx)
                .await?;
            if scene.hang_after_retry {
                scene.retried.notify_one();
                std::future::pending::<()>().await;
            }
        }
        Err(e) => return Err(e),
    }
    Ok(msg.second)
}

#[idempotent(key = "msg.id", ttl = "1h", store = "mysql", name = "my_retry_cross")]
async fn cross(
    tx: &mut MySqlTx<'_>,
    msg: &Cross,
    rows: &str,
    scene: &Scene,
) -> Result<i64, sqlx::Error> {
    cross_one(tx, msg, rows, scene).await
}

#[idempotent(
    key = "msgs.id",
    ttl = "1h",
    store = "mysql",
    name = "my_retry_cross_batch"
)]
async fn cross_batch(
    tx: &mut MySqlTx<'_>,
    msgs: &[Cross],
    rows: &str,
    scene: &Scene,
) -> Result<Vec<i64>, sqlx::Error> {
    let mut values = Vec::with_capacity(msgs.len());
    for msg in msgs {
        values.push(cross_one(tx, msg, rows, scene).await?);
    }
    Ok(values)
}

/// How a message is called: on its own, or as a batch of one.
#[derive(Clone, Copy, Debug)]
enum Shape {
    Single,
    Batch,
}

impl Shape {
    /// The handler's registered name.
    fn handler(self) -> &'static str {
        match self {
            Shape::Single => "my_retry_cross",
            Shape::Batch => "my_retry_cross_batch",
        }
    }

    /// One call of `msg`.
    async fn call(
        self,
        store: &MySqlStore,
        msg: &Cross,
        rows: &str,
        scene: &Scene,
    ) -> Result<Outcome<i64>, Error<sqlx::Error>> {
        match self {
            Shape::Single => cross(store, msg, rows, scene).await,
            Shape::Batch => {
                let mut answers =
                    cross_batch(store, std::slice::from_ref(msg), rows, scene).await?;
                answers.pop().expect("one answer")
            }
        }
    }
}

/// Delivers `msg` until its call returns an outcome, as a consumer does
/// with a store fault (`Error::Store`: redelivered); any other error fails
/// the test.
async fn deliver(
    shape: Shape,
    store: &MySqlStore,
    msg: &Cross,
    rows: &str,
    scene: &Scene,
) -> Outcome<i64> {
    for _ in 0..5 {
        match shape.call(store, msg, rows, scene).await {
            Ok(outcome) => return outcome,
            Err(Error::Store { .. }) => continue,
            Err(e) => panic!("{}: {e}", msg.id),
        }
    }
    panic!("{}: still a store fault after 5 deliveries", msg.id)
}

const A: Cross = Cross {
    id: "a",
    first: 1,
    second: 2,
};
const B: Cross = Cross {
    id: "b",
    first: 2,
    second: 1,
};

/// Both calls end with their outcome recorded, each row has exactly the one
/// hit the other message's body gave it, and every pooled connection is
/// back to autocommit.
async fn applied_once(fx: &Fx, shape: Shape, scene: &Scene) {
    assert_eq!(
        fx.hits().await,
        (1, 1),
        "each body's hit is applied once (victims: {:?}, runs: {})",
        scene.victims(),
        scene.runs.load(Ordering::SeqCst)
    );
    for msg in [&A, &B] {
        let record = fx
            .store
            .record(
                shape.handler(),
                &idem_runtime::Key::from_parts(&[&msg.id]).unwrap(),
            )
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{}: no record", msg.id));
        assert_eq!(
            record.outcome.as_deref(),
            Some(msg.second.to_string().as_str()),
            "{}",
            msg.id
        );
    }
    fx.sessions_are_clean().await;
}

/// The victim's statement, sent again after InnoDB ended its transaction,
/// commits with its claim and outcome (claiming last) or rolls back with
/// the call that found its claim row gone (claiming first, then
/// redelivered): once either way.
async fn a_retried_statement_is_part_of_the_call(
    name: &str,
    shape: Shape,
    order: ClaimOrder,
    trips: RoundTrips,
) {
    let fx = or_skip!(Fx::open(name, order, trips).await);
    let scene = Scene::new(false);
    let (a, b) = tokio::join!(
        deliver(shape, &fx.store, &A, &fx.rows, &scene),
        deliver(shape, &fx.store, &B, &fx.rows, &scene)
    );
    assert_eq!(scene.victims().len(), 1, "one deadlock victim");
    assert_eq!((a.into_inner(), b.into_inner()), (2, 1));
    applied_once(&fx, shape, &scene).await;
}

/// The victim's call is dropped after its statement ran again, in the
/// middle of its body: nothing of it stays (the redelivery applies the
/// hit once), and its connection does not go back to the pool with
/// autocommit off.
async fn a_victim_dropped_after_its_retry_leaves_nothing(
    name: &str,
    shape: Shape,
    order: ClaimOrder,
    trips: RoundTrips,
) {
    let fx = or_skip!(Fx::open(name, order, trips).await);
    let scene = Scene::new(true);
    let call = |msg: Cross| {
        let (store, rows, scene) = (fx.store.clone(), fx.rows.clone(), Arc::clone(&scene));
        tokio::spawn(async move { shape.call(&store, &msg, &rows, &scene).await })
    };
    let (a, b) = (call(A), call(B));
    tokio::time::timeout(Duration::from_secs(20), scene.retried.notified())
        .await
        .expect("a victim sends its statement again");
    let victims = scene.victims();
    assert_eq!(victims.len(), 1, "one deadlock victim");
    let (victim, winner, msg) = match victims[0] {
        "a" => (a, b, A),
        _ => (b, a, B),
    };
    victim.abort();
    assert!(victim.await.unwrap_err().is_cancelled());
    match winner.await.expect("the winner's call") {
        Ok(Outcome::Executed(_)) => {}
        other => panic!("the winner executes: {other:?}"),
    }
    // The victim's message comes again, alone.
    assert_eq!(
        deliver(shape, &fx.store, &msg, &fx.rows, &scene).await,
        Outcome::Executed(msg.second)
    );
    applied_once(&fx, shape, &scene).await;
}

macro_rules! each_way {
    ($($name:ident: $shape:expr, $order:expr, $trips:expr;)*) => {$(
        mod $name {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_retried_statement_commits_with_the_call() {
                a_retried_statement_is_part_of_the_call(
                    stringify!($name),
                    $shape,
                    $order,
                    $trips,
                )
                .await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_victim_dropped_mid_body_leaves_nothing_and_a_clean_pool() {
                a_victim_dropped_after_its_retry_leaves_nothing(
                    concat!(stringify!($name), "_drop"),
                    $shape,
                    $order,
                    $trips,
                )
                .await;
            }
        }
    )*};
}

// A batch writes its dedup rows at the commit whatever the claim order:
// once is enough for it.
each_way! {
    claim_last: Shape::Single, ClaimOrder::Last, RoundTrips::Separate;
    claim_last_merged: Shape::Single, ClaimOrder::Last, RoundTrips::Merged;
    claim_first: Shape::Single, ClaimOrder::First, RoundTrips::Separate;
    claim_checked: Shape::Single, ClaimOrder::Checked, RoundTrips::Separate;
    batch: Shape::Batch, ClaimOrder::Last, RoundTrips::Separate;
}

/// Claiming first, the claim row InnoDB takes back with a deadlock victim's
/// transaction: whether the claim inserted it or took over a record (a
/// failure counted earlier), the call finds it gone and fails, instead of
/// writing its outcome over the record that came back. And a call dropped
/// at any point, its `BEGIN` in flight included, leaves the pooled
/// connection with autocommit on and no transaction open.
mod claims_lost_and_calls_dropped {
    use std::future::Future;
    use std::pin::pin;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::task::Poll;
    use std::time::Duration;

    use idem_runtime::{Error, Key, MySqlStore, MySqlTx, Outcome, Status, idempotent};
    use idem_tests::{DropMySqlTables, mysql_pool, or_skip, unique_table};
    use sqlx::{AssertSqlSafe, MySqlPool};
    use tokio::sync::Notify;

    use super::is_deadlock;

    struct Scene {
        rows: String,
        fail_first: AtomicBool,
        holds_b: Notify,
        retried: AtomicUsize,
    }

    #[derive(Debug, Clone)]
    struct Msg {
        id: String,
    }

    async fn hit(tx: &mut sqlx::MySqlConnection, rows: &str, id: &str) -> Result<(), sqlx::Error> {
        sqlx::query(AssertSqlSafe(format!(
            "UPDATE {rows} SET n = n + 1 WHERE id = ?"
        )))
        .bind(id)
        .execute(&mut *tx)
        .await
        .map(drop)
    }

    /// Claims first (`max_attempts`). With `fail_first`, its first run
    /// fails (a counted failure); later runs hit `c`, `b`, then `a`, and a
    /// deadlock on `a` is caught and only `UPDATE a` is sent again.
    #[idempotent(
        key = "msg.id",
        ttl = "1h",
        store = "mysql",
        max_attempts = 3,
        name = "my_retry_take"
    )]
    async fn take(tx: &mut MySqlTx<'_>, msg: &Msg, scene: &Scene) -> Result<u32, sqlx::Error> {
        let _ = msg;
        if scene.fail_first.swap(false, Ordering::SeqCst) {
            return Err(sqlx::Error::Protocol("a business failure".into()));
        }
        hit(tx, &scene.rows, "c").await?;
        hit(tx, &scene.rows, "b").await?;
        scene.holds_b.notify_one();
        match hit(tx, &scene.rows, "a").await {
            Err(e) if is_deadlock(&e) => {
                scene.retried.fetch_add(1, Ordering::SeqCst);
                hit(tx, &scene.rows, "a").await?;
            }
            other => other?,
        }
        Ok(7)
    }

    async fn n(pool: &MySqlPool, rows: &str, id: &str) -> i64 {
        sqlx::query_scalar(AssertSqlSafe(format!("SELECT n FROM {rows} WHERE id = ?")))
            .bind(id)
            .fetch_one(pool)
            .await
            .unwrap()
    }

    async fn the_victims_claim_is_found_gone(prior_failure: bool) {
        let pool = or_skip!(mysql_pool(6, 5).await);
        let dedup = unique_table("my_retry_take");
        let rows = format!("{dedup}_rows");
        let _drop = DropMySqlTables::new(&[&dedup, &rows]);
        let store = MySqlStore::from_pool(pool.clone())
            .with_table(&dedup)
            .unwrap();
        store.migrate().await.unwrap();
        // Rows `x*` weigh the rival's transaction, so that InnoDB picks the
        // body's as the victim.
        let extra: Vec<String> = (1..=40).map(|i| format!("('x{i}', 0)")).collect();
        sqlx::raw_sql(AssertSqlSafe(format!(
            "CREATE TABLE {rows} (id VARCHAR(8) PRIMARY KEY, n BIGINT NOT NULL) ENGINE=InnoDB;
             INSERT INTO {rows} VALUES ('a', 0), ('b', 0), ('c', 0), {};",
            extra.join(", ")
        )))
        .execute(&pool)
        .await
        .unwrap();
        let scene = Arc::new(Scene {
            rows: rows.clone(),
            fail_first: AtomicBool::new(prior_failure),
            holds_b: Notify::new(),
            retried: AtomicUsize::new(0),
        });
        let key = Key::from_parts(&[&"k1"]).unwrap();
        if prior_failure {
            let r = take(&store, &Msg { id: "k1".into() }, &scene).await;
            assert!(matches!(r, Err(Error::Handler { .. })), "{r:?}");
            let record = store.record("my_retry_take", &key).await.unwrap().unwrap();
            assert_eq!((record.status, record.failures), (Status::Retry, 1));
        }
        let mut rival = pool.begin().await.unwrap();
        let weigh: Vec<String> = std::iter::once("a".to_owned())
            .chain((1..=40).map(|i| format!("x{i}")))
            .map(|id| format!("UPDATE {rows} SET n = n + 10 WHERE id = '{id}';"))
            .collect();
        sqlx::raw_sql(AssertSqlSafe(weigh.join(" ")))
            .execute(&mut *rival)
            .await
            .unwrap();
        let call = {
            let (store, scene) = (store.clone(), Arc::clone(&scene));
            tokio::spawn(async move { take(&store, &Msg { id: "k1".into() }, &scene).await })
        };
        tokio::time::timeout(Duration::from_secs(10), scene.holds_b.notified())
            .await
            .expect("the body holds b");
        tokio::time::sleep(Duration::from_millis(200)).await;
        sqlx::query(AssertSqlSafe(format!(
            "UPDATE {rows} SET n = n + 10 WHERE id = 'b'"
        )))
        .execute(&mut *rival)
        .await
        .expect("the rival gets b once the body is the victim");
        rival.rollback().await.unwrap();
        let got = call.await.unwrap();
        assert_eq!(
            scene.retried.load(Ordering::SeqCst),
            1,
            "the body was the victim"
        );
        match got {
            Err(Error::Store { .. }) => {}
            other => panic!(
                "the claim row InnoDB took back went unnoticed: {other:?}, c = {}",
                n(&pool, &rows, "c").await
            ),
        }
        // Nothing of the call stands: no effect, the record as it was.
        assert_eq!(
            (
                n(&pool, &rows, "a").await,
                n(&pool, &rows, "b").await,
                n(&pool, &rows, "c").await
            ),
            (0, 0, 0)
        );
        let record = store.record("my_retry_take", &key).await.unwrap();
        if prior_failure {
            let record = record.expect("the earlier failure's record");
            assert_eq!((record.status, record.failures), (Status::Retry, 1));
        } else {
            assert!(record.is_none(), "{record:?}");
        }
        // The redelivery runs the body whole.
        let again = take(&store, &Msg { id: "k1".into() }, &scene).await;
        assert!(matches!(again, Ok(Outcome::Executed(7))), "{again:?}");
        assert_eq!(
            (
                n(&pool, &rows, "a").await,
                n(&pool, &rows, "b").await,
                n(&pool, &rows, "c").await
            ),
            (1, 1, 1)
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_fresh_claim_lost_to_a_deadlock_fails_the_call() {
        the_victims_claim_is_found_gone(false).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_taken_over_claim_lost_to_a_deadlock_fails_the_call() {
        the_victims_claim_is_found_gone(true).await;
    }

    #[idempotent(key = "id", ttl = "1h", store = "mysql", name = "my_retry_quick")]
    async fn quick(tx: &mut MySqlTx<'_>, msg: &Msg) -> Result<u32, sqlx::Error> {
        let _ = msg;
        let _: i64 = sqlx::query_scalar("SELECT 1").fetch_one(&mut **tx).await?;
        Ok(1)
    }

    /// Polls `fut` `polls` times, yielding in between, then drops it.
    async fn poll_then_drop<F: Future>(fut: F, polls: usize) {
        let mut fut = pin!(fut);
        for _ in 0..polls {
            let ready =
                std::future::poll_fn(|cx| Poll::Ready(fut.as_mut().poll(cx).is_ready())).await;
            if ready {
                return;
            }
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_call_dropped_at_any_point_leaves_a_clean_pooled_connection() {
        let pool = or_skip!(mysql_pool(1, 5).await);
        let dedup = unique_table("my_retry_quick");
        let _drop = DropMySqlTables::new(&[&dedup]);
        let store = MySqlStore::from_pool(pool.clone())
            .with_table(&dedup)
            .unwrap();
        store.migrate().await.unwrap();
        let mut dirty = Vec::new();
        for i in 0..200usize {
            let polls = 1 + i % 8;
            poll_then_drop(
                quick(
                    &store,
                    &Msg {
                        id: format!("q{i}"),
                    },
                ),
                polls,
            )
            .await;
            tokio::time::sleep(Duration::from_millis(5)).await;
            let mut conn = pool.acquire().await.unwrap();
            let (autocommit, completion, open): (i64, String, i64) = sqlx::query_as(
                "SELECT CAST(@@autocommit AS SIGNED), CAST(@@completion_type AS CHAR), CAST(@@in_transaction AS SIGNED)",
            )
            .fetch_one(&mut *conn)
            .await
            .unwrap();
            // A call dropped while sqlx's own `BEGIN` is unanswered leaves
            // that transaction open (`open`), as any sqlx transaction does;
            // the next `BEGIN` on the connection commits it, empty. What the
            // store changes for a call, autocommit and completion_type,
            // must never outlive it.
            if autocommit != 1 || completion != "NO_CHAIN" {
                dirty.push((i, polls, autocommit, completion, open));
            }
            if open != 0 || !dirty.is_empty() {
                let _ = sqlx::query("ROLLBACK").execute(&mut *conn).await;
                conn.close_on_drop();
            }
        }
        assert!(
            dirty.is_empty(),
            "pooled connections left with autocommit off: {dirty:?}"
        );
    }
}
