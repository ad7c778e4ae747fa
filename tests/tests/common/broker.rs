//! The consumer suite, written once over a [`Broker`] fixture and run on
//! RabbitMQ (`rabbitmq.rs`) and NATS JetStream (`nats.rs`): what a consumer
//! does with duplicates, undecodable payloads, failing bodies and a shutdown,
//! read back from the broker itself.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_runtime::consume::{
    Broker as Kind, CancellationToken, ConsumeError, Delivery, Policy, Report,
};
use idem_runtime::metric;
use idem_runtime::{Error, Key, MemoryStore, Outcome, StoreError, idempotent};
use serde::{Deserialize, Serialize};
use tokio::task::JoinHandle;

use super::recorder::capture;
use super::{AppError, eventually};

mod cut;
mod outbox;
#[allow(unused_imports)]
pub(crate) use cut::{
    Boxed, Proxied, a_connection_lost_mid_body_leaves_only_the_ack_to_the_redelivery,
    a_stopping_consumer_waits_no_longer_than_its_grace,
    the_token_lets_bodies_in_flight_reach_their_outcome_on_every_store,
};
#[allow(unused_imports)]
pub(crate) use outbox::staged_messages_arrive_once_under_their_ids;

/// A message of the suite.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Points {
    pub(crate) id: String,
    pub(crate) points: u32,
}

impl Points {
    pub(crate) fn payload(id: &str, points: u32) -> Vec<u8> {
        serde_json::to_vec(&Points {
            id: id.to_owned(),
            points,
        })
        .expect("encode")
    }
}

/// A message moved aside, as the broker keeps it.
#[derive(Debug, Clone)]
pub(crate) struct DeadLetter {
    pub(crate) payload: Vec<u8>,
    pub(crate) reason: String,
    /// Failed attempts (RabbitMQ) or deliveries (JetStream) it had.
    pub(crate) attempts: u64,
}

/// A consumer running on a task of its own, stopped by [`Running::stop`].
pub(crate) struct Running {
    stop: CancellationToken,
    task: JoinHandle<Result<Report, ConsumeError>>,
}

impl Running {
    pub(crate) fn new(
        stop: CancellationToken,
        task: JoinHandle<Result<Report, ConsumeError>>,
    ) -> Self {
        Running { stop, task }
    }

    /// Asks for a graceful shutdown and waits for the consumer's report.
    pub(crate) async fn stop(mut self) -> Report {
        self.stop.cancel();
        tokio::time::timeout(Duration::from_secs(30), &mut self.task)
            .await
            .expect("the consumer shut down within 30 s")
            .expect("the consumer task")
            .expect("the consumer ended without an error")
    }
}

/// A shutdown token for a consumer, and a handle on it to cancel it.
pub(crate) fn shutdown() -> (CancellationToken, CancellationToken) {
    let token = CancellationToken::new();
    (token.clone(), token)
}

