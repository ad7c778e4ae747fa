//! Setting up and staying up: the runtime a consumer runs on, missing and
//! declared topics, a refused topology, a lost connection.

use std::sync::Arc;
use std::time::Duration;

use idem_runtime::MemoryStore;
use idem_runtime::consume::ConsumeError;
use idem_runtime::consume::kafka::Consumer;
use idem_tests::brokers::{DeleteTopics, Kafka, TANSU_ONE_RECORD_A_BATCH, kafka, kafka_brokers};
use idem_tests::{or_skip, unique_table};
use rdkafka::producer::FutureRecord;

use super::{Seen, recording, start, topic};
use crate::common::broker::Points;
use crate::common::{broker, eventually};

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
