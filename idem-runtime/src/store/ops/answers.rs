//! What [`Inspect`](super::Inspect) answers with: counts by handler and
//! status, a forgotten key, a sweep, the table's schema version.

use serde::Serialize;

use super::{Record, Status};

/// One handler's records, counted by [`Inspect::stats`](super::Inspect::stats).
///
/// # Examples
///
/// ```
/// use idem_runtime::store::ops::{HandlerStats, Record, Status};
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
    /// use idem_runtime::store::ops::{HandlerStats, Status};
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
    /// use idem_runtime::store::ops::{HandlerStats, Record, Status};
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

/// The records of a store, counted by handler: what [`Inspect::stats`](super::Inspect::stats)
/// returns.
///
/// # Examples
///
/// ```
/// use idem_runtime::store::ops::{Record, Stats, Status};
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
    /// use idem_runtime::store::ops::{Record, Stats, Status};
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

/// What [`Inspect::forget`](super::Inspect::forget) did.
///
/// # Examples
///
/// ```
/// use idem_runtime::store::ops::{Forgot, Record, Status};
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
    /// use idem_runtime::store::ops::{Forgot, Record, Status};
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

/// What [`Inspect::sweep`](super::Inspect::sweep) did.
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

/// The version of a store's schema: what [`Inspect::schema`](super::Inspect::schema) returns.
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
