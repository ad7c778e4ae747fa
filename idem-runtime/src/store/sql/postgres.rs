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
use std::time::Duration;

use sqlx::postgres::{
    PgConnectOptions, PgConnection, PgDatabaseError, PgPool, PgPoolOptions, PgQueryResult,
};
use sqlx::{AssertSqlSafe, Postgres, Transaction};

use super::dialect::{Fault, WithCommit};
use super::partitions::{PartitionedSql, Partitions, Upkeep};
use super::pool;
use super::rows::{COLUMNS, NewRow, insert_or_take_over};
use super::table::derived_name;
use super::template::{Literals, Placeholders, unicode_escapes};
use super::{ClaimOrder, RoundTrips};
use super::{Dialect, SqlStore, reach};
use crate::error::{Contention, StoreError};
use crate::registry;

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
/// use idem_runtime::store::sql::postgres::{DEFAULT_TABLE, PgStore};
///
/// let store = PgStore::from_pool(pool);
/// assert_eq!(store.table(), DEFAULT_TABLE);
/// assert_eq!(DEFAULT_TABLE, "idem_keys");
/// # Ok(()) }
/// ```
pub const DEFAULT_TABLE: &str = super::table::DEFAULT_TABLE;

/// How long a claim waits on another transaction holding the same key
/// before the call returns [`Error::InProgress`](crate::Error::InProgress).
///
/// # Examples
///
/// ```
/// use idem_runtime::store::sql::postgres::DEFAULT_LOCK_TIMEOUT;
/// use std::time::Duration;
///
/// assert_eq!(DEFAULT_LOCK_TIMEOUT, Duration::from_secs(5));
/// ```
pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(5);
/// The PostgreSQL store, through sqlx.
///
/// * **Transaction mode** (a handler with `tx: &mut PgTx<'_>`): the dedup row
///   is written in the body's transaction; see [`ClaimOrder`] for when.
/// * **Lease mode** (no transaction parameter): the claim is one `INSERT ...
///   ON CONFLICT DO UPDATE ... WHERE expired` carrying a fencing token;
///   completion, release and lease extension compare the token.
///
/// Times are the server's clock in milliseconds since the epoch, read in
/// each statement (`statement_timestamp()`, constant within it): leases,
/// expiry and the record's times are computed in SQL from the lease and the
/// ttl, never from the consumer's clock, so a consumer whose clock is off
/// neither takes over a live lease nor writes times into the future. Expired
/// rows are reclaimed at claim time and deleted by [`sweep_expired`] in
/// bounded batches on the `expires_at` index.
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
pub type PgStore = SqlStore<Postgres>;

impl super::ServerDialect for Postgres {}

