//! The embedded SQLite store (feature `sqlite`, on by default).
//!
//! # Examples
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! use idem_runtime::store::sql::sqlite::SqliteStore;
//!
//! let store = SqliteStore::open(dir.path().join("idem.db")).await?;
//! store.migrate().await?;
//! assert_eq!(store.count().await?, 0);
//! # Ok(()) }
//! ```

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::{
    SqliteConnectOptions, SqliteError, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteQueryResult,
};
use sqlx::{AssertSqlSafe, Sqlite, Transaction};

use super::dialect::Fault;
use super::pool;
use super::rows::{COLUMNS, NewRow, insert_or_take_over};
use super::template::Placeholders;
use super::{ClaimOrder, Dialect, SqlStore};
use crate::error::{Contention, StoreError};
use crate::registry;

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
/// use idem_runtime::store::sql::sqlite::{DEFAULT_TABLE, SqliteStore};
///
/// let store = SqliteStore::open(dir.path().join("idem.db")).await?;
/// assert_eq!(store.table(), DEFAULT_TABLE);
/// assert_eq!(DEFAULT_TABLE, "idem_keys");
/// # Ok(()) }
/// ```
pub const DEFAULT_TABLE: &str = super::table::DEFAULT_TABLE;

/// How long a writer waits for SQLite's write lock before giving up.
///
/// # Examples
///
/// ```
/// use idem_runtime::StoreError;
/// use idem_runtime::store::sql::sqlite::DEFAULT_BUSY_TIMEOUT;
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
/// Times are milliseconds since the epoch, read in each statement from
/// SQLite's own `'now'` (the same within a statement), and leases and expiry
/// are computed in SQL, as on the server databases. SQLite runs inside the
/// consumer, so its clock is the consumer's host's: consumers of one
/// database file share a host (WAL mode needs one), and so share one
/// clock.
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
pub type SqliteStore = SqlStore<Sqlite>;

impl Dialect for Sqlite {
    const OUTBOX_CREATE: &'static str = "CREATE TABLE IF NOT EXISTS {t} (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL, handler TEXT NOT NULL, destination TEXT NOT NULL, msg_key TEXT, lane TEXT NOT NULL, payload BLOB NOT NULL, headers TEXT, staged_at INTEGER NOT NULL, attempts INTEGER NOT NULL DEFAULT 0, last_error TEXT); CREATE INDEX IF NOT EXISTS {s}{i} ON {b} (lane, seq)";
    const OUTBOX_SEQS: &'static str = "(SELECT value FROM json_each(:rows))";
    const OUTBOX_LOCK: &'static str = "";
    const OUTBOX_HOLDS: bool = false;
    // (`AUTOINCREMENT` above: SQLite would otherwise give a drained table's
    // next row the `seq` of a row just deleted, and a relay that read the
    // old row would then delete or count the new one.)
    const OFFSETS_CREATE: &'static str = "CREATE TABLE IF NOT EXISTS {t} (consumer_group TEXT NOT NULL, topic TEXT NOT NULL, partition_id INTEGER NOT NULL, next_offset INTEGER NOT NULL, PRIMARY KEY (consumer_group, topic, partition_id))";
    const OFFSETS_LOAD: &'static str =
        "SELECT topic, partition_id, next_offset FROM {t} WHERE consumer_group = :consumer";
    const OFFSETS_UPSERT: &'static str = "INSERT INTO {t} AS o (consumer_group, topic, partition_id, next_offset) VALUES (:consumer, :stream, :partition, :next) ON CONFLICT (consumer_group, topic, partition_id) DO UPDATE SET next_offset = MAX(o.next_offset, excluded.next_offset)";
    const STORE: &'static str = "sqlite";
    const PLACEHOLDERS: Placeholders = Placeholders::NumberedQuestion;
    // SQLite's `'now'` is the same for every use within one step of a
    // statement (a write is one step). `julianday` counts days as a double,
    // from SQLite's integer milliseconds: rounded back to them, not cut.
    // (`unixepoch('subsec')` needs SQLite 3.42; this works on any.)
    const NOW: &'static str = "CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)";
    const KEY: &'static str = "key";
    const MAX_HANDLER_LEN: usize = usize::MAX;
    // IMMEDIATE takes the write lock now, so the claim cannot deadlock
    // against another transaction upgrading from a read lock, and the row a
    // claim found cannot change before it is read.
    const BEGIN: Option<&'static str> = Some("BEGIN IMMEDIATE");
    const SWEEP_BEGIN: Option<&'static str> = None;
    const LATEST_READ: &'static str = "";
    const BATCH_ROWS: &'static str = "(SELECT json_extract(value, '$.k') AS k,
                json_extract(value, '$.f') AS f, json_extract(value, '$.o') AS o,
                json_extract(value, '$.t') AS t
          FROM json_each(:rows)) AS r";
    const ADDED_COLUMNS: &'static [(u32, &'static str, &'static str)] = &[
        (2, "failures", "INTEGER NOT NULL DEFAULT 0"),
        (2, "last_error", "TEXT"),
        (2, "fingerprint", "TEXT"),
        (3, "max_attempts", "INTEGER"),
        (4, "traceparent", "TEXT"),
    ];

    fn columns(t: &str) -> String {
        let (schema, bare) = t.split_once('.').unwrap_or(("main", t));
        format!("SELECT name FROM pragma_table_info('{bare}', '{schema}')")
    }

    fn create(t: &str) -> String {
        // SQLite names the index's schema on the index, not the table.
        let (schema, bare) = match t.split_once('.') {
            Some((schema, bare)) => (format!("{schema}."), bare),
            None => (String::new(), t),
        };
        format!(
            "CREATE TABLE IF NOT EXISTS {t} (
                handler TEXT NOT NULL,
                key TEXT NOT NULL,
                status TEXT NOT NULL,
                token TEXT,
                outcome TEXT,
                attempts INTEGER NOT NULL,
                failures INTEGER NOT NULL DEFAULT 0,
                last_error TEXT,
                fingerprint TEXT,
                created_at INTEGER NOT NULL,
                updated_at INTEGER NOT NULL,
                expires_at INTEGER NOT NULL,
                max_attempts INTEGER,
                traceparent TEXT,
                PRIMARY KEY (handler, key)
            ) WITHOUT ROWID;
            CREATE INDEX IF NOT EXISTS {schema}{bare}_expires_at ON {bare} (expires_at);"
        )
    }

    fn in_batch(column: &str) -> String {
        format!("{column} IN (SELECT json_extract(value, '$.k') FROM json_each(:rows))")
    }

    fn delete_from_rows(condition: &str) -> String {
        // No join in SQLite's DELETE: the rows are matched by a subquery.
        format!(
            "DELETE FROM {{t}} AS cur WHERE cur.handler = :handler AND {}
             AND EXISTS (SELECT 1 FROM {} WHERE cur.{{key}} = r.k AND {condition})",
            Self::in_batch("cur.{key}"),
            Self::BATCH_ROWS
        )
    }

    fn insert_ignoring(select: &str) -> String {
        format!("INSERT INTO {{t}} ({COLUMNS}) {select} ON CONFLICT (handler, {{key}}) DO NOTHING")
    }

    fn update_from_rows(assignments: &str, condition: &str) -> String {
        format!(
            "UPDATE {{t}} AS cur SET {assignments} FROM {}
             WHERE cur.handler = :handler AND {} AND cur.{{key}} = r.k AND {condition}",
            Self::BATCH_ROWS,
            Self::in_batch("cur.{key}")
        )
    }

    fn take(row: NewRow) -> (String, Option<String>) {
        (insert_or_take_over(row), None)
    }

    fn sweep() -> String {
        "DELETE FROM {t} WHERE (handler, key) IN
            (SELECT handler, key FROM {t} WHERE expires_at <= {now} ORDER BY expires_at LIMIT :batch)"
            .to_owned()
    }

    fn fault(db: &dyn sqlx::error::DatabaseError) -> Fault {
        // SQLITE_BUSY (5) and SQLITE_LOCKED (6), with extended codes. The
        // lock is database-wide: a wait says nothing about the key, so it is
        // a timeout, never `InProgress`.
        if let Some(code) = db.code().and_then(|c| c.parse::<i32>().ok())
            && (code & 0xff == 5 || code & 0xff == 6)
        {
            return Fault::Busy;
        }
        // `no such table: main.idem_keys`
        let message = db.message();
        if let Some(table) = message.strip_prefix("no such table: ") {
            return Fault::MissingTable(table.to_owned());
        }
        // `no such column: failures`, `table idem_keys has no column named failures`
        if message.starts_with("no such column") || message.contains("has no column named") {
            return Fault::MissingColumn;
        }
        Fault::Other
    }

    fn contention(db: &dyn sqlx::error::DatabaseError) -> Option<Contention> {
        db.try_downcast_ref::<SqliteError>()?;
        (Self::fault(db) == Fault::Busy).then_some(Contention::Busy)
    }

    fn rows_affected(done: &SqliteQueryResult) -> u64 {
        done.rows_affected()
    }
}

