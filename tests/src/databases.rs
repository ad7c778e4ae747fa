//! Names of a test's own on the shared servers (PostgreSQL tables, Redis key
//! prefixes), so tests run in parallel, and guards that remove what a test
//! created when it ends, also when it fails.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::services::{mysql_url, pg_url, redis_sync_conn};

/// A unique, valid table name for one test, so tests run in parallel.
/// `tables` and, beside each, the outbox table `migrate()` creates when it
/// is a dedup table (`<name>_outbox`, for a name short enough to keep it).
fn with_outboxes(tables: &[&str]) -> Vec<String> {
    tables
        .iter()
        .flat_map(|t| {
            let bare = t.rsplit('.').next().unwrap_or(t);
            let outbox = (bare.len() + "_outbox".len() <= 63).then(|| format!("{t}_outbox"));
            std::iter::once((*t).to_owned()).chain(outbox)
        })
        .collect()
}

pub fn unique_table(prefix: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let salt = uuid::Uuid::new_v4().simple().to_string();
    format!("{prefix}_{}_{n}_{}", std::process::id(), &salt[..8])
}

/// Sleeps into the next period of `width` on the wall clock, 50 ms past its
/// start: for a test of a dedup table partitioned by time (periods of the
/// database's clock, which is this machine's) that wants rows in a
/// partition of their own.
pub async fn next_period(width: Duration) {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_millis();
    let w = width.as_millis();
    let left = w - now % w + 50;
    tokio::time::sleep(Duration::from_millis(left as u64)).await;
}

/// Drops the named tables when dropped, so tests leave nothing behind even
/// when they fail, with the functions a partitioned dedup table's
/// migration makes beside it (`<table>_idem_bring`, `<table>_idem_maintain`;
/// the tests' table names are short enough to be their prefix).
pub struct DropTables {
    tables: Vec<String>,
}

impl DropTables {
    /// Drops `tables` from the PostgreSQL database at the end of the scope,
    /// with the outbox table `migrate()` creates beside a dedup table.
    pub fn new(tables: &[&str]) -> Self {
        DropTables {
            tables: with_outboxes(tables),
        }
    }
}

impl Drop for DropTables {
    fn drop(&mut self) {
        let functions: Vec<String> = self
            .tables
            .iter()
            .flat_map(|t| {
                [
                    format!("{t}_idem_bring()"),
                    format!("{t}_idem_maintain(bigint, bigint)"),
                ]
            })
            .collect();
        let sql = format!(
            "DROP TABLE IF EXISTS {} CASCADE; DROP FUNCTION IF EXISTS {} CASCADE",
            self.tables.join(", "),
            functions.join(", ")
        );
        // A fresh thread, runtime and connection: the test's runtime may be
        // shutting down, and its connections belong to it.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            if let Ok(rt) = rt {
                rt.block_on(async move {
                    use sqlx::Connection as _;
                    if let Ok(mut conn) = sqlx::PgConnection::connect(&pg_url()).await {
                        let _ = sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                            .execute(&mut conn)
                            .await;
                    }
                });
            }
        })
        .join();
    }
}

/// A unique Redis key prefix for one test (see [`unique_table`]), so tests
/// sharing one server run in parallel; [`DeleteKeys`] removes its keys.
pub fn unique_prefix(name: &str) -> String {
    unique_table(name)
}

/// Deletes every key `prefix:*` from one Redis server when dropped, so a
/// test leaves nothing behind even when it fails.
#[derive(Debug)]
pub struct DeleteKeys {
    url: String,
    pattern: String,
}

impl DeleteKeys {
    /// Deletes the keys under `prefix` (as given to
    /// [`RedisStore::with_prefix`](idem_runtime::RedisStore::with_prefix))
    /// from the server at `url` at the end of the scope.
    pub fn new(url: &str, prefix: &str) -> Self {
        assert!(
            prefix
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_'),
            "a prefix without glob characters: {prefix:?}"
        );
        DeleteKeys {
            url: url.to_owned(),
            pattern: format!("{prefix}:*"),
        }
    }

    /// The keys that match the prefix now (`SCAN MATCH prefix:*`).
    pub fn keys(&self) -> redis::RedisResult<Vec<String>> {
        let mut conn = redis_sync_conn(&self.url)?;
        scan(&mut conn, &self.pattern)
    }
}

impl Drop for DeleteKeys {
    fn drop(&mut self) {
        // A synchronous connection of its own: the test's runtime may be
        // shutting down. Failures are ignored (the server may be gone).
        let Ok(mut conn) = redis_sync_conn(&self.url) else {
            return;
        };
        if let Ok(keys) = scan(&mut conn, &self.pattern) {
            for chunk in keys.chunks(500) {
                let _: redis::RedisResult<i64> = redis::cmd("DEL").arg(chunk).query(&mut conn);
            }
        }
    }
}

fn scan(conn: &mut redis::Connection, pattern: &str) -> redis::RedisResult<Vec<String>> {
    let mut keys = Vec::new();
    let mut cursor = 0u64;
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000)
            .query(conn)?;
        keys.extend(batch);
        if next == 0 {
            return Ok(keys);
        }
        cursor = next;
    }
}

/// Drops the named tables from the MariaDB database of [`mysql_url`] when
/// dropped, so tests leave nothing behind even when they fail.
pub struct DropMySqlTables {
    tables: Vec<String>,
}

impl DropMySqlTables {
    /// Drops `tables` at the end of the scope, with the outbox table
    /// `migrate()` creates beside a dedup table.
    pub fn new(tables: &[&str]) -> Self {
        DropMySqlTables {
            tables: with_outboxes(tables),
        }
    }
}

impl Drop for DropMySqlTables {
    fn drop(&mut self) {
        let sql = format!("DROP TABLE IF EXISTS {}", self.tables.join(", "));
        // A fresh thread, runtime and connection, as for `DropTables`. A
        // failed test may leave a transaction open on the table (its
        // rollback waits for the test's runtime, which this blocks): give up
        // on the table after 10 s rather than wait for ever.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            if let Ok(rt) = rt {
                rt.block_on(async move {
                    use sqlx::Connection as _;
                    if let Ok(mut conn) = sqlx::MySqlConnection::connect(&mysql_url()).await {
                        let sql = format!("SET SESSION lock_wait_timeout = 10; {sql}");
                        let _ = sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                            .execute(&mut conn)
                            .await;
                    }
                });
            }
        })
        .join();
    }
}
