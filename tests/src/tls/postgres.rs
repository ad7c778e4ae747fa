//! A PostgreSQL cluster of the test's own that takes TLS only.

use std::process::Command;
use std::time::Duration;

use super::certs::{Certs, MTLS_USER};
use super::daemon::{Daemon, ServerError, as_user, chown, run};
use crate::processes::free_port;

/// A cluster made by `initdb` on a free port: `ssl = on`, every TCP
/// connection must be TLS (`hostnossl ... reject`), and [`MTLS_USER`] must
/// present a client certificate that names it (`clientcert=verify-full`).
/// It listens on 127.0.0.1 and 127.0.0.2 (its certificate names only the
/// first). Database `test`; users `postgres` and [`MTLS_USER`], without
/// passwords.
#[derive(Debug)]
pub struct TlsPostgres {
    port: u16,
    _daemon: Daemon,
}

impl TlsPostgres {
    /// Makes and starts the cluster (a few seconds).
    pub fn start(certs: &Certs) -> Result<TlsPostgres, ServerError> {
        let bin = bindir()?;
        let dir = Daemon::dir("pg-tls")?;
        let user = as_user("postgres");
        if let Some(user) = user {
            chown(&dir.0, user)?;
        }
        let data = dir.0.join("data");
        let as_postgres = |program: &str| {
            let mut c = Command::new(bin.join(program));
            if let Some((uid, gid)) = user {
                use std::os::unix::process::CommandExt as _;
                c.uid(uid).gid(gid);
            }
            c
        };
        let mut initdb = as_postgres("initdb");
        initdb.arg("-D").arg(&data).args([
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-sync",
        ]);
        run(initdb)?;
        let server = certs.server();
        let copy = |from: &std::path::Path, to: &str| {
            std::fs::copy(from, data.join(to)).map_err(|e| format!("{to}: {e}"))
        };
        copy(&server.cert, "server.crt")?;
        copy(&server.key, "server.key")?;
        copy(&certs.ca(), "root.crt")?;
        {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(
                data.join("server.key"),
                std::fs::Permissions::from_mode(0o600),
            )
            .map_err(|e| format!("server.key: {e}"))?;
        }
        let port = free_port().map_err(|e| ServerError::Failed(e.to_string()))?;
        let conf = format!(
            "\nport = {port}\nlisten_addresses = '127.0.0.1,127.0.0.2'\nunix_socket_directories = '{}'\n\
             ssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\nssl_ca_file = 'root.crt'\n\
             fsync = off\nshared_buffers = 16MB\nmax_connections = 40\n",
            dir.0.display()
        );
        append(&data.join("postgresql.conf"), &conf)?;
        std::fs::write(
            data.join("pg_hba.conf"),
            format!(
                "local all all trust\n\
                 hostssl all {MTLS_USER} 127.0.0.0/8 trust clientcert=verify-full\n\
                 hostssl all all 127.0.0.0/8 trust\n\
                 hostnossl all all 0.0.0.0/0 reject\n"
            ),
        )
        .map_err(|e| format!("pg_hba.conf: {e}"))?;
        if let Some(user) = user {
            chown(&data, user)?;
        }
        let mut postgres = as_postgres("postgres");
        postgres.arg("-D").arg(&data);
        let mut stop = as_postgres("pg_ctl");
        stop.arg("-D").arg(&data).args(["stop", "-m", "immediate"]);
        let daemon = Daemon::spawn(
            "postgres",
            dir,
            postgres,
            Some(stop),
            port,
            Duration::from_secs(30),
        )?;
        // over the socket, where TLS is not asked
        let socket = daemon.path().to_owned();
        let psql = |sql: &str| {
            let mut c = Command::new(bin.join("psql"));
            c.arg("-h")
                .arg(&socket)
                .args(["-p", &port.to_string(), "-U", "postgres", "-d", "postgres"])
                .args(["-v", "ON_ERROR_STOP=1", "-c", sql]);
            run(c)
        };
        // the postmaster listens before it takes logins
        let mut tries = 0;
        while let Err(e) = psql("SELECT 1") {
            tries += 1;
            if tries > 100 {
                return Err(ServerError::Failed(format!("{e}\n{}", daemon.log_tail())));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        psql(&format!("CREATE ROLE {MTLS_USER} LOGIN SUPERUSER"))?;
        psql("CREATE DATABASE test")?;
        Ok(TlsPostgres {
            port,
            _daemon: daemon,
        })
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `postgres://postgres@127.0.0.1:<port>/test`, with `query` (such as
    /// `sslmode=verify-full&sslrootcert=...`) when not empty.
    pub fn url(&self, query: &str) -> String {
        self.url_as("postgres", "127.0.0.1", query)
    }

    /// The URL of `user` at `host`.
    pub fn url_as(&self, user: &str, host: &str, query: &str) -> String {
        let mut url = format!("postgres://{user}@{host}:{}/test", self.port);
        if !query.is_empty() {
            url.push('?');
            url.push_str(query);
        }
        url
    }
}

/// The newest installed PostgreSQL's programs.
fn bindir() -> Result<std::path::PathBuf, ServerError> {
    let mut found: Vec<(u32, std::path::PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .map_err(|e| {
            ServerError::Missing(format!("PostgreSQL's programs (/usr/lib/postgresql): {e}"))
        })?
        .filter_map(Result::ok)
        .filter_map(|e| {
            let version = e.file_name().to_string_lossy().parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .collect();
    found.sort();
    found
        .pop()
        .map(|(_, bin)| bin)
        .ok_or_else(|| ServerError::Missing("no initdb under /usr/lib/postgresql/*/bin".to_owned()))
}

fn append(path: &std::path::Path, text: &str) -> Result<(), String> {
    use std::io::Write as _;
    std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .map_err(|e| format!("{}: {e}", path.display()))
}
