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

mod exec;
mod record;
mod scripts;

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{Cmd, Script, Value};

use crate::clock::{Clock, SystemClock, expiry, millis};
use crate::error::StoreError;
use crate::key::Key;
use crate::registry::{self, HandlerSpec};
use crate::store::contract::{BatchItem, Claim, Failure, Held, LeaseStore, Standing};
use crate::store::inspect::{Forgot, Inspect, Query, Schema, Stats, Swept};
use crate::store::rules::{ClaimPlan, settle_stall};
use crate::store::{LEASE_RAN_OUT, Record, Status};
use record::{Parts, read_hash};

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

/// How many keys one `SCAN` call looks at.
const SCAN_COUNT: usize = 1_000;

/// How often a claim may find that the record it read changed before it
/// could replace it; each time, another delivery wrote the key, so the
/// claim is most likely refused on the next look.
const MAX_SWAPS: usize = 8;

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

/// One of the store's Lua functions, by its name in the store's library.
#[derive(Debug)]
struct Lua {
    name: String,
}

impl Lua {
    /// `FCALL <name> 1 key`, for the arguments to follow (room made for
    /// eight in all, and the usual sizes, so the command is not grown).
    fn on(&self, key: &str) -> Cmd {
        let mut cmd = Cmd::with_capacity(8, 160 + self.name.len() + key.len());
        cmd.arg("FCALL").arg(&self.name).arg(1).arg(key);
        cmd
    }
}

/// The store's Lua functions, in one library (`FUNCTION LOAD`) named by
/// its content, `idem_<16 hex digits>`: a server holds the library of each
/// release that used it, side by side, and loads it again if it lost it
/// (a restart without persistence, a new cluster node).
#[derive(Debug)]
struct Scripts {
    /// The library's source, as `FUNCTION LOAD` takes it.
    library: String,
    swap: Lua,
    hash_claim: Lua,
    complete: Lua,
    fail: Lua,
    release: Lua,
    extend: Lua,
    forget: Lua,
}

