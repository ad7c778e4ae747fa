//! The MySQL/MariaDB fixture: the server of `MYSQL_URL`, with a dedup table
//! and business tables of the test's own (unique names, InnoDB, dropped
//! afterwards), read and written in MySQL's `?` dialect.

use std::str::FromStr;
use std::time::Duration;

use idem_runtime::clock::TimeShift;
use idem_runtime::{ClaimOrder, MySqlStore, RoundTrips};
use idem_tests::{DropMySqlTables, LostReply, mysql_pool, mysql_url, unavailable, unique_table};
use sqlx::AssertSqlSafe;
use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};

use super::lossy::Lossy;
use super::tx::{Open, StoreKind};

/// Connections a fixture's pool (and a second consumer's) may open.
const POOL: u32 = 8;

/// The `innodb_lock_wait_timeout` of an application's pool, in seconds: the
/// store's own default.
const APP_LOCK_WAIT_SECS: u32 = 5;

/// A migrated MySQL store on a dedup table of its own, with business tables
/// `inventory` and `ledger` of the test's own in the same database, written
/// by transaction-mode bodies through the handler's transaction.
pub(crate) struct MySqlDb {
    pub(crate) store: MySqlStore,
    /// The business tables' (unique) names.
    pub(crate) inventory: String,
    pub(crate) ledger: String,
    /// The shift of the store's time, when a test moves it.
    shift: Option<TimeShift>,
    kind: StoreKind,
    /// Declared last: the tables go when everything else has.
    _tables: DropMySqlTables,
}

impl MySqlDb {
    /// The suites' constructor: `None` (after saying why) when the server is
    /// unreachable, which `IDEM_REQUIRE_SERVICES=1` turns into a failure.
    ///
    /// [`Open::Plain`] and [`Open::Shifted`] let the store make its pool (which
    /// sets each session's `innodb_lock_wait_timeout` to 5 s);
    /// [`Open::AppPool`] and [`Open::LockTimeout`] hand it a pool of the
    /// application's, whose lock wait the store is told.
    async fn open_with(kind: StoreKind, how: Open) -> Option<MySqlDb> {
        let StoreKind::MySql(order, trips) = kind else {
            panic!("a MySQL fixture needs a MySQL kind, not {kind:?}")
        };
        let store = match &how {
            Open::Plain | Open::Shifted(_) => store_pool().await?,
            Open::AppPool => MySqlStore::from_pool(mysql_pool(POOL, APP_LOCK_WAIT_SECS).await?)
                .with_lock_timeout(Duration::from_secs(APP_LOCK_WAIT_SECS.into())),
            Open::LockTimeout(timeout) => {
                // The session variable is a whole number of seconds.
                assert!(
                    timeout.subsec_nanos() == 0 && !timeout.is_zero(),
                    "MySQL counts innodb_lock_wait_timeout in whole seconds, not {timeout:?}"
                );
                let secs = u32::try_from(timeout.as_secs()).expect("a lock timeout in seconds");
                MySqlStore::from_pool(mysql_pool(POOL, secs).await?).with_lock_timeout(*timeout)
            }
        };
        let dedup = unique_table("idem_dedup");
        let inventory = unique_table("inventory");
        let ledger = unique_table("ledger");
        // Armed before the tables exist, so a failing setup cleans up too.
        let tables = DropMySqlTables::new(&[&dedup, &inventory, &ledger]);
        let mut store = store
            .with_table(&dedup)
            .expect("valid table name")
            .with_claim_order(order)
            .with_round_trips(trips);
        let mut manual = None;
        if let Open::Shifted(shift) = how {
            store = store.with_time_shift(shift.clone());
            manual = Some(shift);
        }
        store.migrate().await.expect("migrate");
        sqlx::raw_sql(AssertSqlSafe(format!(
            "CREATE TABLE {inventory} (sku VARCHAR(64) PRIMARY KEY, stock BIGINT NOT NULL)
                 ENGINE = InnoDB;
             CREATE TABLE {ledger} (id BIGINT AUTO_INCREMENT PRIMARY KEY,
                                    order_id VARCHAR(64) NOT NULL, amount BIGINT NOT NULL)
                 ENGINE = InnoDB;"
        )))
        .execute(store.pool())
        .await
        .expect("business tables");
        Some(MySqlDb {
            store,
            inventory,
            ledger,
            shift: manual,
            kind,
            _tables: tables,
        })
    }

