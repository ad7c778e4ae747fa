//! Helpers of the behaviour tests, one concern per module:
//!
//! * the suites, each written once and instantiated per store or broker:
//!   [`lease`] (lease mode, every lease store), [`tx`] (transaction mode,
//!   every SQL store), [`broker`] (the consumers) and [`stress`]
//!   (contention, crashes, killed connections and lock waits on PostgreSQL
//!   and MySQL, each fixture in its own test file) and [`http_suite`] (the
//!   Idempotency-Key layer over real HTTP, every store in each of its modes);
//! * the stores' fixtures, a store of the test's own each: [`Db`] (SQLite),
//!   [`PgDb`] (PostgreSQL), [`MySqlDb`] (MySQL/MariaDB), [`MemoryFx`],
//!   [`RedisFx`]; what the SQL ones share (business tables next to the dedup
//!   table, in the `$n` dialect; the suites' fixtures over them) is in
//!   `sql.rs`, and `mysql.rs` writes its business tables in the `?` one;
//! * [`lossy`]: a store whose next completion loses its reply (through a
//!   proxy that drops the connection, where the store has a server);
//! * what a test hands its handlers and does with their calls: [`Probe`]
//!   (`probe.rs`), and [`together`], [`Tally`] and [`eventually`]
//!   (`calls.rs`);
//! * what the metrics said: [`recorder`], a recorder that keeps the series.

// Each test binary uses a different part of these helpers.
#![allow(dead_code)]

#[macro_use]
mod sql;

mod calls;
mod lease_batch;
mod lease_ops;
pub(crate) mod lossy;
mod memory;
mod mysql;
mod pg;
mod probe;
mod redis;
mod sqlite;

pub(crate) mod broker;
pub(crate) mod http_suite;
pub(crate) mod lease;
pub(crate) mod ops;
pub(crate) mod recorder;
pub(crate) mod redis_store;
pub(crate) mod stress;
pub(crate) mod tx;
mod tx_batch;
mod tx_ops;

// Each test binary uses some of these.
#[allow(unused_imports)]
pub(crate) use {
    calls::{Tally, eventually, together},
    memory::MemoryFx,
    mysql::MySqlDb,
    pg::PgDb,
    probe::Probe,
    redis::RedisFx,
    sqlite::Db,
};

/// A fixed start for manual clocks (2023-11-14T22:13:20Z).
pub(crate) const T0: i64 = 1_700_000_000_000;

/// The statement that reads the clock of `store`'s database, as the
/// store's own statements read it ([`Dialect::NOW`]).
///
/// [`Dialect::NOW`]: idem_runtime::store::sql::Dialect::NOW
pub(crate) fn now_sql<D: idem_runtime::store::sql::Dialect>(
    _store: &idem_runtime::store::sql::SqlStore<D>,
) -> String {
    format!("SELECT {}", D::NOW)
}

/// The error type of the test handlers.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AppError {
    #[error("sql: {0}")]
    Sql(#[from] sqlx::Error),
    #[error("refused: {0}")]
    Refused(String),
}
