//! A lease-mode batch: its keys claimed at once, one body over the fresh
//! messages with every claim kept by the lease keeper, every outcome
//! recorded at once (or every claim released when the body fails; a key
//! whose value cannot be recorded settled as failed).

use std::borrow::Cow;
use std::future::Future;
use std::time::Instant;

use tracing::Instrument;

use super::keeper::Lease;
use super::{Persist, complete_while_leased, settle_unrecordable};
use crate::call::plan::{Derived, Fate, Plan, Results, answer, batch_span};
use crate::call::{check_registry, store_err};
use crate::codec::Codec;
use crate::error::Error;
use crate::final_error::ErrorCodec;
use crate::registry::HandlerSpec;
use crate::store::contract::{Claim, Held, LeaseStore, Standing, held};
use crate::telemetry::{body_latency, claim_latency};

/// Runs a lease-mode batch handler: claims the batch's keys at once, runs
/// `body` over the fresh messages with their leases kept by the lease
/// keeper, and records every
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
            .filter(|&u| matches!(claims[u], Claim::Fresh { .. }))
            .collect();
        tracing::Span::current().record("fresh", fresh.len());
        let refusal = |claim: &Claim| match claim {
            Claim::Refused(Standing::InProgress { retry_after }) => {
                Fate::Refused(Standing::InProgress {
                    retry_after: crate::retry_after::lease_hint(spec, *retry_after),
                })
            }
            Claim::Refused(other) => Fate::Refused(other.clone()),
            Claim::Fresh { .. } => Fate::Lost,
        };
        if fresh.is_empty() {
            let fates = claims.iter().map(refusal).collect();
            return Ok(answer(spec, plan, fates, codec, errors));
        }

        let holding = held(&items, &claims);
        let mut lease = Lease::keep_batch(store, spec, &holding, claim_start).await;
        let body_start = Instant::now();
        let result = body(plan.fresh_messages(msgs, &fresh)).await;
        body_latency(spec, body_start);
        crate::retry_after::body_finished(spec, body_start.elapsed());

        let values = match result {
            Ok(values) => values,
            Err(error) => {
                lease.ended();
                drop(lease);
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
        // The body's effects happened: a key whose value cannot be recorded
        // is settled as failed, as a single call's is, and so is every
        // fresh key when no value can be matched to its message.
        if values.len() != fresh.len() {
            let why = format!(
                "the batch body was given {} fresh messages but returned {} values, so no value could be matched to its message",
                fresh.len(),
                values.len()
            );
            settle_all(store, spec, &lease, holding.iter().map(|held| (*held, why.clone()))).await;
            lease.ended();
            return Err(Error::OutcomeCount {
                handler: spec.name,
                fresh: fresh.len(),
                returned: values.len(),
            });
        }
        let encoded: Vec<Result<String, serde_json::Error>> =
            values.iter().map(|value| codec.encoded(value)).collect();
        // Settled before the others are completed: a completion that fails
        // for good ends the call, and these keys must not run again.
        let unrecordable = holding
            .iter()
            .zip(&encoded)
            .filter_map(|(held, outcome)| Some((*held, outcome.as_ref().err()?.to_string())));
        settle_all(store, spec, &lease, unrecordable).await;
        let done: Vec<(Held<'_>, &str)> = holding
            .iter()
            .zip(&encoded)
            .filter_map(|(held, outcome)| Some((*held, outcome.as_deref().ok()?)))
            .collect();
        let completed = if done.is_empty() {
            Ok(Vec::new())
        } else {
            let done = &done[..];
            let complete = move || store.complete_batch(spec, done);
            complete_while_leased(spec, &lease, Persist::OneLeaseAtMost, complete).await
        };
        lease.ended();
        drop(lease);
        let completed = completed.map_err(|source| Error::NotRecorded {
            handler: spec.name,
            key: plan.lead(&fresh),
            source,
        })?;

        let mut completed = completed.into_iter();
        let mut ran = values.into_iter().zip(encoded);
        let fates = claims
            .iter()
            .map(|claim| match claim {
                Claim::Fresh { .. } => match ran.next() {
                    Some((value, Ok(outcome))) => match completed.next() {
                        Some(true) => Fate::Ran(value, outcome),
                        _ => Fate::Lost,
                    },
                    Some((_, Err(source))) => {
                        let recorded = crate::store::unrecordable_encoding(
                            &crate::call::capped(source.to_string()),
                        );
                        Fate::Unrecordable(source, recorded)
                    }
                    None => Fate::Lost,
                },
                refused => refusal(refused),
            })
            .collect();
        Ok(answer(spec, plan, fates, codec, errors))
    }
    .instrument(span)
    .await
}

/// Settles each held key with its reason, one after another, as
/// [`settle_unrecordable`] does; once the store has failed for a whole
/// lease on one, the rest are logged and left (each would wait as long
/// again): they run again once their leases run out.
async fn settle_all<S: LeaseStore>(
    store: &S,
    spec: &'static HandlerSpec,
    lease: &Lease,
    keys: impl Iterator<Item = (Held<'_>, String)>,
) {
    let mut keys = keys;
    while let Some((held, why)) = keys.next() {
        let settled = settle_unrecordable(
            store,
            spec,
            lease,
            Persist::OneLeaseAtMost,
            held.key,
            held.token,
            &why,
        )
        .await;
        if !settled {
            let left = keys.count();
            if left > 0 {
                tracing::error!(
                    left,
                    "the store kept failing: the batch's other keys whose results cannot be recorded are not settled either, and run again once their leases run out"
                );
            }
            return;
        }
    }
}
