//! What a call reports: its `tracing` span and its `metrics`.

use std::time::Instant;

use crate::error::Error;
use crate::key::Key;
use crate::outcome::Outcome;
use crate::registry::HandlerSpec;

/// Metric names, for dashboards and alerts.
///
/// The runtime records them through the [`metrics`](https://docs.rs/metrics)
/// facade; install any recorder (Prometheus, StatsD, ...) to export them.
///
/// # Examples
///
/// ```
/// use idem_runtime::metric;
///
/// // an alert on lease takeovers, in PromQL
/// let alert = format!(r#"rate({}{{result="lease_lost"}}[5m]) > 0"#, metric::CALLS);
/// assert_eq!(alert, r#"rate(idem_calls_total{result="lease_lost"}[5m]) > 0"#);
/// ```
pub mod metric {
    /// Counter of calls, labelled `handler` and `result`: `executed`,
    /// `duplicate`, or an [`Error::kind`](crate::Error::kind).
    ///
    /// # Examples
    ///
    /// ```
    /// // the duplicate rate of one handler, in PromQL
    /// let q = format!(
    ///     r#"rate({0}{{handler="points",result="duplicate"}}[5m]) / rate({0}{{handler="points"}}[5m])"#,
    ///     idem_runtime::metric::CALLS,
    /// );
    /// assert!(q.starts_with("rate(idem_calls_total{"));
    /// ```
    pub const CALLS: &str = "idem_calls_total";
    /// Histogram of the time to claim a key (seconds), labelled `handler`.
    ///
    /// # Examples
    ///
    /// ```
    /// // the 99th percentile of claim latency, in PromQL
    /// let q = format!(
    ///     "histogram_quantile(0.99, rate({}_bucket[5m]))",
    ///     idem_runtime::metric::CLAIM_SECONDS,
    /// );
    /// assert_eq!(q, "histogram_quantile(0.99, rate(idem_claim_seconds_bucket[5m]))");
    /// ```
    pub const CLAIM_SECONDS: &str = "idem_claim_seconds";
    /// Histogram of the time the body ran (seconds), labelled `handler`.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(idem_runtime::metric::BODY_SECONDS, "idem_body_seconds");
    /// ```
    pub const BODY_SECONDS: &str = "idem_body_seconds";
    /// Counter of bodies dropped before their end (in lease mode, before
    /// their outcome was recorded), or that panicked, labelled `handler` and
    /// `mode` (`lease`, `transaction`): by a caller that stopped awaiting
    /// the rewritten handler (a `timeout` around it), or by idem once a
    /// call it ran on its own task outlived its grace (an HTTP route's
    /// [`grace`](crate::http::Idempotency::grace), a consumer's
    /// [`Policy::grace`](crate::consume::Policy::grace)). A transaction-mode
    /// body's writes roll back; a lease-mode body's effects stay, and its
    /// key is held for one more lease before another run may take it.
    ///
    /// # Examples
    ///
    /// ```
    /// // an alert: a body was cut off halfway
    /// let q = format!("increase({}[10m]) > 0", idem_runtime::metric::BODIES_DROPPED);
    /// assert_eq!(q, "increase(idem_bodies_dropped_total[10m]) > 0");
    /// ```
    pub const BODIES_DROPPED: &str = "idem_bodies_dropped_total";
    /// Counter of transaction-mode bodies that ran for a delivery whose key
    /// turned out to be settled by another delivery (an outcome, a final
    /// error, another payload, attempts exhausted), and were rolled back,
    /// labelled `handler`; one that met a lock wait or a deadlock at its
    /// insert is not counted (the call returns `in_progress`), nor a batch's
    /// (a batch reads its records before its body). Claiming last
    /// (`ClaimOrder::Last`), every duplicate's body runs before its insert
    /// finds the record; reading first
    /// (`ClaimOrder::Checked`, the default), only a duplicate that raced the
    /// first delivery's open transaction. Nothing of such a body commits,
    /// but whatever it did outside its transaction (a log line, a metric, a
    /// call to a read-only service) was seen: a rate above zero under
    /// `Checked` says duplicates arrive while their first delivery runs.
    ///
    /// # Examples
    ///
    /// ```
    /// // the share of a handler's calls whose body ran for a settled key
    /// let q = format!(
    ///     r#"rate({}{{handler="points"}}[5m]) / rate({}{{handler="points"}}[5m])"#,
    ///     idem_runtime::metric::DUPLICATE_BODIES,
    ///     idem_runtime::metric::CALLS,
    /// );
    /// assert!(q.starts_with("rate(idem_duplicate_bodies_total{"));
    /// ```
    pub const DUPLICATE_BODIES: &str = "idem_duplicate_bodies_total";

