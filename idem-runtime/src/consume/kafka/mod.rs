//! A Kafka consumer around an idempotent handler (feature `kafka`, through
//! rdkafka, the Rust binding of librdkafka).
//!
//! Kafka has no per-message acknowledgement: progress is an offset per
//! partition, and order holds within a partition. So the consumer
//!
//! * handles a partition's messages **in order**, one at a time, by
//!   default; [`Consumer::lanes`] allows messages of different record keys
//!   of one partition to run at once (a key's messages stay in order);
//! * **commits a partition only up to its first message not settled**:
//!   executed, a duplicate, handed to a retry topic or dead-lettered. A
//!   message running, waiting for its retry or queued holds the commit
//!   where it is; a crash then costs a redelivery, which the store's claim
//!   turns into a duplicate;
//! * **retries without blocking the partition** by default: a message that
//!   must wait (`InProgress`, a store error, a failed attempt) is published
//!   to a retry topic and so settled, and the messages behind it go on; it
//!   comes back to the handler from there once its delay has passed.
//!   [`Retries::InPlace`] waits in the partition instead, for strict order;
//! * dead-letters what no retry can change (a final error, attempts used
//!   up, a payload that does not decode, a key missing, one key with two
//!   payloads) to a dead-letter topic, with headers saying why and where
//!   the message came from.
//!
//! What a handler call's result means is the same as on the other brokers
//! ([`Verdict::of`](crate::consume::Verdict::of)); what differs is how a
//! retry waits.
//!
//! # Topology
//!
//! For a topic `T`, the consumer uses, and creates if missing, with `T`'s
//! partition count, when it starts and on its own with
//! [`Consumer::declare`] (Spring Kafka's names by default, so a Kafka team
//! reads them at once):
//!
//! | topic | default name | setting | holds |
//! | --- | --- | --- | --- |
//! | the topic | `T` | [`Consumer::new`] | the messages; it must exist |
//! | retry topics | `T-retry-100`, `T-retry-1000`, `T-retry-5000`, `T-retry-30000`, `T-retry-300000` ([`RETRY_DELAYS`]) | [`Consumer::retry_topics_named`], [`Consumer::retry_delays`] | retries, by the delay in milliseconds of their tier (with [`Retries::Topics`], the default) |
//! | the dead letters | `T-dlt` | [`Consumer::dead_letters`] | what no retry can cure |
//!
//! The group consumes `T` and its retry topics. A retry goes to the retry
//! topic of the longest delay not longer than its wait (the shortest when
//! the wait is below them all), with its due time (`x-idem-due`). A retry
//! topic's lanes hold each message at the head of its partition until its
//! due time, or until the topic's own delay has passed since it was
//! published there, whichever comes first: every message of the topic was
//! published with at least that delay ahead, so those behind it are not
//! kept past their own. A message whose due time is still ahead by more
//! than 20 ms then hops on to the retry topic for what is left, without a
//! handler call, a retry or a failure counted ([`Report::forwarded`]): a
//! wait of 1.2 s is 1 s + 100 ms + 100 ms, and a wait longer than the
//! longest delay is waited whole. `T` itself must exist (the consumer does
//! not choose its partition count): a missing one is a
//! [`ConsumeError::Setup`]. Names Kafka refuses (characters other than
//! ASCII letters, digits, `.`, `_` and `-`; more than 249) are refused
//! before the broker is asked.
//!
//! A retry or dead letter is published, and acknowledged by the broker
//! (`acks=all`), before its message counts as settled; a crash in between
//! leaves two copies, which is what idem's keys are for.
//!
//! # Headers
//!
//! | header | on | value |
//! | --- | --- | --- |
//! | `x-idem-failures` | retries, dead letters | failed body runs so far |
//! | `x-idem-retries` | retries, dead letters | times sent to a retry topic |
//! | `x-idem-last-error` | retries | why it was retried |
//! | `x-idem-due` | retries | when it is due, ms since the Unix epoch |
//! | `x-idem-topic`, `x-idem-partition`, `x-idem-offset` | retries, dead letters | where it was first consumed |
//! | `x-idem-reason` | dead letters | why it was dead-lettered |
//! | `kafka_dlt-original-topic`, `-partition`, `-offset`, `kafka_dlt-original-consumer-group`, `kafka_dlt-exception-message` | retries, dead letters | Spring Kafka's dead-letter headers, in Spring's encodings (the partition a big-endian `i32`, the offset a big-endian `i64`) |
//!
//! idem's own headers are decimal text, readable by any Kafka tool; the
//! Spring ones are there so a team's existing dead-letter tooling reads the
//! origin. The record key and payload are copied as they are; so are the
//! message's other headers.
//!
//! # Rebalances
//!
//! When the group takes partitions away, the consumer stops taking their
//! messages, gives up their waits (retry due times, in-place backoffs),
//! lets the bodies running finish for up to [`Consumer::revoke_grace`]
//! (10 s), commits what is settled, and only then lets them go. A body
//! that outlives the grace goes on, but its partition's commit stays before
//! it: the next owner gets the message again, and the store's claim keeps
//! the two runs from both taking effect (see the guide's `kafka` chapter
//! for what each mode does then). Partitions lost with the session (the
//! member was presumed dead) are dropped without a commit: they are another
//! member's already.
//!
//! # Offsets in the database
//!
//! With [`Consumer::offsets_in`], a transaction-mode handler on a SQL store
//! writes its message's offset in its own transaction, with the body's
//! writes and the dedup record, and the consumer reads those offsets back
//! when it is assigned a partition, in place of the broker's: the effect
//! and the position commit together, so even a consumer that dies between
//! its database commit and its broker commit does not see the message
//! again.
//!
//! # Connecting
//!
//! librdkafka reconnects by itself: while the brokers are away, messages
//! stop and commits fail (they are tried again); the consumer goes on.
//! [`Consumer::set`] passes any librdkafka setting (security, timeouts) to
//! both the consumer and the producer of retries and dead letters.
//!
//! # Examples
//!
//! ```no_run,standalone_crate
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use idem_runtime::consume::{Policy, kafka::Consumer, shutdown_on};
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
//! let report = Consumer::new("127.0.0.1:9092", "loyalty", "points")
//!     .policy(Policy { max_attempts: 3, ..Policy::default() })
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

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::producer::FutureProducer;

