//! How records and counts are written: times as UTC timestamps and relative
//! to now, records as text or as JSON with stable field names, tables with
//! aligned columns.

use idem_runtime::store::{Record, Status, StoredKey};
use serde::Serialize;

/// `ms` (since the Unix epoch) as an RFC 3339 UTC timestamp with
/// milliseconds: `2023-11-14T22:13:20.000Z`.
pub(crate) fn utc(ms: i64) -> String {
    let secs = ms.div_euclid(1_000);
    let millis = ms.rem_euclid(1_000);
    let days = secs.div_euclid(86_400);
    let day_secs = secs.rem_euclid(86_400);
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        day_secs / 3_600,
        day_secs % 3_600 / 60,
        day_secs % 60
    )
}

/// How far `ms` is from `now_ms`, in its two largest units: `3m 12s ago`,
/// `in 23h 59m`, `now`.
pub(crate) fn relative(ms: i64, now_ms: i64) -> String {
    let delta = i128::from(ms) - i128::from(now_ms);
    let span = delta.unsigned_abs();
    if span < 1_000 {
        return "now".to_owned();
    }
    const UNITS: [(u128, &str); 4] = [
        (86_400_000, "d"),
        (3_600_000, "h"),
        (60_000, "m"),
        (1_000, "s"),
    ];
    let i = UNITS
        .iter()
        .position(|(size, _)| span >= *size)
        .unwrap_or(UNITS.len() - 1);
    let (size, unit) = UNITS[i];
    let mut text = format!("{}{unit}", span / size);
    if let Some((next, next_unit)) = UNITS.get(i + 1) {
        let n = span % size / next;
        if n > 0 {
            text.push_str(&format!(" {n}{next_unit}"));
        }
    }
    if delta < 0 {
        format!("{text} ago")
    } else {
        format!("in {text}")
    }
}

/// A timestamp and how far it is from now: `2023-11-14T22:13:20.000Z (3m
/// 12s ago)`.
pub(crate) fn when(ms: i64, now_ms: i64) -> String {
    format!("{} ({})", utc(ms), relative(ms, now_ms))
}

/// A stored key for people: its parts (`A-17 + apple`), or the text as
/// stored when it is not a key the runtime wrote.
pub(crate) fn shown_key(stored: &str) -> String {
    StoredKey::parse(stored).map_or_else(|_| stored.to_owned(), |k| k.shown())
}

/// What a record's state means now.
pub(crate) fn state(record: &Record, now_ms: i64) -> String {
    let expired = record.is_expired(now_ms);
    let ends = relative(record.expires_at_ms, now_ms);
    if record.is_exhausted(now_ms) {
        return format!(
            "exhausted: {}; its deliveries are refused until {}, or until it is forgotten",
            failures(record),
            utc(record.expires_at_ms)
        );
    }
    if !expired && record.unrecordable().is_some() {
        return format!(
            "unrecordable: the body took effect but its result could not be recorded; its deliveries are refused until {}, or until it is forgotten",
            utc(record.expires_at_ms)
        );
    }
    match (record.status, expired) {
        (Status::InProgress, false) => format!("live claim, its lease ends {ends}"),
        (Status::InProgress, true) => {
            format!("stuck: its lease ran out {ends}; the next delivery takes the key over")
        }
        (_, false) => format!("counts until {}", utc(record.expires_at_ms)),
        (_, true) => format!("expired {ends}, not yet swept: the next delivery runs again"),
    }
}

/// A record's failures, and how many its handler allows when the record
/// knows: `3 of 3 failures`, `1 failure`.
pub(crate) fn failures(record: &Record) -> String {
    let s = if record.failures == 1 { "" } else { "s" };
    match record.max_attempts {
        Some(max) => format!("{} of {max} failure{s}", record.failures),
        None => format!("{} failure{s}", record.failures),
    }
}

/// A record's failures as a column: `3 of 3`, or `1` when the record does
/// not know its handler's limit.
pub(crate) fn failures_cell(record: &Record) -> String {
    match record.max_attempts {
        Some(max) => format!("{} of {max}", record.failures),
        None => record.failures.to_string(),
    }
}

/// A record's status, and what it means now, in a word: `in_progress,
/// stuck`, `retry, exhausted`, `completed, expired`.
pub(crate) fn status_now(record: &Record, now_ms: i64) -> String {
    match (record.status, record.is_expired(now_ms)) {
        (Status::InProgress, true) => "in_progress, stuck".to_owned(),
        (status, true) => format!("{status}, expired"),
        (status, false) if record.is_exhausted(now_ms) => format!("{status}, exhausted"),
        (status, false) if record.unrecordable().is_some() => format!("{status}, unrecordable"),
        (status, false) => status.to_string(),
    }
}

/// A record as `--json` writes it.
#[derive(Debug, Serialize)]
pub(crate) struct RecordJson<'r> {
    handler: &'r str,
    key: &'r str,
    key_parts: Option<Vec<String>>,
    status: Status,
    /// The recorded JSON itself (text if it is not JSON).
    outcome: Option<serde_json::Value>,
    /// Why the body's result could not be recorded, for a key settled
    /// because of it.
    unrecordable: Option<String>,
    attempts: i64,
    failures: i64,
    /// The handler's limit, as the record knows it.
    max_attempts: Option<u32>,
    /// A live retry record whose failures reached `max_attempts`.
    exhausted: bool,
    last_error: Option<&'r str>,
    fingerprint: Option<&'r str>,
    token: Option<&'r str>,
    /// The `traceparent` of the execution that settled the record.
    trace: Option<&'r str>,
    /// Its trace id.
    trace_id: Option<&'r str>,
    created_at_ms: i64,
    updated_at_ms: i64,
    expires_at_ms: i64,
    created_at: String,
    updated_at: String,
    expires_at: String,
    expired: bool,
}

