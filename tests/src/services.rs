//! Reaching the servers the tests use, and what a test does when one is
//! unreachable: it says so and skips (returns early), unless
//! `IDEM_REQUIRE_SERVICES=1`, which turns the skip into a failure. CI sets
//! that, so a missing server fails the build instead of hiding tests.
//!
//! # How a skip shows
//!
//! libtest has no way for a running test to report itself skipped (a test
//! is `ignored` only by `#[ignore]`, decided at compile time), so a skipped
//! test is counted `ok`. To keep that visible, [`unavailable`] writes one
//! line straight to the process's standard error, which libtest does not
//! capture (it captures only the `print!` family of macros):
//!
//! ```text
//! SKIPPED claim_last_merged::none_key_part_is_key_missing_and_the_body_does_not_run: PostgreSQL at postgres://x@127.0.0.1:1/x is unreachable (pool timed out while waiting for an open connection); set IDEM_REQUIRE_SERVICES=1 to fail instead
//! ```
//!
//! The line names the test (its thread's name, which libtest sets to the
//! test's path) and the reason, and appears in a plain `cargo test
//! --workspace` run among the `test ... ok` lines, whatever the capture.
//! `cargo test --workspace 2>&1 | grep '^SKIPPED'` lists every skip of a
//! run. A summary at the end of each test binary would need a hook at the
//! process's exit, which the harness does not offer and the workspace's
//! `unsafe_code = "forbid"` rules out (`atexit`); with
//! `IDEM_REQUIRE_SERVICES=1` no skip passes at all.

use std::io::Write;
use std::time::Duration;

/// `true` when `IDEM_REQUIRE_SERVICES=1`: unreachable servers fail tests.
pub fn services_required() -> bool {
    std::env::var("IDEM_REQUIRE_SERVICES").is_ok_and(|v| v == "1")
}

/// Reports an unreachable service: panics when services are required,
/// otherwise writes a `SKIPPED <test>: <why>` line that libtest does not
/// capture. Returns `None` so callers can `?`-style skip.
pub fn unavailable<T>(service: &str, url: &str, why: impl std::fmt::Display) -> Option<T> {
    let msg = format!("{service} at {url} is unreachable ({why})");
    if services_required() {
        panic!("{msg}; IDEM_REQUIRE_SERVICES=1 makes this a failure");
    }
    let test = std::thread::current()
        .name()
        .unwrap_or("a test outside libtest's threads")
        .to_owned();
    let line = format!("SKIPPED {test}: {msg}; set IDEM_REQUIRE_SERVICES=1 to fail instead\n");
    // Past libtest's capture, in one write so that lines of parallel tests
    // do not interleave.
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
    None
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

/// The PostgreSQL URL: `DATABASE_URL`, or the loopback default, in plain
/// text (`sslmode=disable`): the workspace's tests are built with TLS (the
/// CLI's `tls` feature), with which sqlx's default `prefer` would encrypt
/// to a server that has `ssl = on`, and the tests that cut or drop bytes
/// between client and server read the protocol. TLS has tests of its own,
/// on servers of their own (`tests/tests/tls.rs`).
pub fn pg_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test?sslmode=disable".to_owned())
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

/// The MariaDB (or MySQL) URL: `MYSQL_URL`, or the loopback default, in
/// plain text (`ssl-mode=DISABLED`), for the reason [`pg_url`] gives: with
/// TLS built in, sqlx's default `PREFERRED` would encrypt to a server that
/// offers TLS (MariaDB 11.4 does by default).
pub fn mysql_url() -> String {
    std::env::var("MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test?ssl-mode=DISABLED".to_owned())
}

/// A MariaDB pool whose sessions wait at most `lock_wait_secs` on a row lock
/// (`innodb_lock_wait_timeout`), or `None` (after [`unavailable`]) when the
/// server cannot be reached.
pub async fn mysql_pool(max_connections: u32, lock_wait_secs: u32) -> Option<sqlx::MySqlPool> {
    let url = mysql_url();
    let connect = sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(10))
        .after_connect(move |conn, _| {
            Box::pin(async move {
                sqlx::query("SET SESSION innodb_lock_wait_timeout = ?")
                    .bind(lock_wait_secs)
                    .execute(conn)
                    .await
                    .map(drop)
            })
        })
        .connect(&url);
    match tokio::time::timeout(Duration::from_secs(10), connect).await {
        Ok(Ok(pool)) => Some(pool),
        Ok(Err(e)) => unavailable("MariaDB", &url, e),
        Err(_) => unavailable("MariaDB", &url, "connect timed out"),
    }
}

/// The Redis URL: `REDIS_URL`, or the loopback default.
pub fn redis_url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
}

/// A [`RedisStore`](idem_runtime::RedisStore) on the server of
/// [`redis_url`] whose keys all start with `prefix:`, or `None` (after
/// [`unavailable`]) when the server cannot be reached. Pair it with a
/// [`DeleteKeys`](crate::DeleteKeys) guard for the same prefix.
pub async fn redis_store(prefix: &str) -> Option<idem_runtime::RedisStore> {
    let url = redis_url();
    let connect = idem_runtime::RedisStore::connect(&url);
    let store = match tokio::time::timeout(Duration::from_secs(10), connect).await {
        Ok(Ok(store)) => store,
        Ok(Err(e)) => return unavailable("Redis", &url, e),
        Err(_) => return unavailable("Redis", &url, "connect timed out"),
    };
    Some(store.with_prefix(prefix).expect("a valid key prefix"))
}

/// A synchronous connection to the Redis at `url`, with short timeouts: for
/// clean-up and health checks that must not depend on a test's runtime.
pub(crate) fn redis_sync_conn(url: &str) -> redis::RedisResult<redis::Connection> {
    let conn = redis::Client::open(url)?.get_connection_with_timeout(Duration::from_secs(2))?;
    conn.set_read_timeout(Some(Duration::from_secs(5)))?;
    conn.set_write_timeout(Some(Duration::from_secs(5)))?;
    Ok(conn)
}