use super::front::Handler;
use super::front::handler::erase;
use super::{Broker, CancellationToken, ConsumeError, Meter, Policy, Report, until_ok};
use crate::BoxError;

pub mod dead;
mod group;
mod lane;
mod offsets;
mod progress;
mod state;
pub(crate) mod topics;

pub use offsets::Offsets;
pub use topics::RETRY_DELAYS;

/// How a message that must wait waits.
///
/// # Examples
///
/// ```
/// use idem_runtime::consume::kafka::{Consumer, Retries};
///
/// let strict = Consumer::new("127.0.0.1:9092", "billing", "invoices").retries(Retries::InPlace);
/// # let _ = strict;
/// assert_eq!(Retries::default(), Retries::Topics);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Retries {
    /// Published to a retry topic, and so settled; the messages behind it
    /// go on. The default: one message whose key is held elsewhere, or a
    /// body failing on one bad record, must not stall its whole partition,
    /// and idem's keys make the retry's later run safe. A retried message
    /// can come back after later messages of its partition.
    #[default]
    Topics,
    /// Waited for in the partition (the policy's backoff, or the
    /// `InProgress` delay), holding the messages behind it: strict order,
    /// at the price of a partition that waits as long as its first message.
    /// The attempts still end in the dead letters.
    InPlace,
}

/// A consumer of one Kafka topic in a consumer group; see the
/// [module docs](self).
///
/// # Examples
///
/// ```
/// use idem_runtime::consume::kafka::Consumer;
/// use std::time::Duration;
///
/// let c = Consumer::new("127.0.0.1:9092", "stock", "orders");
/// assert_eq!(c.dead_letter_topic(), "orders-dlt");
/// assert_eq!(c.retry_topic(Duration::from_millis(10)), "orders-retry-100");
/// assert_eq!(c.retry_topic(Duration::from_secs(2)), "orders-retry-1000");
/// assert_eq!(c.retry_topics().len(), 5);
/// ```
#[derive(Debug, Clone)]
pub struct Consumer {
    brokers: String,
    group: String,
    topic: String,
    policy: Policy,
    lanes: usize,
    retries: Retries,
    grace: Duration,
    prefetch: usize,
    config: Vec<(String, String)>,
    offsets: Option<Offsets>,
    names: topics::Names,
}

