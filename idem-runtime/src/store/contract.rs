//! The contract between the runtime and a store: what a claim, a
//! completion and a commit must guarantee, in two traits.
//!
//! [`LeaseStore`] is what lease mode needs (every store of this crate
//! implements it), [`TxStore`] what transaction mode needs (the SQL stores),
//! and [`StoreTransaction`] marks the transaction a [`TxStore`] hands to a
//! handler's body. All three are public (at the crate root) and can be
//! implemented outside this crate.
//!
//! A rewritten handler takes its store generically: a lease-mode handler
//! takes `&impl LeaseStore`, so any lease store runs it (a test can run a
//! `store = "redis"` handler on [`MemoryStore`](crate::MemoryStore)); a
//! transaction-mode handler takes `&impl TxStore<Tx = T>`, where `T` is the
//! transaction type its first parameter names. A store of your own is named
//! by its path: `store = "crate::MyStore"`.

use std::future::Future;
use std::time::Duration;

use crate::error::StoreError;
use crate::key::Key;
use crate::registry::HandlerSpec;

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
        /// ([`Error::InProgress`](crate::Error::InProgress)'s `retry_after`).
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
/// use std::sync::Arc;
///
/// #[derive(Clone, Default)]
/// struct Counted { inner: MemoryStore, claims: Arc<AtomicU64> }
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
///
/// Stores are handles: cloning one shares its connections and records (the
/// call clones it into the task that keeps the lease alive).
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a lease store: a lease-mode handler runs on a store implementing `idem_runtime::LeaseStore`",
    label = "not a lease store",
    note = "pass a store (`&store`), e.g. a `SqliteStore`, `PgStore`, `RedisStore` or `MemoryStore`, or an `Arc` of one"
)]
pub trait LeaseStore: Clone + Send + Sync + 'static {
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
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot run a transaction-mode handler: it does not implement `idem_runtime::TxStore`",
    label = "not a store with transactions",
    note = "pass a SQL store (`&store`) whose transaction is the handler's first parameter, e.g. a `SqliteStore` for `&mut SqliteTx<'_>`, or an `Arc` of one"
)]
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
    type Tx: StoreTransaction + 'static;

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
    /// as [`Outcome::Duplicate`](crate::Outcome::Duplicate) instead of the body's error.
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

/// The transaction a [`TxStore`] hands to a transaction-mode body.
///
/// A handler is in transaction mode when its first parameter (after `self`)
/// is `&mut T` with `T` implementing this trait; the store's
/// [`TxStore::Tx`] must then be `T`. A `&mut T` first parameter whose `T`
/// is not a transaction is a compile error saying so, and a transaction
/// anywhere else is a compile error saying it must come first.
///
/// Implemented for every `sqlx::Transaction` (with a SQL store's feature).
/// A store of your own implements it for its transaction type.
///
/// # Examples
///
/// ```
/// use idem_runtime::StoreTransaction;
///
/// /// A transaction of an application's own store.
/// struct LedgerTx { writes: Vec<String> }
/// impl StoreTransaction for LedgerTx {}
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a store's transaction, but a `&mut` first parameter is taken for the handler's transaction",
    label = "the first parameter of a transaction-mode handler is the store's transaction",
    note = "if this is a message or state of the body, take it by shared reference (`&{Self}`) or put it after the message: a handler without a transaction runs in lease mode",
    note = "a store's own transaction type implements `idem_runtime::StoreTransaction`"
)]
pub trait StoreTransaction: Send {}

#[cfg(feature = "_sql")]
impl<DB: sqlx::Database> StoreTransaction for sqlx::Transaction<'_, DB> {}

/// A shared store is a store: handlers take `&Arc<S>` as they take `&S`.
impl<S: LeaseStore> LeaseStore for std::sync::Arc<S> {
    fn store_name(&self) -> &'static str {
        (**self).store_name()
    }

    fn claim(
        &self,
        spec: &'static HandlerSpec,
        key: &Key,
    ) -> impl Future<Output = Result<Claim, StoreError>> + Send {
        (**self).claim(spec, key)
    }

    fn complete(
        &self,
        spec: &'static HandlerSpec,
        key: &Key,
        token: &str,
        outcome: &str,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        (**self).complete(spec, key, token, outcome)
    }

    fn release(
        &self,
        spec: &'static HandlerSpec,
        key: &Key,
        token: &str,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        (**self).release(spec, key, token)
    }

    fn extend(
        &self,
        spec: &'static HandlerSpec,
        key: &Key,
        token: &str,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        (**self).extend(spec, key, token)
    }
}

/// A shared store is a store: handlers take `&Arc<S>` as they take `&S`.
impl<S: TxStore> TxStore for std::sync::Arc<S> {
    type Tx = S::Tx;

    fn store_name(&self) -> &'static str {
        (**self).store_name()
    }

    fn begin_claim(
        &self,
        spec: &'static HandlerSpec,
        key: &Key,
    ) -> impl Future<Output = Result<TxClaim<Self::Tx>, StoreError>> + Send {
        (**self).begin_claim(spec, key)
    }

    fn commit_outcome(
        &self,
        tx: Self::Tx,
        spec: &'static HandlerSpec,
        key: &Key,
        outcome: &str,
    ) -> impl Future<Output = Result<TxCommit, StoreError>> + Send {
        (**self).commit_outcome(tx, spec, key, outcome)
    }

    fn rollback(
        &self,
        tx: Self::Tx,
        spec: &'static HandlerSpec,
        key: &Key,
    ) -> impl Future<Output = Result<Option<String>, StoreError>> + Send {
        (**self).rollback(tx, spec, key)
    }
}
