//! The Redis store (feature `redis`): lease mode on a single server or a
//! Redis Cluster.
//!
//! # Examples
//!
//! ```no_run
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use idem_runtime::store::redis::RedisStore;
//!
//! let store = RedisStore::connect("redis://127.0.0.1:6379").await?.with_prefix("billing")?;
//! # Ok(()) }
//! ```

use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{Script, Value};

use crate::clock::{Clock, SystemClock, millis};
use crate::error::StoreError;
use crate::key::Key;
use crate::registry::{self, HandlerSpec};
use crate::store::contract::{Claim, Failure, LeaseStore, Standing};
use crate::store::inspect::{Forgot, Inspect, Query, Schema, Stats, Swept};
use crate::store::{LEASE_RAN_OUT, Record, Status};

/// The default prefix of every Redis key the store writes.
///
/// # Examples
///
/// ```
/// use idem_runtime::store::redis::DEFAULT_PREFIX;
/// // records are found with `SCAN 0 MATCH idem:*`
/// assert_eq!(format!("{DEFAULT_PREFIX}:*"), "idem:*");
/// ```
pub const DEFAULT_PREFIX: &str = "idem";

/// How long a command may take before the call fails with
/// [`StoreError::Timeout`]-like backend errors; also the connect timeout.
///
/// # Examples
///
/// ```
/// use idem_runtime::store::redis::DEFAULT_TIMEOUT;
/// use idem_runtime::StoreError;
/// use std::time::Duration;
///
/// assert_eq!(DEFAULT_TIMEOUT, Duration::from_secs(2));
/// // what a call that timed out reports
/// let err = StoreError::Timeout(DEFAULT_TIMEOUT);
/// assert_eq!(err.to_string(), "timed out after 2s");
/// ```
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);

/// Claims `KEYS[1]` with token `ARGV[1]` for a lease of `ARGV[2]` ms;
/// `ARGV[3]` is now (ms), `ARGV[4]` the delivery's fingerprint (or empty),
/// `ARGV[5]` the handler's `max_attempts` (or empty), `ARGV[6]` its ttl
/// (ms), `ARGV[7]` the last error a claim whose lease ran out leaves.
///
/// A claim that ran out counts as a failure while its lease ended less
/// than a ttl ago; a claim of a handler with `max_attempts`, or one that
/// carries failures, lives for its lease and a ttl (the lease ends at `l`),
/// so that a consumer that stops inside it is counted.
///
/// Replies `{1}` claimed, `{2, outcome}` completed, `{3, ms left}` in
/// progress, `{4, fingerprint}` recorded with another payload, `{5, error}`
/// failed for good, `{6, failures, last error}` exhausted. The rules are
/// those of `Standing::of` and `Carried::from`.
///
/// A record written by the first release has no `l` (lease end), `a`, `f`,
/// `e` or `p`: its lease ends with the key's TTL, and it carries one
/// attempt, no failure and no fingerprint.
const CLAIM: &str = r"
local h = redis.call('HMGET', KEYS[1], 's', 'o', 'p', 'f', 'e', 'l', 'a')
local now = tonumber(ARGV[3])
local lease = tonumber(ARGV[2])
local s = h[1]
local attempts, failures, last_error = 1, 0, false
if s then
  local left, ends = nil, nil
  if s == 'in_progress' then
    ends = tonumber(h[6]) or (now + redis.call('PTTL', KEYS[1]))
    left = ends - now
  end
  if left == nil or left > 0 then
    if h[3] and ARGV[4] ~= '' and h[3] ~= ARGV[4] then return {4, h[3]} end
    if s == 'completed' then return {2, h[2]} end
    if s == 'failed' then return {5, h[2]} end
    if s == 'in_progress' then return {3, left} end
    local f = tonumber(h[4]) or 0
    if ARGV[5] ~= '' and f >= tonumber(ARGV[5]) then return {6, f, h[5]} end
    attempts, failures, last_error = (tonumber(h[7]) or 1) + 1, f, h[5]
  elseif ends + tonumber(ARGV[6]) > now then
    attempts = (tonumber(h[7]) or 1) + 1
    failures = (tonumber(h[4]) or 0) + 1
    last_error = ARGV[7]
    if ARGV[5] ~= '' and failures >= tonumber(ARGV[5]) then
      redis.call('HSET', KEYS[1], 's', 'retry', 'f', failures, 'e', last_error, 'u', ARGV[3])
      redis.call('HDEL', KEYS[1], 'l')
      redis.call('PEXPIRE', KEYS[1], ARGV[6])
      return {6, failures, last_error}
    end
  end
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 's', 'in_progress', 't', ARGV[1], 'c', ARGV[3], 'u', ARGV[3],
  'l', now + lease, 'a', attempts, 'f', failures)
