//! What a rewritten handler does around its body, for both modes, and the
//! store interfaces the two modes need.
//!
//! The generated code calls these functions through `__private`. The two
//! traits are public as the written contract of a store (what a claim, a
//! completion and a commit must guarantee) and can be implemented outside
//! this crate, but `#[idempotent(store = "...")]` accepts only the built-in
//! stores.
//!
//! The stores of this crate implement them: [`LeaseStore`] all of them,
//! [`TxStore`] the SQL stores.

use std::future::Future;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde::de::DeserializeOwned;
use tracing::Instrument;

use crate::codec::{decode, encode};
use crate::error::{Error, StoreError};
use crate::key::Key;
use crate::outcome::Outcome;
use crate::registry::{self, HandlerSpec};

/// The state of a key when a lease-mode handler tries to claim it.
///
/// # Examples
///
/// What the generated code does with each answer of [`LeaseStore::claim`]:
///
/// ```
/// # use idem_runtime::registry::{HandlerSpec, Mode};
/// # use std::time::Duration;
/// # static SPEC: HandlerSpec = HandlerSpec {
/// #     name: "notify", function: "notify", key: "message_id",
/// #     ttl: Duration::from_secs(3_600), lease: Duration::from_secs(30),
/// #     store: "memory", mode: Mode::Lease, module: "app", file: "src/app.rs", line: 1,
/// # };
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use idem_runtime::{Claim, Key, LeaseStore, MemoryStore};
///
/// let store = MemoryStore::new();
/// let key = Key::from_parts(&[&"m-1"])?;
/// match store.claim(&SPEC, &key).await? {
///     Claim::Acquired { token } => {
///         // run the body, then record its result under the token
///         assert!(store.complete(&SPEC, &key, &token, "42").await?);
///     }
///     Claim::Completed { outcome } => println!("duplicate; the body returned {outcome}"),
///     Claim::InProgress { lease_left } => println!("busy for at most {lease_left:?} more"),
/// }
/// // the next delivery gets the recorded result
/// assert_eq!(store.claim(&SPEC, &key).await?, Claim::Completed { outcome: "42".into() });
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// The key was absent, expired, or its lease had run out: this caller
    /// holds it now, identified by `token`.
    Acquired {
        /// The fencing token of this claim; completion, release and lease
        /// extension only succeed while the record still holds it.
        token: String,
    },
    /// A completed record exists; `outcome` is its serialized result.
    Completed {
        /// The outcome as the store keeps it (JSON).
        outcome: String,
    },
    /// Another consumer holds a live lease.
    InProgress {
        /// What is left of that lease: after it, the key can be taken over.
        /// The runtime turns it into the caller's redelivery hint
        /// ([`Error::InProgress`]'s `retry_after`).
        lease_left: Duration,
    },
}

/// A store that can run handlers in lease mode.
///
/// Durations come from the handler's [`HandlerSpec`] (`lease`, `ttl`).
///
/// # Examples
///
/// A store that wraps another one, here to count claims:
///
/// ```
/// # use idem_runtime::registry::{HandlerSpec, Mode};
/// # use std::time::Duration;
/// # static SPEC: HandlerSpec = HandlerSpec {
/// #     name: "notify", function: "notify", key: "message_id",
/// #     ttl: Duration::from_secs(3_600), lease: Duration::from_secs(30),
/// #     store: "memory", mode: Mode::Lease, module: "app", file: "src/app.rs", line: 1,
/// # };
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use idem_runtime::{Claim, Key, LeaseStore, MemoryStore, StoreError};
/// use idem_runtime::registry::HandlerSpec;
/// use std::sync::atomic::{AtomicU64, Ordering};
///
/// #[derive(Default)]
/// struct Counted { inner: MemoryStore, claims: AtomicU64 }
///
/// impl LeaseStore for Counted {
///     fn store_name(&self) -> &'static str {
///         "counted"
///     }
///     async fn claim(&self, spec: &'static HandlerSpec, key: &Key) -> Result<Claim, StoreError> {
///         self.claims.fetch_add(1, Ordering::Relaxed);
///         self.inner.claim(spec, key).await
///     }
///     async fn complete(
///         &self, spec: &'static HandlerSpec, key: &Key, token: &str, outcome: &str,
///     ) -> Result<bool, StoreError> {
///         self.inner.complete(spec, key, token, outcome).await
///     }
///     async fn release(&self, spec: &'static HandlerSpec, key: &Key, token: &str) -> Result<(), StoreError> {
///         self.inner.release(spec, key, token).await
///     }
///     async fn extend(&self, spec: &'static HandlerSpec, key: &Key, token: &str) -> Result<bool, StoreError> {
///         self.inner.extend(spec, key, token).await
///     }
/// }
///
/// let store = Counted::default();
/// let key = Key::from_parts(&[&"m-1"])?;
/// assert!(matches!(store.claim(&SPEC, &key).await?, Claim::Acquired { .. }));
/// assert_eq!(store.claims.load(Ordering::Relaxed), 1);
/// # Ok(()) }
/// ```
pub trait LeaseStore: Send + Sync {
    /// The store's name, as written in `store = "..."`.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::{LeaseStore, MemoryStore};
    /// assert_eq!(MemoryStore::new().store_name(), "memory");
    /// ```
    fn store_name(&self) -> &'static str;

