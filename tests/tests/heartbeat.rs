//! The lease keeper: leases are extended by one task per runtime, not by
//! the calls' own tasks, so a body that blocks its thread (a synchronous
//! client, heavy work) keeps its lease on a multi-threaded runtime and a
//! second consumer is told it is in progress; a completion that the store
//! refuses is retried while the lease the keeper renews holds; a lost
//! lease is logged; one keeper serves every call of a runtime, batches
//! included, and a runtime that shuts down takes its keeper only.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem_runtime::{Error, MemoryStore, Outcome, idempotent};

#[derive(Clone, serde::Deserialize)]
struct Job {
    id: u32,
}

static RUNS: AtomicUsize = AtomicUsize::new(0);

#[idempotent(
    key = "id",
    ttl = "1h",
    store = "memory",
    lease = "300ms",
    name = "hb_blocking"
)]
async fn blocking(msg: &Job) -> Result<u32, std::io::Error> {
    RUNS.fetch_add(1, Ordering::SeqCst);
    // Blocks this worker thread for four lease periods without yielding.
    std::thread::sleep(Duration::from_millis(1_200));
    Ok(msg.id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn a_body_that_blocks_its_thread_keeps_its_lease() {
    let store = MemoryStore::new();
    let first = {
        let store = store.clone();
        tokio::spawn(async move { blocking(&store, &Job { id: 1 }).await })
    };
    tokio::time::sleep(Duration::from_millis(600)).await;
    match blocking(&store, &Job { id: 1 }).await {
        Err(Error::InProgress { retry_after, .. }) => {
            assert!(retry_after <= Duration::from_millis(300))
        }
        other => panic!("the second consumer should be told to wait, got {other:?}"),
    }
    assert_eq!(
        first.await.expect("task").expect("first"),
        Outcome::Executed(1)
    );
    assert_eq!(
        blocking(&store, &Job { id: 1 }).await.expect("after"),
        Outcome::Duplicate(1)
    );
    assert_eq!(RUNS.load(Ordering::SeqCst), 1, "the body ran once");
}

// ---------------------------------------------------------------------------
// The lease keeper: one per runtime, for every call and store on it

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use idem_runtime::registry::HandlerSpec;
use idem_runtime::store::{Claim, Failure, LeaseStore};
use idem_runtime::{Key, StoreError};

/// A memory store that counts extensions and can be told to fail them,
/// to lose them, or to fail completions for a while.
#[derive(Clone, Default)]
struct Unsteady {
    inner: MemoryStore,
    extends: Arc<AtomicUsize>,
    /// Extensions fail with a store error.
    extend_fails: Arc<AtomicBool>,
    /// Extensions answer that the lease is lost.
    extend_lost: Arc<AtomicBool>,
    /// This many more extensions answer that the lease is lost.
    lose_next: Arc<AtomicUsize>,
    /// Completions fail with a store error until then.
    complete_fails_until: Arc<Mutex<Option<Instant>>>,
}

fn outage() -> StoreError {
    StoreError::Timeout(Duration::from_millis(1))
}

impl LeaseStore for Unsteady {
    fn store_name(&self) -> &'static str {
        "unsteady"
    }
    async fn claim(
        &self,
        spec: &'static HandlerSpec,
        key: &Key,
        fingerprint: Option<&str>,
    ) -> Result<Claim, StoreError> {
        self.inner.claim(spec, key, fingerprint).await
    }
    async fn fail(
        &self,
        spec: &'static HandlerSpec,
        key: &Key,
        token: &str,
        failure: Failure<'_>,
    ) -> Result<bool, StoreError> {
        self.inner.fail(spec, key, token, failure).await
    }
    async fn complete(
        &self,
        spec: &'static HandlerSpec,
        key: &Key,
        token: &str,
        outcome: &str,
    ) -> Result<bool, StoreError> {
        let until = *self.complete_fails_until.lock().unwrap();
        if until.is_some_and(|until| Instant::now() < until) {
            return Err(outage());
        }
        self.inner.complete(spec, key, token, outcome).await
    }
    async fn release(
        &self,
        spec: &'static HandlerSpec,
        key: &Key,
        token: &str,
    ) -> Result<(), StoreError> {
        self.inner.release(spec, key, token).await
    }
    async fn extend(
        &self,
        spec: &'static HandlerSpec,
        key: &Key,
        token: &str,
    ) -> Result<bool, StoreError> {
        self.extends.fetch_add(1, Ordering::SeqCst);
        if self.extend_fails.load(Ordering::SeqCst) {
            return Err(outage());
        }
        if self.extend_lost.load(Ordering::SeqCst) {
            return Ok(false);
        }
        let lose = |n: usize| n.checked_sub(1);
        if self
            .lose_next
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, lose)
            .is_ok()
        {
            return Ok(false);
        }
        self.inner.extend(spec, key, token).await
    }
}