if last_error then redis.call('HSET', KEYS[1], 'e', last_error) end
if ARGV[4] ~= '' then redis.call('HSET', KEYS[1], 'p', ARGV[4]) end
if failures > 0 or ARGV[5] ~= '' then
  redis.call('PEXPIRE', KEYS[1], lease + tonumber(ARGV[6]))
else
  redis.call('PEXPIRE', KEYS[1], lease)
end
return {1}
";

/// Completes the claim of token `ARGV[1]` with outcome `ARGV[2]`, kept for
/// `ARGV[3]` ms; `ARGV[4]` is now. Returns 1, or 0 when another claim holds
/// the key or completed it. A key that expired with nobody taking it over is
/// recorded all the same, as the SQL stores do: the body's effect happened.
/// Failures and the last error stay: a success resets nothing.
const COMPLETE: &str = r"
local t = redis.call('HGET', KEYS[1], 't')
if t ~= ARGV[1] then
  if t or redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
  redis.call('HSET', KEYS[1], 'c', ARGV[4])
end
redis.call('HSET', KEYS[1], 's', 'completed', 'o', ARGV[2], 'u', ARGV[4])
redis.call('HDEL', KEYS[1], 't', 'l')
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
";

/// Records a failure under the claim of token `ARGV[1]`: status `ARGV[2]`
/// (`retry` or `failed`), recorded error `ARGV[3]` (JSON, or empty), text
/// `ARGV[4]`, kept for `ARGV[5]` ms; `ARGV[6]` is now. Returns 1, or 0 when
/// the token no longer holds the key.
const FAIL: &str = r"
if redis.call('HGET', KEYS[1], 't') ~= ARGV[1] then return 0 end
redis.call('HINCRBY', KEYS[1], 'f', 1)
redis.call('HSET', KEYS[1], 's', ARGV[2], 'e', ARGV[4], 'u', ARGV[6])
if ARGV[3] ~= '' then
  redis.call('HSET', KEYS[1], 'o', ARGV[3])
else
  redis.call('HDEL', KEYS[1], 'o')
end
redis.call('HDEL', KEYS[1], 't', 'l')
redis.call('PEXPIRE', KEYS[1], ARGV[5])
return 1
";

/// Deletes the record if token `ARGV[1]` still holds it.
const RELEASE: &str = r"
if redis.call('HGET', KEYS[1], 't') ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
return 1
";

/// Extends the lease of token `ARGV[1]` to `ARGV[2]` ms from now (`ARGV[3]`),
/// while the claim is in progress. A claim whose record outlives its lease
/// (see `CLAIM`) keeps it for the ttl (`ARGV[4]` ms) past the new lease.
const EXTEND: &str = r"
if redis.call('HGET', KEYS[1], 't') ~= ARGV[1] then return 0 end
if redis.call('HGET', KEYS[1], 's') ~= 'in_progress' then return 0 end
local pttl = redis.call('PTTL', KEYS[1])
local lease = tonumber(ARGV[2])
if pttl > lease then
  redis.call('PEXPIRE', KEYS[1], lease + tonumber(ARGV[4]))
elseif pttl < lease then
  redis.call('PEXPIRE', KEYS[1], lease)
end
redis.call('HSET', KEYS[1], 'u', ARGV[3], 'l', tonumber(ARGV[3]) + tonumber(ARGV[2]))
return 1
";

/// Deletes the record `KEYS[1]` unless `ARGV[1]` is `0` (not forced) and
/// a live claim holds it: in progress, its lease (`l`; for a record of the
/// first release, the key's TTL) not over at `ARGV[2]` (now, ms). Returns
/// 1 deleted, 0 absent, 2 refused.
const FORGET: &str = r"
local h = redis.call('HMGET', KEYS[1], 's', 'l')
if not h[1] then return 0 end
if ARGV[1] == '0' and h[1] == 'in_progress' then
  local ends = tonumber(h[2])
  if (not ends) or ends > tonumber(ARGV[2]) then return 2 end
