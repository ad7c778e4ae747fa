//! The embedded SQLite store (feature `sqlite`, on by default).
//!
//! # Examples
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! use idem_runtime::store::sqlite::SqliteStore;
//!
//! let store = SqliteStore::open(dir.path().join("idem.db")).await?;
//! store.migrate().await?;
//! assert_eq!(store.count().await?, 0);
//! # Ok(()) }
//! ```

use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions};
use sqlx::{Sqlite, Transaction};

use crate::clock::{Clock, SystemClock, millis};
use crate::error::StoreError;
use crate::key::Key;
use crate::registry::{self, HandlerSpec};
use crate::store::contract::{TxClaim, TxCommit, TxStore};
use crate::store::sql::{Dialect, Standing, Statements, q, sql_store};
use crate::store::validate_table_name;

/// The transaction a transaction-mode SQLite handler receives:
/// `tx: &mut SqliteTx<'_>`, used as `&mut **tx` with sqlx.
///
/// # Examples
///
/// A helper a handler's body calls with its transaction:
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// use idem_runtime::{SqliteStore, SqliteTx};
///
/// async fn ship(tx: &mut SqliteTx<'_>, order_id: i64) -> Result<(), sqlx::Error> {
///     sqlx::query("INSERT INTO shipments (order_id) VALUES (?)")
///         .bind(order_id)
///         .execute(&mut **tx)
///         .await?;
///     Ok(())
/// }
///
/// # let store = SqliteStore::open(dir.path().join("shop.db")).await?;
/// # sqlx::query("CREATE TABLE shipments (order_id INTEGER)").execute(store.pool()).await?;
/// let mut tx: SqliteTx<'_> = store.pool().begin().await?;
/// ship(&mut tx, 17).await?;
/// tx.commit().await?;
/// # Ok(()) }
/// ```
pub type SqliteTx<'c> = Transaction<'c, Sqlite>;

/// The default dedup table.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// use idem_runtime::store::sqlite::{DEFAULT_TABLE, SqliteStore};
///
/// let store = SqliteStore::open(dir.path().join("idem.db")).await?;
/// assert_eq!(store.table(), DEFAULT_TABLE);
/// assert_eq!(DEFAULT_TABLE, "idem_keys");
/// # Ok(()) }
/// ```
pub const DEFAULT_TABLE: &str = "idem_keys";

/// How long a writer waits for SQLite's write lock before giving up.
///
/// # Examples
///
/// ```
/// use idem_runtime::StoreError;
/// use idem_runtime::store::sqlite::DEFAULT_BUSY_TIMEOUT;
/// use std::time::Duration;
///
/// assert_eq!(DEFAULT_BUSY_TIMEOUT, Duration::from_secs(5));
/// // what a call that waited that long for the write lock reports
/// let err = StoreError::Timeout(DEFAULT_BUSY_TIMEOUT);
/// assert_eq!(err.to_string(), "timed out after 5s");
/// ```
pub const DEFAULT_BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// The embedded store: a SQLite database file, through sqlx.
///
/// * **Transaction mode** (a handler with `tx: &mut SqliteTx<'_>`): the call
///   opens `BEGIN IMMEDIATE`, inserts the claim row, runs the body in that
///   transaction, and writes the outcome before `COMMIT`. A body error rolls
///   the claim back with the body's writes.
/// * **Lease mode** (no transaction parameter): the claim is one `INSERT ...
///   ON CONFLICT DO UPDATE ... WHERE expired` statement carrying a fencing
///   token; completion, release and lease extension compare the token.
///
/// Expired records are reclaimed at claim time; [`sweep_expired`] and
/// [`Sweeper`](crate::Sweeper) delete them in bounded batches.
///
/// SQLite has one writer at a time: concurrent claims queue on its write lock
/// for up to the busy timeout (5 s unless the pool says otherwise), then fail
/// with [`StoreError::Timeout`].
///
/// [`sweep_expired`]: SqliteStore::sweep_expired
///
/// # Examples
///
/// ```standalone_crate
/// use idem_runtime::{idempotent, Outcome, SqliteStore, SqliteTx};
///
/// #[derive(serde::Deserialize)]
/// struct OrderPlaced { order_id: u64, sku: String, qty: i64 }
///
/// #[idempotent(key = "order_id + sku", ttl = "24h", store = "sqlite")]
/// async fn deduct_stock(tx: &mut SqliteTx<'_>, msg: &OrderPlaced) -> Result<i64, sqlx::Error> {
///     sqlx::query_scalar("UPDATE inventory SET stock = stock - ? WHERE sku = ? RETURNING stock")
///         .bind(msg.qty)
///         .bind(&msg.sku)
///         .fetch_one(&mut **tx)
///         .await
/// }
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// let store = SqliteStore::open(dir.path().join("shop.db")).await?;
/// store.migrate().await?;
/// sqlx::query("CREATE TABLE inventory (sku TEXT PRIMARY KEY, stock INTEGER NOT NULL)")
///     .execute(store.pool()).await?;
/// sqlx::query("INSERT INTO inventory VALUES ('apple', 10)").execute(store.pool()).await?;
///
/// let msg = OrderPlaced { order_id: 1, sku: "apple".into(), qty: 3 };
/// assert_eq!(deduct_stock(&store, &msg).await?, Outcome::Executed(7));
/// assert_eq!(deduct_stock(&store, &msg).await?, Outcome::Duplicate(7));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
    sql: Arc<Statements>,
    clock: Arc<dyn Clock>,
    /// The connections' busy timeout in milliseconds, as SQLite reports it
    /// (`PRAGMA busy_timeout`), for [`StoreError::Timeout`]; read when the
    /// store connects and again by `migrate`.
    busy_timeout_ms: Arc<AtomicU64>,
}