/// One broker, with a queue or stream of the test's own.
pub(crate) trait Broker: Sized {
    /// Whether retries wait in delay tiers (RabbitMQ's retry queues,
    /// Kafka's retry topics), so a wait between two tiers is forwarded;
    /// JetStream's `Nak` waits the delay itself.
    const TIERED: bool;
    /// Whether a stopping consumer drops the bodies still running past its
    /// grace (RabbitMQ, NATS), or returns and lets them run on (Kafka).
    const CUTS_PAST_GRACE: bool;
    /// A fixture on names of its own, or `None` when the broker is
    /// unreachable (the test then skips, or fails under
    /// `IDEM_REQUIRE_SERVICES=1`).
    async fn open(name: &str) -> Option<Self>;
    /// Publishes one message to the consumer's queue or subject.
    async fn publish(&self, payload: &[u8]);
    /// The broker, as the consumer's metrics and deliveries name it.
    const KIND: Kind;
    /// The consumer metrics' `queue` label: the queue, durable or topic.
    fn queue_label(&self) -> String;
    /// Where the handler is told a published message came from
    /// (`Delivery::source`): routing key, subject or topic.
    fn source(&self) -> String;
    /// Starts a consumer with `policy` around `handler`, which is given
    /// each delivery's details as well.
    fn start_with_delivery<F, Fut>(&self, policy: Policy, handler: F) -> Running
    where
        F: Fn(Points, Delivery) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Outcome<u32>, Error<AppError>>> + Send + 'static;
    /// Starts a consumer with `policy` around `handler`.
    fn start<F, Fut>(&self, policy: Policy, handler: F) -> Running
    where
        F: Fn(Points) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Outcome<u32>, Error<AppError>>> + Send + 'static,
    {
        self.start_with_delivery(policy, move |msg, _| handler(msg))
    }
    /// What the dead letters hold now.
    async fn dead_letters(&self) -> Vec<DeadLetter>;
    /// Where an outbox relay publishes messages for this fixture's
    /// consumer (staged with [`source`](Self::source) as their
    /// destination).
    type To: idem_runtime::outbox::Destination;
    /// A new destination.
    async fn destination(&self) -> Self::To;
    /// Whether the broker itself drops a second publish of one message id
    /// (JetStream's duplicate window), so no consumer sees it.
    const DROPS_REPEATED_IDS: bool;
    /// How many messages wait in the work queue (not delivered, or handed
    /// back and due again), once the consumer is stopped.
    async fn waiting(&self) -> u64;
}

/// The effects the bodies had, by message id.
#[derive(Default)]
pub(crate) struct Effects(Mutex<HashMap<String, u32>>);

impl Effects {
    pub(crate) fn apply(&self, id: &str) {
        *self.0.lock().unwrap().entry(id.to_owned()).or_default() += 1;
    }

    pub(crate) fn of(&self, id: &str) -> u32 {
        self.0.lock().unwrap().get(id).copied().unwrap_or(0)
    }

    pub(crate) fn total(&self) -> u32 {
        self.0.lock().unwrap().values().sum()
    }
}

#[idempotent(key = "msg.id", ttl = "1h", store = "memory", name = "broker_grant")]
pub(crate) async fn grant(msg: &Points, effects: &Effects) -> Result<u32, AppError> {
    effects.apply(&msg.id);
    Ok(msg.points)
}

#[idempotent(key = "msg.id", ttl = "1h", store = "memory", name = "broker_refuse")]
async fn refuse(msg: &Points, tries: &AtomicUsize) -> Result<u32, AppError> {
    tries.fetch_add(1, Ordering::SeqCst);
    Err(AppError::Refused(format!("no points for {}", msg.id)))
}

/// A panicking lease-mode body leaves its claim until the lease runs out:
/// a short lease, so the retry can run the body again soon.
#[idempotent(
    key = "msg.id",
    ttl = "1h",
    store = "memory",
    lease = "1s",
    name = "broker_panic"
)]
async fn panics(msg: &Points, tries: &AtomicUsize) -> Result<u32, AppError> {
    tries.fetch_add(1, Ordering::SeqCst);
    panic!("the body of {} panicked", msg.id);
}

#[idempotent(key = "msg.id", ttl = "1h", store = "memory", name = "broker_slow")]
async fn slow(msg: &Points, effects: &Effects) -> Result<u32, AppError> {
    tokio::time::sleep(Duration::from_millis(300)).await;
    effects.apply(&msg.id);
    Ok(msg.points)
}

