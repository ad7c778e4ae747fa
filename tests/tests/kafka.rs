//! The consumer suite (`common/broker.rs`) on Kafka, and what is Kafka's
//! own: partition order, commits that never pass an unsettled message,
//! retry topics that do not block a partition, strict in-place retries,
//! rebalances between two members, offsets in the database. Each test on
//! topics and a group of its own, the topics deleted afterwards.

mod common;

use std::future::Future;

use common::AppError;
use common::broker::{self, Broker, DeadLetter, Points, Running};
use idem_runtime::consume::kafka::Consumer;
use idem_runtime::consume::{Broker as Kind, Delivery, Policy};
use idem_runtime::{Error, Outcome};
use idem_tests::brokers::{
    DeleteTopics, Kafka, TANSU_ONE_RECORD_A_BATCH, TANSU_SHORT_FETCH_WAIT, kafka, kafka_brokers,
};
use idem_tests::{or_skip, unique_table};
use rdkafka::message::{Headers as _, Message as _};
use rdkafka::producer::FutureRecord;

/// Partitions of every test topic: more than one, so that order and
/// commits are per partition.
const PARTITIONS: i32 = 2;

struct Topic {
    kafka: Kafka,
    consumer: Consumer,
    topic: String,
    group: String,
    producer: rdkafka::producer::FutureProducer,
    _cleanup: DeleteTopics,
}

impl Topic {
    /// Messages of the topic the group has not committed past.
    async fn main_lag(&self) -> u64 {
        self.kafka
            .lag(&self.group, std::slice::from_ref(&self.topic))
            .await
    }

    fn all_topics(&self) -> Vec<String> {
        let mut all = vec![self.topic.clone()];
        all.extend(self.consumer.retry_topics());
        all
    }

    async fn send(&self, key: Option<&str>, payload: &[u8]) {
        let mut record = FutureRecord::to(&self.topic).payload(payload);
        if let Some(key) = key {
            record = record.key(key);
        }
        self.producer
            .send(record, std::time::Duration::from_secs(10))
            .await
            .expect("publish");
    }
}

impl Broker for Topic {
    const TIERED: bool = true;

    async fn open(name: &str) -> Option<Self> {
        topic(name, PARTITIONS).await
    }

    async fn publish(&self, payload: &[u8]) {
        self.send(None, payload).await;
    }

    const KIND: Kind = Kind::Kafka;

    fn queue_label(&self) -> String {
        self.topic.clone()
    }

    fn source(&self) -> String {
        self.topic.clone()
    }

    fn start_with_delivery<F, Fut>(&self, policy: Policy, handler: F) -> Running
    where
        F: Fn(Points, Delivery) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Outcome<u32>, Error<AppError>>> + Send + 'static,
    {
        let (stop, signal) = broker::shutdown();
        let consumer = self.consumer.clone().policy(policy);
        Running::new(stop, tokio::spawn(consumer.run(handler, signal)))
    }

    async fn dead_letters(&self) -> Vec<DeadLetter> {
        let dead = self.kafka.read(&self.consumer.dead_letter_topic()).await;
        dead.iter()
            .map(|m| {
                let header = |name: &str| {
                    m.headers()
                        .and_then(|h| h.iter().find(|h| h.key == name))
                        .and_then(|h| h.value)
                        .map(|v| String::from_utf8_lossy(v).into_owned())
                        .unwrap_or_default()
                };
                DeadLetter {
                    payload: m.payload().unwrap_or_default().to_vec(),
                    reason: header("x-idem-reason"),
                    attempts: header("x-idem-failures").parse().unwrap_or(0),
                }
            })
            .collect()
    }

    async fn waiting(&self) -> u64 {
        self.kafka.lag(&self.group, &self.all_topics()).await
    }
}

macro_rules! on_kafka {
    ($($scenario:ident),* $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $scenario() {
            let b = or_skip!(Topic::open(concat!("kafka_", stringify!($scenario))).await);
            broker::$scenario(&b).await;
        }
    )*};
}

on_kafka!(
    every_message_takes_effect_once,
    an_undecodable_payload_is_dead_lettered_with_the_reason,
    a_failing_body_is_retried_then_dead_lettered,
    a_panicking_handler_is_retried_then_dead_lettered,
    shutdown_lets_bodies_in_flight_finish_and_acks_them,
    the_handler_is_told_about_each_delivery,
    the_consumer_counts_what_it_did,
    a_wait_between_tiers_is_waited_exactly,
    store_faults_back_off_and_are_never_dead_lettered,
);

// ---------------------------------------------------------------------------
// What is Kafka's own.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::eventually;
use idem_runtime::consume::kafka::Offsets;
use idem_runtime::consume::kafka::Retries;
use idem_runtime::consume::{ConsumeError, Report};
use idem_runtime::{
    FinalError, MemoryStore, MySqlStore, MySqlTx, PgStore, PgTx, SqliteStore, SqliteTx, idempotent,
};
use idem_tests::{DropMySqlTables, DropTables, mysql_pool, pg_pool};
use rdkafka::message::{Header, OwnedHeaders, OwnedMessage};

/// A topic of the test's own with `partitions`, its consumer and group.
async fn topic(name: &str, partitions: i32) -> Option<Topic> {
    let kafka = kafka().await?;
    let topic = unique_table(name);
    let group = format!("{topic}-group");
    let consumer = Consumer::new(kafka_brokers(), group.clone(), topic.clone())
        .set(TANSU_ONE_RECORD_A_BATCH.0, TANSU_ONE_RECORD_A_BATCH.1)
        .set(TANSU_SHORT_FETCH_WAIT.0, TANSU_SHORT_FETCH_WAIT.1);
    let mut topics = vec![topic.clone(), consumer.dead_letter_topic()];
    topics.extend(consumer.retry_topics());
    let cleanup = DeleteTopics::new(topics);
    kafka.create_topic(&topic, partitions).await;
    let producer = kafka.producer();
    Some(Topic {
        kafka,
        consumer,
        topic,
        group,
        producer,
        _cleanup: cleanup,
    })
}

/// What the bodies saw: the order of ids, and how many ran at once.
#[derive(Default)]
struct Seen {
    order: Mutex<Vec<String>>,
    running: AtomicUsize,
    most: AtomicUsize,
}

impl Seen {
    fn order(&self) -> Vec<String> {
        self.order.lock().unwrap().clone()
    }
}

