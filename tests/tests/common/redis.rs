//! The lease-mode behaviour suite on Redis, written once as scenario
//! functions over a [`Fx`] (a store plus a raw connection to the same
//! server or cluster): `redis_lease.rs` runs each against the server of
//! `REDIS_URL`, `redis_cluster.rs` against a three-master cluster it starts.
//!
//! Expiry here is Redis's own (a key's TTL), so there is no manual clock:
//! the ttl scenario waits past a short ttl, and the takeover scenarios let a
//! lease run out by shortening the record's TTL from the test.
//!
//! Included by each Redis test binary as `#[path = "common/redis.rs"] mod
//! suite;` next to `mod common;`, whose probe and tally it uses.

// Each Redis test binary uses a different part of the fixture.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use idem_runtime::store::Status;
use idem_runtime::{Error, Key, Outcome, RedisStore, idempotent};
use idem_tests::{DeleteKeys, redis_store, redis_url, unique_prefix};
use redis::FromRedisValue;
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;

use crate::common::{AppError, Probe, Tally, eventually, together};

// ---------------------------------------------------------------------------
// The fixture
// ---------------------------------------------------------------------------

/// A raw connection to the store's server or cluster, for what a test reads
/// or does behind the store's back.
#[derive(Clone)]
enum Raw {
    Single(MultiplexedConnection),
    Cluster(ClusterConnection),
}

/// A Redis store with a key prefix of its own, a raw connection to the same
/// Redis, and (on the shared server) a guard that deletes the prefix's keys
/// when the last clone drops.
#[derive(Clone)]
pub(crate) struct Fx {
    pub(crate) store: RedisStore,
    pub(crate) prefix: String,
    raw: Raw,
    /// Every node's URL (one on a single server).
    nodes: Vec<String>,
    _keys: Option<Arc<DeleteKeys>>,
}

impl Fx {
    /// On the server of `REDIS_URL` with a unique prefix starting with
    /// `name`, or `None` when the server is unreachable (the test skips).
    pub(crate) async fn single(name: &str) -> Option<Fx> {
        let prefix = unique_prefix(name);
        let store = redis_store(&prefix).await?;
        let url = redis_url();
        let keys = Arc::new(DeleteKeys::new(&url, &prefix));
        let raw = redis::Client::open(url.as_str())
            .expect("redis url")
            .get_multiplexed_async_connection()
            .await
            .expect("a raw connection to the server the store reached");
        Some(Fx {
            store,
            prefix,
            raw: Raw::Single(raw),
            nodes: vec![url],
            _keys: Some(keys),
        })
    }

    /// On the cluster of `nodes`, with a unique prefix starting with `name`.
    /// The cluster is the test's own and is killed afterwards, so no guard.
    pub(crate) async fn cluster(nodes: &[String], name: &str) -> Fx {
        let prefix = unique_prefix(name);
        let store = RedisStore::connect_cluster(nodes)
            .await
            .expect("connect to the cluster")
            .with_prefix(&prefix)
            .expect("a valid prefix");
        let raw = redis::cluster::ClusterClient::new(nodes.to_vec())
            .expect("cluster urls")
            .get_async_connection()
            .await
            .expect("a raw cluster connection");
        Fx {
            store,
            prefix,
            raw: Raw::Cluster(raw),
            nodes: nodes.to_vec(),
            _keys: None,
        }
    }

    /// Runs `cmd` on the raw connection (routed by key on a cluster).
    pub(crate) async fn query<T: FromRedisValue>(&self, cmd: &redis::Cmd) -> T {
        async fn go<C: ConnectionLike, T: FromRedisValue>(mut c: C, cmd: &redis::Cmd) -> T {
            cmd.query_async(&mut c)
                .await
                .unwrap_or_else(|e| panic!("raw redis command failed: {e}"))
        }
        match &self.raw {
            Raw::Single(c) => go(c.clone(), cmd).await,
            Raw::Cluster(c) => go(c.clone(), cmd).await,
        }
    }

    /// The Redis key of `handler`'s record for `key`.
    pub(crate) fn rkey(&self, handler: &str, key: &Key) -> String {
        self.store.redis_key(handler, key)
    }

    pub(crate) async fn exists(&self, handler: &str, key: &Key) -> bool {
        let n: i64 = self
            .query(redis::cmd("EXISTS").arg(self.rkey(handler, key)))
            .await;
        n == 1
    }

    /// One field of the record hash.
    pub(crate) async fn field(&self, handler: &str, key: &Key, field: &str) -> Option<String> {
        self.query(redis::cmd("HGET").arg(self.rkey(handler, key)).arg(field))
            .await
    }