    /// Claims `key` for `spec.lease`, or reports the record that stands.
    ///
    /// # Examples
    ///
    /// ```
    /// # use idem_runtime::registry::{HandlerSpec, Mode};
    /// # use std::time::Duration;
    /// # static SPEC: HandlerSpec = HandlerSpec {
    /// #     name: "notify", function: "notify", key: "message_id",
    /// #     ttl: Duration::from_secs(3_600), lease: Duration::from_secs(30),
    /// #     store: "memory", mode: Mode::Lease, module: "app", file: "src/app.rs", line: 1,
    /// # };
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_runtime::{Claim, Key, LeaseStore, MemoryStore};
    ///
    /// let store = MemoryStore::new();
    /// let key = Key::from_parts(&[&"m-1"])?;
    /// let first = store.claim(&SPEC, &key).await?;
    /// assert!(matches!(first, Claim::Acquired { .. }));
    /// // a second consumer finds the live lease
    /// let Claim::InProgress { lease_left } = store.claim(&SPEC, &key).await? else { panic!() };
    /// assert!(lease_left <= SPEC.lease);
    /// # Ok(()) }
    /// ```
    fn claim(
        &self,
        spec: &'static HandlerSpec,
        key: &Key,
    ) -> impl Future<Output = Result<Claim, StoreError>> + Send;