// A batch's rows travel as one JSON document (`:rows`): no statement names
// a column parameter, which binds as NULL.
impl super::exec::BindColumn for Sqlite {
    fn bind_column<'q>(
        query: sqlx::query::Query<'q, Self, Self::Arguments>,
        _column: &[Option<&str>],
    ) -> sqlx::query::Query<'q, Self, Self::Arguments> {
        query.bind(None::<&str>)
    }
}

impl SqlStore<Sqlite> {
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
        let store = Self::from_pool_unread(pool);
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
        let store = Self::from_pool_unread(pool);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let reader = store.clone();
            runtime.spawn(async move {
                let _ = reader.read_busy_timeout().await;
            });
        }
        store
    }

    /// The store, with the default busy timeout until it is read.
    fn from_pool_unread(pool: SqlitePool) -> Self {
        SqlStore::new(pool, DEFAULT_BUSY_TIMEOUT, ClaimOrder::First)
    }

    /// Asks SQLite for the connections' busy timeout, which
    /// [`StoreError::Timeout`] reports.
    async fn read_busy_timeout(&self) -> Result<(), StoreError> {
        let ms: i64 = sqlx::query_scalar("PRAGMA busy_timeout")
            .fetch_one(self.pool())
            .await
            .map_err(|e| self.err(e))?;
        self.learn_lock_timeout(Duration::from_millis(u64::try_from(ms).unwrap_or(0)));
        Ok(())
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
        sqlx::raw_sql(AssertSqlSafe(self.create_sql().clone()))
            .execute(self.pool())
            .await
            .map_err(|e| self.err(e))?;
        // The write lock, taken at once, serialises upgrades between
        // processes: a second one finds the columns added.
        let mut tx = pool::begin(self.pool(), Some("BEGIN IMMEDIATE"))
            .await
            .map_err(|e| self.err(e))?;
        self.upgrade(&mut tx).await?;
        tx.commit().await.map_err(|e| self.err(e))?;
        // A store made from the application's pool learns its timeout here.
        self.read_busy_timeout().await
    }
}
