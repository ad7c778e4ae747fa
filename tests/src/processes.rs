//! Child processes a test starts and kills: throw-away `redis-server`s and
//! Redis Clusters on free loopback ports, each in a scratch directory of its
//! own, killed (SIGKILL) when their value drops, also when the test panics.

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
struct ScratchDir(std::path::PathBuf);

impl ScratchDir {
    fn new(what: &str) -> std::io::Result<Self> {
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

/// A throw-away Redis Cluster of masters only (no replicas) on free loopback
/// ports, in a temporary directory; every node is killed when this value
/// drops, also when the test panics.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<Node>,
    // Declared last: the directory goes after the processes.
    _dir: ScratchDir,
}

impl RedisCluster {
    /// Starts `masters` nodes with `cluster-enabled yes`, joins them with
    /// `redis-cli --cluster create` and waits until every node reports
    /// `cluster_state:ok`. Returns `None` (after [`unavailable`]) when
    /// `redis-server` or `redis-cli` is missing or the cluster does not form.
    pub fn start(masters: usize) -> Option<RedisCluster> {
        match Self::try_start(masters) {
            Ok(cluster) => Some(cluster),
            Err(why) => unavailable("Redis Cluster", "127.0.0.1 (a throw-away cluster)", why),
        }
    }

    fn try_start(masters: usize) -> Result<RedisCluster, String> {
        let dir = ScratchDir::new("redis-cluster").map_err(|e| e.to_string())?;
        let mut nodes = Vec::with_capacity(masters);
        for i in 0..masters {
            let mut last = String::new();
            for _ in 0..3 {
                let (port, bus) = match (free_port(), free_port()) {
                    (Ok(p), Ok(b)) if p != b => (p, b),
                    _ => continue,
                };
                let args = vec![
                    "--dir".to_owned(),
                    dir.0.display().to_string(),
                    "--cluster-enabled".to_owned(),
                    "yes".to_owned(),
                    "--cluster-config-file".to_owned(),
                    dir.0
                        .join(format!("nodes-{port}.conf"))
                        .display()
                        .to_string(),
                    "--cluster-port".to_owned(),
                    bus.to_string(),
                ];
                match Node::spawn(port, args, &dir.0.join(format!("redis-{i}.log"))) {
                    Ok(node) => {
                        nodes.push(node);
                        break;
                    }
                    Err(e) => last = e,
                }
            }
            if nodes.len() != i + 1 {
                return Err(format!("node {i}: {last}"));
            }
        }
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let created = std::process::Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdin(std::process::Stdio::null())
            .output()
            .map_err(|e| format!("cannot run redis-cli: {e}"))?;
        if !created.status.success() {
            return Err(format!(
                "redis-cli --cluster create failed: {}{}",
                String::from_utf8_lossy(&created.stdout),
                String::from_utf8_lossy(&created.stderr)
            ));
        }
        let cluster = RedisCluster { nodes, _dir: dir };
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        for node in &cluster.nodes {
            loop {
                let info = redis_sync_conn(&node.url())
                    .and_then(|mut c| redis::cmd("CLUSTER").arg("INFO").query::<String>(&mut c));
                if info
                    .as_deref()
                    .is_ok_and(|i| i.contains("cluster_state:ok"))
                {
                    break;
                }
                if std::time::Instant::now() > deadline {
                    return Err(format!(
                        "node {} never reported cluster_state:ok: {info:?}",
                        node.port
                    ));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Ok(cluster)
    }

    /// The nodes' URLs, `redis://127.0.0.1:<port>`.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(Node::url).collect()
    }
}

/// A throw-away tansu (a Kafka-API broker, in memory) on a free loopback
/// port, advertising to clients the address of the test's choosing (a
/// [`CutProxy`](crate::brokers::CutProxy) in front of it, say); killed
/// (SIGKILL) when dropped.
#[derive(Debug)]
pub struct TansuServer {
    child: std::process::Child,
    port: u16,
}

impl TansuServer {
    /// Starts tansu advertising `127.0.0.1:<advertised>`, or returns `None`
    /// (after [`unavailable`]) when it is not installed or will not start.
    pub fn start(advertised: u16) -> Option<TansuServer> {
        let port = match free_port() {
            Ok(p) => p,
            Err(e) => return unavailable("tansu", "a free port", e),
        };
        let listen = format!("tcp://127.0.0.1:{port}");
        let advertise = format!("tcp://127.0.0.1:{advertised}");
        let child = std::process::Command::new(crate::brokers::tansu_program())
            .args([
                "broker",
                "--listener-url",
                &listen,
                "--advertised-listener-url",
                &advertise,
            ])
            .args(["--storage-engine", "memory://tansu/"])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn();
        let child = match child {
            Ok(c) => c,
            Err(e) => {
                return unavailable(
                    "tansu",
                    "its binary (cargo install tansu --version 0.6.0 --locked --features dynostore)",
                    e,
                );
            }
        };
        let server = TansuServer { child, port };
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if std::time::Instant::now() > deadline {
                return unavailable("tansu", &listen, "it did not listen within 5 s");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Some(server)
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }
}

impl Drop for TansuServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Where Debian's `faketime` package puts libfaketime.
pub const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// One test of the running test binary, run as a child process (`<test>
/// --exact --ignored --nocapture`): a second consumer, in a process of its
/// own, as the chaos tests run theirs. It talks on its stdout (lines the
/// parent waits for) and listens on its stdin; it is killed when this value
/// drops, also when the test panics.
#[derive(Debug)]
pub struct ChildTest {
    child: std::process::Child,
    stdin: Option<std::process::ChildStdin>,
    lines: tokio::sync::mpsc::UnboundedReceiver<String>,
}

impl ChildTest {
    /// Runs `test` (an `#[ignore]`d test of this binary) with `env` added to
    /// its environment.
    pub fn spawn(test: &str, env: &[(&str, &str)]) -> ChildTest {
        let exe = std::env::current_exe().expect("the test binary");
        let mut command = std::process::Command::new(exe);
        command
            .args([test, "--exact", "--ignored", "--nocapture"])
            .args(["--test-threads=1"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit());
        for (name, value) in env {
            command.env(name, value);
        }
        let mut child = command.spawn().expect("start the child test");
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().expect("the child's stdout");
        let (tx, lines) = tokio::sync::mpsc::unbounded_channel();
        // Read on a thread of its own, so the child never blocks on a full
        // pipe and the parent's runtime never blocks on a read.
        std::thread::spawn(move || {
            use std::io::BufRead as _;
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        ChildTest {
            child,
            stdin,
            lines,
        }
    }

    /// What follows `prefix` on the next line of the child's that holds it
    /// (other lines are skipped); panics after `within`, or when the child
    /// ends first.
    pub async fn line(&mut self, prefix: &str, within: Duration) -> String {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            match tokio::time::timeout_at(deadline, self.lines.recv()).await {
                Ok(Some(line)) => {
                    // Anywhere in the line: libtest's `test name ... ` may
                    // come first.
                    if let Some(at) = line.find(prefix) {
                        return line[at + prefix.len()..].trim().to_owned();
                    }
                }
                Ok(None) => panic!("the child test ended before it printed {prefix:?}"),
                Err(_) => panic!("the child test printed no {prefix:?} within {within:?}"),
            }
        }
    }

    /// Writes `line` to the child's stdin.
    pub fn send(&mut self, line: &str) {
        use std::io::Write as _;
        let stdin = self.stdin.as_mut().expect("the child's stdin");
        writeln!(stdin, "{line}").expect("write to the child");
        stdin.flush().expect("flush to the child");
    }

    /// Kills the child with SIGKILL (no unwinding, no destructors, no
    /// shutdown of its sockets or transactions but the kernel's) and reaps
    /// it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits (at most `within`) for the child to exit; panics unless it
    /// succeeded.
    pub async fn finish(mut self, within: Duration) {
        let deadline = std::time::Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().expect("the child's status") {
                assert!(status.success(), "the child test failed: {status}");
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the child test did not exit within {within:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for ChildTest {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
