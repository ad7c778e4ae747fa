//! Lease mode on a Redis Cluster that changes under the consumers: three
//! masters with a replica each, started on free loopback ports by this test
//! (and killed afterwards, also on failure). While consumers (tokio tasks on
//! two cluster connections) run same-key storms and a stream of fresh
//! messages, single calls and batch calls, the test
//!
//! 1. moves the four slots that hold those keys to another master and back,
//!    by hand (`CLUSTER SETSLOT ... IMPORTING/MIGRATING`, `MIGRATE` one key
//!    at a time, `SETSLOT ... NODE`), so calls meet slots half moved;
//! 2. fails their master over gracefully (`CLUSTER FAILOVER` on its
//!    replica);
//! 3. kills that master with SIGKILL after pausing its writes until its
//!    replica had them all (`CLIENT PAUSE WRITE`, then the replica's offset):
//!    nothing it acknowledged is lost;
//! 4. kills another master with SIGKILL in the middle of the traffic: what
//!    it acknowledged and had not yet sent to its replica may be lost, as
//!    Redis's asynchronous replication allows.
//!
//! Every body's effect is written in a ledger (in this process: the
//! consumers are not what crashes here, the servers are), and every call's
//! answer is counted. Phases 1 to 3 must show no effect doubled, every call
//! ending with an outcome or a retryable error (`InProgress`, `Store`), every
//! retried message reaching `Executed` exactly once, and nothing lost: each
//! key's record is there afterwards (a last call is a `Duplicate`). Phase 4
//! must show the same, except that an effect may run twice for a key whose
//! first run came before the kill and whose second came after it (the lost
//! write), and each such key is counted and printed. The counts of every
//! phase are printed, with the message that took longest to settle and the
//! answers it had on the way (a claim left to its lease shows there).
//!
//! Before the phases, one scenario shows the case that the store must send
//! as separate commands: a batch with two keys in one slot that is half
//! moved, one key still on the old master and one that is not.
//!
//! One `#[test]`: it owns the cluster, so no process outlives the run.

mod common;

#[path = "redis_cluster_change/half_moved.rs"]
mod half_moved;
#[path = "redis_cluster_change/phase.rs"]
mod phase;

use std::collections::{BTreeMap, HashMap};
use std::io::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem_runtime::{Error, Key, Outcome, RedisStore, idempotent};
use idem_tests::{ClusterNode, RedisCluster, crc16_after, key_slot};

use common::{AppError, RedisFx};
use half_moved::{a_batch_across_a_slot_half_moved, slots_of};
use phase::phase;

/// The registered name of [`apply_one`].
const SINGLE: &str = "rcc_single";
/// The registered name of [`apply_batch`].
const BATCH: &str = "rcc_batch";

/// A message: its id is its key.
#[derive(Debug, Clone)]
struct Msg {
    id: String,
}

impl Msg {
    fn new(id: &str) -> Msg {
        Msg { id: id.to_owned() }
    }
}

/// Every body's effects: when each run of each (handler, id) happened.
#[derive(Default)]
struct Ledger {
    runs: Mutex<HashMap<String, Vec<Instant>>>,
}

impl Ledger {
    fn apply(&self, handler: &str, id: &str) {
        self.runs
            .lock()
            .unwrap()
            .entry(format!("{handler}/{id}"))
            .or_default()
            .push(Instant::now());
    }

    /// How many times the body of `handler` ran for `id`.
    fn count(&self, handler: &str, id: &str) -> usize {
        self.runs
            .lock()
            .unwrap()
            .get(&format!("{handler}/{id}"))
            .map_or(0, Vec::len)
    }

    fn snapshot(&self) -> HashMap<String, Vec<Instant>> {
        self.runs.lock().unwrap().clone()
    }
}

