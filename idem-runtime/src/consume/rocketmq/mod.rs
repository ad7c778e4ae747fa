//! A RocketMQ consumer around an idempotent handler (feature `rocketmq`,
//! through rocketmq-client-rust's push consumer, in clustering mode).
//!
//! # Topology
//!
//! For a topic `T` and a consumer group `G`:
//!
//! | what | default name | setting | holds |
//! | --- | --- | --- | --- |
//! | the topic | `T` | [`Consumer::new`] | the messages |
//! | the consumer group | `idem-<T>` | [`Consumer::group`] | the members that share the topic's queues, and their offsets |
//! | the retry topic | `G-retry` | [`Consumer::retry_topic_named`] | idem's retries, each due after a delay level |
//! | the broker's retry topic | `%RETRY%G` | (the broker's) | what the client hands back (`RECONSUME_LATER`) |
//! | the dead-letter topic | `%DLQ%G` | [`Consumer::dead_letters`] | what no retry can cure, with idem's reason |
//!
//! The consumer makes the topic and the retry topic when they are missing
//! (with 4 queues, on the brokers that hold `TBW102`, as a producer's
//! first send would); make them beforehand with `mqadmin updateTopic` to
//! choose their queues. The broker's retry topic is its own. Names may hold letters, digits, `-`, `_`, `|` and
//! `%` (the broker's rule), up to 127 characters: others are refused before
//! anything connects ([`ConsumeError::Setup`]).
//!
//! # Delivery
//!
//! Members of one group share the topic's queues; each queue's messages go
//! to one member, which commits its offset past what it settled. A message
//! is settled as its [`Verdict`](super::Verdict) says:
//!
//! - **ack**: the listener answers `CONSUME_SUCCESS`, and the offset moves
//!   past it;
//! - **retry**: a copy is sent to the retry topic `G-retry`, which the
//!   consumer takes from beside the topic, at the longest delay level not
//!   longer than the wait (the shortest when the wait is below them all),
//!   with its counts (`x-idem-failures`, `x-idem-retries`), the last error
//!   (`x-idem-last-error`), its topic (`x-idem-topic`), its original's
//!   publication time (`x-idem-published`) and its due time (`x-idem-due`); the broker stores the copy before the original is
//!   acked. A copy that comes back before it is due is sent on for what is
//!   left without a call, or, when what is left is shorter than the
//!   shortest level, waits it out in the consumer; so a wait longer than
//!   the shortest level is the one asked for, not rounded to a level (a
//!   shorter one waits the shortest level). The levels are the broker's
//!   `messageDelayLevel`: tell the consumer yours with
//!   [`Consumer::delay_levels`] (the default is Apache RocketMQ's, 1 s to
//!   2 h). The retry topic is idem's own, not the group's `%RETRY%` topic,
//!   so that a copy carries its counts (the broker's send-back rebuilds a
//!   message from its stored original, and a producer's send to a
//!   `%RETRY%` topic goes straight to `%DLQ%` on rocketmq-rust 1.0.0: see
//!   the guide's RocketMQ chapter);
//! - **dead letter**: a copy is sent to `%DLQ%G` with `x-idem-reason`,
//!   `x-idem-topic`, `x-idem-failures`, `x-idem-dead-id` and
//!   `x-idem-dead-at`, then the original is acked.
//!
//! A copy keeps the body, the `KEYS`, the `TAGS` and every user property.
//! The broker's own `%DLQ%` transfer (after `maxReconsumeTimes`) never
//! comes first: idem counts attempts itself and moves a message before.
//!
//! The handler's [`Delivery`](super::Delivery) has the message's `KEYS` as
//! its `id` (the business key RocketMQ producers are told to set, and the
//! one the broker indexes; the client's message id when there are none),
//! the topic as `source`, the queue offset as `offset`, the queue id as
//! `partition`, the born time as `published_at`, and every property
//! (`KEYS`, `TAGS`, `UNIQ_KEY`, the user's) as a header. A handler that
//! keys on the `KEYS` rather than on the body reads them there; see the
//! guide's RocketMQ chapter.
//!
//! # What idem sets on the client
//!
//! - **Concurrency.** The push consumer calls its listener on a blocking
//!   lane of the client's runtime, one call per message (batch size 1).
//!   idem sizes that lane and the consumer's threads to the policy's
//!   `concurrency`: with the client's defaults (20 threads, a lane of twice
//!   the cores, eight times the cores queued), no more than twice the cores
//!   run at once, and a call that waits beyond the lane's queue or its
//!   timeout fails before the listener runs: it counts as a failed
//!   consumption, is sent back through `%RETRY%` (or, when that fails, by a
//!   producer's send, which this broker moves to `%DLQ%`), the body never
//!   run.
//! - **Stopping.** A stop lets the bodies in flight reach their outcome,
//!   then shuts the consumer down waiting for the client to commit their
//!   offsets (the client's default waits for nothing, so what ran was
//!   delivered again). A call the client makes after the stop began waits,
//!   without running the body, until the consumer is shut down: the offset
//!   committed stays before its message, which is delivered again to the
//!   queue's next owner.
//! - **Rebalancing.** A member that joins or leaves is seen by the others
//!   at the client's next rebalance, every 20 s: a member that dies leaves
//!   its queues unread until then (and redelivers what it had not
//!   committed). Its offsets are committed every 5 s, so a member killed
//!   between two commits has its last settled messages delivered again;
//!   idem's keys make those duplicates.
//!
//! # Attempts
//!
//! Failures and retries are counted in the copies idem sends
//! (`x-idem-failures`, `x-idem-retries`), as on RabbitMQ and Kafka; a
//! message handed back to the client (at a stop) keeps its counts.
//!
//! # Examples
//!
//! ```no_run,standalone_crate
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use idem_runtime::consume::{rocketmq::Consumer, shutdown_on};
//! use idem_runtime::{idempotent, MemoryStore};
//!
//! #[derive(serde::Deserialize)]
//! struct SmsRequested { request_id: String, phone: String }
//!
//! #[idempotent(key = "request_id", ttl = "24h", store = "memory")]
//! async fn send_sms(msg: &SmsRequested) -> Result<(), std::io::Error> {
//!     println!("SMS to {}", msg.phone);
//!     Ok(())
//! }
//!
//! let store = MemoryStore::new();
//! let report = Consumer::new("127.0.0.1:9876", "sms-requested")
//!     .run(
//!         move |msg: SmsRequested| {
//!             let store = store.clone();
//!             async move { send_sms(&store, &msg).await }
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
use super::{CancellationToken, ConsumeError, Policy, Report};