    /// Consumers: counter of deliveries taken from the broker, labelled
    /// `broker` (`rabbitmq`, `nats`, `kafka`) and `queue` (the queue, the
    /// stream's durable consumer or the topic).
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(idem_runtime::metric::CONSUMER_DELIVERIES, "idem_consumer_deliveries_total");
    /// ```
    pub const CONSUMER_DELIVERIES: &str = "idem_consumer_deliveries_total";
    /// Consumers: counter of deliveries that had been delivered before (the
    /// broker's redelivered flag, or a retry coming back), labelled
    /// `broker` and `queue`.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(idem_runtime::metric::CONSUMER_REDELIVERIES, "idem_consumer_redeliveries_total");
    /// ```
    pub const CONSUMER_REDELIVERIES: &str = "idem_consumer_redeliveries_total";
    /// Consumers: counter of deliveries acknowledged (Kafka: settled for the
    /// commit), labelled `broker`, `queue`, `handler` and `result`:
    /// `executed`, `duplicate`, or `lease_lost` / `not_recorded` (acked with
    /// an alert).
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(idem_runtime::metric::CONSUMER_ACKS, "idem_consumer_acks_total");
    /// ```
    pub const CONSUMER_ACKS: &str = "idem_consumer_acks_total";
    /// Consumers: counter of deliveries handed back to be retried later,
    /// labelled `broker`, `queue`, `handler` and `reason`: what the call
    /// returned ([`Error::kind`](crate::Error::kind): `in_progress`,
    /// `store`, `handler_error`, ...) or `panic`.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(idem_runtime::metric::CONSUMER_RETRIES, "idem_consumer_retries_total");
    /// ```
    pub const CONSUMER_RETRIES: &str = "idem_consumer_retries_total";
    /// Consumers: counter of deliveries dead-lettered, labelled `broker`,
    /// `queue`, `handler` and `reason`: what the last call returned
    /// (`handler_error` when the body failed its last allowed attempt,
    /// `exhausted`, `failed`, `payload_mismatch`, `key_missing`, ...),
    /// `decode` for a payload that does not decode (with `handler` empty),
    /// or `panic`.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(idem_runtime::metric::CONSUMER_DEAD_LETTERS, "idem_consumer_dead_letters_total");
    /// ```
    pub const CONSUMER_DEAD_LETTERS: &str = "idem_consumer_dead_letters_total";
    /// Consumers: counter of deliveries that could not be settled (the
    /// connection went): the broker delivers them again. Labelled `broker`
    /// and `queue`.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(idem_runtime::metric::CONSUMER_UNSETTLED, "idem_consumer_unsettled_total");
    /// ```
    pub const CONSUMER_UNSETTLED: &str = "idem_consumer_unsettled_total";
    /// Consumers: gauge of deliveries being handled now, labelled `broker`
    /// and `queue`.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(idem_runtime::metric::CONSUMER_IN_FLIGHT, "idem_consumer_in_flight");
    /// ```
    pub const CONSUMER_IN_FLIGHT: &str = "idem_consumer_in_flight";
    /// Consumers: histogram of the time from a delivery's arrival to the
    /// handler's answer (seconds: decoding and the call), labelled
    /// `broker`, `queue` and `handler`.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(idem_runtime::metric::CONSUMER_HANDLE_SECONDS, "idem_consumer_handle_seconds");
    /// ```
    pub const CONSUMER_HANDLE_SECONDS: &str = "idem_consumer_handle_seconds";
    /// Consumers: histogram of the time from publication (the broker's or
    /// the producer's timestamp) to the ack or dead letter (seconds),
    /// labelled `broker`, `queue` and `handler`; only for messages that
    /// carry a timestamp (RabbitMQ: the `timestamp` property, in whole
    /// seconds).
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(idem_runtime::metric::CONSUMER_END_TO_END_SECONDS, "idem_consumer_end_to_end_seconds");
    /// ```
    pub const CONSUMER_END_TO_END_SECONDS: &str = "idem_consumer_end_to_end_seconds";
    /// Consumers: gauge of the Unix time (seconds) of the last delivery
    /// settled (acked, retried or dead-lettered), labelled `broker` and
    /// `queue`: `time() - idem_consumer_last_settle_timestamp_seconds`
    /// is how long the consumer has not settled anything.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(idem_runtime::metric::CONSUMER_LAST_SETTLE, "idem_consumer_last_settle_timestamp_seconds");
    /// ```
    pub const CONSUMER_LAST_SETTLE: &str = "idem_consumer_last_settle_timestamp_seconds";
    /// Consumers: gauge of the messages waiting for the consumer, as the
    /// broker last said (NATS: the durable's pending count; Kafka: the
    /// librdkafka's `consumer_lag`, the partition's end (its last stable
    /// offset) minus the commit, summed over the partitions it holds, retry
    /// topics included, every 5 s; RabbitMQ: the queue's ready messages, read every 5 s),
    /// labelled `broker` and `queue`.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(idem_runtime::metric::CONSUMER_LAG, "idem_consumer_lag");
    /// ```
    pub const CONSUMER_LAG: &str = "idem_consumer_lag";
    /// Consumers: counter of reconnections to the broker (Kafka: times
    /// every broker was lost), labelled `broker` and `queue`.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(idem_runtime::metric::CONSUMER_RECONNECTS, "idem_consumer_reconnects_total");
    /// ```
    pub const CONSUMER_RECONNECTS: &str = "idem_consumer_reconnects_total";
    /// Kafka consumers: counter of the group's assignments of partitions to
    /// this consumer, labelled `broker` and `queue`.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(idem_runtime::metric::CONSUMER_REBALANCES, "idem_consumer_rebalances_total");
    /// ```
    pub const CONSUMER_REBALANCES: &str = "idem_consumer_rebalances_total";
    /// Outbox: counter of messages staged in transactions that committed,
    /// labelled `handler` (the handler or producer that staged them).
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(idem_runtime::metric::OUTBOX_STAGED, "idem_outbox_staged_total");
    /// ```
    pub const OUTBOX_STAGED: &str = "idem_outbox_staged_total";
    /// Outbox: counter of messages a relay published and the broker
    /// confirmed, labelled `table` and `destination` (the destination's
    /// kind: `kafka`, `rabbitmq`, `nats`, or a destination's own).
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(idem_runtime::metric::OUTBOX_PUBLISHED, "idem_outbox_published_total");
    /// ```
    pub const OUTBOX_PUBLISHED: &str = "idem_outbox_published_total";
    /// Outbox: counter of publishes that failed (the row stays, and is
    /// published again), labelled `table` and `destination`.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(idem_runtime::metric::OUTBOX_PUBLISH_FAILURES, "idem_outbox_publish_failures_total");
    /// ```
    pub const OUTBOX_PUBLISH_FAILURES: &str = "idem_outbox_publish_failures_total";
    /// Outbox: gauge of the rows waiting in the table, labelled `table`, as
    /// a relay last read it.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(idem_runtime::metric::OUTBOX_ROWS, "idem_outbox_rows");
    /// ```
    pub const OUTBOX_ROWS: &str = "idem_outbox_rows";
    /// Outbox: gauge of the age of the oldest row waiting (seconds; 0 when
    /// none waits), labelled `table`, as a relay last read it: what the
    /// alert `IdemOutboxBehind` watches.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(idem_runtime::metric::OUTBOX_OLDEST_SECONDS, "idem_outbox_oldest_seconds");
    /// ```
    pub const OUTBOX_OLDEST_SECONDS: &str = "idem_outbox_oldest_seconds";
}

