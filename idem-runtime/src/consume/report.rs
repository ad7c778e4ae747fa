//! What a consumer did while it ran ([`Report`]), why it stopped
//! ([`ConsumeError`]), and how one delivery ended with the broker.

use std::sync::{Mutex, MutexGuard, PoisonError};

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
    /// A handler call said the binary is misconfigured ([`Error::Config`](crate::Error::Config)).
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

/// How one delivery ended with the broker.
#[derive(Debug)]
pub(crate) enum Settled {
    Acked {
        duplicate: bool,
        alert: bool,
    },
    Retried,
    DeadLettered,
    /// A retry not yet due, handed on to the tier for what is left of its
    /// wait: no handler call.
    Forwarded,
    /// The binary is misconfigured: the consumer stops.
    #[cfg_attr(
        not(any(feature = "rabbitmq", feature = "nats", feature = "rocketmq")),
        allow(dead_code)
    )]
    Stop(String),
    /// The broker could not be told (the connection is gone): the delivery
    /// comes back by itself.
    #[cfg_attr(
        not(any(feature = "rabbitmq", feature = "nats", feature = "rocketmq")),
        allow(dead_code)
    )]
    Unsettled,
}

impl Report {
    /// Counts one delivery's end.
    pub(crate) fn count(&mut self, settled: &Settled) {
        match settled {
            Settled::Acked { duplicate, alert } => {
                self.acked += 1;
                self.duplicates += u64::from(*duplicate);
                self.alerts += u64::from(*alert);
            }
            Settled::Retried => self.retried += 1,
            Settled::DeadLettered => self.dead_lettered += 1,
            Settled::Forwarded => self.forwarded += 1,
            Settled::Stop(_) | Settled::Unsettled => {}
        }
    }
}

pub(crate) fn lock(report: &Mutex<Report>) -> MutexGuard<'_, Report> {
    report.lock().unwrap_or_else(PoisonError::into_inner)
}
