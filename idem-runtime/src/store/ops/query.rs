//! Which records an operator lists: a [`Query`], its [`Filter`] and
//! [`Order`].

use serde::Serialize;

use super::{Record, Status};

/// How many records [`Query::new`] lists at most.
///
/// # Examples
///
/// ```
/// use idem_runtime::store::ops::{DEFAULT_LIMIT, Query};
/// assert_eq!(Query::new().limit, DEFAULT_LIMIT);
/// ```
pub const DEFAULT_LIMIT: u32 = 100;

/// Which of a handler's records [`Inspect::list`](super::Inspect::list) returns.
///
/// # Examples
///
/// ```
/// use idem_runtime::store::ops::{Filter, Record, Status};
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
    /// use idem_runtime::store::ops::{Filter, Record, Status};
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

/// In which order [`Inspect::list`](super::Inspect::list) returns records: by when their current
/// claim was made (`created_at_ms`), then by key.
///
/// # Examples
///
/// ```
/// use idem_runtime::store::ops::{Order, Query};
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

/// What [`Inspect::list`](super::Inspect::list) returns: which records, how many at most, in
/// which order.
///
/// # Examples
///
/// ```
/// use idem_runtime::store::ops::{Filter, Order, Query};
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
    /// use idem_runtime::store::ops::{Filter, Query};
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
    /// use idem_runtime::store::ops::{Filter, Query, Status};
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
    /// use idem_runtime::store::ops::{Order, Query};
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
