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
//!     .policy(Policy { max_attempts: 3, concurrency: 16, ..Policy::default() })
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

use std::fmt::Display;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicNackOptions,
    BasicPublishOptions, BasicQosOptions, ConfirmSelectOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use serde::de::DeserializeOwned;

use super::tiers::{self, DUE_SLACK};
use super::{
    Attempts, Broker, CancellationToken, ConsumeError, Delivery, Ended, Handled, Meter, Policy,
    Report, Settled, Verdict, drive, handle, sessions,
};
use crate::BoxError;
use crate::error::Error;
use crate::outcome::Outcome;

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
            queue: queue.into(),
            policy: Policy::default(),
            prefetch: None,
            dead: None,
            retry_names: None,
            delays: tiers::normalize(RETRY_DELAYS),
        }
    }

    /// Retries, attempts and concurrency.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::consume::{Policy, rabbitmq::Consumer};
    /// let c = Consumer::new("amqp://127.0.0.1:5672/%2f", "orders")
    ///     .policy(Policy { max_attempts: 10, ..Policy::default() });
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
        self.prefetch.unwrap_or_else(|| {
            let twice = self.policy.concurrency.max(1).saturating_mul(2);
            u16::try_from(twice).unwrap_or(u16::MAX)
        })
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
    fn check(&self) -> Result<(), ConsumeError> {
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
        self.check()?;
        let setup = |e: lapin::Error| ConsumeError::Setup(Box::new(e));
        let conn = Connection::connect(&self.url, ConnectionProperties::default())
            .await
            .map_err(setup)?;
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
    /// misconfigured ([`Error::Config`]), and [`ConsumeError::Setup`] when the
    /// broker refused the topology.
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

    /// As [`run`](Self::run), with the handler given what the broker said
    /// about each delivery as well ([`Delivery`]: redelivered, headers,
    /// message id, routing key, timestamp).
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
    ///     .run_with_delivery(
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
        let meter = Meter::new(Broker::RabbitMq, &self.queue);
        let url = self.url.clone();
        let connect = || Connection::connect(&url, ConnectionProperties::default());
        let session = |conn: Connection, shutdown: CancellationToken| {
            let (this, handler, report, meter) = (&self, &handler, &report, &meter);
            async move {
                let ended = match this.session(&conn, handler, report, meter, shutdown).await {
                    Ok(ended) => Ok(ended),
                    Err(e) if refused(&e) => Err(BoxError::from(Box::new(e))),
                    // Anything else in the set-up (a connection lost while
                    // declaring, a timeout) is worth another session.
                    Err(e) => Ok(Ended::Lost(Box::new(e))),
                };
                let _ = conn.close(200, "done".into()).await;
                ended
            }
        };
        sessions("RabbitMQ", shutdown, &report, &meter, connect, session).await
    }

    /// Declares the topology and consumes until shutdown, a stop or a lost
    /// connection. `Err` is a set-up the broker refused.
    async fn session<M, T, E, F, Fut>(
        &self,
        conn: &Connection,
        handler: &Arc<F>,
        report: &Arc<Mutex<Report>>,
        meter: &Meter,
        shutdown: CancellationToken,
    ) -> Result<Ended, lapin::Error>
    where
        M: DeserializeOwned + Send + 'static,
        T: Send + 'static,
        E: Display + Send + 'static,
        F: Fn(M, Delivery) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Outcome<T>, Error<E>>> + Send + 'static,
    {
        let channel = conn.create_channel().await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        channel
            .basic_qos(self.effective_prefetch(), BasicQosOptions::default())
            .await?;
        self.declare_on(conn, &channel).await?;
        let tag = format!("idem-{}", uuid::Uuid::new_v4().simple());
        let deliveries = channel
            .basic_consume(
                self.queue.as_str().into(),
                tag.as_str().into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        let settle = {
            let (consumer, handler, channel, meter) = (
                self.clone(),
                Arc::clone(handler),
                channel.clone(),
                meter.clone(),
            );
            move |delivery: lapin::message::Delivery| {
                let (consumer, handler, channel, meter) = (
                    consumer.clone(),
                    Arc::clone(&handler),
                    channel.clone(),
                    meter.clone(),
                );
                async move { consumer.settle(&channel, delivery, &*handler, &meter).await }
            }
        };
        // The queue's depth, for the lag gauge, every 5 s while the session
        // lasts (a channel of its own: a failed look-up closes it).
        let depth = {
            let (queue, meter, probe) = (
                self.queue.clone(),
                meter.clone(),
                conn.create_channel().await?,
            );
            tokio::spawn(async move {
                let passive = QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                };
                loop {
                    match probe
                        .queue_declare(queue.as_str().into(), passive, FieldTable::default())
                        .await
                    {
                        Ok(q) => meter.lag(u64::from(q.message_count())),
                        Err(_) => break,
                    }
                    tokio::time::sleep(Duration::from_secs(5)).await;
                }
                let _ = probe.close(200, "done".into()).await;
            })
        };
        let stop_taking = async {
            let _ = channel
                .basic_cancel(tag.as_str().into(), BasicCancelOptions::default())
                .await;
        };
        let ended = drive(
            deliveries,
            self.policy.concurrency,
            report,
            shutdown,
            settle,
            stop_taking,
        )
        .await;
        depth.abort();
        let _ = channel.close(200, "done".into()).await;
        Ok(ended)
    }

    /// Declares the topology on `channel` (for [`declare`](Self::declare)
    /// and every session of `run`).
    async fn declare_on(&self, conn: &Connection, channel: &Channel) -> Result<(), lapin::Error> {
        let durable = QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        };
        // A work queue that exists is used as it is (a quorum queue, one
        // with arguments of its own): only a missing one is declared. The
        // look-up runs on a channel of its own, which a missing queue closes.
        let probe = conn.create_channel().await?;
        let passive = QueueDeclareOptions {
            passive: true,
            ..QueueDeclareOptions::default()
        };
        let exists = probe
            .queue_declare(self.queue.as_str().into(), passive, FieldTable::default())
            .await
            .is_ok();
        let _ = probe.close(200, "looked".into()).await;
        if !exists {
            channel
                .queue_declare(self.queue.as_str().into(), durable, FieldTable::default())
                .await?;
        }
        for delay in &self.delays {
            let mut args = FieldTable::default();
            args.insert(
                "x-message-ttl".into(),
                AMQPValue::LongLongInt(i64::try_from(delay.as_millis()).unwrap_or(i64::MAX)),
            );
            args.insert(
                "x-dead-letter-exchange".into(),
                AMQPValue::LongString(LongString::from("")),
            );
            args.insert(
                "x-dead-letter-routing-key".into(),
                AMQPValue::LongString(LongString::from(self.queue.as_str())),
            );
            channel
                .queue_declare(self.retry_queue(*delay).as_str().into(), durable, args)
                .await?;
        }
        channel
            .queue_declare(
                self.dead_letter_queue().as_str().into(),
                durable,
                FieldTable::default(),
            )
            .await?;
        Ok(())
    }

    /// Runs one delivery through the handler and settles it with the broker.
    async fn settle<M, T, E, F, Fut>(
        &self,
        channel: &Channel,
        delivery: lapin::message::Delivery,
        handler: &F,
        meter: &Meter,
    ) -> Settled
    where
        M: DeserializeOwned,
        E: Display,
        F: Fn(M, Delivery) -> Fut,
        Fut: Future<Output = Result<Outcome<T>, Error<E>>>,
    {
        let headers = delivery.properties.headers().clone().unwrap_or_default();
        // A retry back before its due time waits on in the retry queue for
        // what is left, without a call; one due within the slack waits here.
        if let Some(due) = header_u64(&headers, DUE) {
            let left = tiers::left_until(due);
            if left > DUE_SLACK {
                return self.forward(channel, &delivery, headers, left, meter).await;
            }
            tokio::time::sleep(left).await;
        }
        let failures = header_u32(&headers, "x-idem-failures");
        let retries = header_u32(&headers, "x-idem-retries");
        let described = describe(&delivery, &headers, retries);
        let published_at = described.published_at;
        meter.delivered(&described);
        let _in_flight = meter.in_flight();
        let attempts = Attempts {
            failures,
            retries,
            ..Attempts::default()
        };
        let handled = handle(
            handler,
            &delivery.data,
            described,
            attempts,
            &self.policy,
            meter,
        )
        .await;
        let settled = self
            .settle_as(channel, &delivery, headers, &handled, attempts, meter)
            .await;
        meter.settled(&handled, &settled, published_at);
        settled
    }

    /// Tells the broker what became of `delivery`.
    async fn settle_as(
        &self,
        channel: &Channel,
        delivery: &lapin::message::Delivery,
        headers: FieldTable,
        handled: &Handled,
        attempts: Attempts,
        meter: &Meter,
    ) -> Settled {
        let Attempts {
            failures, retries, ..
        } = attempts;
        let duplicate = handled.duplicate;
        let settled = match handled.verdict.clone() {
            Verdict::Ack { alert } => {
                if let Some(alert) = &alert {
                    tracing::error!(queue = %self.queue, "acked, but look: {alert}");
                }
                ack(delivery).await.map(|()| Settled::Acked {
                    duplicate,
                    alert: alert.is_some(),
                })
            }
            Verdict::Retry {
                after,
                failed,
                reason,
            } => {
                let mut headers = headers;
                let failures = failures + u32::from(failed);
                set(&mut headers, "x-idem-failures", u64::from(failures));
                set(&mut headers, "x-idem-retries", u64::from(retries + 1));
                set_text(&mut headers, "x-idem-last-error", &reason);
                set(&mut headers, DUE, tiers::due_after(after));
                tracing::debug!(queue = %self.queue, ?after, %reason, "retrying later");
                let to = self.retry_queue(after);
                self.hand_over(channel, delivery, &to, headers)
                    .await
                    .map(|()| Settled::Retried)
            }
            Verdict::DeadLetter { reason, failed } => {
                let mut headers = headers;
                set_text(&mut headers, "x-idem-reason", &reason);
                set_text(&mut headers, "x-idem-queue", &self.queue);
                let failures = failures + u32::from(failed);
                set(&mut headers, "x-idem-failures", u64::from(failures));
                // An id and a time for `consume::dead`: a queue has neither.
                set_text(
                    &mut headers,
                    "x-idem-dead-id",
                    &uuid::Uuid::new_v4().to_string(),
                );
                set(
                    &mut headers,
                    "x-idem-dead-at",
                    super::dead::now_ms().unsigned_abs(),
                );
                tracing::warn!(queue = %self.queue, %reason, "dead-lettered");
                let to = self.dead_letter_queue();
                self.hand_over(channel, delivery, &to, headers)
                    .await
                    .map(|()| Settled::DeadLettered)
            }
            Verdict::Stop { reason } => {
                let requeue = BasicNackOptions {
                    requeue: true,
                    ..BasicNackOptions::default()
                };
                let _ = delivery.acker.nack(requeue).await;
                Ok(Settled::Stop(reason))
            }
        };
        match settled {
            Ok(settled) => settled,
            Err(e) => {
                // Handed back to the queue when the channel still works; when
                // it does not, the broker requeues it as the channel goes.
                meter.settle_failed(&e);
                let requeue = BasicNackOptions {
                    requeue: true,
                    ..BasicNackOptions::default()
                };
                let _ = delivery.acker.nack(requeue).await;
                Settled::Unsettled
            }
        }
    }

    /// Hands a retry that is not due yet to the retry queue for the `left`
    /// of its wait, its headers (counts, due time) as they are.
    async fn forward(
        &self,
        channel: &Channel,
        delivery: &lapin::message::Delivery,
        headers: FieldTable,
        left: Duration,
        meter: &Meter,
    ) -> Settled {
        let to = self.retry_queue(left);
        tracing::debug!(queue = %self.queue, ?left, %to, "not due yet: forwarded");
        match self.hand_over(channel, delivery, &to, headers).await {
            Ok(()) => Settled::Forwarded,
            Err(e) => {
                meter.settle_failed(&e);
                let requeue = BasicNackOptions {
                    requeue: true,
                    ..BasicNackOptions::default()
                };
                let _ = delivery.acker.nack(requeue).await;
                Settled::Unsettled
            }
        }
    }

    /// Publishes the delivery to queue `to` with `headers` (mandatory, so a
    /// missing queue is an error, not a silent drop), waits for the broker's
    /// confirm, then acknowledges the original.
    ///
    /// The copy keeps the message's identity (content type and encoding,
    /// message and correlation id, timestamp, type, app id, priority, reply
    /// to) but not what would misroute or drop it: `expiration`, and the
    /// `CC`/`BCC` headers.
    async fn hand_over(
        &self,
        channel: &Channel,
        delivery: &lapin::message::Delivery,
        to: &str,
        mut headers: FieldTable,
    ) -> Result<(), BoxError> {
        let original = &delivery.properties;
        let mut kept = FieldTable::default();
        for (name, value) in headers.inner() {
            if name.as_str() != "CC" && name.as_str() != "BCC" {
                kept.insert(name.clone(), value.clone());
            }
        }
        headers = kept;
        let properties = copy_properties(original, headers);
        let mandatory = BasicPublishOptions {
            mandatory: true,
            ..BasicPublishOptions::default()
        };
        let confirm = channel
            .basic_publish(
                ShortString::from(""),
                to.into(),
                mandatory,
                &delivery.data,
                properties,
            )
            .await?
            .await?;
        if !confirm.is_ack() || confirm.take_message().is_some() {
            return Err(format!("the broker did not take the message for {to}").into());
        }
        ack(delivery).await
    }
}

