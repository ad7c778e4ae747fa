//! Lease mode on the in-memory store. The body's "external effect" is an
//! entry in the probe's list, so the tests can count effects as well as runs.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::lease::Job;
use common::{AppError, Probe, T0, Tally, assert_extended, together};
use idem_runtime::Status;
use idem_runtime::clock::ManualClock;
use idem_runtime::{Error, MemoryStore, Outcome, idempotent};

async fn body(msg: &Job, probe: &Probe) -> Result<u32, AppError> {
    probe.hit();
    if msg.park {
        probe.park().await;
    }
    if msg.fail {
        return Err(AppError::Refused(format!("job {} failed", msg.id)));
    }
    probe.see(format!("{}={}", msg.id, msg.value));
    Ok(msg.value)
}

/// How many effects the bodies had for `id`.
fn effects(probe: &Probe, id: &str) -> usize {
    let prefix = format!("{id}=");
    probe
        .seen()
        .iter()
        .filter(|e| e.starts_with(&prefix))
        .count()
}

const JOB: &str = "mem_job";

#[idempotent(
    key = "msg.id",
    ttl = "1h",
    lease = "1h",
    store = "memory",
    name = "mem_job"
)]
async fn job(msg: &Job, probe: &Probe) -> Result<u32, AppError> {
    body(msg, probe).await
}

#[idempotent(
    key = "msg.id",
    ttl = "1h",
    lease = "400ms",
    store = "memory",
    name = "mem_heartbeat"
)]
async fn short_lease_job(msg: &Job, probe: &Probe) -> Result<u32, AppError> {
    body(msg, probe).await
}

#[tokio::test]
async fn first_delivery_executes_and_records_completed() {
    let clock = ManualClock::new(T0);
    let store = MemoryStore::with_clock(clock.clone());
    let probe = Probe::new();
    let msg = Job::new("j-1", 7);

    assert_eq!(
        job(&store, &msg, &probe).await.unwrap(),
        Outcome::Executed(7)
    );
    assert_eq!(probe.runs(), 1);
    assert_eq!(probe.seen(), ["j-1=7"]);
    let rec = store.record(JOB, &msg.key()).unwrap();
    assert_eq!(rec.status, Status::Completed);
    assert_eq!(rec.outcome.as_deref(), Some("7"));
    assert_eq!(rec.attempts, 1);
    assert_eq!(rec.created_at_ms, T0);
    assert_eq!(rec.expires_at_ms, T0 + 3_600_000);
    assert_eq!(store.len(), 1);
}

#[tokio::test]
async fn duplicate_returns_recorded_outcome_without_running_the_body() {
    let store = MemoryStore::new();
    let probe = Probe::new();
    let msg = Job::new("j-2", 11);
    assert!(job(&store, &msg, &probe).await.unwrap().is_executed());
    for _ in 0..5 {
        assert_eq!(
            job(&store, &msg, &probe).await.unwrap(),
            Outcome::Duplicate(11)
        );
    }
    assert_eq!(
        job(&store, &Job::new("j-2", 99), &probe).await.unwrap(),
        Outcome::Duplicate(11)
    );
    assert_eq!(probe.runs(), 1);
    assert_eq!(effects(&probe, "j-2"), 1);
}