/// Records the message, 20 ms into its body, and how many bodies ran
/// beside it.
#[idempotent(key = "msg.id", ttl = "1h", store = "memory", name = "kafka_record")]
async fn record(msg: &Points, seen: &Seen) -> Result<u32, AppError> {
    let now = seen.running.fetch_add(1, Ordering::SeqCst) + 1;
    seen.most.fetch_max(now, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(20)).await;
    seen.order.lock().unwrap().push(msg.id.clone());
    seen.running.fetch_sub(1, Ordering::SeqCst);
    Ok(msg.points)
}

fn start(
    consumer: Consumer,
    handler: impl Fn(Points) -> BoxedCall + Send + Sync + 'static,
) -> Running {
    let (stop, signal) = broker::shutdown();
    Running::new(stop, tokio::spawn(consumer.run(handler, signal)))
}

type BoxedCall =
    std::pin::Pin<Box<dyn Future<Output = Result<Outcome<u32>, Error<AppError>>> + Send>>;

fn recording(
    store: &MemoryStore,
    seen: &Arc<Seen>,
) -> impl Fn(Points) -> BoxedCall + Send + Sync + 'static {
    let (store, seen) = (store.clone(), Arc::clone(seen));
    move |msg: Points| {
        let (store, seen) = (store.clone(), Arc::clone(&seen));
        Box::pin(async move { record(&store, &msg, &seen).await })
    }
}

/// One partition, one lane: the bodies run one at a time, in the order the
/// messages were published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_is_handled_in_order_one_message_at_a_time() {
    let t = or_skip!(topic("kafka_order", 1).await);
    let ids: Vec<String> = (0..30).map(|i| format!("o-{i}")).collect();
    for id in &ids {
        t.send(Some(id), &Points::payload(id, 1)).await;
    }
    let (store, seen) = (MemoryStore::new(), Arc::new(Seen::default()));
    let running = start(t.consumer.clone(), recording(&store, &seen));
    eventually(Duration::from_secs(20), "30 bodies", || async {
        seen.order().len() == 30
    })
    .await;
    let report = running.stop().await;
    assert_eq!(seen.order(), ids);
    assert_eq!(seen.most.load(Ordering::SeqCst), 1, "one body at a time");
    assert_eq!(report.acked, 30, "{report:?}");
    assert_eq!(t.main_lag().await, 0);
}

/// Lanes by key: bodies of one partition run side by side, and each key's
/// messages still run in their order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lanes_run_keys_side_by_side_each_in_order() {
    let t = or_skip!(topic("kafka_lanes", 1).await);
    let keys = ["a", "b", "c", "d"];
    for i in 0..10 {
        for k in keys {
            let id = format!("{k}-{i}");
            t.send(Some(k), &Points::payload(&id, 1)).await;
        }
    }
    let (store, seen) = (MemoryStore::new(), Arc::new(Seen::default()));
    let running = start(t.consumer.clone().lanes(8), recording(&store, &seen));
    eventually(Duration::from_secs(20), "40 bodies", || async {
        seen.order().len() == 40
    })
    .await;
    let report = running.stop().await;
    let order = seen.order();
    for k in keys {
        let of_key: Vec<&String> = order.iter().filter(|id| id.starts_with(k)).collect();
        let want: Vec<String> = (0..10).map(|i| format!("{k}-{i}")).collect();
        assert_eq!(of_key, want.iter().collect::<Vec<_>>(), "key {k} in order");
    }
    assert!(
        seen.most.load(Ordering::SeqCst) > 1,
        "bodies of one partition ran side by side"
    );
    assert_eq!(report.acked, 40, "{report:?}");
    assert_eq!(t.main_lag().await, 0);
}

/// With lanes, a later message can settle before an earlier one: the
/// commit stays at the earlier one until it settles.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_commit_never_passes_a_message_still_running() {
    let t = or_skip!(topic("kafka_commit", 1).await);
    t.send(Some("held"), &Points::payload("held", 1)).await;
    for i in 0..3 {
        t.send(Some("free"), &Points::payload(&format!("free-{i}"), 1))
            .await;
    }
    let release = Arc::new(tokio::sync::Notify::new());
    let done = Arc::new(AtomicUsize::new(0));
    let store = MemoryStore::new();
    let handler = {
        let (release, done) = (Arc::clone(&release), Arc::clone(&done));
        move |msg: Points| -> BoxedCall {
            let (store, release, done) = (store.clone(), Arc::clone(&release), Arc::clone(&done));
            Box::pin(async move {
                if msg.id == "held" {
                    release.notified().await;
                }
                let r = broker::grant(&store, &msg, &broker::Effects::default()).await;
                done.fetch_add(1, Ordering::SeqCst);
                r
            })
        }
    };
    let running = start(t.consumer.clone().lanes(4), handler);
    eventually(
        Duration::from_secs(20),
        "the three free messages",
        || async { done.load(Ordering::SeqCst) == 3 },
    )
    .await;
    // Several commit rounds (every 200 ms) pass: none goes past offset 0.
    tokio::time::sleep(Duration::from_millis(800)).await;
    let committed = t.kafka.committed(&t.group, &t.topic).await;
    assert!(
        matches!(committed.as_slice(), [(0, None)] | [(0, Some(0))]),
        "committed past a running message: {committed:?}"
    );
    release.notify_one();
    eventually(Duration::from_secs(20), "the commit at the end", || async {
        t.kafka.committed(&t.group, &t.topic).await == vec![(0, Some(4))]
    })
    .await;
    let report = running.stop().await;
    assert_eq!(report.acked, 4, "{report:?}");
}

/// A body that fails once, on the first message of its partition.
#[idempotent(
    key = "msg.id",
    ttl = "1h",
    store = "memory",
    name = "kafka_fails_once"
)]
async fn fails_once(msg: &Points, seen: &Seen, failed: &AtomicUsize) -> Result<u32, AppError> {
    if msg.id == "first" && failed.fetch_add(1, Ordering::SeqCst) == 0 {
        return Err(AppError::Refused("not yet".into()));
    }
    seen.order.lock().unwrap().push(msg.id.clone());
    Ok(msg.points)
}

fn failing_once(
    store: &MemoryStore,
    seen: &Arc<Seen>,
) -> impl Fn(Points) -> BoxedCall + Send + Sync + 'static {
    let (store, seen, failed) = (
        store.clone(),
        Arc::clone(seen),
        Arc::new(AtomicUsize::new(0)),
    );
    move |msg: Points| {
        let (store, seen, failed) = (store.clone(), Arc::clone(&seen), Arc::clone(&failed));
        Box::pin(async move { fails_once(&store, &msg, &seen, &failed).await })
    }
}

