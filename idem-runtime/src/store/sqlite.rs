//! The embedded SQLite store (feature `sqlite`, on by default).

use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions};
use sqlx::{AssertSqlSafe, Row, Sqlite, Transaction};

use crate::clock::{Clock, SystemClock, millis};
use crate::driver::{Claim, LeaseStore, TxClaim, TxCommit, TxStore};
use crate::error::StoreError;
use crate::key::Key;
use crate::registry::{self, HandlerSpec};
use crate::store::{Record, Status, Sweep, validate_table_name};

/// The transaction a transaction-mode SQLite handler receives:
/// `tx: &mut SqliteTx<'_>`, used as `&mut **tx` with sqlx.
pub type SqliteTx<'c> = Transaction<'c, Sqlite>;

/// The default dedup table.
pub const DEFAULT_TABLE: &str = "idem_keys";

/// How long a writer waits for SQLite's write lock before giving up.
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
/// [`Sweeper`](crate::store::Sweeper) delete them in bounded batches.
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
    busy_timeout: Duration,
}

/// The store's SQL, built once from the validated table name.
#[derive(Debug)]
struct Statements {
    table: String,
    create: Arc<str>,
    claim: Arc<str>,
    select: Arc<str>,
    complete_tx: Arc<str>,
    complete_lease: Arc<str>,
    release: Arc<str>,
    extend: Arc<str>,
    sweep: Arc<str>,
}

impl Statements {
    fn new(t: &str) -> Self {
        let index = format!("{}_expires_at", t.replace('.', "_"));
        let s = |sql: String| -> Arc<str> { sql.into() };
        Statements {
            table: t.to_owned(),
            create: s(format!(
                "CREATE TABLE IF NOT EXISTS {t} (
                    handler TEXT NOT NULL,
                    key TEXT NOT NULL,
                    status TEXT NOT NULL,
                    token TEXT,
                    outcome TEXT,
                    attempts INTEGER NOT NULL,
                    created_at INTEGER NOT NULL,
                    updated_at INTEGER NOT NULL,
                    expires_at INTEGER NOT NULL,
                    PRIMARY KEY (handler, key)
                ) WITHOUT ROWID;
                CREATE INDEX IF NOT EXISTS {index} ON {tn} (expires_at);",
                tn = t.rsplit('.').next().unwrap_or(t),
            )),
            // ?1 handler ?2 key ?3 token ?4 now ?5 expires_at
            // A row that exists and has not expired is left alone and returns
            // nothing; an expired one is taken over.
            claim: s(format!(
                "INSERT INTO {t} (handler, key, status, token, outcome, attempts, created_at, updated_at, expires_at)
                 VALUES (?1, ?2, 'in_progress', ?3, NULL, 1, ?4, ?4, ?5)
                 ON CONFLICT (handler, key) DO UPDATE SET
                    status = 'in_progress', token = excluded.token, outcome = NULL,
                    attempts = CASE WHEN {t}.status = 'in_progress' THEN {t}.attempts + 1 ELSE 1 END,
                    created_at = excluded.created_at, updated_at = excluded.updated_at,
                    expires_at = excluded.expires_at
                 WHERE {t}.expires_at <= ?4
                 RETURNING token"
            )),
            select: s(format!(
                "SELECT handler, key, status, outcome, attempts, created_at, updated_at, expires_at
                 FROM {t} WHERE handler = ?1 AND key = ?2"
            )),
            // ?1 handler ?2 key ?3 outcome ?4 now ?5 expires_at
            complete_tx: s(format!(
                "UPDATE {t} SET status = 'completed', token = NULL, outcome = ?3, updated_at = ?4, expires_at = ?5
                 WHERE handler = ?1 AND key = ?2"
            )),
            // ?1 handler ?2 key ?3 outcome ?4 now ?5 expires_at ?6 token
            complete_lease: s(format!(
                "UPDATE {t} SET status = 'completed', token = NULL, outcome = ?3, updated_at = ?4, expires_at = ?5
                 WHERE handler = ?1 AND key = ?2 AND token = ?6 AND status = 'in_progress'"
            )),
            release: s(format!(
                "DELETE FROM {t} WHERE handler = ?1 AND key = ?2 AND token = ?3 AND status = 'in_progress'"
            )),
            // ?1 handler ?2 key ?3 token ?4 now ?5 lease_until
            extend: s(format!(
                "UPDATE {t} SET updated_at = ?4, expires_at = ?5
                 WHERE handler = ?1 AND key = ?2 AND token = ?3 AND status = 'in_progress'"
            )),
            sweep: s(format!(
                "DELETE FROM {t} WHERE (handler, key) IN
                    (SELECT handler, key FROM {t} WHERE expires_at <= ?1 ORDER BY expires_at LIMIT ?2)"
            )),
        }
    }
}

