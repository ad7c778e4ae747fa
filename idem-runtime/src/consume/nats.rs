//! A NATS JetStream consumer around an idempotent handler (feature `nats`,
//! through async-nats).
//!
//! # Topology
//!
//! For a stream `S` and a subject the consumer declares, if they do not
//! exist, when it starts and on its own with [`Consumer::declare`]:
//!
//! | what | default name | setting | holds |
//! | --- | --- | --- | --- |
//! | the stream | `S` | [`Consumer::new`] | the messages; created capturing the subject |
//! | the durable pull consumer | `<S>_<subject>_idem` (with `.`, `*` and `>` as `_`) | [`Consumer::durable`] | the consumer's position: one per stream and subject |
//! | the dead-letter stream | `<S>_DEAD` | [`Consumer::dead_letters`] | what no retry can cure |
//! | the dead-letter subject | `idem.dead.<S>` | [`Consumer::dead_letters`] | the subject dead letters are published to, captured by the dead-letter stream |
//!
//! The durable has explicit acks, no delivery limit (the consumer
//! dead-letters instead, so nothing is dropped silently) and the ack wait of
//! [`Consumer::ack_wait`]; one that exists with other settings is refused
//! ([`ConsumeError::Setup`]) rather than used as it is. Stream and durable
//! names may not hold whitespace, `.`, `*`, `>`, `/` or `\`, and the
//! dead-letter subject no wildcard: such names are refused before the server
//! is asked ([`ConsumeError::Setup`]).
//!
//! **Declare before publishing.** A core NATS publish to a subject no stream
//! captures is dropped, silently (a JetStream publish fails instead): run
//! [`Consumer::declare`] (from a deploy step, or the producer at its start)
//! before the first message is published, or create the stream yourself. A
//! durable created by `declare` starts at the stream's first message, so what
//! is published between `declare` and the first `run` waits for it.
//!
//! A retry is a `Nak` with the delay, which JetStream applies natively; the
//! consumer holds no slot for it meanwhile (JetStream counts it against the
//! durable's `max_ack_pending`, 1,000 by default, until it is redelivered).
//! A dead letter is published (and its publish acknowledged by the server)
//! before the original is terminated (`Term`), with the headers
//! `Idem-Reason`, `Idem-Deliveries`, `Idem-Stream` and `Idem-Subject`; the
//! producer's `Nats-*` headers are left out (they could make the dead-letter
//! stream refuse the copy), `Nats-Msg-Id` kept as `Idem-Original-Msg-Id`. While a body runs, the consumer tells
//! the server it is still working (`Progress`) every third of the ack wait.
//!
//! # Attempts
//!
//! A `Nak` cannot carry a count, so attempts are deliveries: JetStream's
//! `delivered` counter, which survives consumer restarts. A message whose
//! body fails on its `max_attempts`-th delivery or later is dead-lettered;
//! store outages and `InProgress` answers are retried whatever the count, but
//! they do use up deliveries. A store fault's wait follows for how long the
//! store has been failing, not the deliveries (which also count earlier
//! faults and crashed consumers).
//!
//! # Examples
//!
//! ```no_run,standalone_crate
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use idem_runtime::consume::{nats::Consumer, shutdown_on};
//! use idem_runtime::{idempotent, MemoryStore};
//!
//! #[derive(serde::Deserialize)]
//! struct PointsEarned { message_id: String, points: i64 }
//!
//! #[idempotent(key = "message_id", ttl = "7d", store = "memory")]
//! async fn grant(msg: &PointsEarned) -> Result<i64, std::io::Error> {
//!     Ok(msg.points)
//! }
//!
//! let store = MemoryStore::new();
//! let report = Consumer::new("nats://127.0.0.1:4222", "LOYALTY", "loyalty.points")
//!     .run(
//!         move |msg: PointsEarned| {
//!             let store = store.clone();
//!             async move { grant(&store, &msg).await }
//!         },
//!         shutdown_on(async { tokio::signal::ctrl_c().await.ok(); }),
//!     )
//!     .await?;
//! println!("{report:?}");
//! # Ok(()) }
//! ```

use std::fmt::Display;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::consumer::{AckPolicy, pull};
use async_nats::jetstream::{self, AckKind, Message};
use serde::de::DeserializeOwned;