impl Consumer {
    /// A consumer of `topic` in consumer group `group`, on the brokers
    /// `brokers` (`host:port`, comma-separated), with the default
    /// [`Policy`], messages of a partition in order, retries through retry
    /// topics, and librdkafka's settings but these: no auto-commit (the
    /// consumer commits what is settled), `auto.offset.reset=earliest` (a
    /// new group starts at the beginning rather than skipping what is
    /// there), and `acks=all` for retries and dead letters.
    ///
    /// # Examples
    ///
    /// ```
    /// let c = idem_runtime::consume::kafka::Consumer::new("127.0.0.1:9092", "stock", "orders");
    /// # let _ = c;
    /// ```
    pub fn new(
        brokers: impl Into<String>,
        group: impl Into<String>,
        topic: impl Into<String>,
    ) -> Self {
        let topic: String = topic.into();
        Consumer {
            names: topics::Names::new(&topic),
            brokers: brokers.into(),
            group: group.into(),
            topic,
            policy: Policy::default(),
            lanes: 1,
            retries: Retries::Topics,
            grace: Duration::from_secs(10),
            prefetch: 1_000,
            config: Vec::new(),
            offsets: None,
        }
    }

    /// Retries, attempts and concurrency. The policy's `concurrency` bounds
    /// the bodies running at once over all partitions; within a partition,
    /// [`lanes`](Self::lanes) does.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::consume::{Policy, kafka::Consumer};
    /// let c = Consumer::new("127.0.0.1:9092", "stock", "orders")
    ///     .policy(Policy { max_attempts: 10, ..Policy::default() });
    /// # let _ = c;
    /// ```
    pub fn policy(mut self, policy: Policy) -> Self {
        self.policy = policy;
        self
    }

    /// Runs up to `lanes` messages of one partition at once, by record key:
    /// messages whose keys hash to one lane (all of one key, and messages
    /// without a key) stay in order. 1, the default, is strict partition
    /// order.
    ///
    /// # Examples
    ///
    /// ```
    /// let c = idem_runtime::consume::kafka::Consumer::new("127.0.0.1:9092", "sms", "notifications").lanes(8);
    /// # let _ = c;
    /// ```
    pub fn lanes(mut self, lanes: usize) -> Self {
        self.lanes = lanes.max(1);
        self
    }

    /// How a message that must wait waits: [`Retries::Topics`] (the
    /// default) or [`Retries::InPlace`].
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::consume::kafka::{Consumer, Retries};
    /// let c = Consumer::new("127.0.0.1:9092", "billing", "invoices").retries(Retries::InPlace);
    /// # let _ = c;
    /// ```
    pub fn retries(mut self, retries: Retries) -> Self {
        self.retries = retries;
        self
    }

    /// How long a revoke waits for the bodies running on the revoked
    /// partitions before it lets them go. Default 10 s; keep it well under
    /// the group's `max.poll.interval.ms` (5 minutes by default).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// let c = idem_runtime::consume::kafka::Consumer::new("127.0.0.1:9092", "stock", "orders")
    ///     .revoke_grace(Duration::from_secs(30));
    /// # let _ = c;
    /// ```
    pub fn revoke_grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// How many messages of one partition may wait in the consumer before
    /// it pauses fetching that partition (resumed at half): the prefetch,
    /// as RabbitMQ's and NATS's consumers call theirs. Default 1,000.
    ///
    /// # Examples
    ///
    /// ```
    /// let c = idem_runtime::consume::kafka::Consumer::new("127.0.0.1:9092", "stock", "orders").prefetch(200);
    /// # let _ = c;
    /// ```
    pub fn prefetch(mut self, messages: usize) -> Self {
        self.prefetch = messages.max(1);
        self
    }

    /// Sets a librdkafka setting on both the consumer and the producer of
    /// retries and dead letters: `security.protocol`, `sasl.*`,
    /// `session.timeout.ms`, `client.id`... Set last, it wins over the
    /// consumer's own.
    ///
    /// # Examples
    ///
    /// ```
    /// let c = idem_runtime::consume::kafka::Consumer::new("127.0.0.1:9092", "stock", "orders")
    ///     .set("session.timeout.ms", "10000")
    ///     .set("client.id", "stock-1");
    /// # let _ = c;
    /// ```
    pub fn set(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.config.push((key.into(), value.into()));
        self
    }