impl Dialect for Postgres {
    const OUTBOX_CREATE: &'static str = "CREATE TABLE IF NOT EXISTS {t} (seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, id TEXT NOT NULL, handler TEXT NOT NULL, destination TEXT NOT NULL, msg_key TEXT, lane TEXT NOT NULL, payload BYTEA NOT NULL, headers TEXT, staged_at BIGINT NOT NULL, attempts BIGINT NOT NULL DEFAULT 0, last_error TEXT); CREATE INDEX IF NOT EXISTS {i} ON {t} (lane, seq)";
    const OUTBOX_SEQS: &'static str =
        "(SELECT CAST(value AS BIGINT) FROM json_array_elements_text(CAST(:rows AS json)))";
    const OUTBOX_LOCK: &'static str = " FOR UPDATE SKIP LOCKED";
    const OUTBOX_HOLDS: bool = true;
    // A relay's commit deletes rows the broker already has: lost in a
    // crash of the server, they are published again, under their ids. So
    // it does not wait for the WAL's flush, which would cost every pass
    // a disk write.
    const RELAY_BEGIN: Option<&'static str> = Some("BEGIN; SET LOCAL synchronous_commit = off");
    const OFFSETS_CREATE: &'static str = "CREATE TABLE IF NOT EXISTS {t} (consumer_group TEXT NOT NULL, topic TEXT NOT NULL, partition_id INTEGER NOT NULL, next_offset BIGINT NOT NULL, PRIMARY KEY (consumer_group, topic, partition_id))";
    const OFFSETS_LOAD: &'static str = "SELECT topic, CAST(partition_id AS BIGINT), next_offset FROM {t} WHERE consumer_group = :consumer";
    const OFFSETS_UPSERT: &'static str = "INSERT INTO {t} AS o (consumer_group, topic, partition_id, next_offset) VALUES (:consumer, :stream, :partition, :next) ON CONFLICT (consumer_group, topic, partition_id) DO UPDATE SET next_offset = GREATEST(o.next_offset, EXCLUDED.next_offset)";
    const STORE: &'static str = "postgres";
    const PLACEHOLDERS: Placeholders = Placeholders::Dollar;
    // The time the server received the statement: constant within it (and,
    // unlike `now()`, not the transaction's start, which a claim inside a
    // transaction-mode body would see long past).
    const NOW: &'static str = "(extract(epoch from statement_timestamp()) * 1000)::bigint";
    const KEY: &'static str = "key";
    const MAX_HANDLER_LEN: usize = usize::MAX;
    const BEGIN: Option<&'static str> = None;
    const SWEEP_BEGIN: Option<&'static str> = None;
    const LATEST_READ: &'static str = "";
    // Text arrays, which the server reads without parsing a document: a
    // shorter array (an empty one) reads as NULLs.
    const BATCH_ROWS: &'static str = "unnest(:keys::text[], :fingerprints::text[], \
         :outcomes::text[], :tokens::text[]) AS r(k, f, o, t)";
    const ROWS_AS_ARRAYS: bool = true;
    const WITH_COMMIT: Option<WithCommit> = Some(WithCommit {
        // A failed statement aborts the transaction: the savepoint keeps
        // the body's writes when the dedup insert meets a record.
        savepoint: true,
        literals: Literals {
            // A constant the planner uses like any other (an index key), of
            // escapes alone. The server refuses `U&'...'` when
            // `standard_conforming_strings` is off: the call then fails,
            // nothing is read otherwise.
            text: |v| format!("U&'{}'", unicode_escapes(v)),
            null_text: "NULL::text",
            integer: |n| format!("({n})::bigint"),
            null_integer: "NULL::bigint",
        },
    });
    const ADDED_COLUMNS: &'static [(u32, &'static str, &'static str)] = &[
        (2, "failures", "BIGINT NOT NULL DEFAULT 0"),
        (2, "last_error", "TEXT"),
        (2, "fingerprint", "TEXT"),
        (3, "max_attempts", "BIGINT"),
        (4, "traceparent", "TEXT"),
    ];

    fn columns(t: &str) -> String {
        // Unquoted names are folded to lower case.
        let (schema, bare) = match t.split_once('.') {
            Some((schema, bare)) => (format!("lower('{schema}')"), bare),
            None => ("current_schema()".to_owned(), t),
        };
        format!(
            "SELECT CAST(column_name AS text) FROM information_schema.columns
             WHERE table_schema = {schema} AND table_name = lower('{bare}')"
        )
    }

    fn create(t: &str) -> String {
        let bare = t.rsplit('.').next().unwrap_or(t);
        let index = expiry_index(bare);
        format!(
            "CREATE TABLE IF NOT EXISTS {t} (
                {COLUMN_TYPES},
                PRIMARY KEY (handler, key)
            );
            CREATE INDEX IF NOT EXISTS {index} ON {t} (expires_at);"
        )
    }

    const REACHES_BY_PLACE: bool = true;

    fn in_batch(column: &str) -> String {
        // Not in this dialect's batch statements, which look each key up
        // alone (`look_up`): as an index condition next to the handler's,
        // the planner may scan the handler's rows instead.
        format!("{column} = ANY (:keys::text[])")
    }

    fn select_keys(columns: &str) -> String {
        format!(
            "SELECT {columns} FROM unnest(:keys::text[]) AS r(k) {}",
            look_up("*", "cur")
        )
    }

    fn select_from_rows(columns: &str, condition: &str) -> String {
        format!(
            "SELECT {columns} FROM {} {} WHERE {condition}",
            Self::BATCH_ROWS,
            look_up("*", "cur")
        )
    }

    fn delete_from_rows(condition: &str) -> String {
        format!(
            "DELETE FROM {{t}} AS cur USING {}
             WHERE {FOUND} AND {condition}",
            found_rows()
        )
    }

    fn insert_ignoring(select: &str) -> String {
        // No conflict target: the primary key of a partitioned table is
        // `(handler, key, part)`, a plain one's `(handler, key)`.
        format!("INSERT INTO {{t}} ({COLUMNS}) {select} ON CONFLICT DO NOTHING")
    }

    const PARTITIONED: Option<fn(&str, Partitions) -> PartitionedSql> = Some(partitioned);
    const UPKEEP: Option<fn(&str) -> Upkeep> = Some(super::partitions::postgres_upkeep);

    fn update_from_rows(assignments: &str, condition: &str) -> String {
        format!(
            "UPDATE {{t}} AS cur SET {assignments} FROM {}
             WHERE {FOUND} AND {condition}",
            found_rows()
        )
    }

    fn take(row: NewRow) -> (String, Option<String>) {
        (insert_or_take_over(row), None)
    }

    fn sweep() -> String {
        // Rows another transaction holds are skipped, not waited for. A
        // place (`ctid`) is a partition's own: on a table partitioned
        // since the store was opened, one place names a row in each
        // partition, and only the expired ones may go.
        "DELETE FROM {t} WHERE ctid = ANY (ARRAY(
            SELECT ctid FROM {t} WHERE expires_at <= {now}
            ORDER BY expires_at LIMIT :batch FOR UPDATE SKIP LOCKED))
          AND expires_at <= {now}"
            .to_owned()
    }

    fn fault(db: &dyn sqlx::error::DatabaseError) -> Fault {
        match db.code().as_deref() {
            Some("55P03") => Fault::LockWait,
            // deadlock_detected, and serialization_failure (a pool whose
            // transactions run at REPEATABLE READ or SERIALIZABLE): the
            // transaction is rolled back whole and can run again.
            Some("40P01" | "40001") => Fault::Deadlock,
            // undefined_table: `relation "idem_keys" does not exist`
            // undefined_column
            Some("42703") => Fault::MissingColumn,
            // unique_violation
            Some("23505") => Fault::Unique,
            // no_active_sql_transaction
            Some("25P01") => Fault::NoTransaction,
            Some("42P01") => Fault::MissingTable(
                db.message()
                    .split('"')
                    .nth(1)
                    .unwrap_or_default()
                    .to_owned(),
            ),
            _ => Fault::Other,
        }
    }

    fn contention(db: &dyn sqlx::error::DatabaseError) -> Option<Contention> {
        match db.try_downcast_ref::<PgDatabaseError>()?.code() {
            "55P03" => Some(Contention::LockTimeout),
            "40P01" => Some(Contention::Deadlock),
            "40001" => Some(Contention::Serialization),
            _ => None,
        }
    }

    fn rows_affected(done: &PgQueryResult) -> u64 {
        done.rows_affected()
    }
}

