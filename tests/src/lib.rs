//! Helpers for idem's integration tests: where the servers are, and what a
//! test does when one is unreachable.
//!
//! A test that needs a server asks for it through one of the functions here.
//! When the server cannot be reached the test prints why and returns early
//! (skips), unless `IDEM_REQUIRE_SERVICES=1`, in which case it panics: CI
//! sets that, so a missing server fails the build instead of hiding tests.

pub mod brokers;

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// `true` when `IDEM_REQUIRE_SERVICES=1`: unreachable servers fail tests.
pub fn services_required() -> bool {
    std::env::var("IDEM_REQUIRE_SERVICES").is_ok_and(|v| v == "1")
}

/// Reports an unreachable service: panics when services are required,
/// otherwise prints a skip line. Returns `None` so callers can `?`-style skip.
pub fn unavailable<T>(service: &str, url: &str, why: impl std::fmt::Display) -> Option<T> {
    let msg = format!("{service} at {url} is unreachable ({why})");
    if services_required() {
        panic!("{msg}; IDEM_REQUIRE_SERVICES=1 makes this a failure");
    }
    eprintln!("SKIPPED: {msg}; set IDEM_REQUIRE_SERVICES=1 to fail instead");
    None
}

/// The PostgreSQL URL: `DATABASE_URL`, or the loopback default.
pub fn pg_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// A unique, valid table name for one test, so tests run in parallel.
pub fn unique_table(prefix: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let salt = uuid::Uuid::new_v4().simple().to_string();
    format!("{prefix}_{}_{n}_{}", std::process::id(), &salt[..8])
}

/// Skips the calling test (returns from it) when the expression is `None`.
#[macro_export]
macro_rules! or_skip {
    ($e:expr) => {
        match $e {
            Some(v) => v,
            None => return,
        }
    };
}

/// A PostgreSQL pool, or `None` (after [`unavailable`]) when the server
/// cannot be reached.
pub async fn pg_pool(max_connections: u32) -> Option<sqlx::PgPool> {
    let url = pg_url();
    let connect = sqlx::postgres::PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(10))
        .connect(&url);
    match tokio::time::timeout(Duration::from_secs(10), connect).await {
        Ok(Ok(pool)) => Some(pool),
        Ok(Err(e)) => unavailable("PostgreSQL", &url, e),
        Err(_) => unavailable("PostgreSQL", &url, "connect timed out"),
    }
}

/// Drops the named tables when dropped, so tests leave nothing behind even
/// when they fail.
pub struct DropTables {
    tables: Vec<String>,
}

impl DropTables {
    /// Drops `tables` from the PostgreSQL database at the end of the scope.
    pub fn new(tables: &[&str]) -> Self {
        DropTables {
            tables: tables.iter().map(|t| (*t).to_owned()).collect(),
        }
    }
}

impl Drop for DropTables {
    fn drop(&mut self) {
        let sql = format!("DROP TABLE IF EXISTS {} CASCADE", self.tables.join(", "));
        // A fresh thread, runtime and connection: the test's runtime may be
        // shutting down, and its connections belong to it.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            if let Ok(rt) = rt {
                rt.block_on(async move {
                    use sqlx::Connection as _;
                    if let Ok(mut conn) = sqlx::PgConnection::connect(&pg_url()).await {
                        let _ = sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                            .execute(&mut conn)
                            .await;
                    }
                });
            }
        })
        .join();
    }
}

// ---------------------------------------------------------------------------
// MariaDB / MySQL
// ---------------------------------------------------------------------------

/// The MariaDB (or MySQL) URL: `MYSQL_URL`, or the loopback default.
pub fn mysql_url() -> String {
    std::env::var("MYSQL_URL").unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".to_owned())
}

/// A MariaDB pool whose sessions wait at most `lock_wait_secs` on a row lock
/// (`innodb_lock_wait_timeout`), or `None` (after [`unavailable`]) when the
/// server cannot be reached.
pub async fn mysql_pool(max_connections: u32, lock_wait_secs: u32) -> Option<sqlx::MySqlPool> {
    let url = mysql_url();
    let connect = sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(10))
        .after_connect(move |conn, _| {
            Box::pin(async move {
                sqlx::query("SET SESSION innodb_lock_wait_timeout = ?")
                    .bind(lock_wait_secs)
                    .execute(conn)
                    .await
                    .map(drop)
            })
        })
        .connect(&url);
    match tokio::time::timeout(Duration::from_secs(10), connect).await {
        Ok(Ok(pool)) => Some(pool),
        Ok(Err(e)) => unavailable("MariaDB", &url, e),
        Err(_) => unavailable("MariaDB", &url, "connect timed out"),
    }
}

/// Drops the named tables from the MariaDB database of [`mysql_url`] when
/// dropped, so tests leave nothing behind even when they fail.
pub struct DropMySqlTables {
    tables: Vec<String>,
}