    /// The record's TTL in ms (`PTTL`: -2 when it is gone).
    pub(crate) async fn pttl(&self, handler: &str, key: &Key) -> i64 {
        self.query(redis::cmd("PTTL").arg(self.rkey(handler, key)))
            .await
    }

    /// The external effect of a body: a counter per message id, in Redis
    /// under the test's prefix.
    fn effect_key(&self, id: &str) -> String {
        format!("{}:effect:{id}", self.prefix)
    }

    async fn add_effect(&self, id: &str) -> Result<(), AppError> {
        let mut cmd = redis::cmd("INCR");
        cmd.arg(self.effect_key(id));
        let r: redis::RedisResult<i64> = match &self.raw {
            Raw::Single(c) => cmd.query_async(&mut c.clone()).await,
            Raw::Cluster(c) => cmd.query_async(&mut c.clone()).await,
        };
        r.map(drop)
            .map_err(|e| AppError::Refused(format!("effect: {e}")))
    }

    /// How often bodies applied their effect for message `id`.
    pub(crate) async fn effects(&self, id: &str) -> i64 {
        let n: Option<i64> = self.query(redis::cmd("GET").arg(self.effect_key(id))).await;
        n.unwrap_or(0)
    }

    /// Every node's URL (one on a single server).
    pub(crate) fn nodes(&self) -> &[String] {
        &self.nodes
    }

    /// Runs `cmd` on the node at `url` itself, over a plain connection: no
    /// cluster routing, so a key another node serves answers `MOVED`.
    pub(crate) async fn on_node<T: FromRedisValue>(
        &self,
        url: &str,
        cmd: &redis::Cmd,
    ) -> redis::RedisResult<T> {
        let mut c = redis::Client::open(url)?
            .get_multiplexed_async_connection()
            .await?;
        cmd.query_async(&mut c).await
    }

    /// Every key under the prefix, on every node, as `(node url, key)`.
    pub(crate) async fn keys_by_node(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for url in &self.nodes {
            let mut c = redis::Client::open(url.as_str())
                .expect("node url")
                .get_multiplexed_async_connection()
                .await
                .expect("a direct connection to a node");
            let mut cursor = 0u64;
            loop {
                let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(format!("{}:*", self.prefix))
                    .arg("COUNT")
                    .arg(1000)
                    .query_async(&mut c)
                    .await
                    .expect("scan a node");
                out.extend(batch.into_iter().map(|k| (url.clone(), k)));
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        out
    }

    /// Lets the lease of `handler`'s record for `key` run out now, as if its
    /// consumer had stalled for longer than the lease without a heartbeat
    /// getting through: the record's TTL is cut to 1 ms and the test waits
    /// until Redis has expired it. A heartbeat that lands in between extends
    /// the TTL again, so this repeats until the key is gone.
    pub(crate) async fn run_out_lease(&self, handler: &str, key: &Key) {
        let rkey = self.rkey(handler, key);
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let _: i64 = self.query(redis::cmd("PEXPIRE").arg(&rkey).arg(1)).await;
            tokio::time::sleep(Duration::from_millis(3)).await;
            if !self.exists(handler, key).await {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the lease of {rkey} never ran out"
            );
        }
    }
}

fn now_ms() -> i64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970");
    i64::try_from(since.as_millis()).expect("ms fit in i64")
}

// ---------------------------------------------------------------------------
// Messages and handlers
// ---------------------------------------------------------------------------

/// A lease-mode message.
#[derive(Debug, Clone)]
pub(crate) struct Job {
    pub(crate) id: String,
    pub(crate) value: u32,
    /// The body waits on the probe's gate before its effect.
    pub(crate) park: bool,
    /// The body sleeps this long before its effect.
    pub(crate) sleep: Option<Duration>,
    /// The body fails (before its effect).
    pub(crate) fail: bool,
}

impl Job {
    pub(crate) fn new(id: &str, value: u32) -> Self {
        Job {
            id: id.into(),
            value,
            park: false,
            sleep: None,
            fail: false,
        }
    }

    pub(crate) fn parked(id: &str, value: u32) -> Self {
        Job {
            park: true,
            ..Job::new(id, value)
        }
    }

    /// The key `msg.id` derives.
    pub(crate) fn key(&self) -> Key {
        Key::from_parts(&[&self.id]).unwrap()
    }
}

