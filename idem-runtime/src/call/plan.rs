//! What batch handlers of both modes share: a batch's messages reduced to
//! their distinct keys, and one answer per message from what became of
//! each key. A batch claims its keys at once, runs one body over its fresh
//! messages, and records every outcome at once.
//!
//! The generated code derives each message's key (and fingerprint), then
//! runs the batch in its mode (`call/lease/batch.rs`, `call/tx/batch.rs`),
//! which builds on this module. Either mode answers one
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
//! * a message whose key cannot be derived (a `None` part): `KeyMissing`;
//! * in lease mode, a fresh message whose value cannot be recorded:
//!   `Unrecordable`, its key settled as failed (so is a repeat of it).
//!
//! The call itself fails (the outer `Err`) when the batch could not be
//! claimed or recorded, or when the body failed: then nothing of the
//! batch is recorded, so every message may be redelivered. A body that
//! answers another number of values than it was given fresh messages
//! fails the call with `OutcomeCount`: transaction mode rolls back, lease
//! mode settles every fresh key as unrecordable (the effects happened). A batch body's
//! error is never recorded as final nor counted (the macro refuses
//! `max_attempts` on a batch handler): it is the whole batch's error, and
//! [`Error::Handler`] names the key of the batch's first fresh message.

use std::borrow::Cow;

use super::refused;
use crate::codec::{Codec, encode};
use crate::error::Error;
use crate::final_error::ErrorCodec;
use crate::key::Key;
use crate::outcome::Outcome;
use crate::registry::HandlerSpec;
use crate::store::contract::{BatchItem, Standing};
use crate::telemetry::finish;

/// One message's key and payload fingerprint, as the generated code
/// derives them, or why it could not (a `None` key part).
#[doc(hidden)]
pub type Derived<E> = Result<(Key, Option<String>), Error<E>>;

/// One result per message, in input order.
#[doc(hidden)]
pub type Results<T, E> = Vec<Result<Outcome<T>, Error<E>>>;

/// Where a message's answer comes from.
pub(super) enum Slot<E> {
    /// Its key could not be derived.
    Underived(Error<E>),
    /// The first message of distinct key `.0`.
    First(usize),
    /// A later message of distinct key `.0`, with its own fingerprint.
    Repeat(usize, Option<String>),
}

/// A batch's messages, reduced to their distinct keys.
pub(super) struct Plan<E> {
    pub(super) slots: Vec<Slot<E>>,
    /// The distinct keys and their fingerprints, in first-seen order.
    pub(super) keys: Vec<(Key, Option<String>)>,
    /// For each distinct key, the index of its first message.
    pub(super) firsts: Vec<usize>,
}

impl<E> Plan<E> {
    pub(super) fn new(derived: Vec<Derived<E>>) -> Self {
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

    pub(super) fn items(&self) -> Vec<BatchItem<'_>> {
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
    pub(super) fn lead(&self, fresh: &[usize]) -> Key {
        let u = fresh.first().copied().unwrap_or(0);
        self.keys.get(u).or_else(|| self.keys.first()).map_or_else(
            || crate::key::KeyBuilder::new().finish(),
            |(key, _)| key.clone(),
        )
    }

    /// The messages the body runs: the first message of each fresh key,
    /// borrowed as they are when every message is fresh.
    pub(super) fn fresh_messages<'m, M: Clone>(
        &self,
        msgs: &'m [M],
        fresh: &[usize],
    ) -> Cow<'m, [M]> {
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
pub(super) enum Fate<T> {
    /// The body ran it: its value, and the value as recorded.
    Ran(T, String),
    /// A record stood against it.
    Refused(Standing),
    /// Its lease was lost before its outcome was recorded.
    Lost,
    /// The body ran it (lease mode), but its value cannot be recorded
    /// (serde's error); the key was settled as failed with `.1` as its
    /// recorded error.
    Unrecordable(serde_json::Error, String),
}

/// The per-message results from each distinct key's fate, each counted in
/// the handler's metrics.
pub(super) fn answer<T, E>(
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
            // A repeat within the batch is in the batch's own span: no
            // trace to link to.
            Fate::Ran(_, outcome) => Some(Standing::Completed {
                outcome: outcome.clone(),
                trace: None,
            }),
            // The first message of the key links the span to the trace
            // that settled it; its repeats add the link no second time.
            Fate::Refused(standing) => Some(match standing.clone() {
                Standing::Completed { outcome, .. } => Standing::Completed {
                    outcome,
                    trace: None,
                },
                Standing::Failed { error, .. } => Standing::Failed { error, trace: None },
                other => other,
            }),
            Fate::Unrecordable(_, recorded) => Some(Standing::Failed {
                error: recorded.clone(),
                trace: None,
            }),
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
                        Some(Fate::Unrecordable(source, _)) => Err(Error::Unrecordable {
                            handler: spec.name,
                            key: key.clone(),
                            source,
                        }),
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

pub(super) fn batch_span(spec: &HandlerSpec, messages: usize) -> tracing::Span {
    tracing::info_span!(
        "idempotent_batch",
        handler = spec.name,
        messages,
        fresh = tracing::field::Empty,
    )
}

/// The body's values matched to the fresh keys, encoded for the record;
/// `Err` when their number is wrong or one cannot be recorded.
pub(super) fn encode_all<T, E>(
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
