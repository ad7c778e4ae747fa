//! PostgreSQL under real contention, real crashes, dropped connections, lock
//! timeouts and a steady stream with expiry: the stress scenarios
//! (`common/stress.rs`) on the server of `DATABASE_URL`, and what is
//! PostgreSQL's own (the stream with sweeping, a duplicate whose body fails).
//! Every claim about effects is read back from the business table, not from
//! idem's own counters.

mod common;

use std::time::Duration;

use common::stress::{self, Crash, Effect, Setup, StressFixture, Way};
use idem_runtime::clock::TimeShift;
use idem_runtime::{
    ClaimOrder, Error, Key, Outcome, PgStore, PgTx, RoundTrips, StoreError, idempotent,
};
use idem_tests::{DropTables, or_skip, pg_pool, pg_url, unique_table};
use serde::{Deserialize, Serialize};
use sqlx::postgres::{PgConnection, PgPool, PgPoolOptions};
use sqlx::{AssertSqlSafe, Postgres, Transaction};

/// The admin pool of the server of `DATABASE_URL`.
struct PgStress {
    admin: PgPool,
}

/// A store on `pool` over the dedup table `dedup`, claiming in `order`.
fn store_for(pool: PgPool, dedup: &str, Way(order, trips): Way) -> PgStore {
    PgStore::from_pool(pool)
        .with_table(dedup)
        .expect("valid table")
        .with_claim_order(order)
        .with_round_trips(trips)
}

impl StressFixture for PgStress {
    type Store = PgStore;
    type Conn = PgConnection;
    /// `pg_backend_pid()`.
    type ConnId = i32;
    type Holder = Transaction<'static, Postgres>;
    type Cleanup = DropTables;

    const PREFIX: &'static str = "pg";
    const LOCK_TIMEOUT: Duration = Duration::from_millis(300);

    async fn admin() -> Option<Self> {
        Some(PgStress {
            admin: pg_pool(8).await?,
        })
    }

    fn drop_later(tables: &[&str]) -> DropTables {
        DropTables::new(tables)
    }

    fn store_on_admin(&self, dedup: &str, order: Way) -> PgStore {
        store_for(self.admin.clone(), dedup, order)
    }

    async fn migrate(store: &PgStore) -> Result<(), StoreError> {
        store.migrate().await
    }

    async fn consumer(dedup: &str, order: Way) -> (PgStore, i32) {
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .connect(&pg_url())
            .await
            .expect("consumer connects");
        let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&pool)
            .await
            .expect("pid");
        (store_for(pool, dedup, order), pid)
    }

    async fn connect(dedup: &str, Way(order, trips): Way) -> Result<PgStore, StoreError> {
        Ok(PgStore::connect(&pg_url())
            .await?
            .with_table(dedup)?
            .with_claim_order(order)
            .with_round_trips(trips))
    }

    async fn lock_waiting(dedup: &str, order: Way) -> Option<PgStore> {
        let pool = PgPoolOptions::new()
            .max_connections(2)
            .after_connect(|conn, _| {
                Box::pin(async move {
                    sqlx::query("SET lock_timeout = '300ms'")
                        .execute(conn)
                        .await?;
                    Ok(())
                })
            })
            .connect(&pg_url())
            .await
            .expect("connect");
        Some(store_for(pool, dedup, order).with_lock_timeout(Self::LOCK_TIMEOUT))
    }

    async fn kill(&self, pid: i32) {
        let killed: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
            .bind(pid)
            .fetch_one(&self.admin)
            .await
            .expect("terminate");
        assert!(killed, "the backend was terminated");
    }

    fn refuses_table(&self, table: &str) -> bool {
        PgStore::from_pool(self.admin.clone())
            .with_table(table)
            .is_err()
    }

    async fn business_table(&self) -> String {
        let t = unique_table("pg_effects");
        sqlx::query(AssertSqlSafe(format!(
            "CREATE TABLE {t} (message_id BIGINT PRIMARY KEY, applied BIGINT NOT NULL)"
        )))
        .execute(&self.admin)
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
            "SELECT column_name::text FROM information_schema.columns
             WHERE table_name = $1 ORDER BY ordinal_position",
        )
        .bind(dedup)
        .fetch_all(&self.admin)
        .await
        .expect("columns")
    }

    async fn hold(&self, dedup: &str, handler: &str, key: &Key) -> Self::Holder {
        let mut holder = self.admin.begin().await.expect("begin");
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {dedup} (handler, key, status, attempts, created_at, updated_at, expires_at)
             VALUES ($1, $2, 'in_progress', 1, 0, 0, 9223372036854775807)"
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

    async fn bump(conn: &mut PgConnection, msg: &Effect) -> Result<i64, sqlx::Error> {
        let sql = format!(
            "INSERT INTO {} (message_id, applied) VALUES ($1, 1)
             ON CONFLICT (message_id) DO UPDATE SET applied = {0}.applied + 1 RETURNING applied",
            msg.table
        );
        sqlx::query_scalar(AssertSqlSafe(sql))
            .bind(msg.message_id)
            .fetch_one(conn)
            .await
    }

    async fn read(conn: &mut PgConnection, msg: &Effect) -> Result<i64, sqlx::Error> {
        let sql = format!("SELECT applied FROM {} WHERE message_id = $1", msg.table);
        sqlx::query_scalar(AssertSqlSafe(sql))
            .bind(msg.message_id)
            .fetch_one(conn)
            .await
    }
}