fn q(sql: &Arc<str>) -> AssertSqlSafe<Arc<str>> {
    // Built only from a validated identifier; every value is a bound parameter.
    AssertSqlSafe(Arc::clone(sql))
}

fn backend(e: sqlx::Error, busy_timeout: Duration) -> StoreError {
    if let sqlx::Error::Database(db) = &e {
        // SQLITE_BUSY (5) and SQLITE_LOCKED (6), with extended codes.
        if let Some(code) = db.code().and_then(|c| c.parse::<i32>().ok()) {
            if code & 0xff == 5 || code & 0xff == 6 {
                return StoreError::Timeout(busy_timeout);
            }
        }
    }
    if matches!(e, sqlx::Error::PoolTimedOut) {
        return StoreError::Timeout(busy_timeout);
    }
    StoreError::backend(e)
}

impl SqliteStore {
    /// Opens (creating if needed) the database file at `path`, in WAL mode
    /// with a 5 s busy timeout. Call [`migrate`](Self::migrate) before use.
    pub async fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        let options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .busy_timeout(DEFAULT_BUSY_TIMEOUT);
        Self::connect_with(options).await
    }

    /// Connects with a sqlx URL such as `sqlite://data/idem.db?mode=rwc`.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let options = SqliteConnectOptions::from_str(url)
            .map_err(StoreError::backend)?
            .busy_timeout(DEFAULT_BUSY_TIMEOUT);
        Self::connect_with(options).await
    }

    /// Connects with explicit sqlx options. Set the busy timeout on them
    /// with [`SqliteConnectOptions::busy_timeout`]; `busy_timeout` here is
    /// what the store reports in [`StoreError::Timeout`] and
    /// [`Error::InProgress`](crate::Error::InProgress).
    pub async fn connect_with(options: SqliteConnectOptions) -> Result<Self, StoreError> {
        registry::check()?;
        let busy_timeout = DEFAULT_BUSY_TIMEOUT;
        let pool = SqlitePoolOptions::new()
            .acquire_timeout(busy_timeout.max(Duration::from_secs(5)))
            .connect_with(options)
            .await
            .map_err(StoreError::backend)?;
        let mut store = Self::from_pool(pool);
        store.busy_timeout = busy_timeout;
        Ok(store)
    }

    /// Uses an existing pool, e.g. the application's own, so that business
    /// tables and the dedup table share one database.
    pub fn from_pool(pool: SqlitePool) -> Self {
        SqliteStore {
            pool,
            sql: Arc::new(Statements::new(DEFAULT_TABLE)),
            clock: Arc::new(SystemClock),
            busy_timeout: DEFAULT_BUSY_TIMEOUT,
        }
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
        self.sql = Arc::new(Statements::new(table));
        Ok(self)
    }

    /// Reads time from `clock` instead of the system clock (for tests).
    pub fn with_clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Checks a table name: ASCII letters, digits and `_`, optionally
    /// `schema.table`, each part at most 63 bytes and not starting with a digit.
    pub fn validate_table_name(table: &str) -> Result<(), StoreError> {
        validate_table_name(table)
    }

    /// The sqlx pool, for the application's own queries.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// The dedup table's name.
    pub fn table(&self) -> &str {
        &self.sql.table
    }

    /// Creates the dedup table and its expiry index if they do not exist.
    /// Safe to call at every start-up and from several processes.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        sqlx::raw_sql(q(&self.sql.create))
            .execute(&self.pool)
            .await
            .map_err(|e| backend(e, self.busy_timeout))?;
        Ok(())
    }

    /// Deletes at most `batch` expired records, oldest first; returns how many.
    pub async fn sweep_expired(&self, batch: u32) -> Result<u64, StoreError> {
        let r = sqlx::query(q(&self.sql.sweep))
            .bind(self.clock.now_millis())
            .bind(i64::from(batch))
            .execute(&self.pool)
            .await
            .map_err(|e| backend(e, self.busy_timeout))?;
        Ok(r.rows_affected())
    }

    /// The record of `key` under handler `handler`, if any.
    pub async fn record(&self, handler: &str, key: &Key) -> Result<Option<Record>, StoreError> {
        let row = sqlx::query(q(&self.sql.select))
            .bind(handler)
            .bind(key.as_str())
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| backend(e, self.busy_timeout))?;
        row.map(|r| to_record(&r)).transpose()
    }

    /// How many records the table holds, expired or not.
    pub async fn count(&self) -> Result<i64, StoreError> {
        let sql = format!("SELECT COUNT(*) FROM {}", self.sql.table);
        sqlx::query_scalar(AssertSqlSafe(sql))
            .fetch_one(&self.pool)
            .await
            .map_err(|e| backend(e, self.busy_timeout))
    }

    /// The state that stands for `(handler, key)` when a claim did not take it.
    /// `None` means the record vanished in between (released or swept).
    async fn standing(
        &self,
        conn: &mut sqlx::SqliteConnection,
        spec: &HandlerSpec,
        key: &Key,
        now: i64,
    ) -> Result<Option<Standing>, StoreError> {
        let row = sqlx::query(q(&self.sql.select))
            .bind(spec.name)
            .bind(key.as_str())
            .fetch_optional(conn)
            .await
            .map_err(|e| backend(e, self.busy_timeout))?;
        let Some(row) = row else { return Ok(None) };
        let record = to_record(&row)?;
        Ok(Some(match record.status {
            Status::Completed => Standing::Completed(record.outcome.unwrap_or_default()),
            Status::InProgress => Standing::InProgress(Duration::from_millis(
                u64::try_from(record.expires_at_ms - now).unwrap_or(0),
            )),
        }))
    }

    async fn try_claim<'e, X>(
        &self,
        exec: X,
        spec: &HandlerSpec,
        key: &Key,
        token: Option<&str>,
        now: i64,
    ) -> Result<bool, StoreError>
    where
        X: sqlx::Executor<'e, Database = Sqlite>,
    {
        let lease_until = now.saturating_add(millis(spec.lease));
        let row = sqlx::query(q(&self.sql.claim))
            .bind(spec.name)
            .bind(key.as_str())
            .bind(token)
            .bind(now)
            .bind(lease_until)
            .fetch_optional(exec)
            .await
            .map_err(|e| backend(e, self.busy_timeout))?;
        Ok(row.is_some())
    }
}

