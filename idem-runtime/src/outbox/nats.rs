//! Publishing staged messages to NATS JetStream (feature `nats`).

use std::str::FromStr as _;

use async_nats::jetstream;
use async_nats::{HeaderMap, HeaderName, HeaderValue};

use super::{Destination, Outgoing};
use crate::client_tls::{self, ClientTls};
use crate::error::BoxError;

/// Publishes to NATS JetStream: the message's destination is the subject
/// (a stream must take it), its id goes in the `Nats-Msg-Id` header, so
/// that the stream's duplicate window drops a second publish of one id,
/// and its headers as NATS headers; done once the stream's
/// acknowledgement arrives (a publish the window dropped as a duplicate is
/// done too: the stream has it). The client reconnects by itself.
///
/// # Examples
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
/// use idem_runtime::outbox::{NatsDestination, Relay};
///
/// let store = idem_runtime::PgStore::connect("postgres://app@db.internal/shop").await?;
/// let to = NatsDestination::connect("nats://127.0.0.1:4222").await?;
/// tokio::spawn(Relay::new(store.outbox_table(), to).run(std::future::pending()));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct NatsDestination {
    js: jetstream::Context,
}

impl NatsDestination {
    /// Connects to the server at `url`.
    ///
    /// # Errors
    ///
    /// async-nats's, when the server cannot be reached.
    ///
    /// # Examples
    ///
    /// See [`NatsDestination`].
    pub async fn connect(url: &str) -> Result<NatsDestination, BoxError> {
        Ok(NatsDestination::from_client(
            client_tls::nats(url, &ClientTls::default()).await?,
        ))
    }

    /// Connects to the server at `url` with TLS required, verified with
    /// `tls`.
    ///
    /// # Errors
    ///
    /// async-nats's, when the server cannot be reached or its certificate
    /// does not verify.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    /// use idem_runtime::{outbox::NatsDestination, tls::Tls};
    ///
    /// let tls = Tls::new().ca_file("/etc/ssl/nats-ca.pem")?;
    /// let to = NatsDestination::connect_tls("tls://nats.internal:4222", &tls).await?;
    /// # let _ = to; Ok(()) }
    /// ```
    #[cfg(feature = "tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    pub async fn connect_tls(
        url: &str,
        tls: &crate::tls::Tls,
    ) -> Result<NatsDestination, BoxError> {
        Ok(NatsDestination::from_client(
            client_tls::nats(url, &ClientTls::new(tls.clone())).await?,
        ))
    }

    /// Publishes through `client` (one the application configured: its
    /// credentials, TLS, name).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    /// let client = async_nats::ConnectOptions::new().name("orders-relay").connect("nats://127.0.0.1:4222").await?;
    /// let to = idem_runtime::outbox::NatsDestination::from_client(client);
    /// # let _ = to; Ok(()) }
    /// ```
    pub fn from_client(client: async_nats::Client) -> NatsDestination {
        NatsDestination {
            js: jetstream::new(client),
        }
    }
}

impl Destination for NatsDestination {
    fn kind(&self) -> &'static str {
        "nats"
    }

    async fn publish(&self, message: &Outgoing) -> Result<(), BoxError> {
        let mut headers = HeaderMap::new();
        for (name, value) in &message.headers {
            // Checked when staged; a row written otherwise fails its
            // publish rather than the relay.
            let name = HeaderName::from_str(name).map_err(|e| format!("header {name:?}: {e}"))?;
            let value = HeaderValue::from_str(value).map_err(|e| format!("header {name}: {e}"))?;
            headers.append(name, value);
        }
        headers.insert("Nats-Msg-Id", message.id.as_str());
        self.js
            .publish_with_headers(
                message.destination.clone(),
                headers,
                message.payload.clone().into(),
            )
            .await?
            .await?;
        Ok(())
    }
}