    /// A second consumer: its own pool on the same dedup table, as another
    /// process would have.
    async fn second_store(&self) -> MySqlStore {
        store_pool()
            .await
            .expect("MariaDB was reachable a moment ago")
            .with_table(self.store.table())
            .expect("valid table name")
            .with_claim_order(self.order())
            .with_round_trips(self.store.round_trips())
    }

    /// A consumer of its own on the same dedup table (and time), which
    /// reaches MariaDB through a proxy that can lose a completion's reply.
    async fn lossy(&self) -> Lossy<MySqlStore> {
        let options = MySqlConnectOptions::from_str(&mysql_url()).expect("MYSQL_URL");
        let proxy = LostReply::start(options.get_port()).await;
        let options = options.host("127.0.0.1").port(proxy.port());
        let pool = MySqlPoolOptions::new()
            .max_connections(POOL)
            .acquire_timeout(Duration::from_secs(10));
        let mut store = MySqlStore::connect_with(options, pool)
            .await
            .expect("MariaDB through the proxy")
            .with_table(self.store.table())
            .expect("valid table name");
        if let Some(shift) = &self.shift {
            store = store.with_time_shift(shift.clone());
        }
        Lossy::proxied(store, proxy)
    }

    fn order(&self) -> ClaimOrder {
        match self.kind {
            StoreKind::MySql(order, _) => order,
            other => unreachable!("a MySQL fixture opened as {other:?}"),
        }
    }
}

/// A store on a pool it made itself, or `None` (after [`unavailable`]) when
/// the server cannot be reached.
async fn store_pool() -> Option<MySqlStore> {
    let url = mysql_url();
    let options = MySqlConnectOptions::from_str(&url).expect("MYSQL_URL");
    let pool = MySqlPoolOptions::new()
        .max_connections(POOL)
        .acquire_timeout(Duration::from_secs(10));
    match MySqlStore::connect_with(options, pool).await {
        Ok(store) => Some(store),
        Err(e) => unavailable("MariaDB", &url, e),
    }
}

// The business tables in MySQL's dialect: `?` placeholders, `ON DUPLICATE
// KEY UPDATE`, no `RETURNING`, and `key` quoted (a reserved word).
impl MySqlDb {
    /// Puts `stock` units of `sku` in the inventory.
    pub(crate) async fn stock_up(&self, sku: &str, stock: i64) {
        let sql = format!(
            "INSERT INTO {} (sku, stock) VALUES (?, ?) ON DUPLICATE KEY UPDATE stock = ?",
            self.inventory
        );
        sqlx::query(AssertSqlSafe(sql))
            .bind(sku)
            .bind(stock)
            .bind(stock)
            .execute(self.store.pool())
            .await
            .expect("stock up");
    }

    /// The stock of `sku`, read back from the database.
    pub(crate) async fn stock(&self, sku: &str) -> i64 {
        let sql = format!("SELECT stock FROM {} WHERE sku = ?", self.inventory);
        self.scalar(sql, Some(sku)).await
    }

    /// How many ledger rows the bodies wrote for `order_id`.
    pub(crate) async fn ledger_rows(&self, order_id: &str) -> i64 {
        let sql = format!("SELECT COUNT(*) FROM {} WHERE order_id = ?", self.ledger);
        self.scalar(sql, Some(order_id)).await
    }

    /// How many ledger rows there are in all.
    pub(crate) async fn ledger_len(&self) -> i64 {
        self.scalar(format!("SELECT COUNT(*) FROM {}", self.ledger), None)
            .await
    }

    /// The one number `sql` (with at most one parameter) returns.
    async fn scalar(&self, sql: String, arg: Option<&str>) -> i64 {
        let mut query = sqlx::query_scalar(AssertSqlSafe(sql));
        if let Some(arg) = arg {
            query = query.bind(arg);
        }
        query
            .fetch_one(self.store.pool())
            .await
            .expect("read a number")
    }

