//! The store contract: what a store guarantees and what it is asked, for
//! anyone who writes a store of their own; and the stores of this crate.
//!
//! A handler runs on any type that implements the trait of its mode:
//!
//! * [`LeaseStore`] for lease mode: [`claim`](LeaseStore::claim) a key for
//!   a lease and answer with a [`Claim`], then [`complete`](LeaseStore::complete),
//!   [`fail`](LeaseStore::fail) (with a [`Failure`]), [`release`](LeaseStore::release)
//!   or [`extend`](LeaseStore::extend) it while the claim's fencing token
//!   still holds it. The batch methods ([`BatchItem`], [`Held`]) have
//!   defaults that call the single ones.
//! * [`TxStore`] for transaction mode: [`begin_claim`](TxStore::begin_claim)
//!   opens a transaction (a [`TxClaim`]) whose type implements
//!   [`StoreTransaction`] and is handed to the body; the outcome commits
//!   with the body's writes ([`TxCommit`]); batches are [`TxBatch`] and
//!   [`TxBatchCommit`].
//! * [`Sweep`] to have a [`Sweeper`](crate::Sweeper) delete expired
//!   records, and [`Inspect`] for operators' tools (`idem show`, `list`,
//!   `stats`, `forget`), which read [`Record`]s and name keys by their
//!   stored form ([`StoredKey`]). The operator API ([`Inspect`], what it is
//!   asked and what it answers) is the module [`ops`]; its names are also
//!   here, where earlier releases had them.
//!
//! A delivery that may not run its body gets the [`Standing`] of the record
//! of its key. [`Standing::of`] is what a live record says and
//! [`Standing::of_ran_out`] what a claim whose lease ran out says: call them
//! and a store of your own answers as those of this crate do.
//!
//! The attribute names a store of your own by its path
//! (`store = "crate::Notebook"`); a lease-mode handler takes `&impl
//! LeaseStore`, so it also runs on any other lease store (a test can run a
//! `store = "redis"` handler on [`MemoryStore`](crate::MemoryStore)).
//!
//! The stores of this crate are [`memory`], `sql` (SQLite, PostgreSQL,
//! MySQL/MariaDB) and `redis`; applications name them from the crate root
//! (`SqliteStore`, `PgStore`, `RedisStore`, ...).
//!
//! # Examples
//!
//! A lease store of your own, its records in a map (it leaves out what the
//! stores of this crate also do: count a claim whose lease ran out as a
//! failure, [`Standing::of_ran_out`]), running a handler:
//!
//! ```standalone_crate
//! use std::collections::HashMap;
//! use std::sync::{Arc, Mutex};
//! use std::time::{Duration, SystemTime, UNIX_EPOCH};
//!
//! use idem_runtime::registry::HandlerSpec;
//! use idem_runtime::store::{Claim, Failure, LeaseStore, Standing};
//! use idem_runtime::{Key, Outcome, Record, Status, StoreError, idempotent};
//!
//! /// Records by (handler, key).
//! #[derive(Clone, Default)]
//! pub struct Notebook(Arc<Mutex<HashMap<(String, String), Record>>>);
//!
//! fn now_ms() -> i64 {
//!     SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as i64
//! }
//!
//! fn id(spec: &HandlerSpec, key: &Key) -> (String, String) {
//!     (spec.name.to_owned(), key.as_str().to_owned())
//! }
//!
//! impl Notebook {
//!     /// Runs `write` on the record of `key` if the claim `token` still holds it.
//!     fn settle(&self, spec: &HandlerSpec, key: &Key, token: &str, write: impl FnOnce(&mut Record, i64)) -> bool {
//!         let mut records = self.0.lock().unwrap();
//!         match records.get_mut(&id(spec, key)) {
//!             Some(r) if r.status == Status::InProgress && r.token.as_deref() == Some(token) => {
//!                 write(r, now_ms());
//!                 true
//!             }
//!             _ => false,
//!         }
//!     }
//! }
//!
//! impl LeaseStore for Notebook {
//!     fn store_name(&self) -> &'static str {
//!         "notebook"
//!     }
//!
//!     async fn claim(
//!         &self, spec: &'static HandlerSpec, key: &Key, fingerprint: Option<&str>,
//!     ) -> Result<Claim, StoreError> {
//!         let now = now_ms();
//!         let mut records = self.0.lock().unwrap();
//!         let live = records.get(&id(spec, key)).filter(|r| !r.is_expired(now));
//!         if let Some(r) = live {
//!             let left = Duration::from_millis((r.expires_at_ms - now) as u64);
//!             if let Some(standing) = Standing::of(r, spec, fingerprint, left) {
//!                 return Ok(Claim::Refused(standing));
//!             }
//!         }
//!         // the key is free, or a failure to retry: its failures still count
//!         let (attempts, failures) = live.map_or((1, 0), |r| (r.attempts + 1, r.failures));
//!         let token = format!("{now}-{attempts}");
//!         let lease_ends = now + spec.lease.as_millis() as i64;
//!         let mut record = Record::new(spec.name, key.as_str(), Status::InProgress, now, lease_ends);
//!         (record.attempts, record.failures) = (attempts, failures);
//!         record.token = Some(token.clone());
//!         record.fingerprint = fingerprint.map(str::to_owned);
//!         // for operators' tools, which do not know the handler
//!         record.max_attempts = spec.max_attempts;
//!         records.insert(id(spec, key), record);
//!         Ok(Claim::Fresh { token })
//!     }
//!
//!     async fn complete(
//!         &self, spec: &'static HandlerSpec, key: &Key, token: &str, outcome: &str,
//!     ) -> Result<bool, StoreError> {
//!         // Sent again after its reply was lost: the record keeps the token
//!         // that completed it, and this completion is that one.
//!         let done = self.0.lock().unwrap().get(&id(spec, key)).is_some_and(|r| {
//!             r.status == Status::Completed && r.token.as_deref() == Some(token)
//!         });
//!         if done {
//!             return Ok(true);
//!         }
//!         Ok(self.settle(spec, key, token, |r, now| {
//!             r.status = Status::Completed;
//!             r.outcome = Some(outcome.to_owned());
//!             r.expires_at_ms = now + spec.ttl.as_millis() as i64;
//!         }))
//!     }
//!
//!     async fn fail(
//!         &self, spec: &'static HandlerSpec, key: &Key, token: &str, failure: Failure<'_>,
//!     ) -> Result<bool, StoreError> {
//!         Ok(self.settle(spec, key, token, |r, now| {
//!             r.status = failure.status();
//!             r.outcome = failure.recorded().map(str::to_owned);
//!             r.failures += 1;
//!             r.last_error = Some(failure.text().to_owned());
//!             r.expires_at_ms = now + spec.ttl.as_millis() as i64;
//!         }))
//!     }
//!
//!     async fn release(&self, spec: &'static HandlerSpec, key: &Key, token: &str) -> Result<(), StoreError> {
//!         let mut records = self.0.lock().unwrap();
//!         if records.get(&id(spec, key)).is_some_and(|r| r.token.as_deref() == Some(token)) {
//!             records.remove(&id(spec, key));
//!         }
//!         Ok(())
//!     }
//!
//!     async fn extend(&self, spec: &'static HandlerSpec, key: &Key, token: &str) -> Result<bool, StoreError> {
//!         Ok(self.settle(spec, key, token, |r, now| {
//!             r.expires_at_ms = now + spec.lease.as_millis() as i64;
//!         }))
//!     }
//! }
//!
//! struct Shipped { order_id: u64 }
//!
//! #[idempotent(key = "order_id", ttl = "1h", store = "crate::Notebook")]
//! async fn notify(msg: &Shipped) -> Result<u64, std::io::Error> {
//!     Ok(msg.order_id * 10)
//! }
//!
//! #[tokio::main(flavor = "current_thread")]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let store = Notebook::default();
//!     let msg = Shipped { order_id: 7 };
//!     assert_eq!(notify(&store, &msg).await?, Outcome::Executed(70));
//!     assert_eq!(notify(&store, &msg).await?, Outcome::Duplicate(70));
//!     Ok(())
//! }
//! ```