impl Scripts {
    fn new() -> Scripts {
        use std::fmt::Write as _;
        const VERSION: &str = "@version@";
        let complete = format!("{}{}", scripts::COMPLETE_STRING, scripts::COMPLETE);
        let functions = [
            ("swap", scripts::SWAP),
            ("hash_claim", scripts::HASH_CLAIM),
            ("complete", complete.as_str()),
            ("fail", scripts::FAIL),
            ("release", scripts::RELEASE),
            ("extend", scripts::EXTEND),
            ("forget", scripts::FORGET),
        ];
        let mut body = String::from(scripts::PRELUDE);
        for (name, code) in functions {
            // Writing to a String cannot fail.
            let _ = write!(
                body,
                "redis.register_function('idem_{VERSION}_{name}', function(KEYS, ARGV)\n{code}\nend)\n"
            );
        }
        let version = Script::new(&body).get_hash()[..16].to_owned();
        let library = format!(
            "#!lua name=idem_{version}\n{}",
            body.replace(VERSION, &version)
        );
        let lua = |name: &str| Lua {
            name: format!("idem_{version}_{name}"),
        };
        Scripts {
            library,
            swap: lua("swap"),
            hash_claim: lua("hash_claim"),
            complete: lua("complete"),
            fail: lua("fail"),
            release: lua("release"),
            extend: lua("extend"),
            forget: lua("forget"),
        }
    }
}
/// The Redis store: lease mode with fencing tokens and native expiry.
///
/// # Records
///
/// A record is one string value under `<prefix>:{<len>:<handler>|<key>}`
/// (the braces are a hash tag, so on Redis Cluster a record lives in one
/// slot):
///
/// ```text
/// 2|<status>|<updated>|<lease end>|<token length>|<token><created>|<attempts>|<failures>|<fingerprint length>|<error length>|<fingerprint><last error><outcome>
/// ```
///
/// `2` is the format; the status is one letter (`p` in progress, `c`
/// completed, `f` failed for good, `r` waiting for a retry); times are
/// milliseconds since the epoch; the lease end is empty unless the claim is
/// in progress, and the error length when there is no last error. The
/// lengths are in bytes, so no text is ever escaped, and the outcome (the
/// result, or a final error, as JSON) takes the rest of the value. What a
/// claim changes comes before the token, what it keeps after it: a
/// completion checks the token and writes a new head before the same tail
/// and the outcome. A completed record whose body returned `42`:
/// `2|c|1700000000250||0|1700000000000|1|0|0||42`. The key's own TTL is
/// the lease while in progress (the lease and a ttl for a claim of a
/// handler with `max_attempts`, or one that carries failures, so that a
/// consumer that stops inside it is counted), the handler's `ttl` once
/// completed, failed or waiting for a retry.
///
/// # Round trips
///
/// * A claim is `SET key <claim> NX PX <lease> GET`: no reply means the
///   key was free and is claimed; otherwise the reply is the record that
///   stands, and the store answers from it with the rules every store
///   shares ([`Standing::of`], [`Standing::of_ran_out`]). A duplicate
///   learns the recorded outcome in that one round trip. A record the
///   claim may take over (a failure that may be retried, a lease that ran
///   out on a record kept for counting) is replaced by a function that
///   writes only if the record is still the one the claim read: one more
///   round trip, for those keys only.
/// * Completion, failure, release and lease extension are one Lua function
///   each that compares the token: a consumer whose lease ran out and was
///   taken over gets [`Error::LeaseLost`](crate::Error::LeaseLost) instead
///   of overwriting the newer claim. A completion that finds the key gone
///   (its lease ran out and nobody took it over) records the outcome all
///   the same: the body's effect happened. The functions are one library,
///   `idem_<16 hex digits of its content>`, that the store loads where it
///   is missing (`FUNCTION LOAD`, on every master of a cluster): a Redis
///   keeps the library of each release that used it (`FUNCTION DELETE`
///   an old one once no consumer of that release runs). Redis 7.0 or
///   later.
/// * A fresh message costs two round trips (claim, complete), a duplicate
///   one. The batch methods of [`LeaseStore`] cost one pipelined round trip
///   per batch (on a cluster, one pipeline per slot, sent at once).
///
/// # Records of earlier releases
///
/// Earlier releases kept a record as a hash with fields `s` (status), `t`
/// (token), `o` (outcome), `c`/`u` (created/updated), `l` (lease end),
/// `a`/`f`/`e` (attempts, failures, last error) and `p` (fingerprint); the
/// first release's hashes have only `s`, `t`, `o`, `c` and `u` (they read
/// as one attempt, no failure, no fingerprint, a lease ending with the
/// key's TTL). This release honours them until they expire:
///
/// * a claim that meets a hash (`SET ... GET` answers `WRONGTYPE`) runs the
///   previous release's claim rules on it in a function: a completed,
///   failed, exhausted or live hash refuses the claim as it did, and stays
///   a hash, so consumers of the previous release still read it during a
///   rolling upgrade; a claim that takes the key over writes this format;
/// * completion, failure, release, extension and
///   [`Inspect::forget`] read either format, so a claim held in a hash is
///   completed (and written in this format) with its token;
/// * [`Inspect`] (`idem show`, `list`, `stats`, `forget`) reads both.
///
/// The previous release cannot read this format: during a rolling
/// upgrade its consumers fail a call that meets a record written by this
/// release with [`Error::Store`](crate::Error::Store) (`WRONGTYPE`), so the
/// message is redelivered until a consumer of this release takes it; no
/// body runs twice for it. Upgrade every consumer, and do not roll back
/// while records of this format live (a ttl).
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
/// // what the store keeps: a completed record whose outcome is `5`
/// let key = idem_runtime::Key::from_parts(&[&"m-1"])?;
/// let record = store.record("grant_points", &key).await?.expect("recorded");
/// assert_eq!(record.outcome.as_deref(), Some("5"));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct RedisStore {
    conn: Conn,
    prefix: Arc<str>,
    scripts: Arc<Scripts>,
    clock: Arc<dyn Clock>,
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
            prefix: Arc::from(DEFAULT_PREFIX),
            scripts: Arc::new(Scripts::new()),
            clock: Arc::new(SystemClock),
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
        self.prefix = Arc::from(prefix);
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
        self.clock = Arc::new(clock);
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

    /// The record of `key` under handler `handler`, if any, in this
    /// release's format or an earlier one's. `expires_at_ms` is the lease's
    /// end for a claim in progress, and otherwise computed from the key's
    /// TTL.
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

    /// The record of the stored key `key` under `handler`, if any: read
    /// with plain commands (no function to load), so a user allowed only
    /// to read, or a replica, can be inspected.
    async fn read(&self, handler: &str, key: &str) -> Result<Option<Record>, StoreError> {
        let rkey = self.redis_key_of(handler, key);
        // A hash turned into a string between two commands reads again.
        for _ in 0..3 {
            let replies = self.send_all(&read_cmds(&rkey)).await?;
            if let Some(record) = read_replies(handler, key, replies, self.clock.now_millis())? {
                return Ok(record);
            }
        }
        Err(StoreError::Schema(format!(
            "{rkey} kept changing while it was read"
        )))
    }

    /// Claims `key` (see [`Claiming`]): `SET ... NX PX ... GET`, then, when
    /// the record found may be replaced or is a hash, the function that does
    /// it, until the claim is taken or refused.
    async fn claim_one(&self, claiming: &Claiming<'_>) -> Result<Claim, StoreError> {
        let mut step = claiming.after_set(self.send(&claiming.set()).await?)?;
        for _ in 0..MAX_SWAPS {
            step = match step {
                Step::Done(claim) => return Ok(claim),
                Step::Swap(swap) => {
                    let cmd = claiming.swap(&self.scripts, &swap);
                    claiming.after_swap(swap, self.call(&cmd).await?)?
                }
                Step::Hash => {
                    let cmd = claiming.hash_claim(&self.scripts);
                    claiming.after_hash(self.call(&cmd).await?)?
                }
            };
        }
        Ok(step.done_or_contended())
    }
}

