//! Lease mode: a claim with a fencing token and a lease, the body run while
//! the runtime's lease keeper ([`keeper`]) extends the lease, then the
//! outcome recorded (or the claim released). [`single`] runs one message,
//! [`batch`] a batch of them.

use std::future::Future;
use std::time::{Duration, Instant};

use crate::error::StoreError;
use crate::key::Key;
use crate::registry::HandlerSpec;
use crate::store::LeaseStore;
use crate::store::contract::Failure;

pub(crate) mod batch;
pub(crate) mod keeper;
pub(crate) mod single;

use keeper::Lease;

/// How long [`complete_while_leased`] tries again a completion that the
/// store keeps refusing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Persist {
    /// For as long as the lease holds.
    WhileLeased,
    /// For as long as the leases hold, and one lease from the first failure
    /// at most: a batch's completion can fail for good (one statement too
    /// large for the store) while its renewals succeed.
    OneLeaseAtMost,
}

/// Records a successful body's outcome with `complete`, retrying a failing
/// store (with a growing pause, from 20 ms up to 500 ms) for as long as
/// `lease` holds and `persist` allows: once the lease runs out, another
/// consumer may take the key over and run the body again, so the caller
/// must learn that the effect happened without a record. The keeper keeps
/// extending the lease meanwhile.
pub(crate) async fn complete_while_leased<R, F, C>(
    spec: &'static HandlerSpec,
    lease: &Lease,
    persist: Persist,
    mut complete: C,
) -> Result<R, StoreError>
where
    C: FnMut() -> F,
    F: Future<Output = Result<R, StoreError>>,
{
    let mut pause = Duration::from_millis(20);
    let mut give_up: Option<Instant> = None;
    loop {
        match complete().await {
            Ok(completed) => return Ok(completed),
            Err(e) => {
                let mut deadline = lease.ends(spec);
                if persist == Persist::OneLeaseAtMost {
                    let limit = *give_up.get_or_insert_with(|| Instant::now() + spec.lease);
                    deadline = deadline.min(limit);
                }
                if Instant::now() + pause >= deadline {
                    return Err(e);
                }
                tracing::warn!(
                    error = %e,
                    "the body succeeded but its outcome could not be recorded; retrying while the lease holds"
                );
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(500));
            }
        }
    }
}

/// Settles `key`, whose body took effect but whose value cannot be
/// recorded (`why`), as a final failure for the handler's ttl, through
/// [`LeaseStore::fail`]: its recorded error is the runtime's own
/// ([`unrecordable_encoding`](crate::store::unrecordable_encoding)), which
/// every later delivery reads as [`Error::Unrecordable`](crate::Error::Unrecordable)
/// without running the body. Tried again while `lease` holds (and
/// `persist` allows) if the store fails; what cannot be settled is logged,
/// and the key runs again once its lease runs out. `false` when the store
/// kept failing, so that a batch stops trying its other keys (each would
/// wait as long again).
pub(crate) async fn settle_unrecordable<S: LeaseStore>(
    store: &S,
    spec: &'static HandlerSpec,
    lease: &Lease,
    persist: Persist,
    key: &Key,
    token: &str,
    why: &str,
) -> bool {
    let why = crate::call::capped(why.to_owned());
    let encoded = crate::store::unrecordable_encoding(&why);
    let text = crate::call::capped(format!(
        "the body took effect, but its result cannot be recorded: {why}"
    ));
    let failure = Failure::Final {
        error: &text,
        encoded: &encoded,
    };
    let fail = || store.fail(spec, key, token, failure);
    match complete_while_leased(spec, lease, persist, fail).await {
        Ok(true) => true,
        Ok(false) => {
            tracing::warn!(
                "the body took effect but its result cannot be recorded, and the key was not settled under this claim: its lease was lost (or an earlier try settled it and its reply was lost)"
            );
            true
        }
        Err(e) => {
            tracing::error!(
                error = %e,
                "the body took effect but its result cannot be recorded, and the key could not be settled: once its lease runs out, a redelivery runs the body again"
            );
            false
        }
    }
}
