//! What an operator asks a store, apart from any handler: the [`Inspect`]
//! trait (look a record up, list a handler's records, count them, forget a
//! key, sweep, name the handlers, the table's schema version), the types it
//! answers with.
//!
//! Every store of this crate implements [`Inspect`]: the SQL stores
//! (written once for the three databases, in `store/sql/inspect.rs`), Redis
//! and the memory store. The `idem` command-line tool (crate `idem-cli`) is
//! built on it.
//!
//! Keys are given and returned in their stored form
//! ([`Key::as_str`](crate::Key::as_str)): build one from its parts with
//! [`Key::from_parts`](crate::Key::from_parts), exactly as a handler derives
//! it, or check a stored key someone pasted with
//! [`StoredKey::parse`](crate::store::StoredKey::parse).
//!
//! # Examples
//!
//! ```
//! # use idem_runtime::registry::{HandlerSpec, Mode};
//! # use std::time::Duration;
//! # static SPEC: HandlerSpec = HandlerSpec {
//! #     name: "notify", function: "notify", key: "message_id",
//! #     ttl: Duration::from_secs(3_600), lease: Duration::from_secs(30),
//! #     store: "memory", mode: Mode::Lease, module: "app", file: "src/app.rs", line: 1,
//! #     fingerprint: None, max_attempts: None,
//! # };
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use idem_runtime::store::{Forgot, Inspect, Query, Status};
//! use idem_runtime::store::LeaseStore;
//! use idem_runtime::{Key, MemoryStore};
//!
//! let store = MemoryStore::new();
//! let key = Key::from_parts(&[&"m-1"])?;
//! let claim = store.claim(&SPEC, &key, None).await?;
//! # let idem_runtime::store::Claim::Fresh { token } = claim else { panic!() };
//! # store.complete(&SPEC, &key, &token, "42").await?;
//!
//! let record = Inspect::lookup(&store, "notify", key.as_str()).await?.unwrap();
//! assert_eq!(record.status, Status::Completed);
//! assert_eq!(store.list("notify", Query::new()).await?.len(), 1);
//! assert_eq!(store.stats().await?.handlers[0].completed, 1);
//!
//! // let the message run again
//! assert!(matches!(store.forget("notify", key.as_str(), false).await?, Forgot::Deleted(_)));
//! # Ok(()) }
//! ```

use std::future::Future;

use serde::Serialize;

use crate::error::StoreError;
use crate::store::{Record, Status};

/// How many records [`Query::new`] lists at most.
///
/// # Examples
///
/// ```
/// use idem_runtime::store::{DEFAULT_LIMIT, Query};
/// assert_eq!(Query::new().limit, DEFAULT_LIMIT);
/// ```
pub const DEFAULT_LIMIT: u32 = 100;

/// How many expired records [`Inspect::sweep`] deletes in one statement.
#[cfg(feature = "_sql")]
const SWEEP_BATCH: u32 = 1_000;

/// Which of a handler's records [`Inspect::list`] returns.
///
/// # Examples
///
/// ```
/// use idem_runtime::store::{Filter, Record, Status};
///
/// let mut record = Record::new("notify", "3:m-1", Status::InProgress, 0, 30_000);
/// assert!(Filter::Any.matches(&record, 10_000));
/// assert!(!Filter::Stuck.matches(&record, 10_000)); // its lease runs
/// assert!(Filter::Stuck.matches(&record, 30_000)); // its lease ran out
/// record.failures = 1;
/// assert!(Filter::Failed.matches(&record, 10_000));
/// assert!(Filter::Status(Status::InProgress).matches(&record, 10_000));
/// (record.status, record.max_attempts) = (Status::Retry, Some(1));
/// assert!(Filter::Exhausted.matches(&record, 10_000));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case", tag = "filter", content = "status")]
#[non_exhaustive]
pub enum Filter {
    /// Every record, expired or not.
    #[default]
    Any,
    /// The records of one status.
    Status(Status),
    /// Claims in progress past their lease: the consumer stopped, or
    /// stalled; the next delivery takes the key over.
    Stuck,
    /// Records that saw a failure: at least one failed delivery counted
    /// (`failures > 0`), or the status `failed` or `retry`.
    Failed,
    /// Keys that used up their attempts: live `retry` records whose
    /// failures reached the `max_attempts` they recorded
    /// ([`Record::is_exhausted`]). Their deliveries are refused until the
    /// record expires or is forgotten.
    Exhausted,
}

