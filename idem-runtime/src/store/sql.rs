//! What the SQL stores share: their statements, built once per table from
//! one template, and the lease-mode logic, written once and stamped out for
//! each store by [`sql_store!`].

use std::sync::Arc;
use std::time::Duration;

use sqlx::AssertSqlSafe;

use crate::store::{Record, Status};

/// The SQL dialects of the stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dialect {
    Sqlite,
    Postgres,
}

/// The store's SQL, built once from a validated table name. Values are
/// always bound parameters; the only text spliced in is the table name,
/// which [`validate_table_name`](super::validate_table_name) restricted to
/// letters, digits, `_` and one `.`.
#[derive(Debug)]
pub(crate) struct Statements {
    pub(crate) table: String,
    /// Creates the table and its expiry index (several statements).
    pub(crate) create: Arc<str>,
    /// Serialises concurrent migrations (Postgres): `CREATE ... IF NOT
    /// EXISTS` alone can still collide in the catalog.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) lock_migration: Option<Arc<str>>,
    /// `$1` handler `$2` key `$3` token `$4` now `$5` lease end: takes an
    /// absent or expired row as `in_progress`, returns a row if it did.
    pub(crate) claim: Arc<str>,
    /// `$1` handler `$2` key `$3` outcome `$4` now `$5` expiry: inserts a
    /// `completed` row, or takes over an expired one; affects no row when a
    /// live one stands (transaction mode, claim last).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) claim_with_outcome: Arc<str>,
    /// `$1` handler `$2` key: the record.
    pub(crate) select: Arc<str>,
    /// `$1` handler `$2` key `$3` outcome `$4` now `$5` expiry.
    pub(crate) complete_tx: Arc<str>,
    /// As `complete_tx`, if token `$6` still holds the claim.
    pub(crate) complete_lease: Arc<str>,
    /// `$1` handler `$2` key `$3` token.
    pub(crate) release: Arc<str>,
    /// `$1` handler `$2` key `$3` token `$4` now `$5` lease end.
    pub(crate) extend: Arc<str>,
    /// `$1` now `$2` batch: deletes at most a batch of expired rows.
    pub(crate) sweep: Arc<str>,
    pub(crate) count: Arc<str>,
}

