//! Consumers on real brokers around any idempotent handler (features
//! `rabbitmq`, `nats` and `kafka`): decode the payload, call the handler,
//! and turn what it returned into the broker's ack (Kafka: a commit up to
//! it), delayed retry or dead letter.
//!
//! A consumer is started in a few lines, with a closure that calls the
//! rewritten function with its store: see `rabbitmq`, `nats` and `kafka`.
//!
//! # What happens to a delivery
//!
//! [`Verdict::of`] decides, the same way on every broker:
//!
//! | the call returned | verdict |
//! | --- | --- |
//! | `Executed`, `Duplicate` | ack |
//! | `InProgress { retry_after }` | retry after `retry_after`; not a failed attempt |
//! | `Store` | retry after the backoff; not a failed attempt (the store, not the message, is at fault), contention in a transaction-mode body's transaction included (`StoreError::Contention`) |
//! | `Handler` | retry after the backoff; a failed attempt: the one after the last allowed is dead-lettered with the last error |
//! | `LeaseLost`, `NotRecorded` | ack (a redelivery would run the body again), and an error is logged to alert |
//! | `Failed` (a final error, this delivery's or recorded), `Exhausted` (the handler's `max_attempts` used up) | dead letter at once, with the error: no redelivery can pass |
//! | `PayloadMismatch` | dead letter at once, and an error is logged to alert: one key, two payloads |
//! | `KeyMissing`, `Unrecordable`, `Codec` | dead letter at once: no redelivery can change the outcome |
//! | `Config` | stop the consumer and return the error: the build is wrong |
//! | a payload that does not decode | dead letter at once, with serde's reason |
//!
//! Retries never hold a prefetch slot: the delivery is acked and handed back
//! to the broker with a delay (RabbitMQ: a retry queue whose TTL expires it
//! back into the work queue; JetStream: `Nak` with a delay; Kafka: a retry
//! topic, or, for strict order, a wait in place). The wait is the one the
//! verdict asked for, not rounded up to a retry queue's or topic's delay
//! (see [`RETRY_DELAYS`]).
//!
//! # Topology
//!
//! Each consumer declares what it needs (RabbitMQ: retry and dead-letter
//! queues; NATS: the streams and the durable; Kafka: retry and dead-letter
//! topics) when it starts, and on its own with `declare()`, for a producer or
//! a deploy step to run before any message is published. The names and the
//! retry delays are settings of the consumer, with the defaults in each
//! module's topology table.

use std::fmt::Display;
use std::future::Future;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use futures_util::future::FutureExt;
use serde::de::DeserializeOwned;
use std::panic::AssertUnwindSafe;

use crate::error::Error;
use crate::outcome::Outcome;

pub mod dead;
mod delivery;
#[cfg(feature = "kafka")]
#[cfg_attr(docsrs, doc(cfg(feature = "kafka")))]
pub mod kafka;
mod meter;
#[cfg(feature = "nats")]
#[cfg_attr(docsrs, doc(cfg(feature = "nats")))]
pub mod nats;
#[cfg(feature = "rabbitmq")]
#[cfg_attr(docsrs, doc(cfg(feature = "rabbitmq")))]
pub mod rabbitmq;
#[cfg(any(feature = "rabbitmq", feature = "nats"))]
mod session;
#[cfg(any(feature = "rabbitmq", feature = "kafka"))]
mod tiers;
pub use delivery::{Broker, Delivery};
pub(crate) use meter::Meter;

#[cfg(any(feature = "rabbitmq", feature = "nats"))]
pub(crate) use session::{Ended, drive, sessions};

/// The shutdown signal of every consumer and of [`until_ok`]: cancel it
/// (from a signal handler, a supervisor, a test) and the consumer stops
/// taking deliveries, lets the ones in flight finish and returns. One token
/// can stop many consumers; [`CancellationToken::child_token`] stops one.
///
/// # Examples
///
/// ```
/// use idem_runtime::consume::CancellationToken;
///
/// let shutdown = CancellationToken::new();
/// let one_consumer = shutdown.child_token();
/// shutdown.cancel();
/// assert!(one_consumer.is_cancelled());
/// ```
pub use tokio_util::sync::CancellationToken;

