//! A RabbitMQ consumer around an idempotent handler (feature `rabbitmq`,
//! through lapin).
//!
//! # Topology
//!
//! For a work queue `Q` the consumer declares (all durable), when it starts
//! and on its own with [`Consumer::declare`]:
//!
//! | queue | default name | setting | holds |
//! | --- | --- | --- | --- |
//! | the work queue | `Q` | [`Consumer::new`] | the messages; a classic durable queue, declared if it does not exist (an existing one, a quorum queue say, is used as it is) |
//! | retry queues | `Q.idem.retry.<ms>ms`, one per delay: 100 ms, 1 s, 5 s, 30 s, 5 min ([`RETRY_DELAYS`]) | [`Consumer::retry_queues_named`], [`Consumer::retry_delays`] | retries: each queue has its delay as TTL (`x-message-ttl`) and dead-letters expired messages back into `Q` through the default exchange |
//! | the dead letters | `Q.idem.dead` | [`Consumer::dead_letters`] | what no retry can cure |
//!
//! One TTL per queue means a message never waits behind a longer-lived one,
//! which per-message TTLs in one queue would cause. A retry goes to the
//! longest retry queue not longer than its wait (the shortest when the wait
//! is below them all), with its due time; when it comes back to `Q` before
//! that (by more than 20 ms), it is forwarded to the retry queue for what is
//! left, without a handler call, a retry or a failure counted
//! ([`Report::forwarded`]). So a wait of 1.2 s is 1 s + 100 ms + 100 ms, and a
//! wait longer than the longest delay is waited whole.
//!
//! **Declare before publishing.** A message published through the default
//! exchange to a queue that does not exist is dropped, silently (unless the
//! producer publishes `mandatory`). Run [`Consumer::declare`] (from a deploy
//! step, or the producer at its start) before the first message is
//! published, or declare `Q` yourself.
//!
//! A retry or dead letter is published (with publisher confirms) before the
//! original delivery is acknowledged; a crash in between leaves two copies,
//! which is what idem's keys are for.
//!
//! # Headers
//!
//! `x-idem-failures` (failed body runs so far), `x-idem-retries` (times handed
//! back), `x-idem-last-error`, `x-idem-due` (when the retry is due, in
//! milliseconds since the Unix epoch); dead letters add `x-idem-reason`,
//! `x-idem-queue`, `x-idem-dead-id` (a UUID: the id
//! [`consume::dead`](super::dead) lists and replays them by) and
//! `x-idem-dead-at` (ms since the Unix epoch). The failure count lives in
//! the message, so it survives
//! consumer restarts; a consumer killed while running a body is redelivered by
//! RabbitMQ without a count (quorum queues' `delivery-limit` bounds that case).
//! The due time is read against the consumer's clock: the consumers' clocks
//! should agree (NTP), or a retry waits, or runs early, by their difference.
//!
//! # Examples
//!
//! ```no_run,standalone_crate
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use idem_runtime::consume::{Policy, rabbitmq::Consumer, shutdown_on};
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
//! let report = Consumer::new("amqp://guest:guest@127.0.0.1:5672/%2f", "points")
//!     .policy(Policy { max_failures: 3, concurrency: 16, ..Policy::default() })
//!     .prefetch(32)
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

use super::front::Handler;
use super::front::driver;
use super::tiers;
use super::{CancellationToken, ConsumeError, Policy, Report};
use crate::client_tls::{self, ClientTls};

mod amqp;
mod transport;

pub mod dead;

/// The retry queues' default delays, one queue each.
pub use super::RETRY_DELAYS;

/// When a retry is due, in milliseconds since the Unix epoch.
const DUE: &str = "x-idem-due";

/// A consumer of one RabbitMQ queue; see the [module docs](self).
///
/// # Examples
///
/// ```
/// use idem_runtime::consume::rabbitmq::Consumer;
/// use std::time::Duration;
///
/// let c = Consumer::new("amqp://127.0.0.1:5672/%2f", "orders").prefetch(64);
/// assert_eq!(c.dead_letter_queue(), "orders.idem.dead");
/// assert_eq!(c.retry_queue(Duration::from_millis(10)), "orders.idem.retry.100ms");
/// assert_eq!(c.retry_queue(Duration::from_secs(2)), "orders.idem.retry.1000ms");
/// assert_eq!(c.retry_queues().len(), 5);
/// ```
#[derive(Debug, Clone)]
pub struct Consumer {
    url: String,
    tls: ClientTls,
    queue: String,
    policy: Policy,
    /// `None`: twice the policy's concurrency.
    prefetch: Option<u16>,
    /// `None`: `<queue>.idem.dead`.
    dead: Option<String>,
    /// `None`: `<queue>.idem.retry.{ms}ms`.
    retry_names: Option<String>,
    /// Sorted, whole milliseconds, each once; empty is refused at start.
    delays: Vec<Duration>,
}