impl SqliteStore {
    /// Opens (creating if needed) the database file at `path`, in WAL mode
    /// with a 5 s busy timeout. Call [`migrate`](Self::migrate) before use.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = tempfile::tempdir()?;
    /// use idem_runtime::SqliteStore;
    ///
    /// let store = SqliteStore::open(dir.path().join("idem.db")).await?;
    /// store.migrate().await?;
    /// # Ok(()) }
    /// ```
    pub async fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        let options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .busy_timeout(DEFAULT_BUSY_TIMEOUT);
        Self::connect_with(options).await
    }

    /// Connects with a sqlx URL such as `sqlite://data/idem.db?mode=rwc`.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = tempfile::tempdir()?;
    /// use idem_runtime::SqliteStore;
    ///
    /// let path = dir.path().join("idem.db");
    /// let store = SqliteStore::connect(&format!("sqlite://{}?mode=rwc", path.display())).await?;
    /// store.migrate().await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let options = SqliteConnectOptions::from_str(url)
            .map_err(StoreError::backend)?
            .busy_timeout(DEFAULT_BUSY_TIMEOUT);
        Self::connect_with(options).await
    }

    /// Connects with explicit sqlx options. Set the busy timeout on them
    /// with [`SqliteConnectOptions::busy_timeout`] (sqlx's default is 5 s);
    /// [`StoreError::Timeout`] reports the one the connections really have.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = tempfile::tempdir()?;
    /// use idem_runtime::SqliteStore;
    /// use sqlx::sqlite::{SqliteConnectOptions, SqliteSynchronous};
    /// use std::time::Duration;
    ///
    /// let options = SqliteConnectOptions::new()
    ///     .filename(dir.path().join("idem.db"))
    ///     .create_if_missing(true)
    ///     .synchronous(SqliteSynchronous::Full)
    ///     .busy_timeout(Duration::from_secs(5));
    /// let store = SqliteStore::connect_with(options).await?;
    /// store.migrate().await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect_with(options: SqliteConnectOptions) -> Result<Self, StoreError> {
        registry::check()?;
        let pool = SqlitePoolOptions::new()
            .acquire_timeout(DEFAULT_BUSY_TIMEOUT)
            .connect_with(options)
            .await
            .map_err(StoreError::backend)?;
        let store = Self::unread(pool);
        store.read_busy_timeout().await?;
        Ok(store)
    }

    /// Uses an existing pool, e.g. the application's own, so that business
    /// tables and the dedup table share one database. The store asks a
    /// connection for its busy timeout (for [`StoreError::Timeout`]) in the
    /// background when made inside a tokio runtime, and again when
    /// [`migrate`](Self::migrate) runs; until it knows, it reports the 5 s
    /// default. A wait for a free connection reports the pool's own acquire
    /// timeout.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = tempfile::tempdir()?;
    /// use idem_runtime::SqliteStore;
    /// use sqlx::sqlite::{SqliteConnectOptions, SqlitePool};
    ///
    /// let options = SqliteConnectOptions::new()
    ///     .filename(dir.path().join("shop.db"))
    ///     .create_if_missing(true);
    /// let pool = SqlitePool::connect_with(options).await?;
    /// let store = SqliteStore::from_pool(pool.clone());
    /// store.migrate().await?;
    /// // the application's own tables live next to the dedup table
    /// sqlx::query("CREATE TABLE inventory (sku TEXT PRIMARY KEY, stock INTEGER)").execute(&pool).await?;
    /// # Ok(()) }
    /// ```
    pub fn from_pool(pool: SqlitePool) -> Self {
        let store = Self::unread(pool);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let reader = store.clone();
            runtime.spawn(async move {
                let _ = reader.read_busy_timeout().await;
            });
        }
        store
    }

    /// The store, with the default busy timeout until it is read.
    fn unread(pool: SqlitePool) -> Self {
        SqliteStore {
            pool,
            sql: Arc::new(Statements::new(DEFAULT_TABLE, Dialect::Sqlite)),
            clock: Arc::new(SystemClock),
            busy_timeout_ms: Arc::new(AtomicU64::new(millis_u64(DEFAULT_BUSY_TIMEOUT))),
        }
    }

    /// Asks SQLite for the connections' busy timeout.
    async fn read_busy_timeout(&self) -> Result<(), StoreError> {
        let ms: i64 = sqlx::query_scalar("PRAGMA busy_timeout")
            .fetch_one(&self.pool)
            .await
            .map_err(|e| self.err(e))?;
        self.busy_timeout_ms
            .store(u64::try_from(ms).unwrap_or(0), Ordering::Relaxed);
        Ok(())
    }

    /// Uses `table` instead of `idem_keys`. The name must be a plain SQL
    /// identifier (see [`validate_table_name`](Self::validate_table_name)).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let pool = sqlx::SqlitePool::connect("sqlite::memory:").await?;
    /// let store = idem_runtime::SqliteStore::from_pool(pool).with_table("orders_dedup")?;
    /// assert_eq!(store.table(), "orders_dedup");
    /// assert!(idem_runtime::SqliteStore::from_pool(store.pool().clone()).with_table("x; --").is_err());
    /// # Ok(()) }
    /// ```
    pub fn with_table(mut self, table: &str) -> Result<Self, StoreError> {
        validate_table_name(table)?;
        self.sql = Arc::new(Statements::new(table, Dialect::Sqlite));
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

    /// Creates the dedup table and its expiry index if they do not exist.
    /// Safe to call at every start-up and from several processes.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = tempfile::tempdir()?;
    /// use idem_runtime::SqliteStore;
    ///
    /// let store = SqliteStore::open(dir.path().join("idem.db")).await?;
    /// store.migrate().await?;
    /// store.migrate().await?; // a no-op the second time
    /// assert_eq!(store.count().await?, 0);
    /// # Ok(()) }
    /// ```
    pub async fn migrate(&self) -> Result<(), StoreError> {
        sqlx::raw_sql(q(&self.sql.create))
            .execute(&self.pool)
            .await
            .map_err(|e| self.err(e))?;
        // A store made from the application's pool learns its timeout here.
        self.read_busy_timeout().await
    }

    fn err(&self, e: sqlx::Error) -> StoreError {
        if let sqlx::Error::Database(db) = &e {
            // `no such table: main.idem_keys`: this store's table, not one
            // a trigger or the application named.
            let bare = self.sql.table.rsplit('.').next().unwrap_or_default();
            if db
                .message()
                .strip_prefix("no such table: ")
                .is_some_and(|t| t.rsplit('.').next() == Some(bare))
            {
                return StoreError::MissingTable {
                    table: self.sql.table.clone(),
                };
            }
        }
        // Every connection of the pool was busy for its acquire timeout.
        if matches!(e, sqlx::Error::PoolTimedOut) {
            return StoreError::Timeout(self.pool.options().get_acquire_timeout());
        }
        let busy = Duration::from_millis(self.busy_timeout_ms.load(Ordering::Relaxed));
        backend(e, busy)
    }

    /// SQLite's lock is database-wide: a busy wait says nothing about the
    /// key, so it is a timeout, never `InProgress`.
    fn lock_wait(&self, _: &sqlx::Error) -> Option<Duration> {
        None
    }
}

