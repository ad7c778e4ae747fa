//! A RabbitMQ node of the test's own that takes TLS only.

use std::process::Command;
use std::time::Duration;

use super::certs::Certs;
use super::daemon::{Daemon, ServerError, as_user, chown};
use crate::processes::free_port;

/// The broker's scripts (Debian's package puts them here; `/usr/sbin`'s
/// wrappers would switch users and write their logs elsewhere).
const BIN: &str = "/usr/lib/rabbitmq/bin";

/// A RabbitMQ node of its own (its own node name, Mnesia directory,
/// distribution port and no plugins) with no plain-text listener and an
/// `amqps` listener on a free port: it asks for a client certificate and
/// verifies one that is given (`verify_peer`), but lets a client without
/// one in (`fail_if_no_peer_cert = false`). User `guest`/`guest`, allowed
/// from anywhere. The shared broker stays as it is.
#[derive(Debug)]
pub struct TlsRabbitMq {
    port: u16,
    _daemon: Daemon,
}

impl TlsRabbitMq {
    /// Starts it (5–10 s).
    pub fn start(certs: &Certs) -> Result<TlsRabbitMq, ServerError> {
        if !std::path::Path::new(BIN).join("rabbitmq-server").exists() {
            return Err(ServerError::Missing(format!("no rabbitmq-server in {BIN}")));
        }
        let dir = Daemon::dir("rabbitmq-tls")?;
        let port = free_port().map_err(|e| ServerError::Failed(e.to_string()))?;
        let mut dist = port;
        while dist == port {
            dist = free_port().map_err(|e| ServerError::Failed(e.to_string()))?;
        }
        let server = certs.server();
        let conf = dir.0.join("rabbitmq.conf");
        std::fs::write(
            &conf,
            format!(
                "listeners.tcp = none\nlisteners.ssl.default = {port}\n\
                 ssl_options.cacertfile = {}\nssl_options.certfile = {}\nssl_options.keyfile = {}\n\
                 ssl_options.verify = verify_peer\nssl_options.fail_if_no_peer_cert = false\n\
                 loopback_users = none\n",
                certs.ca().display(),
                server.cert.display(),
                server.key.display()
            ),
        )
        .map_err(|e| format!("rabbitmq.conf: {e}"))?;
        let plugins = dir.0.join("enabled_plugins");
        std::fs::write(&plugins, "[].\n").map_err(|e| format!("enabled_plugins: {e}"))?;
        let user = as_user("rabbitmq");
        if let Some(user) = user {
            chown(&dir.0, user)?;
        }
        let node = format!(
            "idem-tls-{}-{}@localhost",
            std::process::id(),
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        );
        let command = |program: &str| {
            let mut c = Command::new(std::path::Path::new(BIN).join(program));
            c.current_dir(&dir.0)
                .env("RABBITMQ_NODENAME", &node)
                .env("RABBITMQ_CONFIG_FILE", &conf)
                .env("RABBITMQ_MNESIA_BASE", dir.0.join("mnesia"))
                .env("RABBITMQ_LOG_BASE", dir.0.join("log"))
                .env("RABBITMQ_ENABLED_PLUGINS_FILE", &plugins)
                .env("RABBITMQ_DIST_PORT", dist.to_string())
                .env("RABBITMQ_PID_FILE", dir.0.join("pid"));
            if let Some((uid, gid)) = user {
                use std::os::unix::process::CommandExt as _;
                // its Erlang cookie is in its home
                c.uid(uid).gid(gid).env("HOME", "/var/lib/rabbitmq");
            }
            c
        };
        let start = command("rabbitmq-server");
        let mut stop = command("rabbitmqctl");
        stop.args(["-n", &node, "stop"]);
        let daemon = Daemon::spawn(
            "rabbitmq",
            dir,
            start,
            Some(stop),
            port,
            Duration::from_secs(60),
        )?;
        Ok(TlsRabbitMq {
            port,
            _daemon: daemon,
        })
    }

    /// `amqps://guest:guest@127.0.0.1:<port>/%2f`.
    pub fn url(&self) -> String {
        self.url_as("amqps")
    }

    /// The URL with another scheme (`amqp`).
    pub fn url_as(&self, scheme: &str) -> String {
        format!("{scheme}://guest:guest@127.0.0.1:{}/%2f", self.port)
    }
}