    /// Records `outcome` and keeps it for `spec.ttl`, if `token` still holds
    /// the claim. `Ok(false)` means the lease was lost.
    ///
    /// # Examples
    ///
    /// ```
    /// # use idem_runtime::registry::{HandlerSpec, Mode};
    /// # use std::time::Duration;
    /// # static SPEC: HandlerSpec = HandlerSpec {
    /// #     name: "notify", function: "notify", key: "message_id",
    /// #     ttl: Duration::from_secs(3_600), lease: Duration::from_secs(30),
    /// #     store: "memory", mode: Mode::Lease, module: "app", file: "src/app.rs", line: 1,
    /// # };
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_runtime::{Claim, Key, LeaseStore, MemoryStore};
    ///
    /// let store = MemoryStore::new();
    /// let key = Key::from_parts(&[&"m-1"])?;
    /// let Claim::Acquired { token } = store.claim(&SPEC, &key).await? else { panic!() };
    /// assert!(store.complete(&SPEC, &key, &token, r#"{"sent":true}"#).await?);
    /// // the token no longer holds a claim
    /// assert!(!store.complete(&SPEC, &key, &token, "null").await?);
    /// # Ok(()) }
    /// ```
    fn complete(
        &self,
        spec: &'static HandlerSpec,
        key: &Key,
        token: &str,
        outcome: &str,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Drops the claim, if `token` still holds it, so the key can run again.
    ///
    /// # Examples
    ///
    /// ```
    /// # use idem_runtime::registry::{HandlerSpec, Mode};
    /// # use std::time::Duration;
    /// # static SPEC: HandlerSpec = HandlerSpec {
    /// #     name: "notify", function: "notify", key: "message_id",
    /// #     ttl: Duration::from_secs(3_600), lease: Duration::from_secs(30),
    /// #     store: "memory", mode: Mode::Lease, module: "app", file: "src/app.rs", line: 1,
    /// # };
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_runtime::{Claim, Key, LeaseStore, MemoryStore};
    ///
    /// let store = MemoryStore::new();
    /// let key = Key::from_parts(&[&"m-1"])?;
    /// let Claim::Acquired { token } = store.claim(&SPEC, &key).await? else { panic!() };
    /// // the body failed: give the key back so a redelivery runs it again
    /// store.release(&SPEC, &key, &token).await?;
    /// assert!(matches!(store.claim(&SPEC, &key).await?, Claim::Acquired { .. }));
    /// # Ok(()) }
    /// ```
    fn release(
        &self,
        spec: &'static HandlerSpec,
        key: &Key,
        token: &str,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Extends the lease by `spec.lease` from now, if `token` still holds it.
    /// `Ok(false)` means the lease was lost.
    ///
    /// # Examples
    ///
    /// ```
    /// # use idem_runtime::registry::{HandlerSpec, Mode};
    /// # use std::time::Duration;
    /// # static SPEC: HandlerSpec = HandlerSpec {
    /// #     name: "notify", function: "notify", key: "message_id",
    /// #     ttl: Duration::from_secs(3_600), lease: Duration::from_secs(30),
    /// #     store: "memory", mode: Mode::Lease, module: "app", file: "src/app.rs", line: 1,
    /// # };
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_runtime::{Claim, Key, LeaseStore, MemoryStore};
    ///
    /// let store = MemoryStore::new();
    /// let key = Key::from_parts(&[&"m-1"])?;
    /// let Claim::Acquired { token } = store.claim(&SPEC, &key).await? else { panic!() };
    /// assert!(store.extend(&SPEC, &key, &token).await?);
    /// assert!(!store.extend(&SPEC, &key, "someone else's token").await?);
    /// # Ok(()) }
    /// ```
    fn extend(
        &self,
        spec: &'static HandlerSpec,
        key: &Key,
        token: &str,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;
}

/// The state of a key when a transaction-mode handler opens its transaction.
///
/// # Examples
///
/// ```
/// # use idem_runtime::registry::{HandlerSpec, Mode};
/// # use std::time::Duration;
/// # static SPEC: HandlerSpec = HandlerSpec {
/// #     name: "deduct_stock", function: "deduct_stock", key: "order_id",
/// #     ttl: Duration::from_secs(86_400), lease: Duration::from_secs(30),
/// #     store: "sqlite", mode: Mode::Transaction, module: "shop", file: "src/shop.rs", line: 1,
/// # };
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// # let store = idem_runtime::SqliteStore::open(dir.path().join("idem.db")).await?;
/// # store.migrate().await?;
/// use idem_runtime::{Key, TxClaim, TxStore};
///
/// let key = Key::from_parts(&[&17u64])?;
/// match store.begin_claim(&SPEC, &key).await? {
///     TxClaim::Fresh(tx) => {
///         // run the body in `tx`, then commit its result with the claim
///         store.commit_outcome(tx, &SPEC, &key, "7").await?;
///     }
///     TxClaim::Completed { outcome } => println!("duplicate; the body returned {outcome}"),
///     TxClaim::InProgress { retry_after } => println!("busy; redeliver in {retry_after:?}"),
/// }
/// assert!(matches!(
///     store.begin_claim(&SPEC, &key).await?,
///     TxClaim::Completed { outcome } if outcome == "7"
/// ));
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub enum TxClaim<Tx> {
    /// The claim row is inserted in the open transaction `Tx`.
    Fresh(Tx),
    /// A completed record exists; the transaction was rolled back.
    Completed {
        /// The outcome as the store keeps it (JSON).
        outcome: String,
    },
    /// Another transaction holds the key past the lock timeout.
    InProgress {
        /// The lock timeout, as a redelivery hint.
        retry_after: Duration,
    },
}

/// What became of a transaction-mode call at its commit.
///
/// # Examples
///
/// ```
/// # use idem_runtime::registry::{HandlerSpec, Mode};
/// # use std::time::Duration;
/// # static SPEC: HandlerSpec = HandlerSpec {
/// #     name: "deduct_stock", function: "deduct_stock", key: "order_id",
/// #     ttl: Duration::from_secs(86_400), lease: Duration::from_secs(30),
/// #     store: "sqlite", mode: Mode::Transaction, module: "shop", file: "src/shop.rs", line: 1,
/// # };
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// # let store = idem_runtime::SqliteStore::open(dir.path().join("idem.db")).await?;
/// # store.migrate().await?;
/// use idem_runtime::{Key, TxClaim, TxCommit, TxStore};
///
/// let key = Key::from_parts(&[&17u64])?;
/// let TxClaim::Fresh(tx) = store.begin_claim(&SPEC, &key).await? else { panic!() };
/// match store.commit_outcome(tx, &SPEC, &key, "7").await? {
///     TxCommit::Committed => println!("executed"),
///     TxCommit::Duplicate { outcome } => println!("duplicate; the body returned {outcome}"),
///     TxCommit::InProgress { retry_after } => println!("busy; redeliver in {retry_after:?}"),
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TxCommit {
    /// The dedup row, the body's writes and the outcome committed.
    Committed,
    /// The store writes its dedup row after the body and found a live one:
    /// this delivery was a duplicate, its writes were rolled back, and this is
    /// the recorded outcome (JSON).
    Duplicate {
        /// The recorded outcome as the store keeps it (JSON).
        outcome: String,
    },
    /// As `Duplicate`, but the other delivery has not completed: the writes
    /// were rolled back and the call should be retried after `retry_after`.
    InProgress {
        /// A hint for the redelivery delay.
        retry_after: Duration,
    },
}

/// A SQL store that can run handlers in transaction mode.
///
/// The generated code claims the key in a transaction, hands that
/// transaction to the body, and commits the body's writes with the outcome or
/// rolls everything back.
///
/// # Examples
///
/// The calls a transaction-mode handler makes, on [`SqliteStore`](crate::SqliteStore):
///
/// ```
/// # use idem_runtime::registry::{HandlerSpec, Mode};
/// # use std::time::Duration;
/// # static SPEC: HandlerSpec = HandlerSpec {
/// #     name: "deduct_stock", function: "deduct_stock", key: "order_id",
/// #     ttl: Duration::from_secs(86_400), lease: Duration::from_secs(30),
/// #     store: "sqlite", mode: Mode::Transaction, module: "shop", file: "src/shop.rs", line: 1,
/// # };
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// # let store = idem_runtime::SqliteStore::open(dir.path().join("idem.db")).await?;
/// # store.migrate().await?;
/// use idem_runtime::{Key, TxClaim, TxCommit, TxStore};
///
/// let key = Key::from_parts(&[&17u64])?;
/// let TxClaim::Fresh(mut tx) = store.begin_claim(&SPEC, &key).await? else { panic!() };
/// // the body's writes go through the same transaction
/// sqlx::query("CREATE TABLE shipments (order_id INTEGER)").execute(&mut *tx).await?;
/// sqlx::query("INSERT INTO shipments VALUES (17)").execute(&mut *tx).await?;
/// assert_eq!(store.commit_outcome(tx, &SPEC, &key, "null").await?, TxCommit::Committed);
///
/// // a redelivery is turned away with the recorded outcome
/// assert!(matches!(store.begin_claim(&SPEC, &key).await?, TxClaim::Completed { .. }));
/// # Ok(()) }
/// ```
pub trait TxStore: Send + Sync {
    /// The open transaction handed to the body.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::{SqliteStore, SqliteTx, TxStore};
    ///
    /// // a transaction-mode SQLite handler's `tx: &mut SqliteTx<'_>` is this
    /// fn body_tx(tx: <SqliteStore as TxStore>::Tx) -> SqliteTx<'static> {
    ///     tx
    /// }
    /// ```
    type Tx: Send;

    /// The store's name, as written in `store = "..."`.
    ///
    /// # Examples
    ///
    /// ```
    /// # use idem_runtime::registry::{HandlerSpec, Mode};
    /// # use std::time::Duration;
    /// # static SPEC: HandlerSpec = HandlerSpec {
    /// #     name: "deduct_stock", function: "deduct_stock", key: "order_id",
    /// #     ttl: Duration::from_secs(86_400), lease: Duration::from_secs(30),
    /// #     store: "sqlite", mode: Mode::Transaction, module: "shop", file: "src/shop.rs", line: 1,
    /// # };
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = tempfile::tempdir()?;
    /// # let store = idem_runtime::SqliteStore::open(dir.path().join("idem.db")).await?;
    /// # store.migrate().await?;
    /// use idem_runtime::TxStore;
    /// assert_eq!(TxStore::store_name(&store), "sqlite");
    /// # Ok(()) }
    /// ```
    fn store_name(&self) -> &'static str;

    /// Begins a transaction and inserts the claim row in it.
    ///
    /// # Examples
    ///
    /// ```
    /// # use idem_runtime::registry::{HandlerSpec, Mode};
    /// # use std::time::Duration;
    /// # static SPEC: HandlerSpec = HandlerSpec {
    /// #     name: "deduct_stock", function: "deduct_stock", key: "order_id",
    /// #     ttl: Duration::from_secs(86_400), lease: Duration::from_secs(30),
    /// #     store: "sqlite", mode: Mode::Transaction, module: "shop", file: "src/shop.rs", line: 1,
    /// # };
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = tempfile::tempdir()?;
    /// # let store = idem_runtime::SqliteStore::open(dir.path().join("idem.db")).await?;
    /// # store.migrate().await?;
    /// use idem_runtime::{Key, TxClaim, TxStore};
    ///
    /// let key = Key::from_parts(&[&17u64])?;
    /// let TxClaim::Fresh(tx) = store.begin_claim(&SPEC, &key).await? else { panic!() };
    /// // ... the body runs in `tx` ...
    /// store.rollback(tx, &SPEC, &key).await?;
    /// # Ok(()) }
    /// ```
    fn begin_claim(
        &self,
        spec: &'static HandlerSpec,
        key: &Key,
    ) -> impl Future<Output = Result<TxClaim<Self::Tx>, StoreError>> + Send;

    /// Records `outcome` in the dedup row and commits, unless the store
    /// writes that row only now and finds the key taken (see [`TxCommit`]).
    ///
    /// # Examples
    ///
    /// ```
    /// # use idem_runtime::registry::{HandlerSpec, Mode};
    /// # use std::time::Duration;
    /// # static SPEC: HandlerSpec = HandlerSpec {
    /// #     name: "deduct_stock", function: "deduct_stock", key: "order_id",
    /// #     ttl: Duration::from_secs(86_400), lease: Duration::from_secs(30),
    /// #     store: "sqlite", mode: Mode::Transaction, module: "shop", file: "src/shop.rs", line: 1,
    /// # };
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = tempfile::tempdir()?;
    /// # let store = idem_runtime::SqliteStore::open(dir.path().join("idem.db")).await?;
    /// # store.migrate().await?;
    /// use idem_runtime::{Key, TxClaim, TxCommit, TxStore};
    ///
    /// let key = Key::from_parts(&[&17u64])?;
    /// let TxClaim::Fresh(tx) = store.begin_claim(&SPEC, &key).await? else { panic!() };
    /// let outcome = serde_json::to_string(&7)?;
    /// assert_eq!(store.commit_outcome(tx, &SPEC, &key, &outcome).await?, TxCommit::Committed);
    /// assert_eq!(store.record("deduct_stock", &key).await?.unwrap().outcome.as_deref(), Some("7"));
    /// # Ok(()) }
    /// ```
    fn commit_outcome(
        &self,
        tx: Self::Tx,
        spec: &'static HandlerSpec,
        key: &Key,
        outcome: &str,
    ) -> impl Future<Output = Result<TxCommit, StoreError>> + Send;

    /// Rolls back a transaction whose body failed (or whose outcome could not
    /// be encoded): the claim and the body's writes vanish.
    ///
    /// A store that writes its dedup row only after the body learns here,
    /// and only here, that the key was completed already: the failed body
    /// was a duplicate's (say, it found the stock the first delivery had
    /// taken). It then returns that recorded outcome, which the call returns
    /// as [`Outcome::Duplicate`] instead of the body's error.
    ///
    /// # Examples
    ///
    /// ```
    /// # use idem_runtime::registry::{HandlerSpec, Mode};
    /// # use std::time::Duration;
    /// # static SPEC: HandlerSpec = HandlerSpec {
    /// #     name: "deduct_stock", function: "deduct_stock", key: "order_id",
    /// #     ttl: Duration::from_secs(86_400), lease: Duration::from_secs(30),
    /// #     store: "sqlite", mode: Mode::Transaction, module: "shop", file: "src/shop.rs", line: 1,
    /// # };
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = tempfile::tempdir()?;
    /// # let store = idem_runtime::SqliteStore::open(dir.path().join("idem.db")).await?;
    /// # store.migrate().await?;
    /// use idem_runtime::{Key, TxClaim, TxStore};
    ///
    /// let key = Key::from_parts(&[&17u64])?;
    /// let TxClaim::Fresh(tx) = store.begin_claim(&SPEC, &key).await? else { panic!() };
    /// // the body failed: nothing of this call remains
    /// assert_eq!(store.rollback(tx, &SPEC, &key).await?, None);
    /// assert!(store.record("deduct_stock", &key).await?.is_none());
    /// # Ok(()) }
    /// ```
    fn rollback(
        &self,
        tx: Self::Tx,
        spec: &'static HandlerSpec,
        key: &Key,
    ) -> impl Future<Output = Result<Option<String>, StoreError>> + Send;
}

// ---------------------------------------------------------------------------
// Telemetry
// ---------------------------------------------------------------------------

/// Metric names, for dashboards and alerts.
///
/// The runtime records them through the [`metrics`](https://docs.rs/metrics)
/// facade; install any recorder (Prometheus, StatsD, ...) to export them.
///
/// # Examples
///
/// ```
/// use idem_runtime::metric;
///
/// // an alert on lease takeovers, in PromQL
/// let alert = format!(r#"rate({}{{result="lease_lost"}}[5m]) > 0"#, metric::CALLS);
/// assert_eq!(alert, r#"rate(idem_calls_total{result="lease_lost"}[5m]) > 0"#);
/// ```
pub mod metric {
    /// Counter of calls, labelled `handler` and `result`: `executed`,
    /// `duplicate`, or an [`Error::kind`](crate::Error::kind).
    ///
    /// # Examples
    ///
    /// ```
    /// // the duplicate rate of one handler, in PromQL
    /// let q = format!(
    ///     r#"rate({0}{{handler="points",result="duplicate"}}[5m]) / rate({0}{{handler="points"}}[5m])"#,
    ///     idem_runtime::metric::CALLS,
    /// );
    /// assert!(q.starts_with("rate(idem_calls_total{"));
    /// ```
    pub const CALLS: &str = "idem_calls_total";
    /// Histogram of the time to claim a key (seconds), labelled `handler`.
    ///
    /// # Examples
    ///
    /// ```
    /// // the 99th percentile of claim latency, in PromQL
    /// let q = format!(
    ///     "histogram_quantile(0.99, rate({}_bucket[5m]))",
    ///     idem_runtime::metric::CLAIM_SECONDS,
    /// );
    /// assert_eq!(q, "histogram_quantile(0.99, rate(idem_claim_seconds_bucket[5m]))");
    /// ```
    pub const CLAIM_SECONDS: &str = "idem_claim_seconds";
    /// Histogram of the time the body ran (seconds), labelled `handler`.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(idem_runtime::metric::BODY_SECONDS, "idem_body_seconds");
    /// ```
    pub const BODY_SECONDS: &str = "idem_body_seconds";
}

fn count(spec: &HandlerSpec, result: &'static str) {
    metrics::counter!(metric::CALLS, "handler" => spec.name, "result" => result).increment(1);
    tracing::Span::current().record("result", result);
}

fn record_claim(spec: &HandlerSpec, since: Instant) {
    metrics::histogram!(metric::CLAIM_SECONDS, "handler" => spec.name)
        .record(since.elapsed().as_secs_f64());
}

fn record_body(spec: &HandlerSpec, since: Instant) {
    metrics::histogram!(metric::BODY_SECONDS, "handler" => spec.name)
        .record(since.elapsed().as_secs_f64());
}

fn finish<T, E>(
    spec: &HandlerSpec,
    r: Result<Outcome<T>, Error<E>>,
) -> Result<Outcome<T>, Error<E>> {
    let label = match &r {
        Ok(Outcome::Executed(_)) => "executed",
        Ok(Outcome::Duplicate(_)) => "duplicate",
        Err(e) => e.kind(),
    };
    count(spec, label);
    match &r {
        Ok(_) => tracing::debug!(result = label, "idempotent call"),
        Err(Error::Handler { .. }) => tracing::debug!(result = label, "idempotent call"),
        Err(e) => {
            tracing::warn!(result = label, error = %ErrorDisplay(e), "idempotent call failed")
        }
    }
    r
}

/// Displays an `Error<E>` without requiring `E: Display` (the body's error
/// is not part of this message).
struct ErrorDisplay<'a, E>(&'a Error<E>);

impl<E> std::fmt::Display for ErrorDisplay<'_, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Error::Store { source, .. } => write!(f, "store: {source}"),
            Error::Codec { source, .. } => write!(f, "codec: {source}"),
            Error::Unrecordable { source, .. } => write!(f, "unrecordable: {source}"),
            Error::Config { source, .. } => write!(f, "config: {source}"),
            other => f.write_str(other.kind()),
        }
    }
}

