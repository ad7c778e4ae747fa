//! Batch handlers: the keys of a whole batch claimed at once, one body run
//! over its fresh messages, every outcome recorded at once.
//!
//! The generated code derives each message's key (and fingerprint), then
//! calls [`run_lease_batch`] or drives a [`TxBatchRun`]. Both answer one
//! result per message, in input order:
//!
//! * a fresh message: [`Outcome::Executed`] with the body's value for it;
//! * a message whose key is recorded: what a single call would answer
//!   (the recorded outcome as [`Outcome::Duplicate`], a replayed final
//!   error, `InProgress`, `PayloadMismatch`, `Exhausted`);
//! * the second message of a key the batch holds twice: a duplicate of the
//!   first ([`Outcome::Duplicate`] of the first's recorded value), or
//!   `PayloadMismatch` when the handler declares a fingerprint and the two
//!   payloads differ;
//! * a message whose key cannot be derived (a `None` part): `KeyMissing`.
//!
//! The call itself fails (the outer `Err`) when the batch could not be
//! claimed or recorded, or when the body failed: then nothing of the
//! batch is recorded, so every message may be redelivered. A batch body's
//! error is never recorded as final nor counted (the macro refuses
//! `max_attempts` on a batch handler): it is the whole batch's error, and
//! [`Error::Handler`] names the key of the batch's first fresh message.

use std::borrow::Cow;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tracing::Instrument;

use super::{check_registry, refused, store_err};
use crate::codec::{Codec, encode};
use crate::error::{Error, StoreError};
use crate::final_error::ErrorCodec;
use crate::key::Key;
use crate::outcome::Outcome;
use crate::registry::HandlerSpec;
use crate::store::contract::{
    BatchItem, Claim, Held, LeaseStore, Standing, TxBatchCommit, TxStore, held,
};
use crate::telemetry::{body_latency, claim_latency, finish};

/// One message's key and payload fingerprint, as the generated code
/// derives them, or why it could not (a `None` key part).
#[doc(hidden)]
pub type Derived<E> = Result<(Key, Option<String>), Error<E>>;

/// One result per message, in input order.
#[doc(hidden)]
pub type Results<T, E> = Vec<Result<Outcome<T>, Error<E>>>;

/// Where a message's answer comes from.
enum Slot<E> {
    /// Its key could not be derived.
    Underived(Error<E>),
    /// The first message of distinct key `.0`.
    First(usize),
    /// A later message of distinct key `.0`, with its own fingerprint.
    Repeat(usize, Option<String>),
}

/// A batch's messages, reduced to their distinct keys.
struct Plan<E> {
    slots: Vec<Slot<E>>,
    /// The distinct keys and their fingerprints, in first-seen order.
    keys: Vec<(Key, Option<String>)>,
    /// For each distinct key, the index of its first message.
    firsts: Vec<usize>,
}

impl<E> Plan<E> {
    fn new(derived: Vec<Derived<E>>) -> Self {
        let mut seen = std::collections::HashMap::with_capacity(derived.len());
        let mut plan = Plan {
            slots: Vec::with_capacity(derived.len()),
            keys: Vec::with_capacity(derived.len()),
            firsts: Vec::with_capacity(derived.len()),
        };
        for (at, d) in derived.into_iter().enumerate() {
            let slot = match d {
                Err(e) => Slot::Underived(e),
                Ok((key, fingerprint)) => match seen.get(key.as_str()) {
                    Some(&u) => Slot::Repeat(u, fingerprint),
                    None => {
                        let u = plan.keys.len();
                        seen.insert(key.as_str().to_owned(), u);
                        plan.keys.push((key, fingerprint));
                        plan.firsts.push(at);
                        Slot::First(u)
                    }
                },
            };
            plan.slots.push(slot);
        }
        plan
    }

