//! A transaction-mode call of one message: claim, body and outcome in one
//! database transaction.

use std::time::Instant;

use tracing::Instrument;

use crate::call::tx::contention;
use crate::call::{Recording, capped, check_registry, refused, store_err};
use crate::codec::{Codec, encode};
use crate::error::{Contention, Error, StoreError};
use crate::final_error::ErrorCodec;
use crate::key::Key;
use crate::outcome::Outcome;
use crate::registry::HandlerSpec;
use crate::store::contract::{Standing, TxClaim, TxCommit, TxStore};
use crate::telemetry::{BodyWatch, body_latency, call_span, claim_latency, duplicate_body, finish};

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
    /// Counts a body dropped before [`tx_finish`].
    body: BodyWatch,
}

impl<Tx> TxCall<Tx> {
    /// The transaction the body runs in.
    pub fn tx(&mut self) -> &mut Tx {
        &mut self.tx
    }

    /// The transaction, to read.
    #[cfg(feature = "http")]
    pub(crate) fn tx_ref(&self) -> &Tx {
        &self.tx
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
    fingerprint: Option<&str>,
    codec: Codec<T>,
    errors: ErrorCodec<E>,
) -> Result<TxBegin<S::Tx, T>, Error<E>>
where
    S: TxStore,
{
    let span = call_span(spec, key);
    let r = async {
        check_registry(spec)?;
        let start = Instant::now();
        let claim = store
            .begin_claim(spec, key, fingerprint)
            .await
            .map_err(|e| store_err(spec, key, e));
        claim_latency(spec, start);
        match claim? {
            TxClaim::Fresh(tx) => Ok(TxBegin::Fresh(TxCall {
                tx,
                span: span.clone(),
                body_start: Instant::now(),
                body: BodyWatch::start(spec, "transaction", span.clone()),
            })),
            TxClaim::Refused(standing) => {
                refused(spec, key, fingerprint, codec, errors, standing).map(TxBegin::Done)
            }
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
// The generated code passes what it made of the handler, one argument each.
#[allow(clippy::too_many_arguments)]
pub async fn tx_finish<S, T, E>(
    store: &S,
    spec: &'static HandlerSpec,
    key: &Key,
    fingerprint: Option<&str>,
    codec: Codec<T>,
    errors: ErrorCodec<E>,
    mut call: TxCall<S::Tx>,
    result: Result<T, E>,
) -> Result<Outcome<T>, Error<E>>
where
    S: TxStore,
{
    call.body.ended();
    body_latency(spec, call.body_start);
    let span = call.span;
    let r = async {
        match result {
            Ok(value) => {
                let outcome = match encode(spec, key, codec, &value) {
                    Ok(o) => o,
                    Err(e) => {
                        rollback_quietly(store, call.tx, spec, key, fingerprint).await;
                        return Err(e);
                    }
                };
                match store
                    .commit_outcome(call.tx, spec, key, fingerprint, &outcome)
                    .await
                    .map_err(|e| store_err(spec, key, e))?
                {
                    TxCommit::Committed => Ok(Outcome::Executed(value)),
                    TxCommit::Refused(standing) => {
                        refused_after_body(spec, key, fingerprint, codec, errors, standing)
                    }
                }
            }
            Err(error) => {
                // The store's own contention is no failure of the body's:
                // nothing is recorded or counted.
                if let Some(kind) = contention(store, errors, &error) {
                    return contended(
                        store,
                        call.tx,
                        spec,
                        key,
                        fingerprint,
                        codec,
                        errors,
                        kind,
                        &error,
                    )
                    .await;
                }
                let recording = match Recording::of(spec, errors, &error) {
                    Ok(recording) => recording,
                    Err(source) => {
                        rollback_quietly(store, call.tx, spec, key, fingerprint).await;
                        return Err(Error::Unrecordable {
                            handler: spec.name,
                            key: key.clone(),
                            source,
                        });
                    }
                };
                let settled = match recording.failure() {
                    Some(failure) => store
                        .commit_failure(call.tx, spec, key, fingerprint, failure)
                        .await
                        .map(|commit| match commit {
                            TxCommit::Committed => None,
                            TxCommit::Refused(standing) => Some(standing),
                        }),
                    None => store.rollback(call.tx, spec, key, fingerprint).await,
                };
                failed(
                    spec,
                    key,
                    fingerprint,
                    codec,
                    errors,
                    recording,
                    error,
                    settled,
                )
            }
        }
    }
    .instrument(span.clone())
    .await;
    let _enter = span.enter();
    finish(spec, r)
}

/// What a call whose body ran returns when its key turned out to be taken
/// (claiming last, or read first and raced): the body's writes rolled
/// back, counted in [`metric::DUPLICATE_BODIES`](crate::metric::DUPLICATE_BODIES)
/// when a record settles the key.
fn refused_after_body<T, E>(
    spec: &'static HandlerSpec,
    key: &Key,
    fingerprint: Option<&str>,
    codec: Codec<T>,
    errors: ErrorCodec<E>,
    standing: Standing,
) -> Result<Outcome<T>, Error<E>> {
    // A record that settles the key: the body ran for a duplicate. A wait
    // at the insert past the lock timeout (or a deadlock) says only that
    // the key was busy, which may be another key's lock: not counted.
    if !matches!(standing, Standing::InProgress { .. }) {
        duplicate_body(spec);
    }
    refused(spec, key, fingerprint, codec, errors, standing)
}

/// What a call whose body failed returns, once its transaction is settled.
#[allow(clippy::too_many_arguments)]
fn failed<T, E>(
    spec: &'static HandlerSpec,
    key: &Key,
    fingerprint: Option<&str>,
    codec: Codec<T>,
    errors: ErrorCodec<E>,
    recording: Recording,
    error: E,
    settled: Result<Option<Standing>, StoreError>,
) -> Result<Outcome<T>, Error<E>> {
    match settled {
        // The body failed because it was a duplicate's: what the
        // first delivery recorded is the answer.
        Ok(Some(standing)) => refused_after_body(spec, key, fingerprint, codec, errors, standing),
        Ok(None) => Err(recording.into_error(spec, key, error)),
        // The transaction's connection is gone (the rollback could
        // not even be sent), so the body's error is most likely that
        // failure seen from inside: a store failure to retry, not a
        // business error to dead-letter. The server rolled back.
        Err(source) => {
            tracing::warn!(
                error = %source,
                "the transaction's connection failed while the body ran; reported as a store error instead of the body's"
            );
            Err(store_err(spec, key, source))
        }
    }
}

/// What a call whose body failed on the store's contention returns: its
/// transaction rolled back through the store (so that, claiming last, a
/// duplicate's body still gets the recorded outcome), it is the store's
/// error, with the body's error as its text.
#[allow(clippy::too_many_arguments)]
async fn contended<S: TxStore, T, E>(
    store: &S,
    tx: S::Tx,
    spec: &'static HandlerSpec,
    key: &Key,
    fingerprint: Option<&str>,
    codec: Codec<T>,
    errors: ErrorCodec<E>,
    kind: Contention,
    error: &E,
) -> Result<Outcome<T>, Error<E>> {
    let text = capped((errors.text)(error));
    match store.rollback(tx, spec, key, fingerprint).await {
        Ok(Some(standing)) => refused_after_body(spec, key, fingerprint, codec, errors, standing),
        Ok(None) => {
            tracing::debug!(%kind, error = %text, "the body met contention in its transaction: rolled back, reported as the store's");
            Err(store_err(
                spec,
                key,
                StoreError::Contention { kind, error: text },
            ))
        }
        Err(source) => Err(store_err(spec, key, source)),
    }
}

async fn rollback_quietly<S: TxStore>(
    store: &S,
    tx: S::Tx,
    spec: &'static HandlerSpec,
    key: &Key,
    fingerprint: Option<&str>,
) -> Option<Standing> {
    store
        .rollback(tx, spec, key, fingerprint)
        .await
        .unwrap_or_else(|e| {
            // The server rolls back on its own when the connection goes.
            tracing::warn!(error = %e, "rollback failed");
            None
        })
}
