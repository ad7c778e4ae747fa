//! The PostgreSQL fixture: the server of `DATABASE_URL`, with a dedup table
//! and business tables of the test's own (unique names, dropped afterwards).

use std::str::FromStr;

use idem_runtime::clock::TimeShift;
use std::time::Duration;

use idem_runtime::store::sql::Partitions;
use idem_runtime::{ClaimOrder, PgStore, RoundTrips};
use idem_tests::{DropTables, LostReply, pg_pool, pg_url, unique_table};
use sqlx::AssertSqlSafe;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

use super::lossy::Lossy;
use super::tx::{Open, StoreKind};

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
    /// The shift of the store's time, when a test moves it.
    shift: Option<TimeShift>,
    kind: StoreKind,
    /// Declared last: the tables go when everything else has.
    _tables: DropTables,
}

impl PgDb {
    /// The suites' constructor: `None` (after saying why) when the server is
    /// unreachable, which `IDEM_REQUIRE_SERVICES=1` turns into a failure.
    async fn open_with(kind: StoreKind, how: Open) -> Option<PgDb> {
        let (order, trips, partitions) = match kind {
            StoreKind::Pg(order, trips) => (order, trips, None),
            StoreKind::PgPartitioned(order, trips) => {
                let minutes = Partitions::every(Duration::from_secs(60)).expect("a width");
                (order, trips, Some(minutes))
            }
            _ => panic!("a PostgreSQL fixture needs a PostgreSQL kind, not {kind:?}"),
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
            Open::Plain | Open::Shifted(_) | Open::AppPool => pool,
        };
        let mut store = PgStore::from_pool(pool)
            .with_table(&dedup)
            .expect("valid table name")
            .with_claim_order(order)
            .with_round_trips(trips);
        if let Some(partitions) = partitions {
            store = store.with_partitions(partitions);
        }
        let mut manual = None;
        match how {
            Open::Shifted(shift) => {
                store = store.with_time_shift(shift.clone());
                manual = Some(shift);
            }
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
            shift: manual,
            kind,
            _tables: tables,
        })
    }

    /// A second consumer: its own pool on the same dedup table, as another
    /// process would have.
    async fn second_store(&self) -> PgStore {
        let options = PgConnectOptions::from_str(&pg_url()).expect("DATABASE_URL");
        let store = PgStore::from_pool(connect(options).await)
            .with_table(self.store.table())
            .expect("valid table name")
            .with_claim_order(self.order())
            .with_round_trips(self.store.round_trips());
        match self.store.partitions() {
            Some(partitions) => store.with_partitions(partitions),
            None => store,
        }
    }

    /// A consumer of its own on the same dedup table (and time), which
    /// reaches PostgreSQL through a proxy that can lose a completion's
    /// reply.
    async fn lossy(&self) -> Lossy<PgStore> {
        let options = PgConnectOptions::from_str(&pg_url()).expect("DATABASE_URL");
        let proxy = LostReply::start(options.get_port()).await;
        let options = options.host("127.0.0.1").port(proxy.port());
        let mut store = PgStore::from_pool(connect(options).await)
            .with_table(self.store.table())
            .expect("valid table name");
        if let Some(partitions) = self.store.partitions() {
            store = store.with_partitions(partitions);
        }
        if let Some(shift) = &self.shift {
            store = store.with_time_shift(shift.clone());
        }
        Lossy::proxied(store, proxy)
    }

    fn order(&self) -> ClaimOrder {
        match self.kind {
            StoreKind::Pg(order, _) | StoreKind::PgPartitioned(order, _) => order,
            other => unreachable!("a PostgreSQL fixture opened as {other:?}"),
        }
    }
}

async fn connect(options: PgConnectOptions) -> PgPool {
    PgPoolOptions::new()
        .max_connections(POOL)
        .connect_with(options)
        .await
        .expect("PostgreSQL was reachable a moment ago")
}

business_tables!(PgDb, conn: sqlx::PgConnection);
sql_suites!(
    PgDb,
    store: PgStore,
    conn: sqlx::PgConnection,
    // The claim order only concerns transaction mode.
    lease_kind: StoreKind::Pg(ClaimOrder::Last, RoundTrips::Separate),
);

// One set for both claim orders: the order is the store's, not the handler's.
crate::common::tx::handlers! {
    PgDb, tx: PgTx, store: "postgres",
    names: { deduct: "pg_deduct", unencodable: "pg_unencodable", refund: "pg_refund",
        reserve: "pg_reserve", flaky: "pg_flaky", unknown: "pg_unknown",
        batch: "pg_deduct_batch",
    },
}
