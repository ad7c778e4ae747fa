//! The SQL stores: one store, [`SqlStore`], written once over a small
//! [`Dialect`] trait that says what differs between SQLite, PostgreSQL and
//! MySQL/MariaDB.
//!
//! [`SqliteStore`](crate::SqliteStore), [`PgStore`](crate::PgStore) and
//! [`MySqlStore`](crate::MySqlStore) are `SqlStore<Sqlite>`,
//! `SqlStore<Postgres>` and `SqlStore<MySql>`; the dialect parameter is sqlx's
//! own database type.
//!
//! * **Here, once:** the lease claim with its retries, what a lost claim
//!   reports (`Standing`), the transaction-mode claim (first or last, see
//!   [`ClaimOrder`]), record decoding, error mapping, and the methods every
//!   SQL store has (`record`, `count`, `sweep_expired`, `with_table`, ...).
//! * **Time is the database's:** every statement reads the database's clock
//!   ([`Dialect::NOW`]) and computes a lease's or a record's end from it in
//!   SQL, from durations the store binds (`:hold`, `:ttl`); where the store
//!   decides in Rust (what a record that stands says to a delivery, a
//!   batch's reads, the operator's reads), the statement that read the
//!   record read the database's now with it. The consumer's clock is never
//!   read, so consumers whose clocks disagree still agree on who holds a
//!   lease.
//! * **In the dialect** (`dialect.rs`, implemented in `sqlite.rs`,
//!   `postgres.rs`, `mysql.rs` beside it): the statements that differ
//!   (create, claim, sweep), how a claim's transaction begins, how a lock
//!   wait, a deadlock, a busy database and a missing table show in its
//!   errors, and its affected-rows count.
//! * **In each store's module:** what shares nothing: connecting, and
//!   `migrate` (SQLite's file, Postgres's advisory lock, MySQL's named lock).
//!
//! The execution is generic too, not repeated per dialect: the sqlx bounds it
//! takes are stated once, on one blanket impl (`exec.rs`), and binding goes by
//! name (`template.rs`), so MySQL's positional `?` and Postgres's `$1` take
//! the same statements and values. Dialects hold no execution code at all,
//! which kept each of them to its SQL and its error codes.
//!
//! The files, each using only those above it (`batch.rs` and `inspect.rs`
//! are more of `SqlStore`'s methods, beside `mod.rs`):
//!
//! ```text
//! template.rs    the template language: `:name` parameters, placeholders, literals
//! rows.rs        the dedup row's SQL: columns, what a claim writes, when it may take a row
//! table.rs       the table's name: the default, the check
//! partitions.rs  PostgreSQL's partitioned table: the option, its SQL
//! exec.rs        what the store needs of a sqlx driver: bind, run, decode
//! dialect.rs     the Dialect trait: what differs between the databases
//! statements.rs  the statements of one store, built once per table
//! mod.rs         SqlStore: the claim loop, both modes, LeaseStore and TxStore
//! batch.rs       SqlStore's batches         inspect.rs  SqlStore's Inspect
//! sqlite.rs, postgres.rs, mysql.rs: each database's Dialect, constructors, migrate()
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sqlx::{Pool, Transaction};

use crate::clock::millis;
use crate::error::{Contention, StoreError};
use crate::key::Key;
use crate::registry::HandlerSpec;
use crate::store::contract::{
    BatchItem, Claim, Failure, Held, LeaseStore, Standing, TxBatch, TxBatchCommit, TxClaim,
    TxCommit, TxStore,
};
use crate::store::rules::{live_standing, may_take};
use crate::store::{Record, Status, Sweep};

mod batch;
mod dialect;
mod exec;
mod inspect;
#[cfg(feature = "mysql")]
#[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
pub mod mysql;
mod partitions;
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub mod postgres;
#[cfg(feature = "kafka")]
pub(crate) mod rider;
mod rows;
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub mod sqlite;
mod statements;
mod table;
mod template;

pub use dialect::Dialect;
use dialect::Fault;
use exec::Found;
pub use partitions::Partitions;
use statements::{Statements, Sweeping, Take};
use table::{DEFAULT_TABLE, bare, validate_table_name};
use template::{Statement, Values};

/// The version of the dedup table this release writes and reads: 1 was
/// the first release's; 2 added `failures`, `last_error` and `fingerprint`;
/// 3 added `max_attempts` (the handler's limit, as each claim writes it, so
/// that operators' tools can tell a key that used up its attempts).
/// `migrate()` adds what a table of an earlier version lacks.
///
/// # Examples
///
/// A start-up check that the table is this release's (`migrate()` upgrades
/// it in place otherwise):
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// use idem_runtime::store::sql::SCHEMA_VERSION;
///
/// let store = idem_runtime::SqliteStore::open(dir.path().join("idem.db")).await?;
/// store.migrate().await?;
/// assert_eq!(store.schema_version().await?, Some(SCHEMA_VERSION));
/// # Ok(()) }
/// ```
pub const SCHEMA_VERSION: u32 = 3;

/// How often a lease claim retries when the record it lost to vanished
/// before it could be read (released or swept in between), or when the
/// database chose it as a deadlock victim.
const CLAIM_RETRIES: usize = 8;

/// How often a statement that runs on its own (completion, release, lease
/// extension, sweep) runs again after the database chose it as a deadlock
/// victim and rolled it back.
const DEADLOCK_RETRIES: usize = 3;

/// How many steps of a partitioned table's upkeep that removed no rows
/// (partitions made, empty ones dropped) one sweep takes at most before it
/// answers.
const MAINTENANCE_STEPS: usize = 32;

/// Marks where a claim's body begins in its transaction (a handler that
/// counts failures). Sent as text, not prepared: MySQL 8.0 does not prepare
/// savepoint statements.
const SAVEPOINT: &str = "SAVEPOINT idem_body";

/// Undoes the body's writes, keeping the claim.
const ROLLBACK_TO_SAVEPOINT: &str = "ROLLBACK TO SAVEPOINT idem_body";