impl Filter {
    /// Whether `record` passes this filter at `now_ms` (ms since the epoch,
    /// by the store's clock). The SQL stores write the same rule in SQL.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::store::{Filter, Record, Status};
    /// let record = Record::new("notify", "3:m-1", Status::Failed, 0, 60_000);
    /// assert!(Filter::Failed.matches(&record, 1_000));
    /// assert!(!Filter::Status(Status::Completed).matches(&record, 1_000));
    /// ```
    pub fn matches(&self, record: &Record, now_ms: i64) -> bool {
        match self {
            Filter::Any => true,
            Filter::Status(status) => record.status == *status,
            Filter::Stuck => record.status == Status::InProgress && record.is_expired(now_ms),
            Filter::Failed => {
                record.failures > 0 || matches!(record.status, Status::Failed | Status::Retry)
            }
            Filter::Exhausted => record.is_exhausted(now_ms),
        }
    }
}

/// In which order [`Inspect::list`] returns records: by when their current
/// claim was made (`created_at_ms`), then by key.
///
/// # Examples
///
/// ```
/// use idem_runtime::store::{Order, Query};
/// assert_eq!(Query::new().order, Order::OldestFirst);
/// assert_eq!(Order::NewestFirst.as_str(), "newest_first");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Order {
    /// The oldest claim first: what has waited longest (the default).
    #[default]
    OldestFirst,
    /// The newest claim first.
    NewestFirst,
}

impl Order {
    /// `"oldest_first"` or `"newest_first"`.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::store::Order;
    /// assert_eq!(Order::OldestFirst.as_str(), "oldest_first");
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            Order::OldestFirst => "oldest_first",
            Order::NewestFirst => "newest_first",
        }
    }
}

/// What [`Inspect::list`] returns: which records, how many at most, in
/// which order.
///
/// # Examples
///
/// ```
/// use idem_runtime::store::{Filter, Order, Query};
///
/// let query = Query::new().filter(Filter::Stuck).limit(20).order(Order::NewestFirst);
/// assert_eq!((query.filter, query.limit, query.order), (Filter::Stuck, 20, Order::NewestFirst));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Query {
    /// Which records.
    #[serde(flatten)]
    pub filter: Filter,
    /// How many at most.
    pub limit: u32,
    /// Oldest or newest first.
    pub order: Order,
}

impl Default for Query {
    fn default() -> Self {
        Query {
            filter: Filter::Any,
            limit: DEFAULT_LIMIT,
            order: Order::OldestFirst,
        }
    }
}

impl Query {
    /// Every record, at most [`DEFAULT_LIMIT`], oldest first.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::store::{Filter, Query};
    /// assert_eq!(Query::new().filter, Filter::Any);
    /// ```
    pub fn new() -> Self {
        Self::default()
    }

    /// Only the records `filter` lets through.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::store::{Filter, Query, Status};
    /// let query = Query::new().filter(Filter::Status(Status::Retry));
    /// assert_eq!(query.filter, Filter::Status(Status::Retry));
    /// ```
    pub fn filter(mut self, filter: Filter) -> Self {
        self.filter = filter;
        self
    }

    /// At most `limit` records.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::store::Query;
    /// assert_eq!(Query::new().limit(5).limit, 5);
    /// ```
    pub fn limit(mut self, limit: u32) -> Self {
        self.limit = limit;
        self
    }

    /// In `order`.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::store::{Order, Query};
    /// assert_eq!(Query::new().order(Order::NewestFirst).order, Order::NewestFirst);
    /// ```
    pub fn order(mut self, order: Order) -> Self {
        self.order = order;
        self
    }

    /// Applies this query to records read in any order (the stores that
    /// cannot ask their server to sort): filters, sorts, cuts.
    pub(crate) fn apply(&self, mut records: Vec<Record>, now_ms: i64) -> Vec<Record> {
        records.retain(|r| self.filter.matches(r, now_ms));
        records.sort_by(|a, b| (a.created_at_ms, &a.key).cmp(&(b.created_at_ms, &b.key)));
        if self.order == Order::NewestFirst {
            records.reverse();
        }
        records.truncate(usize::try_from(self.limit).unwrap_or(usize::MAX));
        records
    }
}

