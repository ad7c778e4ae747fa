//! A Kafka consumer around an idempotent handler (feature `kafka`, through
//! rdkafka, the Rust binding of librdkafka).
//!
//! Kafka has no per-message acknowledgement: progress is an offset per
//! partition. The consumer's contract:
//!
//! * a partition's messages are handled **in order**, one at a time by
//!   default; [`Consumer::lanes`] runs messages of different record keys
//!   side by side, each key's still in order;
//! * a partition is **committed only up to its first message not settled**
//!   (executed, a duplicate, handed to a retry topic, or dead-lettered), so
//!   a crash costs a redelivery, which the store's claim turns into a
//!   duplicate;
//! * a message that must wait goes to a retry topic and the partition goes
//!   on ([`Retries::Topics`], the default), or waits in its partition
//!   ([`Retries::InPlace`], strict order); what no retry can cure goes to
//!   the dead-letter topic, with headers saying why and where it came from.
//!   A retry or dead letter is acknowledged by the brokers before its
//!   message counts as settled;
//! * a partition taken away by a rebalance commits what is settled after
//!   its running bodies finish, for up to [`Consumer::revoke_grace`];
//! * with [`Consumer::offsets_in`], a transaction-mode handler's offset
//!   commits in its own transaction, with its effects.
//!
//! What a call's result means is the same as on the other brokers
//! ([`Verdict::of`](crate::consume::Verdict::of)). The topics and their
//! names, the headers, rebalances, offsets in the database and the settings
//! are in the guide's [kafka](crate::guide::kafka) chapter.
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
//!     .policy(Policy { max_failures: 3, ..Policy::default() })
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
use crate::client_tls::ClientTls;
use heard::Heard;
use settings::Settings;

pub mod dead;
mod group;
mod heard;
mod lane;
mod offsets;
mod progress;
mod settings;
mod state;
pub(crate) mod topics;

pub use offsets::Offsets;
pub use topics::RETRY_DELAYS;

/// The record header that carries a message's id (Kafka has no field of
/// its own for one): what [`Delivery::id`](crate::consume::Delivery::id)
/// reads, and what an outbox relay writes.
///
/// # Examples
///
/// ```
/// assert_eq!(idem_runtime::consume::kafka::MESSAGE_ID_HEADER, "x-idem-message-id");
/// ```
pub const MESSAGE_ID_HEADER: &str = topics::MESSAGE_ID;

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
    config: Settings,
    tls: ClientTls,
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
            config: Settings::default(),
            tls: ClientTls::default(),
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
    ///     .policy(Policy { max_failures: 10, ..Policy::default() });
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
        self.config.0.push((key.into(), value.into()));
        self
    }

    /// Connects over TLS (`security.protocol=ssl`), verified with `tls`:
    /// its CA, its client certificate for brokers that ask for one
    /// (`ssl.client.auth=required`), the brokers' host names checked: every
    /// client the consumer makes starts from
    /// [`Tls::kafka_settings`](crate::tls::Tls::kafka_settings), and the
    /// consumer's own settings ([`set`](Self::set)) come after them, so
    /// `.set("security.protocol", "sasl_ssl")` makes it SASL over TLS. A
    /// `Tls` with a server name is refused at `declare` and `run`
    /// (librdkafka checks the brokers' own names).
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::{consume::kafka::Consumer, tls::Tls};
    ///
    /// let c = Consumer::new("broker-1:9093", "stock", "orders").tls(Tls::new());
    /// # let _ = c;
    /// ```
    #[cfg(feature = "tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    pub fn tls(mut self, tls: crate::tls::Tls) -> Self {
        tls.warn_if_unverified("Kafka");
        self.tls = ClientTls::new(tls);
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

    /// The brokers and the TLS settings, under the consumer's own.
    fn client_config(&self) -> Result<ClientConfig, BoxError> {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", &self.brokers);
        self.tls.kafka(&mut config)?;
        Ok(config)
    }

    fn with_settings(&self, mut config: ClientConfig) -> ClientConfig {
        for (k, v) in &self.config.0 {
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
        // TLS settings no client can take are refused now, not retried
        self.client_config().map_err(ConsumeError::Setup)?;
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
                let mut c = self.client_config().map_err(ConsumeError::Setup)?;
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
            shutdown_grace: self.policy.grace,
            prefetch: self.prefetch,
            offsets: self.offsets.clone(),
        };
        let group = Arc::new(state::Group::new(settings, call, producer, meter, shutdown));
        let consumer: BaseConsumer<group::Ctx> = self
            .with_settings({
                let mut c = self.client_config().map_err(ConsumeError::Setup)?;
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
        let config = self.with_settings(self.client_config()?);
        let topic = self.topic.clone();
        // librdkafka's metadata call blocks: off the runtime's workers.
        let described = tokio::task::spawn_blocking(
            move || -> Result<Option<(Option<RDKafkaErrorCode>, usize)>, BoxError> {
                let client: BaseConsumer<Heard> = config.create_with_context(Heard::default())?;
                let metadata = client
                    .fetch_metadata(Some(&topic), Duration::from_secs(10))
                    .map_err(|e| Heard::explain(&client, e))?;
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
            self.with_settings(self.client_config()?).create()?;
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