/// The span of one call: handler, key digest and (once known) result.
pub(crate) fn call_span(spec: &HandlerSpec, key: &Key) -> tracing::Span {
    tracing::info_span!(
        "idempotent",
        handler = spec.name,
        key = %key.digest(),
        result = tracing::field::Empty,
    )
}

fn store_err<E>(spec: &'static HandlerSpec, key: &Key, source: StoreError) -> Error<E> {
    Error::Store {
        handler: spec.name,
        key: Some(key.clone()),
        source,
    }
}

fn check_registry<E>(spec: &'static HandlerSpec) -> Result<(), Error<E>> {
    registry::check().map_err(|source| Error::Config {
        handler: spec.name,
        source,
    })
}

/// Reports a `None` key part (the body does not run).
#[doc(hidden)]
pub fn key_missing<T, E>(
    spec: &'static HandlerSpec,
    part: &'static str,
) -> Result<Outcome<T>, Error<E>> {
    let err = Error::KeyMissing {
        handler: spec.name,
        part,
    };
    finish(spec, Err(err))
}

// ---------------------------------------------------------------------------
// Lease mode
// ---------------------------------------------------------------------------

/// Runs `body` under a lease on `key`: claim, body with heartbeat, complete or
/// release.
#[doc(hidden)]
pub async fn run_lease<S, T, E, F>(
    store: &S,
    spec: &'static HandlerSpec,
    key: &Key,
    body: F,
) -> Result<Outcome<T>, Error<E>>
where
    S: LeaseStore + Clone + 'static,
    T: Serialize + DeserializeOwned,
    F: Future<Output = Result<T, E>>,
{
    let span = call_span(spec, key);
    let r = lease_inner(store, spec, key, body.instrument(span.clone()))
        .instrument(span.clone())
        .await;
    let _enter = span.enter();
    finish(spec, r)
}