impl super::exec::BindColumn for Postgres {
    fn bind_column<'q>(
        query: sqlx::query::Query<'q, Self, Self::Arguments>,
        column: &[Option<&str>],
    ) -> sqlx::query::Query<'q, Self, Self::Arguments> {
        query.bind(column)
    }
}

/// The dedup table's columns with their types, as this release creates
/// them, plain or partitioned.
const COLUMN_TYPES: &str = "handler TEXT NOT NULL, key TEXT NOT NULL, status TEXT NOT NULL,
    token TEXT, outcome TEXT, attempts BIGINT NOT NULL, failures BIGINT NOT NULL DEFAULT 0,
    last_error TEXT, fingerprint TEXT, created_at BIGINT NOT NULL, updated_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL, max_attempts BIGINT, traceparent TEXT";

/// The lookup of a batch row `r`'s record: `columns` of it, as `alias`,
/// from one search of the primary key's index for `:handler` and the key,
/// whatever the statistics say. Given `handler = :handler AND key = ANY
/// (:keys)` instead, a planner that takes the handler for a rare value (a
/// handler new since the last `ANALYZE`, or a table that grew fast) reads
/// every row of the handler and filters them on the keys: a batch's cost
/// grows with the table. A subquery that refers to `r` is run once per
/// row, and `LIMIT 1` (the key is unique) keeps it from being pulled up
/// into a join the planner would choose.
fn look_up(columns: &str, alias: &str) -> String {
    format!(
        "CROSS JOIN LATERAL
            (SELECT {columns} FROM {{t}} WHERE handler = :handler AND {{key}} = r.k LIMIT 1)
            AS {alias}"
    )
}