/// A body with an external effect, held for a moment so that a storm meets
/// the claim in progress.
#[idempotent(
    key = "msg.id",
    ttl = "1h",
    lease = "10s",
    store = "redis",
    name = "rcc_single"
)]
async fn apply_one(msg: &Msg, ledger: &Ledger) -> Result<u32, AppError> {
    ledger.apply(SINGLE, &msg.id);
    tokio::time::sleep(Duration::from_millis(2)).await;
    Ok(1)
}

/// The batch form: one effect per fresh message.
#[idempotent(
    key = "msgs.id",
    ttl = "1h",
    lease = "10s",
    store = "redis",
    name = "rcc_batch"
)]
async fn apply_batch(msgs: &[Msg], ledger: &Ledger) -> Result<Vec<u32>, AppError> {
    for msg in msgs {
        ledger.apply(BATCH, &msg.id);
    }
    tokio::time::sleep(Duration::from_millis(2)).await;
    Ok(vec![1; msgs.len()])
}

/// An error in a few words: its kind, and a store error's.
fn shown(e: &Error<AppError>) -> String {
    match e {
        Error::Store { .. } => store_kind(e),
        Error::InProgress { retry_after, .. } => format!("in_progress {retry_after:?}"),
        e => e.kind().to_owned(),
    }
}

/// Whether a consumer retries the error (the consumers' verdict: a retry
/// that is not a failed attempt).
fn retryable(e: &Error<AppError>) -> bool {
    matches!(e, Error::InProgress { .. } | Error::Store { .. })
}

/// What a store error says, in a word: the cluster's redirections and
/// refusals by name, or the connection's failure.
fn store_kind(e: &Error<AppError>) -> String {
    let text = e.to_string();
    let upper = text.to_uppercase();
    for (said, kind) in [
        ("MOVED", "MOVED"),
        ("ASK:", "ASK"),
        ("ASK ", "ASK"),
        ("TRYAGAIN", "TRYAGAIN"),
        ("CLUSTERDOWN", "CLUSTERDOWN"),
        ("MASTERDOWN", "MASTERDOWN"),
        ("LOADING", "LOADING"),
        ("READONLY", "READONLY"),
    ] {
        if upper.contains(said) {
            return kind.to_owned();
        }
    }
    if text.contains("timed out") {
        return "timeout".to_owned();
    }
    let lower = text.to_lowercase();
    if [
        "connection",
        "broken pipe",
        "refused",
        "reset",
        "no connections",
    ]
    .iter()
    .any(|w| lower.contains(w))
    {
        return "connection".to_owned();
    }
    format!("other: {text}")
}

/// Writes `line` to the process's standard error past libtest's capture,
/// so that a plain run shows it.
fn say(line: String) {
    let _ = std::io::stderr()
        .lock()
        .write_all(format!("{line}\n").as_bytes());
}

/// The answers of one phase's calls.
#[derive(Default, Debug)]
struct Counts {
    single_calls: usize,
    batch_calls: usize,
    batch_messages: usize,
    executed: usize,
    duplicate: usize,
    in_progress: usize,
    store: BTreeMap<String, usize>,
    lease_lost: usize,
    not_recorded: usize,
    /// Anything else, printed: none is expected.
    other: Vec<String>,
    /// Messages that had no outcome when their retries' time was up.
    unsettled: Vec<String>,
    /// Per (handler, id): executed, lease lost, not recorded.
    by_key: HashMap<String, [usize; 3]>,
    /// The message that took longest to settle: how long, which, and the
    /// answers it had on the way.
    slowest: (Duration, String, Vec<String>),
}

impl Counts {
    fn note(&mut self, handler: &str, id: &str, r: &Result<Outcome<u32>, Error<AppError>>) {
        let slot = |c: &mut Counts, i: usize| {
            c.by_key.entry(format!("{handler}/{id}")).or_default()[i] += 1;
        };
        match r {
            Ok(Outcome::Executed(_)) => {
                self.executed += 1;
                slot(self, 0);
            }
            Ok(Outcome::Duplicate(_)) => self.duplicate += 1,
            Err(Error::InProgress { .. }) => self.in_progress += 1,
            Err(e @ Error::Store { .. }) => *self.store.entry(store_kind(e)).or_default() += 1,
            Err(Error::LeaseLost { .. }) => {
                self.lease_lost += 1;
                slot(self, 1);
            }
            Err(Error::NotRecorded { .. }) => {
                self.not_recorded += 1;
                slot(self, 2);
            }
            Err(e) => self.other.push(format!("{handler}/{id}: {e}")),
        }
    }

