//! The consumer suite (`common/broker.rs`) on Kafka, and what is Kafka's
//! own: partition order, commits that never pass an unsettled message,
//! retry topics that do not block a partition, strict in-place retries,
//! rebalances between two members, offsets in the database. Each test on
//! topics and a group of its own, the topics deleted afterwards.

use crate::common;

#[path = "kafka/members.rs"]
mod members;
#[path = "kafka/offsets.rs"]
mod offsets;
#[path = "kafka/order.rs"]
mod order;
#[path = "kafka/retries.rs"]
mod retries;
#[path = "kafka/setup.rs"]
mod setup;

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_runtime::consume::kafka::Consumer;
use idem_runtime::consume::{Broker as Kind, Delivery, Policy};
use idem_runtime::{Error, MemoryStore, Outcome, idempotent};
use idem_tests::brokers::{
    DeleteTopics, Kafka, TANSU_ONE_RECORD_A_BATCH, TANSU_SHORT_FETCH_WAIT, kafka, kafka_brokers,
};
use idem_tests::{or_skip, unique_table};
use rdkafka::message::{Headers as _, Message as _};
use rdkafka::producer::FutureRecord;

use common::broker::{Broker, DeadLetter, Points, Running};
use common::{AppError, broker};

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
    const CUTS_PAST_GRACE: bool = false;

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

    type To = idem_runtime::outbox::KafkaDestination;

    async fn destination(&self) -> Self::To {
        let mut config = rdkafka::ClientConfig::new();
        config
            .set("bootstrap.servers", kafka_brokers())
            .set(TANSU_ONE_RECORD_A_BATCH.0, TANSU_ONE_RECORD_A_BATCH.1);
        idem_runtime::outbox::KafkaDestination::from_config(config).expect("a producer")
    }

    const DROPS_REPEATED_IDS: bool = false;

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
    staged_messages_arrive_once_under_their_ids,
    an_undecodable_payload_is_dead_lettered_with_the_reason,
    a_failing_body_is_retried_then_dead_lettered,
    a_panicking_handler_is_retried_then_dead_lettered,
    shutdown_lets_bodies_in_flight_finish_and_acks_them,
    the_token_lets_bodies_in_flight_reach_their_outcome_on_every_store,
    a_stopping_consumer_waits_no_longer_than_its_grace,
    the_handler_is_told_about_each_delivery,
    the_consumer_counts_what_it_did,
    a_wait_between_tiers_is_waited_exactly,
    store_faults_back_off_and_are_never_dead_lettered,
);

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

/// A member presumed dead 6 s after its last heartbeat (librdkafka's
/// default is 45 s), for tests that kill one.
fn short_sessions(consumer: Consumer) -> Consumer {
    consumer
        .set("session.timeout.ms", "6000")
        .set("heartbeat.interval.ms", "500")
}
