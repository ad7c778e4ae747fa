//! The PostgreSQL fixture: the server of `DATABASE_URL`, with a dedup table
//! and business tables of the test's own (unique names, dropped afterwards).

use std::str::FromStr;

use idem_runtime::ClaimOrder;
use idem_runtime::PgStore;
use idem_tests::{DropTables, pg_pool, pg_url, unique_table};
use sqlx::AssertSqlSafe;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

use super::{Fixture, Mode, Open};

/// Connections a fixture's pool (and a second consumer's) may open.
const POOL: u32 = 8;

/// A migrated PostgreSQL store on a dedup table of its own, with business
/// tables `inventory` and `ledger` of the test's own in the same database,
/// written by transaction-mode bodies through the handler's transaction.
pub(crate) struct PgDb {
    pub(crate) store: PgStore,
    /// The business tables' (unique) names.
    pub(crate) inventory: String,
    pub(crate) ledger: String,
    order: ClaimOrder,
    /// Declared last: the tables go when everything else has.
    _tables: DropTables,
}

impl PgDb {
    /// The suites' constructor: `None` (after saying why) when the server is
    /// unreachable, which `IDEM_REQUIRE_SERVICES=1` turns into a failure.
    pub(crate) async fn open(mode: Mode, how: Open) -> Option<PgDb> {
        let Mode::Pg(order) = mode else {
            panic!("a PostgreSQL fixture needs a PostgreSQL mode, not {mode:?}")
        };
        let pool = pg_pool(POOL).await?;
        let dedup = unique_table("idem_dedup");
        let inventory = unique_table("inventory");
        let ledger = unique_table("ledger");
        // Armed before the tables exist, so a failing setup cleans up too.
        let tables = DropTables::new(&[&dedup, &inventory, &ledger]);
        let pool = match &how {
            Open::LockTimeout(timeout) => {
                let options = PgConnectOptions::from_str(&pg_url())
                    .expect("DATABASE_URL")
                    .options([("lock_timeout", format!("{}ms", timeout.as_millis()))]);
                connect(options).await
            }
            // Every PostgreSQL fixture shares the application's pool.
            Open::Plain | Open::Clock(_) | Open::AppPool => pool,
        };
        let mut store = PgStore::from_pool(pool)
            .with_table(&dedup)
            .expect("valid table name")
            .with_claim_order(order);
        match how {
            Open::Clock(clock) => store = store.with_clock(clock),
            Open::LockTimeout(timeout) => store = store.with_lock_timeout(timeout),
            Open::Plain | Open::AppPool => {}
        }
        store.migrate().await.expect("migrate");
        sqlx::raw_sql(AssertSqlSafe(format!(
            "CREATE TABLE {inventory} (sku TEXT PRIMARY KEY, stock BIGINT NOT NULL);
             CREATE TABLE {ledger} (id BIGSERIAL PRIMARY KEY,
                                    order_id TEXT NOT NULL, amount BIGINT NOT NULL);"
        )))
        .execute(store.pool())
        .await
        .expect("business tables");
        Some(PgDb {
            store,
            inventory,
            ledger,
            order,
            _tables: tables,
        })
    }

    /// A second consumer: its own pool on the same dedup table, as another
    /// process would have.
    pub(crate) async fn second_consumer(&self) -> PgStore {
        let options = PgConnectOptions::from_str(&pg_url()).expect("DATABASE_URL");
        PgStore::from_pool(connect(options).await)
            .with_table(self.store.table())
            .expect("valid table name")
            .with_claim_order(self.order)
    }
}

async fn connect(options: PgConnectOptions) -> PgPool {
    PgPoolOptions::new()
        .max_connections(POOL)
        .connect_with(options)
        .await
        .expect("PostgreSQL was reachable a moment ago")
}

impl Fixture for PgDb {
    type Store = PgStore;
}

business_tables!(PgDb);