pub(crate) mod client;
pub mod dead;
mod listener;
mod reader;
mod transport;

/// The property a retry's due time travels in (milliseconds since the Unix
/// epoch).
const DUE: &str = "x-idem-due";

/// The property of a retry or a dead letter that names the topic it came
/// from.
const TOPIC: &str = "x-idem-topic";

/// The property of a retry that keeps when its original was published (ms
/// since the Unix epoch).
const PUBLISHED: &str = "x-idem-published";

/// The property that names a dead letter: a UUID the consumer writes.
pub(crate) const DEAD_ID: &str = "x-idem-dead-id";

/// Apache RocketMQ's default `messageDelayLevel`: level 1 is 1 s, level 18
/// is 2 h.
///
/// # Examples
///
/// ```
/// use idem_runtime::consume::rocketmq::DELAY_LEVELS;
/// use std::time::Duration;
///
/// assert_eq!(DELAY_LEVELS.len(), 18);
/// assert_eq!(DELAY_LEVELS[2], Duration::from_secs(10));
/// ```
pub const DELAY_LEVELS: [Duration; 18] = [
    Duration::from_secs(1),
    Duration::from_secs(5),
    Duration::from_secs(10),
    Duration::from_secs(30),
    Duration::from_secs(60),
    Duration::from_secs(120),
    Duration::from_secs(180),
    Duration::from_secs(240),
    Duration::from_secs(300),
    Duration::from_secs(360),
    Duration::from_secs(420),
    Duration::from_secs(480),
    Duration::from_secs(540),
    Duration::from_secs(600),
    Duration::from_secs(1200),
    Duration::from_secs(1800),
    Duration::from_secs(3600),
    Duration::from_secs(7200),
];

