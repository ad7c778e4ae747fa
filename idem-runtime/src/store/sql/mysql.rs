//! The MySQL / MariaDB store (feature `mysql`).
//!
//! # Examples
//!
//! ```no_run
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use idem_runtime::{ClaimOrder, MySqlStore};
//!
//! let store = MySqlStore::connect("mysql://app@db.internal/shop")
//!     .await?
//!     .with_claim_order(ClaimOrder::First);
//! store.migrate().await?;
//! # Ok(()) }
//! ```

use std::str::FromStr;
use std::time::Duration;

use sha2::{Digest, Sha256};
use sqlx::mysql::{
    MySqlConnectOptions, MySqlConnection, MySqlDatabaseError, MySqlPool, MySqlPoolOptions,
    MySqlQueryResult,
};
use sqlx::{AssertSqlSafe, Executor as _, MySql, Transaction};

use super::ClaimOrder;
use super::dialect::{Fault, TxEnd, WithCommit};
use super::pool;
use super::rows::{COLUMNS, NewRow};
use super::statements::insert_then_take_over;
use super::template::{Literals, Placeholders};
use super::{Dialect, SqlStore, reach};
use crate::error::{Contention, StoreError};
use crate::registry;

/// The transaction a transaction-mode MySQL handler receives:
/// `tx: &mut MySqlTx<'_>`, used as `&mut **tx` with sqlx.
///
/// # Examples
///
/// A helper a handler's body calls with its transaction:
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use idem_runtime::{MySqlStore, MySqlTx};
///
/// async fn ship(tx: &mut MySqlTx<'_>, order_id: i64) -> Result<(), sqlx::Error> {
///     sqlx::query("INSERT INTO shipments (order_id) VALUES (?)")
///         .bind(order_id)
///         .execute(&mut **tx)
///         .await?;
///     Ok(())
/// }
///
/// let store = MySqlStore::connect("mysql://root@127.0.0.1:3306/test").await?;
/// let mut tx: MySqlTx<'_> = store.pool().begin().await?;
/// ship(&mut tx, 17).await?;
/// tx.commit().await?;
/// # Ok(()) }
/// ```
pub type MySqlTx<'c> = Transaction<'c, MySql>;

/// The default dedup table.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let pool = sqlx::mysql::MySqlPoolOptions::new().connect_lazy("mysql://root@127.0.0.1:3306/test")?;
/// use idem_runtime::store::sql::mysql::{DEFAULT_TABLE, MySqlStore};
///
/// let store = MySqlStore::from_pool(pool);
/// assert_eq!(store.table(), DEFAULT_TABLE);
/// assert_eq!(DEFAULT_TABLE, "idem_keys");
/// # Ok(()) }
/// ```
pub const DEFAULT_TABLE: &str = super::table::DEFAULT_TABLE;

/// How long a claim waits on another transaction holding the same key
/// before the call returns [`Error::InProgress`](crate::Error::InProgress):
/// the session's `innodb_lock_wait_timeout` when the store makes the pool
/// (MySQL counts it in whole seconds).
///
/// # Examples
///
/// ```
/// use idem_runtime::store::sql::mysql::DEFAULT_LOCK_TIMEOUT;
/// use std::time::Duration;
///
/// assert_eq!(DEFAULT_LOCK_TIMEOUT, Duration::from_secs(5));
/// ```
pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(5);

/// How long `migrate` waits for another process's migration of the same
/// table to finish.
const MIGRATE_LOCK_WAIT: Duration = Duration::from_secs(30);

