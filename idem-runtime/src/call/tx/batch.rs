//! A transaction-mode batch: one transaction reads the batch's records,
//! runs the body over the fresh messages, and commits its writes with
//! every fresh key's outcome.

use std::borrow::Cow;
use std::time::Instant;

use tracing::Instrument;

use crate::call::plan::{Derived, Fate, Plan, Results, answer, batch_span, encode_all};
use crate::call::tx::contention;
use crate::call::{capped, check_registry, store_err};
use crate::codec::Codec;
use crate::error::{Error, StoreError};
use crate::final_error::ErrorCodec;
use crate::registry::HandlerSpec;
use crate::store::contract::{Standing, TxBatchCommit, TxStore};
use crate::telemetry::{BodyWatch, body_latency, claim_latency};

/// A transaction-mode batch call, driven by the generated code:
///
/// ```text
/// let mut run = TxBatchRun::new(store, &SPEC, msgs, derived, codec, errors);
/// loop {
///     let mut call = match run.begin().await? { Fresh(call) => call, Done(results) => return Ok(results) };
///     let fresh = run.fresh(msgs, &call);
///     let result = body(call.tx(), &fresh).await;
///     match run.finish(call, result).await { Step::Done(r) => return r, Step::Again => continue }
/// }
/// ```
///
/// `begin` opens the transaction and reads the batch's records; `finish`
/// commits the body's writes with every fresh key's outcome, or rolls
/// back. When another delivery recorded one of the fresh keys meanwhile,
/// everything was rolled back and the batch begins again with that key a
/// duplicate, so the body runs again over what is still fresh.
#[doc(hidden)]
pub struct TxBatchRun<'s, S, T, E> {
    store: &'s S,
    spec: &'static HandlerSpec,
    plan: Plan<E>,
    codec: Codec<T>,
    errors: ErrorCodec<E>,
    span: tracing::Span,
    /// How many times the batch may still begin again.
    tries: usize,
}

/// What [`TxBatchRun::begin`] found.
#[doc(hidden)]
pub enum TxBatchBegin<Tx, T, E> {
    /// Run the body over the fresh messages in this transaction.
    Fresh(TxBatchCall<Tx>),
    /// Nothing is fresh: these are the results.
    Done(Results<T, E>),
}

/// An open transaction-mode batch.
#[doc(hidden)]
pub struct TxBatchCall<Tx> {
    tx: Tx,
    /// The distinct keys that are fresh.
    fresh: Vec<usize>,
    /// What stands against the others.
    standings: Vec<Option<Standing>>,
    body_start: Instant,
    /// Counts a body dropped before [`TxBatchRun::finish`].
    body: BodyWatch,
}

impl<Tx> TxBatchCall<Tx> {
    /// The transaction the body runs in.
    pub fn tx(&mut self) -> &mut Tx {
        &mut self.tx
    }
}

/// What [`TxBatchRun::finish`] did.
#[doc(hidden)]
pub enum TxBatchStep<T, E> {
    /// The batch's answer.
    Done(Result<Results<T, E>, Error<E>>),
    /// Rolled back because a fresh key was recorded meanwhile: begin again.
    Again,
}

impl<'s, S: TxStore, T, E> TxBatchRun<'s, S, T, E> {
    /// A batch call of `spec` over the derived keys of its messages.
    pub fn new(
        store: &'s S,
        spec: &'static HandlerSpec,
        messages: usize,
        derived: Vec<Derived<E>>,
        codec: Codec<T>,
        errors: ErrorCodec<E>,
    ) -> Self {
        let plan = Plan::new(derived);
        let tries = plan.keys.len() + 1;
        TxBatchRun {
            store,
            spec,
            plan,
            codec,
            errors,
            span: batch_span(spec, messages),
            tries,
        }
    }

    /// The call's span, for the body.
    pub fn span(&self) -> tracing::Span {
        self.span.clone()
    }

