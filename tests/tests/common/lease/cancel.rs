//! A lease-mode call whose caller drops it mid-body (a `timeout` around
//! the rewritten handler): what idem can still make safe.

use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_runtime::store::LeaseStore;
use idem_runtime::{Error, Outcome, metric};

use super::{DROPPED, Job, LeaseFixture, effect_then_wait};
use crate::common::Probe;
use crate::common::recorder::capture;

/// Runs [`effect_then_wait`] for `msg` on `store` under a caller's 1.9 s
/// timeout, which drops the call, and checks what every such drop gives:
/// the body took effect once, the drop is counted, and 2.5 s after the drop
/// (past the 4 s the renewal at 1 s would have lasted to, with a 3 s lease)
/// a delivery is still refused as in progress. Answers when the drop was.
async fn dropped_and_held<F: LeaseFixture, S: LeaseStore>(
    fx: &Arc<F>,
    store: &S,
    msg: &Job,
    probe: &Probe,
) -> Instant {
    let seen = capture();
    let counted = || {
        seen.sum(
            metric::BODIES_DROPPED,
            &[("handler", DROPPED), ("mode", "lease")],
        )
    };
    let before = counted();
    let cut = tokio::time::timeout(
        Duration::from_millis(1_900),
        effect_then_wait(store, msg, probe, &**fx),
    )
    .await;
    let dropped = Instant::now();
    assert!(cut.is_err(), "the caller gave up: {cut:?}");
    assert_eq!(fx.effects(&msg.id).await, 1, "the body took effect");
    assert!(counted() >= before + 1.0, "the drop is counted");

    tokio::time::sleep_until((dropped + Duration::from_millis(2_500)).into()).await;
    match effect_then_wait(store, msg, probe, &**fx).await {
        Err(Error::InProgress { .. }) => {}
        other => panic!("the key is held a whole lease from the drop, got {other:?}"),
    }
    assert_eq!(probe.runs(), 1);
    dropped
}

/// The caller gives up 1.9 s into a body that took effect and then waits,
/// with a 3 s lease renewed every second. The claim is not released, the
/// drop is counted, and the key is held a whole lease from the drop (see
/// [`dropped_and_held`]). Once that lease runs out, the next delivery runs
/// the body again: the window lease mode leaves to the downstream key.
pub(crate) async fn a_dropped_call_holds_its_key_a_whole_lease_from_the_drop<F: LeaseFixture>(
    fx: Arc<F>,
) {
    let probe = Probe::new();
    let msg = Job::new("dropped-1", 4);
    let dropped = dropped_and_held(&fx, fx.store(), &msg, &probe).await;

    tokio::time::sleep_until((dropped + Duration::from_millis(3_600)).into()).await;
    probe.open_gate();
    assert_eq!(
        effect_then_wait(fx.store(), &msg, &probe, &*fx)
            .await
            .expect("a delivery once the lease ran out"),
        Outcome::Executed(4)
    );
    assert_eq!(fx.effects("dropped-1").await, 2);
}

/// The body ends at once, but the store holds its completion, and the
/// caller gives up 1.9 s in, while the outcome is being recorded: the worst
/// drop of all, the effect surely happened. As for a drop in the body, the
/// drop is counted, the claim kept, and the key held a whole lease from the
/// drop (see [`dropped_and_held`]).
pub(crate) async fn a_call_dropped_while_recording_holds_its_key_a_whole_lease<F: LeaseFixture>(
    fx: Arc<F>,
) {
    let store = fx.lossy().await;
    let probe = Probe::new();
    // The body does not wait: its gate is open before it comes.
    probe.open_gate();
    store.stall_next_completion();
    dropped_and_held(&fx, &store, &Job::new("dropped-recording-1", 4), &probe).await;
}
