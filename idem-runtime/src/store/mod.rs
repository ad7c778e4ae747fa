//! The stores, and what they share: the record an operator reads back, what
//! an operator asks of a store ([`Inspect`], in [`inspect`]), table name
//! validation and the background sweeper.
//!
//! # Examples
//!
//! Every store can be asked for the record of a key and swept:
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use idem_runtime::{Key, MemoryStore, Sweeper};
//! use std::time::Duration;
//!
//! let store = MemoryStore::new();
//! let key = Key::from_parts(&[&"m-1"])?;
//! assert!(store.record("notify", &key).is_none());
//! let _sweeper = Sweeper::spawn(store.clone(), Duration::from_secs(60), 1_000);
//! # Ok(()) }
//! ```

use std::future::Future;
use std::time::Duration;

use crate::error::StoreError;

pub(crate) mod batch;
pub(crate) mod contract;
pub mod inspect;
pub mod memory;
#[cfg(feature = "mysql")]
#[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
pub mod mysql;
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub mod postgres;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis;
pub(crate) mod rules;
#[cfg(feature = "_sql")]
#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql")))
)]
pub mod sql;
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub mod sqlite;

pub use inspect::{
    Filter, Forgot, HandlerStats, Inspect, InvalidKey, Order, Query, Schema, Stats, StoredKey,
    Swept,
};
pub use rules::LEASE_RAN_OUT;

/// Where a record stands: being worked on, done, failed for good, or failed
/// and waiting for the next delivery.
///
/// # Examples
///
/// ```
/// use idem_runtime::store::Status;
/// assert_eq!(Status::parse("completed"), Some(Status::Completed));
/// assert_eq!(Status::InProgress.as_str(), "in_progress");
/// assert_eq!(Status::ALL.len(), 4);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Claimed; the body has not finished (lease mode), or the transaction
    /// has not committed (never visible to others in transaction mode).
    InProgress,
    /// The body finished and its outcome is recorded.
    Completed,
    /// The body failed with a final error, recorded as the outcome:
    /// duplicates get the error back until the ttl ends.
    Failed,
    /// The body failed with an error that may pass (a handler with
    /// `max_attempts`): the failure is counted, and the next delivery may
    /// claim the key, until the count reaches `max_attempts`.
    Retry,
}

impl Status {
    /// Every status, in the order operators' tools list them.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::store::Status;
    /// let names: Vec<&str> = Status::ALL.iter().map(|s| s.as_str()).collect();
    /// assert_eq!(names, ["in_progress", "completed", "failed", "retry"]);
    /// ```
    pub const ALL: [Status; 4] = [
        Status::InProgress,
        Status::Completed,
        Status::Failed,
        Status::Retry,
    ];