/// A consumer of one RocketMQ topic in a consumer group; see the
/// [module docs](self).
///
/// # Examples
///
/// ```
/// use idem_runtime::consume::rocketmq::Consumer;
///
/// let c = Consumer::new("127.0.0.1:9876", "orders");
/// assert_eq!(c.group_name(), "idem-orders");
/// assert_eq!(c.retry_topic(), "idem-orders-retry");
/// assert_eq!(c.dead_letter_topic(), "%DLQ%idem-orders");
/// ```
#[derive(Debug, Clone)]
pub struct Consumer {
    name_server: String,
    topic: String,
    group: String,
    tags: String,
    policy: Policy,
    /// The broker's delay levels, in its order (level 1 first).
    levels: Vec<Duration>,
    /// `None`: `<group>-retry`.
    retry: Option<String>,
    /// `None`: `%DLQ%<group>`.
    dead: Option<String>,
}

impl Consumer {
    /// A consumer of `topic` through the name servers `name_server`
    /// (`host:port`, several joined by `;`), in the group `idem-<topic>`,
    /// taking every tag, with the default [`Policy`] and Apache RocketMQ's
    /// [`DELAY_LEVELS`].
    ///
    /// # Examples
    ///
    /// ```
    /// let c = idem_runtime::consume::rocketmq::Consumer::new("10.0.0.5:9876;10.0.0.6:9876", "orders");
    /// assert_eq!(c.topic(), "orders");
    /// ```
    pub fn new(name_server: impl Into<String>, topic: impl Into<String>) -> Self {
        let topic: String = topic.into();
        Consumer {
            name_server: name_server.into(),
            group: format!("idem-{topic}"),
            topic,
            tags: "*".to_owned(),
            policy: Policy::default(),
            levels: DELAY_LEVELS.to_vec(),
            retry: None,
            dead: None,
        }
    }

    /// The consumer group: members of one group share the topic's queues
    /// (and its retry and dead-letter topics); two groups each get every
    /// message.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::consume::rocketmq::Consumer;
    /// let c = Consumer::new("127.0.0.1:9876", "orders").group("stock");
    /// assert_eq!(c.retry_topic(), "stock-retry");
    /// ```
    pub fn group(mut self, group: impl Into<String>) -> Self {
        self.group = group.into();
        self
    }

    /// The tags taken: a RocketMQ tag expression (`"*"`, the default, or
    /// `"paid || refunded"`).
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::consume::rocketmq::Consumer;
    /// let c = Consumer::new("127.0.0.1:9876", "orders").tags("paid || refunded");
    /// # let _ = c;
    /// ```
    pub fn tags(mut self, expression: impl Into<String>) -> Self {
        self.tags = expression.into();
        self
    }

    /// Retries, attempts and concurrency (the listener calls the client runs
    /// at once).
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::consume::{Policy, rocketmq::Consumer};
    /// let c = Consumer::new("127.0.0.1:9876", "orders")
    ///     .policy(Policy { concurrency: 16, ..Policy::default() });
    /// # let _ = c;
    /// ```
    pub fn policy(mut self, policy: Policy) -> Self {
        self.policy = policy;
        self
    }

    /// The broker's delay levels, level 1 first: its `messageDelayLevel`
    /// setting. A retry goes to the longest level not longer than its wait.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::consume::rocketmq::Consumer;
    /// use std::time::Duration;
    ///
    /// // messageDelayLevel = "1s 5s 30s 2m" (whole s, m, h or d each)
    /// let c = Consumer::new("127.0.0.1:9876", "orders").delay_levels([
    ///     Duration::from_secs(1),
    ///     Duration::from_secs(5),
    ///     Duration::from_secs(30),
    ///     Duration::from_secs(120),
    /// ]);
    /// assert_eq!(c.delay_level(Duration::from_secs(7)), 2);
    /// ```
    pub fn delay_levels(mut self, levels: impl IntoIterator<Item = Duration>) -> Self {
        self.levels = levels.into_iter().collect();
        self
    }

    /// Sends dead letters to `topic` rather than `%DLQ%<group>`.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::consume::rocketmq::Consumer;
    /// let c = Consumer::new("127.0.0.1:9876", "orders").dead_letters("orders-dead");
    /// assert_eq!(c.dead_letter_topic(), "orders-dead");
    /// ```
    pub fn dead_letters(mut self, topic: impl Into<String>) -> Self {
        self.dead = Some(topic.into());
        self
    }

