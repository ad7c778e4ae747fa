//! The contract between the runtime and a store: what a claim, a
//! completion and a commit must guarantee, in two traits.
//!
//! [`LeaseStore`] is what lease mode needs (every store of this crate
//! implements it), [`TxStore`] what transaction mode needs (the SQL stores),
//! and [`StoreTransaction`] marks the transaction a [`TxStore`] hands to a
//! handler's body. All three are public, in [`crate::store`], and can be
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

use crate::error::{Contention, StoreError};
use crate::key::Key;
use crate::registry::HandlerSpec;
pub(crate) use crate::store::batch::{BatchItem, Held, TxBatch, TxBatchCommit};

/// What a record says to a delivery that may not run its body: the answer
/// a claim, a commit or a rollback returns instead of running or recording.
///
/// # Examples
///
/// What the call makes of each:
///
/// ```
/// use idem_runtime::store::Standing;
///
/// fn action(standing: &Standing) -> &'static str {
///     match standing {
///         Standing::Completed { .. } => "duplicate: hand the recorded outcome back",
///         Standing::Failed { .. } => "duplicate of a final failure: hand the recorded error back",
///         Standing::InProgress { .. } => "busy: redeliver later",
///         Standing::Mismatch { .. } => "another payload under this key: dead-letter",
///         Standing::Exhausted { .. } => "failed too often: dead-letter",
///     }
/// }
/// assert_eq!(action(&Standing::Mismatch { recorded: "9f2c".into() }), "another payload under this key: dead-letter");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Standing {
    /// A completed record: `outcome` is its serialized result (JSON).
    Completed {
        /// The outcome as the store keeps it (JSON).
        outcome: String,
    },
    /// A final failure is recorded: `error` is the body's error, serialized
    /// (JSON); duplicates get it back until the ttl ends.
    Failed {
        /// The error as the store keeps it (JSON).
        error: String,
    },
    /// Another delivery holds the key: a live lease (lease mode), or a
    /// transaction holding the key past the lock timeout (transaction mode).
    InProgress {
        /// Lease mode: what is left of the other claim's lease (the runtime
        /// turns it into the caller's redelivery hint). Transaction mode: the
        /// lock timeout, as a redelivery hint.
        retry_after: Duration,
    },
    /// The record was written for a delivery with another payload
    /// fingerprint: the same key names two different messages.
    Mismatch {
        /// The fingerprint the record holds.
        recorded: String,
    },
    /// The body failed on as many deliveries as the handler's
    /// `max_attempts` allows.
    Exhausted {
        /// How many deliveries failed.
        failures: u32,
        /// The text of the last failure, as the record keeps it.
        last_error: Option<String>,
    },
}

/// What became of a lease-mode claim.
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
/// #     fingerprint: None, max_attempts: None,
/// # };
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use idem_runtime::store::{Claim, LeaseStore, Standing};
/// use idem_runtime::{Key, MemoryStore};
///
/// let store = MemoryStore::new();
/// let key = Key::from_parts(&[&"m-1"])?;
/// match store.claim(&SPEC, &key, None).await? {
///     Claim::Fresh { token } => {
///         // run the body, then record its result under the token
///         assert!(store.complete(&SPEC, &key, &token, "42").await?);
///     }
///     Claim::Refused(standing) => println!("not this time: {standing:?}"),
/// }
/// // the next delivery gets the recorded result
/// assert_eq!(
///     store.claim(&SPEC, &key, None).await?,
///     Claim::Refused(Standing::Completed { outcome: "42".into() })
/// );
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// The key was absent, expired, its lease had run out, or its last
    /// delivery failed and may be retried: this caller holds it now,
    /// identified by `token`.
    Fresh {
        /// The fencing token of this claim; completion, failure, release and
        /// lease extension only succeed while the record still holds it.
        token: String,
    },
    /// The record that stands does not let this delivery run.
    Refused(Standing),
}