    /// The text stored in the `status` column.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::store::Status;
    /// assert_eq!(Status::Completed.as_str(), "completed");
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            Status::InProgress => "in_progress",
            Status::Completed => "completed",
            Status::Failed => "failed",
            Status::Retry => "retry",
        }
    }

    /// Reads the text of the `status` column.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::store::Status;
    /// assert_eq!(Status::parse("in_progress"), Some(Status::InProgress));
    /// assert_eq!(Status::parse("done"), None);
    /// ```
    pub fn parse(s: &str) -> Option<Status> {
        Status::ALL.into_iter().find(|status| status.as_str() == s)
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One dedup record, as an operator would ask for it: was this message
/// processed, when, with what result; how often did it fail, and why.
///
/// Times are milliseconds since the Unix epoch. It serializes (for
/// operators' tools, such as `idem show --json`) with these field names,
/// the status as its column's text.
///
/// # Examples
///
/// ```
/// # async fn demo() -> Result<(), idem_runtime::StoreError> {
/// use idem_runtime::{Key, MemoryStore};
/// let store = MemoryStore::new();
/// let key = Key::from_parts(&[&"A-17"]).unwrap();
/// if let Some(record) = store.record("deduct_stock", &key) {
///     println!("{} at {} -> {:?}", record.status, record.updated_at_ms, record.outcome);
///     println!("{} failures, last: {:?}", record.failures, record.last_error);
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct Record {
    /// The handler's registered name.
    pub handler: String,
    /// The stored key (see [`Key`](crate::Key)).
    pub key: String,
    /// In progress, completed, failed or waiting for a retry.
    pub status: Status,
    /// The recorded result as JSON, once completed; the recorded error as
    /// JSON, once failed for good.
    pub outcome: Option<String>,
    /// How many claims this record has seen in its current window (1, plus
    /// one per lease takeover and per redelivery after a failure).
    pub attempts: i64,
    /// How many deliveries failed in the current window: bodies that
    /// returned an error (counted for handlers with `max_attempts`, and for
    /// final errors), and, in lease mode, claims whose lease ran out before
    /// their body finished. A success resets nothing.
    pub failures: i64,
    /// The text of the last failure, if any.
    pub last_error: Option<String>,
    /// The payload fingerprint of the delivery that wrote the record, for a
    /// handler that declares one.
    pub fingerprint: Option<String>,
    /// The fencing token of the claim in progress: who holds the lease.
    pub token: Option<String>,
    /// When the current claim was made.
    pub created_at_ms: i64,
    /// When the record last changed.
    pub updated_at_ms: i64,
    /// When a completed (or failed, or retry) record stops counting, or when
    /// an in-progress lease runs out.
    pub expires_at_ms: i64,
}

impl Record {
    /// A record with nothing but its identity, status and times: no
    /// outcome, one attempt, no failure.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::store::{Record, Status};
    /// let r = Record::new("notify", "3:m-1", Status::InProgress, 1_000, 31_000);
    /// assert_eq!((r.attempts, r.failures, r.expires_at_ms), (1, 0, 31_000));
    /// ```
    pub fn new(
        handler: &str,
        key: &str,
        status: Status,
        created_at_ms: i64,
        expires_at_ms: i64,
    ) -> Self {
        Record {
            handler: handler.to_owned(),
            key: key.to_owned(),
            status,
            outcome: None,
            attempts: 1,
            failures: 0,
            last_error: None,
            fingerprint: None,
            token: None,
            created_at_ms,
            updated_at_ms: created_at_ms,
            expires_at_ms,
        }
    }

    /// Whether the record has expired at `now_ms` (a lease run out, a
    /// window over): it no longer counts, and a claim replaces it.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::store::{Record, Status};
    /// let r = Record::new("notify", "3:m-1", Status::Completed, 0, 60_000);
    /// assert!(!r.is_expired(59_999));
    /// assert!(r.is_expired(60_000));
    /// ```
    pub fn is_expired(&self, now_ms: i64) -> bool {
        self.expires_at_ms <= now_ms
    }
}

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
    /// use idem_runtime::{Key, LeaseStore, MemoryStore};
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
    /// use idem_runtime::{Key, LeaseStore, MemoryStore};
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

/// Checks that `name` is a plain SQL identifier, optionally schema-qualified:
/// ASCII letters, digits and `_`, not starting with a digit, each part at most
/// 63 bytes. Nothing else ever reaches the SQL text.
#[cfg_attr(not(feature = "_sql"), allow(dead_code))]
pub(crate) fn validate_table_name(name: &str) -> Result<(), StoreError> {
    let ok_part = |p: &str| {
        !p.is_empty()
            && p.len() <= 63
            && p.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
            && !p.as_bytes()[0].is_ascii_digit()
    };
    let parts: Vec<&str> = name.split('.').collect();
    if parts.len() <= 2 && parts.iter().all(|p| ok_part(p)) {
        Ok(())
    } else {
        Err(StoreError::InvalidTableName {
            name: name.to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::validate_table_name;

    #[test]
    fn table_names() {
        for ok in ["idem_keys", "app.idem_keys", "_t1", "T"] {
            assert!(validate_table_name(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "1abc",
            "a-b",
            "a.b.c",
            "a b",
            "keys;drop",
            "\"q\"",
            "é",
            ".a",
            &"x".repeat(64),
        ] {
            assert!(validate_table_name(bad).is_err(), "{bad}");
        }
    }
}