/// The commands that read a record in either format: `GET` (a string
/// record), `HMGET` (a hash of an earlier release; the fields
/// [`read_hash`] takes, in its order) and `PTTL`. The one that meets the
/// other type answers `WRONGTYPE`.
fn read_cmds(rkey: &str) -> [Cmd; 3] {
    let mut get = redis::cmd("GET");
    get.arg(rkey);
    let mut hmget = redis::cmd("HMGET");
    hmget
        .arg(rkey)
        .arg(&["s", "o", "c", "u", "l", "a", "f", "e", "p", "t"]);
    let mut pttl = redis::cmd("PTTL");
    pttl.arg(rkey);
    [get, hmget, pttl]
}

/// The record the replies to [`read_cmds`] read at `now`: `Some(None)`
/// for no record, `None` when the key changed type between the commands.
fn read_replies(
    handler: &str,
    key: &str,
    replies: Vec<exec::Reply>,
    now: i64,
) -> Result<Option<Option<Record>>, StoreError> {
    let wrong_type = |r: &exec::Reply| matches!(r, Err(e) if e.code() == Some("WRONGTYPE"));
    let [get, hmget, pttl]: [exec::Reply; 3] = replies
        .try_into()
        .map_err(|_| StoreError::Schema("a read lost a reply".into()))?;
    let pttl = match pttl.map_err(backend)? {
        Value::Int(ms) => ms,
        other => return Err(reply_err("a read", &other)),
    };
    match (get, hmget) {
        (Ok(Value::BulkString(value)), _) => {
            let expires = now.saturating_add(pttl.max(0));
            record::decode(handler, key, &value, expires).map(|r| Some(Some(r)))
        }
        (Ok(Value::Nil), Ok(fields)) => {
            let fields: Vec<Option<String>> =
                redis::from_redis_value(fields).map_err(StoreError::backend)?;
            if fields.iter().all(Option::is_none) {
                Ok(Some(None))
            } else {
                // Nil to GET, fields to HMGET: a hash that appeared between.
                Ok(None)
            }
        }
        (get, Ok(fields)) if wrong_type(&get) => {
            let fields: Vec<Option<String>> =
                redis::from_redis_value(fields).map_err(StoreError::backend)?;
            read_hash(handler, key, fields, pttl, now).map(Some)
        }
        // Nil to GET and a string to HMGET, or a type neither expected:
        // it changed between the commands.
        (Ok(Value::Nil), hmget) if wrong_type(&hmget) => Ok(None),
        (get, hmget) if wrong_type(&get) && wrong_type(&hmget) => Ok(None),
        (Ok(Value::Nil), Err(e)) | (Err(e), _) => Err(backend(e)),
        (Ok(other), _) => Err(reply_err("a read", &other)),
    }
}