async fn body(msg: &Job, probe: &Probe, fx: &Fx) -> Result<u32, AppError> {
    probe.hit();
    if msg.park {
        probe.park().await;
    }
    if let Some(d) = msg.sleep {
        tokio::time::sleep(d).await;
    }
    if msg.fail {
        return Err(AppError::Refused(format!("job {} failed", msg.id)));
    }
    fx.add_effect(&msg.id).await?;
    Ok(msg.value)
}

pub(crate) const JOB: &str = "redis_job";
pub(crate) const SHORT_TTL: &str = "redis_short_ttl";
pub(crate) const SHORT_LEASE: &str = "redis_short_lease";
pub(crate) const SMS: &str = "redis_sms";

/// A lease long enough that the heartbeat never fires during a test.
#[idempotent(
    key = "msg.id",
    ttl = "1h",
    lease = "1h",
    store = "redis",
    name = "redis_job"
)]
pub(crate) async fn job(msg: &Job, probe: &Probe, fx: &Fx) -> Result<u32, AppError> {
    body(msg, probe, fx).await
}

/// A completed record suppresses duplicates for one second only.
#[idempotent(
    key = "msg.id",
    ttl = "1s",
    lease = "1h",
    store = "redis",
    name = "redis_short_ttl"
)]
pub(crate) async fn short_ttl_job(msg: &Job, probe: &Probe, fx: &Fx) -> Result<u32, AppError> {
    body(msg, probe, fx).await
}

/// A 300 ms lease that only the heartbeat (every 100 ms) keeps alive.
#[idempotent(
    key = "msg.id",
    ttl = "1h",
    lease = "300ms",
    store = "redis",
    name = "redis_short_lease"
)]
pub(crate) async fn short_lease_job(msg: &Job, probe: &Probe, fx: &Fx) -> Result<u32, AppError> {
    body(msg, probe, fx).await
}

/// A message whose key part may be missing.
#[derive(Debug)]
pub(crate) struct Sms {
    pub(crate) phone: Option<String>,
    pub(crate) template: &'static str,
}

/// Reads its own key, as a body passing it on to an SMS gateway would.
#[idempotent(
    key = "msg.template + msg.phone",
    ttl = "1h",
    store = "redis",
    name = "redis_sms"
)]
pub(crate) async fn send_sms(msg: &Sms, key: &Key, probe: &Probe) -> Result<String, AppError> {
    probe.hit();
    probe.see(key.as_str());
    Ok(format!("sent {}", msg.template))
}

type Call = tokio::task::JoinHandle<Result<Outcome<u32>, Error<AppError>>>;

/// Delivers `msg` to `job` in a task of its own.
fn spawn_job(fx: &Fx, probe: &Arc<Probe>, msg: Job) -> Call {
    let (fx, probe) = (fx.clone(), Arc::clone(probe));
    tokio::spawn(async move { job(&fx.store, &msg, &probe, &fx).await })
}

/// Delivers `msg` to `short_lease_job` in a task of its own.
fn spawn_short_lease_job(fx: &Fx, probe: &Arc<Probe>, msg: Job) -> Call {
    let (fx, probe) = (fx.clone(), Arc::clone(probe));
    tokio::spawn(async move { short_lease_job(&fx.store, &msg, &probe, &fx).await })
}

// ---------------------------------------------------------------------------
// The scenarios
// ---------------------------------------------------------------------------

/// The first delivery runs the body and leaves a completed record: outcome,
/// timestamps, the ttl as the key's TTL, no fencing token.
pub(crate) async fn first_delivery_executes_and_records_completed(fx: &Fx) {
    let probe = Probe::new();
    let msg = Job::new("j-1", 7);
    let before = now_ms();
    let out = job(&fx.store, &msg, &probe, fx).await.unwrap();
    let after = now_ms();
    assert_eq!(out, Outcome::Executed(7));
    assert_eq!(probe.runs(), 1);
    assert_eq!(fx.effects("j-1").await, 1);

    let rec = fx.store.record(JOB, &msg.key()).await.unwrap().unwrap();
    assert_eq!(rec.status, Status::Completed);
    assert_eq!(rec.outcome.as_deref(), Some("7"));
    assert_eq!(
        (rec.handler.as_str(), rec.key.as_str()),
        (JOB, msg.key().as_str())
    );
    assert_eq!(rec.attempts, 1);
    assert!((before..=after).contains(&rec.created_at_ms), "{rec:?}");
    assert!(
        (rec.created_at_ms..=after).contains(&rec.updated_at_ms),
        "{rec:?}"
    );
    // expires_at is now + the key's TTL: the handler's ttl of one hour.
    let ttl = rec.expires_at_ms - now_ms();
    assert!(
        (3_590_000..=3_600_000).contains(&ttl),
        "{ttl} ms left of 1h: {rec:?}"
    );
    // The fencing token is cleared on completion.
    assert_eq!(fx.field(JOB, &msg.key(), "t").await, None);
    assert_eq!(
        fx.field(JOB, &msg.key(), "s").await.as_deref(),
        Some("completed")
    );
}

