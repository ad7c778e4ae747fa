//! MySQL/MariaDB under real contention, real crashes, killed connections,
//! lock wait timeouts and concurrent migrations: the stress scenarios
//! (`common/stress.rs`) on the server of `MYSQL_URL`. Every claim about
//! effects is read back from the business table, not from idem's own
//! counters.
//!
//! InnoDB's traps are the point here: a duplicate key check takes a shared
//! lock on the uncommitted row of another transaction (so a concurrent
//! duplicate waits, bounded by `innodb_lock_wait_timeout`), and gap locks
//! make deadlocks (1213) possible under contention. Both must end as a
//! retryable `InProgress`, never as a lost or doubled effect.

mod common;

use std::time::Duration;

use common::stress::{self, Crash, Effect, StressFixture, Way};
use idem_runtime::{Key, MySqlStore, StoreError};
use idem_tests::{DropMySqlTables, mysql_pool, mysql_url, unique_table};
use sqlx::mysql::{MySqlConnection, MySqlPool, MySqlPoolOptions};
use sqlx::{AssertSqlSafe, Executor as _, MySql, Transaction};

/// An admin pool of the server of `MYSQL_URL`.
struct MySqlStress {
    admin: MySqlPool,
}

/// A store on `pool` over the dedup table `dedup`, claiming in `order`,
/// sending the dedup row in `trips`.
fn store_for(pool: MySqlPool, dedup: &str, Way(order, trips): Way) -> MySqlStore {
    MySqlStore::from_pool(pool)
        .with_table(dedup)
        .expect("valid table")
        .with_claim_order(order)
        .with_round_trips(trips)
}

impl StressFixture for MySqlStress {
    type Store = MySqlStore;
    type Conn = MySqlConnection;
    /// `CONNECTION_ID()`.
    type ConnId = u64;
    type Holder = Transaction<'static, MySql>;
    type Cleanup = DropMySqlTables;

    const PREFIX: &'static str = "my";
    /// `innodb_lock_wait_timeout` counts whole seconds.
    const LOCK_TIMEOUT: Duration = Duration::from_secs(1);

    async fn admin() -> Option<Self> {
        Some(MySqlStress {
            admin: mysql_pool(4, 5).await?,
        })
    }

    fn drop_later(tables: &[&str]) -> DropMySqlTables {
        DropMySqlTables::new(tables)
    }

    fn store_on_admin(&self, dedup: &str, order: Way) -> MySqlStore {
        store_for(self.admin.clone(), dedup, order)
    }

    async fn migrate(store: &MySqlStore) -> Result<(), StoreError> {
        store.migrate().await
    }

    async fn consumer(dedup: &str, order: Way) -> (MySqlStore, u64) {
        let pool = MySqlPoolOptions::new()
            .max_connections(1)
            .connect(&mysql_url())
            .await
            .expect("consumer connects");
        let id: u64 = sqlx::query_scalar("SELECT CONNECTION_ID()")
            .fetch_one(&pool)
            .await
            .expect("connection id");
        (store_for(pool, dedup, order), id)
    }

    async fn connect(dedup: &str, order: Way) -> Result<MySqlStore, StoreError> {
        Ok(MySqlStore::connect(&mysql_url())
            .await?
            .with_table(dedup)?
            .with_claim_order(order.0))
    }

    async fn lock_waiting(dedup: &str, order: Way) -> Option<MySqlStore> {
        let pool = mysql_pool(2, 1).await?;
        Some(store_for(pool, dedup, order).with_lock_timeout(Self::LOCK_TIMEOUT))
    }

    async fn kill(&self, id: u64) {
        // The server's own integer, not user input.
        self.admin
            .execute(AssertSqlSafe(format!("KILL CONNECTION {id}")))
            .await
            .expect("kill the consumer's connection");
    }

    fn refuses_table(&self, table: &str) -> bool {
        MySqlStore::from_pool(self.admin.clone())
            .with_table(table)
            .is_err()
    }

    async fn business_table(&self) -> String {
        let t = unique_table("my_effects");
        self.admin
            .execute(AssertSqlSafe(format!(
                "CREATE TABLE {t} (message_id BIGINT PRIMARY KEY, applied BIGINT NOT NULL)
                 ENGINE = InnoDB"
            )))
            .await
            .expect("create business table");
        t
    }

