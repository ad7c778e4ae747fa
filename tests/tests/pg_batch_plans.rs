//! A batch on PostgreSQL reads and writes its keys' records one primary-key
//! lookup per key, whatever the planner's statistics say of the handler.
//!
//! The case: a handler new since the table's last `ANALYZE` (or a table
//! that grew fast since). The statistics take its name for a rare value,
//! and a statement written as `handler = $1 AND key = ANY ($2)` is then
//! planned as a read of every row of the handler, filtered on the keys: a
//! batch costs as much as the handler has rows. Each test here gives a
//! handler 30,000 rows the statistics do not know of (autovacuum off for
//! the table, so that no `ANALYZE` comes in between), runs one kind of
//! batch statement over 40 keys, and counts the rows the server read from
//! the table and its indexes (`pg_stat_user_tables`,
//! `pg_stat_user_indexes`): at most a few per key.
//!
//! The last two tests are the race that reaching rows by their place must
//! survive: another statement (the lease keeper extending the same claim)
//! changes a batch's row while the batch's completion, or its release,
//! waits for it.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use idem_runtime::{Key, PgStore, PgTx, idempotent};
use idem_tests::{DropTables, or_skip, pg_pool, pg_url, unique_table};
use serde::Deserialize;
use sqlx::postgres::PgPoolOptions;
use sqlx::{AssertSqlSafe, PgPool};

#[derive(Debug, Clone, Deserialize)]
struct Msg {
    id: u64,
}

/// Rows each handler holds that the statistics do not know of.
const UNSEEN: i64 = 30_000;

/// Keys a batch holds.
const BATCH: u64 = 40;

/// The most rows a batch of [`BATCH`] keys may read: a few per key.
const MOST_READ: i64 = 5 * BATCH as i64;

/// The key of the old row every handler has: `id` 7, recorded with 7.
const OLD: u64 = 7;

#[idempotent(key = "id", ttl = "1h", store = "postgres", name = "pg_plans_tx")]
async fn tx_batch(tx: &mut PgTx<'_>, msgs: &[Msg]) -> Result<Vec<u64>, sqlx::Error> {
    let _ = tx;
    Ok(msgs.iter().map(|m| m.id).collect())
}

#[idempotent(key = "id", ttl = "1h", store = "postgres", name = "pg_plans_lease")]
async fn lease_batch(msgs: &[Msg]) -> Result<Vec<u64>, sqlx::Error> {
    Ok(msgs.iter().map(|m| m.id).collect())
}

#[idempotent(key = "id", ttl = "1h", store = "postgres", name = "pg_plans_failing")]
async fn failing_batch(msgs: &[Msg]) -> Result<Vec<u64>, std::io::Error> {
    let _ = msgs;
    Err(std::io::Error::other("the body fails"))
}

#[idempotent(
    key = "id",
    ttl = "1h",
    lease = "3s",
    store = "postgres",
    name = "pg_plans_slow"
)]
async fn slow_batch(msgs: &[Msg]) -> Result<Vec<u64>, sqlx::Error> {
    // Past a third of the lease: the keeper extends the batch's claims.
    tokio::time::sleep(Duration::from_millis(1_600)).await;
    Ok(msgs.iter().map(|m| m.id).collect())
}

/// What each raced test set up and saw, by handler: its dedup table, and
/// whether the batch's statement waited for the racer's row.
static RACED: Mutex<BTreeMap<&str, (String, bool)>> = Mutex::new(BTreeMap::new());

/// The key of message 1005, whose record the racer changes.
fn raced_key() -> String {
    stored(1_005)
}