/// 20 messages, each published three times: every one takes effect once,
/// and the consumer acks all 60 deliveries, 40 of them as duplicates.
pub(crate) async fn every_message_takes_effect_once<B: Broker>(b: &B) {
    for copy in 0..3 {
        for i in 0..20 {
            b.publish(&Points::payload(&format!("p-{i}"), copy + 1))
                .await;
        }
    }
    let (store, effects) = (MemoryStore::new(), Arc::new(Effects::default()));
    let running = {
        let effects = Arc::clone(&effects);
        b.start(Policy::default(), move |msg: Points| {
            let (store, effects) = (store.clone(), Arc::clone(&effects));
            async move { grant(&store, &msg, &effects).await }
        })
    };
    eventually(Duration::from_secs(20), "20 effects", || async {
        effects.total() == 20
    })
    .await;
    // Let the remaining copies (some handed back as `InProgress`) arrive
    // and be acked as duplicates.
    settles_to(b, 0).await;
    let report = running.stop().await;
    for i in 0..20 {
        assert_eq!(effects.of(&format!("p-{i}")), 1, "p-{i}");
    }
    // Copies delivered while the first was running were `InProgress`, and
    // handed back with a delay: they come back as duplicates.
    assert_eq!(report.acked, 60, "{report:?}");
    assert_eq!(report.duplicates, 40, "{report:?}");
    assert_eq!(report.dead_lettered, 0, "{report:?}");
    settles_to(b, 0).await;
}

/// A payload that is not a `Points` is dead-lettered at once with serde's
/// reason, never retried; the good message beside it is processed.
pub(crate) async fn an_undecodable_payload_is_dead_lettered_with_the_reason<B: Broker>(b: &B) {
    b.publish(b"{\"id\": 7, \"points\": \"many\"}").await;
    b.publish(&Points::payload("good", 1)).await;
    let (store, effects) = (MemoryStore::new(), Arc::new(Effects::default()));
    let running = {
        let effects = Arc::clone(&effects);
        b.start(Policy::default(), move |msg: Points| {
            let (store, effects) = (store.clone(), Arc::clone(&effects));
            async move { grant(&store, &msg, &effects).await }
        })
    };
    eventually(Duration::from_secs(20), "a dead letter", || async {
        !b.dead_letters().await.is_empty()
    })
    .await;
    eventually(Duration::from_secs(20), "the good message", || async {
        effects.of("good") == 1
    })
    .await;
    let report = running.stop().await;
    let dead = b.dead_letters().await;
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0].payload, b"{\"id\": 7, \"points\": \"many\"}");
    assert!(
        dead[0].reason.contains("does not decode") && dead[0].reason.contains("Points"),
        "{:?}",
        dead[0].reason
    );
    assert_eq!((report.dead_lettered, report.retried), (1, 0), "{report:?}");
}

/// A body that always fails is retried after the policy's delays and
/// dead-lettered once its attempts are spent, with the last error.
pub(crate) async fn a_failing_body_is_retried_then_dead_lettered<B: Broker>(b: &B) {
    b.publish(&Points::payload("bad", 1)).await;
    let (store, tries) = (MemoryStore::new(), Arc::new(AtomicUsize::new(0)));
    let policy = Policy {
        max_failures: 3,
        first_delay: Duration::from_millis(100),
        ..Policy::default()
    };
    let started = std::time::Instant::now();
    let running = {
        let tries = Arc::clone(&tries);
        b.start(policy, move |msg: Points| {
            let (store, tries) = (store.clone(), Arc::clone(&tries));
            async move { refuse(&store, &msg, &tries).await }
        })
    };
    eventually(Duration::from_secs(30), "a dead letter", || async {
        !b.dead_letters().await.is_empty()
    })
    .await;
    let took = started.elapsed();
    let report = running.stop().await;
    assert_eq!(tries.load(Ordering::SeqCst), 3, "three attempts");
    let dead = b.dead_letters().await;
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0].attempts, 3, "{dead:?}");
    assert!(
        dead[0].reason.contains("failed 3 times"),
        "{:?}",
        dead[0].reason
    );
    assert!(
        dead[0].reason.contains("no points for bad"),
        "{:?}",
        dead[0].reason
    );
    assert_eq!((report.retried, report.dead_lettered), (2, 1), "{report:?}");
    // Two delays of at least 100 ms and 200 ms were waited out.
    assert!(took >= Duration::from_millis(300), "{took:?}");
    settles_to(b, 0).await;
}