use super::{
    Attempts, Broker, CancellationToken, ConsumeError, Delivery, Ended, Meter, Policy, Report,
    Settled, Verdict, drive, handle, sessions,
};
use crate::BoxError;
use crate::error::Error;
use crate::outcome::Outcome;

/// A consumer of one JetStream subject; see the [module docs](self).
///
/// # Examples
///
/// ```
/// use idem_runtime::consume::nats::Consumer;
///
/// let c = Consumer::new("nats://127.0.0.1:4222", "ORDERS", "orders.placed");
/// assert_eq!(c.durable_name(), "ORDERS_orders_placed_idem");
/// assert_eq!(c.dead_letter_subject(), "idem.dead.ORDERS");
/// assert_eq!(c.dead_letter_stream(), "ORDERS_DEAD");
/// ```
#[derive(Debug, Clone)]
pub struct Consumer {
    url: String,
    stream: String,
    subject: String,
    durable: String,
    policy: Policy,
    /// `None`: twice the policy's concurrency.
    prefetch: Option<usize>,
    ack_wait: Duration,
    /// The dead-letter stream and subject; `None`: `<stream>_DEAD` and
    /// `idem.dead.<stream>`.
    dead: Option<(String, String)>,
}

impl Consumer {
    /// A consumer of `subject` in stream `stream` on the server at `url`,
    /// with the default [`Policy`], a prefetch of twice its concurrency, an
    /// ack wait of 30 s and the default topology (see the
    /// [module docs](self#topology)).
    ///
    /// # Examples
    ///
    /// ```
    /// let c = idem_runtime::consume::nats::Consumer::new("nats://127.0.0.1:4222", "ORDERS", "orders.>");
    /// assert_eq!(c.effective_prefetch(), 16);
    /// ```
    pub fn new(
        url: impl Into<String>,
        stream: impl Into<String>,
        subject: impl Into<String>,
    ) -> Self {
        let stream: String = stream.into();
        let subject: String = subject.into();
        // One durable per stream and subject: two subjects of one stream
        // must not share a consumer (and its filter).
        let named: String = subject
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let durable = format!("{stream}_{named}_idem");
        Consumer {
            durable,
            url: url.into(),
            stream,
            subject,
            policy: Policy::default(),
            prefetch: None,
            ack_wait: Duration::from_secs(30),
            dead: None,
        }
    }

    /// Retries, attempts and concurrency.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::consume::{Policy, nats::Consumer};
    /// let c = Consumer::new("nats://127.0.0.1:4222", "ORDERS", "orders.placed")
    ///     .policy(Policy { max_attempts: 10, ..Policy::default() });
    /// # let _ = c;
    /// ```
    pub fn policy(mut self, policy: Policy) -> Self {
        self.policy = policy;
        self
    }

    /// How many messages one pull asks for. Default: twice the policy's
    /// concurrency (16 with the default policy), as on RabbitMQ: each slot
    /// has a message ready when it frees, and messages do not sit in the
    /// consumer while their ack wait runs; set, it wins whatever the
    /// concurrency.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::consume::{Policy, nats::Consumer};
    /// let c = Consumer::new("nats://127.0.0.1:4222", "ORDERS", "orders.placed")
    ///     .policy(Policy { concurrency: 4, ..Policy::default() });
    /// assert_eq!(c.effective_prefetch(), 8);
    /// assert_eq!(c.prefetch(64).effective_prefetch(), 64);
    /// ```
    pub fn prefetch(mut self, prefetch: usize) -> Self {
        self.prefetch = Some(prefetch.max(1));
        self
    }

    /// The prefetch the consumer asks for: the one set with
    /// [`prefetch`](Self::prefetch), or twice the policy's concurrency.
    ///
    /// # Examples
    ///
    /// See [`prefetch`](Self::prefetch).
    pub fn effective_prefetch(&self) -> usize {
        self.prefetch
            .unwrap_or_else(|| self.policy.concurrency.max(1).saturating_mul(2))
    }