async fn first_then_five(t: &Topic) {
    t.send(Some("k"), &Points::payload("first", 1)).await;
    for i in 0..5 {
        t.send(Some("k"), &Points::payload(&format!("next-{i}"), 1))
            .await;
    }
}

fn quick_retries() -> Policy {
    Policy {
        first_delay: Duration::from_millis(300),
        ..Policy::default()
    }
}

/// By default a message that must wait goes to a retry topic: the messages
/// behind it go on, and it comes back from there with its failure counted
/// and where it came from.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_goes_to_a_retry_topic_and_does_not_block_its_partition() {
    let t = or_skip!(topic("kafka_retry", 1).await);
    first_then_five(&t).await;
    let (store, seen) = (MemoryStore::new(), Arc::new(Seen::default()));
    let running = start(
        t.consumer.clone().policy(quick_retries()),
        failing_once(&store, &seen),
    );
    eventually(Duration::from_secs(20), "six effects", || async {
        seen.order().len() == 6
    })
    .await;
    let report = running.stop().await;
    let order = seen.order();
    assert_eq!(
        order.last().map(String::as_str),
        Some("first"),
        "the retry came last: {order:?}"
    );
    assert_eq!((report.retried, report.acked), (1, 6), "{report:?}");
    // A 300 ms wait goes to the 100 ms topic, and hops on there until due.
    let retry_topic = t.consumer.retry_topic(Duration::from_millis(300));
    assert_eq!(retry_topic, format!("{}-retry-100", t.topic));
    let retries = t.kafka.read(&retry_topic).await;
    assert_eq!(
        retries.len() as u64,
        1 + report.forwarded,
        "the retry, and its hops: {report:?}"
    );
    let due = headers(&retries[0]).get("x-idem-due").cloned();
    assert!(due.is_some(), "a due time");
    for copy in &retries {
        // Hops are neither retries nor failures: the copies say the same.
        let h = headers(copy);
        assert_eq!(h.get("x-idem-failures").map(String::as_str), Some("1"));
        assert_eq!(h.get("x-idem-retries").map(String::as_str), Some("1"));
        assert_eq!(h.get("x-idem-due"), due.as_ref());
        assert_eq!(h.get("x-idem-topic"), Some(&t.topic));
        assert_eq!(h.get("x-idem-offset").map(String::as_str), Some("0"));
        assert!(
            h.get("x-idem-last-error")
                .is_some_and(|e| e.contains("not yet")),
            "{h:?}"
        );
        assert_eq!(copy.key(), Some(&b"k"[..]), "the key is kept");
    }
    assert_eq!(t.kafka.lag(&t.group, &t.all_topics()).await, 0);
}

/// A retry that must wait longer than its retry topic's delay does not hold
/// that topic's partition for all of its wait: it hops on once the topic's
/// delay is over, and a shorter wait behind it comes back on time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_wait_hops_on_and_does_not_hold_the_retry_partition() {
    let t = or_skip!(topic("kafka_hop", 1).await);
    // one partition: in the 1 s retry topic, the long wait is ahead
    t.send(Some("k"), &Points::payload("long", 1)).await;
    t.send(Some("k"), &Points::payload("short", 1)).await;
    let calls: Arc<Mutex<Vec<(String, std::time::Instant)>>> = Arc::default();
    let waits = |id: &str| match id {
        "long" => Duration::from_millis(3_500),
        _ => Duration::from_millis(1_000),
    };
    let running = {
        let calls = Arc::clone(&calls);
        start(t.consumer.clone(), move |msg: Points| {
            let calls = Arc::clone(&calls);
            Box::pin(async move {
                let first = {
                    let mut calls = calls.lock().unwrap();
                    calls.push((msg.id.clone(), std::time::Instant::now()));
                    calls.iter().filter(|(id, _)| *id == msg.id).count() == 1
                };
                if first {
                    Err(Error::InProgress {
                        handler: "kafka_hop",
                        key: idem_runtime::Key::from_parts(&[&msg.id]).expect("a key"),
                        retry_after: waits(&msg.id),
                    })
                } else {
                    Ok(Outcome::Executed(msg.points))
                }
            })
        })
    };
    eventually(Duration::from_secs(20), "both back", || async {
        calls.lock().unwrap().len() == 4
    })
    .await;
    let report = running.stop().await;
    let calls = calls.lock().unwrap().clone();
    let gap = |id: &str| {
        let at: Vec<std::time::Instant> = calls
            .iter()
            .filter(|(i, _)| i == id)
            .map(|(_, at)| *at)
            .collect();
        at[1] - at[0]
    };
    let (long, short) = (gap("long"), gap("short"));
    println!("waits of 3.5 s and 1 s came back after {long:?} and {short:?} ({report:?})");
    assert!(long >= waits("long"), "{long:?}");
    assert!(short >= waits("short"), "{short:?}");
    assert!(
        short < Duration::from_millis(2_000),
        "the short wait was held behind the long one: {short:?}"
    );
    let order: Vec<&str> = calls.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(order, ["long", "short", "short", "long"]);
    assert!(report.forwarded >= 2, "the long wait hopped on: {report:?}");
    assert_eq!((report.retried, report.acked), (2, 2), "{report:?}");
}

/// In place, the partition waits for its first message: strict order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_place_retries_keep_the_partition_in_order() {
    let t = or_skip!(topic("kafka_in_place", 1).await);
    first_then_five(&t).await;
    let (store, seen) = (MemoryStore::new(), Arc::new(Seen::default()));
    let consumer = t
        .consumer
        .clone()
        .policy(quick_retries())
        .retries(Retries::InPlace);
    let running = start(consumer, failing_once(&store, &seen));
    eventually(Duration::from_secs(20), "six effects", || async {
        seen.order().len() == 6
    })
    .await;
    let report = running.stop().await;
    let want: Vec<String> = std::iter::once("first".to_owned())
        .chain((0..5).map(|i| format!("next-{i}")))
        .collect();
    assert_eq!(seen.order(), want);
    assert_eq!((report.retried, report.acked), (0, 6), "{report:?}");
    assert!(
        t.kafka
            .ends(&t.consumer.retry_topic(Duration::ZERO))
            .await
            .is_empty(),
        "no retry topics in place"
    );
    assert_eq!(t.main_lag().await, 0);
}

#[derive(Debug, thiserror::Error, serde::Serialize, serde::Deserialize)]
enum Declined {
    #[error("card declined for {0}")]
    Card(String),
}

impl FinalError for Declined {
    fn is_final(&self) -> bool {
        true
    }
}

