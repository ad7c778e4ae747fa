//! How the Redis store keeps a record: one string value in this release's
//! format, or a hash written by an earlier release, and how either reads
//! as a [`Record`].
//!
//! The string is `2|s|updated|end|token length|token`, then
//! `created|attempts|failures|fingerprint length|error length|`, then the
//! fingerprint, the last error and the rest: each text is as many bytes
//! as its length says (the rest takes what is left, so it is never
//! escaped). The status `s` is one letter: `p` in progress, `c`
//! completed, `f` failed, `r` retry. Times are milliseconds since the
//! epoch, by the consumer's clock, except the end of a settled record. The
//! end is when the record stops counting, as it was written: the end of
//! the lease while the claim is in progress (by the consumer's clock, which
//! claims compare it with); once completed, failed or waiting for a retry,
//! the moment Redis expires the key, by the server's clock (the function
//! that writes the record reads it, and sets the key to expire then), the
//! ttl after the write. A settled record written before its end was kept
//! has it empty, and its end is read from the key's TTL. The error length is empty when there is no last error. The rest
//! is the outcome of a completed or failed record; a record in progress or
//! waiting for a retry has no outcome, and its rest is the handler's
//! `max_attempts` in decimal, or empty (a handler without it, or a record
//! written before it was kept there: readers that predate it ignore it).
//!
//! A record settled inside an OpenTelemetry trace (feature `otel`) keeps
//! the `traceparent` of the execution that settled it, in format 3:
//! `3|<traceparent>|`, then the record as format 2 writes it after its
//! `2|`. Only completions and failures write it; a claim writes format 2.
//! A release before format 3 cannot read such a record: turn on `otel`
//! once every consumer of the key space runs a release that reads it.
//!
//! What a claim changes (status, update, end, token) comes first; what it
//! keeps follows the token. A claim has no outcome yet, so a completion
//! checks the token and writes a new head (the same token, which the
//! completed record keeps), the old tail as it is, and the outcome: the
//! Lua scripts (`scripts.rs`) do it with one `string.match` of the head.

use crate::error::StoreError;
use crate::store::{Record, Status};

/// The first bytes of every string record of this format.
pub(crate) const TAG: &str = "2|";

/// The first bytes of a record that keeps the `traceparent` of the
/// execution that settled it: `3|<traceparent>|`, then the record as
/// format 2 writes it after its tag.
pub(crate) const TRACED_TAG: &str = "3|";

/// Whether `trace` can be written in format 3: not empty, and no `|` (a
/// `traceparent` is hex digits and dashes).
fn writable_trace(trace: &str) -> bool {
    !trace.is_empty() && !trace.contains('|')
}

/// The current span's `traceparent` as the store's functions take it: the
/// trace a completion or failure writes (format 3), or empty (format 2).
pub(crate) fn settling_trace_arg() -> String {
    crate::store::settling_trace()
        .filter(|t| writable_trace(t))
        .unwrap_or_default()
}

/// The letter a status is written as.
pub(crate) fn status_letter(status: Status) -> char {
    match status {
        Status::InProgress => 'p',
        Status::Completed => 'c',
        Status::Failed => 'f',
        Status::Retry => 'r',
    }
}

fn status_of(letter: &[u8]) -> Option<Status> {
    match letter {
        b"p" => Some(Status::InProgress),
        b"c" => Some(Status::Completed),
        b"f" => Some(Status::Failed),
        b"r" => Some(Status::Retry),
        _ => None,
    }
}

/// Appends `n` in decimal (`itoa`: no formatting machinery, and the
/// digits pushed as one slice; this runs for every number of every record
/// and key written).
pub(crate) fn push_int(out: &mut String, n: i64) {
    out.push_str(itoa::Buffer::new().format(n));
}

/// Appends `n` as 16 lowercase hex digits.
pub(crate) fn push_hex(out: &mut String, n: u64) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.reserve(16);
    for shift in (0..16).rev() {
        // A nibble indexes the 16 digits.
        out.push(char::from(HEX[((n >> (shift * 4)) & 0xf) as usize]));
    }
}

