//! Redis Clusters: masters (with replicas) started together, slots moved
//! by hand, masters failed over or killed; the slot of a key.

use std::time::Duration;

use super::{Node, ScratchDir, free_port};
use crate::services::{redis_sync_conn, unavailable};

/// A throw-away Redis Cluster on free loopback ports, in a temporary
/// directory: masters only ([`start`](Self::start)), or masters with
/// replicas ([`start_with_replicas`](Self::start_with_replicas)) for tests
/// that move slots between masters and fail masters over. Every node is
/// killed (SIGKILL) when this value drops, also when the test panics.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<Node>,
    // Declared last: the directory goes after the processes.
    _dir: ScratchDir,
}

/// One node of a [`RedisCluster`] as `CLUSTER NODES` describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterNode {
    /// The node's id (40 hex digits).
    pub id: String,
    /// Its port on 127.0.0.1.
    pub port: u16,
    /// Whether it is a master (else a replica).
    pub master: bool,
    /// A replica's master's id.
    pub replica_of: Option<String>,
    /// Whether the node that described it flags it as failing (`fail` or
    /// `fail?`).
    pub failing: bool,
    /// The slot ranges it serves, both ends included.
    pub slots: Vec<(u16, u16)>,
}

impl ClusterNode {
    /// Whether it serves `slot`.
    pub fn serves(&self, slot: u16) -> bool {
        self.slots.iter().any(|&(a, b)| a <= slot && slot <= b)
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

/// The Redis Cluster slot of `key`, as `CLUSTER KEYSLOT` computes it: CRC16
/// (XMODEM) of its hash tag (the text between the first `{` and the first
/// `}` after it, when not empty), or of the whole key, modulo 16384.
pub fn key_slot(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|b| *b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        let close = rest.iter().position(|b| *b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    crc16_after(0, tagged.unwrap_or(key)) & 0x3fff
}

/// CRC16 (XMODEM) of `bytes` continued from `crc` (0 to start), as Redis
/// computes slots: a test that tries many keys sharing a prefix computes
/// the prefix's once.
pub fn crc16_after(mut crc: u16, bytes: &[u8]) -> u16 {
    for byte in bytes {
        crc = (crc << 8) ^ CRC16[usize::from((crc >> 8) as u8 ^ byte)];
    }
    crc
}

/// CRC16 (XMODEM, polynomial 0x1021) of each byte, for [`key_slot`].
const CRC16: [u16; 256] = {
    let mut table = [0u16; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = (i as u16) << 8;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 0x8000 == 0 {
                crc << 1
            } else {
                (crc << 1) ^ 0x1021
            };
            bit += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
};

/// A synchronous connection to the node on `port`, or why not.
fn node_conn(port: u16) -> Result<redis::Connection, String> {
    redis_sync_conn(&format!("redis://127.0.0.1:{port}")).map_err(|e| format!("node {port}: {e}"))
}

/// Runs `cmd` on the node on `port`.
fn on_node<T: redis::FromRedisValue>(port: u16, cmd: &redis::Cmd) -> Result<T, String> {
    cmd.query(&mut node_conn(port)?)
        .map_err(|e| format!("node {port}: {e}"))
}

/// A field `name:value` of an `INFO` section.
fn info_field<'a>(info: &'a str, name: &str) -> Option<&'a str> {
    info.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .map(str::trim)
}

/// `CLUSTER SETSLOT <slot> <state> <id>` on the node on `port`.
fn setslot(port: u16, slot: u16, state: &str, id: &str) -> Result<(), String> {
    on_node(
        port,
        redis::cmd("CLUSTER")
            .arg("SETSLOT")
            .arg(slot)
            .arg(state)
            .arg(id),
    )
}

/// `CLUSTER NODES` as [`ClusterNode`]s.
fn parse_nodes(text: &str) -> Result<Vec<ClusterNode>, String> {
    let mut nodes = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let bad = || format!("unexpected CLUSTER NODES line: {line}");
        if fields.len() < 8 {
            return Err(bad());
        }
        let addr = fields[1].split('@').next().ok_or_else(bad)?;
        let port = addr
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .ok_or_else(bad)?;
        let flags: Vec<&str> = fields[2].split(',').collect();
        let mut slots = Vec::new();
        // Importing and migrating slots (`[...]`) are the describing node's
        // own state, not served slots.
        for range in fields[8..].iter().filter(|s| !s.starts_with('[')) {
            let (a, b) = range.split_once('-').unwrap_or((range, range));
            slots.push((a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?));
        }
        nodes.push(ClusterNode {
            id: fields[0].to_owned(),
            port,
            master: flags.contains(&"master"),
            replica_of: (fields[3] != "-").then(|| fields[3].to_owned()),
            failing: flags.iter().any(|f| f.starts_with("fail")),
            slots,
        });
    }
    Ok(nodes)
}

/// Polls `step` every 20 ms until it answers `Some`, or fails after
/// `within` with the last reason it gave.
fn poll<T>(
    within: Duration,
    what: &str,
    mut step: impl FnMut() -> Result<T, String>,
) -> Result<T, String> {
    let deadline = std::time::Instant::now() + within;
    loop {
        match step() {
            Ok(v) => return Ok(v),
            Err(why) if std::time::Instant::now() > deadline => {
                return Err(format!("{what} within {within:?}: {why}"));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

impl RedisCluster {
    /// Starts `masters` nodes with `cluster-enabled yes`, joins them with
    /// `redis-cli --cluster create` and waits until every node reports
    /// `cluster_state:ok`. Returns `None` (after [`unavailable`]) when
    /// `redis-server` or `redis-cli` is missing or the cluster does not form.
    pub fn start(masters: usize) -> Option<RedisCluster> {
        match Self::try_start(masters, 0) {
            Ok(cluster) => Some(cluster),
            Err(why) => unavailable("Redis Cluster", "127.0.0.1 (a throw-away cluster)", why),
        }
    }

    /// As [`start`](Self::start), with `replicas` replicas of each master,
    /// for tests that fail masters over: `cluster-node-timeout` is 2000 ms
    /// (a killed master's replica takes over a few seconds later),
    /// `cluster-replica-validity-factor 0` (a replica may take over however
    /// long it was cut off), replicas never migrate to another master, and
    /// replication is diskless without delay. Waits until every replica's
    /// link to its master is up.
    pub fn start_with_replicas(masters: usize, replicas: usize) -> Option<RedisCluster> {
        match Self::try_start(masters, replicas) {
            Ok(cluster) => Some(cluster),
            Err(why) => unavailable(
                "Redis Cluster with replicas",
                "127.0.0.1 (a throw-away cluster)",
                why,
            ),
        }
    }

    fn try_start(masters: usize, replicas: usize) -> Result<RedisCluster, String> {
        let dir = ScratchDir::new("redis-cluster").map_err(|e| e.to_string())?;
        let count = masters * (1 + replicas);
        let mut nodes = Vec::with_capacity(count);
        for i in 0..count {
            let mut last = String::new();
            for _ in 0..3 {
                let (port, bus) = match (free_port(), free_port()) {
                    (Ok(p), Ok(b)) if p != b => (p, b),
                    _ => continue,
                };
                let mut args = vec![
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
                if replicas > 0 {
                    for (name, value) in [
                        ("--cluster-node-timeout", "2000"),
                        ("--cluster-replica-validity-factor", "0"),
                        ("--cluster-allow-replica-migration", "no"),
                        ("--repl-diskless-sync", "yes"),
                        ("--repl-diskless-sync-delay", "0"),
                    ] {
                        args.push(name.to_owned());
                        args.push(value.to_owned());
                    }
                }
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
            .arg("--cluster-replicas")
            .arg(replicas.to_string())
            .arg("--cluster-yes")
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
        cluster.wait_settled(Duration::from_secs(20))?;
        if replicas > 0 {
            // Every node knows every replica as one (gossip tells them).
            poll(Duration::from_secs(20), "every replica known", || {
                for port in cluster.live_ports() {
                    let text: String = on_node(port, redis::cmd("CLUSTER").arg("NODES"))?;
                    let known = parse_nodes(&text)?
                        .iter()
                        .filter(|n| n.replica_of.is_some())
                        .count();
                    if known != masters * replicas {
                        return Err(format!("node {port} knows {known} replicas"));
                    }
                }
                Ok(())
            })?;
            for node in cluster.topology()?.iter().filter(|n| !n.master) {
                poll(Duration::from_secs(20), "a replica in sync", || {
                    let info: String = on_node(node.port, redis::cmd("INFO").arg("replication"))?;
                    match info_field(&info, "master_link_status") {
                        Some("up") => Ok(()),
                        other => Err(format!("node {}: link {other:?}", node.port)),
                    }
                })?;
            }
        }
        Ok(cluster)
    }

    /// The nodes' URLs, `redis://127.0.0.1:<port>`, killed ones included.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(Node::url).collect()
    }

    /// The ports of the nodes that run (not killed).
    fn live_ports(&self) -> Vec<u16> {
        self.nodes
            .iter()
            .filter(|n| n.child.is_some())
            .map(|n| n.port)
            .collect()
    }

    /// The cluster as the first running node that answers describes it.
    pub fn topology(&self) -> Result<Vec<ClusterNode>, String> {
        let mut why = String::from("no node runs");
        for port in self.live_ports() {
            match on_node::<String>(port, redis::cmd("CLUSTER").arg("NODES")) {
                Ok(text) => return parse_nodes(&text),
                Err(e) => why = e,
            }
        }
        Err(why)
    }

    /// The master that serves `slot`.
    pub fn owner(&self, slot: u16) -> Result<ClusterNode, String> {
        self.topology()?
            .into_iter()
            .find(|n| n.master && !n.failing && n.serves(slot))
            .ok_or_else(|| format!("no master serves slot {slot}"))
    }

    /// The replica of `master` that does not fail, if any.
    pub fn replica_of(&self, master: &ClusterNode) -> Result<ClusterNode, String> {
        self.topology()?
            .into_iter()
            .find(|n| n.replica_of.as_deref() == Some(&master.id) && !n.failing)
            .ok_or_else(|| format!("master {} has no live replica", master.port))
    }

    /// Waits until every running node reports `cluster_state:ok` and they
    /// all agree on which master serves which slots.
    pub fn wait_settled(&self, within: Duration) -> Result<(), String> {
        poll(within, "the cluster settled", || {
            let mut views = Vec::new();
            for port in self.live_ports() {
                let info: String = on_node(port, redis::cmd("CLUSTER").arg("INFO"))?;
                if info_field(&info, "cluster_state") != Some("ok") {
                    return Err(format!("node {port}: {info}"));
                }
                let text: String = on_node(port, redis::cmd("CLUSTER").arg("NODES"))?;
                let mut owners: Vec<(u16, Vec<(u16, u16)>)> = parse_nodes(&text)?
                    .into_iter()
                    .filter(|n| n.master && !n.slots.is_empty())
                    .map(|n| (n.port, n.slots))
                    .collect();
                owners.sort();
                views.push((port, owners));
            }
            match views.windows(2).find(|w| w[0].1 != w[1].1) {
                Some(w) => Err(format!("nodes disagree: {:?} vs {:?}", w[0], w[1])),
                None => Ok(()),
            }
        })
    }

    /// Moves `slot` from the master that serves it to `to`, by hand, as
    /// Redis's cluster specification describes resharding:
    /// [`begin_migration`](Self::begin_migration), then
    /// [`move_keys`](Self::move_keys) with `pace` between keys (so clients
    /// meet the slot half moved, and are answered `ASK`), then
    /// [`end_migration`](Self::end_migration). Answers how many keys moved.
    pub fn migrate_slot(
        &self,
        slot: u16,
        to: &ClusterNode,
        pace: Duration,
    ) -> Result<usize, String> {
        let from = self.owner(slot)?;
        if from.id == to.id {
            return Ok(0);
        }
        self.begin_migration(slot, &from, to)?;
        let moved = self.move_keys(slot, &from, to, pace)?;
        self.end_migration(slot, &from, to)?;
        Ok(moved)
    }

    /// `to` imports `slot` from `from`, which migrates it (`CLUSTER SETSLOT
    /// ... IMPORTING` on `to`, then `MIGRATING` on `from`): from now on
    /// `from` serves the keys it still has and answers `ASK` for the others,
    /// and `to` serves a key of the slot only to a client that sent `ASKING`
    /// first.
    pub fn begin_migration(
        &self,
        slot: u16,
        from: &ClusterNode,
        to: &ClusterNode,
    ) -> Result<(), String> {
        setslot(to.port, slot, "IMPORTING", &from.id)?;
        setslot(from.port, slot, "MIGRATING", &to.id)
    }

    /// Moves every key of `slot` that `from` still has to `to`, one
    /// `MIGRATE ... KEYS` at a time with `pace` between them, until `from`
    /// has none. Without `REPLACE`: a key that exists on `to` already
    /// (written there while it only imported the slot, which no client may
    /// do without `ASKING`, nor a command whose key `from` still has) fails
    /// the move, as it fails `redis-cli --cluster reshard`. Answers how many
    /// keys moved.
    pub fn move_keys(
        &self,
        slot: u16,
        from: &ClusterNode,
        to: &ClusterNode,
        pace: Duration,
    ) -> Result<usize, String> {
        let mut moved = 0;
        // A slot that filled under a storm holds thousands of keys, each
        // moved `pace` apart: 30 s ran out once on a busy machine.
        let deadline = std::time::Instant::now() + Duration::from_secs(90);
        let mut conn = node_conn(from.port)?;
        let failed = |what: String| move |e: redis::RedisError| format!("{what}: {e}");
        loop {
            let keys: Vec<Vec<u8>> = redis::cmd("CLUSTER")
                .arg("GETKEYSINSLOT")
                .arg(slot)
                .arg(16)
                .query(&mut conn)
                .map_err(failed(format!("GETKEYSINSLOT on {}", from.port)))?;
            if keys.is_empty() {
                return Ok(moved);
            }
            for key in keys {
                let reply: String = redis::cmd("MIGRATE")
                    .arg("127.0.0.1")
                    .arg(to.port)
                    .arg("")
                    .arg(0)
                    .arg(5000)
                    .arg("KEYS")
                    .arg(&key)
                    .query(&mut conn)
                    .map_err(failed(format!(
                        "MIGRATE {} from {} to {}",
                        String::from_utf8_lossy(&key),
                        from.port,
                        to.port
                    )))?;
                if reply == "OK" {
                    moved += 1;
                }
                std::thread::sleep(pace);
            }
            if std::time::Instant::now() > deadline {
                return Err(format!(
                    "slot {slot} still had keys on {} after 90 s",
                    from.port
                ));
            }
        }
    }

    /// Every master learns that `to` serves `slot` (`CLUSTER SETSLOT ...
    /// NODE`, on `to` first, then on `from`, then on the others).
    pub fn end_migration(
        &self,
        slot: u16,
        from: &ClusterNode,
        to: &ClusterNode,
    ) -> Result<(), String> {
        setslot(to.port, slot, "NODE", &to.id)?;
        setslot(from.port, slot, "NODE", &to.id)?;
        // The others would learn it by gossip; telling them saves them the
        // wait (a node that is no master by now refuses, and needs not know).
        for node in self.topology()?.iter().filter(|n| n.master && !n.failing) {
            if node.id != to.id && node.id != from.id {
                let _ = setslot(node.port, slot, "NODE", &to.id);
            }
        }
        Ok(())
    }

    /// A manual failover: `CLUSTER FAILOVER` on `replica`, which waits for
    /// its master to stop taking writes and to have replicated them all,
    /// then takes its slots over; returns once the cluster agrees on it.
    pub fn failover(&self, replica: &ClusterNode, within: Duration) -> Result<(), String> {
        on_node::<()>(replica.port, redis::cmd("CLUSTER").arg("FAILOVER"))?;
        self.wait_promoted(replica, within)
    }

    /// Waits until `replica` calls itself a master and the cluster agrees.
    pub fn wait_promoted(&self, replica: &ClusterNode, within: Duration) -> Result<(), String> {
        let started = std::time::Instant::now();
        poll(within, "the replica promoted", || {
            let role: Vec<redis::Value> = on_node(replica.port, &redis::cmd("ROLE"))?;
            match role.first() {
                Some(redis::Value::BulkString(r)) if r == b"master" => Ok(()),
                other => Err(format!("node {}: role {other:?}", replica.port)),
            }
        })?;
        self.wait_settled(within.saturating_sub(started.elapsed()))
    }

    /// Stops `master` taking writes (`CLIENT PAUSE <ms> WRITE`: a write
    /// waits, unanswered, until the pause ends or the node dies) and waits
    /// until `replica` has everything the master wrote (its replication
    /// offset reaches the master's): every write the master acknowledged is
    /// then on the replica.
    pub fn pause_writes_until_replicated(
        &self,
        master: &ClusterNode,
        replica: &ClusterNode,
        pause: Duration,
    ) -> Result<(), String> {
        on_node::<()>(
            master.port,
            redis::cmd("CLIENT")
                .arg("PAUSE")
                .arg(pause.as_millis().to_string())
                .arg("WRITE"),
        )?;
        let offset = |port: u16| -> Result<u64, String> {
            let info: String = on_node(port, redis::cmd("INFO").arg("replication"))?;
            info_field(&info, "master_repl_offset")
                .and_then(|o| o.parse().ok())
                .ok_or_else(|| format!("node {port}: no master_repl_offset"))
        };
        poll(pause / 2, "the replica caught up", || {
            let (m, r) = (offset(master.port)?, offset(replica.port)?);
            if r >= m {
                Ok(())
            } else {
                Err(format!("master at {m}, replica at {r}"))
            }
        })
    }

    /// Kills the node on `port` with SIGKILL (no shutdown, nothing saved):
    /// whatever it had not replicated is gone.
    pub fn kill(&mut self, port: u16) {
        if let Some(node) = self.nodes.iter_mut().find(|n| n.port == port) {
            node.kill();
        }
    }

    /// Zeroes the statistics of every running node (`CONFIG RESETSTAT`).
    pub fn reset_stats(&self) {
        for port in self.live_ports() {
            let _ = on_node::<()>(port, redis::cmd("CONFIG").arg("RESETSTAT"));
        }
    }

    /// The error replies the running nodes sent since their statistics were
    /// last reset, by prefix (`MOVED`, `ASK`, `TRYAGAIN`, `CLUSTERDOWN`,
    /// ...), summed over the nodes (`INFO errorstats`).
    pub fn error_replies(&self) -> std::collections::BTreeMap<String, u64> {
        let mut sums = std::collections::BTreeMap::new();
        for port in self.live_ports() {
            let Ok(info) = on_node::<String>(port, redis::cmd("INFO").arg("errorstats")) else {
                continue;
            };
            for line in info.lines() {
                let Some((name, rest)) = line
                    .strip_prefix("errorstat_")
                    .and_then(|l| l.split_once(':'))
                else {
                    continue;
                };
                let count = rest
                    .strip_prefix("count=")
                    .and_then(|c| c.trim().parse::<u64>().ok())
                    .unwrap_or(0);
                *sums.entry(name.to_owned()).or_default() += count;
            }
        }
        sums
    }
}
