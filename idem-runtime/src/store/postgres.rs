//! The PostgreSQL store (feature `postgres`).
//!
//! # Examples
//!
//! ```no_run
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use idem_runtime::{ClaimOrder, PgStore};
//!
//! let store = PgStore::connect("postgres://app@db.internal/shop")
//!     .await?
//!     .with_claim_order(ClaimOrder::First);
//! store.migrate().await?;
//! # Ok(()) }
//! ```

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::Connection as _;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions};
use sqlx::{Postgres, Transaction};

use crate::clock::{Clock, SystemClock, millis};
use crate::error::StoreError;
use crate::key::Key;
use crate::registry::{self, HandlerSpec};
use crate::store::contract::{TxClaim, TxCommit, TxStore};
use crate::store::sql::{Dialect, Standing, Statements, q, sql_store};
use crate::store::validate_table_name;

/// The transaction a transaction-mode Postgres handler receives:
/// `tx: &mut PgTx<'_>`, used as `&mut **tx` with sqlx.
///
/// # Examples
///
/// A helper a handler's body calls with its transaction:
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use idem_runtime::{PgStore, PgTx};
///
/// async fn ship(tx: &mut PgTx<'_>, order_id: i64) -> Result<(), sqlx::Error> {
///     sqlx::query("INSERT INTO shipments (order_id) VALUES ($1)")
///         .bind(order_id)
///         .execute(&mut **tx)
///         .await?;
///     Ok(())
/// }
///
/// let store = PgStore::connect("postgres://postgres@127.0.0.1/test").await?;
/// let mut tx: PgTx<'_> = store.pool().begin().await?;
/// ship(&mut tx, 17).await?;
/// tx.commit().await?;
/// # Ok(()) }
/// ```
pub type PgTx<'c> = Transaction<'c, Postgres>;

/// The default dedup table.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let pool = sqlx::postgres::PgPoolOptions::new().connect_lazy("postgres://postgres@127.0.0.1/test")?;
/// use idem_runtime::store::postgres::{DEFAULT_TABLE, PgStore};
///
/// let store = PgStore::from_pool(pool);
/// assert_eq!(store.table(), DEFAULT_TABLE);
/// assert_eq!(DEFAULT_TABLE, "idem_keys");
/// # Ok(()) }
/// ```
pub const DEFAULT_TABLE: &str = "idem_keys";

/// How long a claim waits on another transaction holding the same key
/// before the call returns [`Error::InProgress`](crate::Error::InProgress).
///
/// # Examples
///
/// ```
/// use idem_runtime::store::postgres::DEFAULT_LOCK_TIMEOUT;
/// use std::time::Duration;
///
/// assert_eq!(DEFAULT_LOCK_TIMEOUT, Duration::from_secs(5));
/// ```
pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(5);

/// When a transaction-mode handler writes its dedup row.
///
/// Both orders keep the invariant: the row, the body's writes and the outcome
/// commit together or not at all.
///
/// # Examples
///
/// ```
/// use idem_runtime::ClaimOrder;
/// assert_eq!(ClaimOrder::default(), ClaimOrder::Last);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ClaimOrder {
    /// After the body, in one statement that carries the outcome: one extra
    /// statement a fresh message. A duplicate's body runs and is rolled back
    /// when the insert finds the row. The default: it is the faster one (see
    /// the README's benchmark).
    #[default]
    Last,
    /// Before the body, with the outcome written by an `UPDATE` before the
    /// commit: two extra statements a fresh message, but a duplicate is turned
    /// away before its body runs. Choose it when a duplicate body is expensive
    /// or has effects a rollback does not undo (sequence values, `NOTIFY`
    /// delivered at commit are fine; calls to other systems are not).
    First,
}

