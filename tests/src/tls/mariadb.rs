//! A MariaDB of the test's own that takes TLS only.

use std::process::Command;
use std::time::Duration;

use super::certs::{Certs, MTLS_USER};
use super::daemon::{Daemon, ServerError, run};
use crate::processes::free_port;

/// A `mariadbd` on a free port of 127.0.0.1 with
/// `require_secure_transport = ON`, its own data directory
/// (`mariadb-install-db`), database `test`, user `idem` without a password
/// and user [`MTLS_USER`], which must present a client certificate of the
/// test CA (`REQUIRE X509`).
#[derive(Debug)]
pub struct TlsMariaDb {
    port: u16,
    _daemon: Daemon,
}

impl TlsMariaDb {
    /// Makes and starts it (a few seconds).
    pub fn start(certs: &Certs) -> Result<TlsMariaDb, ServerError> {
        let dir = Daemon::dir("mariadb-tls")?;
        let data = dir.0.join("data");
        let socket = dir.0.join("sock");
        let mut install = Command::new("mariadb-install-db");
        install
            .arg("--no-defaults")
            .arg(format!("--datadir={}", data.display()))
            .args(["--auth-root-authentication-method=normal", "--skip-test-db"])
            .arg(format!("--user={}", whoami()));
        run(install)?;
        let port = free_port().map_err(|e| ServerError::Failed(e.to_string()))?;
        let server = certs.server();
        let mut c = Command::new("mariadbd");
        c.arg("--no-defaults")
            .arg(format!("--datadir={}", data.display()))
            .arg(format!("--port={port}"))
            .arg("--bind-address=127.0.0.1")
            .arg(format!("--socket={}", socket.display()))
            .arg(format!("--pid-file={}", dir.0.join("pid").display()))
            .arg(format!("--user={}", whoami()))
            .arg("--skip-name-resolve")
            .arg(format!("--ssl-ca={}", certs.ca().display()))
            .arg(format!("--ssl-cert={}", server.cert.display()))
            .arg(format!("--ssl-key={}", server.key.display()))
            .arg("--require-secure-transport=ON")
            .args(["--innodb-buffer-pool-size=16M", "--skip-log-bin"]);
        let daemon = Daemon::spawn("mariadbd", dir, c, None, port, Duration::from_secs(30))?;
        let mut setup = Command::new("mariadb");
        setup
            .arg(format!("--socket={}", socket.display()))
            .args(["-uroot", "-e"])
            .arg(format!(
                "CREATE DATABASE test; \
                 CREATE USER 'idem'@'127.0.0.1'; GRANT ALL ON *.* TO 'idem'@'127.0.0.1'; \
                 CREATE USER '{MTLS_USER}'@'127.0.0.1' REQUIRE X509; \
                 GRANT ALL ON *.* TO '{MTLS_USER}'@'127.0.0.1';"
            ));
        run(setup).map_err(|e| ServerError::Failed(format!("{e}\n{}", daemon.log_tail())))?;
        Ok(TlsMariaDb {
            port,
            _daemon: daemon,
        })
    }

    /// `mysql://<user>@127.0.0.1:<port>/test`, with `query` when not empty.
    pub fn url(&self, user: &str, query: &str) -> String {
        let mut url = format!("mysql://{user}@127.0.0.1:{}/test", self.port);
        if !query.is_empty() {
            url.push('?');
            url.push_str(query);
        }
        url
    }
}

/// The user the tests run as (`mariadbd` runs as it: as root it must be
/// told so).
fn whoami() -> String {
    Command::new("id")
        .arg("-un")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| "root".to_owned())
}