/// Lets a warning through once per window (10 s), and says how many were
/// held back since: an outage is a few lines, not one per call.
pub(crate) struct Throttle {
    state: std::sync::Mutex<(Option<Instant>, u64)>,
}

impl Throttle {
    const WINDOW: std::time::Duration = std::time::Duration::from_secs(10);

    pub(crate) const fn new() -> Self {
        Throttle {
            state: std::sync::Mutex::new((None, 0)),
        }
    }

    /// `Some(held back since the last one)` when this one is to be logged.
    pub(crate) fn admit(&self) -> Option<u64> {
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let now = Instant::now();
        match state.0 {
            Some(at) if now.duration_since(at) < Self::WINDOW => {
                state.1 += 1;
                None
            }
            _ => {
                let held = std::mem::take(&mut state.1);
                state.0 = Some(now);
                Some(held)
            }
        }
    }
}

/// The store faults of calls, one throttle per handler.
fn store_fault_throttle(handler: &'static str) -> Option<u64> {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    static THROTTLES: OnceLock<Mutex<HashMap<&'static str, &'static Throttle>>> = OnceLock::new();
    let throttle = {
        let mut map = THROTTLES
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *map.entry(handler)
            .or_insert_with(|| Box::leak(Box::new(Throttle::new())))
    };
    throttle.admit()
}

