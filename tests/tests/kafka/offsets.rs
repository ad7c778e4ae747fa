//! Offsets in the database: written with the effects, read back on
//! assignment, and committed with the effect when a consumer dies after it.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem_runtime::consume::Report;
use idem_runtime::consume::kafka::{Consumer, Offsets};
use idem_runtime::{
    MySqlStore, MySqlTx, Outcome, PgStore, PgTx, SqliteStore, SqliteTx, idempotent,
};
use idem_tests::brokers::{TANSU_ONE_RECORD_A_BATCH, kafka_brokers};
use idem_tests::{DropMySqlTables, DropTables, mysql_pool, or_skip, pg_pool, unique_table};

use super::{BoxedCall, Topic, short_sessions, start, topic};
use crate::common::broker::Points;
use crate::common::{AppError, eventually};

/// Inserts a row for the message in the handler's transaction: a doubled
/// effect shows as two rows of one id.
#[idempotent(
    key = "msg.id",
    ttl = "1h",
    store = "postgres",
    name = "kafka_apply_pg"
)]
async fn apply_pg(tx: &mut PgTx<'_>, msg: &Points, table: &str) -> Result<u32, AppError> {
    let sql = format!("INSERT INTO {table} (id) VALUES ($1)");
    sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(&msg.id)
        .execute(&mut **tx)
        .await?;
    Ok(msg.points)
}

#[idempotent(
    key = "msg.id",
    ttl = "1h",
    store = "mysql",
    name = "kafka_apply_mysql"
)]
async fn apply_mysql(tx: &mut MySqlTx<'_>, msg: &Points, table: &str) -> Result<u32, AppError> {
    let sql = format!("INSERT INTO {table} (id) VALUES (?)");
    sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(&msg.id)
        .execute(&mut **tx)
        .await?;
    Ok(msg.points)
}

#[idempotent(
    key = "msg.id",
    ttl = "1h",
    store = "sqlite",
    name = "kafka_apply_sqlite"
)]
async fn apply_sqlite(tx: &mut SqliteTx<'_>, msg: &Points, table: &str) -> Result<u32, AppError> {
    let sql = format!("INSERT INTO {table} (id) VALUES (?)");
    sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(&msg.id)
        .execute(&mut **tx)
        .await?;
    Ok(msg.points)
}

/// A SQL database for the offsets scenario: its store's offsets, a handler
/// counting its calls, and what the database holds afterwards.
trait OffsetsDb {
    fn offsets(&self) -> Offsets;
    fn handler(
        &self,
        calls: &Arc<AtomicUsize>,
    ) -> impl Fn(Points) -> BoxedCall + Send + Sync + 'static;
    /// Each partition's next offset in the offsets table, by partition.
    async fn rows(&self, group: &str, topic: &str) -> Vec<(i32, i64)>;
    /// Ids with more than one row in the business table.
    async fn doubled(&self) -> i64;
}

macro_rules! offsets_db {
    ($name:ident, $store:ty, $apply:ident, $pool:ty, $p:expr) => {
        struct $name {
            store: $store,
            pool: $pool,
            business: String,
        }

        impl OffsetsDb for $name {
            fn offsets(&self) -> Offsets {
                Offsets::from(&self.store)
            }

            fn handler(&self, calls: &Arc<AtomicUsize>) -> impl Fn(Points) -> BoxedCall + Send + Sync + 'static {
                let (store, business, calls) = (self.store.clone(), self.business.clone(), Arc::clone(calls));
                move |msg: Points| -> BoxedCall {
                    let (store, business, calls) = (store.clone(), business.clone(), Arc::clone(&calls));
                    Box::pin(async move {
                        calls.fetch_add(1, Ordering::SeqCst);
                        $apply(&store, &msg, &business).await
                    })
                }
            }

            async fn rows(&self, group: &str, topic: &str) -> Vec<(i32, i64)> {
                let sql = format!(
                    "SELECT partition_id, next_offset FROM {} WHERE consumer_group = {} AND topic = {} ORDER BY partition_id",
                    self.offsets().table(),
                    $p[0],
                    $p[1]
                );
                sqlx::query_as(sqlx::AssertSqlSafe(sql))
                    .bind(group)
                    .bind(topic)
                    .fetch_all(&self.pool)
                    .await
                    .expect("the offsets")
            }

            async fn doubled(&self) -> i64 {
                let sql = format!(
                    "SELECT count(*) FROM (SELECT id FROM {} GROUP BY id HAVING count(*) > 1) d",
                    self.business
                );
                sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
                    .fetch_one(&self.pool)
                    .await
                    .expect("count")
            }
        }
    };
}