    /// Keeps the group's offsets in the database of a SQL store, written in
    /// each executed message's transaction and read back on assignment;
    /// see the [module docs](self#offsets-in-the-database). The handler
    /// must be a transaction-mode one on that database; the partitions
    /// must be handled in order (one lane), so that a message's offset is
    /// the partition's.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_runtime::SqliteStore;
    /// use idem_runtime::consume::kafka::Consumer;
    ///
    /// let store = SqliteStore::connect("sqlite::memory:").await?;
    /// let c = Consumer::new("127.0.0.1:9092", "stock", "orders").offsets_in(&store);
    /// # let _ = c;
    /// # Ok(()) }
    /// ```
    pub fn offsets_in(mut self, store: impl Into<Offsets>) -> Self {
        self.offsets = Some(store.into());
        self
    }

    /// Names the dead-letter topic (default `<topic>-dlt`). It must be a
    /// topic name Kafka accepts (ASCII letters, digits, `.`, `_` and `-`,
    /// at most 249) and not one of the consumer's other topics; [`declare`]
    /// and [`run`] refuse it otherwise ([`ConsumeError::Setup`]).
    ///
    /// [`declare`]: Self::declare
    /// [`run`]: Self::run
    ///
    /// # Examples
    ///
    /// ```
    /// let c = idem_runtime::consume::kafka::Consumer::new("127.0.0.1:9092", "stock", "orders")
    ///     .dead_letters("orders.parked");
    /// assert_eq!(c.dead_letter_topic(), "orders.parked");
    /// ```
    pub fn dead_letters(mut self, topic: impl Into<String>) -> Self {
        self.names.dead = Some(topic.into());
        self
    }

    /// Names the retry topics with a template in which `{ms}` is the
    /// topic's delay in milliseconds (default `<topic>-retry-{ms}`). A
    /// template without `{ms}`, or whose names Kafka would refuse, is
    /// refused by [`declare`] and [`run`] ([`ConsumeError::Setup`]).
    ///
    /// [`declare`]: Self::declare
    /// [`run`]: Self::run
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// let c = idem_runtime::consume::kafka::Consumer::new("127.0.0.1:9092", "stock", "orders")
    ///     .retry_topics_named("stock.orders.wait-{ms}");
    /// assert_eq!(c.retry_topic(Duration::from_secs(1)), "stock.orders.wait-1000");
    /// ```
    pub fn retry_topics_named(mut self, template: impl Into<String>) -> Self {
        self.names.retry_names = Some(template.into());
        self
    }

    /// The retry topics' delays, one topic each (default
    /// [`RETRY_DELAYS`]), for [`Retries::Topics`]: taken in whole
    /// milliseconds, sorted, each once. At least one is needed, of 1 ms or
    /// more: [`declare`] and [`run`] refuse an empty list
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
    /// let c = idem_runtime::consume::kafka::Consumer::new("127.0.0.1:9092", "stock", "orders")
    ///     .retry_delays(vec![Duration::from_secs(10), Duration::from_millis(500)]);
    /// assert_eq!(c.retry_topics(), ["orders-retry-500", "orders-retry-10000"]);
    /// assert_eq!(c.retry_topic(Duration::from_secs(3)), "orders-retry-500");
    /// ```
    pub fn retry_delays(mut self, delays: impl IntoIterator<Item = Duration>) -> Self {
        self.names.delays = super::tiers::normalize(delays);
        self
    }

    /// The dead-letter topic: `<topic>-dlt`, or the one named with
    /// [`dead_letters`](Self::dead_letters).
    ///
    /// # Examples
    ///
    /// See [`Consumer`].
    pub fn dead_letter_topic(&self) -> String {
        self.names.dead_letter_topic()
    }

    /// The retry topic a wait of `delay` goes to: the one of the longest
    /// delay not longer than `delay`, or of the shortest when `delay` is
    /// below them all (`<topic>-retry-<ms>` unless named otherwise).
    ///
    /// # Examples
    ///
    /// See [`Consumer`].
    pub fn retry_topic(&self, delay: Duration) -> String {
        self.names.retry_topic(delay)
    }