#[idempotent(key = "id", ttl = "1h", store = "memory", name = "kafka_declined")]
async fn decline(msg: &Points) -> Result<u32, Declined> {
    Err(Declined::Card(msg.id.clone()))
}

/// A final error is dead-lettered at once, with the key, payload and
/// headers of the message, idem's reason, and Spring Kafka's headers of
/// where it came from in Spring's encodings.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_says_why_and_where_it_came_from() {
    let t = or_skip!(topic("kafka_dead", 2).await);
    let payload = Points::payload("pay-1", 5);
    let record = FutureRecord::to(&t.topic)
        .key("pay-1")
        .partition(1)
        .payload(&payload)
        .headers(OwnedHeaders::new().insert(Header {
            key: "trace-id",
            value: Some("t-42"),
        }));
    t.producer
        .send(record, Duration::from_secs(10))
        .await
        .expect("publish");
    let store = MemoryStore::new();
    let running = start(t.consumer.clone(), move |msg: Points| -> BoxedCall {
        let store = store.clone();
        Box::pin(async move {
            decline(&store, &msg).await.map_err(|e| match e {
                Error::Failed {
                    handler,
                    key,
                    error,
                    replayed,
                } => Error::Failed {
                    handler,
                    key,
                    error: AppError::Refused(error.to_string()),
                    replayed,
                },
                other => panic!("{other}"),
            })
        })
    });
    eventually(Duration::from_secs(20), "a dead letter", || async {
        !t.kafka
            .read(&t.consumer.dead_letter_topic())
            .await
            .is_empty()
    })
    .await;
    let report = running.stop().await;
    assert_eq!((report.dead_lettered, report.retried), (1, 0), "{report:?}");
    let dead = t.kafka.read(&t.consumer.dead_letter_topic()).await;
    assert_eq!(dead.len(), 1);
    let d = &dead[0];
    assert_eq!(d.key(), Some(&b"pay-1"[..]));
    assert_eq!(d.payload(), Some(payload.as_slice()));
    let h = headers(d);
    assert_eq!(
        h.get("trace-id").map(String::as_str),
        Some("t-42"),
        "the message's headers are kept"
    );
    assert!(
        h["x-idem-reason"].contains("card declined for pay-1"),
        "{h:?}"
    );
    assert_eq!(h.get("x-idem-partition").map(String::as_str), Some("1"));
    assert_eq!(h.get("x-idem-offset").map(String::as_str), Some("0"));
    let raw = |name: &str| -> Vec<u8> {
        d.headers()
            .and_then(|hs| hs.iter().find(|x| x.key == name))
            .and_then(|x| x.value)
            .map(<[u8]>::to_vec)
            .unwrap_or_default()
    };
    assert_eq!(raw("kafka_dlt-original-topic"), t.topic.as_bytes());
    assert_eq!(raw("kafka_dlt-original-partition"), 1i32.to_be_bytes());
    assert_eq!(raw("kafka_dlt-original-offset"), 0i64.to_be_bytes());
    assert_eq!(raw("kafka_dlt-original-consumer-group"), t.group.as_bytes());
    assert_eq!(t.main_lag().await, 0);
}

