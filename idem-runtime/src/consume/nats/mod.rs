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
//! body fails on its `max_failures`-th delivery or later is dead-lettered;
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
use std::time::Duration;

use async_nats::jetstream;

use super::front::Handler;
use super::front::driver;
use super::front::transport::Opening;
use super::{CancellationToken, ConsumeError, Policy, Report};
use crate::client_tls::{self, ClientTls};

pub mod dead;
mod transport;

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
    tls: ClientTls,
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
            tls: ClientTls::default(),
            stream,
            subject,
            policy: Policy::default(),
            prefetch: None,
            ack_wait: Duration::from_secs(30),
            dead: None,
        }
    }

    /// Connects with TLS required, verified with `tls`: its CA instead of
    /// the system's roots, its client certificate for a server whose `tls`
    /// block says `verify: true`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use idem_runtime::{consume::nats::Consumer, tls::Tls};
    ///
    /// let tls = Tls::new().ca_file("/etc/ssl/nats-ca.pem")?;
    /// let c = Consumer::new("tls://nats.internal:4222", "ORDERS", "orders.>").tls(tls);
    /// # let _ = c;
    /// # Ok::<(), idem_runtime::tls::TlsError>(())
    /// ```
    #[cfg(feature = "tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    pub fn tls(mut self, tls: crate::tls::Tls) -> Self {
        self.tls = ClientTls::new(tls);
        self
    }

    /// Retries, attempts and concurrency.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::consume::{Policy, nats::Consumer};
    /// let c = Consumer::new("nats://127.0.0.1:4222", "ORDERS", "orders.placed")
    ///     .policy(Policy { max_failures: 10, ..Policy::default() });
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
        self.prefetch.unwrap_or_else(|| self.policy.prefetch())
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
    fn check_topology(&self) -> Result<(), ConsumeError> {
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
        self.check_topology()?;
        let client = client_tls::nats(&self.url, &self.tls)
            .await
            .map_err(ConsumeError::Setup)?;
        let declared = self.declare_on(&jetstream::new(client.clone())).await;
        let _ = client.flush().await;
        match declared {
            Ok(_) => Ok(()),
            Err(Opening::Refused(e) | Opening::Lost(e)) => Err(ConsumeError::Setup(e)),
        }
    }

    /// Consumes until `shutdown` is cancelled, then stops pulling, lets the
    /// messages in flight finish and settles them, and returns what it did.
    ///
    /// The server is connected with a growing pause (100 ms to 5 s) until it
    /// answers, at start-up and after the message stream fails; messages in
    /// flight then are redelivered after their ack wait. Returns
    /// [`ConsumeError::Stopped`] when a call reported the binary
    /// misconfigured ([`Error::Config`](crate::Error::Config)), and [`ConsumeError::Setup`] when the
    /// server refused the streams or the consumer.
    ///
    /// The handler takes the decoded message, or the message and what the
    /// server said about it ([`Delivery`](super::Delivery): its delivery
    /// count, headers, `Nats-Msg-Id`, subject, stream sequence and
    /// timestamp); see [`Handler`].
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
    ///     .run(
    ///         |ping: Ping, delivery: Delivery| async move {
    ///             tracing::info!(id = %ping.id, subject = %delivery.source, n = delivery.deliveries, "ping");
    ///             Ok::<_, Error<String>>(Outcome::Executed(()))
    ///         },
    ///         shutdown_on(async { tokio::signal::ctrl_c().await.ok(); }),
    ///     )
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub async fn run<A>(
        self,
        handler: impl Handler<A>,
        shutdown: CancellationToken,
    ) -> Result<Report, ConsumeError> {
        driver::run(self, handler, shutdown).await
    }
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
