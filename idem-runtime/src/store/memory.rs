//! The in-memory store: lease mode in one process, for tests and for
//! consumers whose dedup window may be forgotten on restart.
//!
//! # Examples
//!
//! ```
//! use idem_runtime::store::memory::MemoryStore;
//!
//! let store = MemoryStore::new();
//! let shared = store.clone(); // hand a clone to each consumer task
//! assert!(shared.is_empty());
//! ```

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::clock::{Clock, SystemClock, expiry};
use crate::error::StoreError;
use crate::key::Key;
use crate::registry::HandlerSpec;
use crate::store::contract::{Claim, Failure, LeaseStore};
use crate::store::ops::{Forgot, Inspect, Query, Schema, Stats, Swept};
use crate::store::rules::{ClaimPlan, settle_stall};
use crate::store::{Record, Status, Sweep};

/// An in-process store behind a mutex: lease mode only, records live as long
/// as the process. Expired records are replaced on access and deleted by
/// [`sweep_expired`](MemoryStore::sweep_expired).
///
/// Clones share the same records.
///
/// # Examples
///
/// ```standalone_crate
/// use idem_runtime::{idempotent, MemoryStore, Outcome};
///
/// #[derive(serde::Deserialize)]
/// struct PointsEarned { message_id: String, points: u32 }
///
/// #[idempotent(key = "message_id", ttl = "7d", store = "memory")]
/// async fn grant_points(msg: &PointsEarned) -> Result<u32, std::io::Error> {
///     Ok(msg.points)
/// }
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let store = MemoryStore::new();
/// let msg = PointsEarned { message_id: "m-1".into(), points: 5 };
/// assert_eq!(grant_points(&store, &msg).await.unwrap(), Outcome::Executed(5));
/// assert_eq!(grant_points(&store, &msg).await.unwrap(), Outcome::Duplicate(5));
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct MemoryStore {
    records: Arc<Mutex<HashMap<(String, String), Record>>>,
    clock: Arc<dyn Clock>,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    /// An empty store on the system clock.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::MemoryStore;
    /// let store = MemoryStore::new();
    /// assert!(store.is_empty());
    /// ```
    pub fn new() -> Self {
        Self::with_clock(SystemClock)
    }

    /// An empty store reading time from `clock` (see
    /// [`ManualClock`](crate::clock::ManualClock) for tests).
    ///
    /// # Examples
    ///
    /// A test that lets a record expire without waiting for its ttl:
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
    /// use idem_runtime::store::{Claim, LeaseStore, Standing};
    /// use idem_runtime::{Key, MemoryStore};
    ///
    /// let clock = ManualClock::new(1_000);
    /// let store = MemoryStore::with_clock(clock.clone());
    /// let key = Key::from_parts(&[&"m-1"])?;
    /// let Claim::Fresh { token } = store.claim(&SPEC, &key, None).await? else { panic!() };
    /// store.complete(&SPEC, &key, &token, "null").await?;
    /// assert!(matches!(
    ///     store.claim(&SPEC, &key, None).await?,
    ///     Claim::Refused(Standing::Completed { .. })
    /// ));
    ///
    /// clock.advance(SPEC.ttl); // the record expires: the key runs again
    /// assert!(matches!(store.claim(&SPEC, &key, None).await?, Claim::Fresh { .. }));
    /// # Ok(()) }
    /// ```
    pub fn with_clock(clock: impl Clock) -> Self {
        Self {
            records: Arc::default(),
            clock: Arc::new(clock),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<(String, String), Record>> {
        // A panic while holding the lock cannot leave an entry half-written
        // (every update is a single assignment), so a poisoned map is usable.
        self.records
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// How many records are held, expired or not.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(idem_runtime::MemoryStore::new().len(), 0);
    /// ```
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// `true` when no record is held.
    ///
    /// # Examples
    ///
    /// ```
    /// assert!(idem_runtime::MemoryStore::new().is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// The record of `key` under handler `handler`, if any.
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
    /// use idem_runtime::store::Status;
    /// use idem_runtime::store::LeaseStore;
    /// use idem_runtime::{Key, MemoryStore};
    ///
    /// let store = MemoryStore::with_clock(ManualClock::new(1_000));
    /// let key = Key::from_parts(&[&"m-1"])?;
    /// assert!(store.record("notify", &key).await?.is_none());
    ///
    /// store.claim(&SPEC, &key, None).await?;
    /// let record = store.record("notify", &key).await?.unwrap();
    /// assert_eq!(record.status, Status::InProgress);
    /// assert_eq!(record.created_at_ms, 1_000);
    /// assert_eq!(record.expires_at_ms, 31_000); // the 30 s lease
    /// # Ok(()) }
    /// ```
    pub async fn record(&self, handler: &str, key: &Key) -> Result<Option<Record>, StoreError> {
        let map = self.lock();
        Ok(map
            .get(&(handler.to_owned(), key.as_str().to_owned()))
            .cloned())
    }

    /// Deletes at most `batch` expired records; returns how many.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), idem_runtime::StoreError> {
    /// assert_eq!(idem_runtime::MemoryStore::new().sweep_expired(100).await?, 0);
    /// # Ok(()) }
    /// ```
    pub async fn sweep_expired(&self, batch: u32) -> Result<u64, StoreError> {
        Ok(self.sweep_now(batch))
    }

    /// Deletes at most `batch` expired records under the lock.
    fn sweep_now(&self, batch: u32) -> u64 {
        let now = self.clock.now_millis();
        let mut map = self.lock();
        let expired: Vec<_> = map
            .iter()
            .filter(|(_, e)| e.is_expired(now))
            .map(|(k, _)| k.clone())
            .take(batch as usize)
            .collect();
        for k in &expired {
            map.remove(k);
        }
        expired.len() as u64
    }

    fn with_entry<R>(
        &self,
        spec: &HandlerSpec,
        key: &Key,
        f: impl FnOnce(&mut Option<Record>, i64) -> R,
    ) -> R {
        let now = self.clock.now_millis();
        let mut map = self.lock();
        let k = (spec.name.to_owned(), key.as_str().to_owned());
        let mut slot = map.remove(&k);
        let r = f(&mut slot, now);
        if let Some(e) = slot {
            map.insert(k, e);
        }
        r
    }
}

fn holds(e: &Option<Record>, token: &str) -> bool {
    matches!(e, Some(e) if e.status == Status::InProgress && e.token.as_deref() == Some(token))
}

/// Whether `token`'s claim completed the record: a completion retried with
/// it (its first reply lost) recorded it already.
fn completed_by(e: &Option<Record>, token: &str) -> bool {
    matches!(e, Some(e) if e.status == Status::Completed && e.token.as_deref() == Some(token))
}

/// As [`holds`], or the claim's stall was counted as the last failure: its
/// body may still record what it did.
fn settles(e: &Option<Record>, token: &str) -> bool {
    matches!(e, Some(e) if matches!(e.status, Status::InProgress | Status::Retry)
        && e.token.as_deref() == Some(token))
}

impl LeaseStore for MemoryStore {
    fn store_name(&self) -> &'static str {
        "memory"
    }

    async fn claim(
        &self,
        spec: &'static HandlerSpec,
        key: &Key,
        fingerprint: Option<&str>,
    ) -> Result<Claim, StoreError> {
        Ok(self.with_entry(spec, key, |slot, now| {
            let carried = match ClaimPlan::of(slot.as_ref(), spec, fingerprint, now) {
                ClaimPlan::Refused(standing) => return Claim::Refused(standing),
                ClaimPlan::Exhausted(exhausted) => {
                    // The stalled claim was the last failure allowed: count
                    // it. It keeps its token: a body that finishes after all
                    // still records what it did.
                    if let Some(e) = slot.as_mut() {
                        settle_stall(e, now, spec.ttl);
                    }
                    return Claim::Refused(exhausted);
                }
                ClaimPlan::Take(carried) => carried,
            };
            let token = uuid::Uuid::new_v4().simple().to_string();
            let mut record = Record::new(
                spec.name,
                key.as_str(),
                Status::InProgress,
                now,
                expiry(now, spec.lease),
            );
            record.attempts = carried.attempts;
            record.failures = carried.failures;
            record.last_error = carried.last_error;
            record.fingerprint = fingerprint.map(str::to_owned);
            record.token = Some(token.clone());
            record.max_attempts = spec.max_attempts;
            *slot = Some(record);
            Claim::Fresh { token }
        }))
    }

    async fn complete(
        &self,
        spec: &'static HandlerSpec,
        key: &Key,
        token: &str,
        outcome: &str,
    ) -> Result<bool, StoreError> {
        let trace = crate::store::settling_trace();
        Ok(self.with_entry(spec, key, |slot, now| {
            if completed_by(slot, token) {
                return true;
            }
            if !settles(slot, token) {
                return false;
            }
            if let Some(e) = slot {
                // The record keeps the token of the claim that completed it.
                e.status = Status::Completed;
                e.outcome = Some(outcome.to_owned());
                e.trace = trace;
                e.updated_at_ms = now;
                e.expires_at_ms = expiry(now, spec.ttl);
            }
            true
        }))
    }

    async fn fail(
        &self,
        spec: &'static HandlerSpec,
        key: &Key,
        token: &str,
        failure: Failure<'_>,
    ) -> Result<bool, StoreError> {
        let trace = crate::store::settling_trace();
        Ok(self.with_entry(spec, key, |slot, now| {
            if !settles(slot, token) {
                return false;
            }
            if let Some(e) = slot {
                e.status = failure.status();
                e.outcome = failure.recorded().map(str::to_owned);
                e.token = None;
                e.failures += 1;
                e.last_error = Some(failure.text().to_owned());
                e.trace = trace;
                e.updated_at_ms = now;
                e.expires_at_ms = expiry(now, spec.ttl);
            }
            true
        }))
    }

    async fn release(
        &self,
        spec: &'static HandlerSpec,
        key: &Key,
        token: &str,
    ) -> Result<(), StoreError> {
        self.with_entry(spec, key, |slot, _| {
            if holds(slot, token) {
                *slot = None;
            }
        });
        Ok(())
    }

    async fn extend(
        &self,
        spec: &'static HandlerSpec,
        key: &Key,
        token: &str,
    ) -> Result<bool, StoreError> {
        Ok(self.with_entry(spec, key, |slot, now| {
            if !holds(slot, token) {
                return false;
            }
            if let Some(e) = slot {
                e.updated_at_ms = now;
                e.expires_at_ms = expiry(now, spec.lease);
            }
            true
        }))
    }
}

impl Sweep for MemoryStore {
    async fn sweep_expired(&self, batch: u32) -> Result<u64, StoreError> {
        MemoryStore::sweep_expired(self, batch).await
    }
}

/// Everything happens under the store's lock, so what [`Inspect::forget`]
/// reports is exactly what it deleted.
impl Inspect for MemoryStore {
    async fn lookup(&self, handler: &str, key: &str) -> Result<Option<Record>, StoreError> {
        Ok(self
            .lock()
            .get(&(handler.to_owned(), key.to_owned()))
            .cloned())
    }

    async fn list(&self, handler: &str, query: Query) -> Result<Vec<Record>, StoreError> {
        let now = self.clock.now_millis();
        let records: Vec<Record> = self
            .lock()
            .values()
            .filter(|r| r.handler == handler)
            .cloned()
            .collect();
        Ok(query.apply(records, now))
    }

    async fn stats(&self) -> Result<Stats, StoreError> {
        let mut stats = Stats::new(self.clock.now_millis());
        for record in self.lock().values() {
            stats.add(record);
        }
        Ok(stats)
    }

    async fn forget(&self, handler: &str, key: &str, force: bool) -> Result<Forgot, StoreError> {
        let now = self.clock.now_millis();
        let mut map = self.lock();
        let k = (handler.to_owned(), key.to_owned());
        Ok(match map.get(&k) {
            None => Forgot::Absent,
            Some(r) if !force && r.status == Status::InProgress && !r.is_expired(now) => {
                Forgot::Refused(r.clone())
            }
            Some(_) => map.remove(&k).map_or(Forgot::Absent, Forgot::Deleted),
        })
    }

    async fn sweep(&self) -> Result<Swept, StoreError> {
        Ok(Swept::deleted(self.sweep_now(u32::MAX)))
    }

    async fn handlers(&self) -> Result<Vec<String>, StoreError> {
        let mut names: Vec<String> = self.lock().keys().map(|(h, _)| h.clone()).collect();
        names.sort();
        names.dedup();
        Ok(names)
    }

    async fn schema(&self) -> Result<Schema, StoreError> {
        Ok(Schema::None)
    }
}