/// When a transaction-mode handler writes its dedup row (PostgreSQL and
/// MySQL; SQLite always claims first).
///
/// Every order keeps the invariant: the row, the body's writes and the outcome
/// commit together or not at all. They differ in what a duplicate costs and
/// whether its body runs:
///
/// | order | a fresh message | a duplicate of a settled key | a duplicate while the first is open |
/// | --- | --- | --- | --- |
/// | [`Last`](Self::Last) | 1 statement (none more, merged into the `COMMIT`) | its body runs, then rolls back | its body runs, then waits and rolls back |
/// | [`Checked`](Self::Checked) | 2 statements: a read, the insert | turned away before its body | its body runs, then waits and rolls back |
/// | [`First`](Self::First) | 2 statements: the claim, the outcome | turned away before its body | waits for the first, its body never runs |
///
/// "Settled" is a recorded outcome, a recorded final error, a record of
/// another payload (`Error::PayloadMismatch`) or a record that does not
/// decode. What each costs on this machine is in
/// [`guide::benchmarks`](crate::guide::benchmarks). A batch handler reads
/// its keys' records before its body whatever the order, and gives the body
/// only the fresh messages ([`guide::batches`](crate::guide::batches)).
///
/// # Examples
///
/// ```
/// // `idem_runtime::ClaimOrder` with the feature `postgres` or `mysql`
/// use idem_runtime::store::sql::ClaimOrder;
/// assert_eq!(ClaimOrder::default(), ClaimOrder::Last);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ClaimOrder {
    /// After the body, in one statement that carries the outcome: one extra
    /// statement a fresh message. A duplicate's body runs and is rolled back
    /// when the insert finds the row. The default: it is the faster one
    /// ([`guide::benchmarks`](crate::guide::benchmarks)).
    #[default]
    Last,
    /// After the body, as [`Last`](Self::Last), with a read of the key's
    /// record before it (a `SELECT` by primary key, without a lock): a
    /// delivery of a key that is settled (the redelivery after a crash or a
    /// rebalance, the usual duplicate) is answered before its body runs. One
    /// statement more than `Last` a message, and no lock is held across the
    /// body; only a duplicate that arrives while the first delivery's
    /// transaction is still open runs its body, which then rolls back.
    Checked,
    /// Before the body, with the outcome written by an `UPDATE` before the
    /// commit: two extra statements a fresh message, but a duplicate is turned
    /// away before its body runs. Choose it when a duplicate body is expensive
    /// or has effects a rollback does not undo (sequence values, `NOTIFY`
    /// delivered at commit are fine; calls to other systems are not).
    First,
}

/// How a transaction-mode handler's dedup row travels to the database
/// (PostgreSQL and MySQL; SQLite, in the consumer's process, always runs
/// it as a statement of its own).
///
/// In either way the invariant holds: the row, the body's writes and the
/// outcome commit together or not at all. The default is chosen by
/// measurement (`bench_postgres`, `bench_mysql`): on PostgreSQL `Merged`
/// for a server across a network and `Separate` for one on the consumer's
/// host (a loopback address, `localhost`, a Unix socket), where the two
/// share the CPU; on MySQL/MariaDB `Separate`, whose server spends more on
/// the unprepared statement than the round trip saves. The figures are in
/// [benchmarks](crate::guide::benchmarks).
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use idem_runtime::{PgStore, RoundTrips};
/// use sqlx::postgres::PgPoolOptions;
///
/// let remote = PgPoolOptions::new().connect_lazy("postgres://app@db.internal/shop")?;
/// assert_eq!(PgStore::from_pool(remote).round_trips(), RoundTrips::Merged);
/// let local = PgPoolOptions::new().connect_lazy("postgres://app@127.0.0.1/shop")?;
/// assert_eq!(PgStore::from_pool(local.clone()).round_trips(), RoundTrips::Separate);
/// // a choice of its own, whatever the host
/// let store = PgStore::from_pool(local).with_round_trips(RoundTrips::Merged);
/// assert_eq!(store.round_trips(), RoundTrips::Merged);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoundTrips {
    /// Claiming last, the dedup row is a plain `INSERT` in the message that
    /// carries the `COMMIT`, its values written in as literals the runtime
    /// encoded (text as hex digits): a fresh message costs the round trips
    /// of its business transaction and no more. When a record of the key
    /// stands, the `INSERT` fails alone and the store claims as
    /// [`Separate`](Self::Separate) does: a duplicate costs at most one round
    /// trip more than there. Claiming first, nothing changes. PostgreSQL's
    /// default for a server that is not on the consumer's host; round trips
    /// and measurements in [`guide::postgres`](crate::guide::postgres).
    Merged,
    /// The dedup row is a prepared statement of its own: one more round
    /// trip per fresh message, the least CPU on the server, and no error in
    /// the server's log for a duplicate. For a database on the consumer's
    /// host, where a round trip costs less than parsing a statement (and
    /// the database and the consumer share its CPU). MySQL's default, and
    /// PostgreSQL's on a loopback address, `localhost` or a Unix socket.
    Separate,
}

/// A SQL store: the dedup table in a SQLite, PostgreSQL or MySQL/MariaDB
/// database, through sqlx. Use it by its names [`SqliteStore`](crate::SqliteStore),
/// [`PgStore`](crate::PgStore) and [`MySqlStore`](crate::MySqlStore); each
/// store's page says how it connects, migrates and waits.
///
/// * **Transaction mode** (a handler whose first parameter is the store's
///   transaction): the dedup row, the body's writes and the outcome commit in
///   one transaction, or nothing does.
/// * **Lease mode** (no transaction parameter): the claim takes an absent or
///   expired key with a fencing token; completion, release and lease
///   extension compare the token.
///
/// Expired records are reclaimed at claim time; [`sweep_expired`] and
/// [`Sweeper`](crate::Sweeper) delete them in bounded batches.
///
/// Times (`created_at`, `updated_at`, `expires_at`, in ms since the epoch)
/// are the database's clock, read in each statement
/// ([`Dialect::NOW`]): a consumer whose clock is off neither takes over a
/// live lease nor writes times into the future or the past. A test moves
/// the store's time with `with_time_shift` (feature `test-util`).
///
/// [`sweep_expired`]: SqlStore::sweep_expired
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// use idem_runtime::store::sql::SqlStore;
/// use idem_runtime::SqliteStore;
///
/// let store: SqlStore<sqlx::Sqlite> = SqliteStore::open(dir.path().join("idem.db")).await?;
/// store.migrate().await?;
/// assert_eq!(store.count().await?, 0);
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct SqlStore<D: Dialect> {
    pool: Pool<D>,
    sql: Arc<Statements>,
    /// What tests add to the database's clock (feature `test-util`).
    #[cfg(feature = "test-util")]
    shift: crate::clock::TimeShift,
    /// How long a statement waits on a lock before it gives up, in ms: what
    /// the store was told, or, on SQLite, what the connections report.
    lock_timeout_ms: Arc<AtomicU64>,
    order: ClaimOrder,
    trips: RoundTrips,
    /// How the table is partitioned, where it is (PostgreSQL).
    partitions: Option<Partitions>,
}

impl<D: Dialect> Clone for SqlStore<D> {
    fn clone(&self) -> Self {
        SqlStore {
            pool: self.pool.clone(),
            sql: Arc::clone(&self.sql),
            #[cfg(feature = "test-util")]
            shift: self.shift.clone(),
            lock_timeout_ms: Arc::clone(&self.lock_timeout_ms),
            order: self.order,
            trips: self.trips,
            partitions: self.partitions,
        }
    }
}

/// Who a claim statement's race for the key went to.
enum Race {
    /// This delivery: it took the key.
    Won,
    /// A live record stands: this one (with the database's now when it was
    /// read), or none when it vanished before it could be read.
    Lost(Option<Box<Found>>),
}

impl<D: Dialect> SqlStore<D> {
    /// A store on `pool` and the default table.
    pub(crate) fn new(pool: Pool<D>, lock_timeout: Duration, order: ClaimOrder) -> Self {
        SqlStore {
            pool,
            sql: Arc::new(Statements::new::<D>(DEFAULT_TABLE, None)),
            #[cfg(feature = "test-util")]
            shift: crate::clock::TimeShift::default(),
            lock_timeout_ms: Arc::new(AtomicU64::new(millis_u64(lock_timeout))),
            order,
            trips: RoundTrips::Separate,
            partitions: None,
        }
    }

