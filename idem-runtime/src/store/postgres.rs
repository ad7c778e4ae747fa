//! The PostgreSQL store (feature `postgres`).

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{AssertSqlSafe, Postgres, Row, Transaction};

use crate::clock::{Clock, SystemClock, millis};
use crate::driver::{Claim, LeaseStore, TxClaim, TxCommit, TxStore};
use crate::error::StoreError;
use crate::key::Key;
use crate::registry::{self, HandlerSpec};
use crate::store::{Record, Status, Sweep, validate_table_name};

/// The transaction a transaction-mode Postgres handler receives:
/// `tx: &mut PgTx<'_>`, used as `&mut **tx` with sqlx.
pub type PgTx<'c> = Transaction<'c, Postgres>;

/// The default dedup table.
pub const DEFAULT_TABLE: &str = "idem_keys";

/// How long a claim waits on another transaction holding the same key
/// before the call returns [`Error::InProgress`](crate::Error::InProgress).
pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(5);

/// When a transaction-mode handler writes its dedup row.
///
/// Both orders keep the invariant: the row, the body's writes and the outcome
/// commit together or not at all.
///
/// # Examples
///
/// ```
/// use idem_runtime::store::postgres::ClaimOrder;
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
/// ```no_run
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

#[derive(Debug)]
struct Statements {
    table: String,
    create: Arc<str>,
    lock_migration: Arc<str>,
    claim: Arc<str>,
    claim_with_outcome: Arc<str>,
    select: Arc<str>,
    complete_tx: Arc<str>,
    complete_lease: Arc<str>,
    release: Arc<str>,
    extend: Arc<str>,
    sweep: Arc<str>,
    count: Arc<str>,
}

impl Statements {
    fn new(t: &str) -> Self {
        let bare = t.rsplit('.').next().unwrap_or(t);
        let s = |sql: String| -> Arc<str> { sql.into() };
        // Upserts take an expired row over; a live one is left alone and the
        // statement returns (or affects) nothing.
        let take_over = "ON CONFLICT (handler, key) DO UPDATE SET
                status = excluded.status, token = excluded.token, outcome = excluded.outcome,
                attempts = CASE WHEN cur.status = 'in_progress' AND excluded.status = 'in_progress'
                                THEN cur.attempts + 1 ELSE 1 END,
                created_at = excluded.created_at, updated_at = excluded.updated_at,
                expires_at = excluded.expires_at
             WHERE cur.expires_at <= excluded.created_at";
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
                    created_at BIGINT NOT NULL,
                    updated_at BIGINT NOT NULL,
                    expires_at BIGINT NOT NULL,
                    PRIMARY KEY (handler, key)
                );
                CREATE INDEX IF NOT EXISTS {bare}_expires_at ON {t} (expires_at);"
            )),
            // Serialises concurrent migrations of the same table: CREATE ...
            // IF NOT EXISTS alone can still collide in the catalog.
            lock_migration: s(format!(
                "SELECT pg_advisory_xact_lock(hashtext('idem_migrate_' || '{t}'))"
            )),
            // $1 handler $2 key $3 token $4 now $5 lease_until
            claim: s(format!(
                "INSERT INTO {t} AS cur (handler, key, status, token, outcome, attempts, created_at, updated_at, expires_at)
                 VALUES ($1, $2, 'in_progress', $3, NULL, 1, $4, $4, $5)
                 {take_over}
                 RETURNING 1"
            )),
            // $1 handler $2 key $3 outcome $4 now $5 expires_at
            claim_with_outcome: s(format!(
                "INSERT INTO {t} AS cur (handler, key, status, token, outcome, attempts, created_at, updated_at, expires_at)
                 VALUES ($1, $2, 'completed', NULL, $3, 1, $4, $4, $5)
                 {take_over}"
            )),
            select: s(format!(
                "SELECT handler, key, status, outcome, attempts, created_at, updated_at, expires_at
                 FROM {t} WHERE handler = $1 AND key = $2"
            )),
            // $1 handler $2 key $3 outcome $4 now $5 expires_at
            complete_tx: s(format!(
                "UPDATE {t} SET status = 'completed', token = NULL, outcome = $3, updated_at = $4, expires_at = $5
                 WHERE handler = $1 AND key = $2"
            )),
            // $1 handler $2 key $3 outcome $4 now $5 expires_at $6 token
            complete_lease: s(format!(
                "UPDATE {t} SET status = 'completed', token = NULL, outcome = $3, updated_at = $4, expires_at = $5
                 WHERE handler = $1 AND key = $2 AND token = $6 AND status = 'in_progress'"
            )),
            release: s(format!(
                "DELETE FROM {t} WHERE handler = $1 AND key = $2 AND token = $3 AND status = 'in_progress'"
            )),
            // $1 handler $2 key $3 token $4 now $5 lease_until
            extend: s(format!(
                "UPDATE {t} SET updated_at = $4, expires_at = $5
                 WHERE handler = $1 AND key = $2 AND token = $3 AND status = 'in_progress'"
            )),
            // Rows another transaction holds are skipped, not waited for.
            sweep: s(format!(
                "DELETE FROM {t} WHERE ctid = ANY (ARRAY(
                    SELECT ctid FROM {t} WHERE expires_at <= $1
                    ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED))"
            )),
            count: s(format!("SELECT COUNT(*) FROM {t}")),
        }
    }
}

