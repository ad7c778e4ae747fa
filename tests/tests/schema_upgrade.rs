//! Upgrading the dedup table of an earlier release in place, on every SQL
//! store: a table created by the first release's `migrate()` (its DDL is
//! kept verbatim in `tests/fixtures/schema_v1/`) and filled as that release
//! filled it is migrated by many stores at once while the first release
//! goes on writing to it. Afterwards every record is there, reads as "no
//! failure, no fingerprint", and still suppresses its duplicates; the first
//! release's writes still work (a rolling deploy); and a call on a table
//! nobody migrated is refused with advice, not run. A table of schema
//! version 2 (`tests/fixtures/schema_v2/`, before `max_attempts`) is
//! upgraded the same way: its records keep their counts and read as "limit
//! unknown", an exhausted key stays exhausted, and this release's claims
//! write the limit.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use idem_runtime::registry::{HandlerSpec, Mode};
use idem_runtime::store::sql::SCHEMA_VERSION;
use idem_runtime::store::{Claim, LeaseStore, Standing};
use idem_runtime::store::{Record, Status};
use idem_runtime::{Key, MySqlStore, PgStore, SqliteStore, StoreError};
use idem_tests::{DropMySqlTables, DropTables, mysql_url, or_skip, pg_url, unique_table};
use tokio::sync::Barrier;

static SPEC: HandlerSpec = HandlerSpec {
    name: "upgrade_points",
    function: "upgrade_points",
    key: "id",
    ttl: Duration::from_secs(3_600),
    lease: Duration::from_secs(60),
    store: "sqlite",
    mode: Mode::Lease,
    module: module_path!(),
    file: file!(),
    line: line!(),
    fingerprint: None,
    max_attempts: None,
};

/// A handler allowed three failed deliveries per key.
static LIMITED: HandlerSpec = HandlerSpec {
    name: "upgrade_limited",
    function: "upgrade_limited",
    max_attempts: Some(3),
    ..SPEC
};

/// How many stores migrate the table at the same time.
const MIGRATORS: usize = 6;
/// Records the first release wrote before the upgrade: completed ones,
/// then claims in progress.
const COMPLETED: usize = 200;
const IN_PROGRESS: usize = 40;
/// Records the first release writes while the upgrade runs.
const DURING: usize = 150;

fn now_ms() -> i64 {
    i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap()
}

fn key(i: usize) -> Key {
    Key::from_parts(&[&format!("m-{i}")]).unwrap()
}

/// A record as the first release wrote it.
struct OldRow {
    key: String,
    status: &'static str,
    token: Option<String>,
    outcome: Option<String>,
    expires_at: i64,
}

impl OldRow {
    fn completed(i: usize) -> OldRow {
        OldRow {
            key: key(i).as_str().to_owned(),
            status: "completed",
            token: None,
            outcome: Some(format!("{{\"granted\":{i}}}")),
            expires_at: now_ms() + 3_600_000,
        }
    }

    fn in_progress(i: usize) -> OldRow {
        OldRow {
            key: key(i).as_str().to_owned(),
            status: "in_progress",
            token: Some(uuid::Uuid::new_v4().simple().to_string()),
            outcome: None,
            expires_at: now_ms() + 60_000,
        }
    }
}

/// A record as schema version 2 wrote it: with its counts and
/// fingerprint, without the handler's limit.
struct V2Row {
    key: String,
    status: &'static str,
    token: Option<String>,
    outcome: Option<String>,
    attempts: i64,
    failures: i64,
    last_error: Option<String>,
    fingerprint: Option<String>,
    expires_at: i64,
}

impl V2Row {
    /// A key of `upgrade_limited` whose deliveries failed `failures` times.
    fn retry(i: usize, failures: i64) -> V2Row {
        V2Row {
            key: key(i).as_str().to_owned(),
            status: "retry",
            token: None,
            outcome: None,
            attempts: failures,
            failures,
            last_error: Some(format!("timeout {i}")),
            fingerprint: None,
            expires_at: now_ms() + 3_600_000,
        }
    }

    fn completed(i: usize) -> V2Row {
        V2Row {
            key: key(i).as_str().to_owned(),
            status: "completed",
            token: None,
            outcome: Some(format!("{{\"granted\":{i}}}")),
            attempts: 2,
            failures: 1,
            last_error: Some("timeout".to_owned()),
            fingerprint: Some("0123456789abcdef0123456789abcdef".to_owned()),
            expires_at: now_ms() + 3_600_000,
        }
    }
}

