//! The lease suite's scenarios about a lease: what is left of it, the ttl
//! running out, a lease taken over and the stale holder's completion or
//! failure, lost replies, and heartbeats.

use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_runtime::store::Status;
use idem_runtime::{Error, Outcome};

use super::{
    HINT, JOB, Job, LOST_REPLY_VALUE, LeaseFixture, Moves, SHORT_LEASE, SHORT_TTL, Token,
    assert_expires_in, assert_extended, hint_job, job, ms, short_lease_job, short_ttl_job,
    spawn_job,
};
use crate::common::{Probe, eventually};

/// A delivery that finds a live claim learns what is left of its lease
/// (the record's expiry), and gets a redelivery hint of what the claim has
/// held so far: no body of this handler has finished yet to suggest less.
pub(crate) async fn in_progress_reports_what_is_left_of_the_lease<F: LeaseFixture>(fx: Arc<F>) {
    let probe = Probe::new();
    let msg = Job::new("j-7", 1);
    let first = {
        let (fx, probe) = (Arc::clone(&fx), Arc::clone(&probe));
        tokio::spawn(
            async move { hint_job(fx.store(), &Job::parked("j-7", 1), &probe, &*fx).await },
        )
    };
    probe.wait_parked().await;
    let rec = fx.record(HINT, &msg.key()).await.expect("the claim");
    assert_eq!(
        (rec.status, rec.outcome.as_deref()),
        (Status::InProgress, None)
    );
    assert_expires_in(&*fx, &rec, Duration::from_secs(3_600)).await;
    let token = fx.token(HINT, &msg.key()).await;
    assert_ne!(token, Token::Shown(None), "a claim without a fencing token");

    fx.advance(Duration::from_millis(200)).await;
    let err = hint_job(fx.store(), &msg, &probe, &*fx).await.unwrap_err();
    // What the claim had held when the call returned: on a manual clock
    // exactly the 200 ms; Redis counts whole milliseconds (1 ms of slack).
    let held = Duration::from_millis(u64::try_from(fx.now_ms().await - rec.created_at_ms).unwrap());
    match err {
        Error::InProgress {
            retry_after,
            handler: HINT,
            key,
        } => {
            assert_eq!(key, msg.key());
            let least = Duration::from_millis(200)
                .saturating_sub(fx.slack())
                .max(Duration::from_millis(10));
            assert!(
                (least..=held + Duration::from_millis(1)).contains(&retry_after),
                "{retry_after:?}, held {held:?}"
            );
        }
        other => panic!("expected InProgress, got {other:?}"),
    }
    probe.open_gate();
    assert_eq!(first.await.unwrap().unwrap(), Outcome::Executed(1));
    assert_eq!(probe.runs(), 1);
}

/// A completed record suppresses its key until its ttl (1 s) is over, then
/// the key runs again as a new window. On a manual clock the boundary is
/// exact: a duplicate one millisecond before, a new run at the ttl.
pub(crate) async fn after_the_ttl_the_key_runs_again<F: LeaseFixture>(fx: Arc<F>) {
    let probe = Probe::new();
    let msg = Job::new("j-6", 4);
    let out = short_ttl_job(fx.store(), &msg, &probe, &*fx).await.unwrap();
    assert!(out.is_executed());
    let first = fx.record(SHORT_TTL, &msg.key()).await.unwrap();
    assert_expires_in(&*fx, &first, Duration::from_secs(1)).await;
    assert_eq!(
        short_ttl_job(fx.store(), &msg, &probe, &*fx).await.unwrap(),
        Outcome::Duplicate(4)
    );

    // Just before the ttl (by the slack): still a duplicate.
    let left =
        Duration::from_millis(u64::try_from(first.expires_at_ms - fx.now_ms().await).unwrap());
    let slack = fx.slack();
    fx.advance(left - Duration::from_millis(1) - slack).await;
    assert_eq!(
        short_ttl_job(fx.store(), &msg, &probe, &*fx).await.unwrap(),
        Outcome::Duplicate(4)
    );
    // At the ttl (past it by the slack) the record stops suppressing the key.
    fx.advance(Duration::from_millis(1) + 2 * slack).await;
    if F::DELETES_EXPIRED {
        assert_eq!(
            fx.record(SHORT_TTL, &msg.key()).await,
            None,
            "the record outlived its ttl"
        );
    }
    assert_eq!(
        short_ttl_job(fx.store(), &msg, &probe, &*fx).await.unwrap(),
        Outcome::Executed(4)
    );
    assert_eq!(probe.runs(), 2);
    assert_eq!(fx.effects("j-6").await, 2);

    // The new window starts now, with one record and a fresh attempt count.
    let second = fx.record(SHORT_TTL, &msg.key()).await.unwrap();
    assert_eq!((second.status, second.attempts), (Status::Completed, 1));
    assert!(
        (first.expires_at_ms..=fx.now_ms().await).contains(&second.created_at_ms),
        "{first:?} {second:?}"
    );
    assert_eq!(fx.records().await, 1);
}