impl Statements {
    pub(crate) fn new(t: &str, dialect: Dialect) -> Self {
        let (schema, bare) = match t.split_once('.') {
            Some((schema, bare)) => (Some(schema), bare),
            None => (None, t),
        };
        let (int, create_tail, index, sweep) = match dialect {
            Dialect::Sqlite => (
                "INTEGER",
                ") WITHOUT ROWID",
                // SQLite names the index's schema on the index, not the table.
                format!(
                    "CREATE INDEX IF NOT EXISTS {}{bare}_expires_at ON {bare} (expires_at)",
                    schema.map(|s| format!("{s}.")).unwrap_or_default()
                ),
                format!(
                    "DELETE FROM {t} WHERE (handler, key) IN
                        (SELECT handler, key FROM {t} WHERE expires_at <= $1 ORDER BY expires_at LIMIT $2)"
                ),
            ),
            Dialect::Postgres => (
                "BIGINT",
                ")",
                format!("CREATE INDEX IF NOT EXISTS {bare}_expires_at ON {t} (expires_at)"),
                // Rows another transaction holds are skipped, not waited for.
                format!(
                    "DELETE FROM {t} WHERE ctid = ANY (ARRAY(
                        SELECT ctid FROM {t} WHERE expires_at <= $1
                        ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED))"
                ),
            ),
        };
        // An expired row is taken over; a live one is left alone and the
        // statement returns (or affects) nothing.
        let take_over = "ON CONFLICT (handler, key) DO UPDATE SET
                status = excluded.status, token = excluded.token, outcome = excluded.outcome,
                attempts = CASE WHEN cur.status = 'in_progress' AND excluded.status = 'in_progress'
                                THEN cur.attempts + 1 ELSE 1 END,
                created_at = excluded.created_at, updated_at = excluded.updated_at,
                expires_at = excluded.expires_at
             WHERE cur.expires_at <= excluded.created_at";
        let columns =
            "handler, key, status, token, outcome, attempts, created_at, updated_at, expires_at";
        let sql = |text: String| -> Arc<str> {
            match dialect {
                Dialect::Postgres => text.into(),
                // `?N` is SQLite's numbered parameter.
                Dialect::Sqlite => text.replace('$', "?").into(),
            }
        };
        Statements {
            table: t.to_owned(),
            create: sql(format!(
                "CREATE TABLE IF NOT EXISTS {t} (
                    handler TEXT NOT NULL,
                    key TEXT NOT NULL,
                    status TEXT NOT NULL,
                    token TEXT,
                    outcome TEXT,
                    attempts {int} NOT NULL,
                    created_at {int} NOT NULL,
                    updated_at {int} NOT NULL,
                    expires_at {int} NOT NULL,
                    PRIMARY KEY (handler, key)
                {create_tail};
                {index};"
            )),
            lock_migration: (dialect == Dialect::Postgres).then(|| {
                sql(format!(
                    "SELECT pg_advisory_xact_lock(hashtext('idem_migrate_' || '{t}'))"
                ))
            }),
            claim: sql(format!(
                "INSERT INTO {t} AS cur ({columns})
                 VALUES ($1, $2, 'in_progress', $3, NULL, 1, $4, $4, $5)
                 {take_over}
                 RETURNING 1"
            )),
            claim_with_outcome: sql(format!(
                "INSERT INTO {t} AS cur ({columns})
                 VALUES ($1, $2, 'completed', NULL, $3, 1, $4, $4, $5)
                 {take_over}"
            )),
            select: sql(format!(
                "SELECT handler, key, status, outcome, attempts, created_at, updated_at, expires_at
                 FROM {t} WHERE handler = $1 AND key = $2"
            )),
            complete_tx: sql(format!(
                "UPDATE {t} SET status = 'completed', token = NULL, outcome = $3, updated_at = $4, expires_at = $5
                 WHERE handler = $1 AND key = $2"
            )),
            complete_lease: sql(format!(
                "UPDATE {t} SET status = 'completed', token = NULL, outcome = $3, updated_at = $4, expires_at = $5
                 WHERE handler = $1 AND key = $2 AND token = $6 AND status = 'in_progress'"
            )),
            release: sql(format!(
                "DELETE FROM {t} WHERE handler = $1 AND key = $2 AND token = $3 AND status = 'in_progress'"
            )),
            extend: sql(format!(
                "UPDATE {t} SET updated_at = $4, expires_at = $5
                 WHERE handler = $1 AND key = $2 AND token = $3 AND status = 'in_progress'"
            )),
            sweep: sql(sweep),
            count: sql(format!("SELECT COUNT(*) FROM {t}")),
        }
    }
}

/// A statement for sqlx. Built only from a validated identifier; every value
/// is a bound parameter.
pub(crate) fn q(sql: &Arc<str>) -> AssertSqlSafe<Arc<str>> {
    AssertSqlSafe(Arc::clone(sql))
}

/// The record that stands when a claim did not take the key.
pub(crate) enum Standing {
    Completed(String),
    InProgress(Duration),
}

impl Standing {
    pub(crate) fn of(record: Record, now: i64) -> Self {
        match record.status {
            Status::Completed => Standing::Completed(record.outcome.unwrap_or_default()),
            Status::InProgress => Standing::InProgress(Duration::from_millis(
                u64::try_from(record.expires_at_ms - now).unwrap_or(0),
            )),
        }
    }
}

/// How often a lease claim retries when the record it lost to vanished
/// before it could be read (released or swept in between).
pub(crate) const CLAIM_RETRIES: usize = 8;

