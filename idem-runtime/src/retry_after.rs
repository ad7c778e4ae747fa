//! When to redeliver a message whose key another consumer holds in lease
//! mode: the `retry_after` of [`Error::InProgress`](crate::Error::InProgress).
//!
//! The other claim's remaining lease is the latest moment that matters (then
//! the key can be taken over), but it is a poor hint: a body that takes
//! microseconds under a 30 s lease would send every duplicate away for half
//! a minute. The hint is when the other delivery's result is likely to be
//! recorded instead:
//!
//! * while the other claim is younger than the typical body time of this
//!   handler in this process (a moving average), what is left of that time;
//! * otherwise (no body finished yet, or this one runs longer than usual) as
//!   long again as the claim has been held, so that a slow or stuck claim is
//!   asked about less and less often. Its age is read off the lease (`lease -
//!   remaining`); a heartbeat renews the lease, so for long bodies this is the
//!   time since the last renewal;
//!
//! and in both cases at least [`MIN_RETRY`] and at most the remaining lease.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{OnceLock, PoisonError, RwLock};
use std::time::Duration;

use crate::registry::HandlerSpec;

/// The shortest hint: a broker's redelivery costs more than this anyway.
pub(crate) const MIN_RETRY: Duration = Duration::from_millis(10);

/// No body of the handler has finished in this process yet.
const UNKNOWN: u64 = u64::MAX;

/// The moving average of one handler's body times (microseconds), shared by
/// every call of that handler: one slot per handler name, made on first use
/// and kept for the process's life, so the hot path is a read lock and an
/// atomic.
fn typical_body(name: &'static str) -> &'static AtomicU64 {
    static SLOTS: OnceLock<RwLock<HashMap<&'static str, &'static AtomicU64>>> = OnceLock::new();
    let slots = SLOTS.get_or_init(Default::default);
    if let Some(slot) = slots
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .get(name)
    {
        return slot;
    }
    slots
        .write()
        .unwrap_or_else(PoisonError::into_inner)
        .entry(name)
        .or_insert_with(|| Box::leak(Box::new(AtomicU64::new(UNKNOWN))))
}

/// Notes how long one body of `spec` took.
pub(crate) fn body_finished(spec: &'static HandlerSpec, took: Duration) {
    let took = u64::try_from(took.as_micros()).unwrap_or(UNKNOWN - 1);
    let _ = typical_body(spec.name).fetch_update(Ordering::Relaxed, Ordering::Relaxed, |avg| {
        Some(match avg {
            UNKNOWN => took,
            avg => avg / 4 * 3 + took / 4,
        })
    });
}

/// The redelivery hint for a key held by another claim with `lease_left`
/// of its lease remaining.
pub(crate) fn lease_hint(spec: &'static HandlerSpec, lease_left: Duration) -> Duration {
    let lease_left = lease_left.min(spec.lease);
    let held_for = spec.lease - lease_left;
    let estimate = match typical_body(spec.name).load(Ordering::Relaxed) {
        UNKNOWN => held_for,
        micros => {
            let typical = Duration::from_micros(micros);
            if held_for < typical {
                typical - held_for
            } else {
                held_for
            }
        }
    };
    estimate.max(MIN_RETRY).min(lease_left)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::Mode;

    const fn spec(name: &'static str) -> HandlerSpec {
        HandlerSpec {
            name,
            function: name,
            key: "id",
            ttl: Duration::from_secs(3600),
            lease: Duration::from_secs(30),
            store: "memory",
            mode: Mode::Lease,
            module: "retry_after::tests",
            file: "retry_after.rs",
            line: 1,
            fingerprint: None,
            max_attempts: None,
        }
    }

    static FRESH: HandlerSpec = spec("retry_fresh");
    static FAST: HandlerSpec = spec("retry_fast");
    static SLOW: HandlerSpec = spec("retry_slow");
    static STUCK: HandlerSpec = spec("retry_stuck");

    #[test]
    fn before_any_body_finished_the_claims_age_is_the_estimate() {
        // just claimed: the floor
        assert_eq!(lease_hint(&FRESH, Duration::from_secs(30)), MIN_RETRY);
        // held 2 s: about 2 s more
        assert_eq!(
            lease_hint(&FRESH, Duration::from_secs(28)),
            Duration::from_secs(2)
        );
        // held 20 s: capped by the 10 s left of the lease
        assert_eq!(
            lease_hint(&FRESH, Duration::from_secs(10)),
            Duration::from_secs(10)
        );
    }

    #[test]
    fn fast_bodies_give_short_hints_whatever_the_lease() {
        for _ in 0..8 {
            body_finished(&FAST, Duration::from_micros(50));
        }
        assert_eq!(lease_hint(&FAST, Duration::from_millis(29_997)), MIN_RETRY);
    }

    #[test]
    fn a_claim_held_longer_than_usual_is_asked_about_less_and_less_often() {
        for _ in 0..8 {
            body_finished(&STUCK, Duration::from_millis(1));
        }
        for held in [1u64, 5, 9] {
            assert_eq!(
                lease_hint(&STUCK, Duration::from_secs(30 - held)),
                Duration::from_secs(held),
                "held {held} s"
            );
        }
    }

    #[test]
    fn slow_bodies_give_what_is_left_of_a_typical_body() {
        body_finished(&SLOW, Duration::from_secs(4));
        // held 1 s of a typical 4 s
        assert_eq!(
            lease_hint(&SLOW, Duration::from_secs(29)),
            Duration::from_secs(3)
        );
        // never past the lease's end
        assert_eq!(
            lease_hint(&SLOW, Duration::from_millis(5)),
            Duration::from_millis(5)
        );
    }
}
