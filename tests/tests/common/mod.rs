//! Helpers shared by the behaviour tests: a database of its own per test
//! (SQLite: [`Db`]; PostgreSQL: [`PgDb`]) with business tables next to the
//! dedup table, a probe that counts how often a body really ran and can park
//! it, a tally of concurrent results, and the behaviour suites themselves
//! ([`tx::suite!`](tx) and [`lease::suite!`](lease)), written once and
//! instantiated per store.

// Each test binary uses a different part of these helpers.
#![allow(dead_code)]

use std::fmt::Debug;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_runtime::ClaimOrder;
use idem_runtime::clock::ManualClock;
use idem_runtime::{Error, Outcome};
use idem_runtime::{Record, Status};
use tokio::sync::{Barrier, Notify};

/// The business tables of a suite fixture (a type with `store`, `inventory`
/// and `ledger` fields), read and written with the same SQL on every store:
/// `$n` placeholders, which SQLite accepts as well as PostgreSQL.
macro_rules! business_tables {
    ($Db:ident) => {
        impl $Db {
            /// Puts `stock` units of `sku` in the inventory.
            pub(crate) async fn stock_up(&self, sku: &str, stock: i64) {
                let sql = format!(
                    "INSERT INTO {} (sku, stock) VALUES ($1, $2)
                     ON CONFLICT (sku) DO UPDATE SET stock = excluded.stock",
                    self.inventory
                );
                self.write(sql, sku, stock).await.expect("stock up");
            }

            /// The stock of `sku`, read back from the database.
            pub(crate) async fn stock(&self, sku: &str) -> i64 {
                let sql = format!("SELECT stock FROM {} WHERE sku = $1", self.inventory);
                self.scalar(sql, Some(sku)).await
            }

            /// How many ledger rows the bodies wrote for `order_id`.
            pub(crate) async fn ledger_rows(&self, order_id: &str) -> i64 {
                let sql = format!("SELECT COUNT(*) FROM {} WHERE order_id = $1", self.ledger);
                self.scalar(sql, Some(order_id)).await
            }

            /// How many ledger rows there are in all.
            pub(crate) async fn ledger_len(&self) -> i64 {
                self.scalar(format!("SELECT COUNT(*) FROM {}", self.ledger), None)
                    .await
            }

            /// The one number `sql` (with at most one parameter) returns.
            async fn scalar(&self, sql: String, arg: Option<&str>) -> i64 {
                let mut query = sqlx::query_scalar(sqlx::AssertSqlSafe(sql));
                if let Some(arg) = arg {
                    query = query.bind(arg);
                }
                query
                    .fetch_one(self.store.pool())
                    .await
                    .expect("read a number")
            }

            /// Writes a ledger row through the pool, outside any idem
            /// transaction, as a lease-mode body's external effect would be.
            pub(crate) async fn add_ledger(
                &self,
                order_id: &str,
                amount: i64,
            ) -> Result<(), sqlx::Error> {
                let sql = format!(
                    "INSERT INTO {} (order_id, amount) VALUES ($1, $2)",
                    self.ledger
                );
                self.write(sql, order_id, amount).await
            }

            /// Runs `sql` with a text and a number parameter.
            async fn write(&self, sql: String, text: &str, number: i64) -> Result<(), sqlx::Error> {
                sqlx::query(sqlx::AssertSqlSafe(sql))
                    .bind(text)
                    .bind(number)
                    .execute(self.store.pool())
                    .await
                    .map(drop)
            }

            /// How many dedup records the store's table holds.
            pub(crate) async fn records(&self) -> i64 {
                self.store.count().await.expect("count records")
            }

            /// Overwrites the recorded outcome of `handler`'s records, as if
            /// the return type had changed since; returns how many changed.
            pub(crate) async fn set_outcome(&self, handler: &str, outcome: &str) -> u64 {
                let sql = format!(
                    "UPDATE {} SET outcome = $1 WHERE handler = $2",
                    self.store.table()
                );
                sqlx::query(sqlx::AssertSqlSafe(sql))
                    .bind(outcome)
                    .bind(handler)
                    .execute(self.store.pool())
                    .await
                    .expect("overwrite outcome")
                    .rows_affected()
            }

            /// The fencing token of the dedup table's only record.
            pub(crate) async fn only_token(&self) -> Option<String> {
                let sql = format!("SELECT token FROM {}", self.store.table());
                sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
                    .fetch_one(self.store.pool())
                    .await
                    .expect("read the token")
            }
        }
    };
}