/// The PostgreSQL store, through sqlx.
///
/// * **Transaction mode** (a handler with `tx: &mut PgTx<'_>`): the dedup row
///   is written in the body's transaction; see [`ClaimOrder`] for when.
/// * **Lease mode** (no transaction parameter): the claim is one `INSERT ...
///   ON CONFLICT DO UPDATE ... WHERE expired RETURNING` carrying a fencing
///   token; completion, release and lease extension compare the token.
///
/// Times are the consumer's clock in milliseconds since the epoch (keep
/// consumers' clocks in sync with NTP, as leases assume anyway). Expired rows
/// are reclaimed at claim time and deleted by [`sweep_expired`] in bounded
/// batches on the `expires_at` index.
///
/// A claim that waits on another transaction holding the same key gives up
/// after the connection's `lock_timeout` (5 s when the store made the pool)
/// with [`Error::InProgress`](crate::Error::InProgress).
///
/// [`sweep_expired`]: PgStore::sweep_expired
///
/// # Examples
///
/// ```no_run,standalone_crate
/// use idem_runtime::{idempotent, Outcome, PgStore, PgTx};
///
/// #[derive(serde::Deserialize)]
/// struct OrderPlaced { order_id: i64, sku: String, qty: i64 }
///
/// #[idempotent(key = "order_id + sku", ttl = "24h", store = "postgres")]
/// async fn deduct_stock(tx: &mut PgTx<'_>, msg: &OrderPlaced) -> Result<i64, sqlx::Error> {
///     sqlx::query_scalar("UPDATE inventory SET stock = stock - $1 WHERE sku = $2 RETURNING stock")
///         .bind(msg.qty)
///         .bind(&msg.sku)
///         .fetch_one(&mut **tx)
///         .await
/// }
///
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let store = PgStore::connect("postgres://postgres@127.0.0.1/test").await?;
/// store.migrate().await?;
/// let msg = OrderPlaced { order_id: 1, sku: "apple".into(), qty: 3 };
/// match deduct_stock(&store, &msg).await? {
///     Outcome::Executed(left) => println!("deducted, {left} left"),
///     Outcome::Duplicate(left) => println!("seen before, {left} left then"),
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct PgStore {
    pool: PgPool,
    sql: Arc<Statements>,
    clock: Arc<dyn Clock>,
    lock_timeout: Duration,
    order: ClaimOrder,
}

fn is_lock_timeout(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db) if db.code().as_deref() == Some("55P03"))
}

fn backend(e: sqlx::Error) -> StoreError {
    StoreError::backend(e)
}

