//! What the outbox reports: its metrics (names in
//! [`metric`](crate::metric)).

use std::time::Duration;

use crate::telemetry::metric;

/// `n` messages of `handler` committed.
pub(crate) fn staged(handler: &str, n: u32) {
    metrics::counter!(metric::OUTBOX_STAGED, "handler" => handler.to_owned())
        .increment(u64::from(n));
}

/// `n` messages published to `destination` and confirmed.
pub(crate) fn published(table: &str, destination: &'static str, n: usize) {
    metrics::counter!(metric::OUTBOX_PUBLISHED, "table" => table.to_owned(), "destination" => destination)
        .increment(n as u64);
}

/// `n` publishes to `destination` failed.
pub(crate) fn failed(table: &str, destination: &'static str, n: usize) {
    metrics::counter!(metric::OUTBOX_PUBLISH_FAILURES, "table" => table.to_owned(), "destination" => destination)
        .increment(n as u64);
}

/// The table's backlog as last read.
pub(crate) fn backlog(table: &str, rows: u64, oldest: Duration) {
    metrics::gauge!(metric::OUTBOX_ROWS, "table" => table.to_owned()).set(rows as f64);
    metrics::gauge!(metric::OUTBOX_OLDEST_SECONDS, "table" => table.to_owned())
        .set(oldest.as_secs_f64());
}