/// Whether the broker refused the set-up for good (access refused, no such
/// vhost or queue, a queue declared with other arguments, an exclusive one
/// in use): a new session would meet the same answer.
fn refused(e: &lapin::Error) -> bool {
    use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
    match e.kind() {
        lapin::ErrorKind::ProtocolError(amqp) => matches!(
            amqp.kind(),
            AMQPErrorKind::Soft(
                AMQPSoftError::ACCESSREFUSED
                    | AMQPSoftError::NOTFOUND
                    | AMQPSoftError::RESOURCELOCKED
                    | AMQPSoftError::PRECONDITIONFAILED
            )
        ),
        _ => false,
    }
}

/// The properties of a copy of a message (a retry, a dead letter, a
/// replayed dead letter): persistent, with `headers`, keeping the
/// message's identity (content type and encoding, message and correlation
/// id, timestamp, type, priority, reply to, app id) but not `expiration`,
/// which would drop the copy.
pub(crate) fn copy_properties(original: &BasicProperties, headers: FieldTable) -> BasicProperties {
    let mut properties = BasicProperties::default()
        .with_headers(headers)
        .with_delivery_mode(2);
    if let Some(v) = original.content_type() {
        properties = properties.with_content_type(v.clone());
    }
    if let Some(v) = original.content_encoding() {
        properties = properties.with_content_encoding(v.clone());
    }
    if let Some(v) = original.message_id() {
        properties = properties.with_message_id(v.clone());
    }
    if let Some(v) = original.correlation_id() {
        properties = properties.with_correlation_id(v.clone());
    }
    if let Some(v) = original.timestamp() {
        properties = properties.with_timestamp(*v);
    }
    if let Some(v) = original.kind() {
        properties = properties.with_type(v.clone());
    }
    if let Some(v) = original.priority() {
        properties = properties.with_priority(*v);
    }
    if let Some(v) = original.reply_to() {
        properties = properties.with_reply_to(v.clone());
    }
    if let Some(v) = original.app_id() {
        properties = properties.with_app_id(v.clone());
    }
    properties
}

