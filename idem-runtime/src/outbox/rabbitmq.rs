//! Publishing staged messages to RabbitMQ (feature `rabbitmq`).

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Connection};
use tokio::sync::Mutex;

use super::{Destination, Outgoing};
use crate::client_tls::{self, ClientTls};
use crate::error::BoxError;

/// Publishes to RabbitMQ: to the exchange it is given (the default
/// exchange, `""`, unless [`exchange`](Self::exchange) names another),
/// with the message's destination as the routing key; persistent,
/// `mandatory` (a message no queue takes comes back, and counts as a
/// failed publish), with the message's id as the AMQP `message_id`
/// property and its headers as AMQP headers; done once the broker's
/// publisher confirm arrives. A lost connection is opened again at the
/// next publish.
///
/// # Examples
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
/// use idem_runtime::outbox::{RabbitMqDestination, Relay};
///
/// let store = idem_runtime::PgStore::connect("postgres://app@db.internal/shop").await?;
/// let to = RabbitMqDestination::connect("amqp://guest:guest@127.0.0.1:5672/%2f")
///     .await?
///     .exchange("orders");
/// tokio::spawn(Relay::new(store.outbox_table(), to).run(std::future::pending()));
/// # Ok(()) }
/// ```
pub struct RabbitMqDestination {
    url: String,
    tls: ClientTls,
    exchange: String,
    open: Mutex<Option<(Connection, Channel)>>,
}

impl std::fmt::Debug for RabbitMqDestination {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RabbitMqDestination")
            .field("exchange", &self.exchange)
            .finish_non_exhaustive()
    }
}

impl RabbitMqDestination {
    /// Connects to the broker at `url` (checked now, and opened again
    /// whenever it is lost).
    ///
    /// # Errors
    ///
    /// lapin's, when the broker cannot be reached.
    ///
    /// # Examples
    ///
    /// See [`RabbitMqDestination`].
    pub async fn connect(url: &str) -> Result<RabbitMqDestination, BoxError> {
        RabbitMqDestination::connect_over(url, ClientTls::default()).await
    }

    /// Connects to the broker at `url` (`amqps://`) over TLS verified with
    /// `tls`.
    ///
    /// # Errors
    ///
    /// lapin's, when the broker cannot be reached or its certificate does
    /// not verify; a URL that is not `amqps://`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    /// use idem_runtime::{outbox::RabbitMqDestination, tls::Tls};
    ///
    /// let tls = Tls::new().ca_file("/etc/ssl/broker-ca.pem")?;
    /// let to = RabbitMqDestination::connect_tls("amqps://broker.internal:5671/%2f", &tls).await?;
    /// # let _ = to; Ok(()) }
    /// ```
    #[cfg(feature = "tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    pub async fn connect_tls(
        url: &str,
        tls: &crate::tls::Tls,
    ) -> Result<RabbitMqDestination, BoxError> {
        RabbitMqDestination::connect_over(url, ClientTls::new(tls.clone())).await
    }

    async fn connect_over(url: &str, tls: ClientTls) -> Result<RabbitMqDestination, BoxError> {
        let to = RabbitMqDestination {
            tls,
            url: url.to_owned(),
            exchange: String::new(),
            open: Mutex::new(None),
        };
        to.channel().await?;
        Ok(to)
    }

    /// Publishes to `exchange` rather than the default exchange.
    ///
    /// # Examples
    ///
    /// See [`RabbitMqDestination`].
    pub fn exchange(mut self, exchange: impl Into<String>) -> RabbitMqDestination {
        self.exchange = exchange.into();
        self
    }

    /// The channel (in confirm mode), opened again if it was lost.
    async fn channel(&self) -> Result<Channel, BoxError> {
        let mut open = self.open.lock().await;
        if let Some((conn, channel)) = open.as_ref()
            && conn.status().connected()
            && channel.status().connected()
        {
            return Ok(channel.clone());
        }
        let conn = client_tls::amqp(&self.url, &self.tls).await?;
        let channel = conn.create_channel().await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        *open = Some((conn, channel.clone()));
        Ok(channel)
    }
}

impl Destination for RabbitMqDestination {
    fn kind(&self) -> &'static str {
        "rabbitmq"
    }

    async fn publish(&self, message: &Outgoing) -> Result<(), BoxError> {
        let channel = self.channel().await?;
        let mut headers = FieldTable::default();
        for (name, value) in &message.headers {
            // Checked when staged; a row written otherwise fails its
            // publish rather than the relay.
            if name.len() > 255 {
                return Err(format!("header name {name:?} is longer than AMQP's 255 bytes").into());
            }
            headers.insert(
                ShortString::from(name.as_str()),
                AMQPValue::LongString(LongString::from(value.as_bytes())),
            );
        }
        let properties = BasicProperties::default()
            .with_delivery_mode(2)
            .with_message_id(ShortString::from(message.id.as_str()))
            .with_headers(headers);
        let mandatory = BasicPublishOptions {
            mandatory: true,
            ..BasicPublishOptions::default()
        };
        let confirm = channel
            .basic_publish(
                ShortString::from(self.exchange.as_str()),
                ShortString::from(message.destination.as_str()),
                mandatory,
                &message.payload,
                properties,
            )
            .await?
            .await?;
        if !confirm.is_ack() {
            return Err(format!("RabbitMQ refused {} (a nack)", message.id).into());
        }
        if confirm.take_message().is_some() {
            return Err(format!(
                "RabbitMQ returned {}: no queue is bound to routing key {:?} on exchange {:?}",
                message.id, message.destination, self.exchange
            )
            .into());
        }
        Ok(())
    }
}