stress::handlers! {
    PgStress, tx: PgTx, store: "postgres",
    names: { effect: "pg_apply_effect", parked: "pg_apply_parked" },
}

// ---------------------------------------------------------------------------
// The stress scenarios

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn contention_claim_last_applies_each_message_once() {
    stress::contention::<PgStress>(Way::LAST).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn contention_claim_last_merged_applies_each_message_once() {
    stress::contention::<PgStress>(Way::LAST_MERGED).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn contention_claim_first_applies_each_message_once() {
    stress::contention::<PgStress>(Way::FIRST).await;
}

/// The child side of the crash tests: run by the parent as a separate process
/// of this test binary, killed with SIGKILL where it parks.
#[tokio::test]
#[ignore = "run as a child process by the crash tests"]
async fn crash_child() {
    stress::crash_child::<PgStress>().await;
}

/// Postgres rolls back whatever the killed consumer had not committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_inside_the_body_leaves_nothing_and_redelivery_runs_once() {
    stress::crash::<PgStress>(Crash::InsideBody, Way::LAST).await;
    stress::crash::<PgStress>(Crash::InsideBody, Way::FIRST).await;
    stress::crash::<PgStress>(Crash::InsideBody, Way::LAST_MERGED).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_after_commit_before_ack_makes_redelivery_a_duplicate() {
    stress::crash::<PgStress>(Crash::AfterCommit, Way::LAST).await;
    stress::crash::<PgStress>(Crash::AfterCommit, Way::FIRST).await;
    stress::crash::<PgStress>(Crash::AfterCommit, Way::LAST_MERGED).await;
}

/// `pg_terminate_backend` on the consumer's connection while the body is
/// parked in its transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_connection_gives_store_error_and_records_nothing() {
    stress::killed_connection::<PgStress>().await;
}

/// The claim waits on the unique index, `lock_timeout` 300 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_claim_waiting_past_the_lock_timeout_is_in_progress() {
    stress::claim_waiting_past_the_lock_timeout::<PgStress>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn migrate_from_many_processes_at_once() {
    stress::migrate_from_many_connections_at_once::<PgStress>().await;
}

// ---------------------------------------------------------------------------
// PostgreSQL's own
/// A steady stream with a short ttl: expired rows are reclaimed at claim time
/// and swept in bounded batches, so the table stays the size of the window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steady_stream_keeps_the_table_the_size_of_the_window() {
    #[derive(Serialize, Deserialize)]
    struct Tick {
        id: i64,
    }
    #[idempotent(key = "id", ttl = "10s", store = "postgres", name = "pg_stream_tick")]
    async fn tick(msg: &Tick) -> Result<i64, std::io::Error> {
        Ok(msg.id)
    }

    let fx = or_skip!(PgStress::admin().await);
    let dedup = unique_table("pg_stream_dedup");
    let _cleanup = DropTables::new(&[&dedup]);
    let shift = TimeShift::new();
    let store = fx
        .store_on_admin(&dedup, Way::LAST)
        .with_time_shift(shift.clone());
    store.migrate().await.expect("migrate");
    // 100 messages a simulated second for 60 s; the window is 10 s, so the
    // live set is 1,000 rows. Sweep every simulated second in batches of 300.
    let mut counts = Vec::new();
    let mut id = 0;
    for second in 0..60 {
        // The database's time runs on while the messages go in: a simulated
        // second is the shift and that real time together.
        let started = std::time::Instant::now();
        for _ in 0..100 {
            assert!(
                tick(&store, &Tick { id })
                    .await
                    .expect("tick")
                    .is_executed()
            );
            id += 1;
        }
        shift.advance(Duration::from_secs(1).saturating_sub(started.elapsed()));
        loop {
            let n = store.sweep_expired(300).await.expect("sweep");
            assert!(n <= 300, "a batch is bounded");
            if n < 300 {
                break;
            }
        }
        let count = store.count().await.expect("count");
        if second % 10 == 9 {
            counts.push(count);
        }
    }
    eprintln!("rows every 10 simulated seconds: {counts:?}");
    for c in &counts {
        assert!(
            (900..=1_100).contains(c),
            "table size {c} strays from the window"
        );
    }
    // An expired key is reclaimed at claim time even before the sweep.
    assert!(
        tick(&store, &Tick { id: id - 1 })
            .await
            .expect("dup")
            .is_duplicate()
    );
    shift.advance(Duration::from_secs(11));
    assert!(
        tick(&store, &Tick { id: id - 1 })
            .await
            .expect("again")
            .is_executed()
    );
}