/// One SQL store's side of the scenario.
trait OldTable: Send + Sync + 'static {
    /// A store of this release on the table (its own pool each time).
    type Store: LeaseStore;
    fn store(&self) -> impl Future<Output = Self::Store> + Send;
    fn migrate(store: &Self::Store) -> impl Future<Output = Result<(), StoreError>> + Send;
    fn schema_version(
        store: &Self::Store,
    ) -> impl Future<Output = Result<Option<u32>, StoreError>> + Send;
    fn record(
        store: &Self::Store,
        key: &Key,
    ) -> impl Future<Output = Result<Option<Record>, StoreError>> + Send;
    /// The record of `key` under `handler`.
    fn record_of(
        store: &Self::Store,
        handler: &str,
        key: &Key,
    ) -> impl Future<Output = Result<Option<Record>, StoreError>> + Send;
    fn count(store: &Self::Store) -> impl Future<Output = Result<i64, StoreError>> + Send;
    /// Creates the table with the first release's DDL.
    fn create_v1(&self) -> impl Future<Output = ()> + Send;
    /// Writes `row` with the first release's column list.
    fn insert_v1(&self, row: OldRow) -> impl Future<Output = ()> + Send;
    /// Creates the table with schema version 2's DDL.
    fn create_v2(&self) -> impl Future<Output = ()> + Send;
    /// Writes `row` of `upgrade_limited` with schema version 2's column list.
    fn insert_v2(&self, row: V2Row) -> impl Future<Output = ()> + Send;
}

async fn upgrade_under_load<T: OldTable>(old: Arc<T>) {
    old.create_v1().await;
    for i in 0..COMPLETED {
        old.insert_v1(OldRow::completed(i)).await;
    }
    for i in COMPLETED..COMPLETED + IN_PROGRESS {
        old.insert_v1(OldRow::in_progress(i)).await;
    }
    let store = old.store().await;
    assert_eq!(T::schema_version(&store).await.unwrap(), Some(1));

    // This release, before anyone migrated: refused with advice.
    let err = store.claim(&SPEC, &key(0), None).await.unwrap_err();
    assert!(
        matches!(&err, StoreError::Schema(m) if m.contains("migrate()")),
        "{err}"
    );

    // Many stores migrate at once while the first release writes on.
    let barrier = Arc::new(Barrier::new(MIGRATORS + 1));
    let mut migrators = Vec::new();
    for _ in 0..MIGRATORS {
        let store = old.store().await;
        let barrier = Arc::clone(&barrier);
        migrators.push(tokio::spawn(async move {
            barrier.wait().await;
            T::migrate(&store).await
        }));
    }
    let writer = {
        let old = Arc::clone(&old);
        let barrier = Arc::clone(&barrier);
        tokio::spawn(async move {
            barrier.wait().await;
            let first = COMPLETED + IN_PROGRESS;
            for i in first..first + DURING {
                old.insert_v1(OldRow::completed(i)).await;
            }
        })
    };
    for m in migrators {
        m.await.unwrap().expect("every concurrent migrate succeeds");
    }
    writer.await.unwrap();

    assert_eq!(
        T::schema_version(&store).await.unwrap(),
        Some(SCHEMA_VERSION)
    );
    let total = COMPLETED + IN_PROGRESS + DURING;
    assert_eq!(T::count(&store).await.unwrap(), total as i64);

    // Every record kept its meaning and suppresses its duplicates.
    for i in (0..COMPLETED).chain(COMPLETED + IN_PROGRESS..total) {
        let record = T::record(&store, &key(i)).await.unwrap().unwrap();
        assert_eq!(
            (
                record.status,
                record.attempts,
                record.failures,
                record.last_error.as_deref(),
                record.fingerprint.as_deref()
            ),
            (Status::Completed, 1, 0, None, None),
            "{i}"
        );
        assert_eq!(
            store.claim(&SPEC, &key(i), None).await.unwrap(),
            Claim::Refused(Standing::Completed {
                outcome: format!("{{\"granted\":{i}}}"),
                trace: None,
            }),
            "record {i} suppresses its duplicate"
        );
    }
    for i in COMPLETED..COMPLETED + IN_PROGRESS {
        match store.claim(&SPEC, &key(i), None).await.unwrap() {
            Claim::Refused(Standing::InProgress { retry_after }) => {
                assert!(retry_after <= SPEC.lease, "{i}: {retry_after:?}")
            }
            other => panic!("the first release's live claim {i} holds: {other:?}"),
        }
    }

    // The first release still writes after the upgrade, and this one
    // runs new keys.
    old.insert_v1(OldRow::completed(total)).await;
    assert!(matches!(
        store.claim(&SPEC, &key(total), None).await.unwrap(),
        Claim::Refused(Standing::Completed { .. })
    ));
    let Claim::Fresh { token } = store.claim(&SPEC, &key(total + 1), None).await.unwrap() else {
        panic!("a new key is claimed");
    };
    assert!(
        store
            .complete(&SPEC, &key(total + 1), &token, "1")
            .await
            .unwrap()
    );

    // Migrating again is a no-op.
    T::migrate(&store).await.unwrap();
    assert_eq!(T::count(&store).await.unwrap(), total as i64 + 2);
}

