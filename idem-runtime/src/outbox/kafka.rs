//! Publishing staged messages to Kafka (feature `kafka`).

use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;

use super::{Destination, Outgoing};
use crate::error::BoxError;

/// The record header a Kafka message's id travels in (Kafka has no field
/// of its own for one): what an idem consumer's
/// [`Delivery::id`](crate::consume::Delivery::id) reads.
///
/// # Examples
///
/// ```
/// assert_eq!(idem_runtime::outbox::KAFKA_ID_HEADER, "x-idem-message-id");
/// ```
pub const KAFKA_ID_HEADER: &str = crate::consume::kafka::MESSAGE_ID_HEADER;

/// Publishes to Kafka with librdkafka's idempotent producer
/// (`enable.idempotence`, which implies `acks=all`): the message's
/// destination is the topic, its key the record key (its lane when it has
/// none, so the messages of one lane share a partition and keep their
/// order), its id the header [`KAFKA_ID_HEADER`], and its headers record
/// headers; done once every in-sync replica has it.
///
/// # Examples
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
/// use idem_runtime::outbox::{KafkaDestination, Relay};
///
/// let store = idem_runtime::PgStore::connect("postgres://app@db.internal/shop").await?;
/// let to = KafkaDestination::connect("127.0.0.1:9092")?;
/// tokio::spawn(Relay::new(store.outbox_table(), to).run(std::future::pending()));
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct KafkaDestination {
    producer: FutureProducer,
}

impl std::fmt::Debug for KafkaDestination {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaDestination").finish_non_exhaustive()
    }
}

impl KafkaDestination {
    /// A producer for the cluster at `brokers` (`host:port,...`).
    ///
    /// # Errors
    ///
    /// librdkafka's, for a configuration it refuses.
    ///
    /// # Examples
    ///
    /// See [`KafkaDestination`].
    pub fn connect(brokers: &str) -> Result<KafkaDestination, BoxError> {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", brokers);
        KafkaDestination::from_config(config)
    }

    /// A producer for the cluster at `brokers` over TLS verified with
    /// `tls` (its [`kafka_settings`](crate::tls::Tls::kafka_settings)).
    ///
    /// # Errors
    ///
    /// librdkafka's, for a configuration it refuses.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn demo() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    /// use idem_runtime::{outbox::KafkaDestination, tls::Tls};
    ///
    /// let tls = Tls::new().ca_file("/etc/ssl/kafka-ca.pem")?;
    /// let to = KafkaDestination::connect_tls("broker-1:9093", &tls)?;
    /// # let _ = to; Ok(()) }
    /// ```
    #[cfg(feature = "tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    pub fn connect_tls(brokers: &str, tls: &crate::tls::Tls) -> Result<KafkaDestination, BoxError> {
        tls.warn_if_unverified("Kafka");
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", brokers);
        for (k, v) in tls.kafka_settings()? {
            config.set(k, v);
        }
        KafkaDestination::from_config(config)
    }

    /// A producer made from `config` (TLS, SASL, the application's
    /// settings), with `enable.idempotence=true` and `acks=all` set over
    /// it, and `message.timeout.ms` 9 s unless it sets one (under the
    /// relay's default timeout of 10 s: raise both together).
    ///
    /// # Errors
    ///
    /// librdkafka's, for a configuration it refuses.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn demo() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    /// let mut config = rdkafka::ClientConfig::new();
    /// config.set("bootstrap.servers", "127.0.0.1:9092").set("linger.ms", "5");
    /// let to = idem_runtime::outbox::KafkaDestination::from_config(config)?;
    /// # let _ = to; Ok(()) }
    /// ```
    pub fn from_config(mut config: ClientConfig) -> Result<KafkaDestination, BoxError> {
        config.set("enable.idempotence", "true").set("acks", "all");
        // librdkafka gives up on a message before the relay's default
        // timeout (10 s) does, so a publish the relay counts as failed is
        // not still being sent.
        if config.get("message.timeout.ms").is_none() {
            config.set("message.timeout.ms", "9000");
        }
        Ok(KafkaDestination {
            producer: config.create()?,
        })
    }
}

impl Destination for KafkaDestination {
    fn kind(&self) -> &'static str {
        "kafka"
    }

    async fn publish(&self, message: &Outgoing) -> Result<(), BoxError> {
        let mut headers =
            OwnedHeaders::new_with_capacity(message.headers.len() + 1).insert(Header {
                key: KAFKA_ID_HEADER,
                value: Some(message.id.as_str()),
            });
        for (name, value) in &message.headers {
            // The id is the relay's: a header of that name (refused when
            // staged) cannot replace it.
            if name.eq_ignore_ascii_case(KAFKA_ID_HEADER) {
                continue;
            }
            headers = headers.insert(Header {
                key: name.as_str(),
                value: Some(value.as_str()),
            });
        }
        let record = FutureRecord::to(&message.destination)
            .key(message.partition_key())
            .payload(&message.payload)
            .headers(headers);
        self.producer
            .send(record, Timeout::After(Duration::from_secs(30)))
            .await
            .map_err(|(e, _)| Box::new(e) as BoxError)?;
        Ok(())
    }
}
