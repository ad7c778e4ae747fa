//! TLS to the stores and brokers: one [`Tls`] for every client idem drives.
//!
//! Built with the `tls` feature, idem's clients speak TLS through one
//! stack, rustls with the *ring* provider: sqlx (PostgreSQL, MySQL),
//! redis, lapin (RabbitMQ) and async-nats. Kafka's client is librdkafka, a
//! C library whose only TLS is OpenSSL: the feature builds it with the
//! system's OpenSSL (Debian's `libssl-dev` to build, `libssl3` to run).
//!
//! A URL that asks for TLS works as it is once the feature is on:
//! `postgres://…?sslmode=verify-full&sslrootcert=ca.pem`,
//! `mysql://…?ssl-mode=VERIFY_IDENTITY&ssl-ca=ca.pem`, `rediss://…`,
//! `amqps://…`, `tls://…` for NATS. What a URL cannot say for every client
//! alike (a private CA, a client certificate for mutual TLS) a [`Tls`]
//! says, given to the store's `connect_tls`, a consumer's `tls`, a dead
//! letter queue's or an outbox destination's `connect_tls`:
//!
//! ```no_run
//! # #[cfg(feature = "postgres")]
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use idem_runtime::{tls::Tls, PgStore};
//!
//! let tls = Tls::new()
//!     .ca_file("/etc/idem/ca.pem")?
//!     .client_identity_files("/etc/idem/client.pem", "/etc/idem/client.key")?;
//! let store = PgStore::connect_tls("postgres://app@db.internal/shop", &tls).await?;
//! # Ok(()) }
//! # #[cfg(not(feature = "postgres"))] fn main() {}
//! ```
//!
//! A `Tls` always encrypts and, unless told otherwise, verifies: the
//! server's certificate must chain to the CA given (or, without one, to the
//! client's public roots) and name the host of the URL.
//!
//! - A CA given is trusted *instead of* the public roots by the clients
//!   idem configures itself (redis, NATS, RabbitMQ, Kafka), and *besides*
//!   them by sqlx (PostgreSQL, MySQL), which always loads webpki's roots.
//! - [`Tls::server_name`] verifies another name than the URL's host, on
//!   NATS and RabbitMQ; sqlx, redis and librdkafka check only the host they
//!   dial, so those stores and Kafka refuse it.
//! - [`Tls::danger_accept_invalid_certs`] turns verification off, for a
//!   test bench only, and says so in a warning.
//!
//! When a certificate does not verify, [`refusal`] reads the reason out of
//! any error chain (an unknown CA, a wrong host name, an expired
//! certificate, a client certificate the server refused).

mod explain;

/// Installs *ring* as rustls' process-wide crypto provider unless one is
/// installed. The clients that build a rustls configuration of their own
/// (redis-rs for `rediss://`, async-nats for a `tls://` URL) ask rustls for
/// that default, and rustls can only pick one by itself when exactly one
/// provider is built in: a build with the `rocketmq` feature also has
/// aws-lc-rs (through the RocketMQ client's HTTP client), so without a
/// default installed they would panic.
pub(crate) fn install_ring_default() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
mod pem;
#[cfg(any(feature = "nats", feature = "rabbitmq"))]
pub(crate) mod rustls_config;

use std::path::{Path, PathBuf};

pub use explain::{Refusal, refusal};
use pem::Pem;

/// What a connection's TLS needs beyond its URL: the CA to trust, a client
/// certificate for mutual TLS, and whether to verify at all.
///
/// Files are read and checked when the `Tls` is built, so a wrong path or a
/// file without a certificate is an error there, naming the file, rather
/// than a handshake failure later.
///
/// # Examples
///
/// ```no_run
/// use idem_runtime::tls::Tls;
///
/// // the server's certificate chains to the public roots
/// let public = Tls::new();
/// // a private CA, and a client certificate for servers that ask for one
/// let private = Tls::new()
///     .ca_file("ca.pem")?
///     .client_identity_files("client.pem", "client.key")?;
/// # Ok::<(), idem_runtime::tls::TlsError>(())
/// ```
#[derive(Clone)]
pub struct Tls {
    pub(crate) ca: Option<Pem>,
    pub(crate) identity: Option<Identity>,
    pub(crate) server_name: Option<String>,
    verify: bool,
}

impl Default for Tls {
    fn default() -> Self {
        Tls::new()
    }
}