/// A handler that panics is a failed attempt like any other: retried, then
/// dead-lettered with the panic's message, never left holding its delivery.
pub(crate) async fn a_panicking_handler_is_retried_then_dead_lettered<B: Broker>(b: &B) {
    b.publish(&Points::payload("boom", 1)).await;
    b.publish(&Points::payload("fine", 1)).await;
    let (store, tries) = (MemoryStore::new(), Arc::new(AtomicUsize::new(0)));
    let (good_store, effects) = (MemoryStore::new(), Arc::new(Effects::default()));
    let policy = Policy {
        max_failures: 2,
        first_delay: Duration::from_millis(100),
        concurrency: 1,
        ..Policy::default()
    };
    let running = {
        let (tries, effects) = (Arc::clone(&tries), Arc::clone(&effects));
        b.start(policy, move |msg: Points| {
            let (store, good_store, tries, effects) = (
                store.clone(),
                good_store.clone(),
                Arc::clone(&tries),
                Arc::clone(&effects),
            );
            async move {
                if msg.id == "boom" {
                    panics(&store, &msg, &tries).await
                } else {
                    grant(&good_store, &msg, &effects).await
                }
            }
        })
    };
    eventually(Duration::from_secs(30), "a dead letter", || async {
        !b.dead_letters().await.is_empty()
    })
    .await;
    eventually(Duration::from_secs(20), "the good message", || async {
        effects.of("fine") == 1
    })
    .await;
    let report = running.stop().await;
    assert_eq!(tries.load(Ordering::SeqCst), 2, "two attempts");
    let dead = b.dead_letters().await;
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert!(
        dead[0].reason.contains("panicked") && dead[0].reason.contains("the body of boom panicked"),
        "{:?}",
        dead[0].reason
    );
    // Retried once for the panic, and as `InProgress` while the panicked
    // body's claim held its (1 s) lease.
    assert!(report.retried >= 1, "{report:?}");
    assert_eq!(report.dead_lettered, 1, "{report:?}");
    settles_to(b, 0).await;
}

/// A shutdown while bodies run: the consumer takes nothing more, lets the
/// bodies in flight finish and acks them; what it did not start stays in
/// the queue for the next consumer.
pub(crate) async fn shutdown_lets_bodies_in_flight_finish_and_acks_them<B: Broker>(b: &B) {
    for i in 0..10 {
        b.publish(&Points::payload(&format!("s-{i}"), 1)).await;
    }
    let (store, effects) = (MemoryStore::new(), Arc::new(Effects::default()));
    let started = Arc::new(AtomicUsize::new(0));
    let running = {
        let (effects, started) = (Arc::clone(&effects), Arc::clone(&started));
        let policy = Policy {
            concurrency: 2,
            ..Policy::default()
        };
        b.start(policy, move |msg: Points| {
            let (store, effects, started) =
                (store.clone(), Arc::clone(&effects), Arc::clone(&started));
            async move {
                started.fetch_add(1, Ordering::SeqCst);
                slow(&store, &msg, &effects).await
            }
        })
    };
    eventually(Duration::from_secs(20), "two bodies running", || async {
        started.load(Ordering::SeqCst) >= 2
    })
    .await;
    let report = running.stop().await;
    let done = effects.total();
    assert_eq!(
        u64::from(done),
        report.acked,
        "every body that ran was acked: {report:?}"
    );
    assert!(done >= 2, "the bodies in flight finished: {done}");
    assert!(done < 10, "the consumer stopped taking: {done}");
    settles_to(b, 10 - u64::from(done)).await;
}

/// When each call of a handler began, for the waits between them.
#[derive(Default)]
pub(crate) struct Calls(Mutex<Vec<std::time::Instant>>);

impl Calls {
    /// Notes a call; returns how many came before it.
    fn note(&self) -> usize {
        let mut calls = self.0.lock().unwrap();
        calls.push(std::time::Instant::now());
        calls.len() - 1
    }

    fn count(&self) -> usize {
        self.0.lock().unwrap().len()
    }

    /// The waits between consecutive calls.
    fn gaps(&self) -> Vec<Duration> {
        let calls = self.0.lock().unwrap();
        calls.windows(2).map(|w| w[1] - w[0]).collect()
    }
}