async fn lease_inner<S, T, E, F>(
    store: &S,
    spec: &'static HandlerSpec,
    key: &Key,
    body: F,
) -> Result<Outcome<T>, Error<E>>
where
    S: LeaseStore + Clone + 'static,
    T: Serialize + DeserializeOwned,
    F: Future<Output = Result<T, E>>,
{
    check_registry(spec)?;
    let claim_start = Instant::now();
    let token = match store.claim(spec, key).await {
        Ok(Claim::Acquired { token }) => token,
        Ok(Claim::Completed { outcome }) => {
            record_claim(spec, claim_start);
            return decode(spec, key, &outcome);
        }
        Ok(Claim::InProgress { lease_left }) => {
            record_claim(spec, claim_start);
            return Err(Error::InProgress {
                handler: spec.name,
                key: key.clone(),
                retry_after: crate::retry::lease_hint(spec, lease_left),
            });
        }
        Err(e) => return Err(store_err(spec, key, e)),
    };
    record_claim(spec, claim_start);

    let body_start = Instant::now();
    let result = with_heartbeat(store, spec, key, &token, body).await;
    record_body(spec, body_start);
    crate::retry::body_finished(spec, body_start.elapsed());

    match result {
        Ok(value) => {
            // The body succeeded, so its effect happened: if the outcome cannot
            // be encoded the claim is kept (not released) until its lease
            // runs out, rather than inviting an immediate second execution.
            let outcome = encode(spec, key, &value)?;
            match store.complete(spec, key, &token, &outcome).await {
                Ok(true) => Ok(Outcome::Executed(value)),
                Ok(false) => Err(Error::LeaseLost {
                    handler: spec.name,
                    key: key.clone(),
                }),
                Err(e) => Err(store_err(spec, key, e)),
            }
        }
        Err(error) => {
            release_quietly(store, spec, key, &token).await;
            Err(Error::Handler {
                handler: spec.name,
                key: key.clone(),
                error,
            })
        }
    }
}