/// A body that waits `msg.id` milliseconds (without blocking its thread).
#[idempotent(
    key = "id",
    ttl = "1h",
    store = "memory",
    lease = "300ms",
    name = "hb_waits"
)]
async fn waits(msg: &Job) -> Result<u32, std::io::Error> {
    tokio::time::sleep(Duration::from_millis(u64::from(msg.id))).await;
    Ok(msg.id)
}

/// As [`waits`], under a 1.2 s lease (extended every 400 ms).
#[idempotent(
    key = "id",
    ttl = "1h",
    store = "memory",
    lease = "1200ms",
    name = "hb_waits_1200ms"
)]
async fn waits_1200ms(msg: &Job) -> Result<u32, std::io::Error> {
    tokio::time::sleep(Duration::from_millis(u64::from(msg.id))).await;
    Ok(msg.id)
}

/// As [`waits`], under a 30 s lease: nothing is due to be extended
/// during a test.
#[idempotent(
    key = "id",
    ttl = "1h",
    store = "memory",
    lease = "30s",
    name = "hb_waits_long"
)]
async fn waits_long(msg: &Job) -> Result<u32, std::io::Error> {
    tokio::time::sleep(Duration::from_millis(u64::from(msg.id))).await;
    Ok(msg.id)
}

/// The body succeeds, then completion fails for 1.5 s, longer than the
/// 1.2 s lease: the keeper keeps extending the lease meanwhile, and the
/// completion, retried for as long as the lease it last renewed holds (the
/// pause between tries grows to 500 ms), lands. Counted from the claim
/// alone, the lease would have ended first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_is_retried_while_the_keeper_renews_the_lease() {
    let store = Unsteady::default();
    let body_ends = Instant::now() + Duration::from_millis(50);
    *store.complete_fails_until.lock().unwrap() = Some(body_ends + Duration::from_millis(1_500));
    let start = Instant::now();
    let r = waits_1200ms(&store, &Job { id: 50 }).await;
    assert_eq!(r.unwrap(), Outcome::Executed(50));
    assert!(
        start.elapsed() >= Duration::from_millis(1_500),
        "{:?}",
        start.elapsed()
    );
    assert!(
        store.extends.load(Ordering::SeqCst) >= 3,
        "the lease was renewed meanwhile"
    );
    assert_eq!(
        waits_1200ms(&store, &Job { id: 50 }).await.unwrap(),
        Outcome::Duplicate(50)
    );
}

/// Completion and extension both fail (the store is away): the call stops
/// retrying before the lease it last renewed (at the claim) ends, 300 ms
/// after the claim, and says the effect happened without a record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_gives_up_when_the_lease_it_knows_of_ends() {
    let store = Unsteady::default();
    store.extend_fails.store(true, Ordering::SeqCst);
    *store.complete_fails_until.lock().unwrap() = Some(Instant::now() + Duration::from_secs(60));
    let start = Instant::now();
    let r = waits(&store, &Job { id: 20 }).await;
    let took = start.elapsed();
    assert!(matches!(r, Err(Error::NotRecorded { .. })), "{r:?}");
    assert!(
        (Duration::from_millis(100)..Duration::from_millis(350)).contains(&took),
        "gave up after {took:?} under a 300 ms lease"
    );
    assert!(
        store.extends.load(Ordering::SeqCst) >= 1,
        "the keeper tried"
    );
}

