//! The Redis fixture: a store with a key prefix of its own, on the server of
//! `REDIS_URL` or on a cluster a test started, with a raw connection to the
//! same Redis for what a test reads or does behind the store's back.
//!
//! Expiry here is Redis's own (a key's TTL), so there is no manual clock: a
//! test waits past a short ttl, and lets a lease run out by cutting the
//! record's TTL.

use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_runtime::store::Record;
use idem_runtime::{Key, RedisStore};
use idem_tests::{DeleteKeys, LostReply, redis_store, redis_url, unique_prefix};
use redis::FromRedisValue;
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;

use super::AppError;
use super::lease::{BoxFuture, Effects, LeaseFixture, Time, Token};
use super::lossy::{Lossy, port_of, through};

/// A raw connection to the store's server or cluster, for what a test reads
/// or does behind the store's back.
#[derive(Clone)]
enum Raw {
    Single(MultiplexedConnection),
    Cluster(ClusterConnection),
}

/// A Redis store with a key prefix of its own, a raw connection to the same
/// Redis, and (on the shared server) a guard that deletes the prefix's keys
/// when the last clone drops.
#[derive(Clone)]
pub(crate) struct RedisFx {
    pub(crate) store: RedisStore,
    pub(crate) prefix: String,
    raw: Raw,
    /// Every node's URL (one on a single server).
    nodes: Vec<String>,
    _keys: Option<Arc<DeleteKeys>>,
}

impl RedisFx {
    /// On the server of `REDIS_URL` with a unique prefix starting with
    /// `name`, or `None` when the server is unreachable (the test skips).
    pub(crate) async fn single(name: &str) -> Option<RedisFx> {
        let prefix = unique_prefix(name);
        let store = redis_store(&prefix).await?;
        let url = redis_url();
        let keys = Arc::new(DeleteKeys::new(&url, &prefix));
        let raw = redis::Client::open(url.as_str())
            .expect("redis url")
            .get_multiplexed_async_connection()
            .await
            .expect("a raw connection to the server the store reached");
        Some(RedisFx {
            store,
            prefix,
            raw: Raw::Single(raw),
            nodes: vec![url],
            _keys: Some(keys),
        })
    }

    /// On the cluster of `nodes`, with a unique prefix starting with `name`.
    /// The cluster is the test's own and is killed afterwards, so no guard.
    pub(crate) async fn cluster(nodes: &[String], name: &str) -> RedisFx {
        let prefix = unique_prefix(name);
        let store = RedisStore::connect_cluster(nodes)
            .await
            .expect("connect to the cluster")
            .with_prefix(&prefix)
            .expect("a valid prefix");
        let raw = redis::cluster::ClusterClient::new(nodes.to_vec())
            .expect("cluster urls")
            .get_async_connection()
            .await
            .expect("a raw cluster connection");
        RedisFx {
            store,
            prefix,
            raw: Raw::Cluster(raw),
            nodes: nodes.to_vec(),
            _keys: None,
        }
    }

    /// Runs `cmd` on the raw connection (routed by key on a cluster).
    pub(crate) async fn query<T: FromRedisValue>(&self, cmd: &redis::Cmd) -> T {
        async fn go<C: ConnectionLike, T: FromRedisValue>(mut c: C, cmd: &redis::Cmd) -> T {
            cmd.query_async(&mut c)
                .await
                .unwrap_or_else(|e| panic!("raw redis command failed: {e}"))
        }
        match &self.raw {
            Raw::Single(c) => go(c.clone(), cmd).await,
            Raw::Cluster(c) => go(c.clone(), cmd).await,
        }
    }

    /// Runs a script invocation on the raw connection (routed by its key on
    /// a cluster).
    pub(crate) async fn invoke<T: FromRedisValue>(&self, inv: &redis::ScriptInvocation<'_>) -> T {
        let r = match &self.raw {
            Raw::Single(c) => inv.invoke_async(&mut c.clone()).await,
            Raw::Cluster(c) => inv.invoke_async(&mut c.clone()).await,
        };
        r.unwrap_or_else(|e| panic!("raw redis script failed: {e}"))
    }

    /// The Redis key of `handler`'s record for `key`.
    pub(crate) fn rkey(&self, handler: &str, key: &Key) -> String {
        self.store.redis_key(handler, key)
    }

    pub(crate) async fn exists(&self, handler: &str, key: &Key) -> bool {
        let n: i64 = self
            .query(redis::cmd("EXISTS").arg(self.rkey(handler, key)))
            .await;
        n == 1
    }

    /// The external effect of a body: a counter per message id, in Redis
    /// under the test's prefix.
    fn effect_key(&self, id: &str) -> String {
        format!("{}:effect:{id}", self.prefix)
    }

    async fn add_effect(&self, id: &str) -> Result<(), AppError> {
        let mut cmd = redis::cmd("INCR");
        cmd.arg(self.effect_key(id));
        let r: redis::RedisResult<i64> = match &self.raw {
            Raw::Single(c) => cmd.query_async(&mut c.clone()).await,
            Raw::Cluster(c) => cmd.query_async(&mut c.clone()).await,
        };
        r.map(drop)
            .map_err(|e| AppError::Refused(format!("effect: {e}")))
    }

    /// Every node's URL (one on a single server).
    pub(crate) fn nodes(&self) -> &[String] {
        &self.nodes
    }