async fn release_quietly<S: LeaseStore>(
    store: &S,
    spec: &'static HandlerSpec,
    key: &Key,
    token: &str,
) {
    if let Err(e) = store.release(spec, key, token).await {
        // The lease runs out on its own; the key becomes claimable then.
        tracing::warn!(error = %e, "could not release the claim; it frees itself when its lease runs out");
    }
}

/// Awaits `body` while a task of its own extends the lease every third of it.
///
/// The heartbeat runs as a separate task so that a body that blocks its
/// thread (a synchronous client, heavy computation) does not starve it on a
/// multi-threaded runtime; it stops when the body finishes or the call is
/// dropped.
async fn with_heartbeat<S, T, E, F>(
    store: &S,
    spec: &'static HandlerSpec,
    key: &Key,
    token: &str,
    body: F,
) -> Result<T, E>
where
    S: LeaseStore + Clone + 'static,
    F: Future<Output = Result<T, E>>,
{
    let period = (spec.lease / 3).max(Duration::from_millis(10));
    let (store, key, token) = (store.clone(), key.clone(), token.to_owned());
    let heartbeat = async move {
        let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            match store.extend(spec, &key, &token).await {
                Ok(true) => {}
                Ok(false) => {
                    tracing::warn!(
                        "lease lost while the body runs: another consumer took the key over"
                    );
                    return;
                }
                Err(e) => tracing::warn!(error = %e, "could not extend the lease; will retry"),
            }
        }
    };
    let _heartbeat = AbortOnDrop(tokio::spawn(heartbeat.instrument(tracing::Span::current())));
    // A task spawned from a worker waits in that worker's own slot, which no
    // other worker takes: let it start (arm its timer) before a body that may
    // block this thread runs. Its timer then wakes it on a free worker.
    tokio::task::yield_now().await;
    body.await
}