    /// Names the dead-letter stream and the subject dead letters are
    /// published to (default `<stream>_DEAD` and `idem.dead.<stream>`).
    /// The stream's name may not hold whitespace, `.`, `*`, `>`, `/` or
    /// `\`, nor be the consumer's stream; the subject may not hold a
    /// wildcard, nor be one the consumer's stream captures (the server
    /// refuses streams whose subjects overlap). [`declare`] and [`run`]
    /// refuse such names ([`ConsumeError::Setup`]).
    ///
    /// [`declare`]: Self::declare
    /// [`run`]: Self::run
    ///
    /// # Examples
    ///
    /// ```
    /// let c = idem_runtime::consume::nats::Consumer::new("nats://127.0.0.1:4222", "ORDERS", "orders.placed")
    ///     .dead_letters("PARKED_ORDERS", "parked.orders");
    /// assert_eq!(c.dead_letter_stream(), "PARKED_ORDERS");
    /// assert_eq!(c.dead_letter_subject(), "parked.orders");
    /// ```
    pub fn dead_letters(mut self, stream: impl Into<String>, subject: impl Into<String>) -> Self {
        self.dead = Some((stream.into(), subject.into()));
        self
    }

    /// The durable consumer's name (default `<stream>_<subject>_idem`).
    ///
    /// # Examples
    ///
    /// ```
    /// let c = idem_runtime::consume::nats::Consumer::new("nats://127.0.0.1:4222", "ORDERS", "orders.placed")
    ///     .durable("stock");
    /// assert_eq!(c.durable_name(), "stock");
    /// ```
    pub fn durable(mut self, name: impl Into<String>) -> Self {
        self.durable = name.into();
        self
    }

    /// How long the server waits for an ack before it redelivers (default
    /// 30 s); bodies that run longer keep their message with `Progress`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// let c = idem_runtime::consume::nats::Consumer::new("nats://127.0.0.1:4222", "ORDERS", "orders.placed")
    ///     .ack_wait(Duration::from_secs(60));
    /// # let _ = c;
    /// ```
    pub fn ack_wait(mut self, ack_wait: Duration) -> Self {
        self.ack_wait = ack_wait.max(Duration::from_millis(100));
        self
    }

    /// The durable consumer's name.
    ///
    /// # Examples
    ///
    /// ```
    /// let c = idem_runtime::consume::nats::Consumer::new("nats://127.0.0.1:4222", "ORDERS", "orders.placed");
    /// assert_eq!(c.durable_name(), "ORDERS_orders_placed_idem");
    /// ```
    pub fn durable_name(&self) -> &str {
        &self.durable
    }

    /// Where dead letters are published: `idem.dead.<stream>`, or the
    /// subject named with [`dead_letters`](Self::dead_letters).
    ///
    /// # Examples
    ///
    /// ```
    /// let c = idem_runtime::consume::nats::Consumer::new("nats://127.0.0.1:4222", "ORDERS", "orders.placed");
    /// assert_eq!(c.dead_letter_subject(), "idem.dead.ORDERS");
    /// ```
    pub fn dead_letter_subject(&self) -> String {
        match &self.dead {
            Some((_, subject)) => subject.clone(),
            None => format!("idem.dead.{}", self.stream),
        }
    }

    /// The stream that keeps the dead letters: `<stream>_DEAD`, or the one
    /// named with [`dead_letters`](Self::dead_letters).
    ///
    /// # Examples
    ///
    /// ```
    /// let c = idem_runtime::consume::nats::Consumer::new("nats://127.0.0.1:4222", "ORDERS", "orders.placed");
    /// assert_eq!(c.dead_letter_stream(), "ORDERS_DEAD");
    /// ```
    pub fn dead_letter_stream(&self) -> String {
        match &self.dead {
            Some((stream, _)) => stream.clone(),
            None => format!("{}_DEAD", self.stream),
        }
    }

    /// Why the topology cannot be declared, if it cannot: names JetStream
    /// refuses.
    fn check(&self) -> Result<(), ConsumeError> {
        let refuse = |reason: String| ConsumeError::Setup(reason.into());
        check_name("stream", &self.stream).map_err(refuse)?;
        check_name("durable consumer", &self.durable).map_err(refuse)?;
        check_subject("subject", &self.subject, true).map_err(refuse)?;
        let dead = self.dead_letter_stream();
        check_name("dead-letter stream", &dead).map_err(refuse)?;
        if dead == self.stream {
            return Err(refuse(format!(
                "the dead-letter stream {dead:?} is the consumer's stream"
            )));
        }
        check_subject("dead-letter subject", &self.dead_letter_subject(), false).map_err(refuse)?;
        Ok(())
    }