offsets_db!(PgOffsets, PgStore, apply_pg, sqlx::PgPool, ["$1", "$2"]);
offsets_db!(
    MySqlOffsets,
    MySqlStore,
    apply_mysql,
    sqlx::MySqlPool,
    ["?", "?"]
);
offsets_db!(
    SqliteOffsets,
    SqliteStore,
    apply_sqlite,
    sqlx::SqlitePool,
    ["?", "?"]
);

/// With offsets in the database, each partition's next offset is written
/// with the effects and read back on assignment: a consumer whose broker
/// commits went back to the start does not see the messages again, and
/// brings the broker's commits up to the table's. Without them the same
/// consumer gets every message again (as duplicates).
async fn offsets_in_the_database_win_over_the_brokers(t: &Topic, db: &impl OffsetsDb) {
    for i in 0..20 {
        t.send(
            Some(&format!("x-{i}")),
            &Points::payload(&format!("x-{i}"), 1),
        )
        .await;
    }
    let calls = Arc::new(AtomicUsize::new(0));
    let running = start(
        t.consumer.clone().offsets_in(db.offsets()),
        db.handler(&calls),
    );
    eventually(Duration::from_secs(20), "20 calls", || async {
        calls.load(Ordering::SeqCst) == 20
    })
    .await;
    let first: Report = running.stop().await;
    assert_eq!(first.acked, 20, "{first:?}");
    let rows = db.rows(&t.group, &t.topic).await;
    let ends = t.kafka.ends(&t.topic).await;
    let with_messages: Vec<(i32, i64)> = ends.into_iter().filter(|(_, end)| *end > 0).collect();
    assert_eq!(
        rows, with_messages,
        "each partition's next offset is in the table"
    );

    // The broker forgets: its commits go back to the start.
    rewind(&t.group, &t.topic, rows.iter().map(|(p, _)| *p).collect()).await;
    let again = Arc::new(AtomicUsize::new(0));
    let running = start(
        t.consumer.clone().offsets_in(db.offsets()),
        db.handler(&again),
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    let second = running.stop().await;
    assert_eq!(
        again.load(Ordering::SeqCst),
        0,
        "nothing came again: {second:?}"
    );
    // ... and the broker's commits were brought up to the table's.
    let committed: Vec<(i32, i64)> = t
        .kafka
        .committed(&t.group, &t.topic)
        .await
        .into_iter()
        .filter_map(|(p, o)| Some((p, o?)))
        .filter(|(p, _)| rows.iter().any(|(rp, _)| rp == p))
        .collect();
    assert_eq!(committed, rows, "the table's offsets reached the broker");

    // The broker forgets again.
    rewind(&t.group, &t.topic, rows.iter().map(|(p, _)| *p).collect()).await;

    // The same without the table's offsets: everything comes again.
    let running = start(t.consumer.clone(), db.handler(&again));
    eventually(Duration::from_secs(20), "20 calls again", || async {
        again.load(Ordering::SeqCst) == 20
    })
    .await;
    let third = running.stop().await;
    assert_eq!(third.duplicates, 20, "{third:?}");
    assert_eq!(db.doubled().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offsets_in_postgres_win_over_the_brokers() {
    let t = or_skip!(topic("kafka_offsets_pg", 2).await);
    let pool = or_skip!(pg_pool(4).await);
    let (dedup, business) = (unique_table("kdedup"), unique_table("kapplied"));
    let _tables = DropTables::new(&[&dedup, &business, &format!("{dedup}_kafka_offsets")]);
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE {business} (id TEXT NOT NULL)"
    )))
    .execute(&pool)
    .await
    .expect("business table");
    let store = PgStore::from_pool(pool.clone())
        .with_table(&dedup)
        .expect("a table name");
    store.migrate().await.expect("migrate");
    offsets_in_the_database_win_over_the_brokers(
        &t,
        &PgOffsets {
            store,
            pool,
            business,
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offsets_in_mariadb_win_over_the_brokers() {
    let t = or_skip!(topic("kafka_offsets_my", 2).await);
    let pool = or_skip!(mysql_pool(4, 5).await);
    let (dedup, business) = (unique_table("kdedup"), unique_table("kapplied"));
    let _tables = DropMySqlTables::new(&[&dedup, &business, &format!("{dedup}_kafka_offsets")]);
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE {business} (id VARCHAR(64) NOT NULL)"
    )))
    .execute(&pool)
    .await
    .expect("business table");
    let store = MySqlStore::from_pool(pool.clone())
        .with_table(&dedup)
        .expect("a table name");
    store.migrate().await.expect("migrate");
    offsets_in_the_database_win_over_the_brokers(
        &t,
        &MySqlOffsets {
            store,
            pool,
            business,
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offsets_in_sqlite_win_over_the_brokers() {
    let t = or_skip!(topic("kafka_offsets_lite", 2).await);
    let dir = tempfile::tempdir().expect("a temporary directory");
    let store = SqliteStore::open(dir.path().join("idem.db"))
        .await
        .expect("open");
    store.migrate().await.expect("migrate");
    let pool = store.pool().clone();
    let business = "applied".to_owned();
    sqlx::query("CREATE TABLE applied (id TEXT NOT NULL)")
        .execute(&pool)
        .await
        .expect("business table");
    offsets_in_the_database_win_over_the_brokers(
        &t,
        &SqliteOffsets {
            store,
            pool,
            business,
        },
    )
    .await;
}

/// Commits offset 0 for `partitions` of `topic` in `group`.
async fn rewind(group: &str, topic: &str, partitions: Vec<i32>) {
    let (group, topic) = (group.to_owned(), topic.to_owned());
    tokio::task::spawn_blocking(move || {
        use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer as _};
        let c: BaseConsumer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", kafka_brokers())
            .set("group.id", &group)
            .set("enable.auto.commit", "false")
            .create()
            .expect("a client");
        let mut tpl = rdkafka::TopicPartitionList::new();
        for p in partitions {
            tpl.add_partition_offset(&topic, p, rdkafka::Offset::Offset(0))
                .expect("a partition");
        }
        c.commit(&tpl, CommitMode::Sync).expect("commit offset 0");
    })
    .await
    .expect("rewind");
}

/// The offset rides in the handler's transaction: a consumer killed right
/// after a message's transaction committed, before the consumer learned of
/// it, leaves that message's offset in the table (its broker commit is
/// behind), and the next consumer starts after it, with no duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_offset_commits_with_the_effect_when_the_consumer_dies_after_it() {
    let t = or_skip!(topic("kafka_offsets_die", 1).await);
    let pool = or_skip!(pg_pool(4).await);
    let (dedup, business) = (unique_table("kdedup"), unique_table("kapplied"));
    let _tables = DropTables::new(&[&dedup, &business, &format!("{dedup}_kafka_offsets")]);
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE {business} (id TEXT NOT NULL)"
    )))
    .execute(&pool)
    .await
    .expect("business table");
    let store = PgStore::from_pool(pool.clone())
        .with_table(&dedup)
        .expect("a table name");
    store.migrate().await.expect("migrate");
    for i in 0..10 {
        t.send(Some("k"), &Points::payload(&format!("x-{i}"), 1))
            .await;
    }
    let mut child = idem_tests::ChildTest::spawn(
        "kafka::offsets::kafka_consumer_dies_after_a_commit",
        &[
            ("IDEM_KAFKA_TOPIC", &t.topic),
            ("IDEM_KAFKA_GROUP", &t.group),
            ("IDEM_KAFKA_DEDUP", &dedup),
            ("IDEM_KAFKA_BUSINESS", &business),
            ("IDEM_KAFKA_DIE_AT", "x-5"),
        ],
    );
    child.line("DYING", Duration::from_secs(30)).await;
    drop(child);
    let db = PgOffsets {
        store: store.clone(),
        pool: pool.clone(),
        business: business.clone(),
    };
    assert_eq!(
        db.rows(&t.group, &t.topic).await,
        vec![(0, 6)],
        "x-5 (offset 5) committed its offset"
    );
    let broker = t.kafka.committed(&t.group, &t.topic).await;
    assert!(
        matches!(broker.as_slice(), [(0, None)] | [(0, Some(0..=5))]),
        "the broker's commit is behind: {broker:?}"
    );
    let calls = Arc::new(AtomicUsize::new(0));
    let running = start(t.consumer.clone().offsets_in(&store), db.handler(&calls));
    eventually(Duration::from_secs(20), "the last four", || async {
        calls.load(Ordering::SeqCst) >= 4
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let report = running.stop().await;
    assert_eq!(
        (calls.load(Ordering::SeqCst), report.duplicates),
        (4, 0),
        "{report:?}"
    );
    assert_eq!(db.doubled().await, 0);
    let applied: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM {business}"
    )))
    .fetch_one(&pool)
    .await
    .expect("count");
    assert_eq!(applied, 10);
}