sql_store!(
    SqliteStore,
    Sqlite,
    sqlx::sqlite::SqliteRow,
    "sqlite",
    // The generated methods' examples run on a temporary database.
    "```\n\
     # #[tokio::main(flavor = \"current_thread\")]\n\
     # async fn main() -> Result<(), Box<dyn std::error::Error>> {\n\
     # let dir = tempfile::tempdir()?;\n\
     # let store = idem_runtime::SqliteStore::open(dir.path().join(\"idem.db\")).await?;\n\
     # store.migrate().await?;"
);

fn backend(e: sqlx::Error, busy_timeout: Duration) -> StoreError {
    if let sqlx::Error::Database(db) = &e {
        // SQLITE_BUSY (5) and SQLITE_LOCKED (6), with extended codes.
        if let Some(code) = db.code().and_then(|c| c.parse::<i32>().ok())
            && (code & 0xff == 5 || code & 0xff == 6)
        {
            return StoreError::Timeout(busy_timeout);
        }
    }
    StoreError::backend(e)
}

impl TxStore for SqliteStore {
    type Tx = SqliteTx<'static>;

    fn store_name(&self) -> &'static str {
        "sqlite"
    }

    async fn begin_claim(
        &self,
        spec: &'static HandlerSpec,
        key: &Key,
    ) -> Result<TxClaim<Self::Tx>, StoreError> {
        // IMMEDIATE takes the write lock now, so the claim cannot deadlock
        // against another transaction upgrading from a read lock.
        let mut tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(|e| self.err(e))?;
        let now = self.clock.now_millis();
        if self
            .try_claim(&mut *tx, spec, key, None, now, spec.ttl)
            .await
            .map_err(|e| self.err(e))?
        {
            return Ok(TxClaim::Fresh(tx));
        }
        // We hold the write lock: the row cannot change before we read it.
        let standing = self.standing(&mut *tx, spec, key, now).await?;
        tx.rollback().await.map_err(|e| self.err(e))?;
        match standing {
            Some(Standing::Completed(outcome)) => Ok(TxClaim::Completed { outcome }),
            Some(Standing::InProgress(retry_after)) => Ok(TxClaim::InProgress { retry_after }),
            None => Err(StoreError::Schema(format!(
                "claim on {} neither inserted nor found a row",
                self.sql.table
            ))),
        }
    }

    async fn commit_outcome(
        &self,
        mut tx: Self::Tx,
        spec: &'static HandlerSpec,
        key: &Key,
        outcome: &str,
    ) -> Result<TxCommit, StoreError> {
        let now = self.clock.now_millis();
        sqlx::query(q(&self.sql.complete_tx))
            .bind(spec.name)
            .bind(key.as_str())
            .bind(outcome)
            .bind(now)
            .bind(now.saturating_add(millis(spec.ttl)))
            .execute(&mut *tx)
            .await
            .map_err(|e| self.err(e))?;
        tx.commit().await.map_err(|e| self.err(e))?;
        Ok(TxCommit::Committed)
    }

    async fn rollback(
        &self,
        tx: Self::Tx,
        _: &'static HandlerSpec,
        _: &Key,
    ) -> Result<Option<String>, StoreError> {
        // The claim came first: a failing body was never a duplicate's.
        tx.rollback().await.map_err(|e| self.err(e))?;
        Ok(None)
    }
}

fn millis_u64(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