/// A length as the format writes it.
fn push_len(out: &mut String, n: usize) {
    push_int(out, i64::try_from(n).unwrap_or(i64::MAX));
}

/// The parts of a record as the string format holds them.
pub(crate) struct Parts<'a> {
    pub(crate) status: Status,
    pub(crate) created: i64,
    pub(crate) updated: i64,
    /// When the record stops counting: the end of a claim's lease, or when
    /// Redis expires a settled record. `None` only in records written before
    /// the end of a settled record was kept. A settled record written by a
    /// function has its end put in there by the function.
    pub(crate) ends: Option<i64>,
    pub(crate) attempts: i64,
    pub(crate) failures: i64,
    pub(crate) token: &'a str,
    pub(crate) fingerprint: &'a str,
    pub(crate) last_error: Option<&'a str>,
    /// The outcome of a completed or failed record.
    pub(crate) outcome: &'a str,
    /// The handler's `max_attempts`, kept by a record in progress or
    /// waiting for a retry.
    pub(crate) max_attempts: Option<u32>,
    /// The `traceparent` of the execution that settled the record: written
    /// in format 3 when there is one (and it holds no `|`).
    pub(crate) trace: Option<&'a str>,
}

impl Parts<'_> {
    /// The record's string value.
    pub(crate) fn encode(&self) -> String {
        let mut out = String::with_capacity(
            64 + self.token.len()
                + self.fingerprint.len()
                + self.last_error.map_or(0, str::len)
                + self.outcome.len()
                + self.trace.map_or(0, str::len),
        );
        match self.trace.filter(|t| writable_trace(t)) {
            Some(trace) => {
                out.push_str(TRACED_TAG);
                out.push_str(trace);
                out.push('|');
            }
            None => out.push_str(TAG),
        }
        out.push(status_letter(self.status));
        out.push('|');
        push_int(&mut out, self.updated);
        out.push('|');
        if let Some(end) = self.ends {
            push_int(&mut out, end);
        }
        out.push('|');
        push_len(&mut out, self.token.len());
        out.push('|');
        out.push_str(self.token);
        push_int(&mut out, self.created);
        out.push('|');
        push_int(&mut out, self.attempts);
        out.push('|');
        push_int(&mut out, self.failures);
        out.push('|');
        push_len(&mut out, self.fingerprint.len());
        out.push('|');
        if let Some(error) = self.last_error {
            push_len(&mut out, error.len());
        }
        out.push('|');
        out.push_str(self.fingerprint);
        out.push_str(self.last_error.unwrap_or_default());
        if has_outcome(self.status) {
            out.push_str(self.outcome);
        } else if let Some(max) = self.max_attempts {
            push_int(&mut out, i64::from(max));
        }
        out
    }

    /// The string value of `record`, whose `expires_at_ms` is its end.
    pub(crate) fn of(record: &Record) -> Parts<'_> {
        Parts {
            status: record.status,
            created: record.created_at_ms,
            updated: record.updated_at_ms,
            ends: Some(record.expires_at_ms),
            attempts: record.attempts,
            failures: record.failures,
            token: record.token.as_deref().unwrap_or_default(),
            fingerprint: record.fingerprint.as_deref().unwrap_or_default(),
            last_error: record.last_error.as_deref(),
            outcome: record.outcome.as_deref().unwrap_or_default(),
            max_attempts: record.max_attempts,
            trace: record.trace.as_deref(),
        }
    }
}

/// Whether a record of `status` holds an outcome in its rest (completed,
/// failed), or the handler's `max_attempts` (in progress, retry).
fn has_outcome(status: Status) -> bool {
    matches!(status, Status::Completed | Status::Failed)
}

fn malformed(why: &str) -> StoreError {
    StoreError::Schema(format!(
        "a Redis record that is not in idem's format: {why}"
    ))
}