    /// Notes how long `key` took to settle, through `seen`.
    fn settled(&mut self, key: String, took: Duration, seen: Vec<String>) {
        if took > self.slowest.0 {
            self.slowest = (took, key, seen);
        }
    }

    fn store_errors(&self) -> usize {
        self.store.values().sum()
    }
}

/// Ids whose records (of one handler, under the test's prefix) are in the
/// phase's slots, made as they are asked for.
struct Ids {
    stem: String,
    handler: &'static str,
    /// The CRC16 of the record's hash tag up to the id's counter: the
    /// tag is `<len>:<handler>|<len>:<id>` and an id `<stem>-<10 digits>`
    /// (a `u32` counter never outgrows them),
    /// so only the digits change from one candidate to the next.
    crc_before: u16,
    tried: u32,
    issued: Vec<String>,
}

/// What the consumers share in a phase.
struct Traffic {
    stores: Vec<RedisStore>,
    ledger: Ledger,
    counts: Mutex<Counts>,
    /// Whether a slot is one of the phase's.
    slots: Vec<bool>,
    /// Fresh messages of single calls and of batch calls, handed out in
    /// order.
    fresh: [Mutex<Ids>; 2],
    /// The storm keys of single calls and of batch calls, one per 50 ms.
    storms: [Mutex<Ids>; 2],
    started: Instant,
    stop: AtomicBool,
    /// When a message's retries give up.
    retry_for: Duration,
}

const STORM_EVERY: Duration = Duration::from_millis(50);