end
redis.call('DEL', KEYS[1])
return 1
";

/// How many keys one `SCAN` call looks at.
const SCAN_COUNT: usize = 1_000;

#[derive(Clone)]
enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Conn::Single(_) => "Single",
            Conn::Cluster(_) => "Cluster",
        })
    }
}

#[derive(Debug)]
struct Scripts {
    claim: Script,
    complete: Script,
    fail: Script,
    release: Script,
    extend: Script,
    forget: Script,
}

/// The Redis store: lease mode with fencing tokens and native expiry.
///
/// Each record is one hash, `<prefix>:{<len>:<handler>|<key>}`: `s` (status), `t`
/// (the claim's fencing token), `o` (the outcome, or a final error, JSON),
/// `c`/`u` (created and updated, ms since the epoch), `l` (when the lease
/// of a claim in progress ends), `a` (attempts), `f` (failures), `e` (the
/// last error's text), `p` (the payload fingerprint), with the key's own
/// TTL: the lease while in progress (the lease and a ttl, for a claim of a
/// handler with `max_attempts` or one that carries failures, so that a
/// consumer that stops inside it is counted), the handler's `ttl` once
/// completed or failed. The braces are a hash tag, so on Redis
/// Cluster a record lives in one slot. A record written by the first
/// release, without `l`, `a`, `f`, `e` and `p`, is read as one attempt, no
/// failure, no fingerprint, its lease ending with its TTL.
///
/// * a claim is one round trip (a Lua script): it takes an absent key with a
///   new token, or returns the recorded outcome of a completed one, or the
///   remaining lease of a live one;
/// * completion, release and lease extension are one script each that
///   compares the token, so a consumer whose lease ran out and was taken
///   over gets [`Error::LeaseLost`](crate::Error::LeaseLost) instead of
///   overwriting the newer claim.
///
/// A fresh message costs two round trips (claim, complete), a duplicate one.
///
/// **Persistence.** A Redis that keeps nothing on disk (`save ""`,
/// `appendonly no`) forgets every record when it restarts: each message seen
/// within the ttl runs again once. Run the dedup Redis with
/// `appendonly yes` and `appendfsync everysec` (at most about a second of
/// records lost on a crash) or `appendfsync always` (none, slower), and
/// never with an eviction policy that can drop keys with a TTL
/// (`maxmemory-policy noeviction`).
///
/// # Examples
///
/// ```no_run,standalone_crate
/// use idem_runtime::{idempotent, RedisStore};
///
/// #[derive(serde::Deserialize)]
/// struct PointsEarned { message_id: String, points: i64 }
///
/// #[idempotent(key = "message_id", ttl = "7d", store = "redis")]
/// async fn grant_points(msg: &PointsEarned) -> Result<i64, std::io::Error> {
///     Ok(msg.points)
/// }
///
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let store = RedisStore::connect("redis://127.0.0.1:6379").await?;
/// let msg = PointsEarned { message_id: "m-1".into(), points: 5 };
/// let granted = grant_points(&store, &msg).await?.into_inner();
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct RedisStore {
    conn: Conn,
    prefix: String,
    scripts: std::sync::Arc<Scripts>,
    clock: std::sync::Arc<dyn Clock>,
}

fn backend(e: redis::RedisError) -> StoreError {
    if e.is_timeout() {
        return StoreError::Timeout(DEFAULT_TIMEOUT);
    }
    StoreError::backend(e)
}

