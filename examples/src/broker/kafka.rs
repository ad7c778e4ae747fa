//! Kafka topics of the run's own (`KAFKA_BROKERS`, default
//! `127.0.0.1:9092`), made with [`PARTITIONS`] partitions and deleted with
//! the retry and dead-letter topics the consumer made next to them, and the
//! consumer group removed; a producer with `acks=all`.

use std::fmt::Display;
use std::future::Future;
use std::time::Duration;

use idem_runtime::consume::kafka::Consumer;
use idem_runtime::consume::{ConsumeError, Policy, Report};
use idem_runtime::{Error, Outcome};
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde::de::DeserializeOwned;

use super::{BoxError, Broker};

/// Partitions of every topic the examples make: more than one, so that
/// order and commits are per partition.
pub const PARTITIONS: i32 = 3;

/// The brokers: `KAFKA_BROKERS`, or the loopback default.
pub fn brokers() -> String {
    std::env::var("KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".into())
}

fn config() -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", brokers());
    c
}

/// A producer that waits for every replica (`acks=all`).
pub fn producer() -> Result<FutureProducer, BoxError> {
    Ok(config().set("acks", "all").create()?)
}

/// Publishes `payload` with record key `key` to `topic` and waits for the
/// broker's acknowledgement.
pub async fn send(
    producer: &FutureProducer,
    topic: &str,
    key: &str,
    payload: &[u8],
) -> Result<(), BoxError> {
    let record = FutureRecord::to(topic).key(key).payload(payload);
    producer
        .send(record, Duration::from_secs(30))
        .await
        .map_err(|(e, _)| e)?;
    Ok(())
}

/// The topics `consumer` makes next to its own: its retry topics and its
/// dead-letter topic.
pub fn made_by(consumer: &Consumer) -> Vec<String> {
    let mut topics = consumer.retry_topics();
    topics.push(consumer.dead_letter_topic());
    topics
}

/// Topic and group administration.
pub struct Admin {
    admin: AdminClient<DefaultClientContext>,
}

impl Admin {
    /// An admin client of the brokers.
    pub fn connect() -> Result<Self, BoxError> {
        Ok(Admin {
            admin: config().create()?,
        })
    }

    /// Creates `topic` with [`PARTITIONS`] partitions.
    pub async fn create_topic(&self, topic: &str) -> Result<(), BoxError> {
        let new = NewTopic::new(topic, PARTITIONS, TopicReplication::Fixed(-1));
        for result in self
            .admin
            .create_topics([&new], &AdminOptions::new())
            .await?
        {
            result.map_err(|(name, code)| format!("could not create topic {name}: {code}"))?;
        }
        Ok(())
    }

    /// Deletes `topics`; says which could not be.
    pub async fn delete_topics(&self, topics: &[String]) -> Result<(), BoxError> {
        let names: Vec<&str> = topics.iter().map(String::as_str).collect();
        let failed: Vec<String> = self
            .admin
            .delete_topics(&names, &AdminOptions::new())
            .await?
            .into_iter()
            .filter_map(|r| r.err().map(|(name, code)| format!("{name}: {code}")))
            .collect();
        if failed.is_empty() {
            Ok(())
        } else {
            Err(format!("could not delete topics {}", failed.join(", ")).into())
        }
    }

    /// Deletes the consumer group `group` (it must have no members left).
    pub async fn delete_group(&self, group: &str) -> Result<(), BoxError> {
        for result in self
            .admin
            .delete_groups(&[group], &AdminOptions::new())
            .await?
        {
            result.map_err(|(name, code)| format!("could not delete group {name}: {code}"))?;
        }
        Ok(())
    }
}

/// A topic, the consumer of it (its group named as the topic is) and a
/// producer.
pub struct Topic {
    admin: Admin,
    consumer: Consumer,
    producer: FutureProducer,
    topic: String,
}

impl Broker for Topic {
    const NAME: &'static str = "kafka";

    async fn open(name: &str) -> Result<Self, BoxError> {
        let admin = Admin::connect()?;
        admin.create_topic(name).await?;
        Ok(Topic {
            admin,
            consumer: Consumer::new(brokers(), name, name),
            producer: producer()?,
            topic: name.to_owned(),
        })
    }

    async fn publish(&self, key: &str, payload: Vec<u8>) -> Result<(), BoxError> {
        send(&self.producer, &self.topic, key, &payload).await
    }

    fn consume<M, T, E, F, Fut>(
        &self,
        policy: Policy,
        handler: F,
        shutdown: idem_runtime::consume::CancellationToken,
    ) -> impl Future<Output = Result<Report, ConsumeError>> + Send + 'static
    where
        M: DeserializeOwned + Send + 'static,
        T: Send + 'static,
        E: Display + Send + 'static,
        F: Fn(M) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Outcome<T>, Error<E>>> + Send + 'static,
    {
        self.consumer.clone().policy(policy).run(handler, shutdown)
    }

    async fn remove(self) {
        let mut topics = vec![self.topic.clone()];
        topics.extend(made_by(&self.consumer));
        if let Err(e) = self.admin.delete_topics(&topics).await {
            eprintln!("kafka: {e}");
        }
        if let Err(e) = self.admin.delete_group(&self.topic).await {
            eprintln!("kafka: {e}");
        }
    }
}