impl Consumer {
    /// A consumer of `queue` on the broker at `url`
    /// (`amqp://user:pass@host:5672/vhost`), with the default [`Policy`], a
    /// prefetch of twice its concurrency, and the default topology (see the
    /// [module docs](self#topology)).
    ///
    /// # Examples
    ///
    /// ```
    /// let c = idem_runtime::consume::rabbitmq::Consumer::new("amqp://127.0.0.1:5672/%2f", "orders");
    /// assert_eq!(c.effective_prefetch(), 16);
    /// ```
    pub fn new(url: impl Into<String>, queue: impl Into<String>) -> Self {
        Consumer {
            url: url.into(),
            tls: ClientTls::default(),
            queue: queue.into(),
            policy: Policy::default(),
            prefetch: None,
            dead: None,
            retry_names: None,
            delays: tiers::normalize(RETRY_DELAYS),
        }
    }

    /// Connects over TLS (an `amqps://` URL, or the consumer is refused at
    /// `declare` and `run`), verified with `tls`: its CA instead of the
    /// public roots, its server name instead of the URL's host, its client
    /// certificate for a broker that asks for one (`ssl_options.verify =
    /// verify_peer`).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use idem_runtime::{consume::rabbitmq::Consumer, tls::Tls};
    ///
    /// let tls = Tls::new().ca_file("/etc/ssl/broker-ca.pem")?;
    /// let c = Consumer::new("amqps://app:secret@broker.internal:5671/%2f", "orders").tls(tls);
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
    /// use idem_runtime::consume::{Policy, rabbitmq::Consumer};
    /// let c = Consumer::new("amqp://127.0.0.1:5672/%2f", "orders")
    ///     .policy(Policy { max_failures: 10, ..Policy::default() });
    /// # let _ = c;
    /// ```
    pub fn policy(mut self, policy: Policy) -> Self {
        self.policy = policy;
        self
    }

    /// How many unacknowledged deliveries the broker may send ahead
    /// (`basic.qos`). Default: twice the policy's concurrency (16 with the
    /// default policy), so each slot has a delivery ready when it frees and
    /// the consumer hoards no more than that; set, it wins whatever the
    /// concurrency.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::consume::{Policy, rabbitmq::Consumer};
    /// let c = Consumer::new("amqp://127.0.0.1:5672/%2f", "orders")
    ///     .policy(Policy { concurrency: 4, ..Policy::default() });
    /// assert_eq!(c.effective_prefetch(), 8);
    /// assert_eq!(c.prefetch(64).effective_prefetch(), 64);
    /// ```
    pub fn prefetch(mut self, prefetch: u16) -> Self {
        self.prefetch = Some(prefetch.max(1));
        self
    }

    /// The prefetch the consumer asks for: the one set with
    /// [`prefetch`](Self::prefetch), or twice the policy's concurrency.
    ///
    /// # Examples
    ///
    /// See [`prefetch`](Self::prefetch).
    pub fn effective_prefetch(&self) -> u16 {
        self.prefetch
            .unwrap_or_else(|| u16::try_from(self.policy.prefetch()).unwrap_or(u16::MAX))
    }

    /// Names the dead-letter queue (default `<queue>.idem.dead`). It must
    /// be a queue name RabbitMQ accepts (1 to 255 bytes, not starting with
    /// `amq.`) and not one of the consumer's other queues; [`declare`] and
    /// [`run`] refuse it otherwise ([`ConsumeError::Setup`]).
    ///
    /// [`declare`]: Self::declare
    /// [`run`]: Self::run
    ///
    /// # Examples
    ///
    /// ```
    /// let c = idem_runtime::consume::rabbitmq::Consumer::new("amqp://127.0.0.1:5672/%2f", "orders")
    ///     .dead_letters("orders.parked");
    /// assert_eq!(c.dead_letter_queue(), "orders.parked");
    /// ```
    pub fn dead_letters(mut self, queue: impl Into<String>) -> Self {
        self.dead = Some(queue.into());
        self
    }