/// Two members of one group: the second's arrival rebalances the first,
/// both consume, and every message takes effect once; with eager
/// rebalancing (every partition revoked, then assigned again) and with
/// cooperative rebalancing (only what moves).
async fn two_members_share_the_partitions(t: &Topic, strategy: &str) {
    let member =
        || short_sessions(t.consumer.clone()).set("partition.assignment.strategy", strategy);
    let store = MemoryStore::new();
    let (seen_a, seen_b) = (Arc::new(Seen::default()), Arc::new(Seen::default()));
    let first = start(member(), recording(&store, &seen_a));
    let mut sent = 0;
    while seen_a.order().len() < 10 {
        t.send(
            Some(&format!("m-{sent}")),
            &Points::payload(&format!("m-{sent}"), 1),
        )
        .await;
        sent += 1;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let second = start(member(), recording(&store, &seen_b));
    let joined = std::time::Instant::now();
    // Keep publishing until the second member has consumed some.
    while seen_b.order().len() < 10 {
        assert!(
            joined.elapsed() < Duration::from_secs(60),
            "the second member got nothing in 60 s"
        );
        t.send(
            Some(&format!("m-{sent}")),
            &Points::payload(&format!("m-{sent}"), 1),
        )
        .await;
        sent += 1;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    eprintln!(
        "the second member consumed {:?} after it started",
        joined.elapsed()
    );
    eventually(
        Duration::from_secs(60),
        "every message's effect",
        || async { seen_a.order().len() + seen_b.order().len() >= sent },
    )
    .await;
    let (a, b) = (first.stop().await, second.stop().await);
    let mut ids: Vec<String> = seen_a.order();
    ids.extend(seen_b.order());
    let all = ids.len();
    ids.sort();
    ids.dedup();
    assert_eq!(
        (ids.len(), all),
        (sent, sent),
        "each message took effect once"
    );
    assert!(
        a.rebalances >= 2,
        "the second member's arrival rebalanced the first: {a:?}"
    );
    assert_eq!(
        a.acked + b.acked - a.duplicates - b.duplicates,
        sent as u64,
        "{a:?} {b:?}"
    );
    assert_eq!(t.kafka.lag(&t.group, &t.all_topics()).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_members_share_the_partitions_with_eager_rebalancing() {
    let t = or_skip!(topic("kafka_members", 4).await);
    two_members_share_the_partitions(&t, "range,roundrobin").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_members_share_the_partitions_with_cooperative_rebalancing() {
    let t = or_skip!(topic("kafka_members_coop", 4).await);
    two_members_share_the_partitions(&t, "cooperative-sticky").await;
}

/// The poll loop is a thread of the consumer's own, so a consumer on a
/// current-thread runtime works as on a multi-threaded one.
#[tokio::test(flavor = "current_thread")]
async fn a_consumer_runs_on_a_current_thread_runtime() {
    let b = or_skip!(topic("kafka_current_thread", 2).await);
    broker::every_message_takes_effect_once(&b).await;
}

/// A topic that does not exist is a set-up error, not a silent wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_topic_is_a_setup_error() {
    let _kafka = or_skip!(kafka().await);
    let name = unique_table("kafka_missing");
    let consumer = Consumer::new(kafka_brokers(), format!("{name}-group"), name.clone());
    let store = MemoryStore::new();
    let (stop, signal) = broker::shutdown();
    let run = consumer.run(recording(&store, &Arc::new(Seen::default())), signal);
    let ended = tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .expect("the consumer gave up within 30 s");
    drop(stop);
    match ended {
        Err(ConsumeError::Setup(e)) => assert!(e.to_string().contains("does not exist"), "{e}"),
        other => panic!("expected a set-up error, got {other:?}"),
    }
}

/// `declare` creates the retry and dead-letter topics, with the names and
/// delays it was given and the topic's partition count, before any member
/// joins the group; and a topic that does not exist is a set-up error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declare_creates_the_retry_and_dead_letter_topics() {
    let kafka = or_skip!(kafka().await);
    let topic = unique_table("kafka_declare");
    let group = format!("{topic}-group");
    let consumer = Consumer::new(kafka_brokers(), group.clone(), topic.clone())
        .set(TANSU_ONE_RECORD_A_BATCH.0, TANSU_ONE_RECORD_A_BATCH.1)
        .dead_letters(format!("{topic}.parked"))
        .retry_topics_named(format!("{topic}.wait-{{ms}}"))
        .retry_delays([Duration::from_millis(200), Duration::from_secs(2)]);
    let mut topics = vec![topic.clone(), consumer.dead_letter_topic()];
    topics.extend(consumer.retry_topics());
    let _cleanup = DeleteTopics::new(topics);
    match consumer.declare().await {
        Err(ConsumeError::Setup(e)) => assert!(e.to_string().contains("does not exist"), "{e}"),
        other => panic!("expected a set-up error, got {other:?}"),
    }
    kafka.create_topic(&topic, 3).await;
    consumer.declare().await.expect("declared");
    assert_eq!(
        consumer.retry_topics(),
        [format!("{topic}.wait-200"), format!("{topic}.wait-2000")]
    );
    for name in consumer
        .retry_topics()
        .into_iter()
        .chain([format!("{topic}.parked")])
    {
        let partitions: Vec<i32> = kafka.ends(&name).await.iter().map(|(p, _)| *p).collect();
        assert_eq!(partitions.len(), 3, "{name}: {partitions:?}");
    }
    assert!(
        kafka.ends(&format!("{topic}-dlt")).await.is_empty(),
        "no topic of the default names"
    );
    consumer.declare().await.expect("declared again");

    // The consumer uses them: a dead letter goes to the topic named.
    let producer = kafka.producer();
    for payload in [&b"not points"[..], &Points::payload("good", 1)] {
        producer
            .send(
                FutureRecord::<(), _>::to(&topic).payload(payload),
                Duration::from_secs(10),
            )
            .await
            .expect("publish");
    }
    let (store, seen) = (MemoryStore::new(), Arc::new(Seen::default()));
    let running = start(consumer, recording(&store, &seen));
    eventually(
        Duration::from_secs(30),
        "the effect and a dead letter",
        || async {
            seen.order().len() == 1 && kafka.read(&format!("{topic}.parked")).await.len() == 1
        },
    )
    .await;
    let report = running.stop().await;
    assert_eq!((report.acked, report.dead_lettered), (1, 1), "{report:?}");
}

/// A topology that cannot be declared is refused by `declare` and `run`
/// alike, before the brokers are asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topology_that_cannot_be_declared_is_refused_before_connecting() {
    // nothing listens there: a refusal that needed the brokers would time
    // out instead
    let nowhere = "127.0.0.1:1";
    let c = || Consumer::new(nowhere, "stock", "orders");
    for (consumer, says) in [
        (c().retry_delays(Vec::new()), "at least one"),
        (c().retry_topics_named("orders-wait"), "{ms}"),
        (c().dead_letters("orders dead"), "' '"),
        (c().dead_letters("orders"), "consumed topic"),
    ] {
        match consumer.declare().await {
            Err(ConsumeError::Setup(e)) => assert!(e.to_string().contains(says), "{e}"),
            other => panic!("expected a refusal, got {other:?}"),
        }
        let store = MemoryStore::new();
        let run = consumer.run(
            recording(&store, &Arc::new(Seen::default())),
            idem_runtime::consume::CancellationToken::new(),
        );
        match tokio::time::timeout(Duration::from_secs(5), run).await {
            Ok(Err(ConsumeError::Setup(e))) => assert!(e.to_string().contains(says), "{e}"),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }
}

/// Inserts a row for the message in the handler's transaction: a doubled
/// effect shows as two rows of one id.
#[idempotent(
    key = "msg.id",
    ttl = "1h",
    store = "postgres",
    name = "kafka_apply_pg"
)]
async fn apply_pg(tx: &mut PgTx<'_>, msg: &Points, table: &str) -> Result<u32, AppError> {
    let sql = format!("INSERT INTO {table} (id) VALUES ($1)");
    sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(&msg.id)
        .execute(&mut **tx)
        .await?;
    Ok(msg.points)
}

#[idempotent(
    key = "msg.id",
    ttl = "1h",
    store = "mysql",
    name = "kafka_apply_mysql"
)]
async fn apply_mysql(tx: &mut MySqlTx<'_>, msg: &Points, table: &str) -> Result<u32, AppError> {
    let sql = format!("INSERT INTO {table} (id) VALUES (?)");
    sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(&msg.id)
        .execute(&mut **tx)
        .await?;
    Ok(msg.points)
}

#[idempotent(
    key = "msg.id",
    ttl = "1h",
    store = "sqlite",
    name = "kafka_apply_sqlite"
)]
async fn apply_sqlite(tx: &mut SqliteTx<'_>, msg: &Points, table: &str) -> Result<u32, AppError> {
    let sql = format!("INSERT INTO {table} (id) VALUES (?)");
    sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(&msg.id)
        .execute(&mut **tx)
        .await?;
    Ok(msg.points)
}

/// A SQL database for the offsets scenario: its store's offsets, a handler
/// counting its calls, and what the database holds afterwards.
trait OffsetsDb {
    fn offsets(&self) -> Offsets;
    fn handler(
        &self,
        calls: &Arc<AtomicUsize>,
    ) -> impl Fn(Points) -> BoxedCall + Send + Sync + 'static;
    /// Each partition's next offset in the offsets table, by partition.
    async fn rows(&self, group: &str, topic: &str) -> Vec<(i32, i64)>;
    /// Ids with more than one row in the business table.
    async fn doubled(&self) -> i64;
}

