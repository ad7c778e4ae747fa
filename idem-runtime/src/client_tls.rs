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
}

/// Connects to RabbitMQ at `url`: over `amqps://` with the settings' CA
/// and client certificate when there are settings.
#[cfg(feature = "rabbitmq")]
pub(crate) async fn amqp(url: &str, tls: &ClientTls) -> Result<lapin::Connection, BoxError> {
    use lapin::{Connection, ConnectionProperties};
    #[cfg(feature = "tls")]
    if let Some(tls) = &tls.tls {
        let scheme = url.split_once("://").map_or("", |(s, _)| s);
        if !scheme.eq_ignore_ascii_case("amqps") {
            return Err(Box::new(crate::tls::TlsError::PlainScheme {
                scheme: scheme.to_owned(),
                tls_scheme: "amqps",
            }));
        }
        let config = tls.amqp()?;
        let conn = lapin::DefaultConnectionBuilder::new()?
            .with_uri_str(url.to_owned())
            .with_properties(ConnectionProperties::default())
            .with_tls_config(config)
            .connect()
            .await?;
        return Ok(conn);
    }
    let _ = tls;
    Ok(Connection::connect(url, ConnectionProperties::default()).await?)
}

/// Connects to NATS at `url`: TLS required, with the settings' CA and
/// client certificate, when there are settings.
#[cfg(feature = "nats")]
pub(crate) async fn nats(url: &str, tls: &ClientTls) -> Result<async_nats::Client, BoxError> {
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
