//! When to redeliver a message whose key another consumer holds in lease
//! mode: the `retry_after` of [`Error::InProgress`](crate::Error::InProgress).
//!
//! The other claim's remaining lease is the latest moment that matters (then
//! the key can be taken over), but it is a poor hint: a body that takes
//! microseconds under a 30 s lease would send every duplicate away for half
//! a minute. The hint is when the other delivery's result is likely to be
//! recorded instead:
//!
//! * once bodies of this handler have finished in this process, the typical
//!   body time (a moving average) minus how long the other claim has been
//!   held;
//! * before that, as long again as the other claim has been held (its age,
//!   read off the lease: `lease - remaining`; a heartbeat renews the lease,
//!   so for long bodies this is the time since the last renewal);
//!
//! and in both cases at least [`MIN_RETRY`] and at most the remaining lease.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use crate::registry::HandlerSpec;

/// The shortest hint: a broker's redelivery costs more than this anyway.
pub(crate) const MIN_RETRY: Duration = Duration::from_millis(10);

/// Moving average of body times per handler name, in this process.
fn typical_bodies() -> &'static Mutex<HashMap<&'static str, Duration>> {
    static TYPICAL: OnceLock<Mutex<HashMap<&'static str, Duration>>> = OnceLock::new();
    TYPICAL.get_or_init(Default::default)
}

/// Notes how long one body of `spec` took.
pub(crate) fn body_finished(spec: &'static HandlerSpec, took: Duration) {
    let mut typical = typical_bodies()
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    typical
        .entry(spec.name)
        .and_modify(|avg| *avg = (*avg * 3 + took) / 4)
        .or_insert(took);
}

/// The redelivery hint for a key held by another claim with `lease_left`
/// of its lease remaining.
pub(crate) fn lease_hint(spec: &'static HandlerSpec, lease_left: Duration) -> Duration {
    let lease_left = lease_left.min(spec.lease);
    let held_for = spec.lease - lease_left;
    let typical = typical_bodies()
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .get(spec.name)
        .copied();
    let estimate = match typical {
        Some(typical) => typical.saturating_sub(held_for),
        None => held_for,
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
            module: "retry::tests",
            file: "retry.rs",
            line: 1,
        }
    }

    static FRESH: HandlerSpec = spec("retry_fresh");
    static FAST: HandlerSpec = spec("retry_fast");
    static SLOW: HandlerSpec = spec("retry_slow");

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