/// A token cancelled once `signal` resolves (a `ctrl_c`, a `SIGTERM`), for
/// the consumers' `run`; the future runs on a task of its own, so this is
/// called within a Tokio runtime (it panics outside one, as
/// `tokio::spawn` does).
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use idem_runtime::consume::shutdown_on;
///
/// // in a service: shutdown_on(async { tokio::signal::ctrl_c().await.ok(); })
/// let (tx, rx) = tokio::sync::oneshot::channel::<()>();
/// let shutdown = shutdown_on(async move { rx.await.ok(); });
/// assert!(!shutdown.is_cancelled());
/// tx.send(()).unwrap();
/// shutdown.cancelled().await;
/// # }
/// ```
pub fn shutdown_on(signal: impl Future<Output = ()> + Send + 'static) -> CancellationToken {
    let token = CancellationToken::new();
    let cancel = token.clone();
    tokio::spawn(async move {
        signal.await;
        cancel.cancel();
    });
    token
}

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
/// let policy = Policy { max_attempts: 3, ..Policy::default() };
/// assert_eq!(policy.backoff(1), Duration::from_secs(1));
/// assert_eq!(policy.backoff(2), Duration::from_secs(2));
/// assert!(policy.backoff(30) <= policy.max_delay);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// How many times the body may fail (`Error::Handler`) before the message
    /// is dead-lettered. Default 5.
    pub max_attempts: u32,
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
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            max_attempts: 5,
            first_delay: Duration::from_secs(1),
            max_delay: Duration::from_secs(300),
            concurrency: 8,
            max_store_delay: Duration::from_secs(30),
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
}

/// What a consumer does with one delivery.
///
/// # Examples
///
/// ```
/// use idem_runtime::consume::{Attempts, Policy, Verdict};
/// use idem_runtime::Outcome;
///
/// let ok: Result<Outcome<u32>, idem_runtime::Error<String>> = Ok(Outcome::Duplicate(7));
/// assert_eq!(Verdict::of(&ok, Attempts::default(), &Policy::default()), Verdict::Ack { alert: None });
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Acknowledge: done, or nothing a redelivery could improve. `alert`
    /// says why an operator should look (a lost lease, an effect without a
    /// record).
    Ack {
        /// Why to alert, if anything went wrong that acking does not undo.
        alert: Option<String>,
    },
    /// Hand the message back to the broker, to be delivered again after
    /// `after`. `failed` says whether this counts as a failed attempt.
    Retry {
        /// The delay before the redelivery.
        after: Duration,
        /// Whether the body failed (counted against `max_attempts`).
        failed: bool,
        /// What happened, for the message's headers and the log.
        reason: String,
    },
    /// Move the message aside, with the reason, and acknowledge it.
    DeadLetter {
        /// Why, for the dead letter's headers.
        reason: String,
        /// Whether the body failed this time (its last allowed attempt).
        failed: bool,
    },
    /// Stop consuming: the binary is misconfigured. The message is left
    /// unacknowledged, for the broker to deliver again once fixed.
    Stop {
        /// Why.
        reason: String,
    },
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
    /// Failed runs of the body so far (counted against `max_attempts`).
    pub failures: u32,
    /// Times the message was handed back to the broker so far.
    pub retries: u32,
    /// For how long this consumer's calls (any message's) have been failing
    /// in the store with no call getting past it in between: zero at a
    /// store fault that follows a call that got past the store. The store's
    /// health, which a store fault's wait follows.
    pub store_failing_for: Duration,
}

/// The store's health as one consumer sees it: since when its calls have
/// been failing in the store, none getting past it.
#[derive(Debug, Clone, Default)]
pub(crate) struct StoreHealth(std::sync::Arc<Mutex<Option<std::time::Instant>>>);

impl StoreHealth {
    /// A call failed in the store: for how long the store has been failing.
    fn fault(&self) -> Duration {
        let mut since = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        since.get_or_insert_with(std::time::Instant::now).elapsed()
    }

    /// A call got past the store.
    fn ok(&self) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }
}

impl Verdict {
    /// The body failed (returned `Err`, or panicked) for a message whose
    /// body already failed `failures` times: retried, or dead-lettered once
    /// its attempts are spent.
    fn body_failed(error: &str, failures: u32, policy: &Policy) -> Verdict {
        let failures = failures.saturating_add(1);
        if failures >= policy.max_attempts {
            Verdict::DeadLetter {
                reason: format!("the body failed {failures} times; the last error: {error}"),
                failed: true,
            }
        } else {
            Verdict::Retry {
                after: policy.backoff(failures),
                failed: true,
                reason: format!("the body failed: {error}"),
            }
        }
    }