impl RedisStore {
    /// Connects to one Redis server (`redis://host:port/db`). The connection
    /// reconnects by itself after a failure; calls made while the server is
    /// away fail with [`StoreError`] within the 2 s timeout.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_runtime::RedisStore;
    ///
    /// let store = RedisStore::connect("redis://:secret@cache.internal:6379/2").await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        registry::check()?;
        let client = redis::Client::open(url).map_err(backend)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(DEFAULT_TIMEOUT))
            .set_response_timeout(Some(DEFAULT_TIMEOUT))
            .set_number_of_retries(2)
            .set_max_delay(Duration::from_millis(500));
        let conn = client
            .get_connection_manager_with_config(config)
            .await
            .map_err(backend)?;
        Ok(Self::with_conn(Conn::Single(conn)))
    }

    /// Connects to a Redis Cluster through any of its nodes.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_runtime::RedisStore;
    ///
    /// let store = RedisStore::connect_cluster(&[
    ///     "redis://10.0.0.1:7000",
    ///     "redis://10.0.0.2:7000",
    /// ])
    /// .await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect_cluster<I: AsRef<str>>(nodes: &[I]) -> Result<Self, StoreError> {
        registry::check()?;
        let nodes: Vec<&str> = nodes.iter().map(AsRef::as_ref).collect();
        let client = redis::cluster::ClusterClient::builder(nodes)
            .connection_timeout(DEFAULT_TIMEOUT)
            .response_timeout(DEFAULT_TIMEOUT)
            .retries(3)
            .build()
            .map_err(backend)?;
        let conn = client.get_async_connection().await.map_err(backend)?;
        Ok(Self::with_conn(Conn::Cluster(conn)))
    }

    fn with_conn(conn: Conn) -> Self {
        RedisStore {
            conn,
            prefix: DEFAULT_PREFIX.to_owned(),
            scripts: std::sync::Arc::new(Scripts {
                claim: Script::new(CLAIM),
                complete: Script::new(COMPLETE),
                fail: Script::new(FAIL),
                release: Script::new(RELEASE),
                extend: Script::new(EXTEND),
                forget: Script::new(FORGET),
            }),
            clock: std::sync::Arc::new(SystemClock),
        }
    }

    /// Uses `prefix` instead of `idem` for every key (e.g. one prefix per
    /// service sharing a Redis). Any text without `{` or `}`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let store = idem_runtime::RedisStore::connect("redis://127.0.0.1:6379").await?;
    /// use idem_runtime::Key;
    ///
    /// let store = store.with_prefix("billing")?;
    /// let key = Key::from_parts(&[&"m-1"])?;
    /// assert_eq!(store.redis_key("charge", &key), "billing:{6:charge|3:m-1}");
    /// assert!(store.with_prefix("{billing}").is_err());
    /// # Ok(()) }
    /// ```
    pub fn with_prefix(mut self, prefix: &str) -> Result<Self, StoreError> {
        if prefix.is_empty() || prefix.contains(['{', '}']) {
            return Err(StoreError::InvalidPrefix {
                prefix: prefix.to_owned(),
            });
        }
        self.prefix = prefix.to_owned();
        Ok(self)
    }

    /// Reads the `c`/`u` timestamps from `clock` (expiry is Redis's own).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let store = idem_runtime::RedisStore::connect("redis://127.0.0.1:6379").await?;
    /// use idem_runtime::clock::ManualClock;
    ///
    /// let store = store.with_clock(ManualClock::new(1_700_000_000_000));
    /// # Ok(()) }
    /// ```
    pub fn with_clock(mut self, clock: impl Clock) -> Self {
        self.clock = std::sync::Arc::new(clock);
        self
    }

    /// The Redis key of a record.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(store: idem_runtime::RedisStore) {
    /// let key = idem_runtime::Key::from_parts(&[&"m-1"]).unwrap();
    /// assert_eq!(store.redis_key("grant_points", &key), "idem:{12:grant_points|3:m-1}");
    /// # }
    /// ```
    pub fn redis_key(&self, handler: &str, key: &Key) -> String {
        self.redis_key_of(handler, key.as_str())
    }

    async fn run<T: redis::FromRedisValue>(
        &self,
        inv: &redis::ScriptInvocation<'_>,
    ) -> Result<T, StoreError> {
        match &self.conn {
            Conn::Single(c) => inv.invoke_async(&mut c.clone()).await.map_err(backend),
            Conn::Cluster(c) => inv.invoke_async(&mut c.clone()).await.map_err(backend),
        }
    }

    async fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> Result<T, StoreError> {
        async fn go<C: ConnectionLike, T: redis::FromRedisValue>(
            c: &mut C,
            cmd: &redis::Cmd,
        ) -> Result<T, StoreError> {
            cmd.query_async(c).await.map_err(backend)
        }
        match &self.conn {
            Conn::Single(c) => go(&mut c.clone(), cmd).await,
            Conn::Cluster(c) => go(&mut c.clone(), cmd).await,
        }
    }

    /// The record of `key` under handler `handler`, if any. `expires_at_ms`
    /// is the lease's end for a claim in progress, and otherwise computed
    /// from the key's TTL.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let store = idem_runtime::RedisStore::connect("redis://127.0.0.1:6379").await?;
    /// use idem_runtime::Key;
    ///
    /// let key = Key::from_parts(&[&"m-1"])?;
    /// if let Some(r) = store.record("grant_points", &key).await? {
    ///     println!("{:?}, expires at {}: {:?}", r.status, r.expires_at_ms, r.outcome);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn record(&self, handler: &str, key: &Key) -> Result<Option<Record>, StoreError> {
        self.read(handler, key.as_str()).await
    }

    /// The record of the stored key `key` under `handler`, if any.
    async fn read(&self, handler: &str, key: &str) -> Result<Option<Record>, StoreError> {
        let rkey = self.redis_key_of(handler, key);
        let (fields, pttl): (Vec<Option<String>>, i64) = match &self.conn {
            // One round trip, and one view of the hash and its TTL.
            Conn::Single(c) => redis::pipe()
                .atomic()
                .cmd("HMGET")
                .arg(&rkey)
                .arg(&RECORD_FIELDS)
                .cmd("PTTL")
                .arg(&rkey)
                .query_async(&mut c.clone())
                .await
                .map_err(backend)?,
            Conn::Cluster(_) => (
                self.query(redis::cmd("HMGET").arg(&rkey).arg(&RECORD_FIELDS))
                    .await?,
                self.query(redis::cmd("PTTL").arg(&rkey)).await?,
            ),
        };
        let now = self.clock.now_millis();
        read_record(handler, key, fields, pttl, now)
    }

    /// The Redis key of the record of stored key `key` under `handler`.
    fn redis_key_of(&self, handler: &str, key: &str) -> String {
        // The handler name is length-prefixed like the key's parts, so no two
        // (handler, key) pairs share a Redis key whatever the name holds.
        format!("{}:{{{}:{}|{}}}", self.prefix, handler.len(), handler, key)
    }

    /// The handler and the stored key of a Redis key of this store's
    /// prefix; `None` for any other key.
    fn parse_redis_key<'k>(&self, rkey: &'k str) -> Option<(&'k str, &'k str)> {
        let inner = rkey
            .strip_prefix(self.prefix.as_str())?
            .strip_prefix(":{")?
            .strip_suffix('}')?;
        let (len, rest) = inner.split_once(':')?;
        let len: usize = len.parse().ok()?;
        if !rest.is_char_boundary(len) {
            return None;
        }
        let (handler, rest) = rest.split_at_checked(len)?;
        Some((handler, rest.strip_prefix('|')?))
    }

    /// The `SCAN` pattern of the records of `handler`, or of every record:
    /// glob characters in the prefix and the name are escaped.
    fn pattern(&self, handler: Option<&str>) -> String {
        match handler {
            Some(handler) => format!(
                "{}:{{{}:{}|*",
                glob_escape(&self.prefix),
                handler.len(),
                glob_escape(handler)
            ),
            None => format!("{}:{{*", glob_escape(&self.prefix)),
        }
    }

    /// Every key matching `pattern`: on the server, or on every master of
    /// the cluster. Keys that are not UTF-8 are not this store's.
    async fn scan(&self, pattern: &str) -> Result<Vec<String>, StoreError> {
        let mut keys = Vec::new();
        match &self.conn {
            Conn::Single(c) => {
                let mut c = c.clone();
                let mut cursor = 0u64;
                loop {
                    let (next, batch): (u64, Vec<Vec<u8>>) = scan_cmd(cursor, pattern)
                        .query_async(&mut c)
                        .await
                        .map_err(backend)?;
                    keys.extend(batch.into_iter().filter_map(|k| String::from_utf8(k).ok()));
                    if next == 0 {
                        break;
                    }
                    cursor = next;
                }
            }
            Conn::Cluster(c) => {
                let mut c = c.clone();
                for (host, port) in masters(&mut c).await? {
                    let node =
                        RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress { host, port });
                    let mut cursor = 0u64;
                    loop {
                        let reply = c
                            .route_command(scan_cmd(cursor, pattern), node.clone())
                            .await
                            .map_err(backend)?;
                        let (next, batch): (u64, Vec<Vec<u8>>) =
                            redis::from_redis_value(reply).map_err(StoreError::backend)?;
                        keys.extend(batch.into_iter().filter_map(|k| String::from_utf8(k).ok()));
                        if next == 0 {
                            break;
                        }
                        cursor = next;
                    }
                }
            }
        }
        keys.sort();
        keys.dedup();
        Ok(keys)
    }

    /// The records of `handler` (or of every handler), in no order.
    async fn scan_records(&self, handler: Option<&str>) -> Result<Vec<Record>, StoreError> {
        let keys = self.scan(&self.pattern(handler)).await?;
        let found: Vec<(&str, &str)> = keys
            .iter()
            .filter_map(|rkey| self.parse_redis_key(rkey))
            .filter(|(h, _)| handler.is_none_or(|handler| *h == handler))
            .collect();
        let mut records = Vec::with_capacity(found.len());
        match &self.conn {
            // A pipeline of the hashes and TTLs per batch of keys.
            Conn::Single(c) => {
                let mut c = c.clone();
                for batch in found.chunks(SCAN_COUNT) {
                    let mut pipe = redis::pipe();
                    for (handler, key) in batch {
                        let rkey = self.redis_key_of(handler, key);
                        pipe.cmd("HMGET")
                            .arg(&rkey)
                            .arg(&RECORD_FIELDS)
                            .cmd("PTTL")
                            .arg(&rkey);
                    }
                    let replies: Vec<(Vec<Option<String>>, i64)> = pipe
                        .query_async::<Vec<Value>>(&mut c)
                        .await
                        .map_err(backend)?
                        .chunks(2)
                        .map(|pair| match pair {
                            [fields, pttl] => Ok((
                                redis::from_redis_value_ref(fields)?,
                                redis::from_redis_value_ref(pttl)?,
                            )),
                            _ => Err(redis::ParsingError::from("a reply is missing")),
                        })
                        .collect::<Result<_, _>>()
                        .map_err(StoreError::backend)?;
                    let now = self.clock.now_millis();
                    for ((handler, key), (fields, pttl)) in batch.iter().zip(replies) {
                        records.extend(read_record(handler, key, fields, pttl, now)?);
                    }
                }
            }
            Conn::Cluster(_) => {
                for (handler, key) in found {
                    records.extend(self.read(handler, key).await?);
                }
            }
        }
        Ok(records)
    }
}