/// The [`OldTable`] of a SQL store type `$Store` on the fixture `$Old`
/// (fields `table` and `pool`): a store of this release from `$connect`
/// (with `old` the fixture), the first release's DDL from `$ddl`, and its
/// insert `$insert` (`{t}` the table; handler, key, status, token, outcome,
/// created_at, updated_at, expires_at as parameters, in that order); schema
/// version 2's DDL from `$ddl2` and its insert `$insert2` (handler, key,
/// status, token, outcome, attempts, failures, last_error, fingerprint,
/// created_at, updated_at, expires_at).
macro_rules! old_table {
    (
        $Old:ty, $Store:ty, |$old:ident| $connect:expr,
        $ddl:literal, $insert:literal, $ddl2:literal, $insert2:literal
    ) => {
        impl OldTable for $Old {
            type Store = $Store;

            async fn store(&self) -> $Store {
                let $old = self;
                $connect.with_table(&self.table).unwrap()
            }
            async fn migrate(store: &$Store) -> Result<(), StoreError> {
                store.migrate().await
            }
            async fn schema_version(store: &$Store) -> Result<Option<u32>, StoreError> {
                store.schema_version().await
            }
            async fn record(store: &$Store, key: &Key) -> Result<Option<Record>, StoreError> {
                store.record(SPEC.name, key).await
            }
            async fn record_of(
                store: &$Store,
                handler: &str,
                key: &Key,
            ) -> Result<Option<Record>, StoreError> {
                store.record(handler, key).await
            }
            async fn count(store: &$Store) -> Result<i64, StoreError> {
                store.count().await
            }
            async fn create_v1(&self) {
                let ddl = include_str!($ddl).replace("{t}", &self.table);
                sqlx::raw_sql(sqlx::AssertSqlSafe(ddl))
                    .execute(&self.pool)
                    .await
                    .unwrap();
            }
            async fn insert_v1(&self, row: OldRow) {
                let now = now_ms();
                let sql = $insert.replace("{t}", &self.table);
                sqlx::query(sqlx::AssertSqlSafe(sql))
                    .bind(SPEC.name)
                    .bind(&row.key)
                    .bind(row.status)
                    .bind(&row.token)
                    .bind(&row.outcome)
                    .bind(now)
                    .bind(now)
                    .bind(row.expires_at)
                    .execute(&self.pool)
                    .await
                    .unwrap();
            }
            async fn create_v2(&self) {
                let ddl = include_str!($ddl2).replace("{t}", &self.table);
                sqlx::raw_sql(sqlx::AssertSqlSafe(ddl))
                    .execute(&self.pool)
                    .await
                    .unwrap();
            }
            async fn insert_v2(&self, row: V2Row) {
                let now = now_ms();
                let sql = $insert2.replace("{t}", &self.table);
                sqlx::query(sqlx::AssertSqlSafe(sql))
                    .bind(LIMITED.name)
                    .bind(&row.key)
                    .bind(row.status)
                    .bind(&row.token)
                    .bind(&row.outcome)
                    .bind(row.attempts)
                    .bind(row.failures)
                    .bind(&row.last_error)
                    .bind(&row.fingerprint)
                    .bind(now)
                    .bind(now)
                    .bind(row.expires_at)
                    .execute(&self.pool)
                    .await
                    .unwrap();
            }
        }
    };
}

/// Keys of the version 2 scenario: exhausted ones (three failures of
/// three), ones with attempts left (one failure), completed ones.
const EXHAUSTED: std::ops::Range<usize> = 0..20;
const LEFT: std::ops::Range<usize> = 20..40;
const DONE: std::ops::Range<usize> = 40..60;
/// Written by schema version 2 while the upgrade runs.
const DURING_V2: std::ops::Range<usize> = 60..160;

