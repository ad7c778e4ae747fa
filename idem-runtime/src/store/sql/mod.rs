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
//! The files, each using only those above it (`claim.rs` to `ops.rs` are
//! more of `SqlStore`'s methods, beside `mod.rs`):
//!
//! ```text
//! template.rs    the template language: `:name` parameters, placeholders, literals
//! rows.rs        the dedup row's SQL: columns, what a claim writes, when it may take a row
//! table.rs       the table's name: the default, the check
//! partitions.rs  PostgreSQL's partitioned table: the option, its SQL
//! exec.rs        what the store needs of a sqlx driver: bind, run, decode
//! dialect.rs     the Dialect trait: what differs between the databases
//! statements.rs  the statements of one store, built once per table
//! mod.rs         SqlStore: the type, its settings, its errors
//! claim.rs       what both modes share: taking a row, the record that stands
//! lease.rs       LeaseStore                 tx.rs       TxStore
//! batch.rs       SqlStore's batches         inspect.rs  SqlStore's Inspect
//! ops.rs         sweeping, one record, the count, the schema version
//! rider.rs       a write that rides in an outcome's transaction
//! offsets.rs     offset tables: a consumer's position, written by a rider
//! outbox.rs      the outbox table: staged messages, taken and removed by relays
//! sqlite.rs, postgres.rs, mysql.rs: each database's Dialect, constructors, migrate()
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sqlx::Pool;

use crate::error::StoreError;

mod batch;
mod claim;
mod dialect;
mod exec;
mod inspect;
mod lease;
#[cfg(feature = "mysql")]
#[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
pub mod mysql;
mod offsets;
mod ops;
pub(crate) mod outbox;
mod partitions;
mod pool;
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub mod postgres;
mod rider;
mod rows;
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub mod sqlite;
mod statements;
mod table;
pub(crate) mod template;
mod tx;

use dialect::Fault;
pub use dialect::{Dialect, ServerDialect};
use exec::Found;
pub use offsets::OffsetTable;
pub use outbox::OutboxTable;
pub use partitions::Partitions;
use statements::Statements;
use table::{DEFAULT_TABLE, bare, validate_table_name};
use template::Values;