/// One handler's records, counted by [`Inspect::stats`].
///
/// # Examples
///
/// ```
/// use idem_runtime::store::{HandlerStats, Record, Status};
///
/// let mut stats = HandlerStats::new("notify");
/// stats.add(&Record::new("notify", "3:m-1", Status::InProgress, 1_000, 31_000), 40_000);
/// stats.add(&Record::new("notify", "3:m-2", Status::Completed, 2_000, 90_000), 40_000);
/// assert_eq!((stats.records, stats.in_progress, stats.completed), (2, 1, 1));
/// assert_eq!(stats.oldest_in_progress_at_ms, Some(1_000));
/// assert_eq!(stats.expired, 1); // the lease of m-1 ran out
/// assert_eq!(stats.count(Status::Completed), 1);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct HandlerStats {
    /// The handler's registered name.
    pub handler: String,
    /// How many records it has, expired or not.
    pub records: u64,
    /// Claims in progress (live or stuck).
    pub in_progress: u64,
    /// Completed records.
    pub completed: u64,
    /// Records of a final failure.
    pub failed: u64,
    /// Records of a failed delivery waiting for the next one.
    pub retry: u64,
    /// When the oldest claim still in progress was made (its
    /// `created_at_ms`), if any.
    pub oldest_in_progress_at_ms: Option<i64>,
    /// Records expired and not yet swept (leases run out included): they no
    /// longer count, and the next claim or sweep removes them.
    pub expired: u64,
}

impl HandlerStats {
    /// No records yet.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::store::HandlerStats;
    /// assert_eq!(HandlerStats::new("notify").records, 0);
    /// ```
    pub fn new(handler: &str) -> Self {
        HandlerStats {
            handler: handler.to_owned(),
            records: 0,
            in_progress: 0,
            completed: 0,
            failed: 0,
            retry: 0,
            oldest_in_progress_at_ms: None,
            expired: 0,
        }
    }

    /// How many of its records have `status`.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::store::{HandlerStats, Status};
    /// assert_eq!(HandlerStats::new("notify").count(Status::Retry), 0);
    /// ```
    pub fn count(&self, status: Status) -> u64 {
        match status {
            Status::InProgress => self.in_progress,
            Status::Completed => self.completed,
            Status::Failed => self.failed,
            Status::Retry => self.retry,
        }
    }

    /// Counts one record of this handler, read at `now_ms`.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::store::{HandlerStats, Record, Status};
    /// let mut stats = HandlerStats::new("notify");
    /// stats.add(&Record::new("notify", "3:m-1", Status::Retry, 0, 60_000), 1_000);
    /// assert_eq!((stats.records, stats.retry, stats.expired), (1, 1, 0));
    /// ```
    pub fn add(&mut self, record: &Record, now_ms: i64) {
        let oldest = (record.status == Status::InProgress).then_some(record.created_at_ms);
        self.add_group(
            record.status,
            1,
            oldest,
            u64::from(record.is_expired(now_ms)),
        );
    }

    /// Counts `records` records of `status`, the oldest created at
    /// `oldest_ms`, `expired` of them expired.
    pub(crate) fn add_group(
        &mut self,
        status: Status,
        records: u64,
        oldest_ms: Option<i64>,
        expired: u64,
    ) {
        self.records += records;
        self.expired += expired;
        match status {
            Status::InProgress => {
                self.in_progress += records;
                if let Some(at) = oldest_ms {
                    self.oldest_in_progress_at_ms = Some(
                        self.oldest_in_progress_at_ms
                            .map_or(at, |known| known.min(at)),
                    );
                }
            }
            Status::Completed => self.completed += records,
            Status::Failed => self.failed += records,
            Status::Retry => self.retry += records,
        }
    }
}

/// The records of a store, counted by handler: what [`Inspect::stats`]
/// returns.
///
/// # Examples
///
/// ```
/// use idem_runtime::store::{Record, Stats, Status};
///
/// let mut stats = Stats::new(40_000);
/// stats.add(&Record::new("sms", "3:m-1", Status::Completed, 1_000, 90_000));
/// stats.add(&Record::new("points", "3:m-1", Status::Retry, 1_000, 90_000));
/// let names: Vec<&str> = stats.handlers.iter().map(|h| h.handler.as_str()).collect();
/// assert_eq!(names, ["points", "sms"]); // by name
/// assert_eq!(stats.handler("sms").unwrap().completed, 1);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Stats {
    /// When the records were counted, by the store's clock (ms since the
    /// epoch): what "expired" is measured against.
    pub at_ms: i64,
    /// One entry per handler that has records, by name.
    pub handlers: Vec<HandlerStats>,
}

