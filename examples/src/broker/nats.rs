//! A JetStream stream of the run's own (`NATS_URL`, default
//! `nats://127.0.0.1:4222`), on the subject `idem.example.<stream>`,
//! published to with JetStream's acknowledgements.

use std::fmt::Display;
use std::future::Future;

use idem_runtime::consume::{ConsumeError, Policy, Report, nats};
use idem_runtime::{Error, Outcome};
use serde::de::DeserializeOwned;

use super::{BoxError, Broker};

/// The stream, with a JetStream context to publish on and the consumer of it.
#[derive(Debug)]
pub struct Stream {
    consumer: nats::Consumer,
    js: async_nats::jetstream::Context,
    stream: String,
    subject: String,
}

impl Broker for Stream {
    const NAME: &'static str = "nats";

    async fn open(name: &str) -> Result<Self, BoxError> {
        let url = std::env::var("NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into());
        let js = async_nats::jetstream::new(async_nats::connect(&url).await?);
        let subject = format!("idem.example.{name}");
        js.get_or_create_stream(async_nats::jetstream::stream::Config {
            name: name.to_owned(),
            subjects: vec![subject.clone()],
            ..Default::default()
        })
        .await?;
        Ok(Stream {
            consumer: nats::Consumer::new(url, name, subject.clone()),
            js,
            stream: name.to_owned(),
            subject,
        })
    }

    async fn publish(&self, _key: &str, payload: Vec<u8>) -> Result<(), BoxError> {
        self.js
            .publish(self.subject.clone(), payload.into())
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
        let _ = self.js.delete_stream(&self.stream).await;
        let _ = self
            .js
            .delete_stream(self.consumer.dead_letter_stream())
            .await;
    }
}