    /// Opens the transaction and reads what stands for each key.
    pub async fn begin(&mut self) -> Result<TxBatchBegin<S::Tx, T, E>, Error<E>> {
        let span = self.span.clone();
        async {
            check_registry(self.spec)?;
            if self.plan.keys.is_empty() {
                return Ok(TxBatchBegin::Done(self.answer(Vec::new())));
            }
            let start = Instant::now();
            let found = {
                let items = self.plan.items();
                self.store.begin_batch(self.spec, &items).await
            }
            .map_err(|e| store_err(self.spec, &self.plan.lead(&[]), e))?;
            claim_latency(self.spec, start);
            let fresh: Vec<usize> = (0..found.standings.len())
                .filter(|&u| found.standings[u].is_none())
                .collect();
            tracing::Span::current().record("fresh", fresh.len());
            if fresh.is_empty() {
                if let Err(e) = self.store.rollback_batch(found.tx).await {
                    tracing::warn!(error = %e, "rollback failed");
                }
                let fates = found.standings.into_iter().map(refused_fate).collect();
                return Ok(TxBatchBegin::Done(self.answer(fates)));
            }
            Ok(TxBatchBegin::Fresh(TxBatchCall {
                tx: found.tx,
                fresh,
                standings: found.standings,
                body_start: Instant::now(),
                body: BodyWatch::start(self.spec, "transaction", self.span.clone()),
            }))
        }
        .instrument(span)
        .await
    }

    /// The messages the body runs: the fresh ones, in input order.
    pub fn fresh<'m, M: Clone>(&self, msgs: &'m [M], call: &TxBatchCall<S::Tx>) -> Cow<'m, [M]> {
        self.plan.fresh_messages(msgs, &call.fresh)
    }

    /// Commits the body's writes with the fresh keys' outcomes, or rolls
    /// back.
    pub async fn finish(
        &mut self,
        mut call: TxBatchCall<S::Tx>,
        result: Result<Vec<T>, E>,
    ) -> TxBatchStep<T, E> {
        call.body.ended();
        body_latency(self.spec, call.body_start);
        let span = self.span.clone();
        async {
            let TxBatchCall {
                tx,
                fresh,
                standings,
                ..
            } = call;
            // The store's own contention fails the batch as the store's.
            if let Err(error) = &result
                && let Some(kind) = contention(self.store, self.errors, error)
            {
                let text = capped((self.errors.text)(error));
                if let Err(e) = self.store.rollback_batch(tx).await {
                    tracing::warn!(error = %e, "rollback failed");
                }
                return TxBatchStep::Done(Err(store_err(
                    self.spec,
                    &self.plan.lead(&fresh),
                    StoreError::Contention { kind, error: text },
                )));
            }
            let ran = match result
                .map_err(|error| Error::Handler {
                    handler: self.spec.name,
                    key: self.plan.lead(&fresh),
                    error,
                })
                .and_then(|values| encode_all(self.spec, &self.plan, &fresh, self.codec, values))
            {
                Ok(ran) => ran,
                Err(e) => {
                    if let Err(e) = self.store.rollback_batch(tx).await {
                        tracing::warn!(error = %e, "rollback failed");
                    }
                    return TxBatchStep::Done(Err(e));
                }
            };
            let mut outcomes: Vec<Option<&str>> = vec![None; standings.len()];
            for (&u, (_, outcome)) in fresh.iter().zip(&ran) {
                outcomes[u] = Some(outcome);
            }
            let commit = {
                let items = self.plan.items();
                self.store
                    .commit_batch(tx, self.spec, &items, &outcomes)
                    .await
            };
            match commit {
                Ok(TxBatchCommit::Committed) => {
                    let mut ran = ran.into_iter();
                    let fates = standings
                        .into_iter()
                        .map(|standing| match standing {
                            None => match ran.next() {
                                Some((value, outcome)) => Fate::Ran(value, outcome),
                                None => Fate::Lost,
                            },
                            Some(standing) => Fate::Refused(standing),
                        })
                        .collect();
                    TxBatchStep::Done(Ok(self.answer(fates)))
                }
                Ok(TxBatchCommit::Lost) if self.tries > 1 => {
                    self.tries -= 1;
                    tracing::debug!("a key of the batch was recorded meanwhile; beginning again");
                    TxBatchStep::Again
                }
                Ok(TxBatchCommit::Lost) => TxBatchStep::Done(Err(store_err(
                    self.spec,
                    &self.plan.lead(&fresh),
                    StoreError::Schema(
                        "the batch was taken at every commit, more often than it has keys".into(),
                    ),
                ))),
                Err(e) => TxBatchStep::Done(Err(store_err(self.spec, &self.plan.lead(&fresh), e))),
            }
        }
        .instrument(span)
        .await
    }

    fn answer(&mut self, fates: Vec<Fate<T>>) -> Results<T, E> {
        let plan = std::mem::replace(
            &mut self.plan,
            Plan {
                slots: Vec::new(),
                keys: Vec::new(),
                firsts: Vec::new(),
            },
        );
        answer(self.spec, plan, fates, self.codec, self.errors)
    }
}

fn refused_fate<T>(standing: Option<Standing>) -> Fate<T> {
    standing.map_or(Fate::Lost, Fate::Refused)
}
