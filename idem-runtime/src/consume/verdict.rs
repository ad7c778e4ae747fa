//! What a consumer does with one delivery, decided the same way on every
//! broker: the [`Verdict`] on a call's result.

use std::fmt::Display;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use super::policy::{Attempts, Policy};
use crate::error::Error;
use crate::outcome::Outcome;

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
        /// Whether the body failed (counted against the policy's `max_failures`).
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

/// The store's health as one consumer sees it: since when its calls have
/// been failing in the store, none getting past it.
#[derive(Debug, Clone, Default)]
pub(crate) struct StoreHealth(std::sync::Arc<Mutex<Option<std::time::Instant>>>);

impl StoreHealth {
    /// A call failed in the store: for how long the store has been failing.
    pub(crate) fn fault(&self) -> Duration {
        let mut since = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        since.get_or_insert_with(std::time::Instant::now).elapsed()
    }

    /// A call got past the store.
    pub(crate) fn ok(&self) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }
}

impl Verdict {
    /// The body failed (returned `Err`, or panicked) for a message whose
    /// body already failed `failures` times: retried, or dead-lettered once
    /// its attempts are spent.
    pub(crate) fn body_failed(error: &str, failures: u32, policy: &Policy) -> Verdict {
        let failures = failures.saturating_add(1);
        if failures >= policy.max_failures {
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
    /// let policy = Policy { max_failures: 2, ..Policy::default() };
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