impl Traffic {
    fn new(name: &str, stores: &[RedisStore], slots: &[u16]) -> Traffic {
        let mut in_phase = vec![false; 16384];
        for &s in slots {
            in_phase[usize::from(s)] = true;
        }
        let ids = |what: &str, handler: &'static str| {
            // Spaces are no part of a stem: the ids are keys of their own.
            let stem = format!("{name}-{what}").replace(' ', "-");
            let id_len = stem.len() + 11;
            let head = format!("{}:{handler}|{id_len}:{stem}-", handler.len());
            Mutex::new(Ids {
                crc_before: crc16_after(0, head.as_bytes()),
                stem,
                handler,
                tried: 0,
                issued: Vec::new(),
            })
        };
        Traffic {
            stores: stores.to_vec(),
            ledger: Ledger::default(),
            counts: Mutex::default(),
            slots: in_phase,
            fresh: [ids("fresh", SINGLE), ids("fresh", BATCH)],
            storms: [ids("storm", SINGLE), ids("storm", BATCH)],
            started: Instant::now(),
            stop: AtomicBool::new(false),
            retry_for: Duration::from_secs(30),
        }
    }

    fn store(&self, worker: usize) -> &RedisStore {
        &self.stores[worker % self.stores.len()]
    }

    /// The next id of `ids` whose record is in the phase's slots.
    fn issue(&self, ids: &mut Ids) {
        loop {
            let n = ids.tried;
            ids.tried += 1;
            let mut digits = [0u8; 10];
            let mut rest = n;
            for d in digits.iter_mut().rev() {
                *d = b'0' + u8::try_from(rest % 10).expect("a digit");
                rest /= 10;
            }
            let slot = crc16_after(ids.crc_before, &digits) & 0x3fff;
            if self.slots[usize::from(slot)] {
                let id = format!("{}-{n:010}", ids.stem);
                // The shortcut computes what Redis does with the record's key.
                let key = Key::from_parts(&[&id.as_str()]).expect("a key");
                let rkey = self.stores[0].redis_key(ids.handler, &key);
                assert_eq!(key_slot(rkey.as_bytes()), slot, "{rkey}");
                ids.issued.push(id);
                return;
            }
        }
    }

    /// The storm key of this moment for handler `h` (0 single, 1 batch).
    fn storm_id(&self, h: usize) -> String {
        let n = self.started.elapsed().as_millis() / STORM_EVERY.as_millis();
        let n = usize::try_from(n).expect("a phase of some seconds");
        let mut ids = self.storms[h].lock().unwrap();
        while ids.issued.len() <= n {
            self.issue(&mut ids);
        }
        ids.issued[n].clone()
    }

    /// A fresh message for handler `h` (0 single, 1 batch).
    fn take_fresh(&self, h: usize) -> String {
        let mut ids = self.fresh[h].lock().unwrap();
        self.issue(&mut ids);
        ids.issued.last().expect("issued").clone()
    }

    fn counts(&self) -> std::sync::MutexGuard<'_, Counts> {
        self.counts.lock().unwrap()
    }

    /// One single call, counted.
    async fn single(&self, worker: usize, id: &str) -> Result<Outcome<u32>, Error<AppError>> {
        let r = apply_one(self.store(worker), &Msg::new(id), &self.ledger).await;
        let mut c = self.counts();
        c.single_calls += 1;
        c.note(SINGLE, id, &r);
        r
    }

    /// A single call repeated while its answer is retryable, as a consumer
    /// redelivers, until `retry_for` is up.
    async fn settle_single(&self, worker: usize, id: &str) {
        let t0 = Instant::now();
        let deadline = t0 + self.retry_for;
        let mut wait = Duration::from_millis(20);
        let mut seen = Vec::new();
        loop {
            match self.single(worker, id).await {
                Err(e) if retryable(&e) => seen.push(shown(&e)),
                _ => {
                    self.counts()
                        .settled(format!("{SINGLE}/{id}"), t0.elapsed(), seen);
                    return;
                }
            }
            if Instant::now() > deadline {
                self.counts().unsettled.push(format!("{SINGLE}/{id}"));
                return;
            }
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(Duration::from_millis(400));
        }
    }

    /// A batch call; the messages whose answers are retryable (or all of
    /// them, when the whole call failed with a retryable error) are called
    /// again, as a batch, until `retry_for` is up.
    async fn settle_batch(&self, worker: usize, ids: Vec<String>) {
        let t0 = Instant::now();
        let deadline = t0 + self.retry_for;
        let mut seen = Vec::new();
        let mut wait = Duration::from_millis(20);
        let mut pending: Vec<Msg> = ids.iter().map(|id| Msg::new(id)).collect();
        loop {
            let before: Vec<usize> = pending
                .iter()
                .map(|m| self.ledger.count(BATCH, &m.id))
                .collect();
            let r = apply_batch(self.store(worker), &pending, &self.ledger).await;
            let mut again = Vec::new();
            {
                let mut c = self.counts();
                c.batch_calls += 1;
                c.batch_messages += pending.len();
                match r {
                    Ok(answers) => {
                        assert_eq!(answers.len(), pending.len(), "one answer per message");
                        for (msg, a) in pending.iter().zip(&answers) {
                            c.note(BATCH, &msg.id, a);
                            if let Err(e) = a
                                && retryable(e)
                            {
                                seen.push(format!("{}: {}", msg.id, shown(e)));
                                again.push(msg.clone());
                            }
                        }
                    }
                    Err(e) => {
                        seen.push(format!("batch: {}", shown(&e)));
                        // The whole call failed. A store fault or a busy
                        // key: every message again. A lost lease or an
                        // outcome not recorded: the body ran for the
                        // messages whose runs grew, and the consumer acks.
                        for (msg, was) in pending.iter().zip(&before) {
                            let ran = self.ledger.count(BATCH, &msg.id) > *was;
                            let key = format!("{BATCH}/{}", msg.id);
                            match &e {
                                Error::Store { .. } => {
                                    *c.store.entry(store_kind(&e)).or_default() += 1;
                                    again.push(msg.clone());
                                }
                                Error::InProgress { .. } => {
                                    c.in_progress += 1;
                                    again.push(msg.clone());
                                }
                                Error::LeaseLost { .. } if ran => {
                                    c.lease_lost += 1;
                                    c.by_key.entry(key).or_default()[1] += 1;
                                }
                                Error::NotRecorded { .. } if ran => {
                                    c.not_recorded += 1;
                                    c.by_key.entry(key).or_default()[2] += 1;
                                }
                                Error::LeaseLost { .. } | Error::NotRecorded { .. } => {}
                                other => c.other.push(format!("{key}: {other}")),
                            }
                        }
                    }
                }
            }
            if again.is_empty() {
                let key = format!("{BATCH}/{}", ids.join(","));
                self.counts().settled(key, t0.elapsed(), seen);
                return;
            }
            if Instant::now() > deadline {
                let mut c = self.counts();
                for msg in &again {
                    c.unsettled.push(format!("{BATCH}/{}", msg.id));
                }
                return;
            }
            pending = again;
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(Duration::from_millis(400));
        }
    }
}

