//! Helpers shared by the behaviour tests: a SQLite database of its own per
//! test (with business tables next to the dedup table), a probe that counts
//! how often a body really ran and can park it, and a tally of concurrent
//! results.

// Each test binary uses a different part of these helpers.
#![allow(dead_code)]

use std::fmt::Debug;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_runtime::clock::ManualClock;
use idem_runtime::{Error, Outcome, SqliteStore};
use tempfile::TempDir;
use tokio::sync::{Barrier, Notify};

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

/// A SQLite store in a fresh temporary directory; the directory lives as
/// long as this value.
pub(crate) struct Db {
    pub(crate) store: SqliteStore,
    dir: TempDir,
}

impl Db {
    /// A migrated store on the system clock, with `inventory` and `ledger`.
    pub(crate) async fn new() -> Db {
        Self::build(None).await
    }

    /// A migrated store reading time from `clock`.
    pub(crate) async fn with_clock(clock: &ManualClock) -> Db {
        Self::build(Some(clock.clone())).await
    }

    async fn build(clock: Option<ManualClock>) -> Db {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = SqliteStore::open(dir.path().join("idem.db"))
            .await
            .expect("open sqlite store");
        let store = match clock {
            Some(c) => store.with_clock(c),
            None => store,
        };
        Db::with_store(store, dir).await
    }

    /// Migrates `store` (whose file is `idem.db` in `dir`) and adds the business
    /// tables.
    pub(crate) async fn with_store(store: SqliteStore, dir: TempDir) -> Db {
        store.migrate().await.expect("migrate");
        sqlx::raw_sql(
            "CREATE TABLE inventory (sku TEXT PRIMARY KEY, stock INTEGER NOT NULL);
             CREATE TABLE ledger (id INTEGER PRIMARY KEY AUTOINCREMENT,
                                  order_id TEXT NOT NULL, amount INTEGER NOT NULL);",
        )
        .execute(store.pool())
        .await
        .expect("business tables");
        Db { store, dir }
    }

    /// Puts `stock` units of `sku` in the inventory.
    pub(crate) async fn stock_up(&self, sku: &str, stock: i64) {
        sqlx::query("INSERT OR REPLACE INTO inventory (sku, stock) VALUES (?, ?)")
            .bind(sku)
            .bind(stock)
            .execute(self.store.pool())
            .await
            .expect("stock up");
    }

    /// The stock of `sku`, read back from the database.
    pub(crate) async fn stock(&self, sku: &str) -> i64 {
        sqlx::query_scalar("SELECT stock FROM inventory WHERE sku = ?")
            .bind(sku)
            .fetch_one(self.store.pool())
            .await
            .expect("read stock")
    }

    /// How many ledger rows the bodies wrote for `order_id`.
    pub(crate) async fn ledger_rows(&self, order_id: &str) -> i64 {
        sqlx::query_scalar("SELECT COUNT(*) FROM ledger WHERE order_id = ?")
            .bind(order_id)
            .fetch_one(self.store.pool())
            .await
            .expect("count ledger rows")
    }

    /// How many ledger rows there are in all.
    pub(crate) async fn ledger_len(&self) -> i64 {
        sqlx::query_scalar("SELECT COUNT(*) FROM ledger")
            .fetch_one(self.store.pool())
            .await
            .expect("count ledger")
    }

    /// The database file, to open a second store on it (another consumer).
    pub(crate) fn file(&self) -> std::path::PathBuf {
        self.dir.path().join("idem.db")
    }

    /// How many dedup records the store's table holds.
    pub(crate) async fn records(&self) -> i64 {
        self.store.count().await.expect("count records")
    }
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
    /// [`open_gate`](Self::open_gate).
    pub(crate) async fn park(&self) {
        self.entered.notify_one();
        self.gate.notified().await;
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