async fn upgrade_v2_under_load<T: OldTable>(old: Arc<T>) {
    old.create_v2().await;
    for i in EXHAUSTED {
        old.insert_v2(V2Row::retry(i, 3)).await;
    }
    for i in LEFT {
        old.insert_v2(V2Row::retry(i, 1)).await;
    }
    for i in DONE {
        old.insert_v2(V2Row::completed(i)).await;
    }
    let store = old.store().await;
    assert_eq!(T::schema_version(&store).await.unwrap(), Some(2));
    let err = store.claim(&LIMITED, &key(0), None).await.unwrap_err();
    assert!(
        matches!(&err, StoreError::Schema(m) if m.contains("migrate()")),
        "{err}"
    );

    let barrier = Arc::new(Barrier::new(MIGRATORS + 1));
    let mut migrators = Vec::new();
    for _ in 0..MIGRATORS {
        let store = old.store().await;
        let barrier = Arc::clone(&barrier);
        migrators.push(tokio::spawn(async move {
            barrier.wait().await;
            T::migrate(&store).await
        }));
    }
    let writer = {
        let old = Arc::clone(&old);
        let barrier = Arc::clone(&barrier);
        tokio::spawn(async move {
            barrier.wait().await;
            for i in DURING_V2 {
                old.insert_v2(V2Row::retry(i, 3)).await;
            }
        })
    };
    for m in migrators {
        m.await.unwrap().expect("every concurrent migrate succeeds");
    }
    writer.await.unwrap();
    assert_eq!(
        T::schema_version(&store).await.unwrap(),
        Some(SCHEMA_VERSION)
    );
    assert_eq!(T::count(&store).await.unwrap(), DURING_V2.end as i64);

    // Every record kept its counts; its limit is not known.
    let record = |i| {
        let store = &store;
        async move {
            T::record_of(store, LIMITED.name, &key(i))
                .await
                .unwrap()
                .unwrap_or_else(|| panic!("record {i}"))
        }
    };
    for i in EXHAUSTED.chain(DURING_V2) {
        let r = record(i).await;
        assert_eq!(
            (
                r.status,
                r.failures,
                r.max_attempts,
                r.last_error.as_deref()
            ),
            (
                Status::Retry,
                3,
                None,
                Some(format!("timeout {i}").as_str())
            ),
            "{i}"
        );
        // The rules read the limit from the handler: still exhausted.
        assert_eq!(
            store.claim(&LIMITED, &key(i), None).await.unwrap(),
            Claim::Refused(Standing::Exhausted {
                failures: 3,
                last_error: Some(format!("timeout {i}")),
            }),
            "record {i} stays exhausted"
        );
    }
    for i in DONE {
        let r = record(i).await;
        assert_eq!(
            (r.status, r.attempts, r.failures, r.max_attempts),
            (Status::Completed, 2, 1, None),
            "{i}"
        );
        assert!(r.fingerprint.is_some(), "{i}");
    }

    // This release's claims write the limit: a key with attempts left
    // taken over, a new key inserted; its stores can tell exhaustion.
    for i in LEFT {
        let Claim::Fresh { token } = store.claim(&LIMITED, &key(i), None).await.unwrap() else {
            panic!("key {i} has attempts left");
        };
        let r = record(i).await;
        assert_eq!(
            (r.status, r.attempts, r.failures, r.max_attempts),
            (Status::InProgress, 2, 1, Some(3)),
            "{i}"
        );
        assert!(
            store
                .fail(
                    &LIMITED,
                    &key(i),
                    &token,
                    idem_runtime::store::Failure::Counted { error: "again" },
                )
                .await
                .unwrap()
        );
        let r = record(i).await;
        assert_eq!(
            (r.status, r.failures, r.max_attempts),
            (Status::Retry, 2, Some(3))
        );
        assert!(!r.is_exhausted(now_ms()), "{i}: one attempt left");
    }
    let fresh = DURING_V2.end;
    let Claim::Fresh { .. } = store.claim(&LIMITED, &key(fresh), None).await.unwrap() else {
        panic!("a new key is claimed");
    };
    assert_eq!(record(fresh).await.max_attempts, Some(3));

    // Schema version 2 still writes after the upgrade (a rolling deploy).
    old.insert_v2(V2Row::retry(fresh + 1, 3)).await;
    assert!(matches!(
        store.claim(&LIMITED, &key(fresh + 1), None).await.unwrap(),
        Claim::Refused(Standing::Exhausted { failures: 3, .. })
    ));
    T::migrate(&store).await.unwrap();
    assert_eq!(T::count(&store).await.unwrap(), fresh as i64 + 2);
}