    /// The topic.
    ///
    /// # Examples
    ///
    /// ```
    /// let c = idem_runtime::consume::rocketmq::Consumer::new("127.0.0.1:9876", "orders");
    /// assert_eq!(c.topic(), "orders");
    /// ```
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// The consumer group.
    ///
    /// # Examples
    ///
    /// See [`Consumer`].
    pub fn group_name(&self) -> &str {
        &self.group
    }

    /// The retry topic: `<group>-retry` unless
    /// [`retry_topic_named`](Self::retry_topic_named) named another.
    ///
    /// # Examples
    ///
    /// See [`Consumer`].
    pub fn retry_topic(&self) -> String {
        self.retry
            .clone()
            .unwrap_or_else(|| format!("{}-retry", self.group))
    }

    /// Sends retries to `topic` rather than `<group>-retry`. Each consumer
    /// group needs its own: the consumer takes every message of it.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::consume::rocketmq::Consumer;
    /// let c = Consumer::new("127.0.0.1:9876", "orders").retry_topic_named("orders-stock-retry");
    /// assert_eq!(c.retry_topic(), "orders-stock-retry");
    /// ```
    pub fn retry_topic_named(mut self, topic: impl Into<String>) -> Self {
        self.retry = Some(topic.into());
        self
    }

    /// Where dead letters go: `%DLQ%<group>` unless
    /// [`dead_letters`](Self::dead_letters) named another topic.
    ///
    /// # Examples
    ///
    /// See [`Consumer`].
    pub fn dead_letter_topic(&self) -> String {
        self.dead
            .clone()
            .unwrap_or_else(|| default_dead_letter_topic(&self.group))
    }

    /// The delay level (1 for the first) a retry that waits `wait` is sent
    /// at: the longest level not longer than `wait`, or the first.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::consume::rocketmq::Consumer;
    /// use std::time::Duration;
    ///
    /// let c = Consumer::new("127.0.0.1:9876", "orders");
    /// assert_eq!(c.delay_level(Duration::from_millis(300)), 1); // 1 s
    /// assert_eq!(c.delay_level(Duration::from_secs(45)), 4); // 30 s, then 15 s more
    /// assert_eq!(c.delay_level(Duration::from_secs(86_400)), 18); // 2 h, then again
    /// ```
    pub fn delay_level(&self, wait: Duration) -> i32 {
        let below = self.levels.iter().rposition(|l| *l <= wait);
        let at = below.unwrap_or_else(|| {
            // Below every level: the shortest.
            self.levels
                .iter()
                .enumerate()
                .min_by_key(|(_, l)| **l)
                .map_or(0, |(i, _)| i)
        });
        i32::try_from(at + 1).unwrap_or(i32::MAX)
    }

    /// Refuses a topology the broker would refuse or misuse.
    fn check_topology(&self) -> Result<(), ConsumeError> {
        let refuse = |e: String| ConsumeError::Setup(e.into());
        check_name("topic", &self.topic).map_err(refuse)?;
        check_name("consumer group", &self.group).map_err(refuse)?;
        check_name("retry topic", &self.retry_topic()).map_err(refuse)?;
        check_name("dead-letter topic", &self.dead_letter_topic()).map_err(refuse)?;
        for (what, topic) in [("topic", &self.topic), ("retry topic", &self.retry_topic())] {
            if topic.starts_with('%') {
                return Err(refuse(format!(
                    "the {what} {topic:?} starts with `%`, which RocketMQ keeps for its retry and dead-letter topics"
                )));
            }
        }
        let dead = self.dead_letter_topic();
        if dead == self.topic || dead == self.retry_topic() || self.topic == self.retry_topic() {
            return Err(refuse(format!(
                "the topic {:?}, the retry topic {:?} and the dead-letter topic {dead:?} must differ: what one holds would be consumed as another's",
                self.topic,
                self.retry_topic()
            )));
        }
        if self.levels.is_empty()
            || self.levels.iter().any(Duration::is_zero)
            || self.levels.windows(2).any(|w| w[0] >= w[1])
        {
            return Err(refuse(format!(
                "the delay levels {:?} are not a messageDelayLevel: at least one, none of them zero, each longer than the one before",
                self.levels
            )));
        }
        if !(1..=1_000).contains(&self.policy.concurrency) {
            return Err(refuse(format!(
                "a concurrency of {}: the RocketMQ client runs 1 to 1,000 consumer threads",
                self.policy.concurrency
            )));
        }
        if self.tags.trim().is_empty() {
            return Err(refuse(
                "an empty tag expression: `*` takes every tag".to_owned(),
            ));
        }
        Ok(())
    }

