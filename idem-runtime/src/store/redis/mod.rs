//! The Redis store (feature `redis`): lease mode on a single server or a
//! Redis Cluster.
//!
//! [`RedisStore`] and its constructors are here; the rest is one concern a
//! file, each using only those above it:
//!
//! * `record.rs`: the record format (a string value, or an earlier
//!   release's hash) and how it reads as a [`Record`](crate::Record);
//! * `scripts.rs`: the Lua code of the store's functions;
//! * `library.rs`: the Lua library put together from them, and how one of
//!   its functions is called;
//! * `exec.rs`: the connection (one server or a cluster), how commands are
//!   sent on it, one at a time or pipelined (on a cluster, each command
//!   on its own, all sent at once), and how their replies read;
//! * `keys.rs`: the Redis key of a record, and finding records by `SCAN`
//!   (on every master of a cluster);
//! * `read.rs`: reading a record with plain commands;
//! * `claim.rs`: the claim, `SET ... NX PX ... GET` and then the function
//!   that replaces the record found, step by step, one key or a batch;
//! * `lease.rs`: [`LeaseStore`](crate::store::LeaseStore): the claim, completion,
//!   failure, release and extension, one key or a batch;
//! * `inspect.rs`: [`Inspect`](crate::store::Inspect), what an operator asks.
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

mod claim;
mod exec;
mod inspect;
mod keys;
mod lease;
mod library;
mod read;
mod record;
mod scripts;
#[cfg(feature = "tls")]
mod tls;

use std::sync::Arc;
use std::time::Duration;

use crate::clock::{Clock, SystemClock};
use crate::error::StoreError;
use crate::registry;
use exec::Conn;
use library::Library;

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

/// The Redis store: lease mode with fencing tokens and native expiry.
///
/// It connects to one server ([`connect`](Self::connect)) or to a Redis
/// Cluster ([`connect_cluster`](Self::connect_cluster)), Redis 7.0 or
/// later (it loads a library of Lua functions). Each record is one value
/// under [`redis_key`](Self::redis_key), which Redis expires by itself;
/// the store is a [`LeaseStore`](crate::store::LeaseStore) and answers
/// [`Inspect`](crate::store::Inspect) (`idem show`, `list`, `stats`, `forget`).
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
    library: Arc<Library>,
    clock: Arc<dyn Clock>,
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
        #[cfg(feature = "tls")]
        tls::default_provider();
        let client = redis::Client::open(url).map_err(exec::backend)?;
        Ok(Self::with_conn(Conn::single(client).await?))
    }

    /// Connects to one server over TLS (`rediss://host:port/db`), verified
    /// with `tls`: its CA instead of the system's roots, its client
    /// certificate for a server started with `tls-auth-clients yes`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_runtime::{tls::Tls, RedisStore};
    ///
    /// let tls = Tls::new()
    ///     .ca_file("/etc/ssl/cache-ca.pem")?
    ///     .client_identity_files("/etc/ssl/app.pem", "/etc/ssl/app.key")?;
    /// let store = RedisStore::connect_tls("rediss://:secret@cache.internal:6380/2", &tls).await?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    pub async fn connect_tls(url: &str, tls: &crate::tls::Tls) -> Result<Self, StoreError> {
        registry::check()?;
        let client = tls::client(url, tls)?;
        Ok(Self::with_conn(Conn::single(client).await?))
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
        #[cfg(feature = "tls")]
        tls::default_provider();
        let builder = redis::cluster::ClusterClient::builder(nodes);
        Ok(Self::with_conn(Conn::cluster(builder).await?))
    }

    /// Connects to a Redis Cluster over TLS (`rediss://` nodes), verified
    /// with `tls`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_runtime::{tls::Tls, RedisStore};
    ///
    /// let tls = Tls::new().ca_file("/etc/ssl/cache-ca.pem")?;
    /// let store = RedisStore::connect_cluster_tls(&["rediss://10.0.0.1:7000"], &tls).await?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    pub async fn connect_cluster_tls<I: AsRef<str>>(
        nodes: &[I],
        tls: &crate::tls::Tls,
    ) -> Result<Self, StoreError> {
        registry::check()?;
        let builder = tls::cluster(nodes, tls)?;
        Ok(Self::with_conn(Conn::cluster(builder).await?))
    }

    fn with_conn(conn: Conn) -> Self {
        RedisStore {
            conn,
            prefix: Arc::from(DEFAULT_PREFIX),
            library: Arc::new(Library::new()),
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

    /// Reads the created and updated times, and the end of a claim's lease,
    /// from `clock`. The expiry of a completed, failed or retry record is
    /// Redis's own: the ttl after the write, by the server's clock, written
    /// in the record as it is set, so [`record`](Self::record) reads the
    /// same expiry each time.
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
}
