//! MySQL / MariaDB: lock timeouts in the body, and a deadlock victim.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use idem_runtime::{Contention, Error, MySqlStore, MySqlTx, Outcome, StoreError, idempotent};
use idem_tests::{DropMySqlTables, mysql_pool, or_skip, unique_table};
use sqlx::{AssertSqlSafe, MySqlPool};

use super::{AppError, Credit, Fixture, Queue, Scene, key, settles_once, until};

/// A MariaDB store on a dedup table of its own whose sessions wait 1 s on a
/// row lock, beside the scene's business tables.
struct MyFx {
    store: MySqlStore,
    pool: MySqlPool,
    scene: Arc<Scene>,
    _drop: DropMySqlTables,
}

impl MyFx {
    async fn open(name: &str) -> Option<MyFx> {
        let pool = mysql_pool(8, 1).await?;
        let dedup = unique_table(&format!("idem_busy_{name}"));
        let scene = Scene {
            rows: format!("{dedup}_rows"),
            effects: format!("{dedup}_effects"),
            ..Scene::default()
        };
        let drop = DropMySqlTables::new(&[&dedup, &scene.rows, &scene.effects]);
        let store = MySqlStore::from_pool(pool.clone())
            .with_table(&dedup)
            .expect("a valid table name")
            .with_lock_timeout(Duration::from_secs(1));
        store.migrate().await.expect("migrate");
        sqlx::raw_sql(AssertSqlSafe(format!(
            "CREATE TABLE {rows} (id VARCHAR(16) PRIMARY KEY, n BIGINT NOT NULL) ENGINE = InnoDB;
             INSERT INTO {rows} VALUES ('hot', 0), ('a', 0), ('b', 0);
             CREATE TABLE {effects} (id VARCHAR(16) NOT NULL) ENGINE = InnoDB;",
            rows = scene.rows,
            effects = scene.effects
        )))
        .execute(&pool)
        .await
        .expect("the business tables");
        Some(MyFx {
            store,
            pool,
            scene: Arc::new(scene),
            _drop: drop,
        })
    }

    async fn n(&self, id: &str) -> i64 {
        sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT n FROM {} WHERE id = ?",
            self.scene.rows
        )))
        .bind(id)
        .fetch_one(&self.pool)
        .await
        .expect("read a row")
    }
}

impl Fixture for MyFx {
    fn scene(&self) -> &Scene {
        &self.scene
    }

    async fn effects(&self) -> HashMap<String, i64> {
        sqlx::query_as(AssertSqlSafe(format!(
            "SELECT id, COUNT(*) FROM {} GROUP BY id",
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

/// Adds a hit to `row`.
async fn my_hit(
    tx: &mut sqlx::MySqlConnection,
    row: &str,
    scene: &Scene,
) -> Result<(), sqlx::Error> {
    sqlx::query(AssertSqlSafe(format!(
        "UPDATE {} SET n = n + 1 WHERE id = ?",
        scene.rows
    )))
    .bind(row)
    .execute(&mut *tx)
    .await?;
    Ok(())
}

#[idempotent(
    key = "msg.id",
    ttl = "1h",
    store = "mysql",
    max_attempts = 2,
    name = "busy_my_credit"
)]
async fn my_credit(tx: &mut MySqlTx<'_>, msg: &Credit, scene: &Scene) -> Result<u32, AppError> {
    scene.ran(&msg.id);
    my_hit(tx, "hot", scene).await?;
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO {} (id) VALUES (?)",
        scene.effects
    )))
    .bind(&msg.id)
    .execute(&mut **tx)
    .await?;
    Ok(1)
}