fn key_of(msg: &Points) -> Key {
    Key::from_parts(&[&msg.id]).expect("a key")
}

/// A wait between two delay tiers (1.2 s, between 1 s and 5 s) is waited
/// as asked: the message comes back after 1.2 s, not rounded up to 5 s (on
/// RabbitMQ and Kafka, forwarded from the 1 s tier to the 100 ms one for
/// what is left; JetStream's `Nak` waits it itself), and the forwards are
/// neither retries nor failures.
pub(crate) async fn a_wait_between_tiers_is_waited_exactly<B: Broker>(b: &B) {
    b.publish(&Points::payload("exact", 1)).await;
    let calls = Arc::new(Calls::default());
    let wait = Duration::from_millis(1_200);
    let running = {
        let calls = Arc::clone(&calls);
        b.start(Policy::default(), move |msg: Points| {
            let calls = Arc::clone(&calls);
            async move {
                if calls.note() == 0 {
                    // as a handler whose key another consumer holds answers
                    Err(Error::InProgress {
                        handler: "broker_exact",
                        key: key_of(&msg),
                        retry_after: wait,
                    })
                } else {
                    Ok(Outcome::Executed(msg.points))
                }
            }
        })
    };
    eventually(Duration::from_secs(20), "the second call", || async {
        calls.count() >= 2
    })
    .await;
    let report = running.stop().await;
    let gaps = calls.gaps();
    println!("a wait of {wait:?} came back after {gaps:?} ({report:?})");
    assert_eq!(gaps.len(), 1, "two calls: {gaps:?}");
    assert!(
        gaps[0] >= wait,
        "came back after {:?}, before 1.2 s",
        gaps[0]
    );
    assert!(
        gaps[0] < Duration::from_millis(2_500),
        "came back after {:?}: rounded up to a longer tier",
        gaps[0]
    );
    assert_eq!((report.retried, report.acked), (1, 1), "{report:?}");
    if B::TIERED {
        // 1 s, then what is left: 200 ms, then 100 ms, in the 100 ms tier
        assert!(report.forwarded >= 1, "{report:?}");
    } else {
        assert_eq!(report.forwarded, 0, "{report:?}");
    }
    settles_to(b, 0).await;
}

/// A store that keeps failing (`Error::Store`) is not the message's fault:
/// it is retried after growing waits (the policy's backoff of its retries:
/// 100, 200, 400, 800 ms), however many times, and never dead-lettered,
/// though `max_attempts` is 2.
pub(crate) async fn store_faults_back_off_and_are_never_dead_lettered<B: Broker>(b: &B) {
    b.publish(&Points::payload("down", 1)).await;
    let calls = Arc::new(Calls::default());
    let faults = 5;
    let policy = Policy {
        max_failures: 2,
        first_delay: Duration::from_millis(100),
        ..Policy::default()
    };
    let running = {
        let calls = Arc::clone(&calls);
        b.start(policy.clone(), move |msg: Points| {
            let calls = Arc::clone(&calls);
            async move {
                if calls.note() < faults {
                    Err(Error::Store {
                        handler: "broker_store_down",
                        key: Some(key_of(&msg)),
                        source: StoreError::Backend("connection refused".into()),
                    })
                } else {
                    Ok(Outcome::Executed(msg.points))
                }
            }
        })
    };
    eventually(
        Duration::from_secs(30),
        "the call after the faults",
        || async { calls.count() > faults },
    )
    .await;
    let report = running.stop().await;
    let gaps = calls.gaps();
    println!("store faults: the waits between calls {gaps:?}");
    assert_eq!(gaps.len(), faults, "{gaps:?}");
    for (i, gap) in gaps.iter().enumerate() {
        let backoff = policy.backoff(u32::try_from(i).unwrap() + 1);
        assert!(
            *gap >= backoff,
            "wait {} was {gap:?}, under the backoff {backoff:?}: {gaps:?}",
            i + 1
        );
    }
    // and they grew: the first came back sooner than the last was asked
    // to wait (a broker's own latency adds to each, not to the growth)
    let last = policy.backoff(u32::try_from(faults).unwrap());
    assert!(gaps[0] < last, "the waits grow: {gaps:?}");
    assert_eq!(
        (report.retried, report.acked, report.dead_lettered),
        (faults as u64, 1, 0),
        "{report:?}"
    );
    assert!(b.dead_letters().await.is_empty());
    settles_to(b, 0).await;
}