/// `SCAN cursor MATCH pattern COUNT n`.
fn scan_cmd(cursor: u64, pattern: &str) -> redis::Cmd {
    let mut cmd = redis::cmd("SCAN");
    cmd.arg(cursor)
        .arg("MATCH")
        .arg(pattern)
        .arg("COUNT")
        .arg(SCAN_COUNT);
    cmd
}

/// The addresses of the cluster's masters, from `CLUSTER SLOTS`.
async fn masters(c: &mut ClusterConnection) -> Result<Vec<(String, u16)>, StoreError> {
    let reply = c
        .route_command(
            redis::cmd("CLUSTER").arg("SLOTS").clone(),
            RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
        )
        .await
        .map_err(backend)?;
    let unexpected = || reply_err("CLUSTER SLOTS", &reply);
    let Value::Array(ranges) = &reply else {
        return Err(unexpected());
    };
    let mut masters = Vec::new();
    for range in ranges {
        // [start, end, [host, port, id, ...], replicas...]
        let Value::Array(range) = range else {
            return Err(unexpected());
        };
        let Some(Value::Array(master)) = range.get(2) else {
            return Err(unexpected());
        };
        let (Some(host), Some(Value::Int(port))) = (master.first(), master.get(1)) else {
            return Err(unexpected());
        };
        let host: String = redis::from_redis_value_ref(host).map_err(StoreError::backend)?;
        let port = u16::try_from(*port).map_err(|_| unexpected())?;
        masters.push((host, port));
    }
    masters.sort();
    masters.dedup();
    Ok(masters)
}

