//! Deleting expired records: what a store that can be swept implements
//! ([`Sweep`]), and the background task that runs it ([`Sweeper`]).

use std::future::Future;
use std::time::Duration;

use crate::error::StoreError;

/// A store whose expired records can be deleted in batches.
///
/// What a [`Sweeper`] runs. The memory and SQL stores implement it; Redis
/// expires its records by itself.
///
/// # Examples
///
/// A one-off sweep at start-up, for any store:
///
/// ```
/// use idem_runtime::{MemoryStore, StoreError, store::Sweep};
///
/// async fn sweep_all<S: Sweep>(store: &S) -> Result<u64, StoreError> {
///     let mut total = 0;
///     loop {
///         let n = store.sweep_expired(500).await?;
///         total += n;
///         if n < 500 {
///             return Ok(total);
///         }
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), StoreError> {
/// assert_eq!(sweep_all(&MemoryStore::new()).await?, 0);
/// # Ok(()) }
/// ```
pub trait Sweep: Clone + Send + Sync + 'static {
    /// Deletes at most `batch` expired records; returns how many it deleted.
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
    /// #     fingerprint: None, max_attempts: None,
    /// # };
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_runtime::clock::ManualClock;
    /// use idem_runtime::store::Sweep;
    /// use idem_runtime::store::LeaseStore;
    /// use idem_runtime::{Key, MemoryStore};
    ///
    /// let clock = ManualClock::starting_now();
    /// let store = MemoryStore::with_clock(clock.clone());
    /// store.claim(&SPEC, &Key::from_parts(&[&"m-1"])?, None).await?;
    /// clock.advance(SPEC.lease); // the lease runs out
    /// assert_eq!(Sweep::sweep_expired(&store, 100).await?, 1);
    /// # Ok(()) }
    /// ```
    fn sweep_expired(&self, batch: u32) -> impl Future<Output = Result<u64, StoreError>> + Send;
}

/// A background task that deletes expired records; stops when dropped.
///
/// Every `every`, it deletes expired records in batches of `batch` until a
/// batch comes back short, so the table stays the size of the dedup window
/// without one long-running delete.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use idem_runtime::{MemoryStore, Sweeper};
/// use std::time::Duration;
/// let store = MemoryStore::new();
/// let sweeper = Sweeper::spawn(store.clone(), Duration::from_secs(60), 1000);
/// drop(sweeper); // stops the task
/// # }
/// ```
#[derive(Debug)]
pub struct Sweeper {
    task: tokio::task::JoinHandle<()>,
}

impl Sweeper {
    /// Spawns the sweeper on the current tokio runtime.
    ///
    /// The first sweep runs at once, then one every `every`. A failed sweep is
    /// logged and retried at the next tick.
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
    /// #     fingerprint: None, max_attempts: None,
    /// # };
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_runtime::clock::ManualClock;
    /// use idem_runtime::Sweeper;
    /// use idem_runtime::store::LeaseStore;
    /// use idem_runtime::{Key, MemoryStore};
    ///
    /// let clock = ManualClock::starting_now();
    /// let store = MemoryStore::with_clock(clock.clone());
    /// store.claim(&SPEC, &Key::from_parts(&[&"m-1"])?, None).await?;
    /// clock.advance(SPEC.lease); // the lease runs out
    ///
    /// let _sweeper = Sweeper::spawn(store.clone(), Duration::from_secs(60), 1_000);
    /// tokio::time::sleep(Duration::from_millis(50)).await;
    /// assert!(store.is_empty());
    /// # Ok(()) }
    /// ```
    pub fn spawn<S: Sweep>(store: S, every: Duration, batch: u32) -> Sweeper {
        let batch = batch.max(1);
        // tokio's interval needs a period above zero.
        let every = every.max(Duration::from_millis(1));
        let task = tokio::spawn(async move {
            let mut ticks = tokio::time::interval(every);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                loop {
                    match store.sweep_expired(batch).await {
                        Ok(n) if n >= u64::from(batch) => tokio::task::yield_now().await,
                        Ok(_) => break,
                        Err(e) => {
                            tracing::warn!(error = %e, "sweeping expired idempotency records failed");
                            break;
                        }
                    }
                }
            }
        });
        Sweeper { task }
    }
}

impl Drop for Sweeper {
    fn drop(&mut self) {
        self.task.abort();
    }
}