macro_rules! offsets_db {
    ($name:ident, $store:ty, $apply:ident, $pool:ty, $p:expr) => {
        struct $name {
            store: $store,
            pool: $pool,
            business: String,
        }

        impl OffsetsDb for $name {
            fn offsets(&self) -> Offsets {
                Offsets::from(&self.store)
            }

            fn handler(&self, calls: &Arc<AtomicUsize>) -> impl Fn(Points) -> BoxedCall + Send + Sync + 'static {
                let (store, business, calls) = (self.store.clone(), self.business.clone(), Arc::clone(calls));
                move |msg: Points| -> BoxedCall {
                    let (store, business, calls) = (store.clone(), business.clone(), Arc::clone(&calls));
                    Box::pin(async move {
                        calls.fetch_add(1, Ordering::SeqCst);
                        $apply(&store, &msg, &business).await
                    })
                }
            }

            async fn rows(&self, group: &str, topic: &str) -> Vec<(i32, i64)> {
                let sql = format!(
                    "SELECT partition_id, next_offset FROM {} WHERE consumer_group = {} AND topic = {} ORDER BY partition_id",
                    self.offsets().table(),
                    $p[0],
                    $p[1]
                );
                sqlx::query_as(sqlx::AssertSqlSafe(sql))
                    .bind(group)
                    .bind(topic)
                    .fetch_all(&self.pool)
                    .await
                    .expect("the offsets")
            }

            async fn doubled(&self) -> i64 {
                let sql = format!(
                    "SELECT count(*) FROM (SELECT id FROM {} GROUP BY id HAVING count(*) > 1) d",
                    self.business
                );
                sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
                    .fetch_one(&self.pool)
                    .await
                    .expect("count")
            }
        }
    };
}

offsets_db!(PgOffsets, PgStore, apply_pg, sqlx::PgPool, ["$1", "$2"]);
offsets_db!(
    MySqlOffsets,
    MySqlStore,
    apply_mysql,
    sqlx::MySqlPool,
    ["?", "?"]
);
offsets_db!(
    SqliteOffsets,
    SqliteStore,
    apply_sqlite,
    sqlx::SqlitePool,
    ["?", "?"]
);