    /// The verdict on a handler call's result, for a message with
    /// `attempts` behind it, under `policy`. A failed body waits
    /// [`Policy::backoff`] of its failures; a store fault waits the first
    /// delay plus for how long the store has been failing
    /// ([`Attempts::store_failing_for`]), up to [`Policy::max_store_delay`]:
    /// an outage is met with pauses that grow with it (doubling, for one
    /// message alone), while a store that fails now and then between calls
    /// that pass costs the first delay, whatever the message met before.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::consume::{Attempts, Policy, Verdict};
    /// use idem_runtime::{Error, Key, Outcome, StoreError};
    /// use std::time::Duration;
    ///
    /// let policy = Policy { max_attempts: 2, ..Policy::default() };
    /// let key = Key::from_parts(&[&"o-1"]).unwrap();
    /// let failed: Result<Outcome<()>, Error<&str>> =
    ///     Err(Error::Handler { handler: "h", key: key.clone(), error: "out of stock" });
    /// // the first failure is retried...
    /// let first = Attempts::default();
    /// assert!(matches!(Verdict::of(&failed, first, &policy), Verdict::Retry { failed: true, .. }));
    /// // ...the second, the last allowed, is dead-lettered
    /// let second = Attempts { failures: 1, retries: 1, ..Attempts::default() };
    /// assert!(matches!(Verdict::of(&failed, second, &policy), Verdict::DeadLetter { .. }));
    ///
    /// // a store fault after 7 s of nothing but store faults waits longer
    /// let down: Result<Outcome<()>, Error<&str>> =
    ///     Err(Error::Store { handler: "h", key: Some(key), source: StoreError::Timeout(Duration::from_secs(5)) });
    /// let after = |secs| match Verdict::of(&down, Attempts { store_failing_for: Duration::from_secs(secs), ..Attempts::default() }, &policy) {
    ///     Verdict::Retry { after, failed: false, .. } => after,
    ///     other => panic!("{other:?}"),
    /// };
    /// assert_eq!(after(0), Duration::from_secs(1));
    /// assert_eq!(after(7), Duration::from_secs(8));
    /// assert_eq!(after(60), policy.max_store_delay); // 30 s at most
    /// ```
    pub fn of<T, E: Display>(
        result: &Result<Outcome<T>, Error<E>>,
        attempts: Attempts,
        policy: &Policy,
    ) -> Verdict {
        let Attempts {
            failures,
            store_failing_for,
            ..
        } = attempts;
        let err = match result {
            Ok(_) => return Verdict::Ack { alert: None },
            Err(e) => e,
        };
        match err {
            Error::InProgress { retry_after, .. } => Verdict::Retry {
                after: *retry_after,
                failed: false,
                reason: err.to_string(),
            },
            Error::Handler { error, .. } => {
                Verdict::body_failed(&error.to_string(), failures, policy)
            }
            Error::LeaseLost { .. } | Error::NotRecorded { .. } => Verdict::Ack {
                alert: Some(err.to_string()),
            },
            Error::PayloadMismatch { .. } => {
                tracing::error!(error = %err, "one key, two payloads: dead-lettered");
                Verdict::DeadLetter {
                    reason: err.to_string(),
                    failed: false,
                }
            }
            Error::Failed { replayed, .. } => Verdict::DeadLetter {
                reason: err.to_string(),
                failed: !replayed,
            },
            Error::Exhausted { .. } => Verdict::DeadLetter {
                reason: err.to_string(),
                failed: false,
            },
            Error::KeyMissing { .. } | Error::Unrecordable { .. } | Error::Codec { .. } => {
                Verdict::DeadLetter {
                    reason: err.to_string(),
                    failed: false,
                }
            }
            Error::Config { .. } => Verdict::Stop {
                reason: err.to_string(),
            },
            // Store failures, and any kind added later: the message is not
            // at fault, so it is retried without counting.
            _ => Verdict::Retry {
                after: policy
                    .first_delay
                    .saturating_add(store_failing_for)
                    .min(policy.max_store_delay),
                failed: false,
                reason: err.to_string(),
            },
        }
    }
}