/// The batch's rows `r` with where their records stand, for an update or
/// a delete to reach each record by its place (`FOUND`) rather than by a
/// condition on the handler, which would let the planner scan the
/// handler's rows (see [`look_up`]). A partition's row places are its own:
/// the partition (`tableoid`) is part of the place.
fn found_rows() -> String {
    format!(
        "(SELECT r.*, x.p, x.c FROM {} {}) AS r",
        <Postgres as Dialect>::BATCH_ROWS,
        look_up("tableoid AS p, ctid AS c", "x")
    )
}

/// The table's row, as `cur`, at the place [`found_rows`] found, still of
/// the same key.
const FOUND: &str = "cur.tableoid = r.p AND cur.ctid = r.c AND cur.{key} = r.k";

/// The SQL of a table partitioned by time, on the server's clock.
fn partitioned(table: &str, partitions: Partitions) -> PartitionedSql {
    super::partitions::postgres(table, partitions, <Postgres as Dialect>::NOW, COLUMN_TYPES)
}

/// Whether a server at `host` (or on a Unix socket) shares the consumer's
/// host: a loopback address, `localhost`, a socket directory. There a round
/// trip costs less than parsing a statement, and the two share the CPU: the
/// default [`RoundTrips`] is `Separate`; across a network, `Merged`.
///
/// A proxy on loopback in front of a remote server (pgbouncer, a cloud SQL
/// proxy) counts as this host: tell such a store `Merged` yourself.
fn on_this_host(host: &str, socket: bool) -> bool {
    let name = host.trim_end_matches('.').to_ascii_lowercase();
    socket
        || host.starts_with('/')
        || name == "localhost"
        || name.ends_with(".localhost")
        || host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.to_canonical().is_loopback() || ip.is_unspecified())
}

