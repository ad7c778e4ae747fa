//! Lease mode on Redis: the lease suite (`common/lease.rs`) against the
//! server of `REDIS_URL` (default 127.0.0.1:6379), each test under a key
//! prefix of its own that is deleted afterwards; and a restart of a
//! throw-away `redis-server` in the middle of a run.

use crate::common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::lease::{self, Job};
use common::{AppError, RedisFx, eventually};
use idem_runtime::{Error, Outcome, RedisStore, idempotent};
use idem_tests::{RedisServer, or_skip};
use tokio::sync::Semaphore;

common::lease::suite!(RedisFx);

/// One `#[tokio::test]` per store-level scenario, on a fixture of its own.
macro_rules! store_tests {
    ($($scenario:ident,)*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $scenario() {
                let fx = or_skip!(RedisFx::single(stringify!($scenario)).await);
                common::redis_store::$scenario(&fx).await;
            }
        )*
    };
}

common::redis_store::redis_store_scenarios!(store_tests! {});

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_prefix_guard_deletes_the_test_s_keys() {
    let prefix = idem_tests::unique_prefix("rl_guard");
    let guard = idem_tests::DeleteKeys::new(&idem_tests::redis_url(), &prefix);
    let store = or_skip!(idem_tests::redis_store(&prefix).await);
    let fx = or_skip!(RedisFx::single("rl_guard_fx").await);
    let probe = common::Probe::new();
    // The handler's effect goes to `fx`'s prefix; its record to `store`'s.
    let msg = Job::new("g-1", 1);
    let out = lease::job(&store, &msg, &probe, &fx).await;
    assert_eq!(out.unwrap(), Outcome::Executed(1));
    assert_eq!(
        guard.keys().unwrap(),
        [store.redis_key(lease::JOB, &msg.key())]
    );
    drop(guard);
    let after = idem_tests::DeleteKeys::new(&idem_tests::redis_url(), &prefix);
    assert_eq!(after.keys().unwrap(), Vec::<String>::new());
}

// ---------------------------------------------------------------------------
// Redis restarted in the middle of a run
// ---------------------------------------------------------------------------

/// How often each message's body ran, in the consumer's process.
#[derive(Debug, Default)]
struct Runs(Mutex<HashMap<String, usize>>);

impl Runs {
    fn of(&self, id: &str) -> usize {
        self.0.lock().unwrap().get(id).copied().unwrap_or(0)
    }
}

#[idempotent(key = "msg.id", ttl = "1h", store = "redis", name = "redis_restart")]
async fn deliver(msg: &Job, runs: &Runs) -> Result<u32, AppError> {
    *runs.0.lock().unwrap().entry(msg.id.clone()).or_default() += 1;
    Ok(msg.value)
}

/// One call of the consumer loop.
#[derive(Debug)]
struct Call {
    took: Duration,
    result: Result<Outcome<u32>, Error<AppError>>,
}

