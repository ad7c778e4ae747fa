//! Where stores read the time from.
//!
//! The in-memory store computes claim leases and record expiry from a
//! [`Clock`], so tests can move time forward without sleeping; the Redis
//! store reads one only for the informational `created_at`/`updated_at` of
//! its records (Redis expires them by its own clock). The SQL stores read
//! no consumer clock at all: every statement takes the database's (see
//! [`SqlStore`](crate::store::sql::SqlStore)); a test moves their time with
//! a [`TimeShift`] (feature `test-util`).
//!
//! # Examples
//!
//! ```
//! use idem_runtime::MemoryStore;
//! use idem_runtime::clock::ManualClock;
//! use std::time::Duration;
//!
//! let clock = ManualClock::starting_now();
//! let store = MemoryStore::with_clock(clock.clone());
//! // records the store makes now expire after their ttl; a test need not wait
//! clock.advance(Duration::from_secs(7 * 86_400));
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A source of wall-clock time in milliseconds since the Unix epoch.
///
/// # Examples
///
/// ```
/// use idem_runtime::clock::{Clock, SystemClock};
/// assert!(SystemClock.now_millis() > 1_600_000_000_000);
/// ```
pub trait Clock: Send + Sync + std::fmt::Debug + 'static {
    /// Milliseconds since the Unix epoch.
    ///
    /// # Examples
    ///
    /// A clock fixed at one instant, e.g. to replay a recorded incident:
    ///
    /// ```
    /// use idem_runtime::clock::Clock;
    ///
    /// #[derive(Debug)]
    /// struct Frozen(i64);
    ///
    /// impl Clock for Frozen {
    ///     fn now_millis(&self) -> i64 {
    ///         self.0
    ///     }
    /// }
    ///
    /// assert_eq!(Frozen(1_700_000_000_000).now_millis(), 1_700_000_000_000);
    /// let _store = idem_runtime::MemoryStore::with_clock(Frozen(1_700_000_000_000));
    /// ```
    fn now_millis(&self) -> i64;
}

/// The system's wall clock; the default everywhere.
///
/// # Examples
///
/// ```
/// use idem_runtime::clock::{Clock, SystemClock};
/// let a = SystemClock.now_millis();
/// assert!(SystemClock.now_millis() >= a);
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_millis(&self) -> i64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
    }
}

/// A clock that only moves when told to, for tests of expiry and leases.
///
/// Clones share the same time.
///
/// # Examples
///
/// ```
/// use idem_runtime::clock::{Clock, ManualClock};
/// use std::time::Duration;
///
/// let clock = ManualClock::new(1_000);
/// let shared = clock.clone();
/// clock.advance(Duration::from_secs(2));
/// assert_eq!(shared.now_millis(), 3_000);
/// ```
#[derive(Debug, Clone)]
pub struct ManualClock(Arc<AtomicI64>);

impl ManualClock {
    /// A clock that reads `start_millis` until advanced.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::clock::{Clock, ManualClock};
    /// let clock = ManualClock::new(1_700_000_000_000);
    /// assert_eq!(clock.now_millis(), 1_700_000_000_000);
    /// ```
    pub fn new(start_millis: i64) -> Self {
        Self(Arc::new(AtomicI64::new(start_millis)))
    }

    /// A clock starting at the system's current time.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::clock::{Clock, ManualClock};
    /// assert!(ManualClock::starting_now().now_millis() > 0);
    /// ```
    pub fn starting_now() -> Self {
        Self::new(SystemClock.now_millis())
    }

    /// Moves the clock forward, for this clock and all its clones.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::clock::{Clock, ManualClock};
    /// use std::time::Duration;
    ///
    /// let clock = ManualClock::new(0);
    /// clock.advance(Duration::from_millis(1_500));
    /// clock.advance(Duration::from_secs(1));
    /// assert_eq!(clock.now_millis(), 2_500);
    /// ```
    pub fn advance(&self, by: Duration) {
        let ms = i64::try_from(by.as_millis()).unwrap_or(i64::MAX);
        self.0.fetch_add(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_millis(&self) -> i64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// How far a test has moved a SQL store's time: an offset, in ms, added to
/// the database's clock in every statement of the stores given it with
/// [`SqlStore::with_time_shift`](crate::store::sql::SqlStore::with_time_shift).
/// Only with the feature `test-util`, for tests.
///
/// It starts at zero, or where [`from_millis`](Self::from_millis) puts it
/// (negative: the past), and moves only when told to. Clones share it.
///
/// # Examples
///
/// ```
/// use idem_runtime::clock::TimeShift;
/// use std::time::Duration;
///
/// let shift = TimeShift::new();
/// let shared = shift.clone();
/// shift.advance(Duration::from_secs(2));
/// assert_eq!(shared.millis(), 2_000);
/// assert_eq!(TimeShift::from_millis(-7_200_000).millis(), -7_200_000);
/// ```
#[cfg(feature = "test-util")]
#[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
#[derive(Debug, Clone, Default)]
pub struct TimeShift(Arc<AtomicI64>);

#[cfg(feature = "test-util")]
impl TimeShift {
    /// No shift yet: the database's own time.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(idem_runtime::clock::TimeShift::new().millis(), 0);
    /// ```
    pub fn new() -> Self {
        Self::default()
    }

    /// A shift of `offset` ms (negative: into the past).
    ///
    /// # Examples
    ///
    /// ```
    /// let an_hour_ago = idem_runtime::clock::TimeShift::from_millis(-3_600_000);
    /// assert_eq!(an_hour_ago.millis(), -3_600_000);
    /// ```
    pub fn from_millis(offset: i64) -> Self {
        Self(Arc::new(AtomicI64::new(offset)))
    }

    /// Moves the time forward by `by`, for this shift and all its clones.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::clock::TimeShift;
    /// use std::time::Duration;
    ///
    /// let shift = TimeShift::new();
    /// shift.advance(Duration::from_millis(1_500));
    /// assert_eq!(shift.millis(), 1_500);
    /// ```
    pub fn advance(&self, by: Duration) {
        self.0.fetch_add(millis(by), Ordering::SeqCst);
    }

    /// The offset, in ms.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(idem_runtime::clock::TimeShift::from_millis(5).millis(), 5);
    /// ```
    pub fn millis(&self) -> i64 {
        self.0.load(Ordering::SeqCst)
    }
}

pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// When something that lasts `hold` from `now` (epoch milliseconds) ends: a
/// lease or a record's window. Every store with a clock of its own computes
/// expiry here.
pub(crate) fn expiry(now: i64, hold: Duration) -> i64 {
    now.saturating_add(millis(hold))
}