/// Runs the consumers until `traffic.stop`: storm workers calling the
/// storm key of the moment (single calls), fresh workers settling one new
/// message at a time (single calls), and batch workers settling batches of
/// new messages with the batch storm key of the moment among them.
fn spawn_consumers(traffic: &Arc<Traffic>) -> Vec<tokio::task::JoinHandle<()>> {
    const STORM_WORKERS: usize = 10;
    const FRESH_WORKERS: usize = 4;
    const BATCH_WORKERS: usize = 4;
    const BATCH_FRESH: usize = 5;
    let mut tasks = Vec::new();
    for w in 0..STORM_WORKERS {
        let t = Arc::clone(traffic);
        tasks.push(tokio::spawn(async move {
            while !t.stop.load(Ordering::Relaxed) {
                let id = t.storm_id(0);
                let _ = t.single(w, &id).await;
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }));
    }
    for w in 0..FRESH_WORKERS {
        let t = Arc::clone(traffic);
        tasks.push(tokio::spawn(async move {
            while !t.stop.load(Ordering::Relaxed) {
                let id = t.take_fresh(0);
                t.settle_single(w, &id).await;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }));
    }
    for w in 0..BATCH_WORKERS {
        let t = Arc::clone(traffic);
        tasks.push(tokio::spawn(async move {
            while !t.stop.load(Ordering::Relaxed) {
                let mut ids = vec![t.storm_id(1)];
                ids.extend((0..BATCH_FRESH).map(|_| t.take_fresh(1)));
                t.settle_batch(w, ids).await;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }));
    }
    tasks
}

#[test]
fn resharding_and_failover_under_storms() {
    let started = Instant::now();
    let Some(cluster) = RedisCluster::start_with_replicas(3, 1) else {
        return;
    };
    say(format!(
        "cluster change: 3 masters and 3 replicas up in {:?}",
        started.elapsed()
    ));
    let urls = cluster.urls();
    let cluster = Arc::new(Mutex::new(cluster));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");

    rt.block_on(async {
        let fx = RedisFx::cluster(&urls, "rcc").await;
        // A second consumer's connection, with its own view of the slots.
        let other = RedisStore::connect_cluster(&urls)
            .await
            .expect("connect to the cluster")
            .with_prefix(&fx.prefix)
            .expect("a valid prefix");
        let stores = vec![fx.store.clone(), other];

        a_batch_across_a_slot_half_moved(&fx, &cluster).await;

        let (a, b) = {
            let c = cluster.lock().unwrap();
            let mut masters: Vec<ClusterNode> = c
                .topology()
                .expect("topology")
                .into_iter()
                .filter(|n| n.master && !n.slots.is_empty())
                .collect();
            masters.sort_by_key(|n| n.slots[0]);
            (masters[0].clone(), masters[1].clone())
        };
        // Slots of `a` that the phases about `a` use (moved to `b` and back,
        // then failed over with `a`).
        let moving = slots_of(&a, 4);

        let mut reports = Vec::new();
        let (to, back) = (b.clone(), a.clone());
        let slots = moving.clone();
        reports.push(
            phase("reshard", &stores, &cluster, &moving, Duration::from_millis(300), move |c| {
                std::thread::sleep(Duration::from_millis(300));
                let c = c.lock().unwrap();
                let mut moved = 0;
                for dest in [&to, &back] {
                    for &slot in &slots {
                        moved += c.migrate_slot(slot, dest, Duration::from_millis(3))?;
                    }
                }
                say(format!("cluster change: reshard: {moved} keys moved, 2 x {} slots", slots.len()));
                Ok(())
            })
            .await,
        );

        let a_now = a.clone();
        reports.push(
            phase("failover", &stores, &cluster, &moving, Duration::from_millis(800), move |c| {
                std::thread::sleep(Duration::from_millis(400));
                let c = c.lock().unwrap();
                let replica = c.replica_of(&a_now)?;
                let t = Instant::now();
                c.failover(&replica, Duration::from_secs(20))?;
                say(format!("cluster change: failover: {} took over from {} in {:?}", replica.port, a_now.port, t.elapsed()));
                Ok(())
            })
            .await,
        );

        let first = moving[0];
        reports.push(
            phase("kill after sync", &stores, &cluster, &moving, Duration::from_millis(800), move |c| {
                std::thread::sleep(Duration::from_millis(400));
                let mut c = c.lock().unwrap();
                let master = c.owner(first)?;
                let replica = c.replica_of(&master)?;
                c.pause_writes_until_replicated(&master, &replica, Duration::from_secs(10))?;
                c.kill(master.port);
                let t = Instant::now();
                c.wait_promoted(&replica, Duration::from_secs(30))?;
                say(format!("cluster change: kill after sync: {} killed, {} took over in {:?}", master.port, replica.port, t.elapsed()));
                Ok(())
            })
            .await,
        );

        let b_slots = slots_of(&b, 4);
        let killed_at = Arc::new(Mutex::new(None::<Instant>));
        let kill_mark = Arc::clone(&killed_at);
        let b_now = b.clone();
        let kill = phase("kill", &stores, &cluster, &b_slots, Duration::from_millis(800), move |c| {
            std::thread::sleep(Duration::from_millis(600));
            let mut c = c.lock().unwrap();
            let replica = c.replica_of(&b_now)?;
            c.kill(b_now.port);
            *kill_mark.lock().unwrap() = Some(Instant::now());
            let t = Instant::now();
            c.wait_promoted(&replica, Duration::from_secs(30))?;
            say(format!("cluster change: kill: {} killed, {} took over in {:?}", b_now.port, replica.port, t.elapsed()));
            Ok(())
        })
        .await;

        for r in &reports {
            r.assert_exactly_once();
        }
        // The kill without a sync: only what the killed master acknowledged
        // and had not replicated may run again, after the kill.
        kill.assert_accounted();
        let killed_at = killed_at.lock().unwrap().expect("the kill's moment");
        for (key, runs) in kill.doubled() {
            assert_eq!(runs.len(), 2, "kill: {key} ran {} times", runs.len());
            assert!(
                runs[0] < killed_at && killed_at < runs[1],
                "kill: {key} ran twice, not across the kill: {:?} and {:?} after the kill",
                killed_at.checked_duration_since(runs[0]),
                runs[1].checked_duration_since(killed_at)
            );
        }
        let explained = kill.doubled().len();
        let line = format!(
            "cluster change: kill: {explained} keys run twice, each first before the SIGKILL and again after it (writes the master acknowledged and had not replicated)\n"
        );
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    });
    drop(rt);
    drop(cluster);
    let took = started.elapsed();
    let line = format!("cluster change: done in {took:?}\n");
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
    assert!(took < Duration::from_secs(120), "{took:?}");
}
