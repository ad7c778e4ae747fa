//! Transaction mode: claim, body and outcome in one database transaction.

use std::time::Instant;

use tracing::Instrument;

use super::{check_registry, store_err};
use crate::codec::{Codec, decode, encode};
use crate::error::Error;
use crate::key::Key;
use crate::outcome::Outcome;
use crate::registry::HandlerSpec;
use crate::store::contract::{TxClaim, TxCommit, TxStore};
use crate::telemetry::{body_latency, call_span, claim_latency, finish};

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
    codec: Codec<T>,
) -> Result<TxBegin<S::Tx, T>, Error<E>>
where
    S: TxStore,
{
    let span = call_span(spec, key);
    let r = async {
        check_registry(spec)?;
        let start = Instant::now();
        let claim = store
            .begin_claim(spec, key)
            .await
            .map_err(|e| store_err(spec, key, e));
        claim_latency(spec, start);
        match claim? {
            TxClaim::Fresh(tx) => Ok(TxBegin::Fresh(TxCall {
                tx,
                span: span.clone(),
                body_start: Instant::now(),
            })),
            TxClaim::Completed { outcome } => decode(spec, key, codec, &outcome).map(TxBegin::Done),
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
    codec: Codec<T>,
    call: TxCall<S::Tx>,
    result: Result<T, E>,
) -> Result<Outcome<T>, Error<E>>
where
    S: TxStore,
{
    body_latency(spec, call.body_start);
    let span = call.span;
    let r = async {
        match result {
            Ok(value) => {
                let outcome = match encode(spec, key, codec, &value) {
                    Ok(o) => o,
                    Err(e) => {
                        rollback_quietly(store, call.tx, spec, key).await;
                        return Err(e);
                    }
                };
                match store
                    .commit_outcome(call.tx, spec, key, &outcome)
                    .await
                    .map_err(|e| store_err(spec, key, e))?
                {
                    TxCommit::Committed => Ok(Outcome::Executed(value)),
                    TxCommit::Duplicate { outcome } => decode(spec, key, codec, &outcome),
                    TxCommit::InProgress { retry_after } => Err(Error::InProgress {
                        handler: spec.name,
                        key: key.clone(),
                        retry_after,
                    }),
                }
            }
            Err(error) => match store.rollback(call.tx, spec, key).await {
                // The body failed because it was a duplicate's: the first
                // delivery's recorded outcome is the answer.
                Ok(Some(outcome)) => decode(spec, key, codec, &outcome),
                Ok(None) => Err(Error::Handler {
                    handler: spec.name,
                    key: key.clone(),
                    error,
                }),
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
            },
        }
    }
    .instrument(span.clone())
    .await;
    let _enter = span.enter();
    finish(spec, r)
}

async fn rollback_quietly<S: TxStore>(
    store: &S,
    tx: S::Tx,
    spec: &'static HandlerSpec,
    key: &Key,
) -> Option<String> {
    store.rollback(tx, spec, key).await.unwrap_or_else(|e| {
        // The server rolls back on its own when the connection goes.
        tracing::warn!(error = %e, "rollback failed");
        None
    })
}