/// What the broker said about `delivery`, for the handler.
fn describe(delivery: &lapin::message::Delivery, headers: &FieldTable, retries: u32) -> Delivery {
    let p = &delivery.properties;
    Delivery {
        broker: Some(Broker::RabbitMq),
        source: delivery.routing_key.to_string(),
        redelivered: delivery.redelivered,
        retries,
        deliveries: retries
            .saturating_add(1)
            .saturating_add(u32::from(delivery.redelivered)),
        id: p.message_id().as_ref().map(|id| id.to_string()),
        published_at: p
            .timestamp()
            .and_then(|secs| std::time::UNIX_EPOCH.checked_add(Duration::from_secs(secs))),
        headers: headers
            .inner()
            .iter()
            .map(|(name, value)| (name.to_string(), amqp_text(value)))
            .collect(),
        ..Delivery::default()
    }
}

/// A header's value as text: strings as they are, numbers in decimal,
/// anything else as its debug form.
fn amqp_text(value: &AMQPValue) -> Vec<u8> {
    match value {
        AMQPValue::LongString(v) => v.as_bytes().to_vec(),
        AMQPValue::ShortString(v) => v.as_str().as_bytes().to_vec(),
        AMQPValue::ByteArray(v) => v.as_slice().to_vec(),
        AMQPValue::Boolean(v) => v.to_string().into_bytes(),
        AMQPValue::ShortShortInt(v) => v.to_string().into_bytes(),
        AMQPValue::ShortShortUInt(v) => v.to_string().into_bytes(),
        AMQPValue::ShortInt(v) => v.to_string().into_bytes(),
        AMQPValue::ShortUInt(v) => v.to_string().into_bytes(),
        AMQPValue::LongInt(v) => v.to_string().into_bytes(),
        AMQPValue::LongUInt(v) => v.to_string().into_bytes(),
        AMQPValue::LongLongInt(v) => v.to_string().into_bytes(),
        AMQPValue::Timestamp(v) => v.to_string().into_bytes(),
        other => format!("{other:?}").into_bytes(),
    }
}