impl SqlStore<Postgres> {
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
        let options = PgConnectOptions::from_str(url).map_err(StoreError::backend)?;
        Self::connect_with(options, PgPoolOptions::new()).await
    }

    /// Connects over TLS, verified with `tls` (its CA, its client
    /// certificate for a server that asks for one), whatever the URL's
    /// `sslmode` says: `verify-full`, or `require` when `tls` does not
    /// verify.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_runtime::{tls::Tls, PgStore};
    ///
    /// let tls = Tls::new().ca_file("/etc/ssl/shop-ca.pem")?;
    /// let store = PgStore::connect_tls("postgres://app@db.internal:5432/shop", &tls).await?;
    /// store.migrate().await?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    pub async fn connect_tls(url: &str, tls: &crate::tls::Tls) -> Result<Self, StoreError> {
        let options = PgConnectOptions::from_str(url).map_err(StoreError::backend)?;
        tls.warn_if_unverified("PostgreSQL");
        Self::connect_with(tls.postgres(options)?, PgPoolOptions::new()).await
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
        reach::<PgConnection>(&options, pool.get_acquire_timeout()).await?;
        let pool = pool
            .connect_with(options)
            .await
            .map_err(StoreError::backend)?;
        Ok(Self::from_pool(pool))
    }

    /// Uses an existing pool (the application's own), so business tables and
    /// the dedup table share transactions. The pool's `lock_timeout` is what
    /// bounds a claim's wait; set it on the connections (`SET lock_timeout`)
    /// and tell the store with [`with_lock_timeout`](Self::with_lock_timeout).
    /// The pool's host decides the default [`RoundTrips`]: `Separate` on a
    /// loopback address, `localhost` or a Unix socket, `Merged` otherwise.
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
        let options = pool.connect_options();
        let trips = if on_this_host(options.get_host(), options.get_socket().is_some()) {
            RoundTrips::Separate
        } else {
            RoundTrips::Merged
        };
        SqlStore::new(pool, DEFAULT_LOCK_TIMEOUT, ClaimOrder::default()).with_round_trips(trips)
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
        let mut tx = pool::begin(self.pool(), None)
            .await
            .map_err(|e| self.err(e))?;
        self.lock_migration(&mut tx).await?;
        self.check_layout(&mut tx).await?;
        sqlx::raw_sql(AssertSqlSafe(self.create_sql().clone()))
            .execute(&mut *tx)
            .await
            .map_err(|e| self.err(e))?;
        self.upgrade(&mut tx).await?;
        tx.commit().await.map_err(|e| self.err(e))?;
        if self.partitioning().is_some() {
            // The partitions of now and ahead, before the first claim.
            self.sweep_expired(0).await?;
        }
        Ok(())
    }

    /// Partitions the dedup table by time ([`Partitions`]): expiry drops a
    /// partition whose records have all expired instead of deleting rows.
    /// Set it before [`migrate`](Self::migrate), which creates the
    /// partitioned table (and refuses a plain table of the same name: see
    /// [`partition_existing`](Self::partition_existing)), and run a
    /// [`Sweeper`](crate::Sweeper), which creates partitions ahead and drops
    /// expired ones. The layout and its guarantees are in
    /// [`guide::postgres`](crate::guide::postgres).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_runtime::store::sql::Partitions;
    /// use idem_runtime::{PgStore, Sweeper};
    /// use std::time::Duration;
    ///
    /// let store = PgStore::connect("postgres://app@db.internal/shop")
    ///     .await?
    ///     .with_partitions(Partitions::daily());
    /// store.migrate().await?;
    /// let _sweeper = Sweeper::spawn(store.clone(), Duration::from_secs(60), 10_000);
    /// # Ok(()) }
    /// ```
    pub fn with_partitions(self, partitions: Partitions) -> Self {
        self.set_partitions(Some(partitions))
    }

    /// How the dedup table is partitioned, if it is
    /// ([`with_partitions`](Self::with_partitions)).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let pool = sqlx::postgres::PgPoolOptions::new().connect_lazy("postgres://postgres@127.0.0.1/test")?;
    /// use idem_runtime::PgStore;
    /// use idem_runtime::store::sql::Partitions;
    ///
    /// let store = PgStore::from_pool(pool);
    /// assert_eq!(store.partitions(), None);
    /// let store = store.with_partitions(Partitions::daily());
    /// assert_eq!(store.partitions(), Some(Partitions::daily()));
    /// # Ok(()) }
    /// ```
    pub fn partitions(&self) -> Option<Partitions> {
        self.partitioning()
    }

    /// Turns the store's plain dedup table into a partitioned one
    /// ([`with_partitions`](Self::with_partitions), which must be set),
    /// keeping every record: the plain table becomes the partitioned
    /// table's first partition, whose records go on suppressing their
    /// duplicates (a key claimed again moves into the current period's
    /// partition), and which the sweeper drops once its last record
    /// expired, one ttl later. Most of the work (a column, a unique index
    /// built `CONCURRENTLY`, a validated check) runs beside the consumers
    /// without blocking them; the swap at the end takes the table's lock
    /// for a moment. Safe to run again after an interruption; a table
    /// already partitioned is left as it is. Consumers still running
    /// without [`with_partitions`](Self::with_partitions) fail their claims
    /// with [`StoreError`] after the swap, and retry them: deploy them with
    /// it. The steps, and how to do them by hand, are in
    /// [`guide::postgres`](crate::guide::postgres).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_runtime::PgStore;
    /// use idem_runtime::store::sql::Partitions;
    ///
    /// let store = PgStore::connect("postgres://app@db.internal/shop")
    ///     .await?
    ///     .with_partitions(Partitions::daily());
    /// store.partition_existing().await?; // once, at the deploy
    /// store.migrate().await?; // at every start-up
    /// # Ok(()) }
    /// ```
    pub async fn partition_existing(&self) -> Result<(), StoreError> {
        let Some(partitions) = self.partitioning() else {
            return Err(StoreError::Schema(format!(
                "`partition_existing` on `{}` needs the store's partitions: call `with_partitions` first",
                self.table()
            )));
        };
        let sql = partitioned(self.table(), partitions);
        let mut conn = pool::acquire(self.pool()).await.map_err(|e| self.err(e))?;
        let kind = self.relkind(&mut conn).await?;
        match kind.as_deref() {
            None => return self.migrate().await,
            Some("p") => return Ok(()),
            Some(_) => {}
        }
        // Columns of an earlier release first, so that the partition has
        // every column of the partitioned table.
        self.upgrade(&mut conn).await?;
        for step in &sql.convert_online {
            sqlx::raw_sql(AssertSqlSafe(step.clone()))
                .execute(&mut *conn)
                .await
                .map_err(|e| self.err(e))?;
        }
        drop(conn);
        let mut tx = pool::begin(self.pool(), None)
            .await
            .map_err(|e| self.err(e))?;
        self.lock_migration(&mut tx).await?;
        let kind = self.relkind(&mut tx).await?;
        if kind.as_deref() == Some("r") {
            sqlx::raw_sql(AssertSqlSafe(sql.convert_swap))
                .execute(&mut *tx)
                .await
                .map_err(|e| self.err(e))?;
        }
        tx.commit().await.map_err(|e| self.err(e))?;
        self.migrate().await
    }

    /// Takes the store's migration lock for the transaction on `conn`.
    async fn lock_migration(&self, conn: &mut PgConnection) -> Result<(), StoreError> {
        sqlx::query("SELECT pg_advisory_xact_lock(hashtext($1))")
            .bind(format!("idem_migrate_{}", self.table()))
            .execute(conn)
            .await
            .map(drop)
            .map_err(|e| self.err(e))
    }

    /// What the table is (`relkind`: `r` plain, `p` partitioned), or
    /// `None` when there is none.
    async fn relkind(&self, conn: &mut PgConnection) -> Result<Option<String>, StoreError> {
        sqlx::query_scalar("SELECT relkind::text FROM pg_class WHERE oid = to_regclass($1)")
            .bind(self.table())
            .fetch_optional(conn)
            .await
            .map_err(|e| self.err(e))
    }

    /// Refuses a table whose layout (plain or partitioned) is not the one
    /// this store was told, before `migrate` writes anything.
    async fn check_layout(&self, conn: &mut PgConnection) -> Result<(), StoreError> {
        let kind = self.relkind(conn).await?;
        let Some(kind) = kind else {
            return Ok(());
        };
        let partitioned = kind == "p";
        match (partitioned, self.partitioning().is_some()) {
            (true, false) => Err(StoreError::Schema(format!(
                "the dedup table `{}` is partitioned; open the store with `with_partitions` to use it",
                self.table()
            ))),
            (false, true) => Err(StoreError::Schema(format!(
                "the dedup table `{}` exists and is not partitioned: `partition_existing()` turns it into a partitioned one (guide::postgres, \"Partitioned tables\")",
                self.table()
            ))),
            _ => Ok(()),
        }
    }
}