    /// Runs `cmd` on the node at `url` itself, over a plain connection: no
    /// cluster routing, so a key another node serves answers `MOVED`.
    pub(crate) async fn on_node<T: FromRedisValue>(
        &self,
        url: &str,
        cmd: &redis::Cmd,
    ) -> redis::RedisResult<T> {
        let mut c = redis::Client::open(url)?
            .get_multiplexed_async_connection()
            .await?;
        cmd.query_async(&mut c).await
    }

    /// Every key under the prefix, on every node, as `(node url, key)`.
    pub(crate) async fn keys_by_node(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for url in &self.nodes {
            let mut c = redis::Client::open(url.as_str())
                .expect("node url")
                .get_multiplexed_async_connection()
                .await
                .expect("a direct connection to a node");
            let mut cursor = 0u64;
            loop {
                let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(format!("{}:*", self.prefix))
                    .arg("COUNT")
                    .arg(1000)
                    .query_async(&mut c)
                    .await
                    .expect("scan a node");
                out.extend(batch.into_iter().map(|k| (url.clone(), k)));
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        out
    }

    /// Lets the lease of `handler`'s record for `key` run out now, as if its
    /// consumer had stalled for longer than the lease without a heartbeat
    /// getting through: the record's TTL is cut to 1 ms and the test waits
    /// until Redis has expired it. A heartbeat that lands in between extends
    /// the TTL again, so this repeats until the key is gone.
    async fn expire_now(&self, handler: &str, key: &Key) {
        let rkey = self.rkey(handler, key);
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let _: i64 = self.query(redis::cmd("PEXPIRE").arg(&rkey).arg(1)).await;
            tokio::time::sleep(Duration::from_millis(3)).await;
            if !self.exists(handler, key).await {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the lease of {rkey} never ran out"
            );
        }
    }
}

impl Effects for RedisFx {
    fn apply<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), AppError>> {
        Box::pin(self.add_effect(id))
    }
}

impl LeaseFixture for RedisFx {
    type Store = RedisStore;
    const COUNTS_TAKEOVERS: bool = false;
    const DELETES_EXPIRED: bool = true;

    /// On the server of `REDIS_URL`, always in real time.
    async fn open(_: Time) -> Option<Self> {
        RedisFx::single("rl").await
    }

    fn store(&self) -> &RedisStore {
        &self.store
    }

    fn time(&self) -> super::lease::Moves<'_> {
        super::lease::Moves::Real
    }

    async fn record(&self, handler: &str, key: &Key) -> Option<Record> {
        self.store
            .record(handler, key)
            .await
            .expect("read a record")
    }

    /// The record keys under the prefix (the effect counters have no hash
    /// tag), on every node.
    async fn records(&self) -> usize {
        let keys = self.keys_by_node().await;
        keys.iter().filter(|(_, k)| k.contains('{')).count()
    }

    async fn token(&self, handler: &str, key: &Key) -> Token {
        Token::Shown(self.record(handler, key).await.and_then(|r| r.token))
    }

    async fn effects(&self, id: &str) -> usize {
        let n: Option<usize> = self.query(redis::cmd("GET").arg(self.effect_key(id))).await;
        n.unwrap_or(0)
    }

    /// A consumer of its own under the same prefix, which reaches the
    /// server through a proxy that can lose a completion's reply. On a
    /// cluster (whose nodes name each other) the loss is simulated.
    async fn lossy(&self) -> Lossy<RedisStore> {
        let [url] = self.nodes.as_slice() else {
            return Lossy::simulated(self.store.clone());
        };
        let proxy = LostReply::start(port_of(url, 6379)).await;
        let store = RedisStore::connect(&through(url, proxy.port()))
            .await
            .expect("Redis through the proxy")
            .with_prefix(&self.prefix)
            .expect("a valid prefix");
        Lossy::proxied(store, proxy)
    }

    /// A claim's record that lives as long as its lease expires. One that
    /// outlives its lease (a handler with `max_attempts`, or a claim that
    /// carries failures, keeps its record for the ttl) has the lease's end
    /// in its value (`2|p|updated|<lease end>|...`): that moment is
    /// moved to now, as the lease's time passing would.
    async fn run_out_lease(&self, handler: &str, key: &Key) {
        let rkey = self.rkey(handler, key);
        let record = self.record(handler, key).await.expect("a claim to run out");
        let pttl: i64 = self.query(redis::cmd("PTTL").arg(&rkey)).await;
        let now = super::lease::system_now_ms();
        if pttl > record.expires_at_ms - now + 1_000 {
            let moved: i64 = self
                .query(
                    redis::cmd("EVAL")
                        .arg(LEASE_ENDS_AT)
                        .arg(1)
                        .arg(&rkey)
                        .arg(now),
                )
                .await;
            assert_eq!(moved, 1, "{rkey} holds no claim in progress");
        } else {
            self.expire_now(handler, key).await
        }
    }
}

/// Sets the lease end of the claim in progress `KEYS[1]` to `ARGV[1]`,
/// keeping the key's TTL; 0 when the key holds no such record.
const LEASE_ENDS_AT: &str = r"
local v = redis.call('GET', KEYS[1])
if not v then return 0 end
local head, tail = string.match(v, '^(2|p|[^|]*|)[^|]*(|.*)$')
if not head then return 0 end
redis.call('SET', KEYS[1], head .. ARGV[1] .. tail, 'KEEPTTL')
return 1
";
