//! The transaction-mode contract: [`TxStore`], the [`TxClaim`] and
//! [`TxCommit`] it answers with, the [`StoreTransaction`] it hands to a
//! body, and its impl for a shared store.

use std::future::Future;

use crate::error::{Contention, StoreError};
use crate::key::Key;
use crate::registry::HandlerSpec;

use super::{BatchItem, Failure, Standing, TxBatch, TxBatchCommit};

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
/// #     fingerprint: None, max_attempts: None,
/// # };
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// # let store = idem_runtime::SqliteStore::open(dir.path().join("idem.db")).await?;
/// # store.migrate().await?;
/// use idem_runtime::store::{Standing, TxClaim, TxStore};
/// use idem_runtime::Key;
///
/// let key = Key::from_parts(&[&17u64])?;
/// match store.begin_claim(&SPEC, &key, None).await? {
///     TxClaim::Fresh(tx) => {
///         // run the body in `tx`, then commit its result with the claim
///         store.commit_outcome(tx, &SPEC, &key, None, "7").await?;
///     }
///     TxClaim::Refused(standing) => println!("not this time: {standing:?}"),
/// }
/// assert!(matches!(
///     store.begin_claim(&SPEC, &key, None).await?,
///     TxClaim::Refused(Standing::Completed { outcome, .. }) if outcome == "7"
/// ));
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub enum TxClaim<Tx> {
    /// The transaction is open, with the claim row in it (claiming first)
    /// or to be written at the commit (claiming last).
    Fresh(Tx),
    /// The record that stands does not let this delivery run; the
    /// transaction was rolled back.
    Refused(Standing),
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
/// #     fingerprint: None, max_attempts: None,
/// # };
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// # let store = idem_runtime::SqliteStore::open(dir.path().join("idem.db")).await?;
/// # store.migrate().await?;
/// use idem_runtime::store::{TxClaim, TxCommit, TxStore};
/// use idem_runtime::Key;
///
/// let key = Key::from_parts(&[&17u64])?;
/// let TxClaim::Fresh(tx) = store.begin_claim(&SPEC, &key, None).await? else { panic!() };
/// match store.commit_outcome(tx, &SPEC, &key, None, "7").await? {
///     TxCommit::Committed => println!("executed"),
///     TxCommit::Refused(standing) => println!("a duplicate after all: {standing:?}"),
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TxCommit {
    /// The dedup row, the body's writes and the outcome (or, from
    /// [`TxStore::commit_failure`], the failure) committed.
    Committed,
    /// The store writes its dedup row after the body and found a live one:
    /// this delivery's writes were rolled back, and this is what stands.
    Refused(Standing),
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
/// #     fingerprint: None, max_attempts: None,
/// # };
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// # let store = idem_runtime::SqliteStore::open(dir.path().join("idem.db")).await?;
/// # store.migrate().await?;
/// use idem_runtime::store::{Standing, TxClaim, TxCommit, TxStore};
/// use idem_runtime::Key;
///
/// let key = Key::from_parts(&[&17u64])?;
/// let TxClaim::Fresh(mut tx) = store.begin_claim(&SPEC, &key, None).await? else { panic!() };
/// // the body's writes go through the same transaction
/// sqlx::query("CREATE TABLE shipments (order_id INTEGER)").execute(&mut *tx).await?;
/// sqlx::query("INSERT INTO shipments VALUES (17)").execute(&mut *tx).await?;
/// assert_eq!(store.commit_outcome(tx, &SPEC, &key, None, "null").await?, TxCommit::Committed);
///
/// // a redelivery is turned away with the recorded outcome
/// assert!(matches!(store.begin_claim(&SPEC, &key, None).await?, TxClaim::Refused(Standing::Completed { .. })));
/// # Ok(()) }
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot run a transaction-mode handler: it does not implement `idem_runtime::store::TxStore`",
    label = "not a store with transactions",
    note = "pass a SQL store (`&store`) whose transaction is the handler's first parameter, e.g. a `SqliteStore` for `&mut SqliteTx<'_>`, or an `Arc` of one"
)]
pub trait TxStore: Send + Sync {
    /// The open transaction handed to the body.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::store::TxStore;
    /// use idem_runtime::{SqliteStore, SqliteTx};
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
    /// #     fingerprint: None, max_attempts: None,
    /// # };
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = tempfile::tempdir()?;
    /// # let store = idem_runtime::SqliteStore::open(dir.path().join("idem.db")).await?;
    /// # store.migrate().await?;
    /// use idem_runtime::store::TxStore;
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
    /// #     fingerprint: None, max_attempts: None,
    /// # };
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = tempfile::tempdir()?;
    /// # let store = idem_runtime::SqliteStore::open(dir.path().join("idem.db")).await?;
    /// # store.migrate().await?;
    /// use idem_runtime::store::{TxClaim, TxStore};
    /// use idem_runtime::Key;
    ///
    /// let key = Key::from_parts(&[&17u64])?;
    /// let TxClaim::Fresh(tx) = store.begin_claim(&SPEC, &key, None).await? else { panic!() };
    /// // ... the body runs in `tx` ...
    /// store.rollback(tx, &SPEC, &key, None).await?;
    /// # Ok(()) }
    /// ```
    fn begin_claim(
        &self,
        spec: &'static HandlerSpec,
        key: &Key,
        fingerprint: Option<&str>,
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
    /// #     fingerprint: None, max_attempts: None,
    /// # };
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = tempfile::tempdir()?;
    /// # let store = idem_runtime::SqliteStore::open(dir.path().join("idem.db")).await?;
    /// # store.migrate().await?;
    /// use idem_runtime::store::{TxClaim, TxCommit, TxStore};
    /// use idem_runtime::Key;
    ///
    /// let key = Key::from_parts(&[&17u64])?;
    /// let TxClaim::Fresh(tx) = store.begin_claim(&SPEC, &key, None).await? else { panic!() };
    /// let outcome = serde_json::to_string(&7)?;
    /// assert_eq!(store.commit_outcome(tx, &SPEC, &key, None, &outcome).await?, TxCommit::Committed);
    /// assert_eq!(store.record("deduct_stock", &key).await?.unwrap().outcome.as_deref(), Some("7"));
    /// # Ok(()) }
    /// ```
    fn commit_outcome(
        &self,
        tx: Self::Tx,
        spec: &'static HandlerSpec,
        key: &Key,
        fingerprint: Option<&str>,
        outcome: &str,
    ) -> impl Future<Output = Result<TxCommit, StoreError>> + Send;

    /// Rolls back the body's writes and records `failure` in their place,
    /// as [`LeaseStore::fail`](super::LeaseStore::fail) describes: committed, a retryable failure
    /// counts one more failure of the key, a final one is recorded like an
    /// outcome. A store that writes its dedup row only now may find the key
    /// taken, and returns what stands instead.
    ///
    /// Handlers with `max_attempts` must have their failure recorded while
    /// their claim still holds the key, so that no other delivery runs
    /// between the failure and its count: the SQL stores claim such a
    /// handler's key first and roll back to a savepoint taken after the
    /// claim.
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
    /// #     fingerprint: None, max_attempts: Some(3),
    /// # };
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = tempfile::tempdir()?;
    /// # let store = idem_runtime::SqliteStore::open(dir.path().join("idem.db")).await?;
    /// # store.migrate().await?;
    /// use idem_runtime::store::{Failure, TxClaim, TxCommit, TxStore};
    /// use idem_runtime::Key;
    ///
    /// let key = Key::from_parts(&[&17u64])?;
    /// let TxClaim::Fresh(tx) = store.begin_claim(&SPEC, &key, None).await? else { panic!() };
    /// let failure = Failure::Counted { error: "warehouse API timed out" };
    /// assert_eq!(store.commit_failure(tx, &SPEC, &key, None, failure).await?, TxCommit::Committed);
    /// let record = store.record("deduct_stock", &key).await?.unwrap();
    /// assert_eq!((record.failures, record.last_error.as_deref()), (1, Some("warehouse API timed out")));
    /// # Ok(()) }
    /// ```
    fn commit_failure(
        &self,
        tx: Self::Tx,
        spec: &'static HandlerSpec,
        key: &Key,
        fingerprint: Option<&str>,
        failure: Failure<'_>,
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
    /// #     fingerprint: None, max_attempts: None,
    /// # };
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = tempfile::tempdir()?;
    /// # let store = idem_runtime::SqliteStore::open(dir.path().join("idem.db")).await?;
    /// # store.migrate().await?;
    /// use idem_runtime::store::{TxClaim, TxStore};
    /// use idem_runtime::Key;
    ///
    /// let key = Key::from_parts(&[&17u64])?;
    /// let TxClaim::Fresh(tx) = store.begin_claim(&SPEC, &key, None).await? else { panic!() };
    /// // the body failed: nothing of this call remains
    /// assert_eq!(store.rollback(tx, &SPEC, &key, None).await?, None);
    /// assert!(store.record("deduct_stock", &key).await?.is_none());
    /// # Ok(()) }
    /// ```
    fn rollback(
        &self,
        tx: Self::Tx,
        spec: &'static HandlerSpec,
        key: &Key,
        fingerprint: Option<&str>,
    ) -> impl Future<Output = Result<Option<Standing>, StoreError>> + Send;

    /// Whether `error` is this store's own transient fault, raised in a
    /// transaction-mode body's transaction: a lock wait that timed out, a
    /// deadlock, a serialization failure. The runtime asks it of every link
    /// of a failed body's error (the error, then its
    /// [`source`](std::error::Error::source)s) before it records anything;
    /// at the first link a store recognises, the call rolls the transaction
    /// back (through [`rollback`](Self::rollback), so a claim-last duplicate
    /// still gets its recorded outcome) and returns
    /// [`Error::Store`](crate::Error::Store) with
    /// [`StoreError::Contention`], keeping the body's error as its text: no
    /// failure is counted against `max_attempts`, and a consumer retries it
    /// as a store fault instead of dead-lettering a healthy message. The
    /// runtime sees the body's error when its type is a
    /// `std::error::Error + 'static`, or a type like `anyhow::Error` or
    /// `Box<dyn Error + Send + Sync>` that is
    /// `AsRef<dyn Error + Send + Sync>` (and not written with a lifetime of
    /// its own, which may borrow); any other body error is the body's.
    ///
    /// The error's code is all the store reads, not which connection raised
    /// it: a body that waits on a lock it holds itself (it writes a row in
    /// its transaction, then again through another connection of the pool)
    /// times out the same way on every delivery, and is retried as a store
    /// fault each time instead of being counted; such a body is a bug to
    /// fix, and the consumers' store-fault backoff (up to
    /// `Policy::max_store_delay`) keeps it from spinning.
    ///
    /// The SQL stores recognise their driver's errors (a `sqlx::Error`, or
    /// the database error it holds) with PostgreSQL's SQLSTATEs 55P03,
    /// 40P01 and 40001, MySQL's error numbers 1205 and 1213, and SQLite's
    /// `SQLITE_BUSY` and `SQLITE_LOCKED`. The default recognises nothing,
    /// so every failed body of a store of your own stays the body's.
    ///
    /// # Examples
    ///
    /// A store whose database reports contention as an error of its own:
    ///
    /// ```
    /// use idem_runtime::Contention;
    /// use std::error::Error;
    ///
    /// #[derive(Debug, thiserror::Error)]
    /// #[error("ledger busy, retry")]
    /// struct LedgerBusy;
    ///
    /// // the body of `TxStore::contention` in the store's impl
    /// fn contention(error: &(dyn Error + 'static)) -> Option<Contention> {
    ///     error.is::<LedgerBusy>().then_some(Contention::LockTimeout)
    /// }
    /// assert_eq!(contention(&LedgerBusy), Some(Contention::LockTimeout));
    /// assert_eq!(contention(&std::fmt::Error), None);
    /// ```
    ///
    /// And what a SQL store makes of a driver error:
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = tempfile::tempdir()?;
    /// use idem_runtime::store::TxStore;
    /// use idem_runtime::{Contention, SqliteStore};
    /// use sqlx::Connection as _;
    /// use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection};
    /// use std::time::Duration;
    ///
    /// let path = dir.path().join("idem.db");
    /// let store = SqliteStore::open(&path).await?;
    /// // one connection holds the database's write lock ...
    /// let _writer = store.pool().begin_with("BEGIN IMMEDIATE").await?;
    /// // ... and another one's write does not wait for it
    /// let impatient = SqliteConnectOptions::new().filename(&path).busy_timeout(Duration::ZERO);
    /// let mut other = SqliteConnection::connect_with(&impatient).await?;
    /// let busy = sqlx::query("BEGIN IMMEDIATE").execute(&mut other).await.unwrap_err();
    /// assert_eq!(store.contention(&busy), Some(Contention::Busy));
    /// // a connection error is no contention: the body's error stays its own
    /// assert_eq!(store.contention(&sqlx::Error::PoolTimedOut), None);
    /// # Ok(()) }
    /// ```
    fn contention(&self, error: &(dyn std::error::Error + 'static)) -> Option<Contention> {
        let _ = error;
        None
    }

    /// Begins a transaction for a batch and reads what stands for each of
    /// its keys, in the order given: `None` for a fresh one. The keys are
    /// distinct. The stores of this crate read the batch in one statement
    /// and write its dedup rows at [`TxStore::commit_batch`], whatever
    /// their [`ClaimOrder`](crate::ClaimOrder).
    ///
    /// The default reports [`StoreError::Unsupported`]: a store of your own
    /// runs batch handlers once it implements the three batch methods.
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
    /// #     fingerprint: None, max_attempts: None,
    /// # };
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = tempfile::tempdir()?;
    /// # let store = idem_runtime::SqliteStore::open(dir.path().join("idem.db")).await?;
    /// # store.migrate().await?;
    /// use idem_runtime::store::{BatchItem, TxBatchCommit, TxStore};
    /// use idem_runtime::Key;
    ///
    /// let keys = [Key::from_parts(&[&17u64])?, Key::from_parts(&[&18u64])?];
    /// let items: Vec<BatchItem<'_>> = keys.iter().map(|key| BatchItem { key, fingerprint: None }).collect();
    /// let found = store.begin_batch(&SPEC, &items).await?;
    /// assert_eq!(found.standings, [None, None]);
    /// // ... the body runs both messages in `found.tx` ...
    /// let outcomes = [Some("1"), Some("2")];
    /// assert_eq!(store.commit_batch(found.tx, &SPEC, &items, &outcomes).await?, TxBatchCommit::Committed);
    /// let again = store.begin_batch(&SPEC, &items).await?;
    /// assert!(again.standings.iter().all(Option::is_some));
    /// store.rollback_batch(again.tx).await?;
    /// # Ok(()) }
    /// ```
    fn begin_batch(
        &self,
        spec: &'static HandlerSpec,
        items: &[BatchItem<'_>],
    ) -> impl Future<Output = Result<TxBatch<Self::Tx>, StoreError>> + Send {
        let _ = (spec, items);
        let store = self.store_name();
        async move {
            Err(StoreError::Unsupported {
                store,
                what: "run batch handlers in transaction mode",
            })
        }
    }

    /// Writes the dedup rows of the batch's fresh keys with their outcomes
    /// (`outcomes` is aligned with `items`: `Some` for each key
    /// [`TxStore::begin_batch`] found fresh) and commits them with the
    /// body's writes, or rolls everything back and answers
    /// [`TxBatchCommit::Lost`] when another delivery recorded one of those
    /// keys meanwhile.
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
    /// #     fingerprint: None, max_attempts: None,
    /// # };
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = tempfile::tempdir()?;
    /// # let store = idem_runtime::SqliteStore::open(dir.path().join("idem.db")).await?;
    /// # store.migrate().await?;
    /// use idem_runtime::store::{BatchItem, TxBatchCommit, TxStore};
    /// use idem_runtime::Key;
    ///
    /// let key = Key::from_parts(&[&17u64])?;
    /// let items = [BatchItem { key: &key, fingerprint: None }];
    /// let found = store.begin_batch(&SPEC, &items).await?;
    /// assert_eq!(found.standings, [None]);
    /// assert_eq!(store.commit_batch(found.tx, &SPEC, &items, &[Some("1")]).await?, TxBatchCommit::Committed);
    /// assert_eq!(store.record("deduct_stock", &key).await?.unwrap().outcome.as_deref(), Some("1"));
    /// # Ok(()) }
    /// ```
    fn commit_batch(
        &self,
        tx: Self::Tx,
        spec: &'static HandlerSpec,
        items: &[BatchItem<'_>],
        outcomes: &[Option<&str>],
    ) -> impl Future<Output = Result<TxBatchCommit, StoreError>> + Send {
        let _ = (tx, spec, items, outcomes);
        let store = self.store_name();
        async move {
            Err(StoreError::Unsupported {
                store,
                what: "run batch handlers in transaction mode",
            })
        }
    }

    /// Rolls back a batch's transaction: its body failed, or nothing in it
    /// was fresh.
    ///
    /// The default drops the transaction, which rolls it back for a
    /// `sqlx::Transaction`.
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
    /// #     fingerprint: None, max_attempts: None,
    /// # };
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = tempfile::tempdir()?;
    /// # let store = idem_runtime::SqliteStore::open(dir.path().join("idem.db")).await?;
    /// # store.migrate().await?;
    /// use idem_runtime::store::{BatchItem, TxStore};
    /// use idem_runtime::Key;
    ///
    /// let key = Key::from_parts(&[&17u64])?;
    /// let found = store.begin_batch(&SPEC, &[BatchItem { key: &key, fingerprint: None }]).await?;
    /// store.rollback_batch(found.tx).await?;
    /// assert!(store.record("deduct_stock", &key).await?.is_none());
    /// # Ok(()) }
    /// ```
    fn rollback_batch(&self, tx: Self::Tx) -> impl Future<Output = Result<(), StoreError>> + Send {
        drop(tx);
        async { Ok(()) }
    }
}

/// The transaction a [`TxStore`] hands to a transaction-mode body.
///
/// A handler is in transaction mode when its first parameter (after `self`)
/// is `&mut T` and a message follows it; `T` must then be the
/// [`TxStore::Tx`] of the handler's store, a type implementing this trait.
/// A `&mut T` first parameter whose `T` is not that store's transaction
/// (another store's, or no transaction at all) is one compile error on `T`
/// naming the type to write, and a transaction anywhere else is a compile
/// error saying it must come first.
///
/// Implemented for every `sqlx::Transaction` (with a SQL store's feature).
/// A store of your own implements it for its transaction type.
///
/// # Examples
///
/// ```
/// use idem_runtime::store::StoreTransaction;
///
/// /// A transaction of an application's own store.
/// struct LedgerTx { writes: Vec<String> }
/// impl StoreTransaction for LedgerTx {}
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a store's transaction: the `Tx` of a `TxStore` implements `idem_runtime::store::StoreTransaction`",
    label = "not a store's transaction",
    note = "a store's own transaction type implements it: `impl StoreTransaction for LedgerTx {{}}`"
)]
pub trait StoreTransaction: Send {}

#[cfg(feature = "_sql")]
impl<DB: sqlx::Database> StoreTransaction for sqlx::Transaction<'_, DB> {}

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
        fingerprint: Option<&str>,
    ) -> impl Future<Output = Result<TxClaim<Self::Tx>, StoreError>> + Send {
        (**self).begin_claim(spec, key, fingerprint)
    }

    fn commit_outcome(
        &self,
        tx: Self::Tx,
        spec: &'static HandlerSpec,
        key: &Key,
        fingerprint: Option<&str>,
        outcome: &str,
    ) -> impl Future<Output = Result<TxCommit, StoreError>> + Send {
        (**self).commit_outcome(tx, spec, key, fingerprint, outcome)
    }

    fn commit_failure(
        &self,
        tx: Self::Tx,
        spec: &'static HandlerSpec,
        key: &Key,
        fingerprint: Option<&str>,
        failure: Failure<'_>,
    ) -> impl Future<Output = Result<TxCommit, StoreError>> + Send {
        (**self).commit_failure(tx, spec, key, fingerprint, failure)
    }

    fn rollback(
        &self,
        tx: Self::Tx,
        spec: &'static HandlerSpec,
        key: &Key,
        fingerprint: Option<&str>,
    ) -> impl Future<Output = Result<Option<Standing>, StoreError>> + Send {
        (**self).rollback(tx, spec, key, fingerprint)
    }

    fn begin_batch(
        &self,
        spec: &'static HandlerSpec,
        items: &[BatchItem<'_>],
    ) -> impl Future<Output = Result<TxBatch<Self::Tx>, StoreError>> + Send {
        (**self).begin_batch(spec, items)
    }

    fn commit_batch(
        &self,
        tx: Self::Tx,
        spec: &'static HandlerSpec,
        items: &[BatchItem<'_>],
        outcomes: &[Option<&str>],
    ) -> impl Future<Output = Result<TxBatchCommit, StoreError>> + Send {
        (**self).commit_batch(tx, spec, items, outcomes)
    }

    fn rollback_batch(&self, tx: Self::Tx) -> impl Future<Output = Result<(), StoreError>> + Send {
        (**self).rollback_batch(tx)
    }

    fn contention(&self, error: &(dyn std::error::Error + 'static)) -> Option<Contention> {
        (**self).contention(error)
    }
}