/// A fencing token: 32 hex digits, unique in the process (a counter) and
/// across processes (a random number drawn once per process), made without
/// a system call.
fn new_token() -> String {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU64, Ordering};
    static SEED: OnceLock<u64> = OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let seed = *SEED.get_or_init(|| uuid::Uuid::new_v4().as_u64_pair().0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let mut token = String::with_capacity(32);
    record::push_hex(&mut token, seed);
    record::push_hex(&mut token, n);
    token
}

/// One claim in the making: the key, the new token, the moment, and what
/// the claim writes.
struct Claiming<'a> {
    spec: &'static HandlerSpec,
    rkey: String,
    fingerprint: Option<&'a str>,
    token: String,
    now: i64,
}

/// What a claim does next.
enum Step {
    Done(Claim),
    /// Replace the record the claim read.
    Swap(Swap),
    /// The key holds a hash of an earlier release: claim it by the
    /// previous release's rules.
    Hash,
}

impl Step {
    /// The claim, or, when other deliveries kept changing the record under
    /// this one, the answer that it is busy.
    fn done_or_contended(self) -> Claim {
        match self {
            Step::Done(claim) => claim,
            Step::Swap(_) | Step::Hash => Claim::Refused(Standing::InProgress {
                retry_after: crate::retry::MIN_RETRY,
            }),
        }
    }
}

/// Write `value` for `px` ms if the key still holds `expected` (`None`:
/// nothing); once written, the claim is acquired, or (`refused`) it
/// settled a stalled claim as the last failure and is refused with that.
struct Swap {
    expected: Option<Vec<u8>>,
    value: String,
    px: i64,
    refused: Option<Standing>,
}