/// A handler that fails a message's first delivery and takes the second:
/// each is told what the broker said, the second as a retry of the first,
/// from the same place, published at the same time.
pub(crate) async fn the_handler_is_told_about_each_delivery<B: Broker>(b: &B) {
    b.publish(&Points::payload("told", 1)).await;
    let (store, effects, tries) = (
        MemoryStore::new(),
        Arc::new(Effects::default()),
        Arc::new(AtomicUsize::new(0)),
    );
    let told: Arc<Mutex<Vec<Delivery>>> = Arc::default();
    let policy = Policy {
        first_delay: Duration::from_millis(100),
        ..Policy::default()
    };
    let running = {
        let (effects, tries, told) = (Arc::clone(&effects), Arc::clone(&tries), Arc::clone(&told));
        b.start_with_delivery(policy, move |msg: Points, delivery: Delivery| {
            let (store, effects, tries, told) = (
                store.clone(),
                Arc::clone(&effects),
                Arc::clone(&tries),
                Arc::clone(&told),
            );
            async move {
                let first = told.lock().unwrap().is_empty();
                told.lock().unwrap().push(delivery);
                if first {
                    refuse(&store, &msg, &tries).await
                } else {
                    grant(&store, &msg, &effects).await
                }
            }
        })
    };
    eventually(Duration::from_secs(20), "the second delivery", || async {
        effects.of("told") == 1
    })
    .await;
    running.stop().await;
    let told = told.lock().unwrap().clone();
    assert_eq!(told.len(), 2, "{told:?}");
    let (first, second) = (&told[0], &told[1]);
    for d in [first, second] {
        assert_eq!(d.broker, Some(B::KIND), "{d:?}");
        assert_eq!(d.source, b.source(), "{d:?}");
        let age = d.age().expect("a publication time");
        assert!(age < Duration::from_secs(60), "{d:?}");
    }
    assert_eq!((first.retries, first.deliveries), (0, 1), "{first:?}");
    assert!(!first.redelivered, "{first:?}");
    assert_eq!((second.retries, second.deliveries), (1, 2), "{second:?}");
    assert_eq!(second.published_at, first.published_at, "{second:?}");
    if B::KIND == Kind::Kafka {
        // Where it was first consumed, through the retry topic.
        assert_eq!(second.partition, first.partition, "{second:?}");
        assert_eq!(second.offset, first.offset, "{second:?}");
    }
    settles_to(b, 0).await;
}