impl Stats {
    /// No handler yet, counted at `at_ms`.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::store::Stats;
    /// assert!(Stats::new(0).handlers.is_empty());
    /// ```
    pub fn new(at_ms: i64) -> Self {
        Stats {
            at_ms,
            handlers: Vec::new(),
        }
    }

    /// The counts of `handler`, if it has records.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::store::Stats;
    /// assert!(Stats::new(0).handler("notify").is_none());
    /// ```
    pub fn handler(&self, handler: &str) -> Option<&HandlerStats> {
        self.handlers.iter().find(|h| h.handler == handler)
    }

    /// Counts one record, under its handler.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::store::{Record, Stats, Status};
    /// let mut stats = Stats::new(0);
    /// stats.add(&Record::new("notify", "3:m-1", Status::Completed, 0, 60_000));
    /// assert_eq!(stats.handler("notify").unwrap().records, 1);
    /// ```
    pub fn add(&mut self, record: &Record) {
        let at = self.at_ms;
        self.entry(&record.handler).add(record, at);
    }

    /// The entry of `handler`, made (in its place by name) if new.
    pub(crate) fn entry(&mut self, handler: &str) -> &mut HandlerStats {
        let at = match self
            .handlers
            .binary_search_by(|h| h.handler.as_str().cmp(handler))
        {
            Ok(at) => at,
            Err(at) => {
                self.handlers.insert(at, HandlerStats::new(handler));
                at
            }
        };
        &mut self.handlers[at]
    }
}

/// What [`Inspect::forget`] did.
///
/// # Examples
///
/// ```
/// use idem_runtime::store::{Forgot, Record, Status};
///
/// let record = Record::new("notify", "3:m-1", Status::Completed, 0, 60_000);
/// let forgot = Forgot::Deleted(record.clone());
/// assert_eq!(forgot.record(), Some(&record));
/// assert_eq!(Forgot::Absent.record(), None);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "result", content = "record")]
#[non_exhaustive]
pub enum Forgot {
    /// The record was deleted: the next delivery of the message runs its
    /// body again. This is the record as read just before the delete.
    Deleted(Record),
    /// There was no record of the key.
    Absent,
    /// A live claim holds the key (in progress, its lease not run out): a
    /// consumer is running the body right now, so the record was left
    /// alone. Forgetting it anyway (`force`) lets another delivery run the
    /// body at the same time.
    Refused(Record),
}

impl Forgot {
    /// The record found, deleted or left alone.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::store::{Forgot, Record, Status};
    /// let record = Record::new("notify", "3:m-1", Status::InProgress, 0, 60_000);
    /// assert_eq!(Forgot::Refused(record.clone()).record(), Some(&record));
    /// ```
    pub fn record(&self) -> Option<&Record> {
        match self {
            Forgot::Deleted(r) | Forgot::Refused(r) => Some(r),
            Forgot::Absent => None,
        }
    }
}

/// What [`Inspect::sweep`] did.
///
/// # Examples
///
/// ```
/// use idem_runtime::store::Swept;
/// let swept = Swept::deleted(3);
/// assert_eq!((swept.deleted, swept.native_expiry), (3, false));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Swept {
    /// How many expired records were deleted.
    pub deleted: u64,
    /// The store expires its records by itself (Redis, with key TTLs), so
    /// there was nothing to sweep.
    pub native_expiry: bool,
}

impl Swept {
    /// A sweep that deleted `deleted` records.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::store::Swept;
    /// assert_eq!(Swept::deleted(0).deleted, 0);
    /// ```
    pub fn deleted(deleted: u64) -> Self {
        Swept {
            deleted,
            native_expiry: false,
        }
    }

    /// The answer of a store that expires its records by itself.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::store::Swept;
    /// assert!(Swept::native().native_expiry);
    /// ```
    pub fn native() -> Self {
        Swept {
            deleted: 0,
            native_expiry: true,
        }
    }
}

/// The version of a store's schema: what [`Inspect::schema`] returns.
///
/// # Examples
///
/// ```
/// use idem_runtime::store::Schema;
/// assert_eq!(Schema::Version { version: 2 }.version(), Some(2));
/// assert_eq!(Schema::NoTable.version(), None);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "schema")]
#[non_exhaustive]
pub enum Schema {
    /// The dedup table exists, at this version (the SQL stores; this
    /// release's is `store::sql::SCHEMA_VERSION`, and `migrate` upgrades an
    /// older one in place).
    Version {
        /// The table's version.
        version: u32,
    },
    /// The dedup table does not exist: the store was never migrated (or
    /// another table was named).
    NoTable,
    /// The store keeps no schema (Redis, memory).
    None,
}

