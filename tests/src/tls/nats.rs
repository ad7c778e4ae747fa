//! `nats-server`s of the test's own, with JetStream, that take TLS only.

use std::process::Command;
use std::time::Duration;

use super::certs::Certs;
use super::daemon::{Daemon, ServerError};
use crate::processes::free_port;

/// A `nats-server` with JetStream and a `tls` block, on a free port of
/// 127.0.0.1 (every client must speak TLS).
#[derive(Debug)]
pub struct TlsNats {
    port: u16,
    _daemon: Daemon,
}

impl TlsNats {
    /// Client certificates not asked for.
    pub fn start(certs: &Certs) -> Result<TlsNats, ServerError> {
        Self::with(certs, false)
    }

    /// Mutual TLS: `verify: true`, a client certificate of the test CA is
    /// required.
    pub fn mutual(certs: &Certs) -> Result<TlsNats, ServerError> {
        Self::with(certs, true)
    }

    fn with(certs: &Certs, verify: bool) -> Result<TlsNats, ServerError> {
        let dir = Daemon::dir("nats-tls")?;
        let port = free_port().map_err(|e| ServerError::Failed(e.to_string()))?;
        let server = certs.server();
        let conf = dir.0.join("nats.conf");
        std::fs::write(
            &conf,
            format!(
                "host: 127.0.0.1\nport: {port}\n\
                 jetstream {{ store_dir: {:?} }}\n\
                 tls {{ cert_file: {:?}\n key_file: {:?}\n ca_file: {:?}\n verify: {verify}\n timeout: 10 }}\n",
                dir.0.join("js").display().to_string(),
                server.cert.display().to_string(),
                server.key.display().to_string(),
                certs.ca().display().to_string(),
            ),
        )
        .map_err(|e| format!("nats.conf: {e}"))?;
        // `timeout` is the TLS handshake's, in seconds: 10, not 2, so that
        // a debug build's handshake on a busy 2-core machine has time (a
        // CI run saw the server reset a test's first connection).
        let mut c = Command::new("nats-server");
        c.arg("-c").arg(&conf);
        let daemon = Daemon::spawn("nats-server", dir, c, None, port, Duration::from_secs(10))?;
        Ok(TlsNats {
            port,
            _daemon: daemon,
        })
    }

    /// `tls://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("tls://127.0.0.1:{}", self.port)
    }

    /// The URL with another scheme (`nats`).
    pub fn url_as(&self, scheme: &str) -> String {
        format!("{scheme}://127.0.0.1:{}", self.port)
    }
}