/// With offsets in the database, each partition's next offset is written
/// with the effects and read back on assignment: a consumer whose broker
/// commits went back to the start does not see the messages again, and
/// brings the broker's commits up to the table's. Without them the same
/// consumer gets every message again (as duplicates).
async fn offsets_in_the_database_win_over_the_brokers(t: &Topic, db: &impl OffsetsDb) {
    for i in 0..20 {
        t.send(
            Some(&format!("x-{i}")),
            &Points::payload(&format!("x-{i}"), 1),
        )
        .await;
    }
    let calls = Arc::new(AtomicUsize::new(0));
    let running = start(
        t.consumer.clone().offsets_in(db.offsets()),
        db.handler(&calls),
    );
    eventually(Duration::from_secs(20), "20 calls", || async {
        calls.load(Ordering::SeqCst) == 20
    })
    .await;
    let first: Report = running.stop().await;
    assert_eq!(first.acked, 20, "{first:?}");
    let rows = db.rows(&t.group, &t.topic).await;
    let ends = t.kafka.ends(&t.topic).await;
    let with_messages: Vec<(i32, i64)> = ends.into_iter().filter(|(_, end)| *end > 0).collect();
    assert_eq!(
        rows, with_messages,
        "each partition's next offset is in the table"
    );

    // The broker forgets: its commits go back to the start.
    rewind(&t.group, &t.topic, rows.iter().map(|(p, _)| *p).collect()).await;
    let again = Arc::new(AtomicUsize::new(0));
    let running = start(
        t.consumer.clone().offsets_in(db.offsets()),
        db.handler(&again),
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    let second = running.stop().await;
    assert_eq!(
        again.load(Ordering::SeqCst),
        0,
        "nothing came again: {second:?}"
    );
    // ... and the broker's commits were brought up to the table's.
    let committed: Vec<(i32, i64)> = t
        .kafka
        .committed(&t.group, &t.topic)
        .await
        .into_iter()
        .filter_map(|(p, o)| Some((p, o?)))
        .filter(|(p, _)| rows.iter().any(|(rp, _)| rp == p))
        .collect();
    assert_eq!(committed, rows, "the table's offsets reached the broker");

    // The broker forgets again.
    rewind(&t.group, &t.topic, rows.iter().map(|(p, _)| *p).collect()).await;

    // The same without the table's offsets: everything comes again.
    let running = start(t.consumer.clone(), db.handler(&again));
    eventually(Duration::from_secs(20), "20 calls again", || async {
        again.load(Ordering::SeqCst) == 20
    })
    .await;
    let third = running.stop().await;
    assert_eq!(third.duplicates, 20, "{third:?}");
    assert_eq!(db.doubled().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offsets_in_postgres_win_over_the_brokers() {
    let t = or_skip!(topic("kafka_offsets_pg", 2).await);
    let pool = or_skip!(pg_pool(4).await);
    let (dedup, business) = (unique_table("kdedup"), unique_table("kapplied"));
    let _tables = DropTables::new(&[&dedup, &business, &format!("{dedup}_kafka_offsets")]);
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE {business} (id TEXT NOT NULL)"
    )))
    .execute(&pool)
    .await
    .expect("business table");
    let store = PgStore::from_pool(pool.clone())
        .with_table(&dedup)
        .expect("a table name");
    store.migrate().await.expect("migrate");
    offsets_in_the_database_win_over_the_brokers(
        &t,
        &PgOffsets {
            store,
            pool,
            business,
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offsets_in_mariadb_win_over_the_brokers() {
    let t = or_skip!(topic("kafka_offsets_my", 2).await);
    let pool = or_skip!(mysql_pool(4, 5).await);
    let (dedup, business) = (unique_table("kdedup"), unique_table("kapplied"));
    let _tables = DropMySqlTables::new(&[&dedup, &business, &format!("{dedup}_kafka_offsets")]);
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE {business} (id VARCHAR(64) NOT NULL)"
    )))
    .execute(&pool)
    .await
    .expect("business table");
    let store = MySqlStore::from_pool(pool.clone())
        .with_table(&dedup)
        .expect("a table name");
    store.migrate().await.expect("migrate");
    offsets_in_the_database_win_over_the_brokers(
        &t,
        &MySqlOffsets {
            store,
            pool,
            business,
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offsets_in_sqlite_win_over_the_brokers() {
    let t = or_skip!(topic("kafka_offsets_lite", 2).await);
    let dir = tempfile::tempdir().expect("a temporary directory");
    let store = SqliteStore::open(dir.path().join("idem.db"))
        .await
        .expect("open");
    store.migrate().await.expect("migrate");
    let pool = store.pool().clone();
    let business = "applied".to_owned();
    sqlx::query("CREATE TABLE applied (id TEXT NOT NULL)")
        .execute(&pool)
        .await
        .expect("business table");
    offsets_in_the_database_win_over_the_brokers(
        &t,
        &SqliteOffsets {
            store,
            pool,
            business,
        },
    )
    .await;
}

/// Commits offset 0 for `partitions` of `topic` in `group`.
async fn rewind(group: &str, topic: &str, partitions: Vec<i32>) {
    let (group, topic) = (group.to_owned(), topic.to_owned());
    tokio::task::spawn_blocking(move || {
        use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer as _};
        let c: BaseConsumer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", kafka_brokers())
            .set("group.id", &group)
            .set("enable.auto.commit", "false")
            .create()
            .expect("a client");
        let mut tpl = rdkafka::TopicPartitionList::new();
        for p in partitions {
            tpl.add_partition_offset(&topic, p, rdkafka::Offset::Offset(0))
                .expect("a partition");
        }
        c.commit(&tpl, CommitMode::Sync).expect("commit offset 0");
    })
    .await
    .expect("rewind");
}

/// A member presumed dead 6 s after its last heartbeat (librdkafka's
/// default is 45 s), for tests that kill one.
fn short_sessions(consumer: Consumer) -> Consumer {
    consumer
        .set("session.timeout.ms", "6000")
        .set("heartbeat.interval.ms", "500")
}

/// A message's headers as text, by name.
fn headers(m: &OwnedMessage) -> std::collections::HashMap<String, String> {
    m.headers()
        .map(|hs| {
            hs.iter()
                .map(|h| {
                    (
                        h.key.to_owned(),
                        String::from_utf8_lossy(h.value.unwrap_or_default()).into_owned(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The offset rides in the handler's transaction: a consumer killed right
/// after a message's transaction committed, before the consumer learned of
/// it, leaves that message's offset in the table (its broker commit is
/// behind), and the next consumer starts after it, with no duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_offset_commits_with_the_effect_when_the_consumer_dies_after_it() {
    let t = or_skip!(topic("kafka_offsets_die", 1).await);
    let pool = or_skip!(pg_pool(4).await);
    let (dedup, business) = (unique_table("kdedup"), unique_table("kapplied"));
    let _tables = DropTables::new(&[&dedup, &business, &format!("{dedup}_kafka_offsets")]);
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE {business} (id TEXT NOT NULL)"
    )))
    .execute(&pool)
    .await
    .expect("business table");
    let store = PgStore::from_pool(pool.clone())
        .with_table(&dedup)
        .expect("a table name");
    store.migrate().await.expect("migrate");
    for i in 0..10 {
        t.send(Some("k"), &Points::payload(&format!("x-{i}"), 1))
            .await;
    }
    let mut child = idem_tests::ChildTest::spawn(
        "kafka_consumer_dies_after_a_commit",
        &[
            ("IDEM_KAFKA_TOPIC", &t.topic),
            ("IDEM_KAFKA_GROUP", &t.group),
            ("IDEM_KAFKA_DEDUP", &dedup),
            ("IDEM_KAFKA_BUSINESS", &business),
            ("IDEM_KAFKA_DIE_AT", "x-5"),
        ],
    );
    child.line("DYING", Duration::from_secs(30)).await;
    drop(child);
    let db = PgOffsets {
        store: store.clone(),
        pool: pool.clone(),
        business: business.clone(),
    };
    assert_eq!(
        db.rows(&t.group, &t.topic).await,
        vec![(0, 6)],
        "x-5 (offset 5) committed its offset"
    );
    let broker = t.kafka.committed(&t.group, &t.topic).await;
    assert!(
        matches!(broker.as_slice(), [(0, None)] | [(0, Some(0..=5))]),
        "the broker's commit is behind: {broker:?}"
    );
    let calls = Arc::new(AtomicUsize::new(0));
    let running = start(t.consumer.clone().offsets_in(&store), db.handler(&calls));
    eventually(Duration::from_secs(20), "the last four", || async {
        calls.load(Ordering::SeqCst) >= 4
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let report = running.stop().await;
    assert_eq!(
        (calls.load(Ordering::SeqCst), report.duplicates),
        (4, 0),
        "{report:?}"
    );
    assert_eq!(db.doubled().await, 0);
    let applied: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM {business}"
    )))
    .fetch_one(&pool)
    .await
    .expect("count");
    assert_eq!(applied, 10);
}

/// The consumer of the test above, in a process of its own: it aborts
/// inside the handler, right after the call that committed the message
/// `IDEM_KAFKA_DIE_AT`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by the_offset_commits_with_the_effect_when_the_consumer_dies_after_it"]
async fn kafka_consumer_dies_after_a_commit() {
    let var = |name: &str| std::env::var(name).expect(name);
    let (topic, group, dedup, business, die_at) = (
        var("IDEM_KAFKA_TOPIC"),
        var("IDEM_KAFKA_GROUP"),
        var("IDEM_KAFKA_DEDUP"),
        var("IDEM_KAFKA_BUSINESS"),
        var("IDEM_KAFKA_DIE_AT"),
    );
    let pool = pg_pool(4).await.expect("PostgreSQL");
    let store = PgStore::from_pool(pool)
        .with_table(&dedup)
        .expect("a table name");
    let handler = {
        let store = store.clone();
        move |msg: Points| -> BoxedCall {
            let (store, business, die_at) = (store.clone(), business.clone(), die_at.clone());
            Box::pin(async move {
                let r = apply_pg(&store, &msg, &business).await;
                if msg.id == die_at && matches!(r, Ok(Outcome::Executed(_))) {
                    println!("DYING");
                    std::process::abort();
                }
                r
            })
        }
    };
    let consumer = short_sessions(Consumer::new(kafka_brokers(), group, topic))
        .set(TANSU_ONE_RECORD_A_BATCH.0, TANSU_ONE_RECORD_A_BATCH.1)
        .offsets_in(&store);
    let _ = consumer
        .run(handler, idem_runtime::consume::CancellationToken::new())
        .await;
}

/// The network between the consumer and its broker goes for 3 s, every
/// connection dropped, while bodies run: librdkafka reconnects, the consumer
/// goes on, and every message takes effect once with the commits at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_consumer_rides_out_a_lost_connection() {
    let proxy_port = idem_tests::free_port().expect("a free port");
    let server = or_skip!(idem_tests::TansuServer::start(proxy_port));
    let proxy = idem_tests::brokers::CutProxy::start(proxy_port, server.port()).await;
    let brokers = format!("127.0.0.1:{}", proxy.port());
    let kafka = or_skip!(Kafka::at(&brokers).await);
    let topic = unique_table("kafka_cut");
    kafka.create_topic(&topic, 2).await;
    let producer = kafka.producer();
    let publish = |range: std::ops::Range<usize>| {
        let (producer, topic) = (producer.clone(), topic.clone());
        async move {
            for i in range {
                let id = format!("c-{i}");
                let payload = Points::payload(&id, 1);
                let record = FutureRecord::to(&topic).key(&id).payload(&payload);
                producer
                    .send(record, Duration::from_secs(30))
                    .await
                    .expect("publish");
            }
        }
    };
    publish(0..20).await;
    let group = format!("{topic}-group");
    let consumer = Consumer::new(&brokers, group.clone(), topic.clone())
        .set(TANSU_ONE_RECORD_A_BATCH.0, TANSU_ONE_RECORD_A_BATCH.1)
        .set("reconnect.backoff.ms", "100")
        .set("reconnect.backoff.max.ms", "500");
    let (store, seen) = (MemoryStore::new(), Arc::new(Seen::default()));
    let running = start(consumer, recording(&store, &seen));
    eventually(Duration::from_secs(20), "the first five", || async {
        seen.order().len() >= 5
    })
    .await;
    proxy.cut();
    tokio::time::sleep(Duration::from_secs(3)).await;
    proxy.restore();
    // Published after the outage: consumed over the new connections.
    publish(20..40).await;
    eventually(Duration::from_secs(60), "all 40", || async {
        seen.order().len() == 40
    })
    .await;
    eventually(
        Duration::from_secs(30),
        "the commits at the end",
        || async { kafka.lag(&group, std::slice::from_ref(&topic)).await == 0 },
    )
    .await;
    let report = running.stop().await;
    let mut ids = seen.order();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 40, "each message took effect once");
    assert_eq!(report.acked, 40, "{report:?}");
    assert!(report.reconnects >= 1, "the outage was seen: {report:?}");
}

#[idempotent(key = "msg.id", ttl = "1h", store = "memory", name = "kafka_stuck")]
async fn stuck(msg: &Points, seen: &Seen) -> Result<u32, AppError> {
    if msg.id == "stuck" {
        seen.running.fetch_add(1, Ordering::SeqCst);
        return Err(AppError::Refused("never".into()));
    }
    seen.order.lock().unwrap().push(msg.id.clone());
    Ok(msg.points)
}

/// A message waiting in place holds its partition, not a slot of the
/// policy's concurrency: with one slot, another partition's messages run
/// while it waits out its backoffs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_waiting_in_place_holds_no_slot() {
    let t = or_skip!(topic("kafka_in_place_slot", 2).await);
    let send_to = |partition: i32, id: &str| {
        let payload = Points::payload(id, 1);
        let (producer, topic) = (t.producer.clone(), t.topic.clone());
        async move {
            let record = FutureRecord::<str, _>::to(&topic)
                .partition(partition)
                .payload(&payload);
            producer
                .send(record, Duration::from_secs(10))
                .await
                .expect("publish");
        }
    };
    send_to(0, "stuck").await;
    let policy = Policy {
        concurrency: 1,
        max_attempts: 4,
        first_delay: Duration::from_millis(500),
        ..Policy::default()
    };
    let consumer = t.consumer.clone().policy(policy).retries(Retries::InPlace);
    let (store, seen) = (MemoryStore::new(), Arc::new(Seen::default()));
    let handler = {
        let seen = Arc::clone(&seen);
        move |msg: Points| -> BoxedCall {
            let (store, seen) = (store.clone(), Arc::clone(&seen));
            Box::pin(async move { stuck(&store, &msg, &seen).await })
        }
    };
    let running = start(consumer, handler);
    // Once the stuck message has failed and waits, the others arrive.
    eventually(Duration::from_secs(20), "the first failure", || async {
        seen.running.load(Ordering::SeqCst) == 1
    })
    .await;
    for i in 0..5 {
        send_to(1, &format!("free-{i}")).await;
    }
    eventually(
        Duration::from_secs(20),
        "the other partition's five",
        || async { seen.order().len() == 5 },
    )
    .await;
    // The stuck message waits 0.5 + 1 + 2 s before its last attempt.
    assert!(
        t.kafka
            .read(&t.consumer.dead_letter_topic())
            .await
            .is_empty(),
        "the other partition ran while the stuck message waited, not after"
    );
    eventually(Duration::from_secs(20), "the dead letter", || async {
        !t.kafka
            .read(&t.consumer.dead_letter_topic())
            .await
            .is_empty()
    })
    .await;
    let report = running.stop().await;
    assert_eq!((report.acked, report.dead_lettered), (5, 1), "{report:?}");
}

/// Offsets kept in one database, the handler's transactions in another of
/// the same kind: the offset does not ride in the handler's transaction
/// (where its table does not exist), the messages are executed, and the
/// offsets are written after each call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offsets_in_another_database_are_written_after_the_call() {
    let t = or_skip!(topic("kafka_offsets_elsewhere", 1).await);
    let dir = tempfile::tempdir().expect("a temporary directory");
    let handlers = SqliteStore::open(dir.path().join("handlers.db"))
        .await
        .expect("open");
    handlers.migrate().await.expect("migrate");
    sqlx::query("CREATE TABLE applied (id TEXT NOT NULL)")
        .execute(handlers.pool())
        .await
        .expect("business table");
    let positions = SqliteStore::open(dir.path().join("offsets.db"))
        .await
        .expect("open");
    positions.migrate().await.expect("migrate");
    for i in 0..5 {
        t.send(Some("k"), &Points::payload(&format!("e-{i}"), 1))
            .await;
    }
    let db = SqliteOffsets {
        store: handlers.clone(),
        pool: handlers.pool().clone(),
        business: "applied".to_owned(),
    };
    let calls = Arc::new(AtomicUsize::new(0));
    let running = start(
        t.consumer.clone().offsets_in(&positions),
        db.handler(&calls),
    );
    eventually(Duration::from_secs(20), "five calls", || async {
        calls.load(Ordering::SeqCst) >= 5
    })
    .await;
    let in_positions = SqliteOffsets {
        store: positions.clone(),
        pool: positions.pool().clone(),
        business: "applied".to_owned(),
    };
    eventually(
        Duration::from_secs(20),
        "the offset saved after the calls",
        || async { in_positions.rows(&t.group, &t.topic).await == vec![(0, 5)] },
    )
    .await;
    let report = running.stop().await;
    assert_eq!(
        (calls.load(Ordering::SeqCst), report.acked, report.retried),
        (5, 5, 0),
        "{report:?}"
    );
    assert_eq!(db.doubled().await, 0);
}
