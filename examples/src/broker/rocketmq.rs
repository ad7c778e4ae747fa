//! A RocketMQ topic of the run's own (`ROCKETMQ_NAMESRV`, default
//! `127.0.0.1:9876`; 4 queues), published to with the client's producer,
//! which waits for the broker to store each message.

use std::collections::HashMap;
use std::fmt::Display;
use std::future::Future;
use std::sync::Arc;

use idem_runtime::consume::{ConsumeError, Policy, Report, rocketmq};
use idem_runtime::{Error, Outcome};
use rocketmq_client_rust::{ClientRuntime, ClientRuntimeConfig, DefaultMQProducer};
use rocketmq_model::common::message::message_single::Message;
use rocketmq_runtime::{RuntimeConfig, RuntimeOwner};
use serde::de::DeserializeOwned;

use super::{BoxError, Broker};

/// The topic, with a producer to publish on and idem's consumer of it.
pub struct Topic {
    consumer: rocketmq::Consumer,
    topic: String,
    producer: DefaultMQProducer,
    // Last: the runtime the producer runs on.
    _owner: RuntimeOwner,
}

impl std::fmt::Debug for Topic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Topic")
            .field("topic", &self.topic)
            .finish_non_exhaustive()
    }
}

/// The delay levels of the broker the tests start (`messageDelayLevel =
/// "1s 2s 3s 5s 10s 30s 1m 2m"`): retries come back in seconds.
fn levels() -> Vec<std::time::Duration> {
    [1, 2, 3, 5, 10, 30, 60, 120]
        .into_iter()
        .map(std::time::Duration::from_secs)
        .collect()
}

impl Broker for Topic {
    const NAME: &'static str = "rocketmq";

    async fn open(name: &str) -> Result<Self, BoxError> {
        let name_server =
            std::env::var("ROCKETMQ_NAMESRV").unwrap_or_else(|_| "127.0.0.1:9876".into());
        let owner =
            RuntimeOwner::plan(RuntimeConfig::for_parallelism("idem-example", 2))?.build()?;
        let runtime: Arc<ClientRuntime> = ClientRuntime::try_new(
            owner.root_context().component("example"),
            ClientRuntimeConfig::default(),
            rocketmq_observability::TelemetryHandle::default(),
        )?;
        let mut producer = DefaultMQProducer::builder(runtime)
            .producer_group(format!("{name}-producer"))
            .name_server_addr(name_server.clone())
            .build();
        Box::pin(producer.start()).await?;
        let topic = name.replace('.', "_");
        let mut made = producer.clone();
        let t = topic.clone();
        Box::pin(async move { made.create_topic("TBW102", &t, 4, HashMap::new()).await }).await?;
        Ok(Topic {
            consumer: rocketmq::Consumer::new(name_server, topic.clone()).delay_levels(levels()),
            topic,
            producer,
            _owner: owner,
        })
    }

    async fn publish(&self, key: &str, payload: Vec<u8>) -> Result<(), BoxError> {
        let msg = Message::builder()
            .topic(self.topic.clone())
            .key(key.to_owned())
            .body(payload)
            .build()?;
        let producer = self.producer.clone();
        match Box::pin(async move { producer.send(msg).await }).await? {
            Some(r) if r.send_status == rocketmq_model::result::SendStatus::SendOk => Ok(()),
            other => Err(format!("the broker did not store the message: {other:?}").into()),
        }
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
        // rocketmq-rust deletes a topic through its admin tools; the
        // topics of a run stay, empty once consumed, under names of its own.
        let mut producer = self.producer;
        Box::pin(async move { producer.shutdown().await }).await;
    }
}
