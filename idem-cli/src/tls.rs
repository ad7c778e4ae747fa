//! The TLS flags, shared by the store and the broker a command reaches,
//! and the reason a certificate did not verify, added to an error.

use std::error::Error as StdError;
use std::path::PathBuf;

use idem_runtime::tls::{Tls, refusal};

use crate::Failure;

/// TLS beyond what a URL says: a private CA, a client certificate for
/// mutual TLS. Any of them makes every connection of the command TLS.
#[derive(Debug, Default, clap::Args)]
#[command(next_help_heading = "TLS (to the store and to the broker)")]
pub(crate) struct TlsArgs {
    /// Trust the CA certificates of this PEM file (and connect over TLS):
    /// instead of the public roots, or besides them on PostgreSQL and MySQL
    #[arg(long, global = true, value_name = "FILE", env = "IDEM_TLS_CA")]
    tls_ca: Option<PathBuf>,

    /// Present this client certificate (PEM) to a server that asks for one;
    /// with --tls-key
    #[arg(long, global = true, value_name = "FILE", env = "IDEM_TLS_CERT")]
    tls_cert: Option<PathBuf>,

    /// The private key (PEM) of --tls-cert
    #[arg(long, global = true, value_name = "FILE", env = "IDEM_TLS_KEY")]
    tls_key: Option<PathBuf>,

    /// Verify the server's certificate for this name rather than the URL's
    /// host (NATS and RabbitMQ; the other clients check the host they dial)
    #[arg(long, global = true, value_name = "NAME", env = "IDEM_TLS_SERVER_NAME")]
    tls_server_name: Option<String>,

    /// DANGER: encrypt, but accept any certificate from whoever answers
    /// (a test bench's throwaway certificates only)
    #[arg(long, global = true)]
    tls_danger_accept_invalid_certs: bool,
}

impl TlsArgs {
    /// The [`Tls`] the flags ask for, or `None` without any.
    pub(crate) fn tls(&self) -> Result<Option<Tls>, Failure> {
        let usage = |e: idem_runtime::tls::TlsError| Failure::Usage(e.to_string());
        let mut tls = None;
        if let Some(ca) = &self.tls_ca {
            tls = Some(Tls::new().ca_file(ca).map_err(usage)?);
        }
        match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => {
                tls = Some(
                    tls.unwrap_or_default()
                        .client_identity_files(cert, key)
                        .map_err(usage)?,
                );
            }
            (None, None) => {}
            _ => {
                return Err(Failure::Usage(
                    "--tls-cert and --tls-key go together: the client certificate and its key"
                        .into(),
                ));
            }
        }
        if let Some(name) = &self.tls_server_name {
            tls = Some(tls.unwrap_or_default().server_name(name).map_err(usage)?);
        }
        if self.tls_danger_accept_invalid_certs {
            // loud, but not a failure: one line on stderr
            eprintln!(
                "idem: warning: --tls-danger-accept-invalid-certs: the server's certificate is not verified, so the connection is open to an impostor"
            );
            tls = Some(tls.unwrap_or_default().danger_accept_invalid_certs());
        }
        Ok(tls)
    }
}

/// `err`'s message, and why the server's certificate did not verify when
/// that is why it failed.
pub(crate) fn explained(err: &(dyn StdError + 'static)) -> String {
    let mut text = err.to_string();
    // The message names the cause only at its own level: add the causes'
    // that it does not already say.
    let mut next = err.source();
    while let Some(cause) = next {
        let said = cause.to_string();
        if !text.contains(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        next = cause.source();
    }
    if let Some(why) = refusal(err) {
        text.push_str(" (");
        text.push_str(&why.to_string());
        text.push(')');
    } else if PLAIN_REFUSED.iter().any(|sign| text.contains(sign)) {
        text.push_str(
            " (the server takes TLS only: use --tls-ca, or a URL that asks for TLS: sslmode=verify-full, ssl-mode=VERIFY_IDENTITY, rediss://, amqps://, tls://)",
        );
    }
    text
}

/// What a server that takes TLS only answers a plain-text client:
/// PostgreSQL's `hostnossl ... reject`, MySQL's `require_secure_transport`.
const PLAIN_REFUSED: &[&str] = &["no encryption", "insecure transport are prohibited"];