/// Takes the whole stock of one row, or refuses when it is gone.
#[idempotent(
    key = "message_id",
    ttl = "1h",
    store = "postgres",
    name = "pg_take_all"
)]
async fn take_all(tx: &mut PgTx<'_>, msg: &Effect) -> Result<i64, TakeError> {
    let sql = format!(
        "UPDATE {} SET applied = 0 WHERE message_id = 1 AND applied > 0 RETURNING 1",
        msg.table
    );
    let taken: Option<i32> = sqlx::query_scalar(AssertSqlSafe(sql))
        .fetch_optional(&mut **tx)
        .await
        .map_err(TakeError::Db)?;
    taken.map(|_| msg.message_id).ok_or(TakeError::NothingLeft)
}

#[derive(Debug, thiserror::Error)]
enum TakeError {
    #[error("nothing left")]
    NothingLeft,
    #[error(transparent)]
    Db(sqlx::Error),
}

/// Claiming last, a duplicate's body runs before the claim can turn it away,
/// and may fail because the first delivery already took effect. The call must
/// still answer with the recorded outcome, not the body's error, or the
/// consumer would retry a processed message forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_whose_body_fails_gets_the_recorded_outcome() {
    for order in [Way::LAST, Way::FIRST, Way::LAST_MERGED] {
        let Setup {
            fx,
            table,
            store,
            _cleanup,
            ..
        } = or_skip!(stress::setup::<PgStress>("takeall_dedup", order).await);
        sqlx::query(AssertSqlSafe(format!("INSERT INTO {table} VALUES (1, 5)")))
            .execute(&fx.admin)
            .await
            .expect("stock");
        let msg = Effect::new(&table, 42);
        assert_eq!(
            take_all(&store, &msg).await.expect("first"),
            Outcome::Executed(42)
        );
        for _ in 0..3 {
            match take_all(&store, &msg).await {
                Ok(Outcome::Duplicate(42)) => {}
                other => panic!("{order:?}: expected the recorded outcome, got {other:?}"),
            }
        }
        // A different message finds nothing left: that error is the body's.
        let other = Effect {
            message_id: 43,
            ..msg.clone()
        };
        assert!(matches!(
            take_all(&store, &other).await,
            Err(Error::Handler {
                error: TakeError::NothingLeft,
                ..
            })
        ));
        assert_eq!(fx.applied(&table).await, vec![(1, 0)]);
    }
}

#[idempotent(
    key = "message_id",
    ttl = "1h",
    store = "postgres",
    name = "pg_deferred_unique"
)]
async fn insert_twice_deferred(tx: &mut PgTx<'_>, msg: &Effect) -> Result<i64, sqlx::Error> {
    let sql = format!("INSERT INTO {}_deferred VALUES (1), (1)", msg.table);
    sqlx::query(AssertSqlSafe(sql)).execute(&mut **tx).await?;
    Ok(msg.message_id)
}