/// A stalled body loses its lease to another consumer: A claims and parks;
/// while its lease holds B is turned away; the lease runs out (see
/// [`LeaseFixture::run_out_lease`]) and B takes the key over and completes.
/// When A's body finishes, its completion carries a stale token:
/// `LeaseLost`, and B's outcome is the one recorded, kept for the ttl.
pub(crate) async fn expired_lease_is_taken_over_and_the_stale_completion_is_lease_lost<
    F: LeaseFixture,
>(
    fx: Arc<F>,
) {
    let probe = Probe::new();
    let key = Job::new("j-8", 0).key();
    let a = spawn_job(&fx, &probe, Job::parked("j-8", 1));
    probe.wait_parked().await;
    let token_a = fx.token(JOB, &key).await;

    let b = job(fx.store(), &Job::new("j-8", 2), &probe, &*fx).await;
    assert!(matches!(b, Err(Error::InProgress { .. })), "{b:?}");

    fx.run_out_lease(JOB, &key).await;
    let b = job(fx.store(), &Job::new("j-8", 2), &probe, &*fx).await;
    assert_eq!(b.unwrap(), Outcome::Executed(2), "B takes the key over");
    let rec = fx.record(JOB, &key).await.unwrap();
    assert_eq!(
        (rec.status, rec.outcome.as_deref()),
        (Status::Completed, Some("2"))
    );
    let attempts = if F::COUNTS_TAKEOVERS { 2 } else { 1 };
    assert_eq!(rec.attempts, attempts, "one claim plus one takeover");

    // A finishes late: its result is not recorded.
    probe.open_gate();
    match a.await.unwrap() {
        Err(Error::LeaseLost { handler, key: k }) => {
            assert_eq!(handler, JOB);
            assert_eq!(k, key);
        }
        other => panic!("expected LeaseLost, got {other:?}"),
    }
    // Exactly one completion stands: B's, kept for the ttl, under B's token.
    let rec = fx.record(JOB, &key).await.unwrap();
    assert_eq!(
        (rec.status, rec.outcome.as_deref()),
        (Status::Completed, Some("2"))
    );
    if token_a != Token::Hidden {
        assert_ne!(fx.token(JOB, &key).await, token_a, "A's token stands");
    }
    assert_expires_in(&*fx, &rec, Duration::from_secs(3_600)).await;
    assert_eq!(fx.records().await, 1);
    for value in [3, 4] {
        assert_eq!(
            job(fx.store(), &Job::new("j-8", value), &probe, &*fx)
                .await
                .unwrap(),
            Outcome::Duplicate(2)
        );
    }
    // Both bodies ran: that is what LeaseLost warns about.
    assert_eq!(probe.runs(), 2);
    assert_eq!(fx.effects("j-8").await, 2);
}

/// As above, but B's body returns what A's does, so the record holds the
/// very bytes A's completion carries: A's completion is still
/// `LeaseLost`, since the record is B's (another token), not A's.
pub(crate) async fn a_takeover_recording_the_same_outcome_leaves_the_stale_completion_lease_lost<
    F: LeaseFixture,
