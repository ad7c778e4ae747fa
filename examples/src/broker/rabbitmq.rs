//! A durable RabbitMQ queue of the run's own (`AMQP_URL`, default
//! `amqp://guest:guest@127.0.0.1:5672/%2f`), published to with publisher
//! confirms.

use std::fmt::Display;
use std::future::Future;

use idem_runtime::consume::{ConsumeError, Policy, Report, rabbitmq};
use idem_runtime::{Error, Outcome};
use serde::de::DeserializeOwned;

use super::{BoxError, Broker};

/// The queue, with a channel to publish on and the consumer of it.
#[derive(Debug)]
pub struct Queue {
    consumer: rabbitmq::Consumer,
    channel: lapin::Channel,
    conn: lapin::Connection,
    queue: String,
}

impl Broker for Queue {
    const NAME: &'static str = "rabbitmq";

    async fn open(name: &str) -> Result<Self, BoxError> {
        let url = std::env::var("AMQP_URL")
            .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into());
        let conn = lapin::Connection::connect(&url, Default::default()).await?;
        let channel = conn.create_channel().await?;
        channel.confirm_select(Default::default()).await?;
        let durable = lapin::options::QueueDeclareOptions {
            durable: true,
            ..Default::default()
        };
        channel
            .queue_declare(name.into(), durable, Default::default())
            .await?;
        Ok(Queue {
            consumer: rabbitmq::Consumer::new(url, name),
            channel,
            conn,
            queue: name.to_owned(),
        })
    }

    async fn publish(&self, _key: &str, payload: Vec<u8>) -> Result<(), BoxError> {
        self.channel
            .basic_publish(
                "".into(),
                self.queue.as_str().into(),
                Default::default(),
                &payload,
                lapin::BasicProperties::default().with_delivery_mode(2),
            )
            .await?
            .await?;
        Ok(())
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
        let mut queues = vec![self.queue, self.consumer.dead_letter_queue()];
        queues.extend(
            rabbitmq::RETRY_DELAYS
                .iter()
                .map(|d| self.consumer.retry_queue(*d)),
        );
        for q in queues {
            let _ = self
                .channel
                .queue_delete(q.as_str().into(), Default::default())
                .await;
        }
        let _ = self.conn.close(200, "done".into()).await;
    }
}
