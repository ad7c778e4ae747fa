//! The record of a key, as an operator reads it back from any store, and
//! its status.

/// Where a record stands: being worked on, done, failed for good, or failed
/// and waiting for the next delivery.
///
/// # Examples
///
/// ```
/// use idem_runtime::store::Status;
/// assert_eq!(Status::parse("completed"), Some(Status::Completed));
/// assert_eq!(Status::InProgress.as_str(), "in_progress");
/// assert_eq!(Status::ALL.len(), 4);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Claimed; the body has not finished (lease mode), or the transaction
    /// has not committed (never visible to others in transaction mode).
    InProgress,
    /// The body finished and its outcome is recorded.
    Completed,
    /// The body failed with a final error, recorded as the outcome:
    /// duplicates get the error back until the ttl ends.
    Failed,
    /// The body failed with an error that may pass (a handler with
    /// `max_attempts`): the failure is counted, and the next delivery may
    /// claim the key, until the count reaches `max_attempts`.
    Retry,
}

impl Status {
    /// Every status, in the order operators' tools list them.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::store::Status;
    /// let names: Vec<&str> = Status::ALL.iter().map(|s| s.as_str()).collect();
    /// assert_eq!(names, ["in_progress", "completed", "failed", "retry"]);
    /// ```
    pub const ALL: [Status; 4] = [
        Status::InProgress,
        Status::Completed,
        Status::Failed,
        Status::Retry,
    ];