    /// Names the retry queues with a template in which `{ms}` is the
    /// queue's delay in milliseconds (default `<queue>.idem.retry.{ms}ms`).
    /// A template without `{ms}`, or whose names RabbitMQ would refuse, is
    /// refused by [`declare`] and [`run`] ([`ConsumeError::Setup`]).
    ///
    /// [`declare`]: Self::declare
    /// [`run`]: Self::run
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// let c = idem_runtime::consume::rabbitmq::Consumer::new("amqp://127.0.0.1:5672/%2f", "orders")
    ///     .retry_queues_named("orders.wait.{ms}");
    /// assert_eq!(c.retry_queue(Duration::from_secs(1)), "orders.wait.1000");
    /// ```
    pub fn retry_queues_named(mut self, template: impl Into<String>) -> Self {
        self.retry_names = Some(template.into());
        self
    }

    /// The retry queues' delays, one queue each (default [`RETRY_DELAYS`]):
    /// taken in whole milliseconds, sorted, each once. At least one is
    /// needed, of 1 ms or more: [`declare`] and [`run`] refuse an empty list
    /// ([`ConsumeError::Setup`]). Fewer tiers mean more hops for a wait
    /// between them (each hop a publish), not a less exact wait.
    ///
    /// [`declare`]: Self::declare
    /// [`run`]: Self::run
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// let c = idem_runtime::consume::rabbitmq::Consumer::new("amqp://127.0.0.1:5672/%2f", "orders")
    ///     .retry_delays(vec![Duration::from_secs(10), Duration::from_millis(500)]);
    /// assert_eq!(c.retry_queues(), ["orders.idem.retry.500ms", "orders.idem.retry.10000ms"]);
    /// assert_eq!(c.retry_queue(Duration::from_secs(3)), "orders.idem.retry.500ms");
    /// ```
    pub fn retry_delays(mut self, delays: impl IntoIterator<Item = Duration>) -> Self {
        self.delays = tiers::normalize(delays);
        self
    }

    /// The queue dead letters go to: `<queue>.idem.dead`, or the one named
    /// with [`dead_letters`](Self::dead_letters).
    ///
    /// # Examples
    ///
    /// ```
    /// let c = idem_runtime::consume::rabbitmq::Consumer::new("amqp://127.0.0.1:5672/%2f", "orders");
    /// assert_eq!(c.dead_letter_queue(), "orders.idem.dead");
    /// ```
    pub fn dead_letter_queue(&self) -> String {
        match &self.dead {
            Some(name) => name.clone(),
            None => format!("{}.idem.dead", self.queue),
        }
    }

    /// The retry queue a wait of `delay` goes to: the one of the longest
    /// delay not longer than `delay`, or of the shortest when `delay` is
    /// below them all. (Without delays, which `run` refuses, the name for
    /// `delay` itself.)
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// let c = idem_runtime::consume::rabbitmq::Consumer::new("amqp://127.0.0.1:5672/%2f", "orders");
    /// assert_eq!(c.retry_queue(Duration::from_millis(1_200)), "orders.idem.retry.1000ms");
    /// assert_eq!(c.retry_queue(Duration::from_secs(3_600)), "orders.idem.retry.300000ms");
    /// ```
    pub fn retry_queue(&self, delay: Duration) -> String {
        let tier = tiers::tier(&self.delays, delay).unwrap_or(delay);
        match &self.retry_names {
            Some(template) => tiers::expand(template, tier),
            None => format!("{}.idem.retry.{}ms", self.queue, tier.as_millis()),
        }
    }

    /// Every retry queue, shortest delay first.
    ///
    /// # Examples
    ///
    /// ```
    /// let c = idem_runtime::consume::rabbitmq::Consumer::new("amqp://127.0.0.1:5672/%2f", "orders");
    /// assert_eq!(c.retry_queues().first().map(String::as_str), Some("orders.idem.retry.100ms"));
    /// ```
    pub fn retry_queues(&self) -> Vec<String> {
        self.delays.iter().map(|d| self.retry_queue(*d)).collect()
    }

    /// Why the topology cannot be declared, if it cannot: names RabbitMQ
    /// would refuse or misuse, or no retry delays.
    fn check_topology(&self) -> Result<(), ConsumeError> {
        let refuse = |reason: String| ConsumeError::Setup(reason.into());
        tiers::check(&self.delays).map_err(refuse)?;
        if let Some(template) = &self.retry_names {
            tiers::check_template("retry queue", template).map_err(refuse)?;
        }
        check_queue("work queue", &self.queue).map_err(refuse)?;
        let dead = self.dead_letter_queue();
        check_queue("dead-letter queue", &dead).map_err(refuse)?;
        if dead == self.queue {
            return Err(refuse(format!(
                "the dead-letter queue {dead:?} is the work queue: dead letters would come back"
            )));
        }
        for retry in self.retry_queues() {
            check_queue("retry queue", &retry).map_err(refuse)?;
            if retry == self.queue || retry == dead {
                return Err(refuse(format!(
                    "the retry queue {retry:?} is the work queue or the dead-letter queue"
                )));
            }
        }
        Ok(())
    }

