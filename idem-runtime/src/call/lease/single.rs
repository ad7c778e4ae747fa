//! A lease-mode call of one message: claim with a fencing token, run the
//! body with its lease kept by the runtime's lease keeper (`keeper.rs`),
//! then complete or release.

use std::future::Future;
use std::time::Instant;

use tracing::Instrument;

use super::keeper::Lease;
use super::{Persist, complete_while_leased, settle_unrecordable};
use crate::call::{Recording, check_registry, refused, store_err};
use crate::codec::Codec;
use crate::error::Error;
use crate::final_error::ErrorCodec;
use crate::key::Key;
use crate::outcome::Outcome;
use crate::registry::HandlerSpec;
use crate::store::contract::{Claim, LeaseStore, Standing};
use crate::telemetry::{body_latency, call_span, claim_latency, finish};

/// Runs `body` under a lease on `key`: claim, body with its lease kept,
/// complete or release.
#[doc(hidden)]
pub async fn run_lease<S, T, E, F>(
    store: &S,
    spec: &'static HandlerSpec,
    key: &Key,
    fingerprint: Option<&str>,
    codec: Codec<T>,
    errors: ErrorCodec<E>,
    body: F,
) -> Result<Outcome<T>, Error<E>>
where
    S: LeaseStore,
    F: Future<Output = Result<T, E>>,
{
    let span = call_span(spec, key);
    let r = lease_inner(
        store,
        spec,
        key,
        fingerprint,
        codec,
        errors,
        body.instrument(span.clone()),
    )
    .instrument(span.clone())
    .await;
    let _enter = span.enter();
    finish(spec, r)
}

async fn lease_inner<S, T, E, F>(
    store: &S,
    spec: &'static HandlerSpec,
    key: &Key,
    fingerprint: Option<&str>,
    codec: Codec<T>,
    errors: ErrorCodec<E>,
    body: F,
) -> Result<Outcome<T>, Error<E>>
where
    S: LeaseStore,
    F: Future<Output = Result<T, E>>,
{
    check_registry(spec)?;
    let claim_start = Instant::now();
    let token = match store.claim(spec, key, fingerprint).await {
        Ok(Claim::Fresh { token }) => token,
        Ok(Claim::Refused(standing)) => {
            claim_latency(spec, claim_start);
            let standing = match standing {
                // What is left of the other claim's lease becomes a hint.
                Standing::InProgress { retry_after } => Standing::InProgress {
                    retry_after: crate::retry_after::lease_hint(spec, retry_after),
                },
                other => other,
            };
            return refused(spec, key, fingerprint, codec, errors, standing);
        }
        Err(e) => return Err(store_err(spec, key, e)),
    };
    claim_latency(spec, claim_start);

    let mut lease = Lease::keep(store, spec, key, &token, claim_start).await;
    let body_start = Instant::now();
    let result = body.await;
    body_latency(spec, body_start);
    crate::retry_after::body_finished(spec, body_start.elapsed());

    match result {
        Ok(value) => {
            let outcome = match codec.encoded(&value) {
                Ok(outcome) => outcome,
                Err(source) => {
                    // The body succeeded, so its effect happened: the key is
                    // settled as failed, and no delivery runs the body again
                    // within the ttl.
                    let why = source.to_string();
                    settle_unrecordable(
                        store,
                        spec,
                        &lease,
                        Persist::WhileLeased,
                        key,
                        &token,
                        &why,
                    )
                    .await;
                    lease.ended();
                    return Err(Error::Unrecordable {
                        handler: spec.name,
                        key: key.clone(),
                        source,
                    });
                }
            };
            let complete = || store.complete(spec, key, &token, &outcome);
            let completed =
                complete_while_leased(spec, &lease, Persist::WhileLeased, complete).await;
            lease.ended();
            match completed {
                Ok(true) => Ok(Outcome::Executed(value)),
                Ok(false) => Err(Error::LeaseLost {
                    handler: spec.name,
                    key: key.clone(),
                }),
                Err(source) => Err(Error::NotRecorded {
                    handler: spec.name,
                    key: key.clone(),
                    source,
                }),
            }
        }
        Err(error) => {
            // Nothing took effect that a record would stand for.
            lease.ended();
            drop(lease);
            let recording = match Recording::of(spec, errors, &error) {
                Ok(recording) => recording,
                Err(source) => {
                    // A final error that cannot be recorded: it is not, but
                    // a handler that counts failures counts this one.
                    if spec.max_attempts.is_some() {
                        let text = crate::call::capped((errors.text)(&error));
                        let failure = crate::store::contract::Failure::Counted { error: &text };
                        if let Err(e) = store.fail(spec, key, &token, failure).await {
                            tracing::warn!(error = %e, "could not record the body's failure");
                        }
                    } else {
                        release_quietly(store, spec, key, &token).await;
                    }
                    return Err(Error::Unrecordable {
                        handler: spec.name,
                        key: key.clone(),
                        source,
                    });
                }
            };
            match recording.failure() {
                Some(failure) => match store.fail(spec, key, &token, failure).await {
                    Ok(true) => {}
                    Ok(false) => tracing::warn!(
                        "the body failed after its lease was lost: the failure is not recorded"
                    ),
                    Err(e) => tracing::warn!(
                        error = %e,
                        "could not record the body's failure; the claim frees itself when its lease runs out, and that counts as a failure"
                    ),
                },
                None => release_quietly(store, spec, key, &token).await,
            }
            Err(recording.into_error(spec, key, error))
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