/// A client certificate chain and its private key, both PEM (read by every
/// client but SQLite's, which has no TLS).
#[derive(Clone)]
#[cfg_attr(
    not(any(
        feature = "postgres",
        feature = "mysql",
        feature = "redis",
        feature = "kafka",
        feature = "nats",
        feature = "rabbitmq"
    )),
    allow(dead_code)
)]
pub(crate) struct Identity {
    pub(crate) cert: Pem,
    pub(crate) key: Pem,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // never the key
        f.debug_struct("Tls")
            .field("ca", &self.ca.as_ref().map(|p| p.origin()))
            .field(
                "client_certificate",
                &self.identity.as_ref().map(|i| i.cert.origin()),
            )
            .field("server_name", &self.server_name)
            .field("verify", &self.verify)
            .finish()
    }
}

/// A [`Tls`] that cannot be built, or cannot be used with a client.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// A certificate or key file could not be read.
    #[error("cannot read the {what} `{}`: {source}", path.display())]
    Read {
        /// What the file was to hold.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Why it could not be read.
        #[source]
        source: std::io::Error,
    },
    /// A CA bundle or client certificate with no PEM certificate in it, or
    /// a key file with no PEM private key.
    #[error("the {what} {origin} holds no PEM {expected}")]
    NoPem {
        /// What the PEM was to hold.
        what: &'static str,
        /// The file, or "given as PEM".
        origin: String,
        /// `CERTIFICATE` or `PRIVATE KEY`.
        expected: &'static str,
    },
    /// The URL names a scheme without TLS where TLS was asked for (such as
    /// `redis://` with a [`Tls`]; use `rediss://`).
    #[error("`{scheme}://` does not use TLS: with TLS settings, use `{tls_scheme}://`")]
    PlainScheme {
        /// The URL's scheme.
        scheme: String,
        /// The scheme that does.
        tls_scheme: &'static str,
    },
    /// A server name that is neither a DNS name nor an IP address.
    #[error("{name:?} is not a server name (a DNS name or an IP address)")]
    ServerName {
        /// The name given.
        name: String,
    },
    /// The client cannot do what the [`Tls`] asks.
    #[error("{client} cannot {what}")]
    Unsupported {
        /// The client.
        client: &'static str,
        /// What it cannot do.
        what: &'static str,
    },
}

impl Tls {
    /// TLS, verified against the client's public roots (each client's own:
    /// webpki's for sqlx, the system's for redis, NATS and RabbitMQ, the
    /// system's OpenSSL for Kafka), without a client certificate.
    ///
    /// # Examples
    ///
    /// ```
    /// let tls = idem_runtime::tls::Tls::new();
    /// assert!(tls.verifies());
    /// ```
    pub fn new() -> Self {
        Tls {
            ca: None,
            identity: None,
            server_name: None,
            verify: true,
        }
    }

    /// Trusts the CA certificates of a PEM file (one or several): instead
    /// of the public roots, or besides them on PostgreSQL and MySQL (sqlx
    /// always loads webpki's).
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::tls::{Tls, TlsError};
    ///
    /// let err = Tls::new().ca_file("/nowhere/ca.pem").unwrap_err();
    /// assert!(matches!(err, TlsError::Read { what: "CA bundle", .. }));
    /// ```
    pub fn ca_file(self, path: impl AsRef<Path>) -> Result<Self, TlsError> {
        let pem = Pem::read("CA bundle", path.as_ref())?;
        self.ca_pem_checked(pem)
    }

    /// Trusts the CA certificates of PEM text, as
    /// [`ca_file`](Self::ca_file).
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::tls::{Tls, TlsError};
    ///
    /// let err = Tls::new().ca_pem("not a certificate").unwrap_err();
    /// assert!(matches!(err, TlsError::NoPem { expected: "CERTIFICATE", .. }));
    /// ```
    pub fn ca_pem(self, pem: impl AsRef<[u8]>) -> Result<Self, TlsError> {
        self.ca_pem_checked(Pem::given(pem.as_ref()))
    }

    fn ca_pem_checked(mut self, pem: Pem) -> Result<Self, TlsError> {
        pem.expect_certificate("CA bundle")?;
        self.ca = Some(pem);
        Ok(self)
    }

    /// Presents a client certificate (a PEM chain, the client's own
    /// certificate first) and its PEM private key (PKCS#8, PKCS#1 or SEC1)
    /// to servers that ask for one: mutual TLS.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::tls::{Tls, TlsError};
    ///
    /// let err = Tls::new()
    ///     .client_identity_files("/nowhere/client.pem", "/nowhere/client.key")
    ///     .unwrap_err();
    /// assert!(matches!(err, TlsError::Read { what: "client certificate", .. }));
    /// ```
    pub fn client_identity_files(
        self,
        cert: impl AsRef<Path>,
        key: impl AsRef<Path>,
    ) -> Result<Self, TlsError> {
        let cert = Pem::read("client certificate", cert.as_ref())?;
        let key = Pem::read("client key", key.as_ref())?;
        self.identity_checked(cert, key)
    }

