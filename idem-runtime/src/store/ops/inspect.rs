//! The [`Inspect`] trait, its impl for a shared store, and the sweep
//! loop the SQL stores share.

use std::future::Future;

use crate::error::StoreError;

use super::{Forgot, Query, Record, Schema, Stats, Swept};

/// How many expired records [`Inspect::sweep`] deletes in one statement.
#[cfg(feature = "_sql")]
const SWEEP_BATCH: u32 = 1_000;

/// What an operator asks a store: every store of this crate implements it.
///
/// Keys are the stored form ([`Key::as_str`](crate::Key::as_str),
/// `4:A-17|5:apple`); handlers are registered names. Times are read from the
/// store's clock (the SQL and memory stores' [`Clock`](crate::clock::Clock);
/// Redis's own expiry).
///
/// # Examples
///
/// An operator's report, for any store:
///
/// ```
/// use idem_runtime::store::ops::{Filter, Inspect, Query};
/// use idem_runtime::StoreError;
///
/// async fn report(store: &impl Inspect) -> Result<(), StoreError> {
///     for h in store.stats().await?.handlers {
///         println!("{}: {} records, {} in progress", h.handler, h.records, h.in_progress);
///         for stuck in store.list(&h.handler, Query::new().filter(Filter::Stuck)).await? {
///             println!("  stuck since {}: {}", stuck.created_at_ms, stuck.key);
///         }
///     }
///     Ok(())
/// }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), StoreError> {
/// # report(&idem_runtime::MemoryStore::new()).await
/// # }
/// ```
pub trait Inspect: Send + Sync {
    /// The record of `key` (stored form) under `handler`, if any, expired
    /// or not.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_runtime::store::Inspect;
    /// use idem_runtime::{Key, MemoryStore};
    ///
    /// let key = Key::from_parts(&[&"A-17", &"apple"])?;
    /// let store = MemoryStore::new();
    /// assert!(Inspect::lookup(&store, "deduct_stock", key.as_str()).await?.is_none());
    /// # Ok(()) }
    /// ```
    fn lookup(
        &self,
        handler: &str,
        key: &str,
    ) -> impl Future<Output = Result<Option<Record>, StoreError>> + Send;

    /// `handler`'s records that pass `query.filter`, at most `query.limit`,
    /// ordered by `created_at_ms` (when the current claim was made), then by
    /// key: oldest first unless `query.order` says otherwise.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_runtime::store::ops::{Filter, Inspect, Query};
    /// use idem_runtime::MemoryStore;
    ///
    /// let store = MemoryStore::new();
    /// let failed = store.list("deduct_stock", Query::new().filter(Filter::Failed).limit(10)).await?;
    /// assert!(failed.is_empty());
    /// # Ok(()) }
    /// ```
    fn list(
        &self,
        handler: &str,
        query: Query,
    ) -> impl Future<Output = Result<Vec<Record>, StoreError>> + Send;

    /// The records by handler and status, with each handler's oldest claim
    /// in progress and its expired records not yet swept.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_runtime::store::Inspect;
    /// use idem_runtime::MemoryStore;
    ///
    /// let stats = MemoryStore::new().stats().await?;
    /// assert!(stats.handlers.is_empty());
    /// # Ok(()) }
    /// ```
    fn stats(&self) -> impl Future<Output = Result<Stats, StoreError>> + Send;

    /// Deletes the record of `key` under `handler`, so that the message can
    /// run again (after a fix, for a key that failed for good or exhausted
    /// its attempts). A live claim in progress is left alone unless `force`
    /// ([`Forgot::Refused`] says what holds it): a consumer is running the
    /// body right now.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_runtime::store::ops::{Forgot, Inspect};
    /// use idem_runtime::{Key, MemoryStore};
    ///
    /// let key = Key::from_parts(&[&"A-17"])?;
    /// let forgot = MemoryStore::new().forget("deduct_stock", key.as_str(), false).await?;
    /// assert_eq!(forgot, Forgot::Absent);
    /// # Ok(()) }
    /// ```
    fn forget(
        &self,
        handler: &str,
        key: &str,
        force: bool,
    ) -> impl Future<Output = Result<Forgot, StoreError>> + Send;

