//! `redis-server`s of the test's own that take TLS only.

use std::process::Command;
use std::time::Duration;

use super::certs::{Certs, Pair};
use super::daemon::{Daemon, ServerError};
use crate::processes::free_port;

/// A `redis-server` with `--port 0` (no plain-text port) and `--tls-port`
/// on a free port, bound to 127.0.0.1 and 127.0.0.2.
#[derive(Debug)]
pub struct TlsRedis {
    port: u16,
    _daemon: Daemon,
}

impl TlsRedis {
    /// With the server certificate; client certificates checked when
    /// given (`--tls-auth-clients optional`).
    pub fn start(certs: &Certs) -> Result<TlsRedis, ServerError> {
        Self::with(certs, &certs.server(), "optional")
    }

    /// Mutual TLS: a client certificate of the test CA is required
    /// (`--tls-auth-clients yes`).
    pub fn mutual(certs: &Certs) -> Result<TlsRedis, ServerError> {
        Self::with(certs, &certs.server(), "yes")
    }

    /// Serving the certificate that expired.
    pub fn expired(certs: &Certs) -> Result<TlsRedis, ServerError> {
        Self::with(certs, &certs.expired(), "optional")
    }

    fn with(certs: &Certs, cert: &Pair, clients: &str) -> Result<TlsRedis, ServerError> {
        let dir = Daemon::dir("redis-tls")?;
        let port = free_port().map_err(|e| ServerError::Failed(e.to_string()))?;
        let mut c = Command::new("redis-server");
        c.args(["--port", "0", "--tls-port", &port.to_string()])
            .args(["--bind", "127.0.0.1", "127.0.0.2"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .arg("--dir")
            .arg(&dir.0)
            .arg("--tls-cert-file")
            .arg(&cert.cert)
            .arg("--tls-key-file")
            .arg(&cert.key)
            .arg("--tls-ca-cert-file")
            .arg(certs.ca())
            .args(["--tls-auth-clients", clients]);
        let daemon = Daemon::spawn("redis-server", dir, c, None, port, Duration::from_secs(10))?;
        Ok(TlsRedis {
            port,
            _daemon: daemon,
        })
    }

    /// `rediss://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("rediss://127.0.0.1:{}", self.port)
    }

    /// The URL with another scheme or host (`redis`, `127.0.0.2`).
    pub fn url_as(&self, scheme: &str, host: &str) -> String {
        format!("{scheme}://{host}:{}", self.port)
    }
}