fn q(sql: &Arc<str>) -> AssertSqlSafe<Arc<str>> {
    // Built only from a validated identifier; every value is a bound parameter.
    AssertSqlSafe(Arc::clone(sql))
}

/// `lock_not_available`: a lock wait ran past `lock_timeout`.
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
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let options = PgConnectOptions::from_str(url).map_err(backend)?;
        Self::connect_with(options, PgPoolOptions::new()).await
    }

    /// Connects with explicit sqlx options; adds `lock_timeout = 5s` to the
    /// connection options.
    pub async fn connect_with(
        options: PgConnectOptions,
        pool: PgPoolOptions,
    ) -> Result<Self, StoreError> {
        registry::check()?;
        let options = options.options([(
            "lock_timeout",
            format!("{}ms", DEFAULT_LOCK_TIMEOUT.as_millis()),
        )]);
        let pool = pool.connect_with(options).await.map_err(backend)?;
        Ok(Self::from_pool(pool))
    }

    /// Uses an existing pool (the application's own), so business tables and
    /// the dedup table share transactions. The pool's `lock_timeout` is what
    /// bounds a claim's wait; set it on the connections (`SET lock_timeout`)
    /// and tell the store with [`with_lock_timeout`](Self::with_lock_timeout).
    pub fn from_pool(pool: PgPool) -> Self {
        PgStore {
            pool,
            sql: Arc::new(Statements::new(DEFAULT_TABLE)),
            clock: Arc::new(SystemClock),
            lock_timeout: DEFAULT_LOCK_TIMEOUT,
            order: ClaimOrder::default(),
        }
    }

    /// Uses `table` instead of `idem_keys`: a plain identifier, optionally
    /// `schema.table`.
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

    /// The lock timeout reported as `retry_after` when a claim times out.
    pub fn with_lock_timeout(mut self, timeout: Duration) -> Self {
        self.lock_timeout = timeout;
        self
    }

    /// When transaction-mode handlers write their dedup row.
    pub fn with_claim_order(mut self, order: ClaimOrder) -> Self {
        self.order = order;
        self
    }

    /// The sqlx pool, for the application's own queries.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The dedup table's name.
    pub fn table(&self) -> &str {
        &self.sql.table
    }

    /// Creates the dedup table and its expiry index if they do not exist.
    /// Safe to call from several processes at once: the creation runs under
    /// a transaction-scoped advisory lock.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await.map_err(backend)?;
        sqlx::query(q(&self.sql.lock_migration))
            .execute(&mut *tx)
            .await
            .map_err(backend)?;
        sqlx::raw_sql(q(&self.sql.create))
            .execute(&mut *tx)
            .await
            .map_err(backend)?;
        tx.commit().await.map_err(backend)
    }

    /// Deletes at most `batch` expired records, oldest first, skipping rows
    /// other transactions hold; returns how many.
    pub async fn sweep_expired(&self, batch: u32) -> Result<u64, StoreError> {
        let r = sqlx::query(q(&self.sql.sweep))
            .bind(self.clock.now_millis())
            .bind(i64::from(batch))
            .execute(&self.pool)
            .await
            .map_err(backend)?;
        Ok(r.rows_affected())
    }

    /// The record of `key` under handler `handler`, if any.
    pub async fn record(&self, handler: &str, key: &Key) -> Result<Option<Record>, StoreError> {
        let row = sqlx::query(q(&self.sql.select))
            .bind(handler)
            .bind(key.as_str())
            .fetch_optional(&self.pool)
            .await
            .map_err(backend)?;
        row.map(|r| to_record(&r)).transpose()
    }

    /// How many records the table holds, expired or not.
    pub async fn count(&self) -> Result<i64, StoreError> {
        sqlx::query_scalar(q(&self.sql.count))
            .fetch_one(&self.pool)
            .await
            .map_err(backend)
    }

    async fn standing<'e, X>(
        &self,
        exec: X,
        spec: &HandlerSpec,
        key: &Key,
        now: i64,
    ) -> Result<Option<Standing>, StoreError>
    where
        X: sqlx::Executor<'e, Database = Postgres>,
    {
        let row = sqlx::query(q(&self.sql.select))
            .bind(spec.name)
            .bind(key.as_str())
            .fetch_optional(exec)
            .await
            .map_err(backend)?;
        let Some(row) = row else { return Ok(None) };
        let record = to_record(&row)?;
        Ok(Some(match record.status {
            Status::Completed => Standing::Completed(record.outcome.unwrap_or_default()),
            Status::InProgress => Standing::InProgress(Duration::from_millis(
                u64::try_from(record.expires_at_ms - now).unwrap_or(0),
            )),
        }))
    }

    fn in_progress(&self) -> TxClaim<PgTx<'static>> {
        TxClaim::InProgress {
            retry_after: self.lock_timeout,
        }
    }
}