impl<'a> Claiming<'a> {
    fn new(
        store: &RedisStore,
        spec: &'static HandlerSpec,
        key: &Key,
        fingerprint: Option<&'a str>,
    ) -> Claiming<'a> {
        Claiming {
            spec,
            rkey: store.redis_key(spec.name, key),
            fingerprint,
            token: new_token(),
            now: store.clock.now_millis(),
        }
    }

    fn lease_ms(&self) -> i64 {
        millis(self.spec.lease).max(1)
    }

    fn ttl_ms(&self) -> i64 {
        millis(self.spec.ttl).max(1)
    }

    /// How long the key of a claim carrying `failures` lives: its lease, and
    /// a ttl more when it counts (a handler with `max_attempts`, or a claim
    /// that carries failures), so that a consumer that stops inside it is
    /// counted.
    fn px(&self, failures: i64) -> i64 {
        if failures > 0 || self.spec.max_attempts.is_some() {
            self.lease_ms().saturating_add(self.ttl_ms())
        } else {
            self.lease_ms()
        }
    }

    /// The claim's record, carrying `attempts`, `failures` and `last_error`.
    fn value(&self, attempts: i64, failures: i64, last_error: Option<&str>) -> String {
        Parts {
            status: Status::InProgress,
            created: self.now,
            updated: self.now,
            lease_end: Some(expiry(
                self.now,
                self.spec.lease.max(Duration::from_millis(1)),
            )),
            attempts,
            failures,
            token: &self.token,
            fingerprint: self.fingerprint.unwrap_or_default(),
            last_error,
            outcome: "",
        }
        .encode()
    }

    /// `SET key <claim> NX PX <lease> GET`.
    fn set(&self) -> Cmd {
        let value = self.value(1, 0, None);
        let mut cmd = Cmd::with_capacity(7, 32 + self.rkey.len() + value.len());
        cmd.arg("SET")
            .arg(&self.rkey)
            .arg(value)
            .arg("NX")
            .arg("PX")
            .arg(self.px(0))
            .arg("GET");
        cmd
    }

    fn swap(&self, scripts: &Scripts, swap: &Swap) -> Cmd {
        let mut cmd = scripts.swap.on(&self.rkey);
        cmd.arg(swap.expected.as_deref().unwrap_or_default())
            .arg(&swap.value)
            .arg(swap.px);
        cmd
    }

    fn hash_claim(&self, scripts: &Scripts) -> Cmd {
        let mut cmd = scripts.hash_claim.on(&self.rkey);
        cmd.arg(&self.token)
            .arg(self.lease_ms())
            .arg(self.now)
            .arg(self.fingerprint.unwrap_or_default())
            .arg(
                self.spec
                    .max_attempts
                    .map(|m| m.to_string())
                    .unwrap_or_default(),
            )
            .arg(self.ttl_ms())
            .arg(LEASE_RAN_OUT);
        cmd
    }

    fn acquired(&self) -> Claim {
        Claim::Acquired {
            token: self.token.clone(),
        }
    }

    /// After `SET ... NX ... GET`: claimed, or the record that stands.
    fn after_set(&self, reply: exec::Reply) -> Result<Step, StoreError> {
        match reply {
            Ok(Value::Nil) => Ok(Step::Done(self.acquired())),
            Ok(Value::BulkString(found)) => self.plan(Some(found)),
            Ok(other) => Err(reply_err("a claim", &other)),
            Err(e) if e.code() == Some("WRONGTYPE") => Ok(Step::Hash),
            Err(e) => Err(backend(e)),
        }
    }

    /// What the claim does about the record it found (`None`: the key is
    /// free), by the rules every store shares ([`ClaimPlan`]).
    fn plan(&self, found: Option<Vec<u8>>) -> Result<Step, StoreError> {
        let Some(found) = found else {
            return Ok(Step::Swap(Swap {
                expected: None,
                value: self.value(1, 0, None),
                px: self.px(0),
                refused: None,
            }));
        };
        // The key exists, so a record that is not in progress has not
        // expired: Redis would have deleted it.
        let mut record = record::decode("", "", &found, i64::MAX)?;
        if record.token.as_deref() == Some(self.token.as_str()) {
            // This claim's own write, its reply lost and the command sent
            // again.
            return Ok(Step::Done(self.acquired()));
        }
        Ok(
            match ClaimPlan::of(Some(&record), self.spec, self.fingerprint, self.now) {
                ClaimPlan::Refused(standing) => Step::Done(Claim::Refused(standing)),
                ClaimPlan::Exhausted(exhausted) => {
                    settle_stall(&mut record, self.now, self.spec.ttl);
                    Step::Swap(Swap {
                        value: Parts::of(&record).encode(),
                        expected: Some(found),
                        px: self.ttl_ms(),
                        refused: Some(exhausted),
                    })
                }
                ClaimPlan::Take(carried) => Step::Swap(Swap {
                    value: self.value(
                        carried.attempts,
                        carried.failures,
                        carried.last_error.as_deref(),
                    ),
                    expected: Some(found),
                    px: self.px(carried.failures),
                    refused: None,
                }),
            },
        )
    }

    /// After the swap: done, or the record changed meanwhile and the claim
    /// looks again at what it is now.
    fn after_swap(&self, swap: Swap, reply: exec::Reply) -> Result<Step, StoreError> {
        let reply = reply.map_err(backend)?;
        match int_tagged(&reply) {
            Some((1, _)) => Ok(Step::Done(match swap.refused {
                Some(standing) => Claim::Refused(standing),
                None => self.acquired(),
            })),
            Some((0, [current])) => self.plan(bytes(current)?),
            Some((2, _)) => Ok(Step::Hash),
            _ => Err(reply_err("a claim", &reply)),
        }
    }

    /// After the claim of a hash: the previous release's answers.
    fn after_hash(&self, reply: exec::Reply) -> Result<Step, StoreError> {
        let reply = reply.map_err(backend)?;
        let text = |v: &Value| -> Result<String, StoreError> {
            Ok(bytes(v)?
                .map(|b| String::from_utf8(b).map_err(|e| StoreError::Schema(e.to_string())))
                .transpose()?
                .unwrap_or_default())
        };
        let int = |v: &Value| match v {
            Value::Int(i) => Ok(*i),
            other => Err(reply_err("a claim", other)),
        };
        let standing = match int_tagged(&reply) {
            Some((1, [])) => return Ok(Step::Done(self.acquired())),
            Some((2, [outcome])) => Standing::Completed {
                outcome: text(outcome)?,
            },
            Some((3, [left])) => Standing::InProgress {
                retry_after: Duration::from_millis(u64::try_from(int(left)?).unwrap_or(0)),
            },
            Some((4, [recorded])) => Standing::Mismatch {
                recorded: text(recorded)?,
            },
            Some((5, [error])) => Standing::Failed {
                error: text(error)?,
            },
            Some((6, [failures, rest @ ..])) if rest.len() <= 1 => Standing::Exhausted {
                failures: u32::try_from(int(failures)?).unwrap_or(u32::MAX),
                last_error: match rest.first() {
                    Some(e) => bytes(e)?
                        .map(String::from_utf8)
                        .transpose()
                        .map_err(|e| StoreError::Schema(e.to_string()))?,
                    None => None,
                },
            },
            Some((7, [current])) => return self.plan(bytes(current)?),
            _ => return Err(reply_err("a claim", &reply)),
        };
        Ok(Step::Done(Claim::Refused(standing)))
    }
}

