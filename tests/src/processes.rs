//! Child processes a test starts and kills: throw-away `redis-server`s and
//! Redis Clusters (with replicas, slots a test moves and masters it fails
//! over) on free loopback ports, each in a scratch directory of its
//! own, killed (SIGKILL) when their value drops, also when the test panics.

mod child;
mod cluster;
mod tansu;

pub use child::{ChildTest, LIBFAKETIME};
pub use cluster::{ClusterNode, RedisCluster, crc16_after, key_slot};
pub use tansu::TansuServer;

use std::time::Duration;

use crate::services::{redis_sync_conn, unavailable};

/// A free TCP port on loopback (bound once, then released).
pub fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// A directory of its own under the system temp dir, removed when dropped.
#[derive(Debug)]
pub(crate) struct ScratchDir(pub(crate) std::path::PathBuf);

impl ScratchDir {
    pub(crate) fn new(what: &str) -> std::io::Result<Self> {
        let salt = uuid::Uuid::new_v4().simple().to_string();
        let path = std::env::temp_dir().join(format!("idem-{what}-{}-{salt}", std::process::id()));
        std::fs::create_dir_all(&path)?;
        Ok(ScratchDir(path))
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// One `redis-server` child process; killed (SIGKILL) when dropped.
#[derive(Debug)]
struct Node {
    port: u16,
    args: Vec<String>,
    child: Option<std::process::Child>,
}

impl Node {
    /// Spawns `redis-server --port <port> <args>` and waits until it answers
    /// `PING` (at most 5 s).
    fn spawn(port: u16, args: Vec<String>, log: &std::path::Path) -> Result<Node, String> {
        let mut node = Node {
            port,
            args,
            child: None,
        };
        node.start(log)?;
        Ok(node)
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn start(&mut self, log: &std::path::Path) -> Result<(), String> {
        assert!(self.child.is_none(), "the node is running");
        let child = std::process::Command::new("redis-server")
            .arg("--port")
            .arg(self.port.to_string())
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(["--daemonize", "no", "--logfile"])
            .arg(log)
            .args(&self.args)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot run redis-server: {e}"))?;
        self.child = Some(child);
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                self.child = None;
                let log = std::fs::read_to_string(log).unwrap_or_default();
                return Err(format!("redis-server exited with {status}: {log}"));
            }
            let pong = redis_sync_conn(&self.url())
                .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c));
            if pong.is_ok() {
                return Ok(());
            }
            if std::time::Instant::now() > deadline {
                self.kill();
                return Err("redis-server did not answer PING within 5 s".to_owned());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// SIGKILL, and reap the process.
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A throw-away `redis-server` on a free loopback port, without persistence
/// (`--save "" --appendonly no`), for tests that kill and restart the server.
/// It is killed when this value drops, also when the test panics.
#[derive(Debug)]
pub struct RedisServer {
    node: Node,
    log: std::path::PathBuf,
    // Declared last: the directory goes after the process.
    _dir: ScratchDir,
}

impl RedisServer {
    /// Starts the server, or returns `None` (after [`unavailable`]) when
    /// `redis-server` is missing or will not start.
    pub fn start() -> Option<RedisServer> {
        Self::start_with(&[])
    }

    /// As [`start`](Self::start), with an append-only file synced at every
    /// write (`--appendonly yes --appendfsync always`): a restart forgets
    /// nothing, as a dedup Redis is advised to run.
    pub fn start_persistent() -> Option<RedisServer> {
        Self::start_with(&["--appendonly", "yes", "--appendfsync", "always"])
    }

    fn start_with(extra: &[&str]) -> Option<RedisServer> {
        let dir = match ScratchDir::new("redis") {
            Ok(d) => d,
            Err(e) => return unavailable("redis-server", "a temporary directory", e),
        };
        let log = dir.0.join("redis.log");
        let mut why = String::new();
        // A port found free may be taken before the server binds it: retry.
        for _ in 0..3 {
            let port = match free_port() {
                Ok(p) => p,
                Err(e) => return unavailable("redis-server", "127.0.0.1", e),
            };
            let mut args = vec!["--dir".to_owned(), dir.0.display().to_string()];
            args.extend(extra.iter().map(|a| (*a).to_owned()));
            match Node::spawn(port, args, &log) {
                Ok(node) => {
                    return Some(RedisServer {
                        node,
                        log,
                        _dir: dir,
                    });
                }
                Err(e) => why = e,
            }
        }
        unavailable("redis-server", "127.0.0.1 (a throw-away server)", why)
    }

    /// Its port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.node.port
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        self.node.url()
    }

    /// Kills the server with SIGKILL (no shutdown, no save) and waits for it.
    pub fn kill(&mut self) {
        self.node.kill();
    }

    /// Starts the server again on the same port, empty (it persisted
    /// nothing), and waits until it answers.
    pub fn restart(&mut self) {
        self.node.kill();
        self.node
            .start(&self.log)
            .unwrap_or_else(|e| panic!("restarting redis-server on port {}: {e}", self.node.port));
    }
}