/// A consumer delivers a stream of messages while its Redis is killed
/// (SIGKILL) and restarted on the same port. While Redis is down every call
/// fails with a typed `Error::Store` within the 2 s command timeout (no
/// panic, no hang); once it is back the same store recovers by itself.
///
/// The throw-away server keeps nothing on disk (`--save "" --appendonly
/// no`), so the restarted Redis has forgotten every record: a message
/// delivered before the restart runs again after it. That is what the
/// store's docs warn about; a dedup Redis wants `appendonly yes`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restarted_mid_run_fails_calls_with_store_errors_then_recovers() {
    let server = or_skip!(RedisServer::start());
    let store = RedisStore::connect(&server.url())
        .await
        .expect("connect to the throw-away server");
    let runs = Arc::new(Runs::default());

    let before = Job::new("r-0", 1);
    assert_eq!(
        deliver(&store, &before, &runs).await.unwrap(),
        Outcome::Executed(1)
    );
    assert_eq!(
        deliver(&store, &before, &runs).await.unwrap(),
        Outcome::Duplicate(1)
    );

    // The consumer loop: a fresh message every 10 ms until told to stop.
    let calls = Arc::new(Mutex::new(Vec::<Call>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let consumer = {
        let (store, runs, calls, stop) = (
            store.clone(),
            Arc::clone(&runs),
            Arc::clone(&calls),
            Arc::clone(&stop),
        );
        tokio::spawn(async move {
            let mut i = 0u32;
            while !stop.load(Ordering::SeqCst) {
                let msg = Job::new(&format!("loop-{i}"), i);
                let start = Instant::now();
                let result = deliver(&store, &msg, &runs).await;
                calls.lock().unwrap().push(Call {
                    took: start.elapsed(),
                    result,
                });
                i += 1;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    let count = |ok: bool| {
        calls
            .lock()
            .unwrap()
            .iter()
            .filter(|c| c.result.is_ok() == ok)
            .count()
    };

    eventually(
        Duration::from_secs(5),
        "5 calls before the kill",
        || async { count(true) >= 5 },
    )
    .await;
    let mut server = server;
    server.kill();
    let killed = Instant::now();
    eventually(
        Duration::from_secs(10),
        "3 failed calls while Redis is down",
        || async { count(false) >= 3 },
    )
    .await;
    let down_for = killed.elapsed();
    let ok_before_restart = count(true);
    let server = tokio::task::spawn_blocking(move || {
        server.restart();
        server
    })
    .await
    .unwrap();
    let restarted = Instant::now();
    eventually(
        Duration::from_secs(10),
        "5 calls after the restart",
        || async { count(true) >= ok_before_restart + 5 },
    )
    .await;
    let recovered_within = restarted.elapsed();
    stop.store(true, Ordering::SeqCst);
    consumer.await.unwrap();

    let calls = std::mem::take(&mut *calls.lock().unwrap());
    // Ok... then failures while Redis was away, then Ok again: once
    // recovered, the connection stays recovered.
    let first_err = calls
        .iter()
        .position(|c| c.result.is_err())
        .expect("a failed call");
    let last_err = calls.iter().rposition(|c| c.result.is_err()).unwrap();
    let failed = &calls[first_err..=last_err];
    for (i, c) in calls.iter().enumerate() {
        if i < first_err || i > last_err {
            assert!(
                matches!(c.result, Ok(Outcome::Executed(_))),
                "call {i}: {c:?}"
            );
        }
    }
    for c in failed {
        assert!(
            matches!(
                &c.result,
                Err(Error::Store {
                    handler: "redis_restart",
                    key: Some(_),
                    ..
                })
            ),
            "a call while Redis was away: {c:?}"
        );
        assert!(
            c.took < Duration::from_secs(3),
            "a failing call took {:?}",
            c.took
        );
    }
    let slowest = failed.iter().map(|c| c.took).max().unwrap();
    let mean =
        failed.iter().map(|c| c.took).sum::<Duration>() / u32::try_from(failed.len()).unwrap();
    let errors: Vec<String> = failed
        .iter()
        .map(|c| match &c.result {
            Err(Error::Store { source, .. }) => format!("{:?}: {source}", c.took),
            other => format!("{other:?}"),
        })
        .collect();
    eprintln!(
        "redis restart: {} calls ({} ok before, {} Error::Store, {} ok after); down {down_for:?}; \
         failing calls took {mean:?} on average, {slowest:?} at most; recovered {recovered_within:?} \
         after the restart; errors: {errors:#?}",
        calls.len(),
        first_err,
        failed.len(),
        calls.len() - last_err - 1,
    );

    // The restarted Redis kept nothing: the message delivered (and
    // recorded) before the kill executes a second time.
    assert_eq!(runs.of("r-0"), 1);
    assert_eq!(
        deliver(&store, &before, &runs).await.unwrap(),
        Outcome::Executed(1)
    );
    assert_eq!(runs.of("r-0"), 2);
    assert_eq!(
        deliver(&store, &before, &runs).await.unwrap(),
        Outcome::Duplicate(1)
    );
    drop(server);
}

/// A body that waits at `gate` before it succeeds: the test kills Redis
/// while it waits, so its effect happens while the store is away.
async fn held(msg: &Job, gate: &tokio::sync::Semaphore, runs: &Runs) -> Result<u32, AppError> {
    let _permit = gate.acquire().await.expect("gate");
    *runs.0.lock().unwrap().entry(msg.id.clone()).or_default() += 1;
    Ok(msg.value)
}

/// Under a 5 s lease.
#[idempotent(
    key = "msg.id",
    ttl = "1h",
    store = "redis",
    lease = "5s",
    name = "redis_outage_5s"
)]
async fn held_5s(msg: &Job, gate: &tokio::sync::Semaphore, runs: &Runs) -> Result<u32, AppError> {
    held(msg, gate, runs).await
}

/// Under a 1 s lease.
#[idempotent(
    key = "msg.id",
    ttl = "1h",
    store = "redis",
    lease = "1s",
    name = "redis_outage_1s"
)]
async fn held_1s(msg: &Job, gate: &tokio::sync::Semaphore, runs: &Runs) -> Result<u32, AppError> {
    held(msg, gate, runs).await
}

/// The body succeeds while Redis is down; Redis is back 400 ms later, well
/// within the 5 s lease. The completion is retried until it lands: the call
/// is `Executed`, and the redelivery a `Duplicate` of it (not a second run).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_that_meets_a_restarting_redis_is_retried_while_the_lease_holds() {
    let mut server = or_skip!(RedisServer::start());
    let store = RedisStore::connect(&server.url())
        .await
        .expect("connect to the throw-away server");
    let (gate, runs) = (
        Arc::new(tokio::sync::Semaphore::new(0)),
        Arc::new(Runs::default()),
    );
    let msg = Job::new("outage-1", 7);
    let call = {
        let (store, gate, runs) = (store.clone(), Arc::clone(&gate), Arc::clone(&runs));
        tokio::spawn(async move { held_5s(&store, &Job::new("outage-1", 7), &gate, &runs).await })
    };
    // The claim is in Redis; the body waits.
    eventually(Duration::from_secs(5), "the claim", || async {
        store
            .record("redis_outage_5s", &msg.key())
            .await
            .unwrap()
            .is_some()
    })
    .await;
    server.kill();
    gate.add_permits(1);
    tokio::time::sleep(Duration::from_millis(400)).await;
    let server = tokio::task::spawn_blocking(move || {
        server.restart();
        server
    })
    .await
    .unwrap();
    let r = tokio::time::timeout(Duration::from_secs(10), call)
        .await
        .expect("the call ends")
        .unwrap();
    assert_eq!(r.unwrap(), Outcome::Executed(7));
    assert_eq!(runs.of("outage-1"), 1);
    assert_eq!(
        held_5s(&store, &msg, &Semaphore::new(1), &runs)
            .await
            .unwrap(),
        Outcome::Duplicate(7),
        "the outcome was recorded after the restart"
    );
    assert_eq!(runs.of("outage-1"), 1);
    drop(server);
}