/// A repeat gets the recorded outcome and the body does not run again, even
/// with another payload under the same key.
pub(crate) async fn duplicate_returns_recorded_outcome_without_running_the_body(fx: &Fx) {
    let probe = Probe::new();
    let msg = Job::new("j-2", 11);
    assert!(
        job(&fx.store, &msg, &probe, fx)
            .await
            .unwrap()
            .is_executed()
    );
    for _ in 0..5 {
        assert_eq!(
            job(&fx.store, &msg, &probe, fx).await.unwrap(),
            Outcome::Duplicate(11)
        );
    }
    let other = Job::new("j-2", 99);
    assert_eq!(
        job(&fx.store, &other, &probe, fx).await.unwrap(),
        Outcome::Duplicate(11)
    );
    assert_eq!(probe.runs(), 1);
    assert_eq!(fx.effects("j-2").await, 1);
}

/// A failing body releases its claim (the record is deleted), so the
/// redelivery runs the body again.
pub(crate) async fn body_error_releases_the_claim_and_the_retry_executes(fx: &Fx) {
    let probe = Probe::new();
    let failing = Job {
        fail: true,
        ..Job::new("j-3", 5)
    };
    let err = job(&fx.store, &failing, &probe, fx).await.unwrap_err();
    assert_eq!(err.key(), Some(&failing.key()));
    assert!(
        matches!(&err, Error::Handler { handler: JOB, error: AppError::Refused(m), .. } if m == "job j-3 failed"),
        "{err:?}"
    );
    assert!(
        !fx.exists(JOB, &failing.key()).await,
        "the claim was not released"
    );
    assert_eq!(fx.store.record(JOB, &failing.key()).await.unwrap(), None);

    let out = job(&fx.store, &Job::new("j-3", 5), &probe, fx)
        .await
        .unwrap();
    assert_eq!(out, Outcome::Executed(5));
    assert_eq!(probe.runs(), 2);
    assert_eq!(fx.effects("j-3").await, 1);
    let rec = fx.store.record(JOB, &failing.key()).await.unwrap().unwrap();
    assert_eq!(
        (rec.status, rec.outcome.as_deref()),
        (Status::Completed, Some("5"))
    );
}

/// 64 deliveries of one message at the same moment: one executes, the others
/// are duplicates or in progress.
pub(crate) async fn concurrent_deliveries_of_one_message_execute_exactly_once(fx: &Fx) {
    const N: usize = 64;
    let probe = Probe::new();
    let results = together(N, |_| {
        let (fx, probe) = (fx.clone(), Arc::clone(&probe));
        async move { job(&fx.store, &Job::new("j-4", 3), &probe, &fx).await }
    })
    .await;
    let tally = Tally::of(results);
    eprintln!("{N} concurrent deliveries of one message (redis): {tally:?}");
    assert_eq!(tally.executed, 1, "{tally:?}");
    assert_eq!(tally.duplicate + tally.in_progress, N - 1, "{tally:?}");
    assert!(tally.other.is_empty(), "{tally:?}");
    assert_eq!(probe.runs(), 1);
    assert_eq!(fx.effects("j-4").await, 1);
}

/// While a body runs every other delivery is in progress; once it completed
/// every delivery is a duplicate.
pub(crate) async fn deliveries_while_the_body_runs_are_in_progress_then_duplicates(fx: &Fx) {
    const N: usize = 32;
    let probe = Probe::new();
    let first = spawn_job(fx, &probe, Job::parked("j-5", 8));
    probe.wait_parked().await;
    let during = together(N, |_| {
        let (fx, probe) = (fx.clone(), Arc::clone(&probe));
        async move { job(&fx.store, &Job::new("j-5", 8), &probe, &fx).await }
    })
    .await;
    let tally = Tally::of(during);
    assert_eq!(tally.in_progress, N, "{tally:?}");

    probe.open_gate();
    assert_eq!(first.await.unwrap().unwrap(), Outcome::Executed(8));
    let after = together(N, |_| {
        let (fx, probe) = (fx.clone(), Arc::clone(&probe));
        async move { job(&fx.store, &Job::new("j-5", 8), &probe, &fx).await }
    })
    .await;
    let tally = Tally::of(after);
    assert_eq!(tally.duplicate, N, "{tally:?}");
    assert_eq!(probe.runs(), 1);
    assert_eq!(fx.effects("j-5").await, 1);
}