/// A function's `{tag, ...}` reply as the tag and the rest.
fn int_tagged(reply: &Value) -> Option<(i64, &[Value])> {
    match reply {
        Value::Array(parts) => match parts.split_first() {
            Some((Value::Int(tag), rest)) => Some((*tag, rest)),
            _ => None,
        },
        _ => None,
    }
}

/// A bulk string's bytes, or `None` for nil.
fn bytes(v: &Value) -> Result<Option<Vec<u8>>, StoreError> {
    match v {
        Value::BulkString(b) => Ok(Some(b.clone())),
        Value::Nil => Ok(None),
        other => Err(reply_err("a claim", other)),
    }
}

/// Whether a function answered `1`.
fn one(reply: exec::Reply) -> Result<bool, StoreError> {
    match reply.map_err(backend)? {
        Value::Int(n) => Ok(n == 1),
        other => Err(reply_err("a function", &other)),
    }
}

impl RedisStore {
    /// The Redis key of the record of stored key `key` under `handler`.
    fn redis_key_of(&self, handler: &str, key: &str) -> String {
        // The handler name is length-prefixed like the key's parts, so no two
        // (handler, key) pairs share a Redis key whatever the name holds.
        let mut rkey = String::with_capacity(self.prefix.len() + handler.len() + key.len() + 8);
        rkey.push_str(&self.prefix);
        rkey.push_str(":{");
        record::push_int(&mut rkey, i64::try_from(handler.len()).unwrap_or(i64::MAX));
        rkey.push(':');
        rkey.push_str(handler);
        rkey.push('|');
        rkey.push_str(key);
        rkey.push('}');
        rkey
    }