/// The events logged, for the test that loses a lease.
static LOGGED: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Keeps every event's message (`tracing`'s default subscriber is per
/// thread; the keeper logs from its own tasks, so this one is global).
struct Log;

struct Message(String);

impl tracing::field::Visit for Message {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
}

impl tracing::Subscriber for Log {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let mut message = Message(String::new());
        event.record(&mut message);
        LOGGED.lock().unwrap().push(message.0);
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// The store says the lease is lost when the keeper extends it: the keeper
/// logs it once and stops extending it; the body runs to its end (a lost
/// lease does not cancel it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lease_is_logged_once() {
    let _ = tracing::subscriber::set_global_default(Log);
    let lost = |logged: &[String]| {
        logged
            .iter()
            .filter(|m| m.contains("lease lost while the body runs"))
            .count()
    };
    let store = Unsteady::default();
    store.extend_lost.store(true, Ordering::SeqCst);
    let before = lost(&LOGGED.lock().unwrap());
    let r = waits(&store, &Job { id: 600 }).await;
    assert_eq!(r.unwrap(), Outcome::Executed(600));
    assert_eq!(lost(&LOGGED.lock().unwrap()) - before, 1);
    assert_eq!(
        store.extends.load(Ordering::SeqCst),
        1,
        "extended after it was lost"
    );
}

/// Two hundred calls in their bodies at once: one keeper task serves them
/// all (the runtime holds the calls' tasks, the keeper, and nothing per
/// call besides), and a lease no renewal is due for is never extended
/// while its body runs; dropped, each is extended once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_keeper_serves_every_call_of_a_runtime() {
    const CALLS: u32 = 200;
    let store = Unsteady::default();
    let metrics = tokio::runtime::Handle::current().metrics();
    let calls: Vec<_> = (0..CALLS)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move { waits_long(&store, &Job { id: 10_000 + i }).await })
        })
        .collect();
    eventually(|| store.inner.len() == CALLS as usize).await;
    let alive = metrics.num_alive_tasks();
    assert!(
        alive <= CALLS as usize + 3,
        "{alive} tasks for {CALLS} calls: a task per call besides its own?"
    );
    assert_eq!(store.extends.load(Ordering::SeqCst), 0);
    // Dropped mid-body, each call's lease is extended once more, so that
    // its key is held a whole lease from the drop.
    for call in calls {
        call.abort();
    }
    eventually(|| store.extends.load(Ordering::SeqCst) == CALLS as usize).await;
}

/// A hundred calls whose bodies outlast three of their 300 ms leases: the
/// shared keeper extends each (every 100 ms), so a second delivery of any
/// of them is told it is in progress, and each completes as executed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shared_keeper_extends_every_long_call() {
    const CALLS: u32 = 100;
    let store = Unsteady::default();
    let calls: Vec<_> = (0..CALLS)
        .map(|i| {
            let store = store.clone();
            // Ids 1_000.. are the bodies' milliseconds.
            tokio::spawn(async move { waits(&store, &Job { id: 1_000 + i }).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(700)).await;
    for i in 0..CALLS {
        match waits(&store, &Job { id: 1_000 + i }).await {
            Err(Error::InProgress { .. }) => {}
            other => panic!("call {i}'s lease lapsed: {other:?}"),
        }
    }
    for (i, call) in calls.into_iter().enumerate() {
        let id = 1_000 + u32::try_from(i).unwrap();
        assert_eq!(call.await.unwrap().unwrap(), Outcome::Executed(id));
    }
    let extends = store.extends.load(Ordering::SeqCst);
    assert!(
        extends >= CALLS as usize * 6,
        "{extends} extensions for {CALLS} calls of 1 s under 300 ms leases"
    );
}

/// A batch whose body waits as many milliseconds as its largest id
/// (without blocking its thread), and answers each message's id.
#[idempotent(
    key = "id",
    ttl = "1h",
    store = "memory",
    lease = "300ms",
    name = "hb_batch_waits"
)]
async fn batch_waits(msgs: &[Job]) -> Result<Vec<u32>, std::io::Error> {
    let ms = msgs.iter().map(|m| m.id).max().unwrap_or(0);
    tokio::time::sleep(Duration::from_millis(u64::from(ms))).await;
    Ok(msgs.iter().map(|m| m.id).collect())
}