/// 32 messages, two concurrent copies each: every message executes once.
pub(crate) async fn concurrent_distinct_messages_each_execute_exactly_once(fx: &Fx) {
    const MESSAGES: usize = 32;
    const COPIES: usize = 2;
    let probe = Probe::new();
    let results = together(MESSAGES * COPIES, |i| {
        let (fx, probe) = (fx.clone(), Arc::clone(&probe));
        let msg = Job::new(&format!("m-{}", i % MESSAGES), 1);
        async move { job(&fx.store, &msg, &probe, &fx).await }
    })
    .await;
    let tally = Tally::of(results);
    eprintln!("{MESSAGES} messages x {COPIES} concurrent copies (redis): {tally:?}");
    assert_eq!(tally.executed, MESSAGES, "{tally:?}");
    assert_eq!(
        tally.duplicate + tally.in_progress,
        MESSAGES * (COPIES - 1),
        "{tally:?}"
    );
    assert!(tally.other.is_empty(), "{tally:?}");
    assert_eq!(probe.runs(), MESSAGES);
    for m in 0..MESSAGES {
        assert_eq!(fx.effects(&format!("m-{m}")).await, 1, "message m-{m}");
    }
}

/// A storm of duplicates: 200 concurrent deliveries of 10 messages. Each
/// message's effect counter reads 1, and every delivery that got an outcome
/// got the executed delivery's value.
pub(crate) async fn storm_of_concurrent_duplicates_executes_each_message_once(fx: &Fx) {
    const TASKS: usize = 200;
    const MESSAGES: usize = 10;
    let probe = Probe::new();
    let results = together(TASKS, |i| {
        let (fx, probe) = (fx.clone(), Arc::clone(&probe));
        // Each delivery carries a value of its own, so a duplicate shows
        // whose outcome it got.
        let msg = Job::new(
            &format!("storm-{}", i % MESSAGES),
            u32::try_from(i).unwrap(),
        );
        async move { job(&fx.store, &msg, &probe, &fx).await }
    })
    .await;

    let mut values: Vec<Vec<u32>> = vec![Vec::new(); MESSAGES];
    let mut executed = [0usize; MESSAGES];
    for (i, r) in results.iter().enumerate() {
        match r {
            Ok(Outcome::Executed(v)) => {
                executed[i % MESSAGES] += 1;
                values[i % MESSAGES].push(*v);
            }
            Ok(Outcome::Duplicate(v)) => values[i % MESSAGES].push(*v),
            _ => {}
        }
    }
    let tally = Tally::of(results);
    eprintln!("{TASKS} concurrent deliveries of {MESSAGES} messages (redis): {tally:?}");
    assert_eq!(tally.executed, MESSAGES, "{tally:?}");
    assert_eq!(
        tally.duplicate + tally.in_progress,
        TASKS - MESSAGES,
        "{tally:?}"
    );
    assert!(tally.other.is_empty(), "{tally:?}");
    assert_eq!(probe.runs(), MESSAGES);
    for m in 0..MESSAGES {
        let id = format!("storm-{m}");
        assert_eq!(executed[m], 1, "{id}");
        assert_eq!(fx.effects(&id).await, 1, "{id} took effect more than once");
        assert!(
            values[m].windows(2).all(|w| w[0] == w[1]),
            "{id}: {:?}",
            values[m]
        );
        let rec = fx
            .store
            .record(JOB, &Job::new(&id, 0).key())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(rec.outcome, Some(values[m][0].to_string()), "{id}");
    }
}

