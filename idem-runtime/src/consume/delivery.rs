//! What the broker said about a delivery, for handlers that want it
//! (`run`): redelivered or not, how many times, its headers,
//! id, where it came from and when it was published.

use std::time::SystemTime;

/// The broker a consumer runs on: the `broker` label of the consumer
/// metrics.
///
/// # Examples
///
/// ```
/// use idem_runtime::consume::Broker;
/// assert_eq!(Broker::Nats.as_str(), "nats");
/// assert_eq!(Broker::RabbitMq.to_string(), "rabbitmq");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Broker {
    /// RabbitMQ (AMQP 0-9-1).
    RabbitMq,
    /// NATS JetStream.
    Nats,
    /// Kafka, or a broker that speaks its protocol.
    Kafka,
    /// RocketMQ.
    RocketMq,
}

impl Broker {
    /// The label: `rabbitmq`, `nats`, `kafka` or `rocketmq`.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(idem_runtime::consume::Broker::Kafka.as_str(), "kafka");
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            Broker::RabbitMq => "rabbitmq",
            Broker::Nats => "nats",
            Broker::Kafka => "kafka",
            Broker::RocketMq => "rocketmq",
        }
    }
}

impl std::fmt::Display for Broker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One delivery as the broker described it, handed to a handler started
/// with `run`.
///
/// | field | RabbitMQ | NATS JetStream | Kafka | RocketMQ |
/// | --- | --- | --- | --- | --- |
/// | `source` | the routing key it was published with | the subject | the topic it was first consumed from | the topic it was first consumed from (`x-idem-topic` on a retry) |
/// | `redelivered` | the broker's `redelivered` flag | `delivered > 1` | `false`: Kafka does not say | `deliveries > 1` |
/// | `retries` | `x-idem-retries`: times this consumer handed it back | `delivered - 1`: every redelivery, a `Nak` or an ack wait that ran out | `x-idem-retries` | `x-idem-retries`, plus the client's `RECONSUME_LATER` sends |
/// | `deliveries` | `1 + retries`, `+ 1` when `redelivered` | `delivered` | `1 + retries` | `1 + retries` |
/// | `id` | the `message_id` property | the `Nats-Msg-Id` header | the `x-idem-message-id` header (an outbox relay writes all three) | the `KEYS` (an outbox relay writes the id there), else the client's `UNIQ_KEY` |
/// | `partition`, `offset` | `None` | `None`, the stream sequence | the partition and offset it was first consumed at | the queue id and queue offset of this delivery |
/// | `published_at` | the `timestamp` property (whole seconds) | the stream's timestamp | the record's timestamp | the producer's born time (`x-idem-published` on a retry) |
/// | `headers` | the AMQP headers, values as text | the headers | the record headers | every property (`KEYS`, `TAGS`, `UNIQ_KEY`, the user's) |
///
/// # Examples
///
/// ```
/// use idem_runtime::consume::Delivery;
///
/// // what a test hands a handler written for `run`
/// let d = Delivery::default().with_header("tenant", "acme");
/// assert_eq!(d.header("tenant"), Some("acme"));
/// assert_eq!(d.header("Tenant"), Some("acme")); // names ignore case
/// assert_eq!(d.deliveries, 1);
/// assert!(!d.redelivered);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Delivery {
    /// The broker, or `None` for a delivery made up by a test.
    pub broker: Option<Broker>,
    /// Where the message came from: routing key, subject or topic.
    pub source: String,
    /// Whether the broker says it delivered this message before.
    pub redelivered: bool,
    /// How many times the message was handed back to be delivered again.
    pub retries: u32,
    /// How many times it has been delivered, this one included (at least).
    pub deliveries: u32,
    /// The producer's message id, if it gave one.
    pub id: Option<String>,
    /// Kafka: the partition.
    pub partition: Option<i32>,
    /// Kafka: the offset; NATS: the stream sequence.
    pub offset: Option<i64>,
    /// When the broker (or the producer) stamped it.
    pub published_at: Option<SystemTime>,
    /// Its headers, in the order the broker gave them; values as bytes.
    pub headers: Vec<(String, Vec<u8>)>,
}

impl Default for Delivery {
    fn default() -> Self {
        Delivery {
            broker: None,
            source: String::new(),
            redelivered: false,
            retries: 0,
            deliveries: 1,
            id: None,
            partition: None,
            offset: None,
            published_at: None,
            headers: Vec::new(),
        }
    }
}

impl Delivery {
    /// The first header called `name` (ASCII case ignored), if its value is
    /// UTF-8.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::consume::Delivery;
    /// let d = Delivery::default().with_header("x-idem-retries", "2");
    /// assert_eq!(d.header("x-idem-retries"), Some("2"));
    /// assert_eq!(d.header("x-other"), None);
    /// ```
    pub fn header(&self, name: &str) -> Option<&str> {
        self.header_bytes(name)
            .and_then(|v| std::str::from_utf8(v).ok())
    }

    /// The first header called `name` (ASCII case ignored), as bytes.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::consume::Delivery;
    /// let d = Delivery::default().with_header("trace", [0xff_u8, 0]);
    /// assert_eq!(d.header_bytes("trace"), Some(&[0xff_u8, 0][..]));
    /// assert_eq!(d.header("trace"), None); // not UTF-8
    /// ```
    pub fn header_bytes(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_slice())
    }

    /// The delivery with one more header; for tests of handlers that read
    /// them.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::consume::Delivery;
    /// let d = Delivery::default().with_header("a", "1").with_header("b", "2");
    /// assert_eq!(d.headers.len(), 2);
    /// ```
    pub fn with_header(mut self, name: impl Into<String>, value: impl AsRef<[u8]>) -> Self {
        self.headers.push((name.into(), value.as_ref().to_vec()));
        self
    }

    /// How long ago it was published, if the broker said when (zero for a
    /// timestamp ahead of this machine's clock).
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::consume::Delivery;
    /// use std::time::{Duration, SystemTime};
    ///
    /// let mut d = Delivery::default();
    /// assert_eq!(d.age(), None);
    /// d.published_at = Some(SystemTime::now() - Duration::from_secs(5));
    /// assert!(d.age().unwrap() >= Duration::from_secs(5));
    /// ```
    pub fn age(&self) -> Option<std::time::Duration> {
        self.published_at
            .map(|at| SystemTime::now().duration_since(at).unwrap_or_default())
    }
}
