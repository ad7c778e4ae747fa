//! A store of a test's own on each server, the arguments that name it to
//! the binary, and stores on it that write at another time.

use idem_runtime::clock::{ManualClock, TimeShift};
use idem_runtime::store::Inspect;
use idem_runtime::store::LeaseStore;
use idem_runtime::{MySqlStore, PgStore, RedisStore, SqliteStore};
use idem_tests::{
    DeleteKeys, DropMySqlTables, DropTables, mysql_pool, mysql_url, pg_pool, pg_url, redis_store,
    redis_url, unique_prefix, unique_table,
};

/// A store the binary is run against.
pub(crate) trait StoreFx: Sized {
    /// The runtime's store on it.
    type Store: LeaseStore + Inspect;

    /// The store's name in messages (`sqlite`, ..., `redis`).
    const NAME: &'static str;

    /// Whether the store expires records by itself (Redis): an expired
    /// completed record cannot be written, and `sweep` deletes nothing.
    const NATIVE_EXPIRY: bool;

    /// A fixture of its own, or `None` (after saying why) when the server
    /// is unreachable.
    async fn open() -> Option<Self>;

    /// The store, on the system clock.
    fn store(&self) -> &Self::Store;

    /// The store, writing as if it were `at_ms` (ms since the epoch): a
    /// SQL store's database time shifted there (it runs on from there
    /// while the statement is on its way: a few ms later), Redis's
    /// informational clock set to it.
    fn store_at(&self, at_ms: i64) -> Self::Store;

    /// The arguments naming this store to the binary: `--store URL` and
    /// the table or prefix.
    fn args(&self) -> Vec<String>;

    /// As [`args`](Self::args), with `--table` (or `--prefix`) naming
    /// `other` instead.
    fn args_on(&self, other: &str) -> Vec<String>;
}

/// A shift that moves a SQL database's time (on this host: its clock is
/// the system's) to `at_ms` now.
fn shift_to(at_ms: i64) -> TimeShift {
    TimeShift::from_millis(at_ms - super::now())
}

/// A SQLite database file of its own, with its dedup table `cli_keys`.
pub(crate) struct SqliteFx {
    store: SqliteStore,
    path: String,
    _dir: tempfile::TempDir,
}

impl StoreFx for SqliteFx {
    type Store = SqliteStore;
    const NAME: &'static str = "sqlite";
    const NATIVE_EXPIRY: bool = false;

    async fn open() -> Option<Self> {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("idem.db");
        let store = SqliteStore::open(&path)
            .await
            .expect("open")
            .with_table("cli_keys")
            .expect("a valid table name");
        store.migrate().await.expect("migrate");
        Some(SqliteFx {
            store,
            path: path.display().to_string(),
            _dir: dir,
        })
    }

    fn store(&self) -> &SqliteStore {
        &self.store
    }

    fn store_at(&self, at_ms: i64) -> SqliteStore {
        self.store.clone().with_time_shift(shift_to(at_ms))
    }

    fn args(&self) -> Vec<String> {
        self.args_on("cli_keys")
    }

    fn args_on(&self, table: &str) -> Vec<String> {
        vec![
            "--store".into(),
            format!("sqlite:{}", self.path),
            "--table".into(),
            table.into(),
        ]
    }
}

/// A dedup table of its own on the PostgreSQL of `DATABASE_URL`, dropped
/// at the end.
pub(crate) struct PgFx {
    store: PgStore,
    table: String,
    _drop: DropTables,
}

impl StoreFx for PgFx {
    type Store = PgStore;
    const NAME: &'static str = "postgres";
    const NATIVE_EXPIRY: bool = false;

    async fn open() -> Option<Self> {
        let pool = pg_pool(4).await?;
        let table = unique_table("idem_cli");
        let drop = DropTables::new(&[&table]);
        let store = PgStore::from_pool(pool)
            .with_table(&table)
            .expect("a valid table name");
        store.migrate().await.expect("migrate");
        Some(PgFx {
            store,
            table,
            _drop: drop,
        })
    }

