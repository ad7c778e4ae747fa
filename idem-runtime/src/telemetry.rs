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
}

fn count(spec: &HandlerSpec, result: &'static str) {
    metrics::counter!(metric::CALLS, "handler" => spec.name, "result" => result).increment(1);
    tracing::Span::current().record("result", result);
}

pub(crate) fn claim_latency(spec: &HandlerSpec, since: Instant) {
    metrics::histogram!(metric::CLAIM_SECONDS, "handler" => spec.name)
        .record(since.elapsed().as_secs_f64());
}

pub(crate) fn body_latency(spec: &HandlerSpec, since: Instant) {
    metrics::histogram!(metric::BODY_SECONDS, "handler" => spec.name)
        .record(since.elapsed().as_secs_f64());
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
        Ok(_) => tracing::debug!(result = label, "idempotent call"),
        Err(Error::Handler { .. }) => tracing::debug!(result = label, "idempotent call"),
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