>(
    fx: Arc<F>,
) {
    let probe = Probe::new();
    let key = Job::new("same-1", 0).key();
    let a = spawn_job(&fx, &probe, Job::parked("same-1", 5));
    probe.wait_parked().await;
    let token_a = fx.token(JOB, &key).await;
    fx.run_out_lease(JOB, &key).await;
    let b = job(fx.store(), &Job::new("same-1", 5), &probe, &*fx).await;
    assert_eq!(b.unwrap(), Outcome::Executed(5), "B takes the key over");
    let token_b = fx.token(JOB, &key).await;

    probe.open_gate();
    let a = a.await.unwrap();
    assert!(
        matches!(&a, Err(Error::LeaseLost { handler: JOB, key: k }) if *k == key),
        "expected LeaseLost for A, got {a:?}"
    );
    let rec = fx.record(JOB, &key).await.unwrap();
    assert_eq!(
        (rec.status, rec.outcome.as_deref()),
        (Status::Completed, Some("5"))
    );
    assert_eq!(fx.token(JOB, &key).await, token_b, "B's record stands");
    if token_a != Token::Hidden {
        assert_ne!(token_a, token_b);
    }
    assert_eq!(probe.runs(), 2);
    assert_eq!(fx.effects("same-1").await, 2);
}

/// The store writes a completion and its reply is lost (the connection
/// drops after the write; see [`Lossy`]); the runtime sends the completion
/// again, which finds the record completed by its own token: the call is
/// `Executed`, not `LeaseLost`, and the outcome stands for the ttl. On the
/// stores with a server the connection really drops.
pub(crate) async fn a_completion_whose_reply_was_lost_is_executed_not_lease_lost<
    F: LeaseFixture,
>(
    fx: Arc<F>,
) {
    let lossy = fx.lossy().await;
    let probe = Probe::new();
    // A first call on the link: whatever a store loads or prepares once,
    // it has, so the lost reply is the completion's own.
    let warm = Job::new("lost-0", 1);
    assert_eq!(
        job(&lossy, &warm, &probe, &*fx).await.unwrap(),
        Outcome::Executed(1)
    );

    lossy.lose_next_completion();
    let msg = Job::new("lost-1", LOST_REPLY_VALUE);
    let out = job(&lossy, &msg, &probe, &*fx).await;
    assert_eq!(lossy.lost(), 1, "the completion's reply was not lost");
    eprintln!(
        "a completion's reply lost ({}): {out:?}",
        if lossy.is_real() {
            "the connection dropped"
        } else {
            "simulated"
        }
    );
    assert_eq!(out.unwrap(), Outcome::Executed(LOST_REPLY_VALUE));
    let rec = fx.record(JOB, &msg.key()).await.expect("a record");
    assert_eq!(rec.status, Status::Completed, "{rec:?}");
    assert_eq!(rec.outcome, Some(LOST_REPLY_VALUE.to_string()));
    assert_expires_in(&*fx, &rec, Duration::from_secs(3_600)).await;
    // Redeliveries, through either store, are duplicates.
    let again = job(&lossy, &msg, &probe, &*fx).await;
    assert_eq!(again.unwrap(), Outcome::Duplicate(LOST_REPLY_VALUE));
    let again = job(fx.store(), &msg, &probe, &*fx).await;
    assert_eq!(again.unwrap(), Outcome::Duplicate(LOST_REPLY_VALUE));
    assert_eq!(probe.runs(), 2);
    assert_eq!(fx.effects("lost-1").await, 1);
}