/// Reads a string record of `handler`'s `key`. It expires at the end it
/// was written with; a record written before the end of a settled record
/// was kept expires at `unwritten_end` (what the key's TTL says, or
/// `i64::MAX` when the caller only knows the key is there).
pub(crate) fn decode(
    handler: &str,
    key: &str,
    value: &[u8],
    unwritten_end: i64,
) -> Result<Record, StoreError> {
    let (trace, body) = match value.strip_prefix(TRACED_TAG.as_bytes()) {
        Some(traced) => {
            let end = traced
                .iter()
                .position(|b| *b == b'|')
                .ok_or_else(|| malformed("a trace with no end"))?;
            let trace = std::str::from_utf8(&traced[..end])
                .map_err(|_| malformed("a trace that is not UTF-8"))?;
            (
                (!trace.is_empty()).then(|| trace.to_owned()),
                &traced[end + 1..],
            )
        }
        None => (
            None,
            value
                .strip_prefix(TAG.as_bytes())
                .ok_or_else(|| malformed("no format tag"))?,
        ),
    };
    let number = |field: &[u8]| -> Result<i64, StoreError> {
        std::str::from_utf8(field)
            .ok()
            .and_then(|s| s.parse::<i64>().ok())
            .ok_or_else(|| malformed("a number that does not read"))
    };
    let optional = |field: &[u8]| -> Result<Option<i64>, StoreError> {
        if field.is_empty() {
            Ok(None)
        } else {
            number(field).map(Some)
        }
    };
    let length = |field: &[u8]| -> Result<usize, StoreError> {
        usize::try_from(number(field)?).map_err(|_| malformed("a negative length"))
    };
    let text = |part: &[u8]| -> Result<String, StoreError> {
        String::from_utf8(part.to_vec()).map_err(|_| malformed("a part that is not UTF-8"))
    };
    // The head: status, update, end, token length; then the token.
    let mut head = body.splitn(5, |b| *b == b'|');
    let mut next = || head.next().ok_or_else(|| malformed("too few fields"));
    let status = status_of(next()?).ok_or_else(|| malformed("unknown status"))?;
    let updated = number(next()?)?;
    let ends = optional(next()?)?;
    let token_len = length(next()?)?;
    let after = next()?;
    let token = text(
        after
            .get(..token_len)
            .ok_or_else(|| malformed("the token runs past the end"))?,
    )?;
    // The tail: created, attempts, failures, the two lengths; then the texts.
    let mut tail = after[token_len..].splitn(6, |b| *b == b'|');
    let mut next = || tail.next().ok_or_else(|| malformed("too few fields"));
    let created = number(next()?)?;
    let attempts = number(next()?)?;
    let failures = number(next()?)?;
    let fingerprint_len = length(next()?)?;
    let error_len = optional(next()?)?
        .map(|n| usize::try_from(n).map_err(|_| malformed("a negative length")))
        .transpose()?;
    let rest = next()?;
    let mut at: usize = 0;
    let mut take = |n: Option<usize>| -> Result<String, StoreError> {
        let end = n.map_or(Some(rest.len()), |n| at.checked_add(n));
        let part = end
            .and_then(|end| rest.get(at..end))
            .ok_or_else(|| malformed("a part runs past the end"))?;
        at += part.len();
        text(part)
    };
    let fingerprint = take(Some(fingerprint_len))?;
    let last_error = error_len.map(|n| take(Some(n))).transpose()?;
    let rest = take(None)?;
    let expires_at_ms = ends.unwrap_or(unwritten_end);
    let mut record = Record::new(handler, key, status, created, expires_at_ms);
    record.updated_at_ms = updated;
    record.attempts = attempts;
    record.failures = failures;
    record.token = (!token.is_empty()).then_some(token);
    record.fingerprint = (!fingerprint.is_empty()).then_some(fingerprint);
    record.last_error = last_error;
    record.trace = trace;
    if has_outcome(status) {
        record.outcome = Some(rest);
    } else if !rest.is_empty() {
        let max = rest
            .parse::<u32>()
            .map_err(|_| malformed("a max_attempts that does not read"))?;
        record.max_attempts = Some(max);
    }
    Ok(record)
}