/// A body whose deferred unique constraint only the `COMMIT` checks: in
/// every way of sending the dedup row (in the `COMMIT`'s message too, where
/// the error is a unique violation like a standing record's), the call
/// fails with the database's error, and nothing commits, neither the
/// body's rows nor a record.
#[tokio::test]
async fn a_deferred_constraint_the_commit_breaks_is_a_store_error_and_nothing_commits() {
    for way in [Way::LAST, Way::FIRST, Way::LAST_MERGED] {
        let Setup {
            fx,
            table,
            store,
            _cleanup,
            ..
        } = or_skip!(stress::setup::<PgStress>("deferred", way).await);
        let deferred = format!("{table}_deferred");
        let _drop_deferred = DropTables::new(&[&deferred]);
        sqlx::query(AssertSqlSafe(format!(
            "CREATE TABLE {deferred} (v INT UNIQUE DEFERRABLE INITIALLY DEFERRED)"
        )))
        .execute(&fx.admin)
        .await
        .expect("create");
        let msg = Effect::new(&table, 7);
        match insert_twice_deferred(&store, &msg).await {
            Err(Error::Store { source, .. }) => assert!(
                source.to_string().contains("duplicate key"),
                "{way:?}: expected the deferred constraint's error, got {source}"
            ),
            other => panic!("{way:?}: expected a store error, got {other:?}"),
        }
        let rows: i64 =
            sqlx::query_scalar(AssertSqlSafe(format!("SELECT COUNT(*) FROM {deferred}")))
                .fetch_one(&fx.admin)
                .await
                .expect("count");
        assert_eq!(rows, 0, "{way:?}: the body's rows committed");
        assert_eq!(
            store.count().await.expect("count"),
            0,
            "{way:?}: a record committed"
        );
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct Sabotage {
    message_id: i64,
    /// The business table the body writes.
    table: String,
    /// The dedup table whose rows the body deletes.
    dedup: String,
}

#[idempotent(
    key = "message_id",
    ttl = "1h",
    store = "postgres",
    name = "pg_body_deletes_the_claim"
)]
async fn deletes_the_claim_row(tx: &mut PgTx<'_>, msg: &Sabotage) -> Result<i64, sqlx::Error> {
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO {} VALUES ($1, 1)",
        msg.table
    )))
    .bind(msg.message_id)
    .execute(&mut **tx)
    .await?;
    sqlx::query(AssertSqlSafe(format!("DELETE FROM {}", msg.dedup)))
        .execute(&mut **tx)
        .await?;
    Ok(msg.message_id)
}

/// Claiming first, a body that deletes its own claim row, the transaction
/// still open (as a transaction the database ended would leave it): the
/// outcome's `UPDATE` finds no row, the call says so, and nothing the body
/// wrote commits, whatever `RoundTrips` says.
#[tokio::test]
async fn claiming_first_a_claim_row_the_body_deleted_commits_nothing() {
    for way in [Way::FIRST, Way(ClaimOrder::First, RoundTrips::Merged)] {
        let Setup {
            fx,
            dedup,
            table,
            store,
            _cleanup,
        } = or_skip!(stress::setup::<PgStress>("deleted", way).await);
        let msg = Sabotage {
            message_id: 11,
            table: table.clone(),
            dedup,
        };
        match deletes_the_claim_row(&store, &msg).await {
            Err(Error::Store { source, .. }) => assert!(
                source
                    .to_string()
                    .contains("claim row of this transaction is gone"),
                "{way:?}: {source}"
            ),
            other => panic!("{way:?}: expected a store error, got {other:?}"),
        }
        assert!(
            fx.applied(&table).await.is_empty(),
            "{way:?}: the body's write committed"
        );
        assert_eq!(
            store.count().await.expect("count"),
            0,
            "{way:?}: a record committed"
        );
    }
}

/// A table name as long as PostgreSQL allows (63 bytes) still gets its
/// expiry index, under a name of its own: `<table>_expires_at` would be cut
/// to the table's own name and silently skipped.
#[tokio::test]
async fn the_longest_table_name_gets_its_expiry_index() {
    let admin = or_skip!(pg_pool(2).await);
    let stem = unique_table("pg_long");
    let table = format!("{stem}_{}", "z".repeat(62 - stem.len()));
    assert_eq!(table.len(), 63);
    let store = PgStore::from_pool(admin.clone())
        .with_table(&table)
        .expect("a valid name");
    // The outbox table's name is derived (the table's is too long for a
    // suffix): the store says it.
    let outbox = store.outbox_table();
    let _cleanup = DropTables::new(&[&table, outbox.name()]);
    store.migrate().await.expect("migrate");
    store.migrate().await.expect("migrate again");
    let indexes: Vec<String> = sqlx::query_scalar(
        "SELECT indexname::text FROM pg_indexes WHERE tablename = $1 ORDER BY indexname",
    )
    .bind(&table)
    .fetch_all(&admin)
    .await
    .expect("indexes");
    assert_eq!(
        indexes.len(),
        2,
        "primary key and expiry index: {indexes:?}"
    );
    assert!(
        indexes.iter().any(|i| i.ends_with("_expires_at")),
        "{indexes:?}"
    );
}
