//! Lease mode: a claim with a fencing token and a lease, the body run while
//! the runtime's lease keeper ([`keeper`]) extends the lease, then the
//! outcome recorded (or the claim released). [`single`] runs one message,
//! [`batch`] a batch of them.

use std::future::Future;
use std::time::{Duration, Instant};

use crate::error::StoreError;
use crate::registry::HandlerSpec;

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