    fn items(&self) -> Vec<BatchItem<'_>> {
        self.keys
            .iter()
            .map(|(key, fingerprint)| BatchItem {
                key,
                fingerprint: fingerprint.as_deref(),
            })
            .collect()
    }

    /// The key a failure of the whole batch is reported under: the first
    /// fresh message's (or the first key's).
    fn lead(&self, fresh: &[usize]) -> Key {
        let u = fresh.first().copied().unwrap_or(0);
        self.keys.get(u).or_else(|| self.keys.first()).map_or_else(
            || crate::key::KeyBuilder::new().finish(),
            |(key, _)| key.clone(),
        )
    }

    /// The messages the body runs: the first message of each fresh key,
    /// borrowed as they are when every message is fresh.
    fn fresh_messages<'m, M: Clone>(&self, msgs: &'m [M], fresh: &[usize]) -> Cow<'m, [M]> {
        if fresh.len() == msgs.len() {
            return Cow::Borrowed(msgs);
        }
        Cow::Owned(
            fresh
                .iter()
                .filter_map(|&u| msgs.get(self.firsts[u]).cloned())
                .collect(),
        )
    }
}

/// What became of each distinct key.
enum Fate<T> {
    /// The body ran it: its value, and the value as recorded.
    Ran(T, String),
    /// A record stood against it.
    Refused(Standing),
    /// Its lease was lost before its outcome was recorded.
    Lost,
}

/// The per-message results from each distinct key's fate, each counted in
/// the handler's metrics.
fn answer<T, E>(
    spec: &'static HandlerSpec,
    plan: Plan<E>,
    fates: Vec<Fate<T>>,
    codec: Codec<T>,
    errors: ErrorCodec<E>,
) -> Results<T, E> {
    let Plan { slots, keys, .. } = plan;
    // What stands against the repeats of each key, read before the first
    // messages take their fates: the value the body recorded, or the
    // record that turned the key away.
    let repeats: Vec<Option<Standing>> = fates
        .iter()
        .map(|f| match f {
            Fate::Ran(_, outcome) => Some(Standing::Completed {
                outcome: outcome.clone(),
            }),
            Fate::Refused(standing) => Some(standing.clone()),
            Fate::Lost => None,
        })
        .collect();
    let mut fates: Vec<Option<Fate<T>>> = fates.into_iter().map(Some).collect();
    slots
        .into_iter()
        .map(|slot| {
            let r = match slot {
                Slot::Underived(e) => Err(e),
                Slot::First(u) => {
                    let (key, fingerprint) = &keys[u];
                    match fates[u].take() {
                        Some(Fate::Ran(value, _)) => Ok(Outcome::Executed(value)),
                        Some(Fate::Refused(standing)) => {
                            refused(spec, key, fingerprint.as_deref(), codec, errors, standing)
                        }
                        Some(Fate::Lost) | None => Err(Error::LeaseLost {
                            handler: spec.name,
                            key: key.clone(),
                        }),
                    }
                }
                Slot::Repeat(u, fingerprint) => {
                    let (key, first) = &keys[u];
                    let standing = if fingerprint.is_some() && fingerprint != *first {
                        Some(Standing::Mismatch {
                            recorded: first.clone().unwrap_or_default(),
                        })
                    } else {
                        repeats[u].clone()
                    };
                    match standing {
                        Some(standing) => {
                            refused(spec, key, fingerprint.as_deref(), codec, errors, standing)
                        }
                        None => Err(Error::LeaseLost {
                            handler: spec.name,
                            key: key.clone(),
                        }),
                    }
                }
            };
            finish(spec, r)
        })
        .collect()
}

fn batch_span(spec: &HandlerSpec, messages: usize) -> tracing::Span {
    tracing::info_span!(
        "idempotent_batch",
        handler = spec.name,
        messages,
        fresh = tracing::field::Empty,
    )
}

/// The body's values matched to the fresh keys, encoded for the record;
/// `Err` when their number is wrong or one cannot be recorded.
fn encode_all<T, E>(
    spec: &'static HandlerSpec,
    plan: &Plan<E>,
    fresh: &[usize],
    codec: Codec<T>,
    values: Vec<T>,
) -> Result<Vec<(T, String)>, Error<E>> {
    if values.len() != fresh.len() {
        return Err(Error::OutcomeCount {
            handler: spec.name,
            fresh: fresh.len(),
            returned: values.len(),
        });
    }
    values
        .into_iter()
        .zip(fresh)
        .map(|(value, &u)| {
            let outcome = encode(spec, &plan.keys[u].0, codec, &value)?;
            Ok((value, outcome))
        })
        .collect()
}