/// The body succeeds while Redis is down and Redis stays down past the 1 s
/// lease: the call says the effect happened without a record
/// (`NotRecorded`), not a store error that would invite a redelivery.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_the_store_never_takes_says_the_effect_happened() {
    let mut server = or_skip!(RedisServer::start());
    let store = RedisStore::connect(&server.url())
        .await
        .expect("connect to the throw-away server");
    let (gate, runs) = (
        Arc::new(tokio::sync::Semaphore::new(0)),
        Arc::new(Runs::default()),
    );
    let msg = Job::new("outage-2", 9);
    let call = {
        let (store, gate, runs) = (store.clone(), Arc::clone(&gate), Arc::clone(&runs));
        tokio::spawn(async move { held_1s(&store, &Job::new("outage-2", 9), &gate, &runs).await })
    };
    eventually(Duration::from_secs(5), "the claim", || async {
        store
            .record("redis_outage_1s", &msg.key())
            .await
            .unwrap()
            .is_some()
    })
    .await;
    server.kill();
    let released = Instant::now();
    gate.add_permits(1);
    let r = tokio::time::timeout(Duration::from_secs(15), call)
        .await
        .expect("the call ends")
        .unwrap();
    let took = released.elapsed();
    match &r {
        Err(Error::NotRecorded {
            handler: "redis_outage_1s",
            key,
            ..
        }) => assert_eq!(*key, msg.key()),
        other => panic!("expected NotRecorded, got {other:?}"),
    }
    let text = r.unwrap_err().to_string();
    assert!(text.contains("took effect"), "{text}");
    assert_eq!(runs.of("outage-2"), 1);
    println!("NotRecorded after {took:?} (lease 1 s)");
}