impl PgStore {
    /// Connects with a URL such as `postgres://user@host/db`, setting the
    /// session's `lock_timeout` to 5 s. Call [`migrate`](Self::migrate)
    /// before use.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_runtime::PgStore;
    ///
    /// let store = PgStore::connect("postgres://app:secret@db.internal:5432/shop").await?;
    /// store.migrate().await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let options = PgConnectOptions::from_str(url).map_err(backend)?;
        Self::connect_with(options, PgPoolOptions::new()).await
    }

    /// Connects with explicit sqlx options; adds `lock_timeout = 5s` to the
    /// connection options.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_runtime::PgStore;
    /// use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
    ///
    /// let options = PgConnectOptions::new()
    ///     .host("db.internal")
    ///     .username("app")
    ///     .database("shop");
    /// let store = PgStore::connect_with(options, PgPoolOptions::new().max_connections(32)).await?;
    /// store.migrate().await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect_with(
        options: PgConnectOptions,
        pool: PgPoolOptions,
    ) -> Result<Self, StoreError> {
        registry::check()?;
        let options = options.options([(
            "lock_timeout",
            format!("{}ms", DEFAULT_LOCK_TIMEOUT.as_millis()),
        )]);
        // One direct connection first: a pool retries a refused connection
        // until its acquire timeout (30 s) and then reports only the
        // timeout, while this fails at once with the cause. Only a failure
        // to reach the server is final here; anything else (a server still
        // starting up, 57P03) is left to the pool, which retries it.
        let deadline = pool.get_acquire_timeout();
        match tokio::time::timeout(deadline, PgConnection::connect_with(&options)).await {
            Ok(Ok(conn)) => {
                let _ = conn.close().await;
            }
            Ok(Err(e @ sqlx::Error::Io(_))) => return Err(backend(e)),
            Ok(Err(_)) => {}
            Err(_) => return Err(StoreError::Timeout(deadline)),
        }
        let pool = pool.connect_with(options).await.map_err(backend)?;
        Ok(Self::from_pool(pool))
    }

    /// Uses an existing pool (the application's own), so business tables and
    /// the dedup table share transactions. The pool's `lock_timeout` is what
    /// bounds a claim's wait; set it on the connections (`SET lock_timeout`)
    /// and tell the store with [`with_lock_timeout`](Self::with_lock_timeout).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_runtime::PgStore;
    /// use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
    /// use std::time::Duration;
    ///
    /// let options: PgConnectOptions = "postgres://app@db.internal/shop".parse()?;
    /// let pool = PgPoolOptions::new()
    ///     .connect_with(options.options([("lock_timeout", "2s")]))
    ///     .await?;
    /// let store = PgStore::from_pool(pool.clone()).with_lock_timeout(Duration::from_secs(2));
    /// store.migrate().await?;
    /// # Ok(()) }
    /// ```
    pub fn from_pool(pool: PgPool) -> Self {
        PgStore {
            pool,
            sql: Arc::new(Statements::new(DEFAULT_TABLE, Dialect::Postgres)),
            clock: Arc::new(SystemClock),
            lock_timeout: DEFAULT_LOCK_TIMEOUT,
            order: ClaimOrder::default(),
        }
    }

    /// Uses `table` instead of `idem_keys`: a plain identifier, optionally
    /// `schema.table`.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let pool = sqlx::postgres::PgPoolOptions::new().connect_lazy("postgres://postgres@127.0.0.1/test")?;
    /// use idem_runtime::PgStore;
    ///
    /// let store = PgStore::from_pool(pool).with_table("billing.idem_keys")?;
    /// assert_eq!(store.table(), "billing.idem_keys");
    /// assert!(store.clone().with_table("billing.idem-keys").is_err());
    /// # Ok(()) }
    /// ```
    pub fn with_table(mut self, table: &str) -> Result<Self, StoreError> {
        validate_table_name(table)?;
        self.sql = Arc::new(Statements::new(table, Dialect::Postgres));
        Ok(self)
    }

    /// The lock timeout reported as `retry_after` when a claim times out.
    ///
    /// Set it to the `lock_timeout` of the pool's connections when the store
    /// did not make the pool (see [`from_pool`](Self::from_pool)).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let pool = sqlx::postgres::PgPoolOptions::new().connect_lazy("postgres://postgres@127.0.0.1/test")?;
    /// use idem_runtime::PgStore;
    /// use std::time::Duration;
    ///
    /// let store = PgStore::from_pool(pool).with_lock_timeout(Duration::from_secs(2));
    /// # Ok(()) }
    /// ```
    pub fn with_lock_timeout(mut self, timeout: Duration) -> Self {
        self.lock_timeout = timeout;
        self
    }

    /// When transaction-mode handlers write their dedup row.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let pool = sqlx::postgres::PgPoolOptions::new().connect_lazy("postgres://postgres@127.0.0.1/test")?;
    /// use idem_runtime::PgStore;
    /// use idem_runtime::ClaimOrder;
    ///
    /// // duplicates are frequent and their bodies expensive: turn them away first
    /// let store = PgStore::from_pool(pool).with_claim_order(ClaimOrder::First);
    /// # Ok(()) }
    /// ```
    pub fn with_claim_order(mut self, order: ClaimOrder) -> Self {
        self.order = order;
        self
    }

    /// Creates the dedup table and its expiry index if they do not exist.
    /// Safe to call from several processes at once: the creation runs under
    /// a transaction-scoped advisory lock.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_runtime::PgStore;
    ///
    /// let store = PgStore::connect("postgres://postgres@127.0.0.1/test").await?;
    /// store.migrate().await?; // at every start-up, from every consumer
    /// # Ok(()) }
    /// ```
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await.map_err(|e| self.err(e))?;
        if let Some(lock) = &self.sql.lock_migration {
            sqlx::query(q(lock))
                .execute(&mut *tx)
                .await
                .map_err(|e| self.err(e))?;
        }
        sqlx::raw_sql(q(&self.sql.create))
            .execute(&mut *tx)
            .await
            .map_err(|e| self.err(e))?;
        tx.commit().await.map_err(|e| self.err(e))
    }

    fn err(&self, e: sqlx::Error) -> StoreError {
        // undefined_table, naming this store's table (`relation
        // "idem_keys" does not exist`), not one a trigger named.
        if let sqlx::Error::Database(db) = &e {
            let bare = self.sql.table.rsplit('.').next().unwrap_or_default();
            let relation = db.message().split('"').nth(1).unwrap_or_default();
            if db.code().as_deref() == Some("42P01") && relation.rsplit('.').next() == Some(bare) {
                return StoreError::MissingTable {
                    table: self.sql.table.clone(),
                };
            }
        }
        backend(e)
    }

    /// A claim that gave up waiting on another transaction holding the key.
    fn lock_wait(&self, e: &sqlx::Error) -> Option<Duration> {
        is_lock_timeout(e).then_some(self.lock_timeout)
    }

    fn in_progress(&self) -> TxClaim<PgTx<'static>> {
        TxClaim::InProgress {
            retry_after: self.lock_timeout,
        }
    }
}