    /// Presents a client certificate and key given as PEM text.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::tls::{Tls, TlsError};
    ///
    /// let err = Tls::new().client_identity_pem("", "").unwrap_err();
    /// assert!(matches!(err, TlsError::NoPem { what: "client certificate", .. }));
    /// ```
    pub fn client_identity_pem(
        self,
        cert: impl AsRef<[u8]>,
        key: impl AsRef<[u8]>,
    ) -> Result<Self, TlsError> {
        self.identity_checked(Pem::given(cert.as_ref()), Pem::given(key.as_ref()))
    }

    fn identity_checked(mut self, cert: Pem, key: Pem) -> Result<Self, TlsError> {
        cert.expect_certificate("client certificate")?;
        key.expect_private_key("client key")?;
        self.identity = Some(Identity { cert, key });
        Ok(self)
    }

    /// Verifies the server's certificate for `name` rather than for the
    /// URL's host: for a server dialled by an address (or through a tunnel)
    /// whose certificate names it otherwise. NATS and RabbitMQ take it
    /// (and RabbitMQ sends it as the handshake's SNI); the others' clients
    /// check only the host they dial, so PostgreSQL, MySQL, Redis and Kafka
    /// refuse a `Tls` with one ([`TlsError::Unsupported`]): give them a URL
    /// with that name, which resolves to the server.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::tls::{Tls, TlsError};
    ///
    /// let tls = Tls::new().server_name("broker.internal")?;
    /// assert!(matches!(Tls::new().server_name("not a name"), Err(TlsError::ServerName { .. })));
    /// # Ok::<(), TlsError>(())
    /// ```
    pub fn server_name(mut self, name: impl Into<String>) -> Result<Self, TlsError> {
        let name = name.into();
        if rustls::pki_types::ServerName::try_from(name.as_str()).is_err() {
            return Err(TlsError::ServerName { name });
        }
        self.server_name = Some(name);
        Ok(self)
    }

    /// Refuses a server name on a client that cannot verify one.
    #[cfg(any(
        feature = "postgres",
        feature = "mysql",
        feature = "redis",
        feature = "kafka"
    ))]
    pub(crate) fn without_server_name(&self, client: &'static str) -> Result<(), TlsError> {
        match self.server_name {
            None => Ok(()),
            Some(_) => Err(TlsError::Unsupported {
                client,
                what: "verify a server name other than the URL's host: connect by that name instead",
            }),
        }
    }

    /// **Turns verification off**: the connection is encrypted, but to
    /// whoever answers, whatever its certificate says. For a test bench
    /// whose certificates are throwaway; never where the data matters.
    /// A warning (target `idem::tls`) is logged when a store's
    /// `connect_tls`, the dead letters' and destinations' `connect_tls`,
    /// and a RabbitMQ or NATS consumer connect with it, and when a Kafka
    /// consumer's `tls` is given it.
    ///
    /// # Examples
    ///
    /// ```
    /// let tls = idem_runtime::tls::Tls::new().danger_accept_invalid_certs();
    /// assert!(!tls.verifies());
    /// ```
    pub fn danger_accept_invalid_certs(mut self) -> Self {
        self.verify = false;
        self
    }

    /// Whether the server's certificate is verified (true unless
    /// [`danger_accept_invalid_certs`](Self::danger_accept_invalid_certs)).
    ///
    /// # Examples
    ///
    /// ```
    /// assert!(idem_runtime::tls::Tls::new().verifies());
    /// ```
    pub fn verifies(&self) -> bool {
        self.verify
    }

    /// Logs the loud warning of a connection that does not verify.
    #[cfg_attr(
        not(any(
            feature = "postgres",
            feature = "mysql",
            feature = "redis",
            feature = "kafka",
            feature = "nats",
            feature = "rabbitmq"
        )),
        allow(dead_code)
    )]
    pub(crate) fn warn_if_unverified(&self, what: &str) {
        if !self.verifies() {
            tracing::warn!(
                target: "idem::tls",
                "TLS to {what} does NOT verify the server's certificate (danger_accept_invalid_certs): the connection is open to an impostor"
            );
        }
    }
}