/// The consumer of the test above, in a process of its own: it aborts
/// inside the handler, right after the call that committed the message
/// `IDEM_KAFKA_DIE_AT`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by the_offset_commits_with_the_effect_when_the_consumer_dies_after_it"]
async fn kafka_consumer_dies_after_a_commit() {
    let var = |name: &str| std::env::var(name).expect(name);
    let (topic, group, dedup, business, die_at) = (
        var("IDEM_KAFKA_TOPIC"),
        var("IDEM_KAFKA_GROUP"),
        var("IDEM_KAFKA_DEDUP"),
        var("IDEM_KAFKA_BUSINESS"),
        var("IDEM_KAFKA_DIE_AT"),
    );
    let pool = pg_pool(4).await.expect("PostgreSQL");
    let store = PgStore::from_pool(pool)
        .with_table(&dedup)
        .expect("a table name");
    let handler = {
        let store = store.clone();
        move |msg: Points| -> BoxedCall {
            let (store, business, die_at) = (store.clone(), business.clone(), die_at.clone());
            Box::pin(async move {
                let r = apply_pg(&store, &msg, &business).await;
                if msg.id == die_at && matches!(r, Ok(Outcome::Executed(_))) {
                    println!("DYING");
                    std::process::abort();
                }
                r
            })
        }
    };
    let consumer = short_sessions(Consumer::new(kafka_brokers(), group, topic))
        .set(TANSU_ONE_RECORD_A_BATCH.0, TANSU_ONE_RECORD_A_BATCH.1)
        .offsets_in(&store);
    let _ = consumer
        .run(handler, idem_runtime::consume::CancellationToken::new())
        .await;
}