/// The version of the dedup table this release writes and reads: 1 was
/// the first release's; 2 added `failures`, `last_error` and `fingerprint`;
/// 3 added `max_attempts` (the handler's limit, as each claim writes it, so
/// that operators' tools can tell a key that used up its attempts); 4
/// added `traceparent` (the W3C trace context of the execution that
/// settled a row, [`Record::trace`](crate::store::Record::trace)).
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
pub const SCHEMA_VERSION: u32 = 4;

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
/// | [`Checked`](Self::Checked) (default) | 2 statements: a read, the insert (in [`RoundTrips::Merged`] the read rides on MySQL's session statement and the insert on the `COMMIT`) | turned away before its body | its body runs, then waits and rolls back |
/// | [`Last`](Self::Last) | 1 statement (none more, merged into the `COMMIT`) | its body runs, then rolls back | its body runs, then waits and rolls back |
/// | [`First`](Self::First) | 2 statements: the claim, the outcome | turned away before its body | waits for the first, its body never runs |
///
/// "Settled" is a recorded outcome, a recorded final error, a record of
/// another payload (`Error::PayloadMismatch`) or a record that does not
/// decode. The default turns a settled key's duplicate away before its body,
/// as the field's rule asks; `Last` is the faster choice for a body whose
/// duplicate run costs nothing and shows nothing. Why, and what each order
/// costs on this machine, is in [`guide::design`](crate::guide::design)
/// and [`guide::benchmarks`](crate::guide::benchmarks). A batch handler reads
/// its keys' records before its body whatever the order, and gives the body
/// only the fresh messages ([`guide::batches`](crate::guide::batches)).
///
/// # Examples
///
/// ```
/// // `idem_runtime::ClaimOrder` with the feature `postgres` or `mysql`
/// use idem_runtime::store::sql::ClaimOrder;
/// assert_eq!(ClaimOrder::default(), ClaimOrder::Checked);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ClaimOrder {
    /// After the body, in one statement that carries the outcome: one extra
    /// statement a fresh message. A duplicate's body runs and is rolled back
    /// when the insert finds the row. The fast option, for a body whose
    /// duplicate run neither costs much nor shows outside its transaction:
    /// it saves a primary-key read a message
    /// ([`guide::benchmarks`](crate::guide::benchmarks)).
    Last,
    /// After the body, as [`Last`](Self::Last), with a read of the key's
    /// record before it (a `SELECT` by primary key, without a lock): a
    /// delivery of a key that is settled (the redelivery after a crash or a
    /// rebalance, the usual duplicate) is answered before its body runs. One
    /// statement more than `Last` a message, and no lock is held across the
    /// body; only a duplicate that arrives while the first delivery's
    /// transaction is still open runs its body, which then rolls back
    /// (counted in [`metric::DUPLICATE_BODIES`](crate::metric::DUPLICATE_BODIES)).
    /// In [`RoundTrips::Merged`] on MySQL the read rides in the message of
    /// the store's session statement, so it costs no round trip. The
    /// default.
    #[default]
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

    /// The statements that create the table and its index, for the store
    /// modules' `migrate`.
    pub(crate) fn create_sql(&self) -> &Arc<str> {
        &self.sql.create
    }

    /// How long a statement waits on a lock before it gives up.
    pub(crate) fn lock_timeout(&self) -> Duration {
        Duration::from_millis(self.lock_timeout_ms.load(Ordering::Relaxed))
    }

    /// Records the lock timeout the connections report (SQLite).
    #[cfg(feature = "sqlite")]
    pub(crate) fn learn_lock_timeout(&self, timeout: Duration) {
        self.lock_timeout_ms
            .store(millis_u64(timeout), Ordering::Relaxed);
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

/// The settings of a store on a database server (PostgreSQL,
/// MySQL/MariaDB), the same for every [`ServerDialect`]: on `PgStore` and
/// `MySqlStore` alike.
impl<D: ServerDialect> SqlStore<D> {
    /// The lock timeout reported as `retry_after` when a claim times out,
    /// for this store and the clones made from it from now on.
    ///
    /// Set it to the lock timeout of the pool's sessions (PostgreSQL's
    /// `lock_timeout`, MySQL's `innodb_lock_wait_timeout`) when the store
    /// did not make the pool (`from_pool`).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # #[cfg(feature = "postgres")] {
    /// # let pool = sqlx::postgres::PgPoolOptions::new().connect_lazy("postgres://postgres@127.0.0.1/test")?;
    /// use idem_runtime::PgStore;
    /// use std::time::Duration;
    ///
    /// let store = PgStore::from_pool(pool).with_lock_timeout(Duration::from_secs(2));
    /// # }
    /// # Ok(()) }
    /// ```
    pub fn with_lock_timeout(mut self, timeout: Duration) -> Self {
        self.lock_timeout_ms = Arc::new(AtomicU64::new(millis_u64(timeout)));
        self
    }

    /// When transaction-mode handlers write their dedup row.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # #[cfg(feature = "mysql")] {
    /// # let pool = sqlx::mysql::MySqlPoolOptions::new().connect_lazy("mysql://root@127.0.0.1:3306/test")?;
    /// use idem_runtime::{ClaimOrder, MySqlStore};
    ///
    /// // duplicates are frequent and their bodies expensive: turn them away first
    /// let store = MySqlStore::from_pool(pool).with_claim_order(ClaimOrder::First);
    /// # }
    /// # Ok(()) }
    /// ```
    pub fn with_claim_order(mut self, order: ClaimOrder) -> Self {
        self.order = order;
        self
    }

    /// How transaction-mode handlers send their dedup row: in the
    /// `COMMIT`'s message, or as a statement of its own (see
    /// [`RoundTrips`]).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # #[cfg(feature = "postgres")] {
    /// # let pool = sqlx::postgres::PgPoolOptions::new().connect_lazy("postgres://postgres@127.0.0.1/test")?;
    /// use idem_runtime::{PgStore, RoundTrips};
    ///
    /// // the database is across a network: save the dedup row's round trip
    /// let store = PgStore::from_pool(pool).with_round_trips(RoundTrips::Merged);
    /// assert_eq!(store.round_trips(), RoundTrips::Merged);
    /// # }
    /// # Ok(()) }
    /// ```
    pub fn with_round_trips(mut self, trips: RoundTrips) -> Self {
        self.trips = trips;
        self
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
        Ok(Err(e @ (sqlx::Error::Io(_) | sqlx::Error::Tls(_)))) => Err(StoreError::backend(e)),
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