#[cfg(feature = "_consume")]
tokio::task_local! {
    /// The handler an idempotent call in this task ran: a consumer's
    /// `handler` label.
    static CALLED: std::cell::Cell<Option<&'static str>>;
}

/// Runs `call` and says which idempotent handler it called, if any.
#[cfg(feature = "_consume")]
pub(crate) async fn noting_handler<F: std::future::Future>(
    call: F,
) -> (F::Output, Option<&'static str>) {
    CALLED
        .scope(std::cell::Cell::new(None), async move {
            let out = call.await;
            (out, CALLED.with(std::cell::Cell::get))
        })
        .await
}

fn count(spec: &HandlerSpec, result: &'static str) {
    metrics::counter!(metric::CALLS, "handler" => spec.name, "result" => result).increment(1);
    #[cfg(feature = "_consume")]
    let _ = CALLED.try_with(|called| called.set(Some(spec.name)));
    tracing::Span::current().record("result", result);
}

pub(crate) fn claim_latency(spec: &HandlerSpec, since: Instant) {
    metrics::histogram!(metric::CLAIM_SECONDS, "handler" => spec.name)
        .record(since.elapsed().as_secs_f64());
}

/// A transaction-mode body ran for a key that turned out to be taken, and
/// rolled back ([`metric::DUPLICATE_BODIES`]).
pub(crate) fn duplicate_body(spec: &HandlerSpec) {
    metrics::counter!(metric::DUPLICATE_BODIES, "handler" => spec.name).increment(1);
}

pub(crate) fn body_latency(spec: &HandlerSpec, since: Instant) {
    metrics::histogram!(metric::BODY_SECONDS, "handler" => spec.name)
        .record(since.elapsed().as_secs_f64());
}

/// Watches a body from its start to its end: dropped before [`ended`]
/// (the future that ran it dropped at an `.await`), it counts
/// [`metric::BODIES_DROPPED`] and logs a warning in the call's span, which
/// names the handler and the key.
///
/// [`ended`]: BodyWatch::ended
pub(crate) struct BodyWatch {
    spec: &'static HandlerSpec,
    mode: &'static str,
    span: tracing::Span,
    running: bool,
}

impl BodyWatch {
    /// A body of `spec`'s starting now, in `mode`, in the call's `span`.
    pub(crate) fn start(
        spec: &'static HandlerSpec,
        mode: &'static str,
        span: tracing::Span,
    ) -> BodyWatch {
        let mut watch = BodyWatch::before(spec, mode, span);
        watch.begin();
        watch
    }