pub(crate) mod batch;
pub(crate) mod contract;
pub mod memory;
pub mod ops;
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
pub(crate) mod sweep;

pub use crate::key::{InvalidKey, StoredKey};
pub use batch::{BatchItem, Held, TxBatch, TxBatchCommit};
pub use contract::{
    Claim, Failure, LeaseStore, Standing, StoreTransaction, TxClaim, TxCommit, TxStore,
};
// The operator API's earlier paths, kept.
pub use ops::{
    DEFAULT_LIMIT, Filter, Forgot, HandlerStats, Inspect, Order, Query, Schema, Stats, Swept,
};
pub use ops::{Record, Status};
pub(crate) use ops::{unrecordable_encoding, unrecordable_reason};
pub use rules::LEASE_RAN_OUT;
pub use sweep::Sweep;

/// The W3C `traceparent` of the current span, for a store to keep with the
/// outcome or failure it records ([`Record::trace`]): the runtime completes
/// and fails a claim inside the handler's `idempotent` span (the HTTP
/// layer, inside its `idem.http` span), so this is the execution that
/// settled the key. A duplicate's [`Standing::Completed`] or
/// [`Standing::Failed`] hands it back, and the duplicate's span links to
/// it. `None` without the `otel` feature, and when the current span is in
/// no OpenTelemetry trace; a store that keeps nothing loses only the link.
///
/// # Examples
///
/// ```
/// // No OpenTelemetry layer here: no trace to keep.
/// assert_eq!(idem_runtime::store::settling_trace(), None);
/// ```
pub fn settling_trace() -> Option<String> {
    #[cfg(feature = "otel")]
    {
        crate::trace::current_traceparent()
    }
    #[cfg(not(feature = "otel"))]
    {
        None
    }
}
