//! The NATS JetStream consumer as the front's [`Transport`]: a pull
//! consumer on the durable, each message settled by a double ack, a `Nak`
//! with the retry's delay, or a copy published to the dead-letter stream
//! and a `Term`; a body that runs long tells the server it is still working.

use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::consumer::{AckPolicy, pull};
use async_nats::jetstream::{self, AckKind, Message};
use futures_util::{FutureExt as _, StreamExt as _};

use super::Consumer;
use crate::BoxError;
use crate::client_tls;
use crate::consume::dead::cause::{NATS_HEADERS, header_text};
use crate::consume::front::transport::{Dead, Opening, Read, Retry, Session, Transport};
use crate::consume::{Attempts, Broker, ConsumeError, Delivery, Meter, Policy};

impl Transport for Consumer {
    type Connection = async_nats::Client;
    type Link = jetstream::Context;
    type Message = Message;

    const BROKER: Broker = Broker::Nats;

    fn queue(&self) -> &str {
        &self.durable
    }

    fn policy(&self) -> &Policy {
        &self.policy
    }

    fn check(&self) -> Result<(), ConsumeError> {
        self.check_topology()
    }

    async fn connect(&self) -> Result<async_nats::Client, BoxError> {
        client_tls::nats(&self.url, &self.tls).await
    }

    async fn open(&self, client: &async_nats::Client, _: &Meter) -> Result<Session<Self>, Opening> {
        let js = jetstream::new(client.clone());
        // A refusal is final; a timeout or a JetStream still starting is a
        // lost session.
        let consumer = self.declare_on(&js).await?;
        let messages = consumer
            .stream()
            .max_messages_per_batch(self.effective_prefetch())
            .messages()
            .await
            .map_err(|e| Opening::Lost(Box::new(e)))?;
        Ok(Session {
            messages: messages.map(|m| m.map_err(BoxError::from)).boxed(),
            link: js,
            stop_taking: async {}.boxed(),
            // Acks are sent without waiting for the server: see them out
            // before the connection goes.
            closing: {
                let client = client.clone();
                async move {
                    let _ = client.flush().await;
                }
                .boxed()
            },
        })
    }

    async fn close(&self, _: async_nats::Client) {
        // Dropped: what a session sent was flushed as it closed.
    }

    fn read<'m>(&self, msg: &'m Message) -> Read<'m> {
        let info = msg.info().ok();
        let delivered = info.as_ref().map_or(1, |i| i.delivered);
        // A `Nak` cannot carry a count: every redelivery is a retry, and a
        // failed attempt (see the module docs).
        let failures = u32::try_from(delivered.saturating_sub(1)).unwrap_or(u32::MAX);
        Read {
            payload: &msg.payload,
            delivery: describe(msg, info.as_ref()),
            attempts: Attempts {
                failures,
                retries: failures,
                ..Attempts::default()
            },
            due: None,
            waiting: info.as_ref().map(|i| i.pending),
        }
    }

    async fn ack(&self, _: &jetstream::Context, msg: &Message) -> Result<(), BoxError> {
        msg.double_ack().await
    }

    async fn retry(
        &self,
        _: &jetstream::Context,
        msg: &Message,
        retry: Retry<'_>,
    ) -> Result<(), BoxError> {
        msg.ack_with(AckKind::Nak(Some(retry.after))).await
    }

    async fn dead_letter(
        &self,
        js: &jetstream::Context,
        msg: &Message,
        dead: Dead<'_>,
    ) -> Result<(), BoxError> {
        let delivered = msg.info().map_or(1, |i| i.delivered);
        // The producer's `Nats-*` headers (expected sequence, message id,
        // rollup, TTL) would make the dead-letter stream refuse or drop the
        // copy: only the others pass.
        let mut headers = HeaderMap::new();
        if let Some(original) = &msg.headers {
            for (name, values) in original.iter() {
                let name = name.to_string();
                if name.starts_with("Nats-") {
                    if name == "Nats-Msg-Id" {
                        for v in values {
                            headers.insert("Idem-Original-Msg-Id", v.as_str());
                        }
                    }
                    continue;
                }
                for v in values {
                    headers.append(name.as_str(), v.as_str());
                }
            }
        }
        let reason = header_text(dead.reason);
        headers.insert("Idem-Reason", reason.as_str());
        headers.insert("Idem-Deliveries", delivered.to_string().as_str());
        headers.insert("Idem-Stream", self.stream.as_str());
        headers.insert("Idem-Subject", msg.subject.as_str());
        for (name, value) in dead
            .cause
            .map(|c| c.headers(NATS_HEADERS))
            .unwrap_or_default()
        {
            headers.insert(name, value.as_str());
        }
        js.publish_with_headers(self.dead_letter_subject(), headers, msg.payload.clone())
            .await?
            .await?;
        msg.double_ack_with(AckKind::Term).await
    }

    async fn forward(
        &self,
        _: &jetstream::Context,
        _: &Message,
        _: Duration,
    ) -> Result<(), BoxError> {
        // `read` gives no due time: JetStream waits out a `Nak`'s delay.
        Err("JetStream retries wait on the server: nothing to forward".into())
    }

    async fn give_back(&self, msg: &Message, after: Option<Duration>) {
        let _ = msg.ack_with(AckKind::Nak(after)).await;
    }

    fn keep_alive(&self) -> Option<Duration> {
        // Every third of the ack wait, so a long body does not get its
        // message redelivered.
        Some(self.ack_wait / 3)
    }

    async fn still_working(&self, msg: &Message) {
        let _ = msg.ack_with(AckKind::Progress).await;
    }
}