enum Standing {
    Completed(String),
    InProgress(Duration),
}

fn to_record(row: &sqlx::postgres::PgRow) -> Result<Record, StoreError> {
    let get = |e: sqlx::Error| StoreError::Schema(format!("unexpected dedup row: {e}"));
    let status: String = row.try_get("status").map_err(get)?;
    let attempts: i32 = row.try_get("attempts").map_err(get)?;
    Ok(Record {
        handler: row.try_get("handler").map_err(get)?,
        key: row.try_get("key").map_err(get)?,
        status: Status::parse(&status)
            .ok_or_else(|| StoreError::Schema(format!("unknown status {status:?}")))?,
        outcome: row.try_get("outcome").map_err(get)?,
        attempts: i64::from(attempts),
        created_at_ms: row.try_get("created_at").map_err(get)?,
        updated_at_ms: row.try_get("updated_at").map_err(get)?,
        expires_at_ms: row.try_get("expires_at").map_err(get)?,
    })
}

/// How often a lease claim retries when the record it lost to vanished
/// before it could be read (released or swept in between).
const CLAIM_RETRIES: usize = 8;

impl LeaseStore for PgStore {
    fn store_name(&self) -> &'static str {
        "postgres"
    }

    async fn claim(&self, spec: &'static HandlerSpec, key: &Key) -> Result<Claim, StoreError> {
        for _ in 0..CLAIM_RETRIES {
            let now = self.clock.now_millis();
            let token = uuid::Uuid::new_v4().simple().to_string();
            let won = sqlx::query(q(&self.sql.claim))
                .bind(spec.name)
                .bind(key.as_str())
                .bind(&token)
                .bind(now)
                .bind(now.saturating_add(millis(spec.lease)))
                .fetch_optional(&self.pool)
                .await;
            match won {
                Ok(Some(_)) => return Ok(Claim::Acquired { token }),
                Ok(None) => {}
                Err(e) if is_lock_timeout(&e) => {
                    return Ok(Claim::InProgress {
                        retry_after: self.lock_timeout,
                    });
                }
                Err(e) => return Err(backend(e)),
            }
            match self.standing(&self.pool, spec, key, now).await? {
                Some(Standing::Completed(outcome)) => return Ok(Claim::Completed { outcome }),
                Some(Standing::InProgress(retry_after)) => {
                    return Ok(Claim::InProgress { retry_after });
                }
                None => continue,
            }
        }
        Err(StoreError::Timeout(self.lock_timeout))
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
            .map_err(backend)?;
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
            .map_err(backend)?;
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
            .map_err(backend)?;
        Ok(r.rows_affected() == 1)
    }
}

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
        let mut tx = self.pool.begin().await.map_err(backend)?;
        if self.order == ClaimOrder::Last {
            return Ok(TxClaim::Fresh(tx));
        }
        let now = self.clock.now_millis();
        let won = sqlx::query(q(&self.sql.claim))
            .bind(spec.name)
            .bind(key.as_str())
            .bind(None::<&str>)
            .bind(now)
            .bind(now.saturating_add(millis(spec.ttl)))
            .fetch_optional(&mut *tx)
            .await;
        match won {
            Ok(Some(_)) => return Ok(TxClaim::Fresh(tx)),
            Ok(None) => {}
            Err(e) if is_lock_timeout(&e) => return Ok(self.in_progress()),
            Err(e) => return Err(backend(e)),
        }
        let standing = self.standing(&mut *tx, spec, key, now).await?;
        tx.rollback().await.map_err(backend)?;
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
                tx.rollback().await.map_err(backend)?;
                return Ok(match standing {
                    Some(Standing::Completed(outcome)) => TxCommit::Duplicate { outcome },
                    Some(Standing::InProgress(retry_after)) => TxCommit::InProgress { retry_after },
                    None => TxCommit::InProgress {
                        retry_after: self.lock_timeout,
                    },
                });
            }
            Err(e) if is_lock_timeout(&e) => {
                tx.rollback().await.map_err(backend)?;
                return Ok(TxCommit::InProgress {
                    retry_after: self.lock_timeout,
                });
            }
            Err(e) => return Err(backend(e)),
        }
        tx.commit().await.map_err(backend)?;
        Ok(TxCommit::Committed)
    }

    async fn rollback(&self, tx: Self::Tx) -> Result<(), StoreError> {
        tx.rollback().await.map_err(backend)
    }
}

impl Sweep for PgStore {
    async fn sweep_expired(&self, batch: u32) -> Result<u64, StoreError> {
        PgStore::sweep_expired(self, batch).await
    }
}