    /// The handler and the stored key of a Redis key of this store's
    /// prefix; `None` for any other key.
    fn parse_redis_key<'k>(&self, rkey: &'k str) -> Option<(&'k str, &'k str)> {
        let inner = rkey
            .strip_prefix(&*self.prefix)?
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

    /// The records of `handler` (or of every handler), in no order: the
    /// keys found by `SCAN`, read in pipelines of [`SCAN_COUNT`].
    async fn scan_records(&self, handler: Option<&str>) -> Result<Vec<Record>, StoreError> {
        let keys = self.scan(&self.pattern(handler)).await?;
        let found: Vec<(&str, &str)> = keys
            .iter()
            .filter_map(|rkey| self.parse_redis_key(rkey))
            .filter(|(h, _)| handler.is_none_or(|handler| *h == handler))
            .collect();
        let mut records = Vec::with_capacity(found.len());
        for batch in found.chunks(SCAN_COUNT) {
            let cmds: Vec<Cmd> = batch
                .iter()
                .flat_map(|(handler, key)| read_cmds(&self.redis_key_of(handler, key)))
                .collect();
            let mut replies = self.send_all(&cmds).await?.into_iter();
            let now = self.clock.now_millis();
            for (handler, key) in batch {
                let three: Vec<exec::Reply> = replies.by_ref().take(3).collect();
                match read_replies(handler, key, three, now)? {
                    Some(record) => records.extend(record),
                    // It changed type while the batch was read.
                    None => records.extend(self.read(handler, key).await?),
                }
            }
        }
        Ok(records)
    }

    fn complete_cmd(&self, spec: &HandlerSpec, key: &Key, token: &str, outcome: &str) -> Cmd {
        let mut cmd = self.scripts.complete.on(&self.redis_key(spec.name, key));
        cmd.arg(token)
            .arg(outcome)
            .arg(millis(spec.ttl).max(1))
            .arg(self.clock.now_millis());
        cmd
    }

    fn release_cmd(&self, spec: &HandlerSpec, key: &Key, token: &str) -> Cmd {
        let mut cmd = self.scripts.release.on(&self.redis_key(spec.name, key));
        cmd.arg(token).arg(self.clock.now_millis());
        cmd
    }

    fn extend_cmd(&self, spec: &HandlerSpec, key: &Key, token: &str) -> Cmd {
        let now = self.clock.now_millis();
        let lease = millis(spec.lease).max(1);
        let mut cmd = self.scripts.extend.on(&self.redis_key(spec.name, key));
        cmd.arg(token)
            .arg(now)
            .arg(now.saturating_add(lease))
            .arg(lease)
            .arg(lease.saturating_add(millis(spec.ttl).max(1)))
            .arg(if spec.max_attempts.is_some() {
                "1"
            } else {
                "0"
            });
        cmd
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

/// What a server answered a command that must succeed.
fn answered(reply: exec::Reply) -> Result<Value, StoreError> {
    reply.map_err(backend)
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
        self.claim_one(&Claiming::new(self, spec, key, fingerprint))
            .await
    }

    async fn fail(
        &self,
        spec: &'static HandlerSpec,
        key: &Key,
        token: &str,
        failure: Failure<'_>,
    ) -> Result<bool, StoreError> {
        let mut cmd = self.scripts.fail.on(&self.redis_key(spec.name, key));
        cmd.arg(token)
            .arg(record::status_letter(failure.status()).to_string())
            .arg(failure.recorded().unwrap_or_default())
            .arg(failure.text())
            .arg(millis(spec.ttl).max(1))
            .arg(self.clock.now_millis());
        one(self.call(&cmd).await?)
    }

    async fn complete(
        &self,
        spec: &'static HandlerSpec,
        key: &Key,
        token: &str,
        outcome: &str,
    ) -> Result<bool, StoreError> {
        let cmd = self.complete_cmd(spec, key, token, outcome);
        one(self.call(&cmd).await?)
    }

    async fn release(
        &self,
        spec: &'static HandlerSpec,
        key: &Key,
        token: &str,
    ) -> Result<(), StoreError> {
        let cmd = self.release_cmd(spec, key, token);
        answered(self.call(&cmd).await?).map(drop)
    }

    async fn extend(
        &self,
        spec: &'static HandlerSpec,
        key: &Key,
        token: &str,
    ) -> Result<bool, StoreError> {
        let cmd = self.extend_cmd(spec, key, token);
        one(self.call(&cmd).await?)
    }

    /// One pipelined round trip of `SET ... NX PX ... GET`, one per key;
    /// then, for the keys whose record may be replaced or is a hash only,
    /// one more of the functions that do it.
    async fn claim_batch(
        &self,
        spec: &'static HandlerSpec,
        items: &[BatchItem<'_>],
    ) -> Result<Vec<Claim>, StoreError> {
        let claimings: Vec<Claiming<'_>> = items
            .iter()
            .map(|item| Claiming::new(self, spec, item.key, item.fingerprint))
            .collect();
        let mut steps = Vec::with_capacity(claimings.len());
        match self.claim_steps(&claimings, &mut steps).await {
            Ok(()) => Ok(steps.into_iter().map(Step::done_or_contended).collect()),
            Err(e) => {
                // Give back what the batch took before it failed.
                let held: Vec<Held<'_>> = items
                    .iter()
                    .zip(&steps)
                    .filter_map(|(item, step)| match step {
                        Step::Done(Claim::Acquired { token }) => Some(Held {
                            key: item.key,
                            token,
                        }),
                        _ => None,
                    })
                    .collect();
                if let Err(e) = self.release_batch(spec, &held).await {
                    tracing::warn!(error = %e, "could not release a batch's claims; they free themselves when their leases run out");
                }
                Err(e)
            }
        }
    }

    /// One pipelined round trip of completion functions.
    async fn complete_batch(
        &self,
        spec: &'static HandlerSpec,
        done: &[(Held<'_>, &str)],
    ) -> Result<Vec<bool>, StoreError> {
        let cmds: Vec<Cmd> = done
            .iter()
            .map(|(held, outcome)| self.complete_cmd(spec, held.key, held.token, outcome))
            .collect();
        self.send_all(&cmds).await?.into_iter().map(one).collect()
    }

    /// One pipelined round trip of release functions.
    async fn release_batch(
        &self,
        spec: &'static HandlerSpec,
        held: &[Held<'_>],
    ) -> Result<(), StoreError> {
        let cmds: Vec<Cmd> = held
            .iter()
            .map(|held| self.release_cmd(spec, held.key, held.token))
            .collect();
        for reply in self.send_all(&cmds).await? {
            answered(reply)?;
        }
        Ok(())
    }

    /// One pipelined round trip of extension functions.
    async fn extend_batch(
        &self,
        spec: &'static HandlerSpec,
        held: &[Held<'_>],
    ) -> Result<Vec<bool>, StoreError> {
        let cmds: Vec<Cmd> = held
            .iter()
            .map(|held| self.extend_cmd(spec, held.key, held.token))
            .collect();
        self.send_all(&cmds).await?.into_iter().map(one).collect()
    }
}

impl RedisStore {
    /// The steps of a batch of claims, each round of them in one pipelined
    /// round trip, until every claim is taken or refused; `steps` holds
    /// where each claim got to, also when a round fails.
    async fn claim_steps(
        &self,
        claimings: &[Claiming<'_>],
        steps: &mut Vec<Step>,
    ) -> Result<(), StoreError> {
        let sets: Vec<Cmd> = claimings.iter().map(Claiming::set).collect();
        for (claiming, reply) in claimings.iter().zip(self.send_all(&sets).await?) {
            steps.push(claiming.after_set(reply)?);
        }
        for _ in 0..MAX_SWAPS {
            let pending: Vec<usize> = (0..steps.len())
                .filter(|&i| !matches!(steps[i], Step::Done(_)))
                .collect();
            if pending.is_empty() {
                break;
            }
            let cmds: Vec<Cmd> = pending
                .iter()
                .map(|&i| match &steps[i] {
                    Step::Swap(swap) => claimings[i].swap(&self.scripts, swap),
                    _ => claimings[i].hash_claim(&self.scripts),
                })
                .collect();
            let replies = self.send_all(&cmds).await?;
            for (&i, reply) in pending.iter().zip(replies) {
                let claiming = &claimings[i];
                steps[i] = match std::mem::replace(&mut steps[i], Step::Hash) {
                    Step::Swap(swap) => claiming.after_swap(swap, reply)?,
                    _ => claiming.after_hash(reply)?,
                };
            }
        }
        Ok(())
    }
}

/// Redis expires its records by itself (key TTLs): [`Inspect::sweep`]
/// deletes nothing. Every operation reads records in this release's format
/// and in the hash format of earlier releases. Listing and counting `SCAN`
/// the keys of the store's prefix (on every master of a cluster) and read
/// the records in pipelines, so they take time in proportion to the
/// records; [`Inspect::list`] reads every record of the handler to sort
/// them.
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
        let mut cmd = self.scripts.forget.on(&self.redis_key_of(handler, key));
        cmd.arg(if force { "1" } else { "0" })
            .arg(self.clock.now_millis());
        let done = answered(self.call(&cmd).await?)?;
        Ok(match done {
            Value::Int(1) => Forgot::Deleted(record),
            Value::Int(2) => Forgot::Refused(self.read(handler, key).await?.unwrap_or(record)),
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

fn reply_err(what: &str, v: &Value) -> StoreError {
    StoreError::Schema(format!("unexpected reply to {what}: {v:?}"))
}

#[cfg(test)]
mod tests {
    use super::{glob_escape, new_token};

    #[test]
    fn glob_characters_are_escaped() {
        assert_eq!(glob_escape("plain_name"), "plain_name");
        assert_eq!(glob_escape(r"a*b?c[d]e\f"), r"a\*b\?c\[d\]e\\f");
    }

    #[test]
    fn tokens_are_distinct_hex_of_fixed_length() {
        let tokens: std::collections::HashSet<String> = (0..10_000).map(|_| new_token()).collect();
        assert_eq!(tokens.len(), 10_000);
        assert!(
            tokens
                .iter()
                .all(|t| t.len() == 32 && t.bytes().all(|b| b.is_ascii_hexdigit()))
        );
    }
}