/// Aborts a task when dropped: the heartbeat ends with its call.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

// ---------------------------------------------------------------------------
// Transaction mode
// ---------------------------------------------------------------------------

/// What `tx_begin` found.
#[doc(hidden)]
pub enum TxBegin<Tx, T> {
    /// Run the body in this transaction.
    Fresh(TxCall<Tx>),
    /// Return this without running the body.
    Done(Outcome<T>),
}

/// An open transaction-mode call.
#[doc(hidden)]
pub struct TxCall<Tx> {
    tx: Tx,
    span: tracing::Span,
    body_start: Instant,
}

impl<Tx> TxCall<Tx> {
    /// The transaction the body runs in.
    pub fn tx(&mut self) -> &mut Tx {
        &mut self.tx
    }

    /// The call's span, for the body.
    pub fn span(&self) -> tracing::Span {
        self.span.clone()
    }
}

/// Opens the transaction and claims `key` in it.
#[doc(hidden)]
pub async fn tx_begin<S, T, E>(
    store: &S,
    spec: &'static HandlerSpec,
    key: &Key,
) -> Result<TxBegin<S::Tx, T>, Error<E>>
where
    S: TxStore,
    T: DeserializeOwned,
{
    let span = call_span(spec, key);
    let r = async {
        check_registry(spec)?;
        let start = Instant::now();
        let claim = store
            .begin_claim(spec, key)
            .await
            .map_err(|e| store_err(spec, key, e));
        record_claim(spec, start);
        match claim? {
            TxClaim::Fresh(tx) => Ok(TxBegin::Fresh(TxCall {
                tx,
                span: span.clone(),
                body_start: Instant::now(),
            })),
            TxClaim::Completed { outcome } => decode(spec, key, &outcome).map(TxBegin::Done),
            TxClaim::InProgress { retry_after } => Err(Error::InProgress {
                handler: spec.name,
                key: key.clone(),
                retry_after,
            }),
        }
    }
    .instrument(span.clone())
    .await;
    let _enter = span.enter();
    match r {
        Ok(TxBegin::Done(o)) => finish(spec, Ok(o)).map(TxBegin::Done),
        Ok(fresh) => Ok(fresh),
        Err(e) => finish::<T, E>(spec, Err(e)).map(TxBegin::Done),
    }
}

