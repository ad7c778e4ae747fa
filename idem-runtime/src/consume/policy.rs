//! How a consumer retries: its [`Policy`], the retry tiers' default
//! delays, and the [`Attempts`] a message has behind it.

use std::time::Duration;

/// The default delay tiers of the consumers that retry through the
/// broker's own queues or topics (RabbitMQ's retry queues, Kafka's retry
/// topics): one queue or topic per delay, so a short retry never waits
/// behind a long one. Each consumer takes others with `.retry_delays(...)`.
///
/// A retry goes to the longest tier not longer than its wait (the shortest
/// when the wait is below them all) and carries its due time (`x-idem-due`);
/// one that comes back before it is due is forwarded to the tier for what is
/// left, without running the handler, so a wait of 1.2 s is waited as
/// 1 s + 100 ms + 100 ms rather than rounded up to 5 s, and a wait longer
/// than the longest tier is waited whole.
///
/// # Examples
///
/// ```
/// use idem_runtime::consume::RETRY_DELAYS;
/// use std::time::Duration;
///
/// assert_eq!(RETRY_DELAYS.first(), Some(&Duration::from_millis(100)));
/// assert_eq!(RETRY_DELAYS.last(), Some(&Duration::from_secs(300)));
/// ```
pub const RETRY_DELAYS: [Duration; 5] = [
    Duration::from_millis(100),
    Duration::from_secs(1),
    Duration::from_secs(5),
    Duration::from_secs(30),
    Duration::from_secs(300),
];

/// How a consumer retries: attempts, backoff and concurrency.
///
/// # Examples
///
/// ```
/// use idem_runtime::consume::Policy;
/// use std::time::Duration;
///
/// let policy = Policy { max_failures: 3, ..Policy::default() };
/// assert_eq!(policy.backoff(1), Duration::from_secs(1));
/// assert_eq!(policy.backoff(2), Duration::from_secs(2));
/// assert!(policy.backoff(30) <= policy.max_delay);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// How many times the body may fail (`Error::Handler`) before the message
    /// is dead-lettered. Default 5.
    pub max_failures: u32,
    /// The delay before the first retry; it doubles with each retry of the
    /// same message. Default 1 s.
    pub first_delay: Duration,
    /// The longest delay. Default 5 minutes.
    pub max_delay: Duration,
    /// How many deliveries are processed at once. Default 8.
    pub concurrency: usize,
    /// The longest wait after a store fault (the store, not the message, at
    /// fault): the wait grows with the time the store has been failing up
    /// to this, so a message handed back during an outage is not left
    /// waiting minutes after the store is back. Default 30 s.
    pub max_store_delay: Duration,
    /// How long a consumer that stops (its shutdown token; on RabbitMQ and
    /// NATS also a lost session, before it reconnects) waits for the bodies
    /// in flight to reach their recorded outcome. idem drops no body
    /// before that. Past it, RabbitMQ's, NATS's and RocketMQ's consumers drop the
    /// bodies still running (counted in
    /// [`BODIES_DROPPED`](crate::metric::BODIES_DROPPED)), and their
    /// messages are delivered again; Kafka's commits what is settled and
    /// returns, and the bodies go on until they end or the runtime stops.
    /// A Kafka partition revoked by a rebalance has its own wait,
    /// [`revoke_grace`](crate::consume::kafka::Consumer::revoke_grace).
    /// Default 30 s.
    pub grace: Duration,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            max_failures: 5,
            first_delay: Duration::from_secs(1),
            max_delay: Duration::from_secs(300),
            concurrency: 8,
            max_store_delay: Duration::from_secs(30),
            grace: Duration::from_secs(30),
        }
    }
}

impl Policy {
    /// The delay before retry number `retry` (1 for the first).
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::consume::Policy;
    /// use std::time::Duration;
    ///
    /// let p = Policy::default();
    /// assert_eq!(p.backoff(3), Duration::from_secs(4));
    /// ```
    pub fn backoff(&self, retry: u32) -> Duration {
        let doublings = retry.saturating_sub(1).min(30);
        self.first_delay
            .saturating_mul(1u32 << doublings)
            .min(self.max_delay)
    }

    /// The prefetch of a consumer that sets none: twice the concurrency,
    /// so each slot has a message ready when it frees and the consumer
    /// hoards no more than that.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::consume::Policy;
    ///
    /// assert_eq!(Policy::default().prefetch(), 16);
    /// assert_eq!(Policy { concurrency: 3, ..Policy::default() }.prefetch(), 6);
    /// ```
    pub fn prefetch(&self) -> usize {
        self.concurrency.max(1).saturating_mul(2)
    }
}

/// What a consumer knows when it decides on a delivery: how many times the
/// message's body failed, how many times it was handed back for any reason
/// (a failure, `InProgress`, a store fault), and for how long the
/// consumer's calls have been failing in the store.
///
/// # Examples
///
/// ```
/// use idem_runtime::consume::Attempts;
/// use std::time::Duration;
///
/// let first = Attempts::default();
/// assert_eq!((first.failures, first.retries), (0, 0));
/// assert_eq!(first.store_failing_for, Duration::ZERO);
/// let later = Attempts { failures: 1, retries: 3, ..Attempts::default() };
/// # let _ = later;
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Attempts {
    /// Failed runs of the body so far (counted against the policy's `max_failures`).
    pub failures: u32,
    /// Times the message was handed back to the broker so far.
    pub retries: u32,
    /// For how long this consumer's calls (any message's) have been failing
    /// in the store with no call getting past it in between: zero at a
    /// store fault that follows a call that got past the store. The store's
    /// health, which a store fault's wait follows.
    pub store_failing_for: Duration,
}