/// The MySQL / MariaDB store, through sqlx, on an InnoDB table.
///
/// * **Transaction mode** (a handler with `tx: &mut MySqlTx<'_>`): the dedup
///   row is written in the body's transaction, after the body (by default
///   with a read of the key's record before it) or before it; see
///   [`ClaimOrder`]. Claim, body writes and outcome commit
///   in one InnoDB transaction or not at all. The transaction runs with
///   `autocommit` off (set back when it ends), so a statement the body
///   sends after InnoDB ended it (a deadlock victim that runs its statement
///   again) is part of the call, never committed on its own; a lock wait
///   timeout or deadlock the body returns is the store's
///   [`StoreError::Contention`].
/// * **Lease mode** (no transaction parameter): the claim inserts a row with
///   a fencing token; completion, release and lease extension compare the
///   token.
///
/// A concurrent delivery of the same key waits on the row's lock for
/// `innodb_lock_wait_timeout` (5 s when the store made the pool) and then
/// gets [`Error::InProgress`](crate::Error::InProgress). Expired rows are
/// reclaimed at claim time and deleted by [`sweep_expired`]. Tested on
/// MariaDB 10.11; the statements fit MariaDB 10.6 and MySQL 8.0 or later.
/// How the claim, the round trips, the locks and the sweep work, and what
/// was measured to choose them: [the guide's MySQL chapter](crate::guide::mysql).
///
/// [`sweep_expired`]: MySqlStore::sweep_expired
///
/// # Examples
///
/// ```no_run,standalone_crate
/// use idem_runtime::{idempotent, MySqlStore, MySqlTx, Outcome};
///
/// #[derive(serde::Deserialize)]
/// struct OrderPlaced { order_id: i64, sku: String, qty: i64 }
///
/// #[idempotent(key = "order_id + sku", ttl = "24h", store = "mysql")]
/// async fn deduct_stock(tx: &mut MySqlTx<'_>, msg: &OrderPlaced) -> Result<u64, sqlx::Error> {
///     let done = sqlx::query("UPDATE inventory SET stock = stock - ? WHERE sku = ?")
///         .bind(msg.qty)
///         .bind(&msg.sku)
///         .execute(&mut **tx)
///         .await?;
///     Ok(done.rows_affected())
/// }
///
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let store = MySqlStore::connect("mysql://root@127.0.0.1:3306/test").await?;
/// store.migrate().await?;
/// let msg = OrderPlaced { order_id: 1, sku: "apple".into(), qty: 3 };
/// match deduct_stock(&store, &msg).await? {
///     Outcome::Executed(rows) => println!("deducted ({rows} row)"),
///     Outcome::Duplicate(_) => println!("seen before"),
/// }
/// # Ok(()) }
/// ```
pub type MySqlStore = SqlStore<MySql>;

impl super::ServerDialect for MySql {}