    /// Declares the topology (see the [module docs](self#topology)): the
    /// work queue if it does not exist, the retry queues and the dead-letter
    /// queue, without consuming; `run` declares it the same way. For a
    /// deploy step or a producer to run before the first message is
    /// published, since RabbitMQ drops a message published to a queue that
    /// does not exist. Connects once: an unreachable broker, or a topology
    /// it refuses (a queue that exists with other arguments), is a
    /// [`ConsumeError::Setup`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_runtime::consume::rabbitmq::Consumer;
    ///
    /// // in the deploy step, or at the producer's start
    /// Consumer::new("amqp://guest:guest@127.0.0.1:5672/%2f", "points")
    ///     .declare()
    ///     .await?;
    /// // ... now messages published to "points" wait there for the consumer
    /// # Ok(()) }
    /// ```
    pub async fn declare(&self) -> Result<(), ConsumeError> {
        self.check_topology()?;
        let setup = |e: lapin::Error| ConsumeError::Setup(Box::new(e));
        let conn = client_tls::amqp(&self.url, &self.tls)
            .await
            .map_err(ConsumeError::Setup)?;
        let declared = async {
            let channel = conn.create_channel().await?;
            self.declare_on(&conn, &channel).await?;
            channel.close(200, "declared".into()).await
        }
        .await;
        let _ = conn.close(200, "declared".into()).await;
        declared.map_err(setup)
    }

    /// Consumes until `shutdown` is cancelled, then stops taking deliveries,
    /// lets the ones in flight finish and settles them, and returns what it
    /// did.
    ///
    /// The broker is connected with a growing pause (100 ms to 5 s) until it
    /// answers, at start-up and after a lost connection; deliveries in
    /// flight when a connection is lost are redelivered by the broker.
    /// Returns [`ConsumeError::Stopped`] when a call reported the binary
    /// misconfigured ([`Error::Config`](crate::Error::Config)), and [`ConsumeError::Setup`] when the
    /// broker refused the topology.
    ///
    /// The handler takes the decoded message, or the message and what the
    /// broker said about it ([`Delivery`](super::Delivery): redelivered,
    /// headers, message id, routing key, timestamp); see [`Handler`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_runtime::consume::{Delivery, rabbitmq::Consumer, shutdown_on};
    /// use idem_runtime::{Error, Outcome};
    ///
    /// #[derive(serde::Deserialize)]
    /// struct Ping { id: String }
    ///
    /// Consumer::new("amqp://guest:guest@127.0.0.1:5672/%2f", "pings")
    ///     .run(
    ///         |ping: Ping, delivery: Delivery| async move {
    ///             if delivery.redelivered {
    ///                 tracing::info!(id = %ping.id, "delivered again");
    ///             }
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

/// Why RabbitMQ would refuse or misuse `name` as a queue's, if it would: an
/// empty name (the broker makes one up), more than 255 bytes, or the
/// reserved `amq.` prefix.
fn check_queue(what: &str, name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err(format!(
            "the {what} name is empty (RabbitMQ would make one up)"
        ));
    }
    if name.len() > 255 {
        return Err(format!(
            "the {what} name {name:?} is longer than RabbitMQ's 255 bytes"
        ));
    }
    if name.starts_with("amq.") {
        return Err(format!(
            "the {what} name {name:?} starts with `amq.`, which RabbitMQ reserves"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(c: &Consumer) -> String {
        match c.check_topology() {
            Err(ConsumeError::Setup(e)) => e.to_string(),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn the_default_topology_is_accepted() {
        let c = Consumer::new("amqp://127.0.0.1:5672/%2f", "orders");
        assert!(c.check_topology().is_ok());
        assert_eq!(c.retry_queues().len(), RETRY_DELAYS.len());
    }

    #[test]
    fn a_topology_rabbitmq_would_refuse_or_misuse_is_refused() {
        let c = || Consumer::new("amqp://127.0.0.1:5672/%2f", "orders");
        assert!(refusal(&c().retry_delays(Vec::new())).contains("at least one"));
        assert!(refusal(&c().retry_queues_named("orders.retry")).contains("{ms}"));
        assert!(refusal(&c().dead_letters("")).contains("empty"));
        assert!(refusal(&c().dead_letters("amq.dead")).contains("amq."));
        assert!(refusal(&c().dead_letters("orders")).contains("work queue"));
        assert!(refusal(&c().dead_letters("x".repeat(256))).contains("255"));
        assert!(refusal(&Consumer::new("amqp://127.0.0.1:5672/%2f", "")).contains("empty"));
    }
}