mod pg;
mod sqlite;

pub(crate) mod broker;
pub(crate) mod lease;
pub(crate) mod tx;

pub(crate) use pg::PgDb;
pub(crate) use sqlite::Db;

/// What the suites' expansions use, in one import.
#[allow(unused_imports)]
pub(crate) mod prelude {
    pub(crate) use std::sync::Arc;
    pub(crate) use std::time::{Duration, Instant};

    pub(crate) use super::{
        AppError, Db, Fixture, Mode, Open, PgDb, Probe, T0, Tally, eventually, together,
    };
    pub(crate) use idem_runtime::clock::ManualClock;
    pub(crate) use idem_runtime::store::Status;
    pub(crate) use idem_runtime::{Error, Outcome, PgTx, SqliteTx, StoreError, idempotent};
    pub(crate) use idem_tests::or_skip;
    pub(crate) use sqlx::AssertSqlSafe;
}

/// A suite fixture: a store with business tables next to its dedup table.
pub(crate) trait Fixture {
    /// The store the handlers take.
    type Store: Clone + Send + Sync + 'static;
}

/// Which store (and, on PostgreSQL, which [`ClaimOrder`]) a suite runs on:
/// where their documented behaviour differs, the suites assert each one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Sqlite,
    Pg(ClaimOrder),
}

impl Mode {
    /// Whether a transaction-mode delivery of a key that already has a
    /// record runs its body before the store finds the record. Only
    /// PostgreSQL's `ClaimOrder::Last` does: the dedup row is inserted after
    /// the body, and the body's writes roll back when that insert finds the
    /// row. SQLite and `ClaimOrder::First` claim before the body and turn the
    /// duplicate away.
    pub(crate) fn duplicate_runs_body(self) -> bool {
        self == Mode::Pg(ClaimOrder::Last)
    }

    /// How often transaction-mode bodies run for `executed` deliveries that
    /// commit and `duplicates` deliveries that find a record.
    pub(crate) fn body_runs(self, executed: usize, duplicates: usize) -> usize {
        if self.duplicate_runs_body() {
            executed + duplicates
        } else {
            executed
        }
    }
}

/// How a suite fixture's store is built.
#[derive(Debug, Clone)]
pub(crate) enum Open {
    /// On the system clock.
    Plain,
    /// Reading time from this clock.
    Clock(ManualClock),
    /// With this lock (SQLite: busy) timeout instead of the default 5 s.
    LockTimeout(Duration),
    /// From a pool the application made itself (PostgreSQL stores always are).
    AppPool,
}

/// A fixed start for manual clocks (2023-11-14T22:13:20Z).
pub(crate) const T0: i64 = 1_700_000_000_000;

/// The error type of the test handlers.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AppError {
    #[error("sql: {0}")]
    Sql(#[from] sqlx::Error),
    #[error("refused: {0}")]
    Refused(String),
}

/// Counts how often a body ran, remembers what it saw, and can park a body
/// until the test lets it go.
#[derive(Debug, Default)]
pub(crate) struct Probe {
    runs: AtomicUsize,
    entered: Notify,
    gate: Notify,
    seen: Mutex<Vec<String>>,
}

impl Probe {
    pub(crate) fn new() -> Arc<Probe> {
        Arc::new(Probe::default())
    }

    /// Called by a body when it starts; returns the run number (from 1).
    pub(crate) fn hit(&self) -> usize {
        self.runs.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// How often a body ran.
    pub(crate) fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }

    /// Called by a body: tells the test it is inside, then waits for
    /// [`open_gate`](Self::open_gate). The wait is bounded, so a test that
    /// fails before it opens the gate cannot leave a body (and the locks of
    /// its transaction) parked for ever.
    pub(crate) async fn park(&self) {
        self.entered.notify_one();
        tokio::time::timeout(Duration::from_secs(30), self.gate.notified())
            .await
            .expect("the test never opened the gate");
    }

    /// Waits until a body is parked (a permit is kept, so no wake-up is lost).
    pub(crate) async fn wait_parked(&self) {
        tokio::time::timeout(Duration::from_secs(10), self.entered.notified())
            .await
            .expect("the body never parked");
    }

    /// Lets one parked body go on.
    pub(crate) fn open_gate(&self) {
        self.gate.notify_one();
    }

    /// Remembers a string the body saw (e.g. its key).
    pub(crate) fn see(&self, s: impl Into<String>) {
        self.seen.lock().expect("probe lock").push(s.into());
    }

    pub(crate) fn seen(&self) -> Vec<String> {
        self.seen.lock().expect("probe lock").clone()
    }
}

/// How a batch of concurrent calls came out.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Tally {
    pub(crate) executed: usize,
    pub(crate) duplicate: usize,
    pub(crate) in_progress: usize,
    /// Anything else, printed.
    pub(crate) other: Vec<String>,
}

impl Tally {
    pub(crate) fn of<T: Debug, E: Debug>(
        results: impl IntoIterator<Item = Result<Outcome<T>, Error<E>>>,
    ) -> Tally {
        let mut t = Tally::default();
        for r in results {
            match r {
                Ok(Outcome::Executed(_)) => t.executed += 1,
                Ok(Outcome::Duplicate(_)) => t.duplicate += 1,
                Err(Error::InProgress { .. }) => t.in_progress += 1,
                other => t.other.push(format!("{other:?}")),
            }
        }
        t
    }

    pub(crate) fn total(&self) -> usize {
        self.executed + self.duplicate + self.in_progress + self.other.len()
    }

    /// Lease mode: `executed` calls ran, the `rest` found the key completed
    /// or in progress, and nothing else happened.
    pub(crate) fn assert_leased(&self, executed: usize, rest: usize) {
        assert_eq!(self.executed, executed, "{self:?}");
        assert_eq!(self.duplicate + self.in_progress, rest, "{self:?}");
        assert!(self.other.is_empty(), "{self:?}");
    }
}

/// Spawns `n` tasks that all wait on one barrier and then run `f(i)`, so the
/// calls start at the same moment; returns their results in task order.
pub(crate) async fn together<T, F, Fut>(n: usize, f: F) -> Vec<T>
where
    F: Fn(usize) -> Fut,
    Fut: Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let barrier = Arc::new(Barrier::new(n));
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let barrier = Arc::clone(&barrier);
            let call = f(i);
            tokio::spawn(async move {
                barrier.wait().await;
                call.await
            })
        })
        .collect();
    let mut out = Vec::with_capacity(n);
    for t in tasks {
        out.push(t.await.expect("task panicked"));
    }
    out
}

/// The heartbeat kept `claimed`'s lease alive: `rec`, read later, is still
/// in progress under the first claim (no takeover), with a later update and
/// an expiry past the first lease (400 ms).
pub(crate) fn assert_extended(rec: &Record, claimed: &Record) {
    assert_eq!(rec.status, Status::InProgress, "{rec:?}");
    assert_eq!(rec.attempts, 1, "no takeover happened: {rec:?}");
    assert!(
        rec.expires_at_ms > claimed.created_at_ms + 400,
        "the lease was never extended: {rec:?}"
    );
    assert!(rec.updated_at_ms > claimed.updated_at_ms, "{rec:?}");
}

/// Polls `cond` every 5 ms until it holds, failing after `within`.
pub(crate) async fn eventually<F, Fut>(within: Duration, what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if cond().await {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