/// A's lease runs out while its body is stalled, but nobody takes the key
/// over: when A finishes, its completion is recorded, because the body's
/// effect happened and a redelivery must not repeat it.
pub(crate) async fn a_late_completion_nobody_overtook_is_recorded<F: LeaseFixture>(fx: Arc<F>) {
    let probe = Probe::new();
    let key = Job::new("late-1", 0).key();
    let a = spawn_job(&fx, &probe, Job::parked("late-1", 1));
    probe.wait_parked().await;
    fx.run_out_lease(JOB, &key).await;
    match fx.record(JOB, &key).await {
        None => assert!(F::DELETES_EXPIRED, "the claim vanished"),
        Some(rec) => {
            assert!(!F::DELETES_EXPIRED, "Redis kept an expired lease: {rec:?}");
            assert!(
                rec.expires_at_ms <= fx.now_ms().await,
                "the lease ran out: {rec:?}"
            );
        }
    }

    probe.open_gate();
    assert_eq!(a.await.unwrap().unwrap(), Outcome::Executed(1));
    let rec = fx.record(JOB, &key).await.unwrap();
    assert_eq!(
        (rec.status, rec.outcome.as_deref()),
        (Status::Completed, Some("1"))
    );
    assert_expires_in(&*fx, &rec, Duration::from_secs(3_600)).await;
    assert_eq!(
        job(fx.store(), &Job::new("late-1", 9), &probe, &*fx)
            .await
            .unwrap(),
        Outcome::Duplicate(1)
    );
    assert_eq!(probe.runs(), 1);
    assert_eq!(fx.effects("late-1").await, 1);
}

/// The fencing token also guards release: A's lease runs out, C takes the
/// key over and is still running when A's body fails. A's release carries
/// its stale token and must leave C's claim alone.
pub(crate) async fn stale_failure_after_a_takeover_does_not_release_the_new_claim<
    F: LeaseFixture,
>(
    fx: Arc<F>,
) {
    let (probe_a, probe_c) = (Probe::new(), Probe::new());
    let key = Job::new("j-9", 0).key();
    let failing = Job {
        fail: true,
        ..Job::parked("j-9", 1)
    };
    let a = spawn_job(&fx, &probe_a, failing);
    probe_a.wait_parked().await;
    fx.run_out_lease(JOB, &key).await;

    // C takes the expired lease over and parks, so its claim is in
    // progress when A fails.
    let c = spawn_job(&fx, &probe_c, Job::parked("j-9", 3));
    probe_c.wait_parked().await;
    let token_c = fx.token(JOB, &key).await;

    probe_a.open_gate();
    let a = a.await.unwrap();
    assert!(
        matches!(&a, Err(Error::Handler { .. })),
        "expected A's own Handler error, got {a:?}"
    );
    let rec = fx
        .record(JOB, &key)
        .await
        .expect("A's stale release deleted C's claim");
    let attempts = if F::COUNTS_TAKEOVERS { 2 } else { 1 };
    assert_eq!((rec.status, rec.attempts), (Status::InProgress, attempts));
    assert_eq!(fx.token(JOB, &key).await, token_c, "C's claim stands");
    let d = job(fx.store(), &Job::new("j-9", 4), &probe_a, &*fx).await;
    assert!(matches!(d, Err(Error::InProgress { .. })), "{d:?}");

    probe_c.open_gate();
    assert_eq!(c.await.unwrap().unwrap(), Outcome::Executed(3));
    assert_eq!(
        job(fx.store(), &Job::new("j-9", 5), &probe_a, &*fx)
            .await
            .unwrap(),
        Outcome::Duplicate(3)
    );
    assert_eq!((probe_a.runs(), probe_c.runs()), (1, 1));
    assert_eq!(fx.effects("j-9").await, 1, "only C's effect happened");
}