impl Schema {
    /// The version, where there is a table.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::store::Schema;
    /// assert_eq!(Schema::None.version(), None);
    /// ```
    pub fn version(self) -> Option<u32> {
        match self {
            Schema::Version { version } => Some(version),
            Schema::NoTable | Schema::None => None,
        }
    }
}

/// What an operator asks a store: every store of this crate implements it.
///
/// Keys are the stored form ([`Key::as_str`](crate::Key::as_str),
/// `4:A-17|5:apple`); handlers are registered names. Times are read from the
/// store's clock (the SQL and memory stores' [`Clock`](crate::clock::Clock);
/// Redis's own expiry).
///
/// # Examples
///
/// An operator's report, for any store:
///
/// ```
/// use idem_runtime::store::{Filter, Inspect, Query};
/// use idem_runtime::StoreError;
///
/// async fn report(store: &impl Inspect) -> Result<(), StoreError> {
///     for h in store.stats().await?.handlers {
///         println!("{}: {} records, {} in progress", h.handler, h.records, h.in_progress);
///         for stuck in store.list(&h.handler, Query::new().filter(Filter::Stuck)).await? {
///             println!("  stuck since {}: {}", stuck.created_at_ms, stuck.key);
///         }
///     }
///     Ok(())
/// }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), StoreError> {
/// # report(&idem_runtime::MemoryStore::new()).await
/// # }
/// ```
pub trait Inspect: Send + Sync {
    /// The record of `key` (stored form) under `handler`, if any, expired
    /// or not.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_runtime::store::Inspect;
    /// use idem_runtime::{Key, MemoryStore};
    ///
    /// let key = Key::from_parts(&[&"A-17", &"apple"])?;
    /// let store = MemoryStore::new();
    /// assert!(Inspect::lookup(&store, "deduct_stock", key.as_str()).await?.is_none());
    /// # Ok(()) }
    /// ```
    fn lookup(
        &self,
        handler: &str,
        key: &str,
    ) -> impl Future<Output = Result<Option<Record>, StoreError>> + Send;

    /// `handler`'s records that pass `query.filter`, at most `query.limit`,
    /// ordered by `created_at_ms` (when the current claim was made), then by
    /// key: oldest first unless `query.order` says otherwise.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_runtime::store::{Filter, Inspect, Query};
    /// use idem_runtime::MemoryStore;
    ///
    /// let store = MemoryStore::new();
    /// let failed = store.list("deduct_stock", Query::new().filter(Filter::Failed).limit(10)).await?;
    /// assert!(failed.is_empty());
    /// # Ok(()) }
    /// ```
    fn list(
        &self,
        handler: &str,
        query: Query,
    ) -> impl Future<Output = Result<Vec<Record>, StoreError>> + Send;

    /// The records by handler and status, with each handler's oldest claim
    /// in progress and its expired records not yet swept.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_runtime::store::Inspect;
    /// use idem_runtime::MemoryStore;
    ///
    /// let stats = MemoryStore::new().stats().await?;
    /// assert!(stats.handlers.is_empty());
    /// # Ok(()) }
    /// ```
    fn stats(&self) -> impl Future<Output = Result<Stats, StoreError>> + Send;

    /// Deletes the record of `key` under `handler`, so that the message can
    /// run again (after a fix, for a key that failed for good or exhausted
    /// its attempts). A live claim in progress is left alone unless `force`
    /// ([`Forgot::Refused`] says what holds it): a consumer is running the
    /// body right now.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_runtime::store::{Forgot, Inspect};
    /// use idem_runtime::{Key, MemoryStore};
    ///
    /// let key = Key::from_parts(&[&"A-17"])?;
    /// let forgot = MemoryStore::new().forget("deduct_stock", key.as_str(), false).await?;
    /// assert_eq!(forgot, Forgot::Absent);
    /// # Ok(()) }
    /// ```
    fn forget(
        &self,
        handler: &str,
        key: &str,
        force: bool,
    ) -> impl Future<Output = Result<Forgot, StoreError>> + Send;