/// A record of an earlier release, from its hash's fields `s`, `o`, `c`,
/// `u`, `l`, `a`, `f`, `e`, `p`, `t` (in this order) and the key's TTL,
/// read at `now`: a hash of the first release has no `l`,
/// `a`, `f`, `e` or `p`, and reads as one attempt, no failure, no
/// fingerprint, its lease ending with its TTL.
pub(crate) fn read_hash(
    handler: &str,
    key: &str,
    fields: Vec<Option<String>>,
    pttl: i64,
    now: i64,
) -> Result<Option<Record>, StoreError> {
    let [
        status,
        outcome,
        created,
        updated,
        lease_end,
        attempts,
        failures,
        last_error,
        fingerprint,
        token,
    ]: [Option<String>; 10] = fields
        .try_into()
        .map_err(|_| StoreError::Schema("unexpected HMGET reply".into()))?;
    let Some(status) = status else {
        return Ok(None);
    };
    let status = Status::parse(&status)
        .ok_or_else(|| StoreError::Schema(format!("unknown status {status:?}")))?;
    let num = |v: &Option<String>| v.as_deref().and_then(|s| s.parse::<i64>().ok());
    let expires_at_ms = match (status, num(&lease_end)) {
        (Status::InProgress, Some(end)) => end,
        _ => now.saturating_add(pttl.max(0)),
    };
    let mut record = Record::new(
        handler,
        key,
        status,
        num(&created).unwrap_or(0),
        expires_at_ms,
    );
    record.outcome = outcome;
    record.updated_at_ms = num(&updated).unwrap_or(record.created_at_ms);
    record.attempts = num(&attempts).unwrap_or(1);
    record.failures = num(&failures).unwrap_or(0);
    record.last_error = last_error;
    record.fingerprint = fingerprint;
    record.token = token;
    Ok(Some(record))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Record {
        let mut r = Record::new("h", "3:k-1", Status::Completed, 1_700_000_000_000, 5);
        r.updated_at_ms = 1_700_000_000_250;
        r.attempts = 3;
        r.failures = 2;
        r.last_error = Some("a|b|2|é".into());
        r.fingerprint = Some("ab12|".into());
        r.outcome = Some(r#"{"x":"|2|c|"}"#.into());
        r
    }

    #[test]
    fn a_record_reads_back_as_written_whatever_its_texts_hold() {
        let r = sample();
        let value = Parts::of(&r).encode();
        assert_eq!(decode("h", "3:k-1", value.as_bytes(), 99).unwrap(), r);

        let mut claim = Record::new("h", "3:k-1", Status::InProgress, 10, 30_010);
        claim.token = Some("0f".repeat(16));
        let value = Parts::of(&claim).encode();
        assert_eq!(
            value,
            format!("2|p|10|30010|32|{}10|1|0|0||", "0f".repeat(16))
        );
        assert_eq!(decode("h", "3:k-1", value.as_bytes(), 99).unwrap(), claim);

        // A claim, and a retry, of a handler with max_attempts keep it in
        // their rest; a completed record has its outcome there instead.
        claim.max_attempts = Some(3);
        let value = Parts::of(&claim).encode();
        assert_eq!(
            value,
            format!("2|p|10|30010|32|{}10|1|0|0||3", "0f".repeat(16))
        );
        assert_eq!(decode("h", "3:k-1", value.as_bytes(), 99).unwrap(), claim);
        let mut retry = sample();
        (retry.status, retry.outcome, retry.max_attempts) = (Status::Retry, None, Some(12));
        let value = Parts::of(&retry).encode();
        assert!(value.ends_with("a|b|2|é12"), "{value}");
        assert_eq!(decode("h", "3:k-1", value.as_bytes(), 5).unwrap(), retry);
        let mut done = sample();
        done.max_attempts = Some(3);
        let back = decode("h", "3:k-1", Parts::of(&done).encode().as_bytes(), 5).unwrap();
        assert_eq!((back.outcome, back.max_attempts), (sample().outcome, None));

        // A settled record with its trace: format 3, the rest as format 2.
        let mut traced = sample();
        traced.trace = Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into());
        let value = Parts::of(&traced).encode();
        let untraced = Parts::of(&sample()).encode();
        assert_eq!(
            value,
            format!(
                "3|00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01|{}",
                &untraced[2..]
            )
        );
        assert_eq!(decode("h", "3:k-1", value.as_bytes(), 99).unwrap(), traced);
        let empty = format!("3||{}", &untraced[2..]);
        assert_eq!(
            decode("h", "3:k-1", empty.as_bytes(), 99).unwrap(),
            sample()
        );
        assert!(decode("h", "k", b"3|00-4bf9", 0).is_err());
        assert!(decode("h", "k", b"3|00-4bf9|", 0).is_err());

        // An empty last error is one, and differs from none.
        let mut empty = sample();
        empty.last_error = Some(String::new());
        let back = decode("h", "3:k-1", Parts::of(&empty).encode().as_bytes(), 5).unwrap();
        assert_eq!(back.last_error.as_deref(), Some(""));
    }

    #[test]
    fn a_settled_record_keeps_the_end_it_was_written_with() {
        // Completed at 250 for a ttl of an hour, under the claim's token.
        let mut done = Record::new("h", "3:k-1", Status::Completed, 100, 3_600_250);
        done.updated_at_ms = 250;
        done.token = Some("0f".repeat(16));
        done.outcome = Some("42".into());
        let value = Parts::of(&done).encode();
        assert_eq!(
            value,
            format!("2|c|250|3600250|32|{}100|1|0|0||42", "0f".repeat(16))
        );
        // Whatever the key's TTL says when it is read.
        for ttl_end in [0, 3_600_249, 3_600_251, i64::MAX] {
            assert_eq!(
                decode("h", "3:k-1", value.as_bytes(), ttl_end).unwrap(),
                done
            );
        }
        // A record written before the end of a settled record was kept:
        // its end is what the key's TTL says.
        let older = decode("h", "3:k-1", b"2|c|250||0|100|1|0|0||42", 3_600_262).unwrap();
        assert_eq!(older.expires_at_ms, 3_600_262);
        assert_eq!(older.outcome.as_deref(), Some("42"));
    }

    #[test]
    fn numbers_are_written_as_decimal_and_hex() {
        for n in [0, 7, -7, 10, 1_700_000_000_000, i64::MAX, i64::MIN] {
            let mut out = String::new();
            push_int(&mut out, n);
            assert_eq!(out, n.to_string());
        }
        let mut out = String::new();
        push_hex(&mut out, 0x00ab_cdef_0123_4567);
        assert_eq!(out, "00abcdef01234567");
    }

    #[test]
    fn what_is_not_a_record_is_a_schema_error_not_a_panic() {
        let good = Parts::of(&sample()).encode();
        for bad in [
            "",
            "1",
            "hello",
            "2|",
            "2|x|1||0|1|1|0|0||",
            "2|c|1||99|short",
            "2|c|1||-1|1|1|0|0||",
            "2|c|one||0|1|1|0|0||",
            "2|c|1||0|1|1|0|99||short",
            &good[..good.len() / 2],
        ] {
            // A cut value may still read (the outcome is the rest): only
            // what cannot read must say so.
            if let Err(e) = decode("h", "k", bad.as_bytes(), 0) {
                assert!(matches!(e, StoreError::Schema(_)), "{bad:?}: {e:?}");
            }
        }
        assert!(decode("h", "k", b"2|c|1||99|short", 0).is_err());
        assert!(decode("h", "k", b"2|c|1||0|1|1|0|99||short", 0).is_err());
        assert!(decode("h", "k", &[b'2', b'|', b'c', b'|', 0xff], 0).is_err());
        // A multi-byte character cut by a length is refused, not split.
        assert!(decode("h", "k", "2|c|1||0|1|1|0|0|1|é".as_bytes(), 0).is_err());
        assert!(decode("h", "k", "2|p|1|5|1|é1|1|0|0||".as_bytes(), 0).is_err());
        // The rest of a record in progress is a number, or nothing.
        assert!(decode("h", "k", b"2|p|1|5|0|1|1|0|0||x", 0).is_err());
        assert!(decode("h", "k", b"2|r|1||0|1|1|0|0||-1", 0).is_err());
    }
}