/// Offsets kept in one database, the handler's transactions in another of
/// the same kind: the offset does not ride in the handler's transaction
/// (where its table does not exist), the messages are executed, and the
/// offsets are written after each call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offsets_in_another_database_are_written_after_the_call() {
    let t = or_skip!(topic("kafka_offsets_elsewhere", 1).await);
    let dir = tempfile::tempdir().expect("a temporary directory");
    let handlers = SqliteStore::open(dir.path().join("handlers.db"))
        .await
        .expect("open");
    handlers.migrate().await.expect("migrate");
    sqlx::query("CREATE TABLE applied (id TEXT NOT NULL)")
        .execute(handlers.pool())
        .await
        .expect("business table");
    let positions = SqliteStore::open(dir.path().join("offsets.db"))
        .await
        .expect("open");
    positions.migrate().await.expect("migrate");
    for i in 0..5 {
        t.send(Some("k"), &Points::payload(&format!("e-{i}"), 1))
            .await;
    }
    let db = SqliteOffsets {
        store: handlers.clone(),
        pool: handlers.pool().clone(),
        business: "applied".to_owned(),
    };
    let calls = Arc::new(AtomicUsize::new(0));
    let running = start(
        t.consumer.clone().offsets_in(&positions),
        db.handler(&calls),
    );
    eventually(Duration::from_secs(20), "five calls", || async {
        calls.load(Ordering::SeqCst) >= 5
    })
    .await;
    let in_positions = SqliteOffsets {
        store: positions.clone(),
        pool: positions.pool().clone(),
        business: "applied".to_owned(),
    };
    eventually(
        Duration::from_secs(20),
        "the offset saved after the calls",
        || async { in_positions.rows(&t.group, &t.topic).await == vec![(0, 5)] },
    )
    .await;
    let report = running.stop().await;
    assert_eq!(
        (calls.load(Ordering::SeqCst), report.acked, report.retried),
        (5, 5, 0),
        "{report:?}"
    );
    assert_eq!(db.doubled().await, 0);
}