    async fn applied(&self, table: &str) -> Vec<(i64, i64)> {
        sqlx::query_as(AssertSqlSafe(format!(
            "SELECT message_id, applied FROM {table} ORDER BY message_id"
        )))
        .fetch_all(&self.admin)
        .await
        .expect("read business table")
    }

    async fn dedup_rows(&self, dedup: &str) -> i64 {
        sqlx::query_scalar(AssertSqlSafe(format!("SELECT COUNT(*) FROM {dedup}")))
            .fetch_one(&self.admin)
            .await
            .expect("count")
    }

    async fn columns(&self, dedup: &str) -> Vec<String> {
        sqlx::query_scalar(
            "SELECT CAST(column_name AS CHAR) FROM information_schema.columns
             WHERE table_schema = DATABASE() AND table_name = ? ORDER BY ordinal_position",
        )
        .bind(dedup)
        .fetch_all(&self.admin)
        .await
        .expect("columns")
    }

    async fn hold(&self, dedup: &str, handler: &str, key: &Key) -> Self::Holder {
        let mut holder = self.admin.begin().await.expect("begin");
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {dedup} (handler, `key`, status, attempts, created_at, updated_at, expires_at)
             VALUES (?, ?, 'in_progress', 1, 0, 0, 9223372036854775807)"
        )))
        .bind(handler)
        .bind(key.as_str())
        .execute(&mut *holder)
        .await
        .expect("hold the key");
        holder
    }

    async fn release(holder: Self::Holder) {
        holder.rollback().await.expect("roll back");
    }

    async fn bump(conn: &mut MySqlConnection, msg: &Effect) -> Result<i64, sqlx::Error> {
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {} (message_id, applied) VALUES (?, 1)
             ON DUPLICATE KEY UPDATE applied = applied + 1",
            msg.table
        )))
        .bind(msg.message_id)
        .execute(&mut *conn)
        .await?;
        Self::read(conn, msg).await
    }

    async fn read(conn: &mut MySqlConnection, msg: &Effect) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT applied FROM {} WHERE message_id = ?",
            msg.table
        )))
        .bind(msg.message_id)
        .fetch_one(conn)
        .await
    }
}

stress::handlers! {
    MySqlStress, tx: MySqlTx, store: "mysql",
    names: { effect: "my_apply_effect", parked: "my_apply_parked" },
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn contention_claim_last_applies_each_message_once() {
    stress::contention::<MySqlStress>(Way::LAST).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn contention_claim_last_merged_applies_each_message_once() {
    stress::contention::<MySqlStress>(Way::LAST_MERGED).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn contention_claim_first_applies_each_message_once() {
    stress::contention::<MySqlStress>(Way::FIRST).await;
}

/// The child side of the crash tests: run by the parent as a separate process
/// of this test binary, killed with SIGKILL where it parks.
#[tokio::test]
#[ignore = "run as a child process by the crash tests"]
async fn crash_child() {
    stress::crash_child::<MySqlStress>().await;
}

/// Until the server notices the dead connection, its transaction still
/// holds the key: the redelivery waits and is told to come back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_inside_the_body_leaves_nothing_and_redelivery_runs_once() {
    stress::crash::<MySqlStress>(Crash::InsideBody, Way::LAST).await;
    stress::crash::<MySqlStress>(Crash::InsideBody, Way::FIRST).await;
    stress::crash::<MySqlStress>(Crash::InsideBody, Way::LAST_MERGED).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_after_commit_before_ack_makes_redelivery_a_duplicate() {
    stress::crash::<MySqlStress>(Crash::AfterCommit, Way::LAST).await;
    stress::crash::<MySqlStress>(Crash::AfterCommit, Way::FIRST).await;
    stress::crash::<MySqlStress>(Crash::AfterCommit, Way::LAST_MERGED).await;
}

/// `KILL CONNECTION` on the consumer's connection while the body is parked
/// in its transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_connection_gives_store_error_and_records_nothing() {
    stress::killed_connection::<MySqlStress>().await;
}

/// The claim waits on the row lock, `innodb_lock_wait_timeout` 1 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_claim_waiting_past_the_lock_wait_timeout_is_in_progress() {
    stress::claim_waiting_past_the_lock_timeout::<MySqlStress>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn migrate_from_many_connections_at_once() {
    stress::migrate_from_many_connections_at_once::<MySqlStress>().await;
}