/// As on PostgreSQL, with InnoDB's lock wait timeout (1205), which rolls
/// back only the statement: the store rolls the rest back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_lock_timeouts_in_the_body_are_retried_not_dead_lettered() {
    let my = or_skip!(MyFx::open("my_lock").await);
    let queue = or_skip!(Queue::open("busy_my_lock").await);
    let mut holder = my.pool.begin().await.unwrap();
    sqlx::query(AssertSqlSafe(format!(
        "SELECT n FROM {} WHERE id = 'hot' FOR UPDATE",
        my.scene.rows
    )))
    .execute(&mut *holder)
    .await
    .unwrap();
    let ids = ["m-1", "m-2"];
    for id in ids {
        queue.publish(id).await;
    }
    let running = {
        let (store, scene) = (my.store.clone(), Arc::clone(&my.scene));
        queue.start(move |msg: Credit| {
            let (store, scene) = (store.clone(), Arc::clone(&scene));
            async move { my_credit(&store, &msg, &scene).await }
        })
    };
    until(Duration::from_secs(40), || async {
        ids.iter().all(|id| my.scene.runs(id) >= 3) || queue.dead_letters().await > 0
    })
    .await;
    holder.rollback().await.unwrap();
    settles_once(&queue, running, &ids, &my, "busy_my_credit").await;
    assert_eq!(my.n("hot").await, 2);
}

#[idempotent(
    key = "msg.id",
    ttl = "1h",
    store = "mysql",
    max_attempts = 2,
    name = "busy_my_cross"
)]
async fn my_cross(tx: &mut MySqlTx<'_>, msg: &Credit, scene: &Scene) -> Result<u32, AppError> {
    scene.ran(&msg.id);
    my_hit(tx, "b", scene).await?;
    scene.holds_first.notify_one();
    my_hit(tx, "a", scene).await?;
    Ok(2)
}

/// InnoDB rolls a deadlock victim back whole (1213): here the body, which
/// changed fewer rows than the test's transaction it deadlocks with. The
/// call is the store's `Contention::Deadlock`, nothing of it stands, and
/// nothing was counted against `max_attempts`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mysql_deadlock_victim_body_is_the_store_contention() {
    let my = or_skip!(MyFx::open("my_cycle").await);
    let rows = my.scene.rows.clone();
    let mut rival = my.pool.begin().await.unwrap();
    // The rival changes five rows, `a` among them: more than the body
    // (its claim row and `b`), so InnoDB picks the body as the victim.
    sqlx::raw_sql(AssertSqlSafe(format!(
        "UPDATE {rows} SET n = n + 10 WHERE id IN ('hot', 'a');
         INSERT INTO {effects} (id) VALUES ('x'), ('y'), ('z');",
        effects = my.scene.effects
    )))
    .execute(&mut *rival)
    .await
    .unwrap();
    let call = {
        let (store, scene) = (my.store.clone(), Arc::clone(&my.scene));
        tokio::spawn(async move { my_cross(&store, &Credit { id: "d-1".into() }, &scene).await })
    };
    // The body holds `b`, and goes on to `a`: whichever of the two
    // waits first, the second closes the cycle.
    tokio::time::timeout(Duration::from_secs(10), my.scene.holds_first.notified())
        .await
        .expect("the body holds b");
    sqlx::query(AssertSqlSafe(format!(
        "UPDATE {rows} SET n = n + 10 WHERE id = 'b'"
    )))
    .execute(&mut *rival)
    .await
    .expect("the rival goes on once the body is the victim");
    match call.await.unwrap() {
        Err(Error::Store {
            source:
                StoreError::Contention {
                    kind: Contention::Deadlock,
                    error,
                },
            ..
        }) => assert!(error.contains("Deadlock"), "{error}"),
        other => panic!("{other:?}"),
    }
    rival.rollback().await.unwrap();
    assert!(
        my.store
            .record("busy_my_cross", &key("d-1"))
            .await
            .unwrap()
            .is_none(),
        "nothing of the call stands, no failure counted"
    );
    assert_eq!(
        my_cross(&my.store, &Credit { id: "d-1".into() }, &my.scene)
            .await
            .unwrap(),
        Outcome::Executed(2)
    );
    assert_eq!((my.n("a").await, my.n("b").await), (1, 1));
}