sql_store!(
    PgStore,
    Postgres,
    sqlx::postgres::PgRow,
    "postgres",
    // The generated methods' examples need a server: compiled, not run.
    "```no_run\n\
     # #[tokio::main(flavor = \"current_thread\")]\n\
     # async fn main() -> Result<(), Box<dyn std::error::Error>> {\n\
     # let store = idem_runtime::PgStore::connect(\"postgres://postgres@127.0.0.1/test\").await?;\n\
     # store.migrate().await?;"
);

impl TxStore for PgStore {
    type Tx = PgTx<'static>;

    fn store_name(&self) -> &'static str {
        "postgres"
    }

    async fn begin_claim(
        &self,
        spec: &'static HandlerSpec,
        key: &Key,
    ) -> Result<TxClaim<Self::Tx>, StoreError> {
        let mut tx = self.pool.begin().await.map_err(|e| self.err(e))?;
        if self.order == ClaimOrder::Last {
            return Ok(TxClaim::Fresh(tx));
        }
        let now = self.clock.now_millis();
        let won = self
            .try_claim(&mut *tx, spec, key, None, now, spec.ttl)
            .await;
        match won {
            Ok(true) => return Ok(TxClaim::Fresh(tx)),
            Ok(false) => {}
            Err(e) if is_lock_timeout(&e) => return Ok(self.in_progress()),
            Err(e) => return Err(self.err(e)),
        }
        let standing = self.standing(&mut *tx, spec, key, now).await?;
        tx.rollback().await.map_err(|e| self.err(e))?;
        match standing {
            Some(Standing::Completed(outcome)) => Ok(TxClaim::Completed { outcome }),
            Some(Standing::InProgress(retry_after)) => Ok(TxClaim::InProgress { retry_after }),
            // Deleted between our conflict and our read: let the redelivery retry.
            None => Ok(self.in_progress()),
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
        let expires_at = now.saturating_add(millis(spec.ttl));
        let sql = match self.order {
            ClaimOrder::First => &self.sql.complete_tx,
            ClaimOrder::Last => &self.sql.claim_with_outcome,
        };
        let r = sqlx::query(q(sql))
            .bind(spec.name)
            .bind(key.as_str())
            .bind(outcome)
            .bind(now)
            .bind(expires_at)
            .execute(&mut *tx)
            .await;
        match r {
            Ok(r) if r.rows_affected() == 1 => {}
            Ok(_) => {
                // Claim-last found a live row: this delivery is a duplicate.
                // Its body's writes roll back with the transaction.
                let standing = self.standing(&mut *tx, spec, key, now).await?;
                tx.rollback().await.map_err(|e| self.err(e))?;
                return Ok(match standing {
                    Some(Standing::Completed(outcome)) => TxCommit::Duplicate { outcome },
                    Some(Standing::InProgress(retry_after)) => TxCommit::InProgress { retry_after },
                    None => TxCommit::InProgress {
                        retry_after: self.lock_timeout,
                    },
                });
            }
            Err(e) if is_lock_timeout(&e) => {
                tx.rollback().await.map_err(|e| self.err(e))?;
                return Ok(TxCommit::InProgress {
                    retry_after: self.lock_timeout,
                });
            }
            Err(e) => return Err(self.err(e)),
        }
        tx.commit().await.map_err(|e| self.err(e))?;
        Ok(TxCommit::Committed)
    }

    async fn rollback(
        &self,
        tx: Self::Tx,
        spec: &'static HandlerSpec,
        key: &Key,
    ) -> Result<Option<String>, StoreError> {
        tx.rollback().await.map_err(|e| self.err(e))?;
        if self.order == ClaimOrder::First {
            // The claim came first: a failing body was never a duplicate's.
            return Ok(None);
        }
        // Claiming last, a duplicate's body ran before the claim could turn
        // it away, and it may have failed for that very reason (the first
        // delivery took the stock). A live completed record is the answer.
        // The rollback went through: the transaction's connection was fine.
        // A failure to read the record now is no reason to call the body's
        // failure a store failure; the body's error stands.
        let now = self.clock.now_millis();
        match self.record(spec.name, key).await {
            Ok(record) => Ok(record
                .filter(|r| r.status == crate::store::Status::Completed && r.expires_at_ms > now)
                .and_then(|r| r.outcome)),
            Err(e) => {
                tracing::warn!(error = %e, "could not look the key up after the body failed; its own error stands");
                Ok(None)
            }
        }
    }
}