/// Commits `result` with the claim, or rolls both back.
#[doc(hidden)]
pub async fn tx_finish<S, T, E>(
    store: &S,
    spec: &'static HandlerSpec,
    key: &Key,
    call: TxCall<S::Tx>,
    result: Result<T, E>,
) -> Result<Outcome<T>, Error<E>>
where
    S: TxStore,
    T: Serialize + DeserializeOwned,
{
    record_body(spec, call.body_start);
    let span = call.span;
    let r = async {
        match result {
            Ok(value) => {
                let outcome = match encode(spec, key, &value) {
                    Ok(o) => o,
                    Err(e) => {
                        rollback_quietly(store, call.tx, spec, key).await;
                        return Err(e);
                    }
                };
                match store
                    .commit_outcome(call.tx, spec, key, &outcome)
                    .await
                    .map_err(|e| store_err(spec, key, e))?
                {
                    TxCommit::Committed => Ok(Outcome::Executed(value)),
                    TxCommit::Duplicate { outcome } => decode(spec, key, &outcome),
                    TxCommit::InProgress { retry_after } => Err(Error::InProgress {
                        handler: spec.name,
                        key: key.clone(),
                        retry_after,
                    }),
                }
            }
            Err(error) => match rollback_quietly(store, call.tx, spec, key).await {
                // The body failed because it was a duplicate's: the first
                // delivery's recorded outcome is the answer.
                Some(outcome) => decode(spec, key, &outcome),
                None => Err(Error::Handler {
                    handler: spec.name,
                    key: key.clone(),
                    error,
                }),
            },
        }
    }
    .instrument(span.clone())
    .await;
    let _enter = span.enter();
    finish(spec, r)
}

async fn rollback_quietly<S: TxStore>(
    store: &S,
    tx: S::Tx,
    spec: &'static HandlerSpec,
    key: &Key,
) -> Option<String> {
    store.rollback(tx, spec, key).await.unwrap_or_else(|e| {
        // The server rolls back on its own when the connection goes.
        tracing::warn!(error = %e, "rollback failed");
        None
    })
}