impl Consumer {
    /// Creates the streams and the durable where missing, and checks a
    /// durable that exists (for [`declare`](Self::declare) and every session
    /// of `run`).
    pub(super) async fn declare_on(
        &self,
        js: &jetstream::Context,
    ) -> Result<jetstream::consumer::Consumer<pull::Config>, Opening> {
        // A refusal (an invalid name, a conflicting stream or consumer) is
        // final; a timeout or a JetStream still starting is worth another go.
        macro_rules! step {
            ($e:expr, $refused:ident) => {
                match $e {
                    Ok(v) => v,
                    Err(e) if $refused(&e) => return Err(Opening::Refused(Box::new(e))),
                    Err(e) => return Err(Opening::Lost(Box::new(e))),
                }
            };
        }
        let stream = step!(
            js.get_or_create_stream(jetstream::stream::Config {
                name: self.stream.clone(),
                subjects: vec![self.subject.clone()],
                ..Default::default()
            })
            .await,
            stream_refused
        );
        step!(
            js.get_or_create_stream(jetstream::stream::Config {
                name: self.dead_letter_stream(),
                subjects: vec![self.dead_letter_subject()],
                ..Default::default()
            })
            .await,
            stream_refused
        );
        let consumer: jetstream::consumer::Consumer<pull::Config> = step!(
            stream
                .get_or_create_consumer(
                    &self.durable,
                    pull::Config {
                        durable_name: Some(self.durable.clone()),
                        ack_policy: AckPolicy::Explicit,
                        ack_wait: self.ack_wait,
                        max_deliver: -1,
                        filter_subject: self.subject.clone(),
                        ..Default::default()
                    },
                )
                .await,
            consumer_refused
        );
        // A durable that already exists is returned as it is: it must be the
        // one this consumer would make, or messages go astray (another
        // subject) or are redelivered while their bodies run (another ack
        // wait).
        let found = &consumer.cached_info().config;
        if found.filter_subject != self.subject
            || found.ack_policy != AckPolicy::Explicit
            || found.ack_wait != self.ack_wait
            || found.max_deliver != -1
        {
            return Err(Opening::Refused(format!(
                "the durable consumer {} exists with other settings (filter {:?}, ack wait {:?}, max deliver {}); delete it, or name another with `.durable(...)`",
                self.durable, found.filter_subject, found.ack_wait, found.max_deliver
            )
            .into()));
        }
        Ok(consumer)
    }
}

/// What the server said about `message`, for the handler.
fn describe(message: &Message, info: Option<&jetstream::message::Info<'_>>) -> Delivery {
    let mut described = Delivery {
        broker: Some(Broker::Nats),
        source: message.subject.to_string(),
        ..Delivery::default()
    };
    if let Some(info) = info {
        let delivered = u32::try_from(info.delivered.max(1)).unwrap_or(u32::MAX);
        described.deliveries = delivered;
        described.retries = delivered - 1;
        described.redelivered = delivered > 1;
        described.offset = i64::try_from(info.stream_sequence).ok();
        let nanos = info.published.unix_timestamp_nanos();
        described.published_at = u64::try_from(nanos)
            .ok()
            .and_then(|n| std::time::UNIX_EPOCH.checked_add(Duration::from_nanos(n)));
    }
    if let Some(headers) = &message.headers {
        for (name, values) in headers.iter() {
            for value in values {
                described
                    .headers
                    .push((name.to_string(), value.as_str().as_bytes().to_vec()));
            }
        }
        described.id = headers.get("Nats-Msg-Id").map(|v| v.as_str().to_owned());
    }
    described
}

/// Whether JetStream refused a stream for good: an invalid name or
/// configuration, a conflict with another stream (API errors below 500).
fn stream_refused(e: &jetstream::context::CreateStreamError) -> bool {
    use jetstream::context::CreateStreamErrorKind as K;
    match e.kind() {
        K::EmptyStreamName | K::InvalidStreamName | K::DomainAndExternalSet => true,
        K::JetStream(api) => api.code() < 500,
        _ => false,
    }
}

/// Whether JetStream refused a consumer for good (see [`stream_refused`]).
fn consumer_refused(e: &jetstream::stream::ConsumerError) -> bool {
    use jetstream::stream::ConsumerErrorKind as K;
    match e.kind() {
        K::InvalidConsumerType | K::InvalidName => true,
        K::JetStream(api) => api.code() < 500,
        _ => false,
    }
}