impl<'r> RecordJson<'r> {
    pub(crate) fn new(record: &'r Record, now_ms: i64) -> Self {
        RecordJson {
            handler: &record.handler,
            key: &record.key,
            key_parts: StoredKey::parse(&record.key)
                .ok()
                .and_then(|k| k.parts().map(<[String]>::to_vec)),
            status: record.status,
            outcome: record.outcome.as_deref().map(|text| {
                serde_json::from_str(text)
                    .unwrap_or_else(|_| serde_json::Value::String(text.to_owned()))
            }),
            unrecordable: record.unrecordable(),
            attempts: record.attempts,
            failures: record.failures,
            max_attempts: record.max_attempts,
            exhausted: record.is_exhausted(now_ms),
            last_error: record.last_error.as_deref(),
            fingerprint: record.fingerprint.as_deref(),
            token: record.token.as_deref(),
            trace: record.trace.as_deref(),
            trace_id: record.trace_id(),
            created_at_ms: record.created_at_ms,
            updated_at_ms: record.updated_at_ms,
            expires_at_ms: record.expires_at_ms,
            created_at: utc(record.created_at_ms),
            updated_at: utc(record.updated_at_ms),
            expires_at: utc(record.expires_at_ms),
            expired: record.is_expired(now_ms),
        }
    }
}

/// A record as `show` writes it: one field a line.
pub(crate) fn record_text(record: &Record, now_ms: i64) -> String {
    let dash = |v: Option<&str>| v.unwrap_or("-").to_owned();
    let shown = shown_key(&record.key);
    let key = if shown == record.key {
        shown
    } else {
        format!("{shown}  (stored {})", record.key)
    };
    let ends = if record.status == Status::InProgress {
        "lease ends"
    } else {
        "expires"
    };
    let lines = [
        ("handler", record.handler.clone()),
        ("key", key),
        (
            "status",
            format!("{} ({})", record.status, state(record, now_ms)),
        ),
        (
            "outcome",
            match record.unrecordable() {
                Some(why) => format!("- (the result could not be recorded: {why})"),
                None => dash(record.outcome.as_deref()),
            },
        ),
        ("attempts", record.attempts.to_string()),
        ("failures", record.failures.to_string()),
        (
            "max attempts",
            record
                .max_attempts
                .map_or("-".to_owned(), |m| m.to_string()),
        ),
        ("last error", dash(record.last_error.as_deref())),
        ("fingerprint", dash(record.fingerprint.as_deref())),
        // A completed record keeps the token of the claim that completed
        // it, which holds no lease.
        (
            "lease holder",
            dash(
                record
                    .token
                    .as_deref()
                    .filter(|_| record.status != Status::Completed),
            ),
        ),
        ("created", when(record.created_at_ms, now_ms)),
        ("updated", when(record.updated_at_ms, now_ms)),
        (ends, when(record.expires_at_ms, now_ms)),
        // The execution that settled the record: its trace, and its span
        // within it.
        (
            "settled in",
            match (record.trace_id(), record.trace.as_deref()) {
                (Some(id), Some(parent)) => format!("trace {id}  ({parent})"),
                _ => "-".to_owned(),
            },
        ),
    ];
    let mut out = String::new();
    for (label, value) in lines {
        // One line per field, whatever the text holds.
        let value = value.replace(['\n', '\r'], " ");
        out.push_str(&format!("{label:<13}{value}\n"));
    }
    out
}

/// `rows` under `header`, columns aligned (by characters).
pub(crate) fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let header: Vec<String> = header.iter().map(|h| (*h).to_owned()).collect();
    for row in std::iter::once(&header).chain(rows) {
        let mut line = String::new();
        for (i, (cell, w)) in row.iter().zip(&widths).enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                let pad = w.saturating_sub(cell.chars().count());
                line.push_str(cell);
                line.push_str(&" ".repeat(pad + 2));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// `text` on one line, cut to `max` characters.
pub(crate) fn cut(text: &str, max: usize) -> String {
    let one_line = text.replace(['\n', '\r', '\t'], " ");
    if one_line.chars().count() <= max {
        return one_line;
    }
    let mut cut: String = one_line.chars().take(max.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

#[cfg(test)]
mod tests {
    use super::{cut, relative, table, utc};

    #[test]
    fn timestamps_are_utc() {
        assert_eq!(utc(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(utc(1_700_000_000_000), "2023-11-14T22:13:20.000Z");
        assert_eq!(utc(951_782_400_123), "2000-02-29T00:00:00.123Z");
        assert_eq!(utc(-1), "1969-12-31T23:59:59.999Z");
        // the extremes a record can hold do not overflow
        let _ = utc(i64::MAX);
        let _ = utc(i64::MIN);
    }

    #[test]
    fn spans_are_relative() {
        assert_eq!(relative(1_000, 1_500), "now");
        assert_eq!(relative(0, 192_000), "3m 12s ago");
        assert_eq!(relative(86_340_000, 0), "in 23h 59m");
        assert_eq!(relative(3_600_000, 0), "in 1h");
        assert_eq!(relative(0, 2 * 86_400_000 + 5_000), "2d ago");
        assert_eq!(relative(0, 61_000), "1m 1s ago");
        let _ = relative(i64::MAX, i64::MIN);
    }

    #[test]
    fn tables_align() {
        let rows = vec![vec!["a".to_owned(), "1".to_owned()]];
        assert_eq!(table(&["KEY", "N"], &rows), "KEY  N\na    1\n");
        assert_eq!(cut("abcdef", 4), "abc…");
        assert_eq!(cut("a\nb", 4), "a b");
    }
}