    /// The text stored in the `status` column.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::store::Status;
    /// assert_eq!(Status::Completed.as_str(), "completed");
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            Status::InProgress => "in_progress",
            Status::Completed => "completed",
            Status::Failed => "failed",
            Status::Retry => "retry",
        }
    }

    /// Reads the text of the `status` column.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::store::Status;
    /// assert_eq!(Status::parse("in_progress"), Some(Status::InProgress));
    /// assert_eq!(Status::parse("done"), None);
    /// ```
    pub fn parse(s: &str) -> Option<Status> {
        Status::ALL.into_iter().find(|status| status.as_str() == s)
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One dedup record, as an operator would ask for it: was this message
/// processed, when, with what result; how often did it fail, and why.
///
/// Times are milliseconds since the Unix epoch. It serializes (for
/// operators' tools, such as `idem show --json`) with these field names,
/// the status as its column's text.
///
/// # Examples
///
/// ```
/// # async fn demo() -> Result<(), idem_runtime::StoreError> {
/// use idem_runtime::{Key, MemoryStore};
/// let store = MemoryStore::new();
/// let key = Key::from_parts(&[&"A-17"]).unwrap();
/// if let Some(record) = store.record("deduct_stock", &key).await? {
///     println!("{} at {} -> {:?}", record.status, record.updated_at_ms, record.outcome);
///     println!("{} failures, last: {:?}", record.failures, record.last_error);
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct Record {
    /// The handler's registered name.
    pub handler: String,
    /// The stored key (see [`Key`](crate::Key)).
    pub key: String,
    /// In progress, completed, failed or waiting for a retry.
    pub status: Status,
    /// The recorded result as JSON, once completed; the recorded error as
    /// JSON, once failed for good.
    pub outcome: Option<String>,
    /// How many claims this record has seen in its current window (1, plus
    /// one per lease takeover and per redelivery after a failure).
    pub attempts: i64,
    /// How many deliveries failed in the current window: bodies that
    /// returned an error (counted for handlers with `max_attempts`, and for
    /// final errors), and, in lease mode, claims whose lease ran out before
    /// their body finished. A success resets nothing.
    pub failures: i64,
    /// The text of the last failure, if any.
    pub last_error: Option<String>,
    /// The payload fingerprint of the delivery that wrote the record, for a
    /// handler that declares one.
    pub fingerprint: Option<String>,
    /// The fencing token of the claim in progress: who holds the lease. A
    /// completed record keeps the token of the claim that completed it (a
    /// completion sent again with it answers that it recorded). A failed
    /// record has none, nor has one completed alone by an earlier release.
    pub token: Option<String>,
    /// When the current claim was made.
    pub created_at_ms: i64,
    /// When the record last changed.
    pub updated_at_ms: i64,
    /// When a completed (or failed, or retry) record stops counting, or when
    /// an in-progress lease runs out, as the record was written: the same
    /// at every read. (A settled Redis record: when Redis expires its key,
    /// by the server's clock; one written by an earlier release, from the
    /// key's TTL at the read.)
    pub expires_at_ms: i64,
    /// The handler's `max_attempts` as the claim that wrote the record knew
    /// it: how many failures exhaust the key. `None` for a handler without
    /// it, and where the store does not know it: a record of an earlier
    /// release (a SQL table before schema version 3, a Redis hash), a
    /// completed or failed Redis record (which keeps its outcome in the
    /// limit's place: the limit matters to claims and retries only), or a
    /// store of your own that does not keep it. For operators' tools
    /// ([`is_exhausted`](Record::is_exhausted)); the claim rules read the
    /// limit from the handler itself.
    pub max_attempts: Option<u32>,
    /// The W3C `traceparent` (`00-<trace id>-<span id>-<flags>`) of the
    /// execution that settled the record: the handler's `idempotent` (or
    /// `idempotent_batch`) span whose body completed it or failed (for
    /// good, or counted for a retry); under the HTTP layer that span is a
    /// child of `idem.http`. A duplicate's span links to it, and `idem show` prints
    /// it. `None` while a claim is in progress, without the `otel` feature
    /// or an OpenTelemetry layer, and where the store does not keep it (a
    /// SQL table before schema version 4, a store of your own).
    pub trace: Option<String>,
}

impl Record {
    /// A record with nothing but its identity, status and times: no
    /// outcome, one attempt, no failure.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::store::{Record, Status};
    /// let r = Record::new("notify", "3:m-1", Status::InProgress, 1_000, 31_000);
    /// assert_eq!((r.attempts, r.failures, r.expires_at_ms), (1, 0, 31_000));
    /// ```
    pub fn new(
        handler: &str,
        key: &str,
        status: Status,
        created_at_ms: i64,
        expires_at_ms: i64,
    ) -> Self {
        Record {
            handler: handler.to_owned(),
            key: key.to_owned(),
            status,
            outcome: None,
            attempts: 1,
            failures: 0,
            last_error: None,
            fingerprint: None,
            token: None,
            created_at_ms,
            updated_at_ms: created_at_ms,
            expires_at_ms,
            max_attempts: None,
            trace: None,
        }
    }

    /// The trace id of the execution that settled the record: the second
    /// field of its [`trace`](Record::trace), `None` where it keeps none.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::store::{Record, Status};
    /// let mut r = Record::new("notify", "3:m-1", Status::Completed, 0, 60_000);
    /// assert_eq!(r.trace_id(), None);
    /// r.trace = Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into());
    /// assert_eq!(r.trace_id(), Some("4bf92f3577b34da6a3ce929d0e0e4736"));
    /// ```
    pub fn trace_id(&self) -> Option<&str> {
        self.trace.as_deref().and_then(trace_id_of)
    }

    /// Whether the record has expired at `now_ms` (a lease run out, a
    /// window over): it no longer counts, and a claim replaces it.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::store::{Record, Status};
    /// let r = Record::new("notify", "3:m-1", Status::Completed, 0, 60_000);
    /// assert!(!r.is_expired(59_999));
    /// assert!(r.is_expired(60_000));
    /// ```
    pub fn is_expired(&self, now_ms: i64) -> bool {
        self.expires_at_ms <= now_ms
    }

    /// Why the body's value could not be recorded, when the record is the
    /// failure the runtime records for that: the body succeeded in lease
    /// mode, so its effect happened, but serde could not encode its value
    /// or the value would not read back (a NaN float), or a batch body
    /// returned another number of values than it was given messages. The
    /// key is settled as failed for the handler's ttl, and its deliveries
    /// get [`Error::Unrecordable`](crate::Error::Unrecordable) without
    /// running the body, until the ttl ends or the record is forgotten
    /// (`idem forget`). `None` for any other record.
    ///
    /// The record keeps `{"idem:unrecordable": "<why>"}` as its outcome,
    /// a JSON object no handler's error encodes by accident, and the
    /// reason, prefixed, as its last error.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::store::{Record, Status};
    ///
    /// let mut r = Record::new("notify", "3:m-1", Status::Failed, 0, 60_000);
    /// r.outcome = Some(r#"{"idem:unrecordable":"the result is NaN"}"#.into());
    /// assert_eq!(r.unrecordable().as_deref(), Some("the result is NaN"));
    /// r.outcome = Some(r#"{"UnknownSku":"pear-9"}"#.into()); // a final error of the handler's own
    /// assert_eq!(r.unrecordable(), None);
    /// ```
    pub fn unrecordable(&self) -> Option<String> {
        if self.status != Status::Failed {
            return None;
        }
        unrecordable_reason(self.outcome.as_deref()?)
    }

    /// Whether the key has used up its attempts at `now_ms`: a live
    /// [`Retry`](Status::Retry) record whose failures reached its
    /// [`max_attempts`](Record::max_attempts). Its deliveries are refused
    /// ([`Standing::Exhausted`](crate::store::Standing::Exhausted)) until
    /// the record expires or is forgotten. `false` when the record does not
    /// know its limit.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::store::{Record, Status};
    /// let mut r = Record::new("notify", "3:m-1", Status::Retry, 0, 60_000);
    /// r.failures = 3;
    /// assert!(!r.is_exhausted(1_000)); // its limit is not known
    /// r.max_attempts = Some(3);
    /// assert!(r.is_exhausted(1_000));
    /// assert!(!r.is_exhausted(60_000)); // its window is over: the next delivery runs
    /// r.max_attempts = Some(5);
    /// assert!(!r.is_exhausted(1_000));
    /// ```
    pub fn is_exhausted(&self, now_ms: i64) -> bool {
        self.status == Status::Retry
            && !self.is_expired(now_ms)
            && self
                .max_attempts
                .is_some_and(|max| self.failures >= i64::from(max))
    }
}

/// The trace id in a `traceparent` (`00-<32 hex>-<16 hex>-<2 hex>`), if it
/// has that shape.
pub(crate) fn trace_id_of(traceparent: &str) -> Option<&str> {
    let mut parts = traceparent.split('-');
    let (_version, id, span, _flags) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    (id.len() == 32 && span.len() == 16 && id.bytes().all(|b| b.is_ascii_hexdigit())).then_some(id)
}

/// The member of the one-member JSON object recorded, as a final error, for
/// a key whose body's value could not be recorded.
const UNRECORDABLE: &str = "idem:unrecordable";

/// What the runtime records, as a final error, for a key whose body took
/// effect but whose value could not be recorded (`why`):
/// `{"idem:unrecordable":"<why>"}`. No handler's error encodes as such an
/// object by accident.
pub(crate) fn unrecordable_encoding(why: &str) -> String {
    let mut object = serde_json::Map::new();
    object.insert(UNRECORDABLE.to_owned(), serde_json::Value::from(why));
    serde_json::Value::Object(object).to_string()
}

/// Why the body's value could not be recorded, if `encoded` (a recorded
/// final error) is what [`unrecordable_encoding`] writes.
pub(crate) fn unrecordable_reason(encoded: &str) -> Option<String> {
    // Only an object whose first member is the marker reads further.
    if !encoded.starts_with("{\"idem:unrecordable\"") {
        return None;
    }
    let object: serde_json::Map<String, serde_json::Value> = serde_json::from_str(encoded).ok()?;
    if object.len() != 1 {
        return None;
    }
    object.get(UNRECORDABLE)?.as_str().map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::{unrecordable_encoding, unrecordable_reason};

    #[test]
    fn an_unrecordable_result_reads_back_and_nothing_else_does() {
        for why in ["the result is NaN", "", "a \"quoted\" | é\nline"] {
            let encoded = unrecordable_encoding(why);
            assert_eq!(
                unrecordable_reason(&encoded).as_deref(),
                Some(why),
                "{encoded}"
            );
        }
        assert_eq!(
            unrecordable_encoding("the result is NaN"),
            r#"{"idem:unrecordable":"the result is NaN"}"#
        );
        for other in [
            r#"{"UnknownSku":"pear-9"}"#,
            r#""idem:unrecordable""#,
            r#"{"idem:unrecordable":7}"#,
            r#"{"idem:unrecordable":"x","more":1}"#,
            r#"{"idem:unrecordable":"#,
            "",
        ] {
            assert_eq!(unrecordable_reason(other), None, "{other}");
        }
    }
}