    /// Deletes every record expired now, in batches; Redis expires its
    /// records by itself and answers [`Swept::native`].
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_runtime::store::Inspect;
    /// use idem_runtime::MemoryStore;
    ///
    /// assert_eq!(Inspect::sweep(&MemoryStore::new()).await?.deleted, 0);
    /// # Ok(()) }
    /// ```
    fn sweep(&self) -> impl Future<Output = Result<Swept, StoreError>> + Send;

    /// The handlers that have records, by name.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_runtime::store::Inspect;
    /// use idem_runtime::MemoryStore;
    ///
    /// assert!(MemoryStore::new().handlers().await?.is_empty());
    /// # Ok(()) }
    /// ```
    fn handlers(&self) -> impl Future<Output = Result<Vec<String>, StoreError>> + Send;

    /// The version of the store's schema, where it has one.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_runtime::store::{Inspect, Schema};
    /// use idem_runtime::MemoryStore;
    ///
    /// assert_eq!(MemoryStore::new().schema().await?, Schema::None);
    /// # Ok(()) }
    /// ```
    fn schema(&self) -> impl Future<Output = Result<Schema, StoreError>> + Send;
}

/// A shared store is inspected as the store itself.
impl<S: Inspect> Inspect for std::sync::Arc<S> {
    fn lookup(
        &self,
        handler: &str,
        key: &str,
    ) -> impl Future<Output = Result<Option<Record>, StoreError>> + Send {
        (**self).lookup(handler, key)
    }

    fn list(
        &self,
        handler: &str,
        query: Query,
    ) -> impl Future<Output = Result<Vec<Record>, StoreError>> + Send {
        (**self).list(handler, query)
    }

    fn stats(&self) -> impl Future<Output = Result<Stats, StoreError>> + Send {
        (**self).stats()
    }

    fn forget(
        &self,
        handler: &str,
        key: &str,
        force: bool,
    ) -> impl Future<Output = Result<Forgot, StoreError>> + Send {
        (**self).forget(handler, key, force)
    }

    fn sweep(&self) -> impl Future<Output = Result<Swept, StoreError>> + Send {
        (**self).sweep()
    }

    fn handlers(&self) -> impl Future<Output = Result<Vec<String>, StoreError>> + Send {
        (**self).handlers()
    }

    fn schema(&self) -> impl Future<Output = Result<Schema, StoreError>> + Send {
        (**self).schema()
    }
}

/// The most calls [`sweep_all`] makes of a partitioned table's sweep: each
/// that removes anything drops a partition or deletes a batch of the
/// default partition's rows, so this bounds a run on a table whose default
/// partition fills as fast as it is swept.
#[cfg(feature = "_sql")]
const PARTITIONED_SWEEPS: usize = 10_000;