impl DropMySqlTables {
    /// Drops `tables` at the end of the scope.
    pub fn new(tables: &[&str]) -> Self {
        DropMySqlTables {
            tables: tables.iter().map(|t| (*t).to_owned()).collect(),
        }
    }
}

impl Drop for DropMySqlTables {
    fn drop(&mut self) {
        let sql = format!("DROP TABLE IF EXISTS {}", self.tables.join(", "));
        // A fresh thread, runtime and connection, as for `DropTables`. A
        // failed test may leave a transaction open on the table (its
        // rollback waits for the test's runtime, which this blocks): give up
        // on the table after 10 s rather than wait for ever.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            if let Ok(rt) = rt {
                rt.block_on(async move {
                    use sqlx::Connection as _;
                    if let Ok(mut conn) = sqlx::MySqlConnection::connect(&mysql_url()).await {
                        let sql = format!("SET SESSION lock_wait_timeout = 10; {sql}");
                        let _ = sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                            .execute(&mut conn)
                            .await;
                    }
                });
            }
        })
        .join();
    }
}

// ---------------------------------------------------------------------------
// Redis
// ---------------------------------------------------------------------------

/// The Redis URL: `REDIS_URL`, or the loopback default.
pub fn redis_url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
}

/// A unique Redis key prefix for one test (see [`unique_table`]), so tests
/// sharing one server run in parallel; [`DeleteKeys`] removes its keys.
pub fn unique_prefix(name: &str) -> String {
    unique_table(name)
}

/// A [`RedisStore`](idem_runtime::RedisStore) on the server of
/// [`redis_url`] whose keys all start with `prefix:`, or `None` (after
/// [`unavailable`]) when the server cannot be reached. Pair it with a
/// [`DeleteKeys`] guard for the same prefix.
pub async fn redis_store(prefix: &str) -> Option<idem_runtime::RedisStore> {
    let url = redis_url();
    let connect = idem_runtime::RedisStore::connect(&url);
    let store = match tokio::time::timeout(Duration::from_secs(10), connect).await {
        Ok(Ok(store)) => store,
        Ok(Err(e)) => return unavailable("Redis", &url, e),
        Err(_) => return unavailable("Redis", &url, "connect timed out"),
    };
    Some(store.with_prefix(prefix).expect("a valid key prefix"))
}

/// Deletes every key `prefix:*` from one Redis server when dropped, so a
/// test leaves nothing behind even when it fails.
#[derive(Debug)]
pub struct DeleteKeys {
    url: String,
    pattern: String,
}

impl DeleteKeys {
    /// Deletes the keys under `prefix` (as given to
    /// [`RedisStore::with_prefix`](idem_runtime::RedisStore::with_prefix))
    /// from the server at `url` at the end of the scope.
    pub fn new(url: &str, prefix: &str) -> Self {
        assert!(
            prefix
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_'),
            "a prefix without glob characters: {prefix:?}"
        );
        DeleteKeys {
            url: url.to_owned(),
            pattern: format!("{prefix}:*"),
        }
    }

    /// The keys that match the prefix now (`SCAN MATCH prefix:*`).
    pub fn keys(&self) -> redis::RedisResult<Vec<String>> {
        let mut conn = sync_conn(&self.url)?;
        scan(&mut conn, &self.pattern)
    }
}

impl Drop for DeleteKeys {
    fn drop(&mut self) {
        // A synchronous connection of its own: the test's runtime may be
        // shutting down. Failures are ignored (the server may be gone).
        let Ok(mut conn) = sync_conn(&self.url) else {
            return;
        };
        if let Ok(keys) = scan(&mut conn, &self.pattern) {
            for chunk in keys.chunks(500) {
                let _: redis::RedisResult<i64> = redis::cmd("DEL").arg(chunk).query(&mut conn);
            }
        }
    }
}

fn sync_conn(url: &str) -> redis::RedisResult<redis::Connection> {
    let conn = redis::Client::open(url)?.get_connection_with_timeout(Duration::from_secs(2))?;
    conn.set_read_timeout(Some(Duration::from_secs(5)))?;
    conn.set_write_timeout(Some(Duration::from_secs(5)))?;
    Ok(conn)
}

fn scan(conn: &mut redis::Connection, pattern: &str) -> redis::RedisResult<Vec<String>> {
    let mut keys = Vec::new();
    let mut cursor = 0u64;
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000)
            .query(conn)?;
        keys.extend(batch);
        if next == 0 {
            return Ok(keys);
        }
        cursor = next;
    }
}

/// A free TCP port on loopback (bound once, then released).
fn free_port() -> std::io::Result<u16> {
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
            let pong =
                sync_conn(&self.url()).and_then(|mut c| redis::cmd("PING").query::<String>(&mut c));
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
                let info = sync_conn(&node.url())
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