/// The expiry index's name: `<table>_expires_at`, shortened where that
/// would pass PostgreSQL's 63-byte limit (see [`derived_name`]).
fn expiry_index(table: &str) -> String {
    derived_name(table, "_expires_at")
}

#[cfg(test)]
mod tests {
    use super::{expiry_index, on_this_host};

    #[test]
    fn expiry_index_names_fit_and_differ() {
        assert_eq!(expiry_index("idem_keys"), "idem_keys_expires_at");
        let long_a = format!("t_{}", "a".repeat(61));
        let long_b = format!("t_{}b", "a".repeat(60));
        for name in [&long_a, &long_b] {
            let index = expiry_index(name);
            assert!(index.len() <= 63, "{index}");
            assert_ne!(&index, name);
        }
        assert_ne!(expiry_index(&long_a), expiry_index(&long_b));
    }

    #[test]
    fn a_server_on_this_host_is_a_loopback_address_localhost_or_a_socket() {
        for host in [
            "127.0.0.1",
            "127.0.0.53",
            "::1",
            "[::1]",
            "::ffff:127.0.0.1",
            "0.0.0.0",
            "localhost",
            "LOCALHOST",
            "localhost.",
            "db.localhost",
        ] {
            assert!(on_this_host(host, false), "{host}");
        }
        assert!(on_this_host("/var/run/postgresql", false));
        assert!(on_this_host("db.internal", true));
        for host in [
            "db.internal",
            "10.0.0.7",
            "192.168.1.20",
            "fd00::7",
            "localhost.example.com",
        ] {
            assert!(!on_this_host(host, false), "{host}");
        }
    }
}