    /// The sqlx pool, for the application's own queries.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = tempfile::tempdir()?;
    /// # let store = idem_runtime::SqliteStore::open(dir.path().join("idem.db")).await?;
    /// sqlx::query("CREATE TABLE IF NOT EXISTS shipments (order_id BIGINT PRIMARY KEY)")
    ///     .execute(store.pool())
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn pool(&self) -> &Pool<D> {
        &self.pool
    }

    /// The dedup table's name.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = tempfile::tempdir()?;
    /// # let store = idem_runtime::SqliteStore::open(dir.path().join("idem.db")).await?;
    /// assert_eq!(store.table(), "idem_keys");
    /// # Ok(()) }
    /// ```
    pub fn table(&self) -> &str {
        &self.sql.table
    }

    /// Uses `table` instead of `idem_keys`: a plain identifier, optionally
    /// `schema.table` (see [`validate_table_name`](Self::validate_table_name)).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let pool = sqlx::SqlitePool::connect("sqlite::memory:").await?;
    /// let store = idem_runtime::SqliteStore::from_pool(pool).with_table("orders_dedup")?;
    /// assert_eq!(store.table(), "orders_dedup");
    /// assert!(store.clone().with_table("x; --").is_err());
    /// # Ok(()) }
    /// ```
    pub fn with_table(mut self, table: &str) -> Result<Self, StoreError> {
        validate_table_name(table)?;
        self.sql = Arc::new(Statements::new::<D>(table, self.partitions));
        Ok(self)
    }

    /// Checks a table name: ASCII letters, digits and `_`, optionally
    /// `schema.table`, each part at most 63 bytes and not starting with a digit.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::SqliteStore;
    ///
    /// assert!(SqliteStore::validate_table_name("orders_dedup").is_ok());
    /// assert!(SqliteStore::validate_table_name("main.orders_dedup").is_ok());
    /// assert!(SqliteStore::validate_table_name("orders-dedup").is_err());
    /// assert!(SqliteStore::validate_table_name("1st").is_err());
    /// ```
    pub fn validate_table_name(table: &str) -> Result<(), StoreError> {
        validate_table_name(table)
    }

    /// Moves this store's time by `shift` (and by whatever it is advanced
    /// later): every statement reads the database's clock plus the shift's
    /// offset, bound as a parameter. For tests only (feature `test-util`,
    /// as tokio's): a test of expiry or of a lease running out moves time
    /// without waiting. The database's clock still runs; the shift only
    /// adds to it. Clones of the store, and of the shift, share it.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = tempfile::tempdir()?;
    /// # let store = idem_runtime::SqliteStore::open(dir.path().join("idem.db")).await?;
    /// # store.migrate().await?;
    /// use idem_runtime::clock::TimeShift;
    /// use std::time::Duration;
    ///
    /// let shift = TimeShift::new();
    /// let store = store.with_time_shift(shift.clone());
    /// // a day later, for this store: day-long records are expired
    /// shift.advance(Duration::from_secs(86_400));
    /// store.sweep_expired(1_000).await?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "test-util")]
    #[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
    #[must_use]
    pub fn with_time_shift(mut self, shift: crate::clock::TimeShift) -> Self {
        self.shift = shift;
        self
    }

    /// The values every statement of this store binds: the test shift, if
    /// any, and nothing else yet.
    fn values<'a>(&self) -> Values<'a> {
        Values {
            #[cfg(feature = "test-util")]
            shift: self.shift.millis(),
            ..Values::default()
        }
    }

    /// Deletes at most `batch` expired records, oldest first; returns how
    /// many.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = tempfile::tempdir()?;
    /// # let store = idem_runtime::SqliteStore::open(dir.path().join("idem.db")).await?;
    /// # store.migrate().await?;
    /// let deleted = store.sweep_expired(1_000).await?;
    /// assert_eq!(deleted, 0); // nothing has expired yet
    /// # Ok(()) }
    /// ```
    pub async fn sweep_expired(&self, batch: u32) -> Result<u64, StoreError> {
        let by_partitions = self.swept_by_partitions().await?;
        self.sweep_step(batch, by_partitions).await
    }

    /// One sweep of at most `batch` rows, by partitions or by a delete as
    /// [`swept_by_partitions`](Self::swept_by_partitions) answered.
    pub(crate) async fn sweep_step(
        &self,
        batch: u32,
        by_partitions: bool,
    ) -> Result<u64, StoreError> {
        let values = Values {
            batch: i64::from(batch),
            ..self.values()
        };
        match (&self.sql.sweep, by_partitions) {
            (Sweeping::Delete(delete), _) | (Sweeping::Either { delete, .. }, false) => {
                self.write(delete, &values, D::SWEEP_BEGIN).await
            }
            (Sweeping::Maintain(call), _) | (Sweeping::Either { maintain: call, .. }, true) => {
                self.maintain(call, &values).await
            }
        }
    }

    /// Whether the table is swept by partitions: a store opened with them,
    /// or one opened without them on a table partitioned since (asked of
    /// the database, where it has partitions).
    pub(crate) async fn swept_by_partitions(&self) -> Result<bool, StoreError> {
        match &self.sql.sweep {
            Sweeping::Delete(_) => Ok(false),
            Sweeping::Maintain(_) => Ok(true),
            Sweeping::Either { partitioned, .. } => {
                let mut conn = self.pool.acquire().await.map_err(|e| self.err(e))?;
                let answer = D::number(&mut conn, partitioned, &self.values())
                    .await
                    .map_err(|e| self.err(e))?;
                Ok(answer > 0)
            }
        }
    }

    /// Sweeps a partitioned table by its maintenance function's steps
    /// (`call`): as many rows as it removed.
    async fn maintain(&self, call: &Statement, values: &Values<'_>) -> Result<u64, StoreError> {
        let mut conn = self.pool.acquire().await.map_err(|e| self.err(e))?;
        // Each step is a statement, and so a transaction, of its own: a
        // partition made or dropped releases the table's lock before the
        // next step. A bound on the steps keeps a call short (a partition
        // a step).
        for _ in 0..MAINTENANCE_STEPS {
            let removed = D::number(&mut conn, call, values)
                .await
                .map_err(|e| self.err(e))?;
            if removed >= 0 {
                return Ok(u64::try_from(removed).unwrap_or(0));
            }
        }
        Ok(0)
    }

    /// The record of `key` under handler `handler`, if any.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = tempfile::tempdir()?;
    /// # let store = idem_runtime::SqliteStore::open(dir.path().join("idem.db")).await?;
    /// # store.migrate().await?;
    /// use idem_runtime::Key;
    ///
    /// let key = Key::from_parts(&[&1u64, &"apple"])?;
    /// match store.record("deduct_stock", &key).await? {
    ///     Some(r) => println!("{:?} at {}: {:?}", r.status, r.updated_at_ms, r.outcome),
    ///     None => println!("not seen within its ttl"),
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn record(&self, handler: &str, key: &Key) -> Result<Option<Record>, StoreError> {
        Ok(self.found(handler, key).await?.map(|found| found.record))
    }