#[cfg(feature = "postgres")]
impl Tls {
    /// Sets `options` to connect with this TLS: `verify-full` (or `require`
    /// without verification), the CA and the client certificate. For
    /// [`PgStore::connect_with`](crate::PgStore::connect_with) and pools of
    /// your own; [`PgStore::connect_tls`](crate::PgStore::connect_tls) calls
    /// it.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::tls::Tls;
    /// use sqlx::postgres::{PgConnectOptions, PgSslMode};
    ///
    /// let options = Tls::new().postgres(PgConnectOptions::new().host("db.internal"))?;
    /// assert!(matches!(options.get_ssl_mode(), PgSslMode::VerifyFull));
    /// # Ok::<(), idem_runtime::tls::TlsError>(())
    /// ```
    pub fn postgres(
        &self,
        options: sqlx::postgres::PgConnectOptions,
    ) -> Result<sqlx::postgres::PgConnectOptions, TlsError> {
        use sqlx::postgres::PgSslMode;
        self.without_server_name("sqlx (PostgreSQL)")?;
        let mut options = options.ssl_mode(if self.verifies() {
            PgSslMode::VerifyFull
        } else {
            PgSslMode::Require
        });
        if let Some(ca) = &self.ca {
            options = options.ssl_root_cert_from_pem(ca.bytes().to_vec());
        }
        if let Some(id) = &self.identity {
            options = options
                .ssl_client_cert_from_pem(id.cert.bytes())
                .ssl_client_key_from_pem(id.key.bytes());
        }
        Ok(options)
    }
}

#[cfg(feature = "mysql")]
impl Tls {
    /// Sets `options` to connect with this TLS: `VERIFY_IDENTITY` (or
    /// `REQUIRED` without verification), the CA and the client certificate.
    /// For [`MySqlStore::connect_with`](crate::MySqlStore::connect_with);
    /// [`MySqlStore::connect_tls`](crate::MySqlStore::connect_tls) calls it.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::tls::Tls;
    /// use sqlx::mysql::{MySqlConnectOptions, MySqlSslMode};
    ///
    /// let options = Tls::new().mysql(MySqlConnectOptions::new().host("db.internal"))?;
    /// assert!(matches!(options.get_ssl_mode(), MySqlSslMode::VerifyIdentity));
    /// # Ok::<(), idem_runtime::tls::TlsError>(())
    /// ```
    pub fn mysql(
        &self,
        options: sqlx::mysql::MySqlConnectOptions,
    ) -> Result<sqlx::mysql::MySqlConnectOptions, TlsError> {
        use sqlx::mysql::MySqlSslMode;
        self.without_server_name("sqlx (MySQL)")?;
        let mut options = options.ssl_mode(if self.verifies() {
            MySqlSslMode::VerifyIdentity
        } else {
            MySqlSslMode::Required
        });
        if let Some(ca) = &self.ca {
            options = options.ssl_ca_from_pem(ca.bytes().to_vec());
        }
        if let Some(id) = &self.identity {
            options = options
                .ssl_client_cert_from_pem(id.cert.bytes())
                .ssl_client_key_from_pem(id.key.bytes());
        }
        Ok(options)
    }
}

#[cfg(feature = "kafka")]
impl Tls {
    /// The librdkafka settings of this TLS: `security.protocol=ssl`, the
    /// CA, the client certificate, and host name verification (or none of
    /// it, without verification). The Kafka consumer's
    /// [`tls`](crate::consume::kafka::Consumer::tls) starts every client
    /// from them, under its own settings; where they are set by hand
    /// (`DeadLetters::connect_with`, `KafkaDestination::from_config`), set
    /// `security.protocol` to `sasl_ssl` after them for SASL over TLS. A
    /// server name is refused: librdkafka checks the brokers' own names.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::tls::Tls;
    ///
    /// let settings = Tls::new().kafka_settings()?;
    /// assert!(settings.contains(&("security.protocol", "ssl".to_owned())));
    /// assert!(settings.contains(&("ssl.endpoint.identification.algorithm", "https".to_owned())));
    /// # Ok::<(), idem_runtime::tls::TlsError>(())
    /// ```
    pub fn kafka_settings(&self) -> Result<Vec<(&'static str, String)>, TlsError> {
        self.without_server_name("librdkafka (Kafka)")?;
        let mut settings = vec![("security.protocol", "ssl".to_owned())];
        if let Some(ca) = &self.ca {
            settings.push(("ssl.ca.pem", ca.text().to_owned()));
        }
        if let Some(id) = &self.identity {
            settings.push(("ssl.certificate.pem", id.cert.text().to_owned()));
            settings.push(("ssl.key.pem", id.key.text().to_owned()));
        }
        let (verify, names) = if self.verifies() {
            ("true", "https")
        } else {
            ("false", "none")
        };
        settings.push(("enable.ssl.certificate.verification", verify.to_owned()));
        settings.push(("ssl.endpoint.identification.algorithm", names.to_owned()));
        Ok(settings)
    }
}