/// The heartbeat for real: a body parked well past two 400 ms leases keeps
/// its claim (extended every 133 ms), so a second consumer is turned away,
/// and the first completes.
pub(crate) async fn heartbeat_keeps_a_long_body_s_lease_alive<F: LeaseFixture>(fx: Arc<F>) {
    let probe = Probe::new();
    let key = Job::new("j-10", 0).key();
    let a = {
        let (fx, probe) = (Arc::clone(&fx), Arc::clone(&probe));
        tokio::spawn(async move {
            short_lease_job(fx.store(), &Job::parked("j-10", 1), &probe, &*fx).await
        })
    };
    probe.wait_parked().await;
    let parked_at = Instant::now();
    let claimed = fx.record(SHORT_LEASE, &key).await.unwrap();

    // Well past two leases: without the heartbeat the key would be free.
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    match short_lease_job(fx.store(), &Job::new("j-10", 2), &probe, &*fx).await {
        Err(Error::InProgress { retry_after, .. }) => {
            assert!(retry_after <= Duration::from_millis(400), "{retry_after:?}");
        }
        other => panic!("a second consumer took over a lease the heartbeat should keep: {other:?}"),
    }
    let rec = fx.record(SHORT_LEASE, &key).await.unwrap();
    assert_extended(&rec, &claimed);

    probe.open_gate();
    assert_eq!(a.await.unwrap().unwrap(), Outcome::Executed(1));
    assert!(parked_at.elapsed() >= Duration::from_millis(1_000));
    assert_eq!(probe.runs(), 1);
    assert_eq!(fx.effects("j-10").await, 1);
    let rec = fx.record(SHORT_LEASE, &key).await.unwrap();
    assert_eq!(
        (rec.status, rec.outcome.as_deref()),
        (Status::Completed, Some("1"))
    );
}

/// The heartbeat extends the lease from the store's time: with the time
/// moved past the lease (a manual clock, or the database's shifted), the
/// next beat (a third of the lease later, in real time) renews it from the
/// new time, and no other consumer can take the key over. Only for stores
/// whose time a test moves.
pub(crate) async fn heartbeat_renews_the_lease_from_the_store_s_clock<F: LeaseFixture>(fx: Arc<F>) {
    assert!(
        !matches!(fx.time(), Moves::Real),
        "a store whose time the test moves"
    );
    let t0 = fx.now_ms().await;
    let slack = ms(fx.slack());
    let probe = Probe::new();
    let key = Job::new("j-12", 0).key();
    let a = {
        let (fx, probe) = (Arc::clone(&fx), Arc::clone(&probe));
        tokio::spawn(async move {
            short_lease_job(fx.store(), &Job::parked("j-12", 1), &probe, &*fx).await
        })
    };
    probe.wait_parked().await;
    let rec = fx.record(SHORT_LEASE, &key).await.unwrap();
    // Exactly t0 on a manual clock; where real time runs, beats may already
    // have renewed the lease, each from its own now.
    assert!(
        (t0..=t0 + slack).contains(&rec.created_at_ms),
        "t0 {t0}: {rec:?}"
    );
    assert_eq!(rec.expires_at_ms, rec.updated_at_ms + 400, "{rec:?}");

    // The claim's lease is over on the store's time...
    fx.advance(Duration::from_millis(1_000)).await;
    // ...until the next beat renews it from the new time.
    eventually(
        Duration::from_secs(2),
        "a heartbeat at the new time",
        || async {
            let rec = fx.record(SHORT_LEASE, &key).await.unwrap();
            rec.updated_at_ms >= t0 + 1_000
        },
    )
    .await;
    let rec = fx.record(SHORT_LEASE, &key).await.unwrap();
    let now = fx.now_ms().await;
    assert!(
        (t0 + 1_000..=now).contains(&rec.updated_at_ms),
        "t0 {t0}, now {now}: {rec:?}"
    );
    assert_eq!(rec.expires_at_ms, rec.updated_at_ms + 400, "{rec:?}");
    match short_lease_job(fx.store(), &Job::new("j-12", 2), &probe, &*fx).await {
        Err(Error::InProgress { retry_after, .. }) => {
            assert!(retry_after <= Duration::from_millis(400), "{retry_after:?}");
        }
        other => panic!("a second consumer took over a renewed lease: {other:?}"),
    }
    let rec = fx.record(SHORT_LEASE, &key).await.unwrap();
    assert_eq!(rec.attempts, 1, "no takeover happened");

    probe.open_gate();
    assert_eq!(a.await.unwrap().unwrap(), Outcome::Executed(1));
    assert_eq!(probe.runs(), 1);
    assert_eq!(fx.effects("j-12").await, 1);
}