#[cfg(feature = "_sql")]
/// Runs `sweep` (one call of at most `batch` records, returning how many
/// it removed) until a call comes back short of a batch; on a
/// `partitioned` table, whose sweep drops a whole partition a call however
/// many rows it held, until a call removes nothing.
pub(crate) async fn sweep_all<F, Fut>(partitioned: bool, mut sweep: F) -> Result<Swept, StoreError>
where
    F: FnMut(u32) -> Fut,
    Fut: Future<Output = Result<u64, StoreError>>,
{
    let mut deleted = 0;
    let mut calls = 0;
    loop {
        let n = sweep(SWEEP_BATCH).await?;
        deleted += n;
        calls += 1;
        let done = if partitioned {
            n == 0 || calls == PARTITIONED_SWEEPS
        } else {
            n < u64::from(SWEEP_BATCH)
        };
        if done {
            return Ok(Swept::deleted(deleted));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::Key;

    fn record(key: &str, status: Status, created: i64, expires: i64) -> Record {
        Record::new("h", key, status, created, expires)
    }

    #[test]
    fn queries_filter_sort_and_cut() {
        let records = vec![
            record("1:c", Status::Completed, 3, 100),
            record("1:a", Status::InProgress, 1, 5),
            record("1:b", Status::Retry, 2, 100),
            record("1:d", Status::InProgress, 2, 100),
        ];
        let keys = |q: Query| -> Vec<String> {
            q.apply(records.clone(), 10)
                .into_iter()
                .map(|r| r.key)
                .collect()
        };
        assert_eq!(keys(Query::new()), ["1:a", "1:b", "1:d", "1:c"]);
        assert_eq!(
            keys(Query::new().order(Order::NewestFirst).limit(2)),
            ["1:c", "1:d"]
        );
        assert_eq!(keys(Query::new().filter(Filter::Stuck)), ["1:a"]);
        assert_eq!(keys(Query::new().filter(Filter::Failed)), ["1:b"]);
        assert!(keys(Query::new().filter(Filter::Exhausted)).is_empty());
        // 1:b out of attempts, by the limit it recorded.
        let mut records = records.clone();
        records[2].failures = 2;
        records[2].max_attempts = Some(2);
        let exhausted: Vec<String> = Query::new()
            .filter(Filter::Exhausted)
            .apply(records, 10)
            .into_iter()
            .map(|r| r.key)
            .collect();
        assert_eq!(exhausted, ["1:b"]);
        assert_eq!(
            keys(Query::new().filter(Filter::Status(Status::InProgress))),
            ["1:a", "1:d"]
        );
        assert!(keys(Query::new().limit(0)).is_empty());
    }

    static SPEC: crate::registry::HandlerSpec = crate::registry::HandlerSpec {
        name: "notify",
        function: "notify",
        key: "id",
        ttl: std::time::Duration::from_secs(3_600),
        lease: std::time::Duration::from_secs(30),
        store: "memory",
        mode: crate::registry::Mode::Lease,
        module: "app",
        file: "app.rs",
        line: 1,
        fingerprint: None,
        max_attempts: Some(2),
    };

    #[tokio::test]
    async fn the_memory_store_is_inspected_as_the_others() {
        use crate::clock::{Clock as _, ManualClock};
        use crate::store::contract::{Claim, Failure, LeaseStore};
        use crate::store::memory::MemoryStore;

        let clock = ManualClock::new(1_000_000);
        let store = MemoryStore::with_clock(clock.clone());
        let k = |id: &str| Key::from_parts(&[&id]).unwrap();
        let Claim::Fresh { token } = store.claim(&SPEC, &k("a"), None).await.unwrap() else {
            panic!()
        };
        let Claim::Fresh { token: b } = store.claim(&SPEC, &k("b"), None).await.unwrap() else {
            panic!()
        };
        let failure = Failure::Counted { error: "timeout" };
        store.fail(&SPEC, &k("b"), &b, failure).await.unwrap();

        assert!(matches!(
            store.forget("notify", k("a").as_str(), false).await.unwrap(),
            Forgot::Refused(r) if r.token.as_deref() == Some(token.as_str())
        ));
        let failed = store
            .list("notify", Query::new().filter(Filter::Failed))
            .await
            .unwrap();
        assert_eq!(failed.len(), 1);
        assert_eq!(failed[0].key, k("b").as_str());
        assert_eq!(failed[0].max_attempts, Some(2));
        // One failure of two: not yet exhausted. A second one exhausts it.
        let exhausted = Query::new().filter(Filter::Exhausted);
        assert!(store.list("notify", exhausted).await.unwrap().is_empty());
        let Claim::Fresh { token: b } = store.claim(&SPEC, &k("b"), None).await.unwrap() else {
            panic!()
        };
        store.fail(&SPEC, &k("b"), &b, failure).await.unwrap();
        let listed = store.list("notify", exhausted).await.unwrap();
        assert_eq!(listed.len(), 1);
        assert!(listed[0].is_exhausted(clock.now_millis()));
        clock.advance(SPEC.lease);
        let stats = store.stats().await.unwrap();
        let h = stats.handler("notify").unwrap();
        assert_eq!((h.records, h.in_progress, h.retry, h.expired), (2, 1, 1, 1));
        assert_eq!(h.oldest_in_progress_at_ms, Some(1_000_000));
        assert_eq!(
            store
                .list("notify", Query::new().filter(Filter::Stuck))
                .await
                .unwrap()[0]
                .key,
            k("a").as_str()
        );
        // Its lease ran out: no longer live, so forgotten without force.
        assert!(matches!(
            store
                .forget("notify", k("a").as_str(), false)
                .await
                .unwrap(),
            Forgot::Deleted(_)
        ));
        assert_eq!(store.handlers().await.unwrap(), ["notify"]);
        assert_eq!(Inspect::sweep(&store).await.unwrap(), Swept::deleted(0));
        clock.advance(SPEC.ttl);
        assert_eq!(Inspect::sweep(&store).await.unwrap(), Swept::deleted(1));
        assert!(store.handlers().await.unwrap().is_empty());
    }
}
