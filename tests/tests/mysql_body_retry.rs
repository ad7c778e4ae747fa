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
    batch: Shape::Batch, ClaimOrder::Last, RoundTrips::Separate;
}