/// As the keeper's extension of the same claim would: an update of
/// `handler`'s claim of [`raced_key`] (its `updated_at`), committed only
/// once a statement of the batch waits for the row (seen by
/// `pg_blocking_pids`, at most 10 s), which [`RACED`] then records.
/// Returns once the racer holds the row.
async fn race(handler: &'static str) {
    let table = RACED.lock().unwrap()[handler].0.clone();
    let (locked, wait) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let pool = pg_pool(2).await.expect("the racer connects");
        let mut tx = pool.begin().await.expect("begin");
        let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&mut *tx)
            .await
            .expect("the racer's pid");
        sqlx::query(AssertSqlSafe(format!(
            "UPDATE {table} SET updated_at = updated_at + 1 WHERE handler = $1 AND key = $2"
        )))
        .bind(handler)
        .bind(raced_key())
        .execute(&mut *tx)
        .await
        .expect("the racer updates the claim");
        let _ = locked.send(());
        for _ in 0..500 {
            let waiting: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY (pg_blocking_pids(pid))",
            )
            .bind(pid)
            .fetch_one(&pool)
            .await
            .expect("who waits");
            if waiting > 0 {
                RACED.lock().unwrap().get_mut(handler).expect("set").1 = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tx.commit().await.expect("the racer commits");
    });
    wait.await.expect("the racer took the row");
}

/// Sets up [`race`] for `handler` on `table`.
fn raced(handler: &'static str, table: &str) {
    RACED
        .lock()
        .unwrap()
        .insert(handler, (table.to_owned(), false));
}

/// Whether a statement of `handler`'s batch waited for the racer's row.
fn waited(handler: &str) -> bool {
    RACED.lock().unwrap()[handler].1
}

#[idempotent(key = "id", ttl = "1h", store = "postgres", name = "pg_plans_raced")]
async fn raced_batch(msgs: &[Msg]) -> Result<Vec<u64>, sqlx::Error> {
    race("pg_plans_raced").await;
    Ok(msgs.iter().map(|m| m.id).collect())
}

#[idempotent(
    key = "id",
    ttl = "1h",
    store = "postgres",
    name = "pg_plans_raced_failing"
)]
async fn raced_failing_batch(msgs: &[Msg]) -> Result<Vec<u64>, std::io::Error> {
    let _ = msgs;
    race("pg_plans_raced_failing").await;
    Err(std::io::Error::other("the body fails"))
}

/// A store over a fresh dedup table on a pool of one connection (whose
/// statistics [`counts`](Fixture::counts) has it send to the server), the
/// admin pool, and the table. Handler `handler` has [`UNSEEN`] rows the table's statistics do
/// not know of, among them [`OLD`].
struct Fixture {
    store: PgStore,
    pool: PgPool,
    admin: PgPool,
    table: String,
    _drop: DropTables,
}

impl Fixture {
    async fn new(handler: &str) -> Option<Fixture> {
        let admin = pg_pool(2).await?;
        let version: i32 = sqlx::query_scalar("SELECT current_setting('server_version_num')::int")
            .fetch_one(&admin)
            .await
            .expect("the server's version");
        if version < 150_000 {
            // `pg_stat_force_next_flush` came with PostgreSQL 15.
            eprintln!(
                "skipped: PostgreSQL {version} has no pg_stat_force_next_flush (15 or later)"
            );
            return None;
        }
        let table = unique_table("pg_plans");
        let drop = DropTables::new(&[&table]);
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .connect(&pg_url())
            .await
            .expect("store pool");
        let store = PgStore::from_pool(pool.clone())
            .with_table(&table)
            .expect("valid table");
        store.migrate().await.expect("migrate");
        let run = |sql: String| {
            let admin = admin.clone();
            async move {
                sqlx::query(AssertSqlSafe(sql))
                    .execute(&admin)
                    .await
                    .expect("setup statement");
            }
        };
        run(format!(
            "ALTER TABLE {table} SET (autovacuum_enabled = false)"
        ))
        .await;
        // What the statistics know: another handler's rows.
        run(rows(&table, "pg_plans_other", 2_000)).await;
        run(format!("ANALYZE {table}")).await;
        // What they do not: this handler's.
        run(rows(&table, handler, UNSEEN)).await;
        Some(Fixture {
            store,
            pool,
            admin,
            table,
            _drop: drop,
        })
    }