    /// Consumes until `shutdown` is cancelled, then lets the bodies in
    /// flight finish (for up to the policy's `grace`) and commits their
    /// offsets.
    ///
    /// # Errors
    ///
    /// [`ConsumeError::Setup`] for names the broker would refuse,
    /// [`ConsumeError::Stopped`] when a call reports the build misconfigured.
    /// A broker that cannot be reached is retried with growing pauses.
    ///
    /// # Examples
    ///
    /// See the [module docs](self).
    pub async fn run<A>(
        self,
        handler: impl Handler<A>,
        shutdown: CancellationToken,
    ) -> Result<Report, ConsumeError> {
        driver::run(self, handler, shutdown).await
    }
}

/// The dead-letter topic of consumer group `group`: `%DLQ%<group>`, the
/// broker's own.
///
/// # Examples
///
/// ```
/// use idem_runtime::consume::rocketmq::default_dead_letter_topic;
/// assert_eq!(default_dead_letter_topic("stock"), "%DLQ%stock");
/// ```
pub fn default_dead_letter_topic(group: &str) -> String {
    format!("%DLQ%{group}")
}

/// Why RocketMQ would refuse `name` as a topic's or group's, if it would.
fn check_name(what: &str, name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err(format!("the {what} name is empty"));
    }
    if name.len() > 127 {
        return Err(format!(
            "the {what} name {name:?} is longer than RocketMQ's 127 characters"
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '|' | '%')))
    {
        return Err(format!(
            "the {what} name {name:?} holds {c:?}: RocketMQ takes letters, digits, `-`, `_`, `|` and `%`"
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
        assert!(
            Consumer::new("127.0.0.1:9876", "orders")
                .check_topology()
                .is_ok()
        );
    }

    #[test]
    fn names_the_broker_would_refuse_are_refused() {
        let c = || Consumer::new("127.0.0.1:9876", "orders");
        assert!(refusal(&Consumer::new("127.0.0.1:9876", "")).contains("empty"));
        assert!(refusal(&Consumer::new("127.0.0.1:9876", "a.b")).contains("'.'"));
        assert!(refusal(&Consumer::new("127.0.0.1:9876", "%RETRY%x")).contains("`%`"));
        assert!(refusal(&c().group("x".repeat(128))).contains("127"));
        assert!(refusal(&c().dead_letters("orders")).contains("must differ"));
        assert!(refusal(&c().retry_topic_named("orders")).contains("must differ"));
        assert!(refusal(&c().retry_topic_named("%RETRY%x")).contains("`%`"));
        assert!(refusal(&c().delay_levels(Vec::new())).contains("messageDelayLevel"));
        assert!(refusal(&c().delay_levels([Duration::ZERO])).contains("zero"));
        assert!(refusal(&c().tags(" ")).contains("tag"));
        let policy = |concurrency| Policy {
            concurrency,
            ..Policy::default()
        };
        assert!(refusal(&c().policy(policy(0))).contains("1 to 1,000"));
        assert!(refusal(&c().policy(policy(1_001))).contains("1 to 1,000"));
    }

    #[test]
    fn a_wait_goes_to_the_longest_level_not_longer() {
        let c = Consumer::new("127.0.0.1:9876", "orders").delay_levels([
            Duration::from_millis(500),
            Duration::from_secs(1),
            Duration::from_secs(5),
        ]);
        assert_eq!(c.delay_level(Duration::ZERO), 1);
        assert_eq!(c.delay_level(Duration::from_millis(999)), 1);
        assert_eq!(c.delay_level(Duration::from_secs(1)), 2);
        assert_eq!(c.delay_level(Duration::from_secs(4)), 2);
        assert_eq!(c.delay_level(Duration::from_secs(3600)), 3);
    }
}