/// A failed body, as a store records it.
///
/// # Examples
///
/// ```
/// use idem_runtime::store::Failure;
///
/// let retry = Failure::Counted { error: "connection reset by peer" };
/// assert_eq!(retry.text(), "connection reset by peer");
/// let last = Failure::Final { error: "unknown SKU pear-9", encoded: r#"{"UnknownSku":"pear-9"}"# };
/// assert_eq!(last.text(), "unknown SKU pear-9");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure<'a> {
    /// The error may pass on a redelivery: the store counts it (one more
    /// failure, `error` as the last error) and lets the next delivery claim
    /// the key, until the handler's `max_attempts`.
    Counted {
        /// The error's text (`Display`).
        error: &'a str,
    },
    /// The error is final: the store records it like an outcome
    /// (`encoded`, JSON), and duplicates get it back until the ttl ends.
    Final {
        /// The error's text (`Display`), kept as the last error.
        error: &'a str,
        /// The error, serialized (JSON).
        encoded: &'a str,
    },
}

impl Failure<'_> {
    /// The error's text.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(idem_runtime::store::Failure::Counted { error: "timeout" }.text(), "timeout");
    /// ```
    pub fn text(&self) -> &str {
        match self {
            Failure::Counted { error } | Failure::Final { error, .. } => error,
        }
    }

    /// The status the record takes: [`Retry`](crate::store::Status::Retry)
    /// or [`Failed`](crate::store::Status::Failed).
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::store::{Failure, Status};
    /// assert_eq!(Failure::Counted { error: "timeout" }.status(), Status::Retry);
    /// ```
    pub fn status(&self) -> crate::store::Status {
        match self {
            Failure::Counted { .. } => crate::store::Status::Retry,
            Failure::Final { .. } => crate::store::Status::Failed,
        }
    }

    /// What the record keeps as its outcome: the final error's JSON, or
    /// nothing for a failure that may pass.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::store::Failure;
    /// let last = Failure::Final { error: "unknown SKU", encoded: r#""pear""# };
    /// assert_eq!(last.recorded(), Some(r#""pear""#));
    /// assert_eq!(Failure::Counted { error: "timeout" }.recorded(), None);
    /// ```
    pub fn recorded(&self) -> Option<&str> {
        match self {
            Failure::Counted { .. } => None,
            Failure::Final { encoded, .. } => Some(encoded),
        }
    }
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
/// #     fingerprint: None, max_attempts: None,
/// # };
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use idem_runtime::store::{Claim, Failure, LeaseStore};
/// use idem_runtime::{Key, MemoryStore, StoreError};
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
///     async fn claim(
///         &self, spec: &'static HandlerSpec, key: &Key, fingerprint: Option<&str>,
///     ) -> Result<Claim, StoreError> {
///         self.claims.fetch_add(1, Ordering::Relaxed);
///         self.inner.claim(spec, key, fingerprint).await
///     }
///     async fn complete(
///         &self, spec: &'static HandlerSpec, key: &Key, token: &str, outcome: &str,
///     ) -> Result<bool, StoreError> {
///         self.inner.complete(spec, key, token, outcome).await
///     }
///     async fn fail(
///         &self, spec: &'static HandlerSpec, key: &Key, token: &str, failure: Failure<'_>,
///     ) -> Result<bool, StoreError> {
///         self.inner.fail(spec, key, token, failure).await
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
/// assert!(matches!(store.claim(&SPEC, &key, None).await?, Claim::Fresh { .. }));
/// assert_eq!(store.claims.load(Ordering::Relaxed), 1);
/// # Ok(()) }
/// ```
///
/// Stores are handles: cloning one shares its connections and records (the
/// call clones it into the task that keeps the lease alive).
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a lease store: a lease-mode handler runs on a store implementing `idem_runtime::store::LeaseStore`",
    label = "not a lease store",
    note = "pass a store (`&store`), e.g. a `SqliteStore`, `PgStore`, `RedisStore` or `MemoryStore`, or an `Arc` of one"
)]
pub trait LeaseStore: Clone + Send + Sync + 'static {
    /// The store's name, as written in `store = "..."`.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::store::LeaseStore;
    /// use idem_runtime::MemoryStore;
    /// assert_eq!(MemoryStore::new().store_name(), "memory");
    /// ```
    fn store_name(&self) -> &'static str;

    /// Claims `key` for `spec.lease`, or reports the record that stands.
    ///
    /// `fingerprint` is the delivery's payload digest when the handler
    /// declares one: a new claim stores it, and a live record with another
    /// one refuses the claim with [`Standing::Mismatch`]. Taking over a
    /// failed delivery's record (a [`Status::Retry`](crate::store::Status::Retry)
    /// one, below `spec.max_attempts`) keeps its failure count; taking over
    /// a claim whose lease ran out counts one more failure. The rules of
    /// what a live record answers are [`Standing::of`].
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
    /// use idem_runtime::store::{Claim, LeaseStore, Standing};
    /// use idem_runtime::{Key, MemoryStore};
    ///
    /// let store = MemoryStore::new();
    /// let key = Key::from_parts(&[&"m-1"])?;
    /// let first = store.claim(&SPEC, &key, None).await?;
    /// assert!(matches!(first, Claim::Fresh { .. }));
    /// // a second consumer finds the live lease
    /// let Claim::Refused(Standing::InProgress { retry_after }) =
    ///     store.claim(&SPEC, &key, None).await? else { panic!() };
    /// assert!(retry_after <= SPEC.lease);
    /// # Ok(()) }
    /// ```
    fn claim(
        &self,
        spec: &'static HandlerSpec,
        key: &Key,
        fingerprint: Option<&str>,
    ) -> impl Future<Output = Result<Claim, StoreError>> + Send;

    /// Records `outcome` and keeps it for `spec.ttl`, if `token` still holds
    /// the claim. `Ok(false)` means the lease was lost.
    ///
    /// The runtime sends a completion again, with the same token and
    /// outcome, when the first one failed: also when the store wrote it
    /// and only its reply was lost (the connection dropped after the
    /// write). A completion whose token completed the record already must
    /// answer `Ok(true)` and leave the record as it is; the stores of this
    /// crate keep the token in the completed record to know it. A record
    /// completed under another token (a consumer that took the key over
    /// once this lease ran out) answers `Ok(false)`, even when it holds
    /// the same outcome: that result is the other consumer's. A store that
    /// answers `Ok(false)` to its own completion makes the call report
    /// [`Error::LeaseLost`](crate::Error::LeaseLost) for a key whose
    /// outcome it recorded.
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
    /// use idem_runtime::store::{Claim, LeaseStore};
    /// use idem_runtime::{Key, MemoryStore};
    ///
    /// let store = MemoryStore::new();
    /// let key = Key::from_parts(&[&"m-1"])?;
    /// let Claim::Fresh { token } = store.claim(&SPEC, &key, None).await? else { panic!() };
    /// assert!(store.complete(&SPEC, &key, &token, r#"{"sent":true}"#).await?);
    /// // the same completion again (its first reply lost): recorded, unchanged
    /// assert!(store.complete(&SPEC, &key, &token, r#"{"sent":true}"#).await?);
    /// // another claim's token does not hold the key
    /// assert!(!store.complete(&SPEC, &key, "someone else's token", r#"{"sent":true}"#).await?);
    /// # Ok(()) }
    /// ```
    fn complete(
        &self,
        spec: &'static HandlerSpec,
        key: &Key,
        token: &str,
        outcome: &str,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Records a failed body, if `token` still holds the claim: a
    /// [`Failure::Counted`] counts one more failure and leaves the key for the
    /// next delivery (status [`Retry`](crate::store::Status::Retry), kept for
    /// `spec.ttl` so the count survives); a [`Failure::Final`] is recorded
    /// like an outcome (status [`Failed`](crate::store::Status::Failed)).
    /// `Ok(false)` means the lease was lost.
    ///
    /// The runtime calls it only for handlers that count failures
    /// (`max_attempts`) or for a final error; any other failure is
    /// [`release`](Self::release)d.
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
    /// #     fingerprint: None, max_attempts: Some(2),
    /// # };
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_runtime::store::{Claim, Failure, LeaseStore, Standing};
    /// use idem_runtime::{Key, MemoryStore};
    ///
    /// let store = MemoryStore::new();
    /// let key = Key::from_parts(&[&"m-1"])?;
    /// for _ in 0..2 {
    ///     let Claim::Fresh { token } = store.claim(&SPEC, &key, None).await? else { panic!() };
    ///     assert!(store.fail(&SPEC, &key, &token, Failure::Counted { error: "smtp timeout" }).await?);
    /// }
    /// // two failures, and SPEC allows two attempts
    /// let Claim::Refused(Standing::Exhausted { failures, last_error }) =
    ///     store.claim(&SPEC, &key, None).await? else { panic!() };
    /// assert_eq!((failures, last_error.as_deref()), (2, Some("smtp timeout")));
    /// # Ok(()) }
    /// ```
    fn fail(
        &self,
        spec: &'static HandlerSpec,
        key: &Key,
        token: &str,
        failure: Failure<'_>,
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
    /// #     fingerprint: None, max_attempts: None,
    /// # };
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_runtime::store::{Claim, LeaseStore};
    /// use idem_runtime::{Key, MemoryStore};
    ///
    /// let store = MemoryStore::new();
    /// let key = Key::from_parts(&[&"m-1"])?;
    /// let Claim::Fresh { token } = store.claim(&SPEC, &key, None).await? else { panic!() };
    /// // the body failed: give the key back so a redelivery runs it again
    /// store.release(&SPEC, &key, &token).await?;
    /// assert!(matches!(store.claim(&SPEC, &key, None).await?, Claim::Fresh { .. }));
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
    /// #     fingerprint: None, max_attempts: None,
    /// # };
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_runtime::store::{Claim, LeaseStore};
    /// use idem_runtime::{Key, MemoryStore};
    ///
    /// let store = MemoryStore::new();
    /// let key = Key::from_parts(&[&"m-1"])?;
    /// let Claim::Fresh { token } = store.claim(&SPEC, &key, None).await? else { panic!() };
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
    /// Claims every key of a batch, answering for each in the order given,
    /// as [`LeaseStore::claim`] does for one. The keys are distinct.
    ///
    /// The default claims one key after the other (and releases what it
    /// took if a claim fails); the stores of this crate claim the whole
    /// batch in one statement or one pipelined round trip.
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
    /// use idem_runtime::store::{BatchItem, Claim, Held, LeaseStore};
    /// use idem_runtime::{Key, MemoryStore};
    ///
    /// let store = MemoryStore::new();
    /// let (a, b) = (Key::from_parts(&[&"m-1"])?, Key::from_parts(&[&"m-2"])?);
    /// let Claim::Fresh { token } = store.claim(&SPEC, &a, None).await? else { panic!() };
    /// store.complete(&SPEC, &a, &token, "1").await?;
    ///
    /// let items = [BatchItem { key: &a, fingerprint: None }, BatchItem { key: &b, fingerprint: None }];
    /// let claims = store.claim_batch(&SPEC, &items).await?;
    /// assert!(matches!(claims[0], Claim::Refused(_)));
    /// let Claim::Fresh { token } = &claims[1] else { panic!() };
    /// assert_eq!(store.complete_batch(&SPEC, &[(Held { key: &b, token }, "2")]).await?, [true]);
    /// # Ok(()) }
    /// ```
    fn claim_batch(
        &self,
        spec: &'static HandlerSpec,
        items: &[BatchItem<'_>],
    ) -> impl Future<Output = Result<Vec<Claim>, StoreError>> + Send {
        async move {
            let mut claims = Vec::with_capacity(items.len());
            for item in items {
                match self.claim(spec, item.key, item.fingerprint).await {
                    Ok(claim) => claims.push(claim),
                    Err(e) => {
                        let held = held(items, &claims);
                        if let Err(e) = self.release_batch(spec, &held).await {
                            tracing::warn!(error = %e, "could not release a batch's claims; they free themselves when their leases run out");
                        }
                        return Err(e);
                    }
                }
            }
            Ok(claims)
        }
    }

    /// Records each claim's outcome, as [`LeaseStore::complete`] does for
    /// one: per claim in the order given, `false` when its lease was lost.
    /// Sent again after a failure like a single completion, it answers
    /// `true` for each claim whose token completed its record already.
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
    /// use idem_runtime::store::{BatchItem, Claim, Held, LeaseStore};
    /// use idem_runtime::{Key, MemoryStore};
    ///
    /// let store = MemoryStore::new();
    /// let key = Key::from_parts(&[&"m-1"])?;
    /// let claims = store.claim_batch(&SPEC, &[BatchItem { key: &key, fingerprint: None }]).await?;
    /// let Claim::Fresh { token } = &claims[0] else { panic!() };
    /// assert_eq!(store.complete_batch(&SPEC, &[(Held { key: &key, token }, "7")]).await?, [true]);
    /// # Ok(()) }
    /// ```
    fn complete_batch(
        &self,
        spec: &'static HandlerSpec,
        done: &[(Held<'_>, &str)],
    ) -> impl Future<Output = Result<Vec<bool>, StoreError>> + Send {
        async move {
            let mut completed = Vec::with_capacity(done.len());
            for (held, outcome) in done {
                completed.push(self.complete(spec, held.key, held.token, outcome).await?);
            }
            Ok(completed)
        }
    }

    /// Releases every claim given, as [`LeaseStore::release`] does for one.
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
    /// use idem_runtime::store::{BatchItem, Claim, Held, LeaseStore};
    /// use idem_runtime::{Key, MemoryStore};
    ///
    /// let store = MemoryStore::new();
    /// let key = Key::from_parts(&[&"m-1"])?;
    /// let claims = store.claim_batch(&SPEC, &[BatchItem { key: &key, fingerprint: None }]).await?;
    /// let Claim::Fresh { token } = &claims[0] else { panic!() };
    /// store.release_batch(&SPEC, &[Held { key: &key, token }]).await?;
    /// assert!(matches!(store.claim(&SPEC, &key, None).await?, Claim::Fresh { .. }));
    /// # Ok(()) }
    /// ```
    fn release_batch(
        &self,
        spec: &'static HandlerSpec,
        held: &[Held<'_>],
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        async move {
            for held in held {
                self.release(spec, held.key, held.token).await?;
            }
            Ok(())
        }
    }

    /// Extends every claim given, as [`LeaseStore::extend`] does for one:
    /// per claim in the order given, `false` when its lease was lost.
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
    /// use idem_runtime::store::{BatchItem, Claim, Held, LeaseStore};
    /// use idem_runtime::{Key, MemoryStore};
    ///
    /// let store = MemoryStore::new();
    /// let key = Key::from_parts(&[&"m-1"])?;
    /// let claims = store.claim_batch(&SPEC, &[BatchItem { key: &key, fingerprint: None }]).await?;
    /// let Claim::Fresh { token } = &claims[0] else { panic!() };
    /// assert_eq!(store.extend_batch(&SPEC, &[Held { key: &key, token }]).await?, [true]);
    /// # Ok(()) }
    /// ```
    fn extend_batch(
        &self,
        spec: &'static HandlerSpec,
        held: &[Held<'_>],
    ) -> impl Future<Output = Result<Vec<bool>, StoreError>> + Send {
        async move {
            let mut extended = Vec::with_capacity(held.len());
            for held in held {
                extended.push(self.extend(spec, held.key, held.token).await?);
            }
            Ok(extended)
        }
    }
}

/// The claims `claims` holds of `items`, as [`Held`]s.
pub(crate) fn held<'a>(items: &[BatchItem<'a>], claims: &'a [Claim]) -> Vec<Held<'a>> {
    items
        .iter()
        .zip(claims)
        .filter_map(|(item, claim)| match claim {
            Claim::Fresh { token } => Some(Held {
                key: item.key,
                token,
            }),
            Claim::Refused(_) => None,
        })
        .collect()
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
///     TxClaim::Refused(Standing::Completed { outcome }) if outcome == "7"
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
    /// as [`LeaseStore::fail`] describes: committed, a retryable failure
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
impl<S: LeaseStore> LeaseStore for std::sync::Arc<S> {
    fn store_name(&self) -> &'static str {
        (**self).store_name()
    }

    fn claim(
        &self,
        spec: &'static HandlerSpec,
        key: &Key,
        fingerprint: Option<&str>,
    ) -> impl Future<Output = Result<Claim, StoreError>> + Send {
        (**self).claim(spec, key, fingerprint)
    }

    fn fail(
        &self,
        spec: &'static HandlerSpec,
        key: &Key,
        token: &str,
        failure: Failure<'_>,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        (**self).fail(spec, key, token, failure)
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

    fn claim_batch(
        &self,
        spec: &'static HandlerSpec,
        items: &[BatchItem<'_>],
    ) -> impl Future<Output = Result<Vec<Claim>, StoreError>> + Send {
        (**self).claim_batch(spec, items)
    }

    fn complete_batch(
        &self,
        spec: &'static HandlerSpec,
        done: &[(Held<'_>, &str)],
    ) -> impl Future<Output = Result<Vec<bool>, StoreError>> + Send {
        (**self).complete_batch(spec, done)
    }

    fn release_batch(
        &self,
        spec: &'static HandlerSpec,
        held: &[Held<'_>],
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        (**self).release_batch(spec, held)
    }

    fn extend_batch(
        &self,
        spec: &'static HandlerSpec,
        held: &[Held<'_>],
    ) -> impl Future<Output = Result<Vec<bool>, StoreError>> + Send {
        (**self).extend_batch(spec, held)
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