async fn ack(delivery: &lapin::message::Delivery) -> Result<(), BoxError> {
    delivery.ack(BasicAckOptions::default()).await?;
    Ok(())
}

fn header_u32(headers: &FieldTable, name: &str) -> u32 {
    let n = header_u64(headers, name).unwrap_or(0);
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// A whole-number header, negatives as 0; `None` when absent or not a
/// number.
fn header_u64(headers: &FieldTable, name: &str) -> Option<u64> {
    let value = headers.inner().get(&ShortString::from(name));
    let n: i128 = match value {
        Some(AMQPValue::LongLongInt(n)) => (*n).into(),
        Some(AMQPValue::LongInt(n)) => (*n).into(),
        Some(AMQPValue::LongUInt(n)) => (*n).into(),
        Some(AMQPValue::ShortInt(n)) => (*n).into(),
        Some(AMQPValue::ShortUInt(n)) => (*n).into(),
        Some(AMQPValue::ShortShortInt(n)) => (*n).into(),
        Some(AMQPValue::ShortShortUInt(n)) => (*n).into(),
        Some(AMQPValue::Timestamp(n)) => (*n).into(),
        _ => return None,
    };
    Some(u64::try_from(n.max(0)).unwrap_or(u64::MAX))
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

fn set(headers: &mut FieldTable, name: &str, value: u64) {
    headers.insert(
        name.into(),
        AMQPValue::LongLongInt(i64::try_from(value).unwrap_or(i64::MAX)),
    );
}

fn set_text(headers: &mut FieldTable, name: &str, value: &str) {
    // Header values are bounded; a long error message is cut.
    let value: String = value.chars().take(4_000).collect();
    headers.insert(name.into(), AMQPValue::LongString(LongString::from(value)));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(c: &Consumer) -> String {
        match c.check() {
            Err(ConsumeError::Setup(e)) => e.to_string(),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn the_default_topology_is_accepted() {
        let c = Consumer::new("amqp://127.0.0.1:5672/%2f", "orders");
        assert!(c.check().is_ok());
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
