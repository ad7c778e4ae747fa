//! What a rewritten handler does around its body, for both modes, and the
//! store interfaces the two modes need.
//!
//! The generated code calls these functions through `__private`; they are
//! public so that a store outside this crate can implement [`LeaseStore`] or
//! [`TxStore`].

use std::future::Future;
use std::pin::pin;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde::de::DeserializeOwned;
use tracing::Instrument;

use crate::error::{Error, StoreError};
use crate::key::Key;
use crate::outcome::Outcome;
use crate::registry::{self, HandlerSpec};

/// The state of a key when a lease-mode handler tries to claim it.
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
        /// What is left of that lease.
        retry_after: Duration,
    },
}

/// A store that can run handlers in lease mode.
///
/// Durations come from the handler's [`HandlerSpec`] (`lease`, `ttl`).
pub trait LeaseStore: Send + Sync {
    /// The store's name, as written in `store = "..."`.
    fn store_name(&self) -> &'static str;

    /// Claims `key` for `spec.lease`, or reports the record that stands.
    fn claim(
        &self,
        spec: &'static HandlerSpec,
        key: &Key,
    ) -> impl Future<Output = Result<Claim, StoreError>> + Send;

    /// Records `outcome` and keeps it for `spec.ttl`, if `token` still holds
    /// the claim. `Ok(false)` means the lease was lost.
    fn complete(
        &self,
        spec: &'static HandlerSpec,
        key: &Key,
        token: &str,
        outcome: &str,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Drops the claim, if `token` still holds it, so the key can run again.
    fn release(
        &self,
        spec: &'static HandlerSpec,
        key: &Key,
        token: &str,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Extends the lease by `spec.lease` from now, if `token` still holds it.
    /// `Ok(false)` means the lease was lost.
    fn extend(
        &self,
        spec: &'static HandlerSpec,
        key: &Key,
        token: &str,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;
}

/// The state of a key when a transaction-mode handler opens its transaction.
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
pub trait TxStore: Send + Sync {
    /// The open transaction handed to the body.
    type Tx: Send;

    /// The store's name, as written in `store = "..."`.
    fn store_name(&self) -> &'static str;

    /// Begins a transaction and inserts the claim row in it.
    fn begin_claim(
        &self,
        spec: &'static HandlerSpec,
        key: &Key,
    ) -> impl Future<Output = Result<TxClaim<Self::Tx>, StoreError>> + Send;

    /// Records `outcome` in the dedup row and commits, unless the store
    /// writes that row only now and finds the key taken (see [`TxCommit`]).
    fn commit_outcome(
        &self,
        tx: Self::Tx,
        spec: &'static HandlerSpec,
        key: &Key,
        outcome: &str,
    ) -> impl Future<Output = Result<TxCommit, StoreError>> + Send;

    /// Rolls the transaction back: the claim and the body's writes vanish.
    fn rollback(&self, tx: Self::Tx) -> impl Future<Output = Result<(), StoreError>> + Send;
}

// ---------------------------------------------------------------------------
// Telemetry
// ---------------------------------------------------------------------------

/// Metric names, for dashboards and alerts.
pub mod metric {
    /// Counter of calls, labelled `handler` and `result`: `executed`,
    /// `duplicate`, or an [`Error::kind`](crate::Error::kind).
    pub const CALLS: &str = "idem_calls_total";
    /// Histogram of the time to claim a key (seconds), labelled `handler`.
    pub const CLAIM_SECONDS: &str = "idem_claim_seconds";
    /// Histogram of the time the body ran (seconds), labelled `handler`.
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

fn check_registry<E>(spec: &'static HandlerSpec, key: &Key) -> Result<(), Error<E>> {
    registry::check().map_err(|e| store_err(spec, key, StoreError::Registry(e)))
}

fn decode<T: DeserializeOwned, E>(
    spec: &'static HandlerSpec,
    key: &Key,
    outcome: &str,
) -> Result<Outcome<T>, Error<E>> {
    serde_json::from_str(outcome)
        .map(Outcome::Duplicate)
        .map_err(|source| Error::Codec {
            handler: spec.name,
            key: key.clone(),
            source,
        })
}

fn encode<T: Serialize, E>(
    spec: &'static HandlerSpec,
    key: &Key,
    value: &T,
) -> Result<String, Error<E>> {
    serde_json::to_string(value).map_err(|source| Error::Codec {
        handler: spec.name,
        key: key.clone(),
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
    S: LeaseStore,
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
    S: LeaseStore,
    T: Serialize + DeserializeOwned,
    F: Future<Output = Result<T, E>>,
{
    check_registry(spec, key)?;
    let claim_start = Instant::now();
    let token = match store.claim(spec, key).await {
        Ok(Claim::Acquired { token }) => token,
        Ok(Claim::Completed { outcome }) => {
            record_claim(spec, claim_start);
            return decode(spec, key, &outcome);
        }
        Ok(Claim::InProgress { retry_after }) => {
            record_claim(spec, claim_start);
            return Err(Error::InProgress {
                handler: spec.name,
                key: key.clone(),
                retry_after,
            });
        }
        Err(e) => return Err(store_err(spec, key, e)),
    };
    record_claim(spec, claim_start);

    let body_start = Instant::now();
    let result = with_heartbeat(store, spec, key, &token, body).await;
    record_body(spec, body_start);

    match result {
        Ok(value) => {
            let outcome = match encode(spec, key, &value) {
                Ok(o) => o,
                Err(e) => {
                    release_quietly(store, spec, key, &token).await;
                    return Err(e);
                }
            };
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

/// Polls `body` to completion while extending the lease every third of it.
async fn with_heartbeat<S, T, E, F>(
    store: &S,
    spec: &'static HandlerSpec,
    key: &Key,
    token: &str,
    body: F,
) -> Result<T, E>
where
    S: LeaseStore,
    F: Future<Output = Result<T, E>>,
{
    let period = (spec.lease / 3).max(Duration::from_millis(10));
    let mut body = pin!(body);
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut beating = true;
    loop {
        tokio::select! {
            biased;
            r = &mut body => return r,
            _ = ticks.tick(), if beating => {
                // The body keeps running while the lease is extended.
                let extend = store.extend(spec, key, token);
                let mut extend = pin!(extend);
                let extended = tokio::select! {
                    biased;
                    r = &mut body => return r,
                    e = &mut extend => e,
                };
                match extended {
                    Ok(true) => {}
                    Ok(false) => {
                        tracing::warn!("lease lost while the body runs: another consumer took the key over");
                        beating = false;
                    }
                    Err(e) => tracing::warn!(error = %e, "could not extend the lease; will retry"),
                }
            }
        }
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
        check_registry(spec, key)?;
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
                        rollback_quietly(store, call.tx).await;
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
            Err(error) => {
                rollback_quietly(store, call.tx).await;
                Err(Error::Handler {
                    handler: spec.name,
                    key: key.clone(),
                    error,
                })
            }
        }
    }
    .instrument(span.clone())
    .await;
    let _enter = span.enter();
    finish(spec, r)
}

async fn rollback_quietly<S: TxStore>(store: &S, tx: S::Tx) {
    if let Err(e) = store.rollback(tx).await {
        // The server rolls back on its own when the connection goes.
        tracing::warn!(error = %e, "rollback failed");
    }
}
