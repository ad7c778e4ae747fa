//! Helpers for idem's integration tests: where the servers are, and what a
//! test does when one is unreachable.
//!
//! A test that needs a server asks for it through one of the functions here.
//! When the server cannot be reached the test prints why and returns early
//! (skips), unless `IDEM_REQUIRE_SERVICES=1`, in which case it panics: CI
//! sets that, so a missing server fails the build instead of hiding tests.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// `true` when `IDEM_REQUIRE_SERVICES=1`: unreachable servers fail tests.
pub fn services_required() -> bool {
    std::env::var("IDEM_REQUIRE_SERVICES").is_ok_and(|v| v == "1")
}

/// Reports an unreachable service: panics when services are required,
/// otherwise prints a skip line. Returns `None` so callers can `?`-style skip.
pub fn unavailable<T>(service: &str, url: &str, why: impl std::fmt::Display) -> Option<T> {
    let msg = format!("{service} at {url} is unreachable ({why})");
    if services_required() {
        panic!("{msg}; IDEM_REQUIRE_SERVICES=1 makes this a failure");
    }
    eprintln!("SKIPPED: {msg}; set IDEM_REQUIRE_SERVICES=1 to fail instead");
    None
}

/// The PostgreSQL URL: `DATABASE_URL`, or the loopback default.
pub fn pg_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// A unique, valid table name for one test, so tests run in parallel.
pub fn unique_table(prefix: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let salt = uuid::Uuid::new_v4().simple().to_string();
    format!("{prefix}_{}_{n}_{}", std::process::id(), &salt[..8])
}

/// Skips the calling test (returns from it) when the expression is `None`.
#[macro_export]
macro_rules! or_skip {
    ($e:expr) => {
        match $e {
            Some(v) => v,
            None => return,
        }
    };
}

/// A PostgreSQL pool, or `None` (after [`unavailable`]) when the server
/// cannot be reached.
pub async fn pg_pool(max_connections: u32) -> Option<sqlx::PgPool> {
    let url = pg_url();
    let connect = sqlx::postgres::PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(10))
        .connect(&url);
    match tokio::time::timeout(Duration::from_secs(10), connect).await {
        Ok(Ok(pool)) => Some(pool),
        Ok(Err(e)) => unavailable("PostgreSQL", &url, e),
        Err(_) => unavailable("PostgreSQL", &url, "connect timed out"),
    }
}

/// Drops the named tables when dropped, so tests leave nothing behind even
/// when they fail.
pub struct DropTables {
    tables: Vec<String>,
}

impl DropTables {
    /// Drops `tables` from the PostgreSQL database at the end of the scope.
    pub fn new(tables: &[&str]) -> Self {
        DropTables {
            tables: tables.iter().map(|t| (*t).to_owned()).collect(),
        }
    }
}

impl Drop for DropTables {
    fn drop(&mut self) {
        let sql = format!("DROP TABLE IF EXISTS {} CASCADE", self.tables.join(", "));
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