// ---------------------------------------------------------------------------
// SQLite

struct SqliteOld {
    file: PathBuf,
    table: String,
    pool: sqlx::SqlitePool,
    _dir: tempfile::TempDir,
}

impl SqliteOld {
    async fn new() -> SqliteOld {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("idem.db");
        // The first release's store opened the file (WAL, busy timeout).
        let store = SqliteStore::open(&file).await.unwrap();
        SqliteOld {
            file,
            table: "idem_keys".to_owned(),
            pool: store.pool().clone(),
            _dir: dir,
        }
    }
}

old_table!(
    SqliteOld,
    SqliteStore,
    |old| SqliteStore::open(&old.file).await.unwrap(),
    "../fixtures/schema_v1/sqlite.sql",
    "INSERT INTO {t} (handler, key, status, token, outcome, attempts, created_at, updated_at, expires_at)
     VALUES (?, ?, ?, ?, ?, 1, ?, ?, ?)",
    "../fixtures/schema_v2/sqlite.sql",
    "INSERT INTO {t} (handler, key, status, token, outcome, attempts, failures, last_error,
                      fingerprint, created_at, updated_at, expires_at)
     VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_upgrades_a_first_release_table_under_load() {
    upgrade_under_load(Arc::new(SqliteOld::new().await)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_upgrades_a_version_2_table_under_load() {
    upgrade_v2_under_load(Arc::new(SqliteOld::new().await)).await;
}

// ---------------------------------------------------------------------------
// PostgreSQL

struct PgOld {
    table: String,
    pool: sqlx::PgPool,
    _drop: DropTables,
}

old_table!(
    PgOld,
    PgStore,
    |_old| PgStore::connect(&pg_url()).await.unwrap(),
    "../fixtures/schema_v1/postgres.sql",
    "INSERT INTO {t} (handler, key, status, token, outcome, attempts, created_at, updated_at, expires_at)
     VALUES ($1, $2, $3, $4, $5, 1, $6, $7, $8)",
    "../fixtures/schema_v2/postgres.sql",
    "INSERT INTO {t} (handler, key, status, token, outcome, attempts, failures, last_error,
                      fingerprint, created_at, updated_at, expires_at)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)"
);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_upgrades_a_first_release_table_under_load() {
    let pool = or_skip!(idem_tests::pg_pool(4).await);
    let table = unique_table("upgrade");
    let old = PgOld {
        _drop: DropTables::new(&[&table]),
        table,
        pool,
    };
    upgrade_under_load(Arc::new(old)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_upgrades_a_version_2_table_under_load() {
    let pool = or_skip!(idem_tests::pg_pool(4).await);
    let table = unique_table("upgrade_v2");
    let old = PgOld {
        _drop: DropTables::new(&[&table]),
        table,
        pool,
    };
    upgrade_v2_under_load(Arc::new(old)).await;
}

// ---------------------------------------------------------------------------
// MySQL / MariaDB

struct MySqlOld {
    table: String,
    pool: sqlx::MySqlPool,
    _drop: DropMySqlTables,
}

old_table!(
    MySqlOld,
    MySqlStore,
    |_old| MySqlStore::connect(&mysql_url()).await.unwrap(),
    "../fixtures/schema_v1/mysql.sql",
    "INSERT INTO {t} (handler, `key`, status, token, outcome, attempts, created_at, updated_at, expires_at)
     VALUES (?, ?, ?, ?, ?, 1, ?, ?, ?)",
    "../fixtures/schema_v2/mysql.sql",
    "INSERT INTO {t} (handler, `key`, status, token, outcome, attempts, failures, last_error,
                      fingerprint, created_at, updated_at, expires_at)
     VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mysql_upgrades_a_first_release_table_under_load() {
    let pool = or_skip!(idem_tests::mysql_pool(4, 5).await);
    let table = unique_table("upgrade");
    let old = MySqlOld {
        _drop: DropMySqlTables::new(&[&table]),
        table,
        pool,
    };
    upgrade_under_load(Arc::new(old)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mysql_upgrades_a_version_2_table_under_load() {
    let pool = or_skip!(idem_tests::mysql_pool(4, 5).await);
    let table = unique_table("upgrade_v2");
    let old = MySqlOld {
        _drop: DropMySqlTables::new(&[&table]),
        table,
        pool,
    };
    upgrade_v2_under_load(Arc::new(old)).await;
}
