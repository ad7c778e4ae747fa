//! The consumer suite (`common/broker.rs`) on Kafka, and what is Kafka's
//! own: partition order, commits that never pass an unsettled message,
//! retry topics that do not block a partition, strict in-place retries,
//! rebalances between two members, offsets in the database. Each test on
//! topics and a group of its own, the topics deleted afterwards.

mod common;

use std::future::Future;

use common::AppError;
use common::broker::{self, Broker, DeadLetter, Points, Running};
use idem_runtime::consume::Policy;
use idem_runtime::consume::kafka::Consumer;
use idem_runtime::{Error, Outcome};
use idem_tests::brokers::{DeleteTopics, Kafka, kafka, kafka_brokers};
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
    async fn open(name: &str) -> Option<Self> {
        let kafka = kafka().await?;
        let topic = unique_table(name);
        let group = format!("{topic}-group");
        let consumer = Consumer::new(kafka_brokers(), group.clone(), topic.clone());
        let mut topics = vec![topic.clone(), consumer.dead_letter_topic()];
        topics.extend(consumer.retry_topics());
        let cleanup = DeleteTopics::new(topics);
        kafka.create_topic(&topic, PARTITIONS).await;
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

    async fn publish(&self, payload: &[u8]) {
        self.send(None, payload).await;
    }

    fn start<F, Fut>(&self, policy: Policy, handler: F) -> Running
    where
        F: Fn(Points) -> Fut + Send + Sync + 'static,
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
);