/// The parts of a SQL store that do not depend on its driver, stamped out for
/// `$store` (with fields `pool`, `sql`, `clock` and the methods
/// `fn err(&self, sqlx::Error) -> StoreError` and `fn lock_wait(&self,
/// &sqlx::Error) -> Option<Duration>`, the latter `Some` when a claim gave
/// up waiting on another transaction holding the key).
///
/// `$example` opens the doc examples of the generated public methods: the
/// code fence (with `no_run` when the store needs a server) and hidden lines
/// that bind a migrated `store` inside an `async fn main` returning
/// `Result<(), Box<dyn Error>>`; each example closes it.
macro_rules! sql_store {
    ($store:ty, $db:ty, $row:ty, $name:literal, $example:literal) => {
        impl $store {
            /// The sqlx pool, for the application's own queries.
            ///
            /// # Examples
            ///
            #[doc = $example]
            /// sqlx::query("CREATE TABLE IF NOT EXISTS shipments (order_id BIGINT PRIMARY KEY)")
            ///     .execute(store.pool())
            ///     .await?;
            /// # Ok(()) }
            /// ```
            pub fn pool(&self) -> &sqlx::Pool<$db> {
                &self.pool
            }

            /// The dedup table's name.
            ///
            /// # Examples
            ///
            #[doc = $example]
            /// assert_eq!(store.table(), "idem_keys");
            /// # Ok(()) }
            /// ```
            pub fn table(&self) -> &str {
                &self.sql.table
            }

            /// Reads time from `clock` instead of the system clock (for tests).
            ///
            /// # Examples
            ///
            #[doc = $example]
            /// use idem_runtime::clock::ManualClock;
            /// use std::time::Duration;
            ///
            /// let clock = ManualClock::starting_now();
            /// let store = store.with_clock(clock.clone());
            /// // a day later, by this store's clock: day-long records are expired
            /// clock.advance(Duration::from_secs(86_400));
            /// store.sweep_expired(1_000).await?;
            /// # Ok(()) }
            /// ```
            pub fn with_clock(mut self, clock: impl $crate::clock::Clock) -> Self {
                self.clock = std::sync::Arc::new(clock);
                self
            }

            /// Deletes at most `batch` expired records, oldest first; returns
            /// how many.
            ///
            /// # Examples
            ///
            #[doc = $example]
            /// let deleted = store.sweep_expired(1_000).await?;
            /// assert_eq!(deleted, 0); // nothing has expired yet
            /// # Ok(()) }
            /// ```
            pub async fn sweep_expired(&self, batch: u32) -> Result<u64, StoreError> {
                let r = sqlx::query($crate::store::sql::q(&self.sql.sweep))
                    .bind(self.clock.now_millis())
                    .bind(i64::from(batch))
                    .execute(&self.pool)
                    .await
                    .map_err(|e| self.err(e))?;
                Ok(r.rows_affected())
            }

            /// The record of `key` under handler `handler`, if any.
            ///
            /// # Examples
            ///
            #[doc = $example]
            /// use idem_runtime::Key;
            ///
            /// let key = Key::from_parts(&[&1u64, &"apple"])?;
            /// match store.record("deduct_stock", &key).await? {
            ///     Some(r) => println!("{:?} at {}: {:?}", r.status, r.updated_at_ms, r.outcome),
            ///     None => println!("not seen within its ttl"),
            /// }
            /// # Ok(()) }
            /// ```
            pub async fn record(
                &self,
                handler: &str,
                key: &Key,
            ) -> Result<Option<$crate::store::Record>, StoreError> {
                let row = sqlx::query($crate::store::sql::q(&self.sql.select))
                    .bind(handler)
                    .bind(key.as_str())
                    .fetch_optional(&self.pool)
                    .await
                    .map_err(|e| self.err(e))?;
                row.map(|r| Self::to_record(&r)).transpose()
            }

            /// How many records the table holds, expired or not.
            ///
            /// # Examples
            ///
            #[doc = $example]
            /// assert_eq!(store.count().await?, 0);
            /// # Ok(()) }
            /// ```
            pub async fn count(&self) -> Result<i64, StoreError> {
                sqlx::query_scalar($crate::store::sql::q(&self.sql.count))
                    .fetch_one(&self.pool)
                    .await
                    .map_err(|e| self.err(e))
            }

            fn to_record(row: &$row) -> Result<$crate::store::Record, StoreError> {
                use sqlx::Row as _;
                let get = |e: sqlx::Error| StoreError::Schema(format!("unexpected dedup row: {e}"));
                let status: String = row.try_get("status").map_err(get)?;
                Ok($crate::store::Record {
                    handler: row.try_get("handler").map_err(get)?,
                    key: row.try_get("key").map_err(get)?,
                    status: $crate::store::Status::parse(&status)
                        .ok_or_else(|| StoreError::Schema(format!("unknown status {status:?}")))?,
                    outcome: row.try_get("outcome").map_err(get)?,
                    attempts: row.try_get("attempts").map_err(get)?,
                    created_at_ms: row.try_get("created_at").map_err(get)?,
                    updated_at_ms: row.try_get("updated_at").map_err(get)?,
                    expires_at_ms: row.try_get("expires_at").map_err(get)?,
                })
            }

            /// What stands for `(handler, key)` when a claim did not take it;
            /// `None` when the record vanished in between.
            async fn standing<'e, X>(
                &self,
                exec: X,
                spec: &HandlerSpec,
                key: &Key,
                now: i64,
            ) -> Result<Option<$crate::store::sql::Standing>, StoreError>
            where
                X: sqlx::Executor<'e, Database = $db>,
            {
                let row = sqlx::query($crate::store::sql::q(&self.sql.select))
                    .bind(spec.name)
                    .bind(key.as_str())
                    .fetch_optional(exec)
                    .await
                    .map_err(|e| self.err(e))?;
                row.map(|r| Ok($crate::store::sql::Standing::of(Self::to_record(&r)?, now)))
                    .transpose()
            }

            /// Runs the claim statement; `Ok(true)` when it took the key.
            async fn try_claim<'e, X>(
                &self,
                exec: X,
                spec: &HandlerSpec,
                key: &Key,
                token: Option<&str>,
                now: i64,
                hold: std::time::Duration,
            ) -> Result<bool, sqlx::Error>
            where
                X: sqlx::Executor<'e, Database = $db>,
            {
                let row = sqlx::query($crate::store::sql::q(&self.sql.claim))
                    .bind(spec.name)
                    .bind(key.as_str())
                    .bind(token)
                    .bind(now)
                    .bind(now.saturating_add($crate::clock::millis(hold)))
                    .fetch_optional(exec)
                    .await?;
                Ok(row.is_some())
            }
        }

        impl $crate::store::contract::LeaseStore for $store {
            fn store_name(&self) -> &'static str {
                $name
            }

            async fn claim(
                &self,
                spec: &'static HandlerSpec,
                key: &Key,
            ) -> Result<$crate::store::contract::Claim, StoreError> {
                use $crate::store::contract::Claim;
                use $crate::store::sql::Standing;
                for _ in 0..$crate::store::sql::CLAIM_RETRIES {
                    let now = self.clock.now_millis();
                    let token = uuid::Uuid::new_v4().simple().to_string();
                    match self
                        .try_claim(&self.pool, spec, key, Some(&token), now, spec.lease)
                        .await
                    {
                        Ok(true) => return Ok(Claim::Acquired { token }),
                        Ok(false) => {}
                        Err(e) => {
                            return match self.lock_wait(&e) {
                                Some(lease_left) => Ok(Claim::InProgress { lease_left }),
                                None => Err(self.err(e)),
                            };
                        }
                    }
                    match self.standing(&self.pool, spec, key, now).await? {
                        Some(Standing::Completed(outcome)) => {
                            return Ok(Claim::Completed { outcome });
                        }
                        Some(Standing::InProgress(lease_left)) => {
                            return Ok(Claim::InProgress { lease_left });
                        }
                        None => continue,
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
                let now = self.clock.now_millis();
                let r = sqlx::query($crate::store::sql::q(&self.sql.complete_lease))
                    .bind(spec.name)
                    .bind(key.as_str())
                    .bind(outcome)
                    .bind(now)
                    .bind(now.saturating_add($crate::clock::millis(spec.ttl)))
                    .bind(token)
                    .execute(&self.pool)
                    .await
                    .map_err(|e| self.err(e))?;
                Ok(r.rows_affected() == 1)
            }

            async fn release(
                &self,
                spec: &'static HandlerSpec,
                key: &Key,
                token: &str,
            ) -> Result<(), StoreError> {
                sqlx::query($crate::store::sql::q(&self.sql.release))
                    .bind(spec.name)
                    .bind(key.as_str())
                    .bind(token)
                    .execute(&self.pool)
                    .await
                    .map_err(|e| self.err(e))?;
                Ok(())
            }

            async fn extend(
                &self,
                spec: &'static HandlerSpec,
                key: &Key,
                token: &str,
            ) -> Result<bool, StoreError> {
                let now = self.clock.now_millis();
                let r = sqlx::query($crate::store::sql::q(&self.sql.extend))
                    .bind(spec.name)
                    .bind(key.as_str())
                    .bind(token)
                    .bind(now)
                    .bind(now.saturating_add($crate::clock::millis(spec.lease)))
                    .execute(&self.pool)
                    .await
                    .map_err(|e| self.err(e))?;
                Ok(r.rows_affected() == 1)
            }
        }

        impl $crate::store::Sweep for $store {
            async fn sweep_expired(&self, batch: u32) -> Result<u64, StoreError> {
                <$store>::sweep_expired(self, batch).await
            }
        }
    };
}

pub(crate) use sql_store;