#[tokio::test]
async fn body_error_releases_the_claim_and_the_retry_executes() {
    let store = MemoryStore::new();
    let probe = Probe::new();
    let failing = Job {
        fail: true,
        ..Job::new("j-3", 5)
    };
    let err = job(&store, &failing, &probe).await.unwrap_err();
    assert!(
        matches!(&err, Error::Handler { handler: JOB, error: AppError::Refused(m), key } if m == "job j-3 failed" && *key == failing.key()),
        "{err:?}"
    );
    assert!(store.record(JOB, &failing.key()).is_none());
    assert!(store.is_empty());

    assert_eq!(
        job(&store, &Job::new("j-3", 5), &probe).await.unwrap(),
        Outcome::Executed(5)
    );
    assert_eq!(probe.runs(), 2);
    assert_eq!(effects(&probe, "j-3"), 1);
    let rec = store.record(JOB, &failing.key()).unwrap();
    assert_eq!((rec.status, rec.attempts), (Status::Completed, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_deliveries_of_one_message_execute_exactly_once() {
    const N: usize = 64;
    let store = MemoryStore::new();
    let probe = Probe::new();
    let msg = Arc::new(Job::new("j-4", 3));

    let results = together(N, |_| {
        let (store, probe, msg) = (store.clone(), Arc::clone(&probe), Arc::clone(&msg));
        async move { job(&store, &msg, &probe).await }
    })
    .await;

    let tally = Tally::of(results);
    eprintln!("{N} concurrent deliveries of one message (memory): {tally:?}");
    tally.assert_leased(1, N - 1);
    assert_eq!(probe.runs(), 1);
    assert_eq!(effects(&probe, "j-4"), 1);
    assert_eq!(store.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deliveries_while_the_body_runs_are_in_progress_then_duplicates() {
    const N: usize = 32;
    let store = MemoryStore::new();
    let probe = Probe::new();
    let first = {
        let (store, probe) = (store.clone(), Arc::clone(&probe));
        tokio::spawn(async move { job(&store, &Job::parked("j-5", 8), &probe).await })
    };
    probe.wait_parked().await;

    let during = together(N, |_| {
        let (store, probe) = (store.clone(), Arc::clone(&probe));
        async move { job(&store, &Job::new("j-5", 8), &probe).await }
    })
    .await;
    let tally = Tally::of(during);
    assert_eq!(tally.in_progress, N, "{tally:?}");

    probe.open_gate();
    assert_eq!(first.await.unwrap().unwrap(), Outcome::Executed(8));
    let after = together(N, |_| {
        let (store, probe) = (store.clone(), Arc::clone(&probe));
        async move { job(&store, &Job::new("j-5", 8), &probe).await }
    })
    .await;
    let tally = Tally::of(after);
    assert_eq!(tally.duplicate, N, "{tally:?}");
    assert_eq!(probe.runs(), 1);
    assert_eq!(effects(&probe, "j-5"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_distinct_messages_each_execute_exactly_once() {
    const MESSAGES: usize = 32;
    const COPIES: usize = 2;
    let store = MemoryStore::new();
    let probe = Probe::new();

    let results = together(MESSAGES * COPIES, |i| {
        let (store, probe) = (store.clone(), Arc::clone(&probe));
        let msg = Job::new(&format!("m-{}", i % MESSAGES), 1);
        async move { job(&store, &msg, &probe).await }
    })
    .await;

    let tally = Tally::of(results);
    eprintln!("{MESSAGES} messages x {COPIES} concurrent copies (memory): {tally:?}");
    tally.assert_leased(MESSAGES, MESSAGES * (COPIES - 1));
    assert_eq!(probe.runs(), MESSAGES);
    for m in 0..MESSAGES {
        assert_eq!(effects(&probe, &format!("m-{m}")), 1, "message m-{m}");
    }
    assert_eq!(store.len(), MESSAGES);
}

#[tokio::test]
async fn after_the_ttl_the_key_runs_again() {
    let clock = ManualClock::new(T0);
    let store = MemoryStore::with_clock(clock.clone());
    let probe = Probe::new();
    let msg = Job::new("j-6", 4);

    assert!(job(&store, &msg, &probe).await.unwrap().is_executed());
    clock.advance(Duration::from_millis(3_600_000 - 1));
    assert_eq!(
        job(&store, &msg, &probe).await.unwrap(),
        Outcome::Duplicate(4)
    );
    clock.advance(Duration::from_millis(1));
    assert_eq!(
        job(&store, &msg, &probe).await.unwrap(),
        Outcome::Executed(4)
    );
    assert_eq!(probe.runs(), 2);
    assert_eq!(effects(&probe, "j-6"), 2);
    let rec = store.record(JOB, &msg.key()).unwrap();
    assert_eq!(
        (rec.status, rec.attempts, rec.created_at_ms),
        (Status::Completed, 1, T0 + 3_600_000)
    );
    assert_eq!(store.len(), 1);
}

#[tokio::test]
async fn in_progress_reports_what_is_left_of_the_lease() {
    let clock = ManualClock::new(T0);
    let store = MemoryStore::with_clock(clock.clone());
    let probe = Probe::new();
    let first = {
        let (store, probe) = (store.clone(), Arc::clone(&probe));
        tokio::spawn(async move { job(&store, &Job::parked("j-7", 1), &probe).await })
    };
    probe.wait_parked().await;
    let rec = store.record(JOB, &Job::new("j-7", 1).key()).unwrap();
    assert_eq!((rec.status, rec.outcome), (Status::InProgress, None));
    assert_eq!(rec.expires_at_ms, T0 + 3_600_000);

    clock.advance(Duration::from_secs(600));
    match job(&store, &Job::new("j-7", 1), &probe).await {
        Err(Error::InProgress {
            retry_after,
            handler: JOB,
            ..
        }) => {
            // held 600 s of an hour's lease: at most as long again
            assert!(retry_after <= Duration::from_secs(600), "{retry_after:?}");
            assert!(retry_after >= Duration::from_millis(10), "{retry_after:?}");
        }
        other => panic!("expected InProgress, got {other:?}"),
    }
    probe.open_gate();
    assert_eq!(first.await.unwrap().unwrap(), Outcome::Executed(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_lease_is_taken_over_and_the_stale_completion_is_lease_lost() {
    let clock = ManualClock::new(T0);
    let store = MemoryStore::with_clock(clock.clone());
    let probe = Probe::new();
    let key = Job::new("j-8", 0).key();

    let a = {
        let (store, probe) = (store.clone(), Arc::clone(&probe));
        tokio::spawn(async move { job(&store, &Job::parked("j-8", 1), &probe).await })
    };
    probe.wait_parked().await;
    let b = job(&store, &Job::new("j-8", 2), &probe).await;
    assert!(matches!(b, Err(Error::InProgress { .. })), "{b:?}");

    clock.advance(Duration::from_secs(3_600));
    assert_eq!(
        job(&store, &Job::new("j-8", 2), &probe).await.unwrap(),
        Outcome::Executed(2)
    );
    let rec = store.record(JOB, &key).unwrap();
    assert_eq!(
        (rec.status, rec.outcome.as_deref(), rec.attempts),
        (Status::Completed, Some("2"), 2)
    );

    probe.open_gate();
    match a.await.unwrap() {
        Err(Error::LeaseLost { handler, key: k }) => {
            assert_eq!(handler, JOB);
            assert_eq!(k, key);
        }
        other => panic!("expected LeaseLost, got {other:?}"),
    }
    let rec = store.record(JOB, &key).unwrap();
    assert_eq!(
        (rec.status, rec.outcome.as_deref()),
        (Status::Completed, Some("2"))
    );
    assert_eq!(store.len(), 1);
    assert_eq!(
        job(&store, &Job::new("j-8", 3), &probe).await.unwrap(),
        Outcome::Duplicate(2)
    );
    assert_eq!(probe.runs(), 2);
    assert_eq!(effects(&probe, "j-8"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_failure_after_a_takeover_does_not_release_the_new_claim() {
    let clock = ManualClock::new(T0);
    let store = MemoryStore::with_clock(clock.clone());
    let (probe_a, probe_c) = (Probe::new(), Probe::new());
    let key = Job::new("j-9", 0).key();

    let a = {
        let (store, probe) = (store.clone(), Arc::clone(&probe_a));
        let msg = Job {
            fail: true,
            ..Job::parked("j-9", 1)
        };
        tokio::spawn(async move { job(&store, &msg, &probe).await })
    };
    probe_a.wait_parked().await;
    clock.advance(Duration::from_secs(3_601));
    let c = {
        let (store, probe) = (store.clone(), Arc::clone(&probe_c));
        tokio::spawn(async move { job(&store, &Job::parked("j-9", 3), &probe).await })
    };
    probe_c.wait_parked().await;

    probe_a.open_gate();
    let a = a.await.unwrap();
    assert!(matches!(&a, Err(Error::Handler { .. })), "{a:?}");
    let rec = store
        .record(JOB, &key)
        .expect("A's stale release deleted C's claim");
    assert_eq!((rec.status, rec.attempts), (Status::InProgress, 2));
    let d = job(&store, &Job::new("j-9", 4), &probe_a).await;
    assert!(matches!(d, Err(Error::InProgress { .. })), "{d:?}");

    probe_c.open_gate();
    assert_eq!(c.await.unwrap().unwrap(), Outcome::Executed(3));
    assert_eq!(
        job(&store, &Job::new("j-9", 5), &probe_a).await.unwrap(),
        Outcome::Duplicate(3)
    );
    assert_eq!((probe_a.runs(), probe_c.runs()), (1, 1));
    assert_eq!(probe_c.seen(), ["j-9=3"]);
    assert!(probe_a.seen().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeat_keeps_a_long_body_s_lease_alive() {
    let store = MemoryStore::new();
    let probe = Probe::new();
    let key = Job::new("j-10", 0).key();
    let a = {
        let (store, probe) = (store.clone(), Arc::clone(&probe));
        tokio::spawn(async move { short_lease_job(&store, &Job::parked("j-10", 1), &probe).await })
    };
    probe.wait_parked().await;
    let parked_at = Instant::now();
    let claimed = store.record("mem_heartbeat", &key).unwrap();

    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let b = short_lease_job(&store, &Job::new("j-10", 2), &probe).await;
    assert!(
        matches!(b, Err(Error::InProgress { .. })),
        "a second consumer took over a lease the heartbeat should keep: {b:?}"
    );
    let rec = store.record("mem_heartbeat", &key).unwrap();
    assert_extended(&rec, &claimed);

    probe.open_gate();
    assert_eq!(a.await.unwrap().unwrap(), Outcome::Executed(1));
    assert!(parked_at.elapsed() >= Duration::from_millis(1_000));
    assert_eq!(probe.runs(), 1);
    let rec = store.record("mem_heartbeat", &key).unwrap();
    assert_eq!(
        (rec.status, rec.outcome.as_deref()),
        (Status::Completed, Some("1"))
    );
}

/// The handler's result today; an earlier deployment recorded it as a plain
/// string (`"points-v1"`), which this type no longer reads.
#[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
struct Points {
    points: u32,
}

#[idempotent(key = "msg.id", ttl = "1h", store = "memory", name = "mem_points")]
async fn grant_points(msg: &Job, probe: &Probe) -> Result<Points, AppError> {
    probe.hit();
    Ok(Points { points: msg.value })
}

#[tokio::test]
async fn stored_outcome_that_no_longer_decodes_is_a_codec_error() {
    use idem_runtime::{Claim, LeaseStore};

    let store = MemoryStore::new();
    let probe = Probe::new();
    let msg = Job::new("j-11", 6);
    // The record the earlier deployment left.
    let spec = idem_runtime::registry::find("mem_points").expect("registered");
    let Claim::Acquired { token } = store.claim(spec, &msg.key()).await.unwrap() else {
        panic!("a fresh key")
    };
    assert!(
        store
            .complete(spec, &msg.key(), &token, "\"points-v1\"")
            .await
            .unwrap()
    );

    let err = grant_points(&store, &msg, &probe).await.unwrap_err();
    assert!(
        matches!(&err, Error::Codec { handler: "mem_points", key, .. } if *key == msg.key()),
        "{err:?}"
    );
    assert_eq!(probe.runs(), 0, "a codec failure must not run the body");
}

#[derive(Debug)]
struct Sms {
    phone: Option<String>,
    template: &'static str,
}

#[idempotent(
    key = "msg.template + msg.phone",
    ttl = "1h",
    store = "memory",
    name = "mem_sms"
)]
async fn send_sms(msg: &Sms, probe: &Probe) -> Result<(), AppError> {
    probe.hit();
    Ok(())
}

#[tokio::test]
async fn none_key_part_is_key_missing_and_the_body_does_not_run() {
    let store = MemoryStore::new();
    let probe = Probe::new();
    let msg = Sms {
        phone: None,
        template: "welcome",
    };
    let err = send_sms(&store, &msg, &probe).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::KeyMissing {
                handler: "mem_sms",
                part: "msg.phone"
            }
        ),
        "{err:?}"
    );
    assert!(err.key().is_none());
    assert_eq!(probe.runs(), 0);
    assert!(store.is_empty());

    let msg = Sms {
        phone: Some("+100".into()),
        ..msg
    };
    assert!(send_sms(&store, &msg, &probe).await.unwrap().is_executed());
    assert!(send_sms(&store, &msg, &probe).await.unwrap().is_duplicate());
    assert_eq!(probe.runs(), 1);
}

/// A result whose `Serialize` writes what its `Deserialize` refuses.
#[derive(Debug, PartialEq, serde::Deserialize)]
struct Lopsided {
    points: u32,
}

impl serde::Serialize for Lopsided {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str("points-v1")
    }
}

#[idempotent(key = "msg.id", ttl = "1h", store = "memory", name = "mem_lopsided")]
async fn grant_lopsided(msg: &Job, probe: &Probe) -> Result<Lopsided, AppError> {
    probe.hit();
    Ok(Lopsided { points: msg.value })
}

/// A value that would not read back is refused when recording, never
/// written: the call is `Unrecordable` naming what serde said, the claim is
/// kept without an outcome (the body's effect happened), and a duplicate
/// meanwhile is `InProgress`, not a record it cannot read.
#[tokio::test]
async fn an_outcome_that_would_not_read_back_is_unrecordable_and_the_claim_is_kept() {
    let store = MemoryStore::new();
    let probe = Probe::new();
    let msg = Job::new("j-12", 6);
    let err = grant_lopsided(&store, &msg, &probe).await.unwrap_err();
    match &err {
        Error::Unrecordable {
            handler: "mem_lopsided",
            key,
            source,
        } => {
            assert_eq!(*key, msg.key());
            assert!(
                source.to_string().contains("would not read back"),
                "{source}"
            );
        }
        other => panic!("expected Unrecordable, got {other:?}"),
    }
    let rec = store.record("mem_lopsided", &msg.key()).unwrap();
    assert_eq!((rec.status, rec.outcome), (Status::InProgress, None));
    assert!(matches!(
        grant_lopsided(&store, &msg, &probe).await,
        Err(Error::InProgress { .. })
    ));
    assert_eq!(probe.runs(), 1);
}