enum Standing {
    Completed(String),
    InProgress(Duration),
}

fn to_record(row: &sqlx::sqlite::SqliteRow) -> Result<Record, StoreError> {
    let get = |e: sqlx::Error| StoreError::Schema(format!("unexpected dedup row: {e}"));
    let status: String = row.try_get("status").map_err(get)?;
    Ok(Record {
        handler: row.try_get("handler").map_err(get)?,
        key: row.try_get("key").map_err(get)?,
        status: Status::parse(&status)
            .ok_or_else(|| StoreError::Schema(format!("unknown status {status:?}")))?,
        outcome: row.try_get("outcome").map_err(get)?,
        attempts: row.try_get("attempts").map_err(get)?,
        created_at_ms: row.try_get("created_at").map_err(get)?,
        updated_at_ms: row.try_get("updated_at").map_err(get)?,
        expires_at_ms: row.try_get("expires_at").map_err(get)?,
    })
}

/// How often a lease claim retries when the record it lost to vanished
/// before it could be read (released or swept in between).
const CLAIM_RETRIES: usize = 8;

impl LeaseStore for SqliteStore {
    fn store_name(&self) -> &'static str {
        "sqlite"
    }

    async fn claim(&self, spec: &'static HandlerSpec, key: &Key) -> Result<Claim, StoreError> {
        let mut conn = self
            .pool
            .acquire()
            .await
            .map_err(|e| backend(e, self.busy_timeout))?;
        for _ in 0..CLAIM_RETRIES {
            let now = self.clock.now_millis();
            let token = uuid::Uuid::new_v4().simple().to_string();
            if self
                .try_claim(&mut *conn, spec, key, Some(&token), now)
                .await?
            {
                return Ok(Claim::Acquired { token });
            }
            match self.standing(&mut conn, spec, key, now).await? {
                Some(Standing::Completed(outcome)) => return Ok(Claim::Completed { outcome }),
                Some(Standing::InProgress(retry_after)) => {
                    return Ok(Claim::InProgress { retry_after });
                }
                None => continue,
            }
        }
        Err(StoreError::Timeout(self.busy_timeout))
    }

    async fn complete(
        &self,
        spec: &'static HandlerSpec,
        key: &Key,
        token: &str,
        outcome: &str,
    ) -> Result<bool, StoreError> {
        let now = self.clock.now_millis();
        let r = sqlx::query(q(&self.sql.complete_lease))
            .bind(spec.name)
            .bind(key.as_str())
            .bind(outcome)
            .bind(now)
            .bind(now.saturating_add(millis(spec.ttl)))
            .bind(token)
            .execute(&self.pool)
            .await
            .map_err(|e| backend(e, self.busy_timeout))?;
        Ok(r.rows_affected() == 1)
    }

    async fn release(
        &self,
        spec: &'static HandlerSpec,
        key: &Key,
        token: &str,
    ) -> Result<(), StoreError> {
        sqlx::query(q(&self.sql.release))
            .bind(spec.name)
            .bind(key.as_str())
            .bind(token)
            .execute(&self.pool)
            .await
            .map_err(|e| backend(e, self.busy_timeout))?;
        Ok(())
    }

    async fn extend(
        &self,
        spec: &'static HandlerSpec,
        key: &Key,
        token: &str,
    ) -> Result<bool, StoreError> {
        let now = self.clock.now_millis();
        let r = sqlx::query(q(&self.sql.extend))
            .bind(spec.name)
            .bind(key.as_str())
            .bind(token)
            .bind(now)
            .bind(now.saturating_add(millis(spec.lease)))
            .execute(&self.pool)
            .await
            .map_err(|e| backend(e, self.busy_timeout))?;
        Ok(r.rows_affected() == 1)
    }
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
            .map_err(|e| backend(e, self.busy_timeout))?;
        let now = self.clock.now_millis();
        if self.try_claim(&mut *tx, spec, key, None, now).await? {
            return Ok(TxClaim::Fresh(tx));
        }
        // We hold the write lock: the row cannot change before we read it.
        let standing = self.standing(&mut tx, spec, key, now).await?;
        tx.rollback()
            .await
            .map_err(|e| backend(e, self.busy_timeout))?;
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
            .map_err(|e| backend(e, self.busy_timeout))?;
        tx.commit()
            .await
            .map_err(|e| backend(e, self.busy_timeout))?;
        Ok(TxCommit::Committed)
    }

    async fn rollback(&self, tx: Self::Tx) -> Result<(), StoreError> {
        tx.rollback()
            .await
            .map_err(|e| backend(e, self.busy_timeout))
    }
}

impl Sweep for SqliteStore {
    async fn sweep_expired(&self, batch: u32) -> Result<u64, StoreError> {
        SqliteStore::sweep_expired(self, batch).await
    }
}