/// A delivery that finds a live claim learns what is left of its lease, from
/// the key's TTL.
pub(crate) async fn in_progress_reports_what_is_left_of_the_lease(fx: &Fx) {
    let probe = Probe::new();
    let msg = Job::new("j-7", 1);
    let first = spawn_job(fx, &probe, Job::parked("j-7", 1));
    probe.wait_parked().await;
    let claimed = Instant::now();
    let rec = fx.store.record(JOB, &msg.key()).await.unwrap().unwrap();
    assert_eq!(
        (rec.status, rec.outcome.as_deref()),
        (Status::InProgress, None)
    );
    let left = rec.expires_at_ms - now_ms();
    assert!(
        (3_590_000..=3_600_000).contains(&left),
        "lease_until: {left} ms ahead"
    );
    assert!(
        fx.field(JOB, &msg.key(), "t").await.is_some(),
        "no fencing token"
    );

    tokio::time::sleep(Duration::from_millis(200)).await;
    // At least this much of the lease is gone when the second claim runs
    // (Redis counts whole milliseconds: 1 ms of slack).
    let most = Duration::from_secs(3_600) + Duration::from_millis(1) - claimed.elapsed();
    match job(&fx.store, &msg, &probe, fx).await {
        Err(Error::InProgress {
            retry_after,
            handler: JOB,
            key,
        }) => {
            assert_eq!(key, msg.key());
            // The hint: held for 200 ms, so about that again (less once
            // bodies finished fast), never past the lease's end.
            assert!(retry_after <= most, "{retry_after:?} > {most:?}");
            assert!(retry_after >= Duration::from_millis(10), "{retry_after:?}");
            assert!(retry_after < Duration::from_secs(1), "{retry_after:?}");
        }
        other => panic!("expected InProgress, got {other:?}"),
    }
    probe.open_gate();
    assert_eq!(first.await.unwrap().unwrap(), Outcome::Executed(1));
    assert_eq!(probe.runs(), 1);
}

/// Once the ttl (1 s) is over Redis has expired the record and the key runs
/// again, as a new window.
pub(crate) async fn after_the_ttl_the_key_runs_again(fx: &Fx) {
    let probe = Probe::new();
    let msg = Job::new("j-6", 4);
    assert!(
        short_ttl_job(&fx.store, &msg, &probe, fx)
            .await
            .unwrap()
            .is_executed()
    );
    let first = fx
        .store
        .record(SHORT_TTL, &msg.key())
        .await
        .unwrap()
        .unwrap();
    let pttl = fx.pttl(SHORT_TTL, &msg.key()).await;
    assert!((1..=1_000).contains(&pttl), "PTTL {pttl}");
    assert_eq!(
        short_ttl_job(&fx.store, &msg, &probe, fx).await.unwrap(),
        Outcome::Duplicate(4)
    );

    // Wait past the ttl with a generous margin; Redis never returns a key
    // past its expiry (it expires lazily on access), so this is exact.
    let wait = u64::try_from(first.expires_at_ms - now_ms()).unwrap_or(0) + 500;
    tokio::time::sleep(Duration::from_millis(wait)).await;
    assert!(
        !fx.exists(SHORT_TTL, &msg.key()).await,
        "the record outlived its ttl"
    );
    assert_eq!(fx.store.record(SHORT_TTL, &msg.key()).await.unwrap(), None);

    assert_eq!(
        short_ttl_job(&fx.store, &msg, &probe, fx).await.unwrap(),
        Outcome::Executed(4)
    );
    assert_eq!(probe.runs(), 2);
    assert_eq!(fx.effects("j-6").await, 2);
    let second = fx
        .store
        .record(SHORT_TTL, &msg.key())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(second.status, Status::Completed);
    assert!(
        second.created_at_ms >= first.expires_at_ms,
        "{first:?} {second:?}"
    );
}

/// A `None` key part: `KeyMissing`, no body, nothing written.
pub(crate) async fn none_key_part_is_key_missing_and_the_body_does_not_run(fx: &Fx) {
    let probe = Probe::new();
    let msg = Sms {
        phone: None,
        template: "welcome",
    };
    let err = send_sms(&fx.store, &msg, &probe).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::KeyMissing {
                handler: SMS,
                part: "msg.phone"
            }
        ),
        "{err:?}"
    );
    assert!(err.key().is_none());
    assert_eq!(probe.runs(), 0);
    assert_eq!(fx.keys_by_node().await, Vec::<(String, String)>::new());
}

