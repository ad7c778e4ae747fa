//! Lease mode: claim with a fencing token, run the body under a heartbeat,
//! then complete or release.

use std::future::Future;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde::de::DeserializeOwned;
use tracing::Instrument;

use super::{check_registry, store_err};
use crate::codec::{decode, encode};
use crate::error::Error;
use crate::key::Key;
use crate::outcome::Outcome;
use crate::registry::HandlerSpec;
use crate::store::contract::{Claim, LeaseStore};
use crate::telemetry::{body_latency, call_span, claim_latency, finish};

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
    S: LeaseStore + Clone + 'static,
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
    S: LeaseStore + Clone + 'static,
    T: Serialize + DeserializeOwned,
    F: Future<Output = Result<T, E>>,
{
    check_registry(spec)?;
    let claim_start = Instant::now();
    let token = match store.claim(spec, key).await {
        Ok(Claim::Acquired { token }) => token,
        Ok(Claim::Completed { outcome }) => {
            claim_latency(spec, claim_start);
            return decode(spec, key, &outcome);
        }
        Ok(Claim::InProgress { lease_left }) => {
            claim_latency(spec, claim_start);
            return Err(Error::InProgress {
                handler: spec.name,
                key: key.clone(),
                retry_after: crate::retry::lease_hint(spec, lease_left),
            });
        }
        Err(e) => return Err(store_err(spec, key, e)),
    };
    claim_latency(spec, claim_start);

    let body_start = Instant::now();
    let result = with_heartbeat(store, spec, key, &token, body).await;
    body_latency(spec, body_start);
    crate::retry::body_finished(spec, body_start.elapsed());

    match result {
        Ok(value) => {
            // The body succeeded, so its effect happened: if the outcome cannot
            // be encoded the claim is kept (not released) until its lease
            // runs out, rather than inviting an immediate second execution.
            let outcome = encode(spec, key, &value)?;
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

/// Awaits `body` while a task of its own extends the lease every third of it.
///
/// The heartbeat runs as a separate task so that a body that blocks its
/// thread (a synchronous client, heavy computation) does not starve it on a
/// multi-threaded runtime; it stops when the body finishes or the call is
/// dropped.
async fn with_heartbeat<S, T, E, F>(
    store: &S,
    spec: &'static HandlerSpec,
    key: &Key,
    token: &str,
    body: F,
) -> Result<T, E>
where
    S: LeaseStore + Clone + 'static,
    F: Future<Output = Result<T, E>>,
{
    let period = (spec.lease / 3).max(Duration::from_millis(10));
    let (store, key, token) = (store.clone(), key.clone(), token.to_owned());
    let heartbeat = async move {
        let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            match store.extend(spec, &key, &token).await {
                Ok(true) => {}
                Ok(false) => {
                    tracing::warn!(
                        "lease lost while the body runs: another consumer took the key over"
                    );
                    return;
                }
                Err(e) => tracing::warn!(error = %e, "could not extend the lease; will retry"),
            }
        }
    };
    let _heartbeat = AbortOnDrop(tokio::spawn(heartbeat.instrument(tracing::Span::current())));
    // A task spawned from a worker waits in that worker's own slot, which no
    // other worker takes: let it start (arm its timer) before a body that may
    // block this thread runs. Its timer then wakes it on a free worker.
    tokio::task::yield_now().await;
    body.await
}

/// Aborts a task when dropped: the heartbeat ends with its call.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