/// What the consumer did, as its metrics say it: deliveries, acks by
/// result, retries and dead letters by reason with the handler's name,
/// handling and end-to-end times, in flight, the last settle and the lag.
pub(crate) async fn the_consumer_counts_what_it_did<B: Broker>(b: &B) {
    let seen = capture();
    b.publish(&Points::payload("c-1", 1)).await;
    b.publish(&Points::payload("c-1", 1)).await;
    b.publish(b"not json").await;
    b.publish(&Points::payload("c-bad", 1)).await;
    let (store, effects, tries) = (
        MemoryStore::new(),
        Arc::new(Effects::default()),
        Arc::new(AtomicUsize::new(0)),
    );
    let policy = Policy {
        max_failures: 2,
        first_delay: Duration::from_millis(100),
        concurrency: 1,
        ..Policy::default()
    };
    let running = {
        let (effects, tries) = (Arc::clone(&effects), Arc::clone(&tries));
        b.start(policy, move |msg: Points| {
            let (store, effects, tries) = (store.clone(), Arc::clone(&effects), Arc::clone(&tries));
            async move {
                if msg.id == "c-bad" {
                    refuse(&store, &msg, &tries).await
                } else {
                    grant(&store, &msg, &effects).await
                }
            }
        })
    };
    let queue = b.queue_label();
    let q: &[(&str, &str)] = &[("broker", B::KIND.as_str()), ("queue", &queue)];
    let with = |more: &[(&'static str, &'static str)]| {
        let mut all = q.to_vec();
        all.extend_from_slice(more);
        all
    };
    eventually(
        Duration::from_secs(30),
        "two acks and two dead letters",
        || async {
            seen.sum(metric::CONSUMER_ACKS, q) == 2.0
                && seen.sum(metric::CONSUMER_DEAD_LETTERS, q) == 2.0
        },
    )
    .await;
    if B::KIND == Kind::Kafka {
        // Set from librdkafka's statistics, every 5 s.
        eventually(Duration::from_secs(15), "the lag gauge", || async {
            !seen.series(metric::CONSUMER_LAG, q).is_empty()
        })
        .await;
    }
    let report = running.stop().await;
    assert_eq!(
        (
            report.acked,
            report.duplicates,
            report.dead_lettered,
            report.retried
        ),
        (2, 1, 2, 1),
        "{report:?}"
    );
    let sum = |name: &str, more: &[(&'static str, &'static str)]| seen.sum(name, &with(more));
    // c-1 twice, the undecodable one, c-bad twice.
    assert_eq!(sum(metric::CONSUMER_DELIVERIES, &[]), 5.0);
    assert_eq!(
        sum(metric::CONSUMER_REDELIVERIES, &[]),
        1.0,
        "c-bad came back"
    );
    assert_eq!(
        sum(
            metric::CONSUMER_ACKS,
            &[("handler", "broker_grant"), ("result", "executed")]
        ),
        1.0
    );
    assert_eq!(
        sum(
            metric::CONSUMER_ACKS,
            &[("handler", "broker_grant"), ("result", "duplicate")]
        ),
        1.0
    );
    assert_eq!(
        sum(
            metric::CONSUMER_RETRIES,
            &[("handler", "broker_refuse"), ("reason", "handler_error")]
        ),
        1.0
    );
    assert_eq!(
        sum(
            metric::CONSUMER_DEAD_LETTERS,
            &[("handler", "broker_refuse"), ("reason", "handler_error")]
        ),
        1.0
    );
    assert_eq!(
        sum(
            metric::CONSUMER_DEAD_LETTERS,
            &[("handler", ""), ("reason", "decode")]
        ),
        1.0
    );
    assert_eq!(
        sum(metric::CONSUMER_HANDLE_SECONDS, &[]),
        5.0,
        "every delivery was timed"
    );
    assert_eq!(
        sum(
            metric::CONSUMER_HANDLE_SECONDS,
            &[("handler", "broker_refuse")]
        ),
        2.0
    );
    // Acked or dead-lettered, each with its publication time.
    assert_eq!(sum(metric::CONSUMER_END_TO_END_SECONDS, &[]), 4.0);
    let in_flight = seen.series(metric::CONSUMER_IN_FLIGHT, q);
    assert_eq!(in_flight.len(), 1, "{in_flight:?}");
    assert_eq!(in_flight[0].value, 0.0, "nothing in flight after the stop");
    assert_eq!(in_flight[0].most, 1.0, "one at a time: {in_flight:?}");
    let last = seen.series(metric::CONSUMER_LAST_SETTLE, q);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!(last.len() == 1 && now - last[0].value < 60.0, "{last:?}");
    assert!(
        !seen.series(metric::CONSUMER_LAG, q).is_empty(),
        "the lag was set"
    );
    settles_to(b, 0).await;
}

/// Waits until the broker says `n` messages wait (acks are settled by the
/// broker a moment after they are sent).
async fn settles_to<B: Broker>(b: &B, n: u64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let waiting = b.waiting().await;
        if waiting == n {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{waiting} messages wait, not {n}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