    fn store(&self) -> &PgStore {
        &self.store
    }

    fn store_at(&self, at_ms: i64) -> PgStore {
        self.store.clone().with_time_shift(shift_to(at_ms))
    }

    fn args(&self) -> Vec<String> {
        self.args_on(&self.table)
    }

    fn args_on(&self, table: &str) -> Vec<String> {
        vec!["--store".into(), pg_url(), "--table".into(), table.into()]
    }
}

/// A dedup table of its own on the MariaDB of `MYSQL_URL`, dropped at the
/// end.
pub(crate) struct MySqlFx {
    store: MySqlStore,
    table: String,
    _drop: DropMySqlTables,
}

impl StoreFx for MySqlFx {
    type Store = MySqlStore;
    const NAME: &'static str = "mysql";
    const NATIVE_EXPIRY: bool = false;

    async fn open() -> Option<Self> {
        let pool = mysql_pool(4, 5).await?;
        let table = unique_table("idem_cli");
        let drop = DropMySqlTables::new(&[&table]);
        let store = MySqlStore::from_pool(pool)
            .with_table(&table)
            .expect("a valid table name");
        store.migrate().await.expect("migrate");
        Some(MySqlFx {
            store,
            table,
            _drop: drop,
        })
    }

    fn store(&self) -> &MySqlStore {
        &self.store
    }

    fn store_at(&self, at_ms: i64) -> MySqlStore {
        self.store.clone().with_time_shift(shift_to(at_ms))
    }

    fn args(&self) -> Vec<String> {
        self.args_on(&self.table)
    }

    fn args_on(&self, table: &str) -> Vec<String> {
        // `mariadb://` is the same store as `mysql://`.
        let url = mysql_url().replacen("mysql://", "mariadb://", 1);
        vec!["--store".into(), url, "--table".into(), table.into()]
    }
}

/// A key prefix of its own on the Redis of `REDIS_URL` (or on a cluster
/// the test started), its keys deleted at the end.
pub(crate) struct RedisFx {
    store: RedisStore,
    prefix: String,
    url: String,
    cluster: bool,
    _delete: Vec<DeleteKeys>,
}

impl RedisFx {
    /// A fixture on the cluster whose nodes are `urls`.
    pub(crate) async fn on_cluster(urls: &[String]) -> RedisFx {
        let prefix = unique_prefix("idem_cli");
        let store = RedisStore::connect_cluster(urls)
            .await
            .expect("connect to the cluster")
            .with_prefix(&prefix)
            .expect("a valid prefix");
        RedisFx {
            store,
            url: urls.join(","),
            cluster: true,
            _delete: urls.iter().map(|u| DeleteKeys::new(u, &prefix)).collect(),
            prefix,
        }
    }
}

impl StoreFx for RedisFx {
    type Store = RedisStore;
    const NAME: &'static str = "redis";
    const NATIVE_EXPIRY: bool = true;

    async fn open() -> Option<Self> {
        let url = redis_url();
        let prefix = unique_prefix("idem_cli");
        let store = redis_store(&prefix).await?;
        Some(RedisFx {
            store,
            _delete: vec![DeleteKeys::new(&url, &prefix)],
            url,
            cluster: false,
            prefix,
        })
    }

    fn store(&self) -> &RedisStore {
        &self.store
    }

    fn store_at(&self, at_ms: i64) -> RedisStore {
        self.store.clone().with_clock(ManualClock::new(at_ms))
    }

    fn args(&self) -> Vec<String> {
        self.args_on(&self.prefix)
    }

    fn args_on(&self, prefix: &str) -> Vec<String> {
        let mut args = vec![
            "--store".into(),
            self.url.clone(),
            "--prefix".into(),
            prefix.into(),
        ];
        if self.cluster {
            args.push("--cluster".into());
        }
        args
    }
}