/// `text` with Redis's glob characters escaped, to match as itself in a
/// `SCAN ... MATCH` pattern.
fn glob_escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

/// The hash fields [`read_record`] reads, in its order.
const RECORD_FIELDS: [&str; 10] = ["s", "o", "c", "u", "l", "a", "f", "e", "p", "t"];

/// A record from its hash's [`RECORD_FIELDS`] and TTL, read at `now`.
pub(crate) fn read_record(
    handler: &str,
    key: &str,
    fields: Vec<Option<String>>,
    pttl: i64,
    now: i64,
) -> Result<Option<Record>, StoreError> {
    let [
        status,
        outcome,
        created,
        updated,
        lease_end,
        attempts,
        failures,
        last_error,
        fingerprint,
        token,
    ]: [Option<String>; 10] = fields
        .try_into()
        .map_err(|_| StoreError::Schema("unexpected HMGET reply".into()))?;
    let Some(status) = status else {
        return Ok(None);
    };
    let status = Status::parse(&status)
        .ok_or_else(|| StoreError::Schema(format!("unknown status {status:?}")))?;
    let num = |v: &Option<String>| v.as_deref().and_then(|s| s.parse::<i64>().ok());
    let expires_at_ms = match (status, num(&lease_end)) {
        (Status::InProgress, Some(end)) => end,
        _ => now.saturating_add(pttl.max(0)),
    };
    let mut record = Record::new(
        handler,
        key,
        status,
        num(&created).unwrap_or(0),
        expires_at_ms,
    );
    record.outcome = outcome;
    record.updated_at_ms = num(&updated).unwrap_or(record.created_at_ms);
    record.attempts = num(&attempts).unwrap_or(1);
    record.failures = num(&failures).unwrap_or(0);
    record.last_error = last_error;
    record.fingerprint = fingerprint;
    record.token = token;
    Ok(Some(record))
}