impl Dialect for MySql {
    // Index names are the table's own in MySQL: a fixed one fits any table.
    const OUTBOX_CREATE: &'static str = "CREATE TABLE IF NOT EXISTS {t} (seq BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY, id CHAR(36) CHARACTER SET ascii COLLATE ascii_bin NOT NULL, handler VARCHAR(255) CHARACTER SET utf8mb4 NOT NULL, destination VARCHAR(255) CHARACTER SET utf8mb4 NOT NULL, msg_key TEXT CHARACTER SET utf8mb4 NULL, lane CHAR(32) CHARACTER SET ascii COLLATE ascii_bin NOT NULL, payload LONGBLOB NOT NULL, headers LONGTEXT CHARACTER SET utf8mb4 NULL, staged_at BIGINT NOT NULL, attempts BIGINT NOT NULL DEFAULT 0, last_error TEXT CHARACTER SET utf8mb4 NULL, KEY idem_outbox_lane (lane, seq)) ENGINE = InnoDB";
    const OUTBOX_SEQS: &'static str =
        "(SELECT j.s FROM JSON_TABLE(:rows, '$[*]' COLUMNS (s BIGINT PATH '$')) AS j)";
    const OUTBOX_LOCK: &'static str = " FOR UPDATE SKIP LOCKED";
    const OUTBOX_HOLDS: bool = true;
    // A join, which MariaDB runs by the primary key, where `IN (subquery)`
    // in a single-table `DELETE` may scan the table.
    const OUTBOX_REMOVE: &'static str = "DELETE o FROM {t} AS o JOIN JSON_TABLE(:rows, '$[*]' COLUMNS (s BIGINT PATH '$')) AS j ON o.seq = j.s";
    const OUTBOX_RECHECK: bool = true;
    // Without gap locks: a relay's transaction locks only the rows it
    // publishes, so a handler's insert never waits on it.
    const RELAY_BEGIN: Option<&'static str> =
        Some("SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION");
    const OFFSETS_CREATE: &'static str = "CREATE TABLE IF NOT EXISTS {t} (consumer_group VARCHAR(255) NOT NULL, topic VARCHAR(249) NOT NULL, partition_id INT NOT NULL, next_offset BIGINT NOT NULL, PRIMARY KEY (consumer_group, topic, partition_id))";
    const OFFSETS_LOAD: &'static str = "SELECT topic, CAST(partition_id AS SIGNED), next_offset FROM {t} WHERE consumer_group = :consumer";
    const OFFSETS_UPSERT: &'static str = "INSERT INTO {t} (consumer_group, topic, partition_id, next_offset) VALUES (:consumer, :stream, :partition, :next) ON DUPLICATE KEY UPDATE next_offset = GREATEST(next_offset, VALUES(next_offset))";
    const STORE: &'static str = "mysql";
    const PLACEHOLDERS: Placeholders = Placeholders::Question;
    // `UTC_TIMESTAMP(3)` is the statement's start (as `NOW()`, unlike
    // `SYSDATE()`), in UTC whatever the session's `time_zone`, counted from
    // the epoch without a time-zone conversion: `UNIX_TIMESTAMP(NOW(3))`
    // would convert the session's local time back, ambiguous in the hour a
    // daylight-saving zone repeats. (No `:` in it: statements read `:name`
    // as a parameter.)
    const NOW: &'static str =
        "(TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(3)) DIV 1000)";
    // `KEY` is a reserved word in MySQL.
    const KEY: &'static str = "`key`";
    const MAX_HANDLER_LEN: usize = 128;
    // With autocommit off for the call: InnoDB ends the transaction of a
    // deadlock victim (and, with `innodb_rollback_on_timeout`, of a lock
    // wait timeout) while the body runs, and a statement the body sends
    // after that (retrying the one that failed) would run, and commit, on
    // its own, outside the claim. With autocommit off it opens a new
    // transaction, which the call's commit or rollback ends with the claim
    // and the outcome. `completion_type = 'RELEASE'` makes a `ROLLBACK` that
    // is not the store's own end the session: sqlx's, for a transaction
    // dropped unfinished (a call whose future is dropped, an error path),
    // so that no connection goes back to the pool with autocommit off (the
    // pool's release ping fails, and the pool closes the connection). The
    // `SET` is a statement of its own after sqlx's `BEGIN`: sqlx counts the
    // transaction open once the `BEGIN` is answered, so a call dropped while
    // the `SET` is on its way queues the `ROLLBACK` that ends the session;
    // sent with the `BEGIN`, a call dropped before the answer would leave
    // nothing queued and the session changed. The
    // store's own ends set both back ([`TxEnd`]): the commit by turning
    // autocommit on, which commits the open transaction (completion_type
    // does not apply to that implicit commit, and a commit that fails fails
    // the `SET`), one statement where `COMMIT NO RELEASE` and a `SET` would
    // be two; the rollback with `ROLLBACK NO RELEASE` first.
    const BEGIN: Option<&'static str> = None;
    const CALL_SESSION: Option<&'static str> =
        Some("SET autocommit = 0, completion_type = 'RELEASE'");
    const END: Option<TxEnd> = Some(TxEnd {
        commit: "SET autocommit = 1, completion_type = 'NO_CHAIN'",
        rollback: "ROLLBACK NO RELEASE; SET autocommit = 1, completion_type = 'NO_CHAIN'",
    });
    // Without gap locks: a sweep locks only the rows it deletes, so a claim
    // of a new key never waits on one.
    const SWEEP_BEGIN: Option<&'static str> =
        Some("SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION");
    const LATEST_READ: &'static str = " LOCK IN SHARE MODE";
    // A failed statement undoes only itself: after a duplicate key the
    // transaction, with the body's writes, goes on without a savepoint.
    const WITH_COMMIT: Option<WithCommit> = Some(WithCommit {
        savepoint: false,
        literals: Literals {
            // A binary string of the text's UTF-8 bytes, which the text
            // columns take as their character set's.
            text: |v| format!("X'{}'", crate::key::hex(v.as_bytes())),
            null_text: "NULL",
            integer: |n| format!("({n})"),
            null_integer: "NULL",
        },
    });
    const BATCH_ROWS: &'static str = "JSON_TABLE(:rows, '$[*]' COLUMNS (
            k VARCHAR(128) CHARACTER SET utf8mb4 PATH '$.k',
            f VARCHAR(32) CHARACTER SET ascii PATH '$.f',
            o LONGTEXT CHARACTER SET utf8mb4 PATH '$.o',
            t VARCHAR(32) CHARACTER SET ascii PATH '$.t')) AS r";
    const ADDED_COLUMNS: &'static [(u32, &'static str, &'static str)] = &[
        (2, "failures", "BIGINT NOT NULL DEFAULT 0"),
        (2, "last_error", "TEXT CHARACTER SET utf8mb4 NULL"),
        (
            2,
            "fingerprint",
            "CHAR(32) CHARACTER SET ascii COLLATE ascii_bin NULL",
        ),
        (3, "max_attempts", "BIGINT NULL"),
        (
            4,
            "traceparent",
            "VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NULL",
        ),
    ];

    fn columns(t: &str) -> String {
        let (schema, bare) = match t.split_once('.') {
            Some((schema, bare)) => (format!("'{schema}'"), bare),
            None => ("DATABASE()".to_owned(), t),
        };
        format!(
            "SELECT CAST(column_name AS CHAR) FROM information_schema.columns
             WHERE table_schema = {schema} AND table_name = '{bare}'"
        )
    }

    fn create(t: &str) -> String {
        // Index names are the table's own in MySQL: a fixed one fits any
        // table name.
        format!(
            "CREATE TABLE IF NOT EXISTS {t} (
                handler VARBINARY(128) NOT NULL,
                `key` VARBINARY(128) NOT NULL,
                status VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
                token CHAR(32) CHARACTER SET ascii COLLATE ascii_bin NULL,
                outcome LONGTEXT CHARACTER SET utf8mb4 NULL,
                attempts BIGINT NOT NULL,
                failures BIGINT NOT NULL DEFAULT 0,
                last_error TEXT CHARACTER SET utf8mb4 NULL,
                fingerprint CHAR(32) CHARACTER SET ascii COLLATE ascii_bin NULL,
                created_at BIGINT NOT NULL,
                updated_at BIGINT NOT NULL,
                expires_at BIGINT NOT NULL,
                max_attempts BIGINT NULL,
                traceparent VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NULL,
                PRIMARY KEY (handler, `key`),
                KEY idem_expires_at (expires_at)
            ) ENGINE = InnoDB"
        )
    }

    fn in_batch(column: &str) -> String {
        format!("{column} IN (SELECT r.k FROM {})", Self::BATCH_ROWS)
    }

    fn delete_from_rows(condition: &str) -> String {
        // A join, not `IN (subquery)`: MariaDB runs the latter once per row
        // of the handler.
        format!(
            "DELETE cur FROM {{t}} AS cur JOIN {} ON cur.handler = :handler AND cur.{{key}} = r.k
             WHERE {condition}",
            Self::BATCH_ROWS
        )
    }

    fn insert_ignoring(select: &str) -> String {
        format!("INSERT IGNORE INTO {{t}} ({COLUMNS}) {select}")
    }

    fn update_from_rows(assignments: &str, condition: &str) -> String {
        format!(
            "UPDATE {{t}} AS cur JOIN {} ON cur.handler = :handler AND cur.{{key}} = r.k
             SET {assignments} WHERE {condition}",
            Self::BATCH_ROWS
        )
    }

    fn take(row: NewRow) -> (String, Option<String>) {
        insert_then_take_over::<Self>(row)
    }

    fn sweep() -> String {
        // The expired keys are locked first, skipping rows a claim holds;
        // the delete then finds each by its primary key. A plain `DELETE ...
        // ORDER BY expires_at LIMIT n` would wait on a row a claim holds,
        // and on an uncommitted claim's index entry just past the expired
        // ones, while holding the rows it deleted so far.
        "DELETE cur FROM
            (SELECT handler, {key} FROM {t} WHERE expires_at <= {now}
             ORDER BY expires_at LIMIT :batch FOR UPDATE SKIP LOCKED) AS expired
         STRAIGHT_JOIN {t} AS cur FORCE INDEX (PRIMARY)
            ON cur.handler = expired.handler AND cur.{key} = expired.{key}"
            .to_owned()
    }

    fn fault(db: &dyn sqlx::error::DatabaseError) -> Fault {
        let Some(db) = db.try_downcast_ref::<MySqlDatabaseError>() else {
            return Fault::Other;
        };
        match db.number() {
            // ER_LOCK_WAIT_TIMEOUT
            1205 => Fault::LockWait,
            // ER_LOCK_DEADLOCK
            1213 => Fault::Deadlock,
            // ER_DUP_ENTRY
            1062 => Fault::Unique,
            // ER_BAD_FIELD_ERROR: `Unknown column 'failures' in 'field list'`
            1054 => Fault::MissingColumn,
            // ER_NO_SUCH_TABLE: `Table 'test.idem_keys' doesn't exist`
            1146 => Fault::MissingTable(
                db.message()
                    .split('\'')
                    .nth(1)
                    .unwrap_or_default()
                    .to_owned(),
            ),
            _ => Fault::Other,
        }
    }

    fn contention(db: &dyn sqlx::error::DatabaseError) -> Option<Contention> {
        match db.try_downcast_ref::<MySqlDatabaseError>()?.number() {
            1205 => Some(Contention::LockTimeout),
            1213 => Some(Contention::Deadlock),
            _ => None,
        }
    }

    fn rows_affected(done: &MySqlQueryResult) -> u64 {
        done.rows_affected()
    }
}