    /// The record of `key` under `handler`, with the database's now.
    async fn found(&self, handler: &str, key: &Key) -> Result<Option<Found>, StoreError> {
        let values = self.stamped(handler, key, Duration::ZERO)?;
        let mut conn = self.pool.acquire().await.map_err(|e| self.err(e))?;
        D::fetch(&mut conn, &self.sql.select, &values)
            .await
            .map_err(|e| self.err(e))
    }

    /// How many records the table holds, expired or not.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = tempfile::tempdir()?;
    /// # let store = idem_runtime::SqliteStore::open(dir.path().join("idem.db")).await?;
    /// # store.migrate().await?;
    /// assert_eq!(store.count().await?, 0);
    /// # Ok(()) }
    /// ```
    pub async fn count(&self) -> Result<i64, StoreError> {
        let mut conn = self.pool.acquire().await.map_err(|e| self.err(e))?;
        D::number(&mut conn, &self.sql.count, &Values::default())
            .await
            .map_err(|e| self.err(e))
    }

    /// The version of this store's table: [`SCHEMA_VERSION`] once
    /// migrated by this release; an earlier one (1 for a table of the first
    /// release, 2 for one without `max_attempts`), which `migrate` upgrades
    /// in place; `None` when there is no table.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = tempfile::tempdir()?;
    /// use idem_runtime::store::sql::SCHEMA_VERSION;
    ///
    /// let store = idem_runtime::SqliteStore::open(dir.path().join("idem.db")).await?;
    /// assert_eq!(store.schema_version().await?, None);
    /// store.migrate().await?;
    /// assert_eq!(store.schema_version().await?, Some(SCHEMA_VERSION));
    /// # Ok(()) }
    /// ```
    pub async fn schema_version(&self) -> Result<Option<u32>, StoreError> {
        let mut conn = self.pool.acquire().await.map_err(|e| self.err(e))?;
        let columns = D::texts(&mut conn, &self.sql.columns)
            .await
            .map_err(|e| self.err(e))?;
        if columns.is_empty() {
            return Ok(None);
        }
        // The last version whose columns, and every earlier one's, are all there.
        let has = |column: &str| columns.iter().any(|c| c.eq_ignore_ascii_case(column));
        let complete = |version: u32| {
            self.sql
                .upgrades
                .iter()
                .filter(|(added_in, _, _)| *added_in == version)
                .all(|(_, column, _)| has(column))
        };
        Ok(Some(
            (2..=SCHEMA_VERSION)
                .take_while(|v| complete(*v))
                .last()
                .unwrap_or(1),
        ))
    }