/// A recorded outcome that no longer decodes into the return type (here:
/// overwritten with `HSET ... o`) is a `Codec` error naming the key; the
/// body does not run.
pub(crate) async fn stored_outcome_that_no_longer_decodes_is_a_codec_error(fx: &Fx) {
    let probe = Probe::new();
    let msg = Job::new("j-11", 6);
    assert_eq!(
        job(&fx.store, &msg, &probe, fx).await.unwrap(),
        Outcome::Executed(6)
    );
    let set: i64 = fx
        .query(
            redis::cmd("HSET")
                .arg(fx.rkey(JOB, &msg.key()))
                .arg("o")
                .arg(r#""points-v1""#),
        )
        .await;
    assert_eq!(set, 0, "the o field existed");
    let err = job(&fx.store, &msg, &probe, fx).await.unwrap_err();
    assert!(
        matches!(&err, Error::Codec { handler: JOB, key, .. } if *key == msg.key()),
        "{err:?}"
    );
    assert_eq!(probe.runs(), 1, "a codec failure must not run the body");
}

/// The body reads its own derived key (to pass on to an external call); it
/// is the key the record is stored under.
pub(crate) async fn body_reads_its_own_key(fx: &Fx) {
    let probe = Probe::new();
    let msg = Sms {
        phone: Some("+100".into()),
        template: "welcome",
    };
    let key = Key::from_parts(&[&"welcome", &"+100"]).unwrap();
    assert_eq!(
        send_sms(&fx.store, &msg, &probe).await.unwrap(),
        Outcome::Executed("sent welcome".to_owned())
    );
    assert_eq!(probe.seen(), [key.as_str()]);
    assert!(fx.rkey(SMS, &key).contains(key.as_str()));
    assert!(fx.exists(SMS, &key).await);
    assert!(
        send_sms(&fx.store, &msg, &probe)
            .await
            .unwrap()
            .is_duplicate()
    );
    assert_eq!(probe.runs(), 1);
}

/// A stalled body loses its lease to another consumer. Consumer A claims
/// with a 300 ms lease and parks; its heartbeat would keep the lease alive,
/// so the test lets the lease run out as it would for a consumer stalled
/// past its lease (the record's TTL is cut to 1 ms, see
/// [`Fx::run_out_lease`]). Consumer B then claims the key, runs and
/// completes. When A's body finishes, its completion carries a stale token:
/// `LeaseLost`, and B's outcome is the one recorded.
pub(crate) async fn stalled_body_loses_its_lease_and_its_completion_is_lease_lost(fx: &Fx) {
    let probe = Probe::new();
    let key = Job::new("s-1", 0).key();
    let a = spawn_short_lease_job(fx, &probe, Job::parked("s-1", 1));
    probe.wait_parked().await;
    let token_a = fx.field(SHORT_LEASE, &key, "t").await.expect("A's token");

    // While A's lease holds (the heartbeat extends it), B is turned away.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let b = short_lease_job(&fx.store, &Job::new("s-1", 2), &probe, fx).await;
    assert!(matches!(b, Err(Error::InProgress { .. })), "{b:?}");

    fx.run_out_lease(SHORT_LEASE, &key).await;
    let b = short_lease_job(&fx.store, &Job::new("s-1", 2), &probe, fx).await;
    assert_eq!(b.unwrap(), Outcome::Executed(2), "B takes the key over");
    let rec = fx.store.record(SHORT_LEASE, &key).await.unwrap().unwrap();
    assert_eq!(
        (rec.status, rec.outcome.as_deref()),
        (Status::Completed, Some("2"))
    );

    // A finishes late: its result is not recorded.
    probe.open_gate();
    match a.await.unwrap() {
        Err(Error::LeaseLost { handler, key: k }) => {
            assert_eq!(handler, SHORT_LEASE);
            assert_eq!(k, key);
        }
        other => panic!("expected LeaseLost, got {other:?}"),
    }
    // Exactly one completion stands: B's, kept for the ttl, without token.
    let rec = fx.store.record(SHORT_LEASE, &key).await.unwrap().unwrap();
    assert_eq!(
        (rec.status, rec.outcome.as_deref()),
        (Status::Completed, Some("2"))
    );
    assert_eq!(
        fx.field(SHORT_LEASE, &key, "t").await,
        None,
        "A's token {token_a}"
    );
    assert!(
        fx.pttl(SHORT_LEASE, &key).await > 3_500_000,
        "ttl, not lease"
    );
    for value in [3, 4] {
        assert_eq!(
            short_lease_job(&fx.store, &Job::new("s-1", value), &probe, fx)
                .await
                .unwrap(),
            Outcome::Duplicate(2)
        );
    }
    // Both bodies ran: that is what LeaseLost warns about.
    assert_eq!(probe.runs(), 2);
    assert_eq!(fx.effects("s-1").await, 2);
}

/// A's lease runs out while its body is stalled, but nobody takes the key
/// over: when A finishes, its completion is recorded (as on the SQL stores),
/// because the body's effect happened and a redelivery must not repeat it.
pub(crate) async fn a_late_completion_nobody_overtook_is_recorded(fx: &Fx) {
    let probe = Probe::new();
    let key = Job::new("late-1", 0).key();
    let a = spawn_short_lease_job(fx, &probe, Job::parked("late-1", 1));
    probe.wait_parked().await;
    fx.run_out_lease(SHORT_LEASE, &key).await;
    assert!(!fx.exists(SHORT_LEASE, &key).await, "the lease ran out");

    probe.open_gate();
    assert_eq!(a.await.unwrap().unwrap(), Outcome::Executed(1));
    let rec = fx.store.record(SHORT_LEASE, &key).await.unwrap().unwrap();
    assert_eq!(
        (rec.status, rec.outcome.as_deref()),
        (Status::Completed, Some("1"))
    );
    assert!(
        fx.pttl(SHORT_LEASE, &key).await > 3_500_000,
        "kept for the ttl"
    );
    assert_eq!(
        short_lease_job(&fx.store, &Job::new("late-1", 9), &probe, fx)
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
pub(crate) async fn stale_failure_after_a_takeover_does_not_release_the_new_claim(fx: &Fx) {
    let (probe_a, probe_c) = (Probe::new(), Probe::new());
    let key = Job::new("s-2", 0).key();
    let failing = Job {
        fail: true,
        ..Job::parked("s-2", 1)
    };
    let a = spawn_short_lease_job(fx, &probe_a, failing);
    probe_a.wait_parked().await;
    fx.run_out_lease(SHORT_LEASE, &key).await;

    let c = spawn_short_lease_job(fx, &probe_c, Job::parked("s-2", 3));
    probe_c.wait_parked().await;
    let token_c = fx.field(SHORT_LEASE, &key, "t").await.expect("C's token");

    probe_a.open_gate();
    let a = a.await.unwrap();
    assert!(matches!(&a, Err(Error::Handler { .. })), "{a:?}");
    assert_eq!(
        fx.field(SHORT_LEASE, &key, "t").await.as_deref(),
        Some(token_c.as_str()),
        "A's stale release deleted C's claim"
    );
    let d = short_lease_job(&fx.store, &Job::new("s-2", 4), &probe_a, fx).await;
    assert!(matches!(d, Err(Error::InProgress { .. })), "{d:?}");

    probe_c.open_gate();
    assert_eq!(c.await.unwrap().unwrap(), Outcome::Executed(3));
    assert_eq!(
        short_lease_job(&fx.store, &Job::new("s-2", 5), &probe_a, fx)
            .await
            .unwrap(),
        Outcome::Duplicate(3)
    );
    assert_eq!((probe_a.runs(), probe_c.runs()), (1, 1));
    assert_eq!(fx.effects("s-2").await, 1);
}

/// The heartbeat for real: a body that takes about 1 s under a 300 ms lease
/// keeps its claim (extended every 100 ms), so a second consumer 600 ms in
/// is turned away, and the first completes.
pub(crate) async fn heartbeat_keeps_a_long_body_s_lease_alive(fx: &Fx) {
    let probe = Probe::new();
    let key = Job::new("h-1", 0).key();
    let start = Instant::now();
    let slow = Job {
        sleep: Some(Duration::from_millis(1_000)),
        ..Job::new("h-1", 1)
    };
    let a = spawn_short_lease_job(fx, &probe, slow);
    eventually(Duration::from_secs(5), "A claimed the key", || async {
        probe.runs() == 1
    })
    .await;

    tokio::time::sleep(Duration::from_millis(600).saturating_sub(start.elapsed())).await;
    match short_lease_job(&fx.store, &Job::new("h-1", 2), &probe, fx).await {
        Err(Error::InProgress { retry_after, .. }) => {
            assert!(retry_after <= Duration::from_millis(300), "{retry_after:?}");
        }
        other => panic!("a second consumer took over a lease the heartbeat should keep: {other:?}"),
    }
    // Twice the lease after the claim, the record stands: it was extended.
    let rec = fx.store.record(SHORT_LEASE, &key).await.unwrap().unwrap();
    assert_eq!(rec.status, Status::InProgress);
    assert!(
        rec.updated_at_ms > rec.created_at_ms,
        "never extended: {rec:?}"
    );

    assert_eq!(a.await.unwrap().unwrap(), Outcome::Executed(1));
    assert!(start.elapsed() >= Duration::from_millis(1_000));
    assert_eq!(probe.runs(), 1);
    assert_eq!(fx.effects("h-1").await, 1);
    let rec = fx.store.record(SHORT_LEASE, &key).await.unwrap().unwrap();
    assert_eq!(
        (rec.status, rec.outcome.as_deref()),
        (Status::Completed, Some("1"))
    );
}