/// As [`batch_waits`], under a 30 s lease: nothing is due to be extended
/// during a test.
#[idempotent(
    key = "id",
    ttl = "1h",
    store = "memory",
    lease = "30s",
    name = "hb_batch_waits_long"
)]
async fn batch_waits_long(msgs: &[Job]) -> Result<Vec<u32>, std::io::Error> {
    let ms = msgs.iter().map(|m| m.id).max().unwrap_or(0);
    tokio::time::sleep(Duration::from_millis(u64::from(ms))).await;
    Ok(msgs.iter().map(|m| m.id).collect())
}

fn jobs(ids: &[u32]) -> Vec<Job> {
    ids.iter().map(|&id| Job { id }).collect()
}

/// A batch whose body outlasts three of its 300 ms leases: the keeper
/// extends its claims (every 100 ms), so a second delivery of the batch is
/// told that each key is in progress, and the batch completes as executed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_keeper_extends_a_batch_s_claims() {
    let store = Unsteady::default();
    let ids = [1_000, 1_001, 1_002];
    let first = {
        let store = store.clone();
        tokio::spawn(async move { batch_waits(&store, &jobs(&ids)).await })
    };
    tokio::time::sleep(Duration::from_millis(700)).await;
    let second = batch_waits(&store, &jobs(&ids)).await.expect("the batch");
    for (id, r) in ids.iter().zip(&second) {
        assert!(
            matches!(r, Err(Error::InProgress { .. })),
            "{id}'s lease lapsed: {r:?}"
        );
    }
    let first = first.await.unwrap().expect("the first batch");
    let executed: Vec<_> = ids.iter().map(|&id| Outcome::Executed(id)).collect();
    assert_eq!(
        first.into_iter().map(Result::unwrap).collect::<Vec<_>>(),
        executed
    );
    let extends = store.extends.load(Ordering::SeqCst);
    assert!(
        extends >= ids.len() * 6,
        "{extends} extensions for 3 keys of a 1 s batch under 300 ms leases"
    );
}

/// Fifty batches in their bodies at once: the keeper serves them as it
/// serves single calls (the runtime holds the batches' tasks, the keeper,
/// and nothing per batch besides), and claims no renewal is due for are
/// never extended while the body runs; dropped, each is extended once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_keeper_serves_every_batch_of_a_runtime() {
    const BATCHES: u32 = 50;
    let store = Unsteady::default();
    let metrics = tokio::runtime::Handle::current().metrics();
    let batches: Vec<_> = (0..BATCHES)
        .map(|i| {
            let store = store.clone();
            let ids = [10_000 + 2 * i, 10_001 + 2 * i];
            tokio::spawn(async move { batch_waits_long(&store, &jobs(&ids)).await })
        })
        .collect();
    eventually(|| store.inner.len() == 2 * BATCHES as usize).await;
    let alive = metrics.num_alive_tasks();
    assert!(
        alive <= BATCHES as usize + 3,
        "{alive} tasks for {BATCHES} batches: a task per batch besides its own?"
    );
    assert_eq!(store.extends.load(Ordering::SeqCst), 0);
    // Dropped mid-body, each batch's claims are extended once more.
    for batch in batches {
        batch.abort();
    }
    eventually(|| store.extends.load(Ordering::SeqCst) == 2 * BATCHES as usize).await;
}