    /// The rows the server has read from the table and its indexes so
    /// far, and the rows it updated, once the store's connection has sent
    /// its statistics.
    async fn counts(&self) -> Counts {
        // A backend sends its counts at most once a second unless told
        // to: this tells the store's one connection, whose next statement
        // then sends them when it ends.
        sqlx::query("SELECT pg_stat_force_next_flush()")
            .execute(&self.pool)
            .await
            .expect("flush");
        sqlx::query("SELECT 1")
            .execute(&self.pool)
            .await
            .expect("flushed");
        let (read, updated) = sqlx::query_as(
            "SELECT (t.seq_tup_read + coalesce(sum(i.idx_tup_read), 0))::bigint, t.n_tup_upd
             FROM pg_stat_user_tables t
             JOIN pg_stat_user_indexes i ON i.relid = t.relid
             WHERE t.relid = $1::regclass
             GROUP BY t.seq_tup_read, t.n_tup_upd",
        )
        .bind(&self.table)
        .fetch_one(&self.admin)
        .await
        .expect("the table's counts");
        Counts { read, updated }
    }

    /// The status and outcome of `handler`'s record of `key`.
    async fn record(&self, handler: &str, key: u64) -> Option<(String, Option<String>)> {
        sqlx::query_as(AssertSqlSafe(format!(
            "SELECT status, outcome FROM {} WHERE handler = $1 AND key = $2",
            self.table
        )))
        .bind(handler)
        .bind(stored(key))
        .fetch_optional(&self.admin)
        .await
        .expect("read a record")
    }
}

/// The stored form of message `id`'s key.
fn stored(id: u64) -> String {
    Key::from_parts(&[&id]).expect("a key").as_str().to_owned()
}

/// What [`Fixture::counts`] reads.
#[derive(Debug, Clone, Copy)]
struct Counts {
    read: i64,
    updated: i64,
}

/// An insert of `count` completed rows of `handler`, keys [`OLD`]'s and
/// `old-2`..., each recorded with outcome `7`, for an hour.
fn rows(table: &str, handler: &str, count: i64) -> String {
    // The stored form of a number (`1:7`) holds no quote.
    let old = stored(OLD);
    format!(
        "INSERT INTO {table} (handler, key, status, outcome, attempts, failures,
                              created_at, updated_at, expires_at)
         SELECT '{handler}', CASE WHEN g = 1 THEN '{old}' ELSE 'old-' || g END,
                'completed', '7', 1, 0, n, n, n + 3600000
         FROM generate_series(1, {count}) AS g,
              (SELECT (extract(epoch from now()) * 1000)::bigint AS n) AS now"
    )
}

/// [`BATCH`] fresh messages, and with `old` the old key's among them.
fn batch(old: bool) -> Vec<Msg> {
    let mut msgs: Vec<Msg> = (1_000..1_000 + BATCH).map(|id| Msg { id }).collect();
    if old {
        msgs.push(Msg { id: OLD });
    }
    msgs
}

fn assert_few(read: i64, what: &str) {
    assert!(
        read <= MOST_READ,
        "{what} read {read} rows for {BATCH} keys (at most {MOST_READ}): \
         the handler's {UNSEEN} rows were scanned"
    );
}

#[tokio::test]
async fn a_transaction_batch_reads_its_records_key_by_key() {
    let f = or_skip!(Fixture::new("pg_plans_tx").await);
    let before = f.counts().await;
    let results = tx_batch(&f.store, &batch(true)).await.expect("batch");
    assert_few(f.counts().await.read - before.read, "the transaction batch");
    let (old, fresh) = results.split_last().expect("results");
    assert!(fresh.iter().all(|r| matches!(r, Ok(o) if o.is_executed())));
    let old = old.as_ref().expect("the old key's result");
    assert!(old.is_duplicate() && *old.value() == 7, "{old:?}");
}

