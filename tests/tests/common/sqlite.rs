//! The SQLite fixture: a database file of its own per test, with the
//! business tables `inventory` and `ledger` next to the dedup table.

use std::path::PathBuf;

use idem_runtime::SqliteStore;
use idem_runtime::clock::TimeShift;
use tempfile::TempDir;

use super::tx::{Open, StoreKind};

/// A SQLite store in a fresh temporary directory; the directory lives as
/// long as this value.
pub(crate) struct Db {
    pub(crate) store: SqliteStore,
    /// The business tables (fixed names: the database file is the test's own).
    pub(crate) inventory: &'static str,
    pub(crate) ledger: &'static str,
    /// The shift of the store's time, when a test moves it.
    shift: Option<TimeShift>,
    kind: StoreKind,
    file: PathBuf,
    _dir: TempDir,
}

impl Db {
    /// A migrated store on the database's own time, with `inventory` and
    /// `ledger`.
    pub(crate) async fn new() -> Db {
        Self::build(None).await
    }

    /// A migrated store whose time `shift` moves.
    pub(crate) async fn with_shift(shift: &TimeShift) -> Db {
        Self::build(Some(shift.clone())).await
    }

    async fn build(shift: Option<TimeShift>) -> Db {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = SqliteStore::open(dir.path().join("idem.db"))
            .await
            .expect("open sqlite store");
        let store = match &shift {
            Some(s) => store.with_time_shift(s.clone()),
            None => store,
        };
        let file = dir.path().join("idem.db");
        Db::assemble(store, shift, dir, file).await
    }

    /// Migrates `store` (whose file is `file` in `dir`) and adds the
    /// business tables.
    async fn assemble(
        store: SqliteStore,
        shift: Option<TimeShift>,
        dir: TempDir,
        file: PathBuf,
    ) -> Db {
        store.migrate().await.expect("migrate");
        sqlx::raw_sql(
            "CREATE TABLE inventory (sku TEXT PRIMARY KEY, stock INTEGER NOT NULL);
             CREATE TABLE ledger (id INTEGER PRIMARY KEY AUTOINCREMENT,
                                  order_id TEXT NOT NULL, amount INTEGER NOT NULL);",
        )
        .execute(store.pool())
        .await
        .expect("business tables");
        Db {
            store,
            inventory: "inventory",
            ledger: "ledger",
            shift,
            kind: StoreKind::Sqlite,
            file,
            _dir: dir,
        }
    }

    /// The suites' constructor (always `Some`: SQLite needs no server).
    async fn open_with(kind: StoreKind, how: Open) -> Option<Db> {
        assert_eq!(kind, StoreKind::Sqlite, "a SQLite fixture");
        Some(match how {
            Open::Plain => Db::new().await,
            Open::Shifted(shift) => Db::with_shift(&shift).await,
            Open::LockTimeout(timeout) => {
                let dir = tempfile::tempdir().expect("temp dir");
                let file = dir.path().join("idem.db");
                let options = sqlx::sqlite::SqliteConnectOptions::new()
                    .filename(&file)
                    .create_if_missing(true)
                    .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
                    .busy_timeout(timeout);
                let store = SqliteStore::connect_with(options)
                    .await
                    .expect("open sqlite store");
                Db::assemble(store, None, dir, file).await
            }
            Open::AppPool => {
                // The application's own pool: business tables and dedup
                // table share it.
                let dir = tempfile::tempdir().expect("temp dir");
                let file = dir.path().join("app.db");
                let url = format!("sqlite://{}?mode=rwc", file.display());
                let pool = sqlx::SqlitePool::connect(&url).await.expect("app pool");
                Db::assemble(SqliteStore::from_pool(pool), None, dir, file).await
            }
        })
    }

    /// The store, whose lost replies are simulated: SQLite has no
    /// connection to drop.
    async fn lossy(&self) -> crate::common::lossy::Lossy<SqliteStore> {
        crate::common::lossy::Lossy::simulated(self.store.clone())
    }

    /// A second consumer: its own pool on the same file, as another process
    /// would have.
    async fn second_store(&self) -> SqliteStore {
        SqliteStore::open(&self.file)
            .await
            .expect("open a second store")
    }
}

business_tables!(Db, conn: sqlx::SqliteConnection);
sql_suites!(
    Db,
    store: SqliteStore,
    conn: sqlx::SqliteConnection,
    lease_kind: StoreKind::Sqlite,
);

crate::common::tx::handlers! {
    Db, tx: SqliteTx, store: "sqlite",
    names: { deduct: "sqlite_deduct", unencodable: "sqlite_unencodable", refund: "sqlite_refund",
        reserve: "sqlite_reserve", flaky: "sqlite_flaky", unknown: "sqlite_unknown",
        batch: "sqlite_deduct_batch",
    },
}