    /// The statements adding the columns of this release that `columns`
    /// (a table's) lacks.
    fn missing_columns<'s>(
        &'s self,
        columns: &'s [String],
    ) -> impl Iterator<Item = &'s Statement> + 's {
        self.sql
            .upgrades
            .iter()
            .filter(|(_, column, _)| !columns.iter().any(|c| c.eq_ignore_ascii_case(column)))
            .map(|(_, _, add)| add)
    }

    /// Adds the columns a table of an earlier release lacks, on `conn`,
    /// which holds the store's migration lock. The columns are added with
    /// defaults that read as "no failure, no fingerprint, limit unknown", so
    /// every record keeps its meaning and goes on suppressing its
    /// duplicates.
    pub(crate) async fn upgrade(&self, conn: &mut D::Connection) -> Result<(), StoreError> {
        let columns = D::texts(conn, &self.sql.columns)
            .await
            .map_err(|e| self.err(e))?;
        for add in self.missing_columns(&columns) {
            D::run(conn, add, &Values::default())
                .await
                .map_err(|e| self.err(e))?;
        }
        Ok(())
    }

    /// The statements that create the table and its index, for the store
    /// modules' `migrate`.
    pub(crate) fn create_sql(&self) -> &Arc<str> {
        &self.sql.create
    }

    /// How long a statement waits on a lock before it gives up.
    pub(crate) fn lock_timeout(&self) -> Duration {
        Duration::from_millis(self.lock_timeout_ms.load(Ordering::Relaxed))
    }

    /// Sets the lock timeout this store reports, for this store and the
    /// clones made from it from now on.
    #[cfg(any(feature = "postgres", feature = "mysql"))]
    pub(crate) fn set_lock_timeout(mut self, timeout: Duration) -> Self {
        self.lock_timeout_ms = Arc::new(AtomicU64::new(millis_u64(timeout)));
        self
    }

    /// Records the lock timeout the connections report (SQLite).
    #[cfg(feature = "sqlite")]
    pub(crate) fn learn_lock_timeout(&self, timeout: Duration) {
        self.lock_timeout_ms
            .store(millis_u64(timeout), Ordering::Relaxed);
    }

    /// Sets when transaction-mode handlers write their dedup row.
    #[cfg(any(feature = "postgres", feature = "mysql"))]
    pub(crate) fn set_claim_order(mut self, order: ClaimOrder) -> Self {
        self.order = order;
        self
    }

    /// Partitions the table as `partitions` says (a dialect with
    /// partitions: PostgreSQL).
    #[cfg(feature = "postgres")]
    pub(crate) fn set_partitions(mut self, partitions: Option<Partitions>) -> Self {
        self.partitions = partitions;
        self.sql = Arc::new(Statements::new::<D>(&self.sql.table, partitions));
        self
    }

    /// How the table is partitioned, if it is.
    #[cfg(feature = "postgres")]
    pub(crate) fn partitioning(&self) -> Option<Partitions> {
        self.partitions
    }

    /// Sets how transaction-mode handlers send their dedup row.
    #[cfg(any(feature = "postgres", feature = "mysql"))]
    pub(crate) fn set_round_trips(mut self, trips: RoundTrips) -> Self {
        self.trips = trips;
        self
    }

    /// How transaction-mode handlers send their dedup row: what the store
    /// was told, on a database that can merge it into the `COMMIT`
    /// ([`RoundTrips::Separate`] on one that cannot).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = tempfile::tempdir()?;
    /// use idem_runtime::{RoundTrips, SqliteStore};
    ///
    /// let store = SqliteStore::open(dir.path().join("idem.db")).await?;
    /// assert_eq!(store.round_trips(), RoundTrips::Separate);
    /// # Ok(()) }
    /// ```
    pub fn round_trips(&self) -> RoundTrips {
        match self.sql.claim_with_commit {
            Some(_) => self.trips,
            None => RoundTrips::Separate,
        }
    }

    /// The values of a statement on `key` of `handler`, with `hold` how
    /// long a lease or record it writes lasts from the database's now
    /// (`{until}`).
    fn stamped<'a>(
        &self,
        handler: &'a str,
        key: &'a Key,
        hold: Duration,
    ) -> Result<Values<'a>, StoreError> {
        self.check_handler(handler)?;
        Ok(Values {
            handler,
            key: key.as_str(),
            hold: millis(hold),
            ..self.values()
        })
    }

    /// Refuses a handler name longer than the table holds.
    fn check_handler(&self, handler: &str) -> Result<(), StoreError> {
        if handler.len() > D::MAX_HANDLER_LEN {
            return Err(StoreError::Schema(format!(
                "handler name {handler:?} is {} bytes long; the {} store's table holds at most {}",
                handler.len(),
                D::STORE,
                D::MAX_HANDLER_LEN
            )));
        }
        Ok(())
    }

    /// Runs `take` on `conn`: inserts the claim row, or takes over one a
    /// claim may take (see [`rows::claimable`]); otherwise reads the
    /// record that stands.
    async fn take(
        &self,
        conn: &mut D::Connection,
        take: &Take,
        spec: &HandlerSpec,
        values: &Values<'_>,
    ) -> Result<Race, sqlx::Error> {
        if D::rows_affected(&D::run(conn, &take.insert, values).await?) > 0 {
            return Ok(Race::Won);
        }
        let standing = D::fetch(conn, &self.sql.select_latest, values).await?;
        match (&take.take_over, standing) {
            (Some(take_over), Some(standing))
                if may_take(&standing.record, standing.now, spec, values.fingerprint) =>
            {
                if D::rows_affected(&D::run(conn, take_over, values).await?) > 0 {
                    return Ok(Race::Won);
                }
                // Another claim took it over first: what stands now.
                Ok(Race::Lost(
                    D::fetch(conn, &self.sql.select_latest, values)
                        .await?
                        .map(Box::new),
                ))
            }
            (_, standing) => Ok(Race::Lost(standing.map(Box::new))),
        }
    }

    /// Runs `statement` on its own (or in a transaction opened with `begin`)
    /// and returns how many rows it wrote. A deadlock victim, which the
    /// database rolled back whole, runs again.
    async fn write(
        &self,
        statement: &Statement,
        values: &Values<'_>,
        begin: Option<&'static str>,
    ) -> Result<u64, StoreError> {
        let mut tries = 0;
        loop {
            let done = match begin {
                None => match self.pool.acquire().await {
                    Ok(mut conn) => D::run(&mut conn, statement, values).await,
                    Err(e) => Err(e),
                },
                Some(begin) => match self.pool.begin_with(begin).await {
                    Ok(mut tx) => match D::run(&mut tx, statement, values).await {
                        Ok(done) => tx.commit().await.map(|()| done),
                        Err(e) => {
                            // Now, not when the connection is next used.
                            let _ = tx.rollback().await;
                            Err(e)
                        }
                    },
                    Err(e) => Err(e),
                },
            };
            match done {
                Ok(done) => return Ok(D::rows_affected(&done)),
                Err(e) if tries < DEADLOCK_RETRIES && fault::<D>(&e) == Fault::Deadlock => {
                    tries += 1;
                }
                Err(e) => return Err(self.err(e)),
            }
        }
    }

    /// What a record that did not let a claim take the key says to a
    /// delivery with `fingerprint`, at the database's now when the record
    /// was read; `None` when the record has changed since (expired, or
    /// claimable after all): the claim may be tried again.
    fn standing(
        &self,
        found: Option<Found>,
        spec: &HandlerSpec,
        fingerprint: Option<&str>,
    ) -> Option<Standing> {
        let Found { record, now } = found?;
        live_standing(Some(&record), spec, fingerprint, now)
    }

    /// The values of a claim of `key` for a delivery with `fingerprint`: as
    /// [`stamped`](Self::stamped) for `hold`, with the handler's
    /// `max_attempts` and the start of its window.
    fn claim_values<'a>(
        &self,
        spec: &'a HandlerSpec,
        key: &'a Key,
        fingerprint: Option<&'a str>,
        hold: Duration,
    ) -> Result<Values<'a>, StoreError> {
        let stamped = self.stamped(spec.name, key, hold)?;
        Ok(Values {
            fingerprint,
            max: spec.max_attempts.map(i64::from),
            ttl: millis(spec.ttl),
            ..stamped
        })
    }

    /// When a transaction-mode call of `spec` writes its dedup row: first
    /// for a handler that counts failures, whose count must be read and
    /// held before its body runs; otherwise as the store says.
    fn order_for(&self, spec: &HandlerSpec) -> ClaimOrder {
        if spec.max_attempts.is_some() {
            ClaimOrder::First
        } else {
            self.order
        }
    }

    /// Someone else holds the key: retry after the lock timeout.
    fn busy(&self) -> TxClaim<Transaction<'static, D>> {
        TxClaim::Refused(Standing::InProgress {
            retry_after: self.lock_timeout(),
        })
    }

    /// Opens a transaction-mode call's transaction. It ends with
    /// [`commit_tx`](Self::commit_tx) or [`rollback_tx`](Self::rollback_tx),
    /// which set the session back where the dialect's `BEGIN` changed it.
    async fn begin(&self) -> Result<Transaction<'static, D>, StoreError> {
        let mut tx = match D::BEGIN {
            Some(begin) => self.pool.begin_with(begin).await,
            None => self.pool.begin().await,
        }
        .map_err(|e| self.err(e))?;
        if let Some(session) = D::CALL_SESSION
            && let Err(e) = D::run_text(&mut tx, session).await
        {
            let _ = Self::rollback_tx(tx).await;
            return Err(self.err(e));
        }
        Ok(tx)
    }

    /// Commits a transaction-mode call's transaction ([`Dialect::END`]).
    async fn commit_tx(mut tx: Transaction<'static, D>) -> Result<(), sqlx::Error> {
        match D::END {
            // sqlx still counts the transaction open: dropped, it queues a
            // `ROLLBACK` of nothing, which leaves with the ping the pool
            // sends when the connection returns.
            Some(end) => D::run_text(&mut tx, end.commit).await.map(drop),
            None => tx.commit().await,
        }
    }

    /// Rolls a transaction-mode call's transaction back ([`Dialect::END`]).
    async fn rollback_tx(mut tx: Transaction<'static, D>) -> Result<(), sqlx::Error> {
        match D::END {
            Some(end) => D::run_text(&mut tx, end.rollback).await.map(drop),
            None => tx.rollback().await,
        }
    }

    /// The store's error for a driver error.
    /// Records `outcome` in the transaction-mode call's transaction and
    /// commits it ([`TxStore::commit_outcome`] without the rider).
    async fn record_outcome(
        &self,
        mut tx: Transaction<'static, D>,
        spec: &'static HandlerSpec,
        key: &Key,
        fingerprint: Option<&str>,
        outcome: &str,
    ) -> Result<TxCommit, StoreError> {
        let values = Values {
            outcome: Some(outcome),
            ..self.claim_values(spec, key, fingerprint, spec.ttl)?
        };
        let taken = match self.order_for(spec) {
            // The claim row is this transaction's: record the outcome in it.
            ClaimOrder::First => {
                match self
                    .write_claimed(&mut tx, &self.sql.complete_tx, &values)
                    .await
                {
                    Ok(()) => Ok(Race::Won),
                    Err(e) => {
                        let _ = Self::rollback_tx(tx).await;
                        return Err(self.err(e));
                    }
                }
            }
            ClaimOrder::Last | ClaimOrder::Checked => {
                match self.merged(&self.sql.claim_with_commit) {
                    Some(message) => {
                        return self.commit_claim_merged(tx, message, spec, &values).await;
                    }
                    // Claim-last found a live row: this delivery is a duplicate.
                    // Its body's writes roll back with the transaction.
                    None => {
                        self.take(&mut tx, &self.sql.claim_with_outcome, spec, &values)
                            .await
                    }
                }
            }
        };
        self.lost(tx, spec, &values, taken).await
    }

    pub(crate) fn err(&self, e: sqlx::Error) -> StoreError {
        match fault::<D>(&e) {
            // Only this store's table: not one a trigger or the
            // application named.
            Fault::MissingTable(named) if bare(&named) == bare(&self.sql.table) => {
                return StoreError::MissingTable {
                    table: self.sql.table.clone(),
                };
            }
            Fault::Busy => return StoreError::Timeout(self.lock_timeout()),
            Fault::MissingColumn => {
                return StoreError::Schema(format!(
                    "the dedup table `{}` was created by an earlier release (its columns are not this release's, schema version {SCHEMA_VERSION}): call `migrate()` to upgrade it in place ({e})",
                    self.sql.table
                ));
            }
            _ => {}
        }
        match e {
            // Every connection of the pool was busy for its acquire timeout.
            sqlx::Error::PoolTimedOut => {
                StoreError::Timeout(self.pool.options().get_acquire_timeout())
            }
            sqlx::Error::Decode(_)
            | sqlx::Error::ColumnDecode { .. }
            | sqlx::Error::ColumnNotFound(_)
            | sqlx::Error::ColumnIndexOutOfBounds { .. } => {
                StoreError::Schema(format!("unexpected dedup row: {e}"))
            }
            e => StoreError::backend(e),
        }
    }
}