#[tokio::test]
async fn a_lease_batch_sorts_out_and_completes_its_claims_key_by_key() {
    let f = or_skip!(Fixture::new("pg_plans_lease").await);
    let before = f.counts().await;
    // The old key makes the claims' insert short of one row: the batch
    // reads its records to sort them out, then completes its claims.
    let results = lease_batch(&f.store, &batch(true)).await.expect("batch");
    assert_few(f.counts().await.read - before.read, "the lease batch");
    let (old, fresh) = results.split_last().expect("results");
    assert!(fresh.iter().all(|r| matches!(r, Ok(o) if o.is_executed())));
    assert!(matches!(old, Ok(o) if o.is_duplicate() && *o.value() == 7));
    for id in 1_000..1_000 + BATCH {
        let (status, outcome) = f.record("pg_plans_lease", id).await.expect("recorded");
        assert_eq!(
            (status.as_str(), outcome),
            ("completed", Some(id.to_string()))
        );
    }
}

#[tokio::test]
async fn a_failed_lease_batch_releases_its_claims_key_by_key() {
    let f = or_skip!(Fixture::new("pg_plans_failing").await);
    let before = f.counts().await;
    let failed = failing_batch(&f.store, &batch(false)).await;
    assert!(failed.is_err(), "{failed:?}");
    assert_few(f.counts().await.read - before.read, "the release");
    for id in 1_000..1_000 + BATCH {
        assert_eq!(f.record("pg_plans_failing", id).await, None, "key {id}");
    }
}

#[tokio::test]
async fn a_lease_batch_extends_its_claims_key_by_key() {
    let f = or_skip!(Fixture::new("pg_plans_slow").await);
    let before = f.counts().await;
    let results = slow_batch(&f.store, &batch(false)).await.expect("batch");
    let after = f.counts().await;
    assert_few(after.read - before.read, "the extended batch");
    // The keeper's extension, then the completion, of every claim.
    assert!(
        after.updated - before.updated >= 2 * BATCH as i64,
        "{} rows updated: the keeper did not extend the claims",
        after.updated - before.updated
    );
    assert!(
        results
            .iter()
            .all(|r| matches!(r, Ok(o) if o.is_executed()))
    );
}

#[tokio::test]
async fn a_completion_that_waits_for_a_row_changed_meanwhile_completes_it() {
    let f = or_skip!(Fixture::new("pg_plans_raced").await);
    raced("pg_plans_raced", &f.table);
    let results = raced_batch(&f.store, &batch(false)).await.expect("batch");
    assert!(
        waited("pg_plans_raced"),
        "the completion never waited for the racer's row"
    );
    assert!(
        results
            .iter()
            .all(|r| matches!(r, Ok(o) if o.is_executed())),
        "{results:?}"
    );
    for id in 1_000..1_000 + BATCH {
        let (status, outcome) = f.record("pg_plans_raced", id).await.expect("recorded");
        assert_eq!(
            (status.as_str(), outcome),
            ("completed", Some(id.to_string())),
            "key {id}"
        );
    }
}

#[tokio::test]
async fn a_release_that_waits_for_a_row_changed_meanwhile_releases_it() {
    let f = or_skip!(Fixture::new("pg_plans_raced_failing").await);
    raced("pg_plans_raced_failing", &f.table);
    let failed = raced_failing_batch(&f.store, &batch(false)).await;
    assert!(failed.is_err(), "{failed:?}");
    assert!(
        waited("pg_plans_raced_failing"),
        "the release never waited for the racer's row"
    );
    // Every claim released, the raced one too: the keys are fresh again.
    for id in 1_000..1_000 + BATCH {
        assert_eq!(
            f.record("pg_plans_raced_failing", id).await,
            None,
            "key {id}"
        );
    }
}
