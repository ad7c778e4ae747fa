//! How a broker client connects: with the [`Tls`](crate::tls::Tls) it was
//! given, if any (none in a build without the `tls` feature), so that a
//! consumer, its dead letters and an outbox destination reach a broker the
//! same way.

use crate::BoxError;

/// The TLS settings of a broker connection, if it was given any.
#[derive(Debug, Clone, Default)]
pub(crate) struct ClientTls {
    #[cfg(feature = "tls")]
    tls: Option<crate::tls::Tls>,
}

impl ClientTls {
    /// Connections with `tls`.
    #[cfg(feature = "tls")]
    pub(crate) fn new(tls: crate::tls::Tls) -> ClientTls {
        ClientTls { tls: Some(tls) }
    }

    /// Refuses a RabbitMQ URL whose scheme does not use TLS when there are
    /// settings (before anything connects, and before a consumer's first
    /// attempt, which would be retried).
    #[cfg(feature = "rabbitmq")]
    pub(crate) fn check_amqp(&self, url: &str) -> Result<(), BoxError> {
        #[cfg(feature = "tls")]
        if self.tls.is_some() {
            let scheme = url.split_once("://").map_or("", |(s, _)| s);
            if !scheme.eq_ignore_ascii_case("amqps") {
                return Err(Box::new(crate::tls::TlsError::PlainScheme {
                    scheme: scheme.to_owned(),
                    tls_scheme: "amqps",
                }));
            }
        }
        let _ = url;
        Ok(())
    }

    /// Adds the settings' librdkafka configuration (none without
    /// settings).
    #[cfg(feature = "kafka")]
    pub(crate) fn kafka(&self, config: &mut rdkafka::ClientConfig) -> Result<(), BoxError> {
        #[cfg(feature = "tls")]
        if let Some(tls) = &self.tls {
            for (k, v) in tls.kafka_settings()? {
                config.set(k, v);
            }
        }
        let _ = config;
        Ok(())
    }
}

/// Connects to RabbitMQ at `url`: over `amqps://` with the settings (their
/// CA instead of the public roots, their client certificate, their server
/// name, verification as they say) when there are settings.
#[cfg(feature = "rabbitmq")]
pub(crate) async fn amqp(url: &str, tls: &ClientTls) -> Result<lapin::Connection, BoxError> {
    use lapin::{Connection, ConnectionProperties};
    tls.check_amqp(url)?;
    #[cfg(feature = "tls")]
    crate::tls::install_ring_default();
    #[cfg(feature = "tls")]
    if let Some(tls) = &tls.tls {
        return amqps(url, tls).await;
    }
    Connection::connect(url, ConnectionProperties::default())
        .await
        .map_err(|e| plain_refused(url, e))
}

/// A plain-text connection that a broker answered with something other
/// than AMQP (a TLS listener's alert, a reset) says what to try.
#[cfg(feature = "rabbitmq")]
fn plain_refused(url: &str, e: lapin::Error) -> BoxError {
    let text = e.to_string().to_ascii_lowercase();
    let answered_otherwise = [
        "failed to parse",
        "reset by peer",
        "broken pipe",
        "unexpected end",
    ]
    .iter()
    .any(|sign| text.contains(sign));
    let plain = url
        .split_once("://")
        .is_some_and(|(scheme, _)| scheme.eq_ignore_ascii_case("amqp"));
    if plain && answered_otherwise {
        format!(
            "{e} (the broker did not answer in plain AMQP: if its listener takes TLS, use amqps://)"
        )
        .into()
    } else {
        Box::new(e)
    }
}

/// lapin's own TLS takes a CA only besides webpki's roots, and no server
/// name and no unverified mode: the connection is made here, with the
/// rustls configuration of the settings.
#[cfg(all(feature = "rabbitmq", feature = "tls"))]
async fn amqps(url: &str, tls: &crate::tls::Tls) -> Result<lapin::Connection, BoxError> {
    use std::sync::Arc;

    use lapin::tcp::{AsyncTcpStream, RustlsConnector};
    use lapin::uri::AMQPUri;
    use lapin::{Connection, ConnectionProperties};

    tls.warn_if_unverified("RabbitMQ");
    let uri: AMQPUri = url.parse()?;
    let connector = RustlsConnector::from(Arc::new(tls.rustls_client_config()?));
    let name = tls
        .server_name
        .clone()
        .unwrap_or_else(|| uri.authority.host.clone());
    let runtime = lapin::runtime::default_runtime()?;
    let conn = Connection::connector(
        uri,
        runtime,
        async move |uri: AMQPUri, runtime| {
            let (host, port) = (uri.authority.host.clone(), uri.authority.port);
            let addrs: Vec<std::net::SocketAddr> = tokio::net::lookup_host((host.as_str(), port))
                .await?
                .collect();
            let stream = AsyncTcpStream::connect(&runtime, addrs).await?;
            Ok(stream.into_rustls(&connector, &name).await?)
        },
        ConnectionProperties::default(),
    )
    .await?;
    Ok(conn)
}

/// Connects to NATS at `url`: TLS required, with the settings' CA and
/// client certificate, when there are settings.
#[cfg(feature = "nats")]
pub(crate) async fn nats(url: &str, tls: &ClientTls) -> Result<async_nats::Client, BoxError> {
    // async-nats builds a rustls configuration of its own for a `tls://`
    // URL, from rustls' process default.
    #[cfg(feature = "tls")]
    crate::tls::install_ring_default();
    #[cfg(feature = "tls")]
    if let Some(tls) = &tls.tls {
        tls.warn_if_unverified("NATS");
        let config = tls.rustls_client_config()?;
        let client = async_nats::ConnectOptions::new()
            .require_tls(true)
            .tls_client_config(config)
            .connect(url)
            .await?;
        return Ok(client);
    }
    let _ = tls;
    Ok(async_nats::connect(url).await?)
}