// A batch's rows travel as one JSON document (`:rows`): no statement names
// a column parameter, which binds as NULL.
impl super::exec::BindColumn for MySql {
    fn bind_column<'q>(
        query: sqlx::query::Query<'q, Self, Self::Arguments>,
        _column: &[Option<&str>],
    ) -> sqlx::query::Query<'q, Self, Self::Arguments> {
        query.bind(None::<&str>)
    }
}

impl SqlStore<MySql> {
    /// Connects with a URL such as `mysql://user@host:3306/db`, setting each
    /// session's `innodb_lock_wait_timeout` to 5 s. Call
    /// [`migrate`](Self::migrate) before use.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_runtime::MySqlStore;
    ///
    /// let store = MySqlStore::connect("mysql://app:secret@db.internal:3306/shop").await?;
    /// store.migrate().await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let options = MySqlConnectOptions::from_str(url).map_err(StoreError::backend)?;
        Self::connect_with(options, MySqlPoolOptions::new()).await
    }

    /// Connects over TLS, verified with `tls` (its CA, its client
    /// certificate for a server that asks for one), whatever the URL's
    /// `ssl-mode` says: `VERIFY_IDENTITY`, or `REQUIRED` when `tls` does not
    /// verify.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_runtime::{tls::Tls, MySqlStore};
    ///
    /// let tls = Tls::new().ca_file("/etc/ssl/shop-ca.pem")?;
    /// let store = MySqlStore::connect_tls("mysql://app@db.internal:3306/shop", &tls).await?;
    /// store.migrate().await?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    pub async fn connect_tls(url: &str, tls: &crate::tls::Tls) -> Result<Self, StoreError> {
        let options = MySqlConnectOptions::from_str(url).map_err(StoreError::backend)?;
        tls.warn_if_unverified("MySQL");
        Self::connect_with(tls.mysql(options)?, MySqlPoolOptions::new()).await
    }

    /// Connects with explicit sqlx options. Every connection of the pool
    /// sets its session's `innodb_lock_wait_timeout` to 5 s (in the pool's
    /// `after_connect`, replacing one the options had: to run code of your
    /// own there, make the pool and use [`from_pool`](Self::from_pool)).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_runtime::MySqlStore;
    /// use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};
    ///
    /// let options = MySqlConnectOptions::new()
    ///     .host("db.internal")
    ///     .username("app")
    ///     .database("shop");
    /// let store = MySqlStore::connect_with(options, MySqlPoolOptions::new().max_connections(32)).await?;
    /// store.migrate().await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect_with(
        options: MySqlConnectOptions,
        pool: MySqlPoolOptions,
    ) -> Result<Self, StoreError> {
        registry::check()?;
        reach::<MySqlConnection>(&options, pool.get_acquire_timeout()).await?;
        let pool = pool
            .after_connect(|conn, _| {
                Box::pin(async move {
                    conn.execute(AssertSqlSafe(format!(
                        "SET SESSION innodb_lock_wait_timeout = {}",
                        DEFAULT_LOCK_TIMEOUT.as_secs()
                    )))
                    .await
                    .map(drop)
                })
            })
            .connect_with(options)
            .await
            .map_err(StoreError::backend)?;
        Ok(Self::from_pool(pool))
    }

    /// Uses an existing pool (the application's own), so business tables and
    /// the dedup table share transactions. The session's
    /// `innodb_lock_wait_timeout` is what bounds a claim's wait (the server's
    /// default is 50 s); set it on the connections and tell the store with
    /// [`with_lock_timeout`](Self::with_lock_timeout).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_runtime::MySqlStore;
    /// use sqlx::Executor as _;
    /// use sqlx::mysql::MySqlPoolOptions;
    /// use std::time::Duration;
    ///
    /// let pool = MySqlPoolOptions::new()
    ///     .after_connect(|conn, _| Box::pin(async move {
    ///         conn.execute("SET SESSION innodb_lock_wait_timeout = 2").await.map(drop)
    ///     }))
    ///     .connect("mysql://app@db.internal/shop")
    ///     .await?;
    /// let store = MySqlStore::from_pool(pool.clone()).with_lock_timeout(Duration::from_secs(2));
    /// store.migrate().await?;
    /// # Ok(()) }
    /// ```
    pub fn from_pool(pool: MySqlPool) -> Self {
        SqlStore::new(pool, DEFAULT_LOCK_TIMEOUT, ClaimOrder::default())
    }

    /// Creates the dedup table and its expiry index if they do not exist,
    /// and upgrades a table of an earlier release in place (see
    /// [`schema_version`](Self::schema_version)). Safe to call from several
    /// processes at once: it runs under a named lock (`GET_LOCK`), waiting
    /// at most 30 s for another migration of the same table.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_runtime::MySqlStore;
    ///
    /// let store = MySqlStore::connect("mysql://root@127.0.0.1:3306/test").await?;
    /// store.migrate().await?; // at every start-up, from every consumer
    /// # Ok(()) }
    /// ```
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let lock = migrate_lock_name(self.table());
        let mut conn = pool::acquire(self.pool()).await.map_err(|e| self.err(e))?;
        // The named lock belongs to the session: should this call be
        // dropped while it holds it, the connection must close rather than
        // go back to the pool with it.
        conn.close_on_drop();
        let wait = i64::try_from(MIGRATE_LOCK_WAIT.as_secs()).unwrap_or(i64::MAX);
        let got: Option<i64> = sqlx::query_scalar("SELECT GET_LOCK(?, ?)")
            .bind(&lock)
            .bind(wait)
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| self.err(e))?;
        match got {
            Some(1) => {}
            Some(_) => return Err(StoreError::Timeout(MIGRATE_LOCK_WAIT)),
            None => {
                return Err(StoreError::Backend(
                    format!("GET_LOCK({lock:?}) failed").into(),
                ));
            }
        }
        let created = match sqlx::raw_sql(AssertSqlSafe(self.create_sql().clone()))
            .execute(&mut *conn)
            .await
        {
            Ok(_) => self.upgrade(&mut conn).await,
            Err(e) => Err(self.err(e)),
        };
        let released = sqlx::query("DO RELEASE_LOCK(?)")
            .bind(&lock)
            .execute(&mut *conn)
            .await;
        created?;
        released.map_err(|e| self.err(e))?;
        Ok(())
    }
}

/// The name of the lock that serialises migrations of `table`: at most 64
/// characters, as MySQL requires.
fn migrate_lock_name(table: &str) -> String {
    let name = format!("idem_migrate_{table}");
    if name.len() <= 64 {
        return name;
    }
    let digest = Sha256::digest(table.as_bytes());
    format!("idem_migrate_{}", &crate::key::hex(&digest)[..51])
}

#[cfg(test)]
mod tests {
    use super::migrate_lock_name;

    #[test]
    fn lock_names_fit() {
        assert_eq!(migrate_lock_name("idem_keys"), "idem_migrate_idem_keys");
        let long = format!("{}.{}", "s".repeat(63), "t".repeat(63));
        assert_eq!(migrate_lock_name(&long).len(), 64);
        assert_ne!(
            migrate_lock_name(&long),
            migrate_lock_name(&long.replace('t', "u"))
        );
    }
}