    /// Every retry topic, shortest delay first.
    ///
    /// # Examples
    ///
    /// See [`Consumer`].
    pub fn retry_topics(&self) -> Vec<String> {
        self.names.retry_topics()
    }

    /// Declares the topology (see the [module docs](self#topology)):
    /// checks that the topic exists and creates its retry topics (with
    /// [`Retries::Topics`]) and dead-letter topic where missing, with the
    /// topic's partition count, without joining the group; `run` declares
    /// it the same way. For a deploy step to run before the first retry
    /// or dead letter is published. Asks once: unreachable brokers (after
    /// librdkafka's 10 s), a missing topic, or a topic the brokers refuse
    /// to create, is a [`ConsumeError::Setup`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_runtime::consume::kafka::Consumer;
    ///
    /// // in the deploy step, once "orders" is created
    /// Consumer::new("127.0.0.1:9092", "stock", "orders").declare().await?;
    /// # Ok(()) }
    /// ```
    pub async fn declare(&self) -> Result<(), ConsumeError> {
        self.names
            .check()
            .map_err(|e| ConsumeError::Setup(e.into()))?;
        match self.topology().await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) | Err(e) => Err(ConsumeError::Setup(e)),
        }
    }

    fn client_config(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", &self.brokers);
        config
    }

    fn with_settings(&self, mut config: ClientConfig) -> ClientConfig {
        for (k, v) in &self.config {
            config.set(k, v);
        }
        config
    }

    /// Consumes until `shutdown` is cancelled, then stops taking messages, lets
    /// the bodies running finish (waits for a retry's due time or a backoff
    /// are given up: those messages are not settled and come back), commits
    /// what is settled, leaves the group and returns what it did.
    ///
    /// Waits for the brokers (a growing pause, 100 ms to 5 s) until they
    /// answer. Returns [`ConsumeError::Setup`] when the topic does not exist
    /// or the broker refuses the retry topics, and [`ConsumeError::Stopped`]
    /// when a call reported the binary misconfigured ([`Error::Config`](crate::Error::Config)).
    ///
    /// The handler takes the decoded message, or the message and what the
    /// broker said about it ([`Delivery`](super::Delivery): the topic,
    /// partition and offset it was first consumed at, its headers,
    /// timestamp and retries); see [`Handler`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_runtime::consume::{Delivery, kafka::Consumer, shutdown_on};
    /// use idem_runtime::{Error, Outcome};
    ///
    /// #[derive(serde::Deserialize)]
    /// struct Ping { id: String }
    ///
    /// Consumer::new("127.0.0.1:9092", "pings", "pingers")
    ///     .run(
    ///         |ping: Ping, delivery: Delivery| async move {
    ///             tracing::info!(id = %ping.id, partition = ?delivery.partition, offset = ?delivery.offset, "ping");
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
        self.names
            .check()
            .map_err(|e| ConsumeError::Setup(e.into()))?;
        if self.offsets.is_some() && self.lanes > 1 {
            return Err(ConsumeError::Setup(
                "offsets in the database need the partitions in order: lanes(1)".into(),
            ));
        }
        let setup = until_ok("Kafka", || self.topology(), &shutdown).await;
        let Some(setup) = setup else {
            return Ok(Report::default());
        };
        setup.map_err(ConsumeError::Setup)?;
        if let Some(offsets) = &self.offsets {
            let created = until_ok("the offsets' database", || offsets.create(), &shutdown).await;
            if created.is_none() {
                return Ok(Report::default());
            }
        }
        let producer: FutureProducer = self
            .with_settings({
                let mut c = self.client_config();
                c.set("acks", "all").set("message.timeout.ms", "30000");
                c
            })
            .create()
            .map_err(|e| ConsumeError::Setup(Box::new(e)))?;
        let meter = Meter::new(Broker::Kafka, &self.topic);
        let call = erase(handler, self.policy.clone(), meter.clone());
        let settings = state::Settings {
            names: self.names.clone(),
            group: self.group.clone(),
            retries: self.retries,
            lanes: self.lanes,
            concurrency: self.policy.concurrency,
            grace: self.grace,
            prefetch: self.prefetch,
            offsets: self.offsets.clone(),
        };
        let group = Arc::new(state::Group::new(settings, call, producer, meter, shutdown));
        let consumer: BaseConsumer<group::Ctx> = self
            .with_settings({
                let mut c = self.client_config();
                c.set("group.id", &self.group)
                    .set("enable.auto.commit", "false")
                    .set("enable.auto.offset.store", "false")
                    .set("auto.offset.reset", "earliest")
                    // the lag gauge (`Ctx::stats`)
                    .set("statistics.interval.ms", "5000");
                c
            })
            .create_with_context(group::Ctx {
                group: Arc::clone(&group),
            })
            .map_err(|e| ConsumeError::Setup(Box::new(e)))?;
        let mut subscribed = vec![self.topic.clone()];
        if self.retries == Retries::Topics {
            subscribed.extend(self.retry_topics());
        }
        let names: Vec<&str> = subscribed.iter().map(String::as_str).collect();
        consumer
            .subscribe(&names)
            .map_err(|e| ConsumeError::Setup(Box::new(e)))?;
        // Dropping `run`'s future (a timeout around it, a select) stops the
        // consumer too, as a shutdown does.
        let _stop_on_drop = StopOnDrop(Arc::clone(&group));
        let (done_tx, done_rx) = tokio::sync::oneshot::channel();
        let polled = Arc::clone(&group);
        std::thread::Builder::new()
            .name(format!("idem-kafka-{}", self.topic))
            .spawn(move || {
                group::poll(consumer, polled);
                let _ = done_tx.send(());
            })
            .map_err(|e| ConsumeError::Setup(Box::new(e)))?;
        let _ = done_rx.await;
        if let Some(reason) = lock_std(&group.halt).take() {
            return Err(ConsumeError::Stopped { reason });
        }
        Ok(super::lock(&group.report).clone())
    }

    /// Checks that the topic exists and creates its retry and dead-letter
    /// topics where missing (for [`declare`](Self::declare) and `run`).
    /// `Ok(Err)` is a refusal; `Err` is worth trying again (the broker is
    /// not up yet).
    async fn topology(&self) -> Result<Result<(), BoxError>, BoxError> {
        let config = self.with_settings(self.client_config());
        let topic = self.topic.clone();
        // librdkafka's metadata call blocks: off the runtime's workers.
        let described = tokio::task::spawn_blocking(
            move || -> Result<Option<(Option<RDKafkaErrorCode>, usize)>, BoxError> {
                let admin: AdminClient<DefaultClientContext> = config.create()?;
                let metadata = admin
                    .inner()
                    .fetch_metadata(Some(&topic), Duration::from_secs(10))?;
                Ok(metadata
                    .topics()
                    .iter()
                    .find(|t| t.name() == topic)
                    .map(|t| (t.error().map(RDKafkaErrorCode::from), t.partitions().len())))
            },
        )
        .await??;
        let Some((error, partitions)) = described else {
            return Ok(Err(format!(
                "the broker did not describe topic {}",
                self.topic
            )
            .into()));
        };
        if let Some(code) = error {
            if code == RDKafkaErrorCode::UnknownTopicOrPartition {
                return Ok(Err(format!(
                    "topic {} does not exist; create it with the partitions it needs",
                    self.topic
                )
                .into()));
            }
            return Err(format!("topic {}: {code}", self.topic).into());
        }
        let admin: AdminClient<DefaultClientContext> =
            self.with_settings(self.client_config()).create()?;
        let partitions = i32::try_from(partitions).unwrap_or(i32::MAX).max(1);
        let mut wanted = vec![self.dead_letter_topic()];
        if self.retries == Retries::Topics {
            wanted.extend(self.retry_topics());
        }
        let new: Vec<NewTopic<'_>> = wanted
            .iter()
            .map(|name| NewTopic::new(name, partitions, TopicReplication::Fixed(-1)))
            .collect();
        let results = admin.create_topics(&new, &AdminOptions::new()).await?;
        for result in results {
            if let Err((name, code)) = result
                && code != RDKafkaErrorCode::TopicAlreadyExists
            {
                return Ok(Err(format!("could not create topic {name}: {code}").into()));
            }
        }
        Ok(Ok(()))
    }
}

/// Stops the poll thread when `run`'s future goes.
struct StopOnDrop(Arc<state::Group>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.abandon();
    }
}

fn lock_std<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