/// A batch's completion keeps failing while its claims are renewed: the
/// batch stops retrying one lease (300 ms) after the first failure at
/// most, and says the effects happened without a record, where a single
/// call would retry for as long as the keeper renews its lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_completion_gives_up_one_lease_after_its_first_failure() {
    let store = Unsteady::default();
    *store.complete_fails_until.lock().unwrap() = Some(Instant::now() + Duration::from_secs(60));
    let start = Instant::now();
    // The body takes 151 ms: the claims are renewed during it.
    let r = batch_waits(&store, &jobs(&[150, 151])).await;
    let took = start.elapsed();
    assert!(matches!(r, Err(Error::NotRecorded { .. })), "{r:?}");
    assert!(
        (Duration::from_millis(150)..Duration::from_millis(600)).contains(&took),
        "gave up after {took:?}, the first failure after 151 ms, under 300 ms leases"
    );
    assert!(
        store.extends.load(Ordering::SeqCst) >= 2,
        "the keeper renewed both claims"
    );
}

/// The store says one of a batch's two leases is lost at the first
/// renewal (about 100 ms in): the keeper logs it once and renews only the
/// other from then on, so 450 ms in, past the 300 ms lease, the other key
/// is still in progress and the lost one is free to take over (and its
/// outcome is then not the batch's to record).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_keeps_the_claims_it_did_not_lose() {
    let _ = tracing::subscriber::set_global_default(Log);
    let lost = |logged: &[String]| {
        logged
            .iter()
            .filter(|m| m.contains("leases lost while the batch body runs"))
            .count()
    };
    let store = Unsteady::default();
    store.lose_next.store(1, Ordering::SeqCst);
    let before = lost(&LOGGED.lock().unwrap());
    let first = {
        let store = store.clone();
        tokio::spawn(async move { batch_waits(&store, &jobs(&[600, 601])).await })
    };
    tokio::time::sleep(Duration::from_millis(450)).await;
    let kept = batch_waits(&store, &jobs(&[601])).await.unwrap();
    assert!(matches!(kept[0], Err(Error::InProgress { .. })), "{kept:?}");
    let takeover = {
        let store = store.clone();
        tokio::spawn(async move { batch_waits(&store, &jobs(&[600])).await })
    };
    let first = first.await.unwrap().unwrap();
    assert!(
        matches!(first[0], Err(Error::LeaseLost { .. })),
        "{:?}",
        first[0]
    );
    assert_eq!(first[1].as_ref().unwrap(), &Outcome::Executed(601));
    let takeover = takeover.await.unwrap().unwrap();
    assert_eq!(takeover[0].as_ref().unwrap(), &Outcome::Executed(600));
    assert_eq!(lost(&LOGGED.lock().unwrap()) - before, 1);
}

/// Waits until `done`, for five seconds at most.
async fn eventually(done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !done() {
        assert!(Instant::now() < deadline, "timed out");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Each runtime has a keeper of its own: a call on runtime B keeps its
/// lease while runtime A, whose call started a keeper first, shuts down;
/// a runtime started afterwards gets a keeper again.
#[test]
fn a_runtime_that_shuts_down_takes_only_its_own_keeper() {
    let runtime = || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    };
    let store = Unsteady::default();
    let a = runtime();
    let b = runtime();
    // A's keeper first.
    assert!(
        a.block_on(waits(&store, &Job { id: 5 }))
            .unwrap()
            .is_executed()
    );
    let long = {
        let store = store.clone();
        b.spawn(async move { waits(&store, &Job { id: 1_500 }).await })
    };
    std::thread::sleep(Duration::from_millis(100));
    drop(a);
    std::thread::sleep(Duration::from_millis(700));
    // Past two of its leases: still held.
    let second = b.block_on(waits(&store, &Job { id: 1_500 }));
    assert!(
        matches!(second, Err(Error::InProgress { .. })),
        "{second:?}"
    );
    assert_eq!(b.block_on(long).unwrap().unwrap(), Outcome::Executed(1_500));
    drop(b);

    let c = runtime();
    let extends = store.extends.load(Ordering::SeqCst);
    assert_eq!(
        c.block_on(waits(&store, &Job { id: 700 })).unwrap(),
        Outcome::Executed(700)
    );
    assert!(
        store.extends.load(Ordering::SeqCst) >= extends + 4,
        "no keeper on runtime C"
    );
}