    /// Deletes every record expired now, in batches; Redis expires its
    /// records by itself and answers [`Swept::native`].
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_runtime::store::Inspect;
    /// use idem_runtime::MemoryStore;
    ///
    /// assert_eq!(Inspect::sweep(&MemoryStore::new()).await?.deleted, 0);
    /// # Ok(()) }
    /// ```
    fn sweep(&self) -> impl Future<Output = Result<Swept, StoreError>> + Send;

    /// The handlers that have records, by name.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_runtime::store::Inspect;
    /// use idem_runtime::MemoryStore;
    ///
    /// assert!(MemoryStore::new().handlers().await?.is_empty());
    /// # Ok(()) }
    /// ```
    fn handlers(&self) -> impl Future<Output = Result<Vec<String>, StoreError>> + Send;

    /// The version of the store's schema, where it has one.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_runtime::store::ops::{Inspect, Schema};
    /// use idem_runtime::MemoryStore;
    ///
    /// assert_eq!(MemoryStore::new().schema().await?, Schema::None);
    /// # Ok(()) }
    /// ```
    fn schema(&self) -> impl Future<Output = Result<Schema, StoreError>> + Send;
}

/// A shared store is inspected as the store itself.
impl<S: Inspect> Inspect for std::sync::Arc<S> {
    fn lookup(
        &self,
        handler: &str,
        key: &str,
    ) -> impl Future<Output = Result<Option<Record>, StoreError>> + Send {
        (**self).lookup(handler, key)
    }

    fn list(
        &self,
        handler: &str,
        query: Query,
    ) -> impl Future<Output = Result<Vec<Record>, StoreError>> + Send {
        (**self).list(handler, query)
    }

    fn stats(&self) -> impl Future<Output = Result<Stats, StoreError>> + Send {
        (**self).stats()
    }

    fn forget(
        &self,
        handler: &str,
        key: &str,
        force: bool,
    ) -> impl Future<Output = Result<Forgot, StoreError>> + Send {
        (**self).forget(handler, key, force)
    }

    fn sweep(&self) -> impl Future<Output = Result<Swept, StoreError>> + Send {
        (**self).sweep()
    }

    fn handlers(&self) -> impl Future<Output = Result<Vec<String>, StoreError>> + Send {
        (**self).handlers()
    }

    fn schema(&self) -> impl Future<Output = Result<Schema, StoreError>> + Send {
        (**self).schema()
    }
}

/// The most calls [`sweep_all`] makes of a partitioned table's sweep: each
/// that removes anything drops a partition or deletes a batch of the
/// default partition's rows, so this bounds a run on a table whose default
/// partition fills as fast as it is swept.
#[cfg(feature = "_sql")]
const PARTITIONED_SWEEPS: usize = 10_000;

#[cfg(feature = "_sql")]
/// Runs `sweep` (one call of at most `batch` records, returning how many
/// it removed) until a call comes back short of a batch; on a
/// `partitioned` table, whose sweep drops a whole partition a call however
/// many rows it held, until a call removes nothing.
pub(crate) async fn sweep_all<F, Fut>(partitioned: bool, mut sweep: F) -> Result<Swept, StoreError>
where
    F: FnMut(u32) -> Fut,
    Fut: Future<Output = Result<u64, StoreError>>,
{
    let mut deleted = 0;
    let mut calls = 0;
    loop {
        let n = sweep(SWEEP_BATCH).await?;
        deleted += n;
        calls += 1;
        let done = if partitioned {
            n == 0 || calls == PARTITIONED_SWEEPS
        } else {
            n < u64::from(SWEEP_BATCH)
        };
        if done {
            return Ok(Swept::deleted(deleted));
        }
    }
}