fn reply_err(what: &str, v: &Value) -> StoreError {
    StoreError::Schema(format!("unexpected reply to {what}: {v:?}"))
}

impl LeaseStore for RedisStore {
    fn store_name(&self) -> &'static str {
        "redis"
    }

    async fn claim(
        &self,
        spec: &'static HandlerSpec,
        key: &Key,
        fingerprint: Option<&str>,
    ) -> Result<Claim, StoreError> {
        let token = uuid::Uuid::new_v4().simple().to_string();
        let reply: Vec<Value> = {
            let mut inv = self.scripts.claim.prepare_invoke();
            inv.key(self.redis_key(spec.name, key))
                .arg(&token)
                .arg(millis(spec.lease).max(1))
                .arg(self.clock.now_millis())
                .arg(fingerprint.unwrap_or_default())
                .arg(spec.max_attempts.map(|m| m.to_string()).unwrap_or_default())
                .arg(millis(spec.ttl).max(1))
                .arg(LEASE_RAN_OUT);
            self.run(&inv).await?
        };
        let int = |v: &Value| match v {
            Value::Int(i) => Some(*i),
            _ => None,
        };
        let text = |v: &Value| match v {
            Value::BulkString(bytes) => String::from_utf8(bytes.clone())
                .map(Some)
                .map_err(|e| StoreError::Schema(e.to_string())),
            Value::Nil => Ok(None),
            other => Err(reply_err("claim", other)),
        };
        let standing = match reply.as_slice() {
            [tag] if int(tag) == Some(1) => return Ok(Claim::Acquired { token }),
            [tag, outcome] if int(tag) == Some(2) => Standing::Completed {
                outcome: text(outcome)?.unwrap_or_default(),
            },
            [tag, left] if int(tag) == Some(3) => Standing::InProgress {
                retry_after: Duration::from_millis(
                    u64::try_from(int(left).unwrap_or(0)).unwrap_or(0),
                ),
            },
            [tag, recorded] if int(tag) == Some(4) => Standing::Mismatch {
                recorded: text(recorded)?.unwrap_or_default(),
            },
            [tag, error] if int(tag) == Some(5) => Standing::Failed {
                error: text(error)?.unwrap_or_default(),
            },
            [tag, failures, rest @ ..] if int(tag) == Some(6) && rest.len() <= 1 => {
                Standing::Exhausted {
                    failures: u32::try_from(int(failures).unwrap_or(0)).unwrap_or(u32::MAX),
                    last_error: match rest.first() {
                        Some(e) => text(e)?,
                        None => None,
                    },
                }
            }
            _ => {
                return Err(StoreError::Schema(format!(
                    "unexpected reply to claim: {reply:?}"
                )));
            }
        };
        Ok(Claim::Refused(standing))
    }

    async fn fail(
        &self,
        spec: &'static HandlerSpec,
        key: &Key,
        token: &str,
        failure: Failure<'_>,
    ) -> Result<bool, StoreError> {
        let done: i64 = {
            let mut inv = self.scripts.fail.prepare_invoke();
            inv.key(self.redis_key(spec.name, key))
                .arg(token)
                .arg(failure.status().as_str())
                .arg(failure.recorded().unwrap_or_default())
                .arg(failure.text())
                .arg(millis(spec.ttl).max(1))
                .arg(self.clock.now_millis());
            self.run(&inv).await?
        };
        Ok(done == 1)
    }

    async fn complete(
        &self,
        spec: &'static HandlerSpec,
        key: &Key,
        token: &str,
        outcome: &str,
    ) -> Result<bool, StoreError> {
        let done: i64 = {
            let mut inv = self.scripts.complete.prepare_invoke();
            inv.key(self.redis_key(spec.name, key))
                .arg(token)
                .arg(outcome)
                .arg(millis(spec.ttl).max(1))
                .arg(self.clock.now_millis());
            self.run(&inv).await?
        };
        Ok(done == 1)
    }

    async fn release(
        &self,
        spec: &'static HandlerSpec,
        key: &Key,
        token: &str,
    ) -> Result<(), StoreError> {
        let _: i64 = {
            let mut inv = self.scripts.release.prepare_invoke();
            inv.key(self.redis_key(spec.name, key)).arg(token);
            self.run(&inv).await?
        };
        Ok(())
    }

    async fn extend(
        &self,
        spec: &'static HandlerSpec,
        key: &Key,
        token: &str,
    ) -> Result<bool, StoreError> {
        let done: i64 = {
            let mut inv = self.scripts.extend.prepare_invoke();
            inv.key(self.redis_key(spec.name, key))
                .arg(token)
                .arg(millis(spec.lease).max(1))
                .arg(self.clock.now_millis())
                .arg(millis(spec.ttl).max(1));
            self.run(&inv).await?
        };
        Ok(done == 1)
    }
}