/// What a consumer did while it ran.
///
/// # Examples
///
/// ```
/// let report = idem_runtime::consume::Report::default();
/// assert_eq!(report.acked + report.retried + report.dead_lettered, 0);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Report {
    /// Deliveries acknowledged (executed, duplicate, or acked with an alert).
    pub acked: u64,
    /// Of those, duplicates.
    pub duplicates: u64,
    /// Deliveries handed back to the broker to be retried later.
    pub retried: u64,
    /// Deliveries moved to the dead letters.
    pub dead_lettered: u64,
    /// Retries that came back before they were due and were forwarded to
    /// the retry queue or topic for what was left of their wait, without a
    /// handler call (RabbitMQ, Kafka); not counted in `retried`.
    pub forwarded: u64,
    /// Deliveries acked with an alert (`LeaseLost`, `NotRecorded`).
    pub alerts: u64,
    /// Times the consumer reconnected to the broker (Kafka: times every
    /// broker was lost, librdkafka reconnecting by itself).
    pub reconnects: u64,
    /// Kafka: times the group assigned this consumer partitions.
    pub rebalances: u64,
}

/// Why a consumer stopped other than by its shutdown signal.
///
/// # Examples
///
/// ```
/// let e = idem_runtime::consume::ConsumeError::Stopped { reason: "two handlers share a name".into() };
/// assert!(e.to_string().contains("two handlers"));
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConsumeError {
    /// A handler call said the binary is misconfigured ([`Error::Config`]).
    #[error("the consumer stopped: {reason}")]
    Stopped {
        /// The handler's error.
        reason: String,
    },
    /// The broker refused the consumer's set-up (a queue or stream that
    /// exists with other settings, missing permissions).
    #[error("broker set-up failed: {0}")]
    Setup(#[source] crate::BoxError),
}

/// Decodes a payload (JSON) into the handler's message type; the error says
/// what the consumer dead-letters.
pub(crate) fn decode_payload<M: DeserializeOwned>(payload: &[u8]) -> Result<M, String> {
    serde_json::from_slice(payload).map_err(|e| {
        format!(
            "the payload does not decode as {}: {e}",
            std::any::type_name::<M>()
        )
    })
}

/// What [`handle`] made of one delivery.
#[derive(Clone)]
pub(crate) struct Handled {
    pub(crate) verdict: Verdict,
    /// An `Outcome::Duplicate`.
    pub(crate) duplicate: bool,
    /// The idempotent handler the call ran ("" when none ran: a payload
    /// that does not decode).
    pub(crate) handler: &'static str,
    /// What the call returned, for the metrics' `result` and `reason`:
    /// `executed`, `duplicate`, an [`Error::kind`], `decode` or `panic`.
    pub(crate) cause: &'static str,
}

/// Decodes `payload`, calls `handler` with it and `delivery`, and decides
/// what to do with the delivery; the time it took goes to `meter`.
pub(crate) async fn handle<M, T, E, F, Fut>(
    handler: &F,
    payload: &[u8],
    delivery: Delivery,
    attempts: Attempts,
    policy: &Policy,
    meter: &Meter,
) -> Handled
where
    M: DeserializeOwned,
    E: Display,
    F: Fn(M, Delivery) -> Fut,
    Fut: Future<Output = Result<Outcome<T>, Error<E>>>,
{
    let began = std::time::Instant::now();
    let handled = run_handler(handler, payload, delivery, attempts, policy, &meter.store).await;
    meter.handled(&handled, began);
    handled
}

async fn run_handler<M, T, E, F, Fut>(
    handler: &F,
    payload: &[u8],
    delivery: Delivery,
    attempts: Attempts,
    policy: &Policy,
    store: &StoreHealth,
) -> Handled
where
    M: DeserializeOwned,
    E: Display,
    F: Fn(M, Delivery) -> Fut,
    Fut: Future<Output = Result<Outcome<T>, Error<E>>>,
{
    let msg = match decode_payload::<M>(payload) {
        Ok(m) => m,
        Err(reason) => {
            return Handled {
                verdict: Verdict::DeadLetter {
                    reason,
                    failed: false,
                },
                duplicate: false,
                handler: "",
                cause: "decode",
            };
        }
    };
    // A panicking handler is a failed attempt like any other, so its
    // delivery is settled (retried, then dead-lettered) instead of held.
    let call = std::panic::catch_unwind(AssertUnwindSafe(|| handler(msg, delivery)));
    let (result, called) = match call {
        Ok(call) => crate::telemetry::noting_handler(AssertUnwindSafe(call).catch_unwind()).await,
        Err(panic) => (Err(panic), None),
    };
    let handler = called.unwrap_or("");
    match result {
        Ok(result) => {
            let cause = match &result {
                Ok(Outcome::Executed(_)) => "executed",
                Ok(Outcome::Duplicate(_)) => "duplicate",
                Err(e) => e.kind(),
            };
            let attempts = match result {
                Err(Error::Store { .. }) => Attempts {
                    store_failing_for: store.fault(),
                    ..attempts
                },
                _ => {
                    store.ok();
                    attempts
                }
            };
            Handled {
                verdict: Verdict::of(&result, attempts, policy),
                duplicate: matches!(result, Ok(Outcome::Duplicate(_))),
                handler,
                cause,
            }
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".to_owned());
            let reason = format!("the handler panicked: {what}");
            tracing::error!(%reason, "a handler panicked");
            Handled {
                verdict: Verdict::body_failed(&reason, attempts.failures, policy),
                duplicate: false,
                handler,
                cause: "panic",
            }
        }
    }
}

/// Retries `op` with a growing pause (100 ms doubling to 5 s) until it
/// succeeds (`Some`) or `shutdown` is cancelled (`None`); for connecting to
/// a broker or a store at start-up, when it may not be up yet. The first
/// failure is logged as a warning, the ones after it at debug level, with a
/// warning every minute that says how long it has been failing.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use idem_runtime::consume::{CancellationToken, until_ok};
///
/// // e.g. `|| PgStore::connect(url)`; here a store that answers at the third try
/// let mut tries = 0;
/// let connect = || {
///     tries += 1;
///     let answer = if tries < 3 { Err("connection refused") } else { Ok(tries) };
///     async move { answer }
/// };
/// let shutdown = CancellationToken::new();
/// assert_eq!(until_ok("the store", connect, &shutdown).await, Some(3));
///
/// // once shutdown is asked for, it gives up
/// shutdown.cancel();
/// let never = || async { Err::<(), _>("connection refused") };
/// assert_eq!(until_ok("the store", never, &shutdown).await, None);
/// # }
/// ```
pub async fn until_ok<T, E, F, Fut>(
    what: &str,
    mut op: F,
    shutdown: &CancellationToken,
) -> Option<T>
where
    E: Display,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let mut shutdown = std::pin::pin!(shutdown.cancelled());
    let mut pause = Duration::from_millis(100);
    let since = std::time::Instant::now();
    let mut warned: Option<std::time::Instant> = None;
    loop {
        // An attempt that hangs (a connection to a black hole) does not
        // hold up a shutdown, nor does a token cancelled already.
        let attempt = tokio::select! {
            biased;
            () = &mut shutdown => return None,
            attempt = op() => attempt,
        };
        match attempt {
            Ok(v) => {
                if warned.is_some() {
                    tracing::info!("{what} is reachable again after {:?}", since.elapsed());
                }
                return Some(v);
            }
            Err(e) => {
                if warned.is_none_or(|at| at.elapsed() >= Duration::from_secs(60)) {
                    warned = Some(std::time::Instant::now());
                    tracing::warn!(error = %e, failing_for = ?since.elapsed(), "{what} is not reachable; retrying (a pause of 100 ms doubling to 5 s)");
                } else {
                    tracing::debug!(error = %e, "{what} is not reachable; retrying in {pause:?}");
                }
            }
        }
        tokio::select! {
            _ = &mut shutdown => return None,
            _ = tokio::time::sleep(pause) => {}
        }
        pause = (pause * 2).min(Duration::from_secs(5));
    }
}

/// How one delivery ended with the broker.
pub(crate) enum Settled {
    Acked {
        duplicate: bool,
        alert: bool,
    },
    Retried,
    DeadLettered,
    /// A retry not yet due, handed on to the tier for what is left of its
    /// wait: no handler call.
    #[cfg_attr(not(any(feature = "rabbitmq", feature = "kafka")), allow(dead_code))]
    Forwarded,
    /// The binary is misconfigured: the consumer stops.
    #[cfg_attr(not(any(feature = "rabbitmq", feature = "nats")), allow(dead_code))]
    Stop(String),
    /// The broker could not be told (the connection is gone): the delivery
    /// comes back by itself.
    #[cfg_attr(not(any(feature = "rabbitmq", feature = "nats")), allow(dead_code))]
    Unsettled,
}

pub(crate) fn lock(report: &Mutex<Report>) -> MutexGuard<'_, Report> {
    report.lock().unwrap_or_else(PoisonError::into_inner)
}