// ---------------------------------------------------------------------------
// Records the first release wrote
// ---------------------------------------------------------------------------

/// The first release's hashes have `s`, `t`, `o`, `c`, `u` only, and the
/// key's TTL is the lease of a claim in progress. This release reads them,
/// replays their outcomes, honours their leases, and takes a claim whose
/// lease ran out over as any other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_of_the_first_release_are_read_and_still_suppress_duplicates() {
    use idem_runtime::Key;
    use idem_runtime::registry::{HandlerSpec, Mode};
    use idem_runtime::store::Status;
    use idem_runtime::store::{Claim, LeaseStore, Standing};

    static SPEC: HandlerSpec = HandlerSpec {
        name: "redis_v1",
        function: "redis_v1",
        key: "id",
        ttl: Duration::from_secs(3_600),
        lease: Duration::from_secs(30),
        store: "redis",
        mode: Mode::Lease,
        module: module_path!(),
        file: file!(),
        line: line!(),
        fingerprint: Some("*"),
        max_attempts: Some(3),
    };
    let prefix = idem_tests::unique_prefix("rl_v1");
    let _guard = idem_tests::DeleteKeys::new(&idem_tests::redis_url(), &prefix);
    let store = or_skip!(idem_tests::redis_store(&prefix).await);
    let mut conn = redis::Client::open(idem_tests::redis_url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let key = |id: &str| Key::from_parts(&[&id]).unwrap();
    let now = i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap();
    // What the first release's scripts wrote.
    let old = |id: &str, fields: &[(&str, String)], ttl_ms: u64| {
        let mut pipe = redis::pipe();
        let rkey = store.redis_key(SPEC.name, &key(id));
        pipe.cmd("HSET").arg(&rkey).arg(fields).ignore();
        pipe.cmd("PEXPIRE").arg(&rkey).arg(ttl_ms).ignore();
        pipe
    };
    let completed = old(
        "done",
        &[
            ("s", "completed".into()),
            ("o", "{\"points\":5}".into()),
            ("c", now.to_string()),
            ("u", now.to_string()),
        ],
        3_600_000,
    );
    let live = old(
        "busy",
        &[
            ("s", "in_progress".into()),
            ("t", "0123456789abcdef0123456789abcdef".into()),
            ("c", now.to_string()),
            ("u", now.to_string()),
        ],
        20_000,
    );
    let () = completed.query_async(&mut conn).await.unwrap();
    let () = live.query_async(&mut conn).await.unwrap();

    // Read as one attempt, no failure, no fingerprint.
    let r = store
        .record(SPEC.name, &key("done"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (
            r.status,
            r.outcome.as_deref(),
            r.attempts,
            r.failures,
            r.fingerprint.as_deref()
        ),
        (Status::Completed, Some("{\"points\":5}"), 1, 0, None)
    );
    assert!(r.expires_at_ms > now + 3_500_000, "{r:?}");
    let r = store
        .record(SPEC.name, &key("busy"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (r.status, r.token.as_deref()),
        (Status::InProgress, Some("0123456789abcdef0123456789abcdef"))
    );
    assert!(
        r.expires_at_ms <= now + 20_100 && r.expires_at_ms > now,
        "the lease ends with the key's TTL: {r:?}"
    );

    // A fingerprinted delivery meets a record without one: it replays.
    assert_eq!(
        store
            .claim(&SPEC, &key("done"), Some("ab12"))
            .await
            .unwrap(),
        Claim::Refused(Standing::Completed {
            outcome: "{\"points\":5}".into(),
            trace: None,
        })
    );
    // The old claim's lease holds, measured by its TTL.
    match store.claim(&SPEC, &key("busy"), None).await.unwrap() {
        Claim::Refused(Standing::InProgress { retry_after }) => {
            assert!(retry_after <= Duration::from_secs(20), "{retry_after:?}")
        }
        other => panic!("the first release's live claim holds: {other:?}"),
    }
    // Its token still completes it: a consumer of the first release that
    // finishes during the deploy records its outcome.
    assert!(
        store
            .complete(&SPEC, &key("busy"), "0123456789abcdef0123456789abcdef", "7")
            .await
            .unwrap()
    );
    assert_eq!(
        store.claim(&SPEC, &key("busy"), None).await.unwrap(),
        Claim::Refused(Standing::Completed {
            outcome: "7".into(),
            trace: None
        })
    );
}

// ---------------------------------------------------------------------------
// What a batch sends
// ---------------------------------------------------------------------------

/// The server's counts of what it did: commands by name, and read events
/// (one per batch of bytes a client's socket delivered).
#[derive(Debug, Default)]
struct Counts {
    calls: HashMap<String, u64>,
    reads: u64,
}

impl Counts {
    async fn of(conn: &mut redis::aio::MultiplexedConnection) -> Counts {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .arg("stats")
            .query_async(conn)
            .await
            .unwrap();
        let mut counts = Counts::default();
        for line in info.lines() {
            if let Some(reads) = line.strip_prefix("total_reads_processed:") {
                counts.reads = reads.trim().parse().unwrap();
            }
            if let Some((cmd, rest)) = line
                .strip_prefix("cmdstat_")
                .and_then(|l| l.split_once(':'))
            {
                let calls = rest
                    .split(',')
                    .find_map(|f| f.strip_prefix("calls=")?.parse().ok())
                    .unwrap();
                counts.calls.insert(cmd.to_owned(), calls);
            }
        }
        counts
    }

    /// Calls of `cmd` since `before`.
    fn since(&self, before: &Counts, cmd: &str) -> u64 {
        self.calls.get(cmd).copied().unwrap_or(0) - before.calls.get(cmd).copied().unwrap_or(0)
    }
}

/// On a server of the test's own (no other client), a batch of 1,000
/// claims is 1,000 `SET`s and no function, delivered in a handful of reads
/// (one pipeline, not 1,000 round trips); its completion 1,000 function
/// calls, as few reads; a batch in which ten keys hold a failure to retry
/// runs the replacing function for those ten only. The first pipeline on
/// a server without the store's library loads it once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_is_one_pipeline_and_scripts_run_only_where_a_record_stands() {
    use idem_runtime::Key;
    use idem_runtime::registry::{HandlerSpec, Mode};
    use idem_runtime::store::{BatchItem, Claim, Failure, Held, LeaseStore};

    static SPEC: HandlerSpec = HandlerSpec {
        name: "rl_pipeline",
        function: "rl_pipeline",
        key: "id",
        ttl: Duration::from_secs(3_600),
        lease: Duration::from_secs(30),
        store: "redis",
        mode: Mode::Lease,
        module: module_path!(),
        file: file!(),
        line: line!(),
        fingerprint: None,
        max_attempts: Some(3),
    };
    const KEYS: u64 = 1_000;
    let server = or_skip!(RedisServer::start());
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let mut admin = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let keys: Vec<Key> = (0..KEYS).map(|i| Key::from_parts(&[&i]).unwrap()).collect();
    let items: Vec<BatchItem<'_>> = keys
        .iter()
        .map(|key| BatchItem {
            key,
            fingerprint: None,
        })
        .collect();

    // The server has no library yet: the first pipeline that calls a
    // function is answered `Function not found`, loads the library once,
    // and sends those calls again.
    let warm: Vec<Key> = ["warm-1", "warm-2"]
        .iter()
        .map(|id| Key::from_parts(&[id]).unwrap())
        .collect();
    let warm_items: Vec<BatchItem<'_>> = warm
        .iter()
        .map(|key| BatchItem {
            key,
            fingerprint: None,
        })
        .collect();
    let before = Counts::of(&mut admin).await;
    let claims = store.claim_batch(&SPEC, &warm_items).await.unwrap();
    let held: Vec<(Held<'_>, &str)> = warm
        .iter()
        .zip(&claims)
        .map(|(key, claim)| match claim {
            Claim::Fresh { token } => (Held { key, token }, "0"),
            other => panic!("a fresh key: {other:?}"),
        })
        .collect();
    assert_eq!(
        store.complete_batch(&SPEC, &held).await.unwrap(),
        [true, true]
    );
    let after = Counts::of(&mut admin).await;
    assert_eq!(after.since(&before, "function|load"), 1);
    // A failure retried: its claim replaces the record (the swap).
    let claims = store.claim_batch(&SPEC, &warm_items[..1]).await;
    assert!(matches!(claims.unwrap()[0], Claim::Refused(_)));
    let retried = Key::from_parts(&[&"warm-3"]).unwrap();
    let Claim::Fresh { token } = store.claim(&SPEC, &retried, None).await.unwrap() else {
        panic!("a fresh key")
    };
    let failure = Failure::Counted { error: "warm" };
    assert!(store.fail(&SPEC, &retried, &token, failure).await.unwrap());
    let item = [BatchItem {
        key: &retried,
        fingerprint: None,
    }];
    let Claim::Fresh { token } = &store.claim_batch(&SPEC, &item).await.unwrap()[0] else {
        panic!("the failure may be retried")
    };
    assert!(store.complete(&SPEC, &retried, token, "0").await.unwrap());

    let before = Counts::of(&mut admin).await;
    let claims = store.claim_batch(&SPEC, &items).await.unwrap();
    let after = Counts::of(&mut admin).await;
    assert_eq!(
        (after.since(&before, "set"), after.since(&before, "fcall")),
        (KEYS, 0)
    );
    assert!(
        after.reads - before.reads < 50,
        "{} reads for one batch",
        after.reads - before.reads
    );

    let tokens: Vec<&str> = claims
        .iter()
        .map(|c| match c {
            Claim::Fresh { token } => token.as_str(),
            other => panic!("a fresh key: {other:?}"),
        })
        .collect();
    // Ten bodies fail (counted, one at a time), the others complete at once.
    for i in 0..10 {
        let failure = Failure::Counted { error: "timeout" };
        assert!(
            store
                .fail(&SPEC, &keys[i], tokens[i], failure)
                .await
                .unwrap()
        );
    }
    let done: Vec<(Held<'_>, &str)> = (10..keys.len())
        .map(|i| {
            (
                Held {
                    key: &keys[i],
                    token: tokens[i],
                },
                "1",
            )
        })
        .collect();
    let before = Counts::of(&mut admin).await;
    let completed = store.complete_batch(&SPEC, &done).await.unwrap();
    let after = Counts::of(&mut admin).await;
    assert!(completed.iter().all(|c| *c));
    // One call of the completion function for the batch's 990 keys.
    assert_eq!(after.since(&before, "fcall"), 1);
    assert!(
        after.reads - before.reads < 50,
        "{} reads for one batch",
        after.reads - before.reads
    );

    // The redelivery: ten retries take their keys over, the rest replay.
    let before = Counts::of(&mut admin).await;
    let again = store.claim_batch(&SPEC, &items).await.unwrap();
    let after = Counts::of(&mut admin).await;
    // (A function's own commands count too: each swap writes with one `SET`.)
    assert_eq!(
        (after.since(&before, "set"), after.since(&before, "fcall")),
        (KEYS + 10, 10)
    );
    assert!(
        again[..10].iter().all(|c| matches!(c, Claim::Fresh { .. })),
        "{:?}",
        &again[..10]
    );
    assert!(again[10..].iter().all(|c| matches!(c, Claim::Refused(_))));
    drop(server);
}