/// Redis expires its records by itself (key TTLs): [`Inspect::sweep`]
/// deletes nothing. Listing and counting `SCAN` the keys of the store's
/// prefix (on every master of a cluster) and read each record, so they
/// take time in proportion to the records; [`Inspect::list`] reads every
/// record of the handler to sort them.
impl Inspect for RedisStore {
    async fn lookup(&self, handler: &str, key: &str) -> Result<Option<Record>, StoreError> {
        self.read(handler, key).await
    }

    async fn list(&self, handler: &str, query: Query) -> Result<Vec<Record>, StoreError> {
        let records = self.scan_records(Some(handler)).await?;
        Ok(query.apply(records, self.clock.now_millis()))
    }

    async fn stats(&self) -> Result<Stats, StoreError> {
        let records = self.scan_records(None).await?;
        let mut stats = Stats::new(self.clock.now_millis());
        for record in &records {
            stats.add(record);
        }
        Ok(stats)
    }

    async fn forget(&self, handler: &str, key: &str, force: bool) -> Result<Forgot, StoreError> {
        let Some(record) = self.read(handler, key).await? else {
            return Ok(Forgot::Absent);
        };
        let done: i64 = {
            let mut inv = self.scripts.forget.prepare_invoke();
            inv.key(self.redis_key_of(handler, key))
                .arg(if force { "1" } else { "0" })
                .arg(self.clock.now_millis());
            self.run(&inv).await?
        };
        Ok(match done {
            1 => Forgot::Deleted(record),
            2 => Forgot::Refused(self.read(handler, key).await?.unwrap_or(record)),
            _ => Forgot::Absent,
        })
    }

    async fn sweep(&self) -> Result<Swept, StoreError> {
        Ok(Swept::native())
    }

    async fn handlers(&self) -> Result<Vec<String>, StoreError> {
        let keys = self.scan(&self.pattern(None)).await?;
        let mut names: Vec<String> = keys
            .iter()
            .filter_map(|rkey| self.parse_redis_key(rkey))
            .map(|(handler, _)| handler.to_owned())
            .collect();
        names.sort();
        names.dedup();
        Ok(names)
    }

    async fn schema(&self) -> Result<Schema, StoreError> {
        Ok(Schema::None)
    }
}

#[cfg(test)]
mod tests {
    use super::glob_escape;

    #[test]
    fn glob_characters_are_escaped() {
        assert_eq!(glob_escape("plain_name"), "plain_name");
        assert_eq!(glob_escape(r"a*b?c[d]e\f"), r"a\*b\?c\[d\]e\\f");
    }
}