    /// The watch of a body of `spec`'s that has not started yet: a drop
    /// before [`begin`](BodyWatch::begin) is no drop of its body.
    pub(crate) fn before(
        spec: &'static HandlerSpec,
        mode: &'static str,
        span: tracing::Span,
    ) -> BodyWatch {
        BodyWatch {
            spec,
            mode,
            span,
            running: false,
        }
    }

    /// The body starts.
    pub(crate) fn begin(&mut self) {
        self.running = true;
    }

    /// The body came to its end (whatever it returned), and where the
    /// watch covers it, its outcome's recording too.
    pub(crate) fn ended(&mut self) {
        self.running = false;
    }

    /// Whether the body has not come to its end yet.
    pub(crate) fn running(&self) -> bool {
        self.running
    }
}

impl Drop for BodyWatch {
    fn drop(&mut self) {
        if !self.running {
            return;
        }
        metrics::counter!(metric::BODIES_DROPPED, "handler" => self.spec.name, "mode" => self.mode)
            .increment(1);
        let _enter = self.span.enter();
        if std::thread::panicking() {
            // The panic is the caller's to report; the key stands as for a drop.
            tracing::warn!(mode = self.mode, "the body panicked before its end");
            return;
        }
        match self.mode {
            "lease" => tracing::warn!(
                "the body was dropped before its end or before its outcome was recorded: what it did so far stays done, and its key is held for one more lease before another run may take it"
            ),
            _ => tracing::warn!(
                "the body was dropped before its end: its transaction rolls back, and the key is free for the next delivery"
            ),
        }
    }
}

pub(crate) fn finish<T, E>(
    spec: &HandlerSpec,
    r: Result<Outcome<T>, Error<E>>,
) -> Result<Outcome<T>, Error<E>> {
    let label = match &r {
        Ok(Outcome::Executed(_)) => "executed",
        Ok(Outcome::Duplicate(_)) => "duplicate",
        Err(e) => e.kind(),
    };
    count(spec, label);
    match &r {
        // What a redelivery sorts out, and the body's own errors (the
        // body's to log), are not warnings.
        Ok(_) | Err(Error::Handler { .. } | Error::InProgress { .. }) => {
            tracing::debug!(result = label, "idempotent call")
        }
        Err(e @ Error::Store { .. }) => match store_fault_throttle(spec.name) {
            Some(held) => tracing::warn!(
                result = label,
                error = %ErrorDisplay(e),
                held_back = held,
                "idempotent call failed (store faults are logged once per 10 s per handler; `held_back` says how many were not)"
            ),
            None => {
                tracing::debug!(result = label, error = %ErrorDisplay(e), "idempotent call failed")
            }
        },
        Err(e) => {
            tracing::warn!(result = label, error = %ErrorDisplay(e), "idempotent call failed")
        }
    }
    r
}

/// Displays an `Error<E>` without requiring `E: Display` (the body's error
/// is not part of this message).
struct ErrorDisplay<'a, E>(&'a Error<E>);

impl<E> std::fmt::Display for ErrorDisplay<'_, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Error::Store { source, .. } => write!(f, "store: {source}"),
            Error::Codec { source, .. } => write!(f, "codec: {source}"),
            Error::Unrecordable { source, .. } => write!(f, "unrecordable: {source}"),
            Error::Config { source, .. } => write!(f, "config: {source}"),
            Error::NotRecorded { source, .. } => write!(f, "not recorded: {source}"),
            other => f.write_str(other.kind()),
        }
    }
}

/// A key's digest, computed only when a subscriber records the span's
/// field (a SHA-256 per call otherwise, with or without a subscriber).
struct Digest<'a>(&'a Key);

impl std::fmt::Display for Digest<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0.digest())
    }
}

/// The span of one call: handler, key digest and (once known) result.
pub(crate) fn call_span(spec: &HandlerSpec, key: &Key) -> tracing::Span {
    tracing::info_span!(
        "idempotent",
        handler = spec.name,
        key = %Digest(key),
        result = tracing::field::Empty,
    )
}