/// Opens one connection with `options` directly, before a store builds its
/// pool: a pool retries a refused connection until its acquire timeout
/// (`deadline`, 30 s by default) and then reports only the timeout, while
/// this fails at once with the cause. Only a failure to reach the server is
/// final here; anything else (a server still starting up) is left to the
/// pool, which retries it.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) async fn reach<C: sqlx::Connection>(
    options: &C::Options,
    deadline: Duration,
) -> Result<(), StoreError> {
    match tokio::time::timeout(deadline, C::connect_with(options)).await {
        Ok(Ok(conn)) => {
            let _ = conn.close().await;
            Ok(())
        }
        Ok(Err(e @ sqlx::Error::Io(_))) => Err(StoreError::backend(e)),
        Ok(Err(_)) => Ok(()),
        Err(_) => Err(StoreError::Timeout(deadline)),
    }
}

/// What a driver error means to the store (see [`Fault`]).
fn fault<D: Dialect>(e: &sqlx::Error) -> Fault {
    match e {
        sqlx::Error::Database(db) => D::fault(db.as_ref()),
        _ => Fault::Other,
    }
}

fn millis_u64(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl<D: Dialect> LeaseStore for SqlStore<D> {
    fn store_name(&self) -> &'static str {
        D::STORE
    }

    async fn claim(
        &self,
        spec: &'static HandlerSpec,
        key: &Key,
        fingerprint: Option<&str>,
    ) -> Result<Claim, StoreError> {
        for _ in 0..CLAIM_RETRIES {
            let token = uuid::Uuid::new_v4().simple().to_string();
            let values = Values {
                token: Some(&token),
                ..self.claim_values(spec, key, fingerprint, spec.lease)?
            };
            let mut conn = self.pool.acquire().await.map_err(|e| self.err(e))?;
            match self.take(&mut conn, &self.sql.claim, spec, &values).await {
                Ok(Race::Won) => return Ok(Claim::Fresh { token }),
                Ok(Race::Lost(found)) => {
                    if let Some(exhausted) = found
                        .as_ref()
                        .and_then(|f| Standing::of_ran_out(&f.record, spec, f.now))
                    {
                        // The stalled claim was the last failure allowed:
                        // count it, unless another claim did first.
                        let settle = Values {
                            hold: millis(spec.ttl),
                            ..values
                        };
                        match D::run(&mut conn, &self.sql.settle_ran_out, &settle).await {
                            Ok(done) if D::rows_affected(&done) == 1 => {
                                return Ok(Claim::Refused(exhausted));
                            }
                            Ok(_) => {}
                            Err(e) if fault::<D>(&e) == Fault::Deadlock => {}
                            Err(e) => return Err(self.err(e)),
                        }
                        continue;
                    }
                    if let Some(standing) = self.standing(found.map(|f| *f), spec, fingerprint) {
                        return Ok(Claim::Refused(standing));
                    }
                    // Gone, or changed, before it could be read: again.
                }
                Err(e) => match fault::<D>(&e) {
                    Fault::LockWait => {
                        return Ok(Claim::Refused(Standing::InProgress {
                            retry_after: self.lock_timeout(),
                        }));
                    }
                    Fault::Deadlock => {}
                    _ => return Err(self.err(e)),
                },
            }
        }
        Err(StoreError::Backend(Box::from(
            "the record kept changing while it was being claimed; retry the delivery",
        )))
    }

    async fn complete(
        &self,
        spec: &'static HandlerSpec,
        key: &Key,
        token: &str,
        outcome: &str,
    ) -> Result<bool, StoreError> {
        let values = Values {
            token: Some(token),
            outcome: Some(outcome),
            ..self.stamped(spec.name, key, spec.ttl)?
        };
        if self.write(&self.sql.complete_lease, &values, None).await? == 1 {
            return Ok(true);
        }
        // The claim no longer holds the key: lost, or completed by this
        // very token (a completion whose reply was lost, tried again). The
        // completed row keeps its token, so the row says which.
        Ok(self.found(spec.name, key).await?.is_some_and(|found| {
            found.record.status == Status::Completed && found.record.token.as_deref() == Some(token)
        }))
    }

    async fn fail(
        &self,
        spec: &'static HandlerSpec,
        key: &Key,
        token: &str,
        failure: Failure<'_>,
    ) -> Result<bool, StoreError> {
        let values = Values {
            token: Some(token),
            status: failure.status().as_str(),
            outcome: failure.recorded(),
            error: Some(failure.text()),
            ..self.stamped(spec.name, key, spec.ttl)?
        };
        Ok(self.write(&self.sql.fail_lease, &values, None).await? == 1)
    }

    async fn release(
        &self,
        spec: &'static HandlerSpec,
        key: &Key,
        token: &str,
    ) -> Result<(), StoreError> {
        let values = Values {
            token: Some(token),
            ..self.stamped(spec.name, key, Duration::ZERO)?
        };
        self.write(&self.sql.release, &values, None).await?;
        Ok(())
    }

    async fn extend(
        &self,
        spec: &'static HandlerSpec,
        key: &Key,
        token: &str,
    ) -> Result<bool, StoreError> {
        let values = Values {
            token: Some(token),
            ..self.stamped(spec.name, key, spec.lease)?
        };
        Ok(self.write(&self.sql.extend, &values, None).await? == 1)
    }

    async fn claim_batch(
        &self,
        spec: &'static HandlerSpec,
        items: &[BatchItem<'_>],
    ) -> Result<Vec<Claim>, StoreError> {
        self.claim_rows(spec, items).await
    }

    async fn complete_batch(
        &self,
        spec: &'static HandlerSpec,
        done: &[(Held<'_>, &str)],
    ) -> Result<Vec<bool>, StoreError> {
        self.complete_rows(spec, done).await
    }

    async fn release_batch(
        &self,
        spec: &'static HandlerSpec,
        held: &[Held<'_>],
    ) -> Result<(), StoreError> {
        self.release_rows(spec, held).await
    }

    async fn extend_batch(
        &self,
        spec: &'static HandlerSpec,
        held: &[Held<'_>],
    ) -> Result<Vec<bool>, StoreError> {
        self.extend_rows(spec, held).await
    }
}

impl<D: Dialect> SqlStore<D> {
    /// Runs `statement`, which writes the claim row this transaction holds
    /// (claiming first), and fails the call if the row is gone: the
    /// database ended the transaction (InnoDB rolls a deadlock victim back
    /// whole and ends it, and what the body sent after that is in a
    /// transaction of its own, which the caller rolls back; a statement of
    /// the body may have committed implicitly), and nothing may be
    /// committed as if the claim held.
    async fn write_claimed(
        &self,
        tx: &mut Transaction<'static, D>,
        statement: &Statement,
        values: &Values<'_>,
    ) -> Result<(), sqlx::Error> {
        let done = D::run(tx, statement, values).await?;
        if D::rows_affected(&done) == 1 {
            return Ok(());
        }
        Err(self.claim_row_gone())
    }

    /// Settles a claim-last (or claim-again) statement that lost: rolls the
    /// transaction back and says what stands.
    async fn lost(
        &self,
        tx: Transaction<'static, D>,
        spec: &HandlerSpec,
        values: &Values<'_>,
        taken: Result<Race, sqlx::Error>,
    ) -> Result<TxCommit, StoreError> {
        let standing = match taken {
            Ok(Race::Won) => {
                Self::commit_tx(tx).await.map_err(|e| self.err(e))?;
                return Ok(TxCommit::Committed);
            }
            Ok(Race::Lost(found)) => self.standing(found.map(|f| *f), spec, values.fingerprint),
            Err(e) if matches!(fault::<D>(&e), Fault::LockWait | Fault::Deadlock) => None,
            Err(e) => {
                let _ = Self::rollback_tx(tx).await;
                return Err(self.err(e));
            }
        };
        Self::rollback_tx(tx).await.map_err(|e| self.err(e))?;
        Ok(TxCommit::Refused(standing.unwrap_or(
            Standing::InProgress {
                retry_after: self.lock_timeout(),
            },
        )))
    }
}

impl<D: Dialect> SqlStore<D> {
    /// The message of `statement` (in [`RoundTrips::Merged`]) when the
    /// store sends it so.
    fn merged<'s>(&self, statement: &'s Option<template::Inline>) -> Option<&'s template::Inline> {
        statement
            .as_ref()
            .filter(|_| self.trips == RoundTrips::Merged)
    }

    /// Claims last with the outcome and commits, in one message
    /// ([`RoundTrips::Merged`]). When a record of the key stands, the
    /// message's insert fails: back before it (the body's writes kept),
    /// the claim goes on as claiming last on its own does, reading the
    /// record first: a duplicate costs one round trip more than claiming
    /// on its own does (the rollback to the savepoint; none on MySQL), a
    /// record the claim may take over (expired, or a failure to retry) at
    /// most three.
    async fn commit_claim_merged(
        &self,
        mut tx: Transaction<'static, D>,
        message: &template::Inline,
        spec: &HandlerSpec,
        values: &Values<'_>,
    ) -> Result<TxCommit, StoreError> {
        let Err(e) = D::run_message(&mut tx, message.text(values)).await else {
            // The message ends the transaction as the dialect does (a
            // `COMMIT` and a `BEGIN`, which leaves the connection where sqlx
            // believes it is; or the dialect's own end): dropping `tx`
            // queues its `ROLLBACK` of nothing, which leaves with the ping
            // the pool sends when the connection returns, in the background.
            return Ok(TxCommit::Committed);
        };
        let taken = match fault::<D>(&e) {
            Fault::Unique => {
                let savepoint = D::WITH_COMMIT.is_some_and(|with| with.savepoint);
                if savepoint
                    && let Err(back) = D::run_text(&mut tx, statements::BACK_BEFORE_DEDUP_ROW).await
                {
                    let _ = Self::rollback_tx(tx).await;
                    // No transaction to go back into: the unique key the
                    // error names is a deferred one of the body's tables,
                    // checked by the `COMMIT`, which rolled back. Anything
                    // else (the connection dropped) is the rollback's own.
                    return Err(self.err(if fault::<D>(&back) == Fault::NoTransaction {
                        e
                    } else {
                        back
                    }));
                }
                self.take_standing(&mut tx, spec, values).await
            }
            // Another transaction holds the key, or this one was a
            // deadlock victim: settled as claiming last settles them.
            Fault::LockWait | Fault::Deadlock => Err(e),
            _ => {
                let _ = Self::rollback_tx(tx).await;
                return Err(self.err(e));
            }
        };
        self.lost(tx, spec, values, taken).await
    }

    /// Claims last with the outcome, in `tx`, a key whose record stands:
    /// reads the record, and takes it over only where a claim may.
    async fn take_standing(
        &self,
        tx: &mut D::Connection,
        spec: &HandlerSpec,
        values: &Values<'_>,
    ) -> Result<Race, sqlx::Error> {
        match D::fetch(tx, &self.sql.select_latest, values).await? {
            Some(found) if !may_take(&found.record, found.now, spec, values.fingerprint) => {
                Ok(Race::Lost(Some(Box::new(found))))
            }
            _ => {
                self.take(tx, &self.sql.claim_with_outcome, spec, values)
                    .await
            }
        }
    }

    /// Claiming last with a read first ([`ClaimOrder::Checked`]): reads the
    /// key's record in `tx` and turns the delivery away when the record
    /// settles the key; otherwise hands `tx` to the body, and the insert
    /// after it decides as claiming last does.
    async fn check_before_body(
        &self,
        spec: &'static HandlerSpec,
        key: &Key,
        fingerprint: Option<&str>,
    ) -> Result<TxClaim<Transaction<'static, D>>, StoreError> {
        let values = self.stamped(spec.name, key, Duration::ZERO)?;
        let mut tx = self.begin().await?;
        let found = match D::fetch(&mut tx, &self.sql.select, &values).await {
            Ok(found) => found,
            Err(e) => {
                let _ = Self::rollback_tx(tx).await;
                return Err(self.err(e));
            }
        };
        match self.standing(found, spec, fingerprint) {
            // A live claim (a lease-mode handler's of the same name, in a
            // table shared with it) is left to the insert after the body,
            // as claiming last leaves it.
            None | Some(Standing::InProgress { .. }) => Ok(TxClaim::Fresh(tx)),
            Some(settled) => {
                Self::rollback_tx(tx).await.map_err(|e| self.err(e))?;
                Ok(TxClaim::Refused(settled))
            }
        }
    }

    /// The error of a claim row gone before its commit (see
    /// [`write_claimed`](Self::write_claimed)).
    fn claim_row_gone(&self) -> sqlx::Error {
        sqlx::Error::Protocol(format!(
            "the claim row of this transaction is gone before its commit (on {}): the transaction ended while the body ran (a deadlock victim, an implicit commit, a COMMIT or ROLLBACK the body sent); nothing was recorded",
            self.sql.table
        ))
    }
}

impl<D: Dialect> TxStore for SqlStore<D> {
    type Tx = Transaction<'static, D>;

    fn store_name(&self) -> &'static str {
        D::STORE
    }

    async fn begin_claim(
        &self,
        spec: &'static HandlerSpec,
        key: &Key,
        fingerprint: Option<&str>,
    ) -> Result<TxClaim<Self::Tx>, StoreError> {
        match self.order_for(spec) {
            ClaimOrder::Last => return Ok(TxClaim::Fresh(self.begin().await?)),
            ClaimOrder::Checked => return self.check_before_body(spec, key, fingerprint).await,
            ClaimOrder::First => {}
        }
        let values = self.claim_values(spec, key, fingerprint, spec.ttl)?;
        let mut tx = self.begin().await?;
        let standing = match self.take(&mut tx, &self.sql.claim, spec, &values).await {
            Ok(Race::Won) => {
                // A failure is to be counted in the claim row: the body's
                // writes must be undoable without it.
                if spec.max_attempts.is_some()
                    && let Err(e) = D::run_text(&mut tx, SAVEPOINT).await
                {
                    let _ = Self::rollback_tx(tx).await;
                    return Err(self.err(e));
                }
                return Ok(TxClaim::Fresh(tx));
            }
            Ok(Race::Lost(found)) => self.standing(found.map(|f| *f), spec, fingerprint),
            // Another transaction holds the key past the lock timeout, or
            // this one was a deadlock victim: either way nothing of it
            // remains once it is rolled back.
            Err(e) if matches!(fault::<D>(&e), Fault::LockWait | Fault::Deadlock) => {
                Self::rollback_tx(tx).await.map_err(|e| self.err(e))?;
                return Ok(self.busy());
            }
            Err(e) => {
                let _ = Self::rollback_tx(tx).await;
                return Err(self.err(e));
            }
        };
        Self::rollback_tx(tx).await.map_err(|e| self.err(e))?;
        // Changed between our conflict and our read: let the redelivery retry.
        Ok(standing.map_or_else(|| self.busy(), TxClaim::Refused))
    }

    async fn commit_outcome(
        &self,
        tx: Self::Tx,
        spec: &'static HandlerSpec,
        key: &Key,
        fingerprint: Option<&str>,
        outcome: &str,
    ) -> Result<TxCommit, StoreError> {
        // A consumer's write (its offset) that commits with the outcome.
        #[cfg(feature = "kafka")]
        let mut tx = tx;
        #[cfg(feature = "kafka")]
        let rode = match rider::take(&self.pool) {
            Some(rider) => {
                if let Err(e) = rider.write(&mut tx).await {
                    let _ = Self::rollback_tx(tx).await;
                    return Err(self.err(e));
                }
                true
            }
            None => false,
        };
        let committed = self
            .record_outcome(tx, spec, key, fingerprint, outcome)
            .await;
        #[cfg(feature = "kafka")]
        if rode && matches!(committed, Ok(TxCommit::Committed)) {
            rider::committed();
        }
        committed
    }

    async fn commit_failure(
        &self,
        mut tx: Self::Tx,
        spec: &'static HandlerSpec,
        key: &Key,
        fingerprint: Option<&str>,
        failure: Failure<'_>,
    ) -> Result<TxCommit, StoreError> {
        let values = Values {
            status: failure.status().as_str(),
            outcome: failure.recorded(),
            error: Some(failure.text()),
            ..self.claim_values(spec, key, fingerprint, spec.ttl)?
        };
        if self.order_for(spec) == ClaimOrder::First && spec.max_attempts.is_some() {
            // The claim row holds the key throughout: undo the body's
            // writes, record the failure in the row, commit. No other
            // delivery runs between the failure and its count.
            let recorded = async {
                D::run_text(&mut tx, ROLLBACK_TO_SAVEPOINT).await?;
                self.write_claimed(&mut tx, &self.sql.fail_tx, &values)
                    .await
            }
            .await;
            if let Err(e) = recorded {
                let _ = Self::rollback_tx(tx).await;
                return Err(self.err(e));
            }
            Self::commit_tx(tx).await.map_err(|e| self.err(e))?;
            return Ok(TxCommit::Committed);
        }
        // No claim row to keep (claiming last, or a final error of a handler
        // that does not count failures): roll everything back, then claim
        // the key anew with the failure.
        Self::rollback_tx(tx).await.map_err(|e| self.err(e))?;
        let mut tx = self.begin().await?;
        let taken = self
            .take(&mut tx, &self.sql.claim_with_failure, spec, &values)
            .await;
        self.lost(tx, spec, &values, taken).await
    }

    async fn rollback(
        &self,
        tx: Self::Tx,
        spec: &'static HandlerSpec,
        key: &Key,
        fingerprint: Option<&str>,
    ) -> Result<Option<Standing>, StoreError> {
        Self::rollback_tx(tx).await.map_err(|e| self.err(e))?;
        if self.order_for(spec) == ClaimOrder::First {
            // The claim came first: a failing body was never a duplicate's.
            return Ok(None);
        }
        // Claiming last, a duplicate's body ran before the claim could turn
        // it away, and it may have failed for that very reason (the first
        // delivery took the stock). A live record that settles the key is
        // the answer: its outcome, its final error, or the other payload.
        // The rollback went through: the transaction's connection was fine.
        // A failure to read the record now is no reason to call the body's
        // failure a store failure; the body's error stands.
        self.check_handler(spec.name)?;
        match self.found(spec.name, key).await {
            Ok(found) => Ok(self.standing(found, spec, fingerprint).filter(|s| {
                matches!(
                    s,
                    Standing::Completed { .. }
                        | Standing::Failed { .. }
                        | Standing::Mismatch { .. }
                )
            })),
            Err(e) => {
                tracing::warn!(error = %e, "could not look the key up after the body failed; its own error stands");
                Ok(None)
            }
        }
    }

    async fn begin_batch(
        &self,
        spec: &'static HandlerSpec,
        items: &[BatchItem<'_>],
    ) -> Result<TxBatch<Self::Tx>, StoreError> {
        self.begin_rows(spec, items).await
    }

    async fn commit_batch(
        &self,
        tx: Self::Tx,
        spec: &'static HandlerSpec,
        items: &[BatchItem<'_>],
        outcomes: &[Option<&str>],
    ) -> Result<TxBatchCommit, StoreError> {
        self.commit_rows(tx, spec, items, outcomes).await
    }

    async fn rollback_batch(&self, tx: Self::Tx) -> Result<(), StoreError> {
        Self::rollback_tx(tx).await.map_err(|e| self.err(e))
    }

    fn contention(&self, error: &(dyn std::error::Error + 'static)) -> Option<Contention> {
        // A `sqlx::Error`, or the database error one holds: its `source`,
        // which a wrapper that is `#[error(transparent)]` over a
        // `sqlx::Error` hands on in its place.
        let db = match error.downcast_ref::<sqlx::Error>() {
            Some(sqlx::Error::Database(db)) => db,
            Some(_) => return None,
            None => error.downcast_ref::<Box<dyn sqlx::error::DatabaseError>>()?,
        };
        D::contention(db.as_ref())
    }
}

impl<D: Dialect> Sweep for SqlStore<D> {
    async fn sweep_expired(&self, batch: u32) -> Result<u64, StoreError> {
        SqlStore::sweep_expired(self, batch).await
    }
}
