//! The lease-mode contract: [`LeaseStore`], and its impl for a shared
//! store.

use std::future::Future;

use crate::error::StoreError;
use crate::key::Key;
use crate::registry::HandlerSpec;

use super::{BatchItem, Claim, Failure, Held};

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
    /// one refuses the claim with [`Standing::Mismatch`](super::Standing::Mismatch). Taking over a
    /// failed delivery's record (a [`Status::Retry`](crate::store::Status::Retry)
    /// one, below `spec.max_attempts`) keeps its failure count; taking over
    /// a claim whose lease ran out counts one more failure. The rules of
    /// what a live record answers are [`Standing::of`](super::Standing::of).
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
