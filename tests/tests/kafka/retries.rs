//! Retries and dead letters: retry topics that do not block a partition,
//! waits that hop on, strict in-place retries, and what a dead letter says.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_runtime::consume::Policy;
use idem_runtime::consume::kafka::Retries;
use idem_runtime::{Error, FinalError, MemoryStore, Outcome, idempotent};
use idem_tests::or_skip;
use rdkafka::message::{Header, Headers as _, Message as _, OwnedHeaders, OwnedMessage};
use rdkafka::producer::FutureRecord;

use super::{BoxedCall, Seen, Topic, start, topic};
use crate::common::broker::Points;
use crate::common::{AppError, eventually};

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
        max_failures: 4,
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