    /// Writes a ledger row through the pool, outside any idem transaction,
    /// as a lease-mode body's external effect would be.
    pub(crate) async fn add_ledger(&self, order_id: &str, amount: i64) -> Result<(), sqlx::Error> {
        let sql = format!(
            "INSERT INTO {} (order_id, amount) VALUES (?, ?)",
            self.ledger
        );
        sqlx::query(AssertSqlSafe(sql))
            .bind(order_id)
            .bind(amount)
            .execute(self.store.pool())
            .await
            .map(drop)
    }

    /// The database's clock (unshifted), ms since the epoch: the
    /// expression the store's statements read it with.
    pub(crate) async fn db_now_ms(&self) -> i64 {
        self.scalar(crate::common::now_sql(&self.store), None).await
    }

    /// How many dedup records the store's table holds.
    pub(crate) async fn record_count(&self) -> i64 {
        self.store.count().await.expect("count records")
    }

    /// Overwrites the recorded outcome of `handler`'s records, as if the
    /// return type had changed since; returns how many changed.
    pub(crate) async fn overwrite_outcome(&self, handler: &str, outcome: &str) -> u64 {
        let sql = format!(
            "UPDATE {} SET outcome = ? WHERE handler = ?",
            self.store.table()
        );
        sqlx::query(AssertSqlSafe(sql))
            .bind(outcome)
            .bind(handler)
            .execute(self.store.pool())
            .await
            .expect("overwrite outcome")
            .rows_affected()
    }

    /// The fencing token of `handler`'s record of `key`.
    pub(crate) async fn token_of(&self, handler: &str, key: &idem_runtime::Key) -> Option<String> {
        let sql = format!(
            "SELECT token FROM {} WHERE handler = ? AND `key` = ?",
            self.store.table()
        );
        let token: Option<Option<String>> = sqlx::query_scalar(AssertSqlSafe(sql))
            .bind(handler)
            .bind(key.as_str())
            .fetch_optional(self.store.pool())
            .await
            .expect("read the token");
        token.flatten()
    }

    /// In a body: takes `qty` of `sku` from the inventory through the
    /// transaction; returns what is left, read back in the same transaction
    /// (its own write). No row to update is `RowNotFound`, as `RETURNING`
    /// would have it.
    pub(crate) async fn take_stock(
        &self,
        conn: &mut sqlx::MySqlConnection,
        sku: &str,
        qty: i64,
    ) -> Result<i64, sqlx::Error> {
        let update = format!(
            "UPDATE {} SET stock = stock - ? WHERE sku = ?",
            self.inventory
        );
        sqlx::query(AssertSqlSafe(update))
            .bind(qty)
            .bind(sku)
            .execute(&mut *conn)
            .await?;
        let select = format!("SELECT stock FROM {} WHERE sku = ?", self.inventory);
        sqlx::query_scalar(AssertSqlSafe(select))
            .bind(sku)
            .fetch_one(conn)
            .await
    }

    /// In a body: writes a ledger row through the transaction.
    pub(crate) async fn add_ledger_in(
        &self,
        conn: &mut sqlx::MySqlConnection,
        order_id: &str,
        amount: i64,
    ) -> Result<(), sqlx::Error> {
        let sql = format!(
            "INSERT INTO {} (order_id, amount) VALUES (?, ?)",
            self.ledger
        );
        sqlx::query(AssertSqlSafe(sql))
            .bind(order_id)
            .bind(amount)
            .execute(conn)
            .await
            .map(drop)
    }
}

sql_suites!(
    MySqlDb,
    store: MySqlStore,
    conn: sqlx::MySqlConnection,
    // The claim order only concerns transaction mode.
    lease_kind: StoreKind::MySql(ClaimOrder::Last, RoundTrips::Separate),
);

// One set for both claim orders: the order is the store's, not the handler's.
crate::common::tx::handlers! {
    MySqlDb, tx: MySqlTx, store: "mysql",
    names: { deduct: "mysql_deduct", unencodable: "mysql_unencodable", refund: "mysql_refund",
        reserve: "mysql_reserve", flaky: "mysql_flaky", unknown: "mysql_unknown",
        batch: "mysql_deduct_batch",
    },
}