/// Runs a lease-mode batch handler: claims the batch's keys at once, runs
/// `body` over the fresh messages under one heartbeat, and records every
/// outcome at once (or releases every claim when the body fails).
#[doc(hidden)]
// The generated code passes what it made of the handler, one argument each.
#[allow(clippy::too_many_arguments)]
pub async fn run_lease_batch<'m, S, M, T, E, B, F>(
    store: &S,
    spec: &'static HandlerSpec,
    msgs: &'m [M],
    derived: Vec<Derived<E>>,
    codec: Codec<T>,
    errors: ErrorCodec<E>,
    body: B,
) -> Result<Results<T, E>, Error<E>>
where
    S: LeaseStore,
    M: Clone,
    B: FnOnce(Cow<'m, [M]>) -> F,
    F: Future<Output = Result<Vec<T>, E>>,
{
    let span = batch_span(spec, msgs.len());
    async move {
        check_registry(spec)?;
        let plan = Plan::new(derived);
        let items = plan.items();
        if items.is_empty() {
            return Ok(answer(spec, plan, Vec::new(), codec, errors));
        }
        let claim_start = Instant::now();
        let claims = store
            .claim_batch(spec, &items)
            .await
            .map_err(|e| store_err(spec, &plan.lead(&[]), e))?;
        claim_latency(spec, claim_start);
        let fresh: Vec<usize> = (0..claims.len())
            .filter(|&u| matches!(claims[u], Claim::Acquired { .. }))
            .collect();
        tracing::Span::current().record("fresh", fresh.len());
        let refusal = |claim: &Claim| match claim {
            Claim::Refused(Standing::InProgress { retry_after }) => {
                Fate::Refused(Standing::InProgress {
                    retry_after: crate::retry::lease_hint(spec, *retry_after),
                })
            }
            Claim::Refused(other) => Fate::Refused(other.clone()),
            Claim::Acquired { .. } => Fate::Lost,
        };
        if fresh.is_empty() {
            let fates = claims.iter().map(refusal).collect();
            return Ok(answer(spec, plan, fates, codec, errors));
        }

        let holding = held(&items, &claims);
        let heartbeat = BatchHeartbeat::start(store, spec, &holding, claim_start).await;
        let body_start = Instant::now();
        let result = body(plan.fresh_messages(msgs, &fresh)).await;
        body_latency(spec, body_start);
        crate::retry::body_finished(spec, body_start.elapsed());

        let values = match result {
            Ok(values) => values,
            Err(error) => {
                drop(heartbeat);
                if let Err(e) = store.release_batch(spec, &holding).await {
                    tracing::warn!(error = %e, "could not release the batch's claims; they free themselves when their leases run out");
                }
                return Err(Error::Handler {
                    handler: spec.name,
                    key: plan.lead(&fresh),
                    error,
                });
            }
        };
        // The body's effects happened: a result that cannot be recorded
        // keeps the claims until their leases run out, as a single call does.
        let ran = encode_all(spec, &plan, &fresh, codec, values)?;
        let done: Vec<(Held<'_>, &str)> = holding
            .iter()
            .zip(&ran)
            .map(|(held, (_, outcome))| (*held, outcome.as_str()))
            .collect();
        let completed = complete_while_leased(store, spec, &done, &heartbeat)
            .await
            .map_err(|source| Error::NotRecorded {
                handler: spec.name,
                key: plan.lead(&fresh),
                source,
            })?;
        drop(heartbeat);

        let mut ran = ran.into_iter().zip(completed);
        let fates = claims
            .iter()
            .map(|claim| match claim {
                Claim::Acquired { .. } => match ran.next() {
                    Some(((value, outcome), true)) => Fate::Ran(value, outcome),
                    _ => Fate::Lost,
                },
                refused => refusal(refused),
            })
            .collect();
        Ok(answer(spec, plan, fates, codec, errors))
    }
    .instrument(span)
    .await
}

/// Records a batch's outcomes, retrying a failing store (with a growing
/// pause, from 20 ms up to 500 ms) for one lease from the first failure,
/// and no longer than the leases are known to hold: a store that keeps
/// refusing (a statement too large for it) ends the call instead of
/// retrying for as long as the heartbeat keeps the leases alive.
async fn complete_while_leased<S: LeaseStore>(
    store: &S,
    spec: &'static HandlerSpec,
    done: &[(Held<'_>, &str)],
    heartbeat: &BatchHeartbeat,
) -> Result<Vec<bool>, StoreError> {
    let mut pause = Duration::from_millis(20);
    let mut give_up: Option<Instant> = None;
    loop {
        match store.complete_batch(spec, done).await {
            Ok(completed) => return Ok(completed),
            Err(e) => {
                let deadline = *give_up.get_or_insert_with(|| Instant::now() + spec.lease);
                if Instant::now() + pause >= deadline.min(heartbeat.lease_ends(spec)) {
                    return Err(e);
                }
                tracing::warn!(
                    error = %e,
                    "the batch body succeeded but its outcomes could not be recorded; retrying while the leases hold"
                );
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(500));
            }
        }
    }
}

/// A task that extends a batch's leases every third of the lease, from
/// before the body starts until the outcomes are recorded; it stops when
/// dropped. One task per batch call.
struct BatchHeartbeat {
    task: tokio::task::JoinHandle<()>,
    renewed: Arc<Mutex<Instant>>,
}

impl BatchHeartbeat {
    async fn start<S: LeaseStore>(
        store: &S,
        spec: &'static HandlerSpec,
        holding: &[Held<'_>],
        claimed: Instant,
    ) -> BatchHeartbeat {
        let period = (spec.lease / 3).max(Duration::from_millis(10));
        let renewed = Arc::new(Mutex::new(claimed));
        let mut owned: Vec<(Key, String)> = holding
            .iter()
            .map(|h| (h.key.clone(), h.token.to_owned()))
            .collect();
        let (store, last) = (store.clone(), Arc::clone(&renewed));
        let beat = async move {
            let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                let asked = Instant::now();
                let held: Vec<Held<'_>> = owned
                    .iter()
                    .map(|(key, token)| Held { key, token })
                    .collect();
                match store.extend_batch(spec, &held).await {
                    Ok(extended) => {
                        let lost = extended.iter().filter(|e| !**e).count();
                        if lost > 0 {
                            // Another consumer took these over; the others
                            // are still this call's to keep.
                            tracing::warn!(
                                lost,
                                "leases lost while the batch body runs: another consumer took keys over"
                            );
                            let mut kept = extended.iter();
                            owned.retain(|_| kept.next().copied().unwrap_or(false));
                        }
                        if owned.is_empty() {
                            return;
                        }
                        *last.lock().unwrap_or_else(PoisonError::into_inner) = asked;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "could not extend the batch's leases; will retry")
                    }
                }
            }
        };
        let task = tokio::spawn(beat.instrument(tracing::Span::current()));
        tokio::task::yield_now().await;
        BatchHeartbeat { task, renewed }
    }

    fn lease_ends(&self, spec: &HandlerSpec) -> Instant {
        *self.renewed.lock().unwrap_or_else(PoisonError::into_inner) + spec.lease
    }
}

impl Drop for BatchHeartbeat {
    fn drop(&mut self) {
        self.task.abort();
    }
}

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
        call: TxBatchCall<S::Tx>,
        result: Result<Vec<T>, E>,
    ) -> TxBatchStep<T, E> {
        body_latency(self.spec, call.body_start);
        let span = self.span.clone();
        async {
            let TxBatchCall {
                tx,
                fresh,
                standings,
                ..
            } = call;
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
                Ok(TxBatchCommit::Taken) if self.tries > 1 => {
                    self.tries -= 1;
                    tracing::debug!("a key of the batch was recorded meanwhile; beginning again");
                    TxBatchStep::Again
                }
                Ok(TxBatchCommit::Taken) => TxBatchStep::Done(Err(store_err(
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