    /// Declares the topology (see the [module docs](self#topology)): the
    /// stream, the dead-letter stream and the durable consumer, where
    /// missing, without consuming; `run` declares it the same way. For a
    /// deploy step or a producer to run before the first message is
    /// published. Connects once: an unreachable server, names it refuses,
    /// or a durable that exists with other settings, is a
    /// [`ConsumeError::Setup`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_runtime::consume::nats::Consumer;
    ///
    /// // in the deploy step, or at the producer's start
    /// Consumer::new("nats://127.0.0.1:4222", "LOYALTY", "loyalty.points")
    ///     .declare()
    ///     .await?;
    /// // ... now messages published to "loyalty.points" wait for the consumer
    /// # Ok(()) }
    /// ```
    pub async fn declare(&self) -> Result<(), ConsumeError> {
        self.check()?;
        let client = async_nats::connect(self.url.clone())
            .await
            .map_err(|e| ConsumeError::Setup(Box::new(e)))?;
        let declared = self.declare_on(&jetstream::new(client.clone())).await;
        let _ = client.flush().await;
        match declared {
            Ok(_) => Ok(()),
            Err(Refused::ForGood(e) | Refused::ForNow(e)) => Err(ConsumeError::Setup(e)),
        }
    }

    /// Creates the streams and the durable where missing, and checks a
    /// durable that exists (for [`declare`](Self::declare) and every session
    /// of `run`).
    async fn declare_on(
        &self,
        js: &jetstream::Context,
    ) -> Result<jetstream::consumer::Consumer<pull::Config>, Refused> {
        // A refusal (an invalid name, a conflicting stream or consumer) is
        // final; a timeout or a JetStream still starting is worth another go.
        macro_rules! step {
            ($e:expr, $refused:ident) => {
                match $e {
                    Ok(v) => v,
                    Err(e) if $refused(&e) => return Err(Refused::ForGood(Box::new(e))),
                    Err(e) => return Err(Refused::ForNow(Box::new(e))),
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
            return Err(Refused::ForGood(format!(
                "the durable consumer {} exists with other settings (filter {:?}, ack wait {:?}, max deliver {}); delete it, or name another with `.durable(...)`",
                self.durable, found.filter_subject, found.ack_wait, found.max_deliver
            )
            .into()));
        }
        Ok(consumer)
    }

    /// Consumes until `shutdown` is cancelled, then stops pulling, lets the
    /// messages in flight finish and settles them, and returns what it did.
    ///
    /// The server is connected with a growing pause (100 ms to 5 s) until it
    /// answers, at start-up and after the message stream fails; messages in
    /// flight then are redelivered after their ack wait. Returns
    /// [`ConsumeError::Stopped`] when a call reported the binary
    /// misconfigured ([`Error::Config`]), and [`ConsumeError::Setup`] when the
    /// server refused the streams or the consumer.
    ///
    /// # Examples
    ///
    /// See the [module docs](self).
    pub async fn run<M, T, E, F, Fut>(
        self,
        handler: F,
        shutdown: CancellationToken,
    ) -> Result<Report, ConsumeError>
    where
        M: DeserializeOwned + Send + 'static,
        T: Send + 'static,
        E: Display + Send + 'static,
        F: Fn(M) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Outcome<T>, Error<E>>> + Send + 'static,
    {
        self.run_with_delivery(move |msg, _: Delivery| handler(msg), shutdown)
            .await
    }

    /// As [`run`](Self::run), with the handler given what the server said
    /// about each message as well ([`Delivery`]: its delivery count,
    /// headers, `Nats-Msg-Id`, subject, stream sequence and timestamp).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_runtime::consume::{Delivery, nats::Consumer, shutdown_on};
    /// use idem_runtime::{Error, Outcome};
    ///
    /// #[derive(serde::Deserialize)]
    /// struct Ping { id: String }
    ///
    /// Consumer::new("nats://127.0.0.1:4222", "PINGS", "pings.>")
    ///     .run_with_delivery(
    ///         |ping: Ping, delivery: Delivery| async move {
    ///             tracing::info!(id = %ping.id, subject = %delivery.source, n = delivery.deliveries, "ping");
    ///             Ok::<_, Error<String>>(Outcome::Executed(()))
    ///         },
    ///         shutdown_on(async { tokio::signal::ctrl_c().await.ok(); }),
    ///     )
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub async fn run_with_delivery<M, T, E, F, Fut>(
        self,
        handler: F,
        shutdown: CancellationToken,
    ) -> Result<Report, ConsumeError>
    where
        M: DeserializeOwned + Send + 'static,
        T: Send + 'static,
        E: Display + Send + 'static,
        F: Fn(M, Delivery) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Outcome<T>, Error<E>>> + Send + 'static,
    {
        self.check()?;
        let handler = Arc::new(handler);
        let report = Arc::new(Mutex::new(Report::default()));
        let meter = Meter::new(Broker::Nats, &self.durable);
        let url = self.url.clone();
        let connect = || async_nats::connect(url.clone());
        let session = |client: async_nats::Client, shutdown: CancellationToken| {
            let (this, handler, report, meter) = (&self, &handler, &report, &meter);
            async move { this.session(client, handler, report, meter, shutdown).await }
        };
        sessions("NATS", shutdown, &report, &meter, connect, session).await
    }

    async fn session<M, T, E, F, Fut>(
        &self,
        client: async_nats::Client,
        handler: &Arc<F>,
        report: &Arc<Mutex<Report>>,
        meter: &Meter,
        shutdown: CancellationToken,
    ) -> Result<Ended, BoxError>
    where
        M: DeserializeOwned + Send + 'static,
        T: Send + 'static,
        E: Display + Send + 'static,
        F: Fn(M, Delivery) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Outcome<T>, Error<E>>> + Send + 'static,
    {
        let js = jetstream::new(client.clone());
        // A refusal is final; a timeout or a JetStream still starting is a
        // lost session.
        let consumer = match self.declare_on(&js).await {
            Ok(consumer) => consumer,
            Err(Refused::ForGood(e)) => return Err(e),
            Err(Refused::ForNow(e)) => return Ok(Ended::Lost(e)),
        };
        let messages = match consumer
            .stream()
            .max_messages_per_batch(self.effective_prefetch())
            .messages()
            .await
        {
            Ok(m) => m,
            Err(e) => return Ok(Ended::Lost(Box::new(e))),
        };
        let settle = {
            let (consumer, handler, meter) = (self.clone(), Arc::clone(handler), meter.clone());
            move |message: Message| {
                let (consumer, handler, js, meter) = (
                    consumer.clone(),
                    Arc::clone(&handler),
                    js.clone(),
                    meter.clone(),
                );
                async move { consumer.settle(&js, message, &*handler, &meter).await }
            }
        };
        let ended = drive(
            messages,
            self.policy.concurrency,
            report,
            shutdown,
            settle,
            async {},
        )
        .await;
        // Acks are sent without waiting for the server: see them out before
        // the connection goes.
        let _ = client.flush().await;
        Ok(ended)
    }

    /// Runs one message through the handler and settles it with the server.
    async fn settle<M, T, E, F, Fut>(
        &self,
        js: &jetstream::Context,
        message: Message,
        handler: &F,
        meter: &Meter,
    ) -> Settled
    where
        M: DeserializeOwned,
        E: Display,
        F: Fn(M, Delivery) -> Fut,
        Fut: Future<Output = Result<Outcome<T>, Error<E>>>,
    {
        let info = message.info().ok();
        let delivered = info.as_ref().map_or(1, |i| i.delivered);
        let failures = u32::try_from(delivered.saturating_sub(1)).unwrap_or(u32::MAX);
        let described = describe(&message, info.as_ref());
        if let Some(info) = &info {
            meter.lag(info.pending);
        }
        let published_at = described.published_at;
        meter.delivered(&described);
        let _in_flight = meter.in_flight();
        // A `Nak` cannot carry a count: every redelivery is a retry, and a
        // failed attempt (see the module docs).
        let attempts = Attempts {
            failures,
            retries: failures,
            ..Attempts::default()
        };
        // Tell the server the body is still running, every third of the ack
        // wait, so a long body does not get its message redelivered.
        let handled = {
            let beat = self.ack_wait / 3;
            let work = handle(
                handler,
                &message.payload,
                described,
                attempts,
                &self.policy,
                meter,
            );
            let mut work = std::pin::pin!(work);
            let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + beat, beat);
            loop {
                tokio::select! {
                    done = &mut work => break done,
                    _ = ticks.tick() => {
                        let _ = message.ack_with(AckKind::Progress).await;
                    }
                }
            }
        };
        let duplicate = handled.duplicate;
        let settled: Result<Settled, BoxError> = async {
            Ok(match handled.verdict.clone() {
                Verdict::Ack { alert } => {
                    if let Some(alert) = &alert {
                        tracing::error!(stream = %self.stream, "acked, but look: {alert}");
                    }
                    message.double_ack().await?;
                    Settled::Acked {
                        duplicate,
                        alert: alert.is_some(),
                    }
                }
                Verdict::Retry { after, reason, .. } => {
                    tracing::debug!(stream = %self.stream, ?after, %reason, "retrying later");
                    message.ack_with(AckKind::Nak(Some(after))).await?;
                    Settled::Retried
                }
                Verdict::DeadLetter { reason, .. } => {
                    tracing::warn!(stream = %self.stream, %reason, "dead-lettered");
                    // The producer's `Nats-*` headers (expected sequence,
                    // message id, rollup, TTL) would make the dead-letter
                    // stream refuse or drop the copy: only the others pass.
                    let mut headers = HeaderMap::new();
                    if let Some(original) = &message.headers {
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
                    let reason: String = reason.chars().take(4_000).collect();
                    headers.insert("Idem-Reason", reason.as_str());
                    headers.insert("Idem-Deliveries", delivered.to_string().as_str());
                    headers.insert("Idem-Stream", self.stream.as_str());
                    headers.insert("Idem-Subject", message.subject.as_str());
                    js.publish_with_headers(
                        self.dead_letter_subject(),
                        headers,
                        message.payload.clone(),
                    )
                    .await?
                    .await?;
                    message.double_ack_with(AckKind::Term).await?;
                    Settled::DeadLettered
                }
                Verdict::Stop { reason } => {
                    let _ = message.ack_with(AckKind::Nak(None)).await;
                    Settled::Stop(reason)
                }
            })
        }
        .await;
        let settled = match settled {
            Ok(settled) => settled,
            Err(e) => {
                meter.settle_failed(&e);
                let _ = message
                    .ack_with(AckKind::Nak(Some(Duration::from_secs(1))))
                    .await;
                Settled::Unsettled
            }
        };
        meter.settled(&handled, &settled, published_at);
        settled
    }
}

/// Why the topology could not be declared.
enum Refused {
    /// The server refused it: a new session would meet the same answer.
    ForGood(BoxError),
    /// A timeout, a JetStream still starting: worth another session.
    ForNow(BoxError),
}

/// Why JetStream would refuse `name` as a stream's or a durable's, if it
/// would: empty, or holding whitespace, `.`, `*`, `>`, `/`, `\` or a
/// control character.
fn check_name(what: &str, name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err(format!("the {what} name is empty"));
    }
    if let Some(c) = name
        .chars()
        .find(|c| c.is_whitespace() || c.is_control() || matches!(c, '.' | '*' | '>' | '/' | '\\'))
    {
        return Err(format!(
            "the {what} name {name:?} holds {c:?}: NATS names may not hold whitespace, `.`, `*`, `>`, `/` or `\\`"
        ));
    }
    Ok(())
}

/// Why NATS would refuse `subject`, if it would: empty, whitespace, an
/// empty token (`a..b`, a leading or trailing `.`), or, unless `wildcards`,
/// a `*` or `>` (one cannot publish to a wildcard).
fn check_subject(what: &str, subject: &str, wildcards: bool) -> Result<(), String> {
    if subject.is_empty() {
        return Err(format!("the {what} is empty"));
    }
    if subject.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!("the {what} {subject:?} holds whitespace"));
    }
    if subject.split('.').any(str::is_empty) {
        return Err(format!(
            "the {what} {subject:?} has an empty token (a leading, trailing or doubled `.`)"
        ));
    }
    if !wildcards && subject.split('.').any(|t| t == "*" || t == ">") {
        return Err(format!(
            "the {what} {subject:?} is a wildcard: messages are published to it"
        ));
    }
    Ok(())
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
