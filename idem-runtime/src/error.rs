//! The errors of an idempotent call and of the stores.

use std::time::Duration;

use crate::key::Key;

/// A boxed error from a store's driver (sqlx, redis).
///
/// # Examples
///
/// ```
/// use idem_runtime::{BoxError, StoreError};
///
/// let driver: BoxError = "connection refused".into();
/// let err = StoreError::Backend(driver);
/// assert_eq!(err.to_string(), "connection refused");
/// ```
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why an idempotent call did not produce an [`Outcome`](crate::Outcome).
///
/// Every variant names the handler (its registered name) and, where it was
/// derived, the key, so a log line is enough to find the record.
///
/// # Examples
///
/// A consumer decides between ack, nack-with-delay and dead-lettering:
///
/// ```
/// use idem_runtime::{Error, StoreError};
///
/// fn decide<E: std::fmt::Display>(err: &Error<E>) -> &'static str {
///     match err {
///         Error::Handler { .. } => "nack: the body failed and left nothing behind, retry",
///         Error::Failed { .. } => "dead-letter: the body failed for good, and said so",
///         Error::PayloadMismatch { .. } => "dead-letter and alert: one key, two payloads",
///         Error::Exhausted { .. } => "dead-letter: failed max_attempts times",
///         Error::InProgress { .. } => "nack with delay: another consumer is on it",
///         Error::Store { source: StoreError::MissingTable { .. }, .. } => "stop: migrate the store",
///         Error::Store { source: StoreError::Contention { .. }, .. } => "nack: the rows were busy, retry soon",
///         Error::Store { .. } => "nack: the store failed, retry later",
///         Error::Config { .. } => "stop the consumer: the build is wrong, retrying never helps",
///         Error::NotRecorded { .. } => "ack and alert: the effect happened, a redelivery would repeat it",
///         _ => "dead-letter and alert",
///     }
/// }
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error<E> {
    /// The body returned `Err`, an error that may pass on a redelivery.
    /// Nothing of the call stands: in transaction mode the claim rolled back
    /// with the body's writes, in lease mode the claim was released, so a
    /// redelivery runs the body again. For a handler with `max_attempts` the
    /// failure was counted in the record (with the error's text), and the
    /// delivery after the last allowed one gets [`Error::Exhausted`].
    ///
    /// In transaction mode a body's error that the store tells as its own
    /// contention in the call's transaction (a lock wait past the lock
    /// timeout, a deadlock, a serialization failure: PostgreSQL's 55P03,
    /// 40P01, 40001, MySQL's 1205, 1213, SQLite's busy database) is not
    /// this but [`Error::Store`] with [`StoreError::Contention`], counted
    /// against nothing; see
    /// [`TxStore::contention`](crate::store::TxStore::contention).
    #[error("handler `{handler}` failed for key {}: {error}", .key.shown())]
    Handler {
        /// The handler's registered name.
        handler: &'static str,
        /// The derived key.
        key: Key,
        /// The body's own error. It is part of this error's message, and
        /// not its [`source`](std::error::Error::source): so `Error<E>` is a
        /// `std::error::Error` for any `E: Display + Debug` (`anyhow::Error`,
        /// `Box<dyn Error + Send + Sync>` included) and `?` converts it into
        /// those; get the body's error back with
        /// [`into_handler_error`](Error::into_handler_error).
        error: E,
    },

    /// The body failed with an error its type calls final (see
    /// [`FinalError`](crate::FinalError)): the SKU does not exist, the
    /// account is closed. The error is recorded like an outcome, and every
    /// delivery of the key until the ttl ends gets it back (`replayed` is then
    /// `true`) without running the body, except in transaction mode when the
    /// delivery's body runs before the record is found: claiming last
    /// (`ClaimOrder::Last`), or, under the default `ClaimOrder::Checked`, a
    /// delivery that races the first one's open transaction. Its writes are
    /// then rolled back. In transaction mode the failing
    /// body's writes were rolled back too. Dead-letter (or ack) the message:
    /// no redelivery can pass.
    #[error("handler `{handler}` failed for good for key {}{}: {error}", .key.shown(), if *.replayed { " (recorded earlier)" } else { "" })]
    Failed {
        /// The handler's registered name.
        handler: &'static str,
        /// The derived key.
        key: Key,
        /// The body's error: this delivery's, or the recorded one, decoded.
        error: E,
        /// Whether the error was read from the record instead of returned by
        /// this delivery's body.
        replayed: bool,
    },

    /// The key was recorded for a delivery with another payload: the
    /// handler's `fingerprint` (its declared expression, or the whole
    /// message) differs between the two deliveries. The same key names two
    /// different messages, a producer's bug or a key expression that misses
    /// a field. The record was left as it is, and nothing of this delivery
    /// was committed: its body did not run, except in transaction mode when
    /// it ran before the record was found: claiming last
    /// (`ClaimOrder::Last`), or, under the default `ClaimOrder::Checked`, a
    /// delivery that raced the first one's open transaction. Its writes were
    /// then rolled back. Dead-letter the message and alert.
    #[error("handler `{handler}`: key {} was recorded with another payload (fingerprint {recorded}, this delivery's {given}); the record was left as it is and nothing of this delivery was committed", .key.shown())]
    PayloadMismatch {
        /// The handler's registered name.
        handler: &'static str,
        /// The derived key.
        key: Key,
        /// The fingerprint the record holds.
        recorded: String,
        /// This delivery's fingerprint.
        given: String,
    },

    /// The body failed on as many deliveries of this key as the handler's
    /// `max_attempts` allows, so this one did not run it. Dead-letter the
    /// message; once the cause is fixed, an operator lets it run again with
    /// `idem forget`.
    #[error("handler `{handler}`: key {} failed {failures} times, its attempts are exhausted{}", .key.shown(), .last_error.as_ref().map(|e| format!("; last error: {e}")).unwrap_or_default())]
    Exhausted {
        /// The handler's registered name.
        handler: &'static str,
        /// The derived key.
        key: Key,
        /// How many deliveries failed.
        failures: u32,
        /// The last failure's text, as recorded.
        last_error: Option<String>,
    },

    /// Another delivery of the same key is being processed right now (a live
    /// lease, or a transaction holding the key past the lock timeout). Nack
    /// and redeliver after `retry_after`. Nothing of this delivery was
    /// committed; its body did not run, except claiming last, where the
    /// wait comes at the insert after the body, whose writes were rolled
    /// back.
    #[error(
        "handler `{handler}`: key {} is being processed by another consumer; retry after {retry_after:?}"
    , .key.shown())]
    InProgress {
        /// The handler's registered name.
        handler: &'static str,
        /// The derived key.
        key: Key,
        /// When to redeliver. Lease mode: when the other delivery's result is
        /// likely to be recorded: what is left of this handler's typical body
        /// time in this process, or, before any body finished or once the
        /// other claim outlived that time, as long again as the claim has been
        /// held; 10 ms at the least, unless less of the other claim's lease is
        /// left, and never past its end (then the key can be taken over).
        /// Transaction mode: the lock timeout the claim waited.
        retry_after: Duration,
    },

    /// Lease mode: the body finished, but its lease had run out and another
    /// consumer took the key over, so this result was not recorded. The body's
    /// external effect may have happened twice; the record holds the other
    /// consumer's result (under the other claim's token, even when it is the
    /// same bytes as this one).
    ///
    /// Not this: a completion that the store wrote but whose reply was lost
    /// (the connection dropped after the write). The runtime sends a failed
    /// completion again, the store answers that the record was completed by
    /// this claim's own token (see [`LeaseStore::complete`](crate::store::LeaseStore::complete)),
    /// and the call is [`Outcome::Executed`](crate::Outcome::Executed).
    #[error(
        "handler `{handler}`: lease on key {} was lost to another consumer; this result was not recorded"
    , .key.shown())]
    LeaseLost {
        /// The handler's registered name.
        handler: &'static str,
        /// The derived key.
        key: Key,
    },

    /// Lease mode: the body succeeded, so its effect happened, but its
    /// outcome could not be recorded: the store kept failing for as long as
    /// the call's lease held (the runtime retried the completion until then).
    /// A redelivery after the lease runs out would run the body again, so
    /// ack the message (do not redeliver) and alert: the key has no record.
    #[error(
        "handler `{handler}`: the body took effect for key {}, but its outcome could not be recorded while the lease held: {source}"
    , .key.shown())]
    NotRecorded {
        /// The handler's registered name.
        handler: &'static str,
        /// The derived key.
        key: Key,
        /// The store's last failure.
        #[source]
        source: StoreError,
    },

    /// A key part was an `Option` holding `None`; no key could be derived and
    /// the body did not run.
    #[error("handler `{handler}`: key part `{part}` is None, so no idempotency key can be derived")]
    KeyMissing {
        /// The handler's registered name.
        handler: &'static str,
        /// The part of the key expression that was `None`.
        part: &'static str,
    },

    /// The body succeeded, but its value cannot be recorded so that a
    /// duplicate reads the same value back: serde could not encode it, or its
    /// encoding does not decode into the return type again (a NaN or infinite
    /// float, which JSON can only write as `null`; a type whose `Deserialize`
    /// refuses what its `Serialize` wrote). The value is never written, so no
    /// duplicate can ever meet an unreadable record.
    ///
    /// Transaction mode: the body's writes were rolled back with the claim,
    /// and a redelivery runs the body again and is refused again.
    ///
    /// Lease mode: the body's effect happened, so the key is settled at once
    /// as failed for the handler's ttl, its record saying why (`idem show`
    /// prints it; [`Record::unrecordable`](crate::Record::unrecordable)):
    /// no delivery runs the body again until the ttl ends or an operator
    /// runs `idem forget`. Every later delivery of the key gets this error
    /// too, without running the body, its `source` made from the recorded
    /// reason (the same text), whatever the handler's error type. A batch
    /// answers it for each message whose value cannot be recorded (the
    /// others are recorded as usual), and for each message of a batch
    /// settled by [`Error::OutcomeCount`] on a later delivery. If the store
    /// cannot settle the key while the lease holds, that is logged, and a
    /// redelivery after the lease runs the body again.
    ///
    /// Either way, dead-letter the message rather than redeliver it.
    #[error("handler `{handler}`: the result for key {} cannot be recorded: {source}", .key.shown())]
    Unrecordable {
        /// The handler's registered name.
        handler: &'static str,
        /// The derived key.
        key: Key,
        /// Why: serde's error, encoding or reading back.
        #[source]
        source: serde_json::Error,
    },

    /// A batch handler's body returned another number of values than it
    /// was given fresh messages, so no value can be matched to its message.
    /// No value was recorded. Transaction mode: the body's writes were
    /// rolled back. Lease mode: the body's effects happened, so every fresh
    /// key of the batch is settled as failed for the handler's ttl, as for
    /// [`Error::Unrecordable`]: later deliveries of those keys get
    /// `Unrecordable` (saying what the body returned) without running the
    /// body, until the ttl ends or the keys are forgotten. A bug in the
    /// handler: fix the body.
    #[error(
        "handler `{handler}`: the batch body was given {fresh} fresh messages but returned {returned} values"
    )]
    OutcomeCount {
        /// The handler's registered name.
        handler: &'static str,
        /// How many fresh messages the body was given.
        fresh: usize,
        /// How many values it returned.
        returned: usize,
    },

    /// A recorded outcome no longer decodes into the handler's return type
    /// (the type changed since it was recorded). Nothing of this delivery was
    /// committed; its body did not run, except when its body ran before the
    /// record was found: claiming last (`ClaimOrder::Last`), or, under the
    /// default `ClaimOrder::Checked`, a delivery that raced the first one's
    /// open transaction. Its writes were then rolled back.
    #[error("handler `{handler}`: the recorded outcome for key {} does not decode: {source}", .key.shown())]
    Codec {
        /// The handler's registered name.
        handler: &'static str,
        /// The derived key.
        key: Key,
        /// The serde error.
        #[source]
        source: serde_json::Error,
    },

    /// The binary itself is wrong: two handlers share a registered name, so
    /// their keys would collide. No call of any handler runs until the build
    /// is fixed, and no redelivery can fix it: stop the consumer, give the
    /// handlers distinct `name = "..."`s and deploy again.
    #[error("handler `{handler}` refused to run: {source}")]
    Config {
        /// The handler's registered name.
        handler: &'static str,
        /// Every clash in the binary.
        #[source]
        source: crate::registry::RegistryError,
    },

    /// The store failed: connection, timeout, schema. In transaction mode
    /// this is also what a call returns when the transaction's connection
    /// failed while the body ran (the body's own error was only the symptom
    /// of it), and when the body's error was the store's contention in the
    /// call's transaction ([`StoreError::Contention`], with the body's
    /// error as its text): nothing was committed, no failure was counted
    /// against `max_attempts`, and a redelivery is the cure.
    #[error("handler `{handler}`: store error{}: {source}", key.as_ref().map(|k| format!(" for key {}", k.shown())).unwrap_or_default())]
    Store {
        /// The handler's registered name.
        handler: &'static str,
        /// The derived key, when it was derived before the failure.
        key: Option<Key>,
        /// What the store reported.
        #[source]
        source: StoreError,
    },
}

impl<E> Error<E> {
    /// The registered name of the handler that failed.
    ///
    /// # Examples
    ///
    /// ```
    /// let err: idem_runtime::Error<()> = idem_runtime::Error::KeyMissing { handler: "h", part: "coupon" };
    /// assert_eq!(err.handler(), "h");
    /// ```
    pub fn handler(&self) -> &'static str {
        match self {
            Error::Handler { handler, .. }
            | Error::Failed { handler, .. }
            | Error::PayloadMismatch { handler, .. }
            | Error::Exhausted { handler, .. }
            | Error::InProgress { handler, .. }
            | Error::LeaseLost { handler, .. }
            | Error::NotRecorded { handler, .. }
            | Error::KeyMissing { handler, .. }
            | Error::Unrecordable { handler, .. }
            | Error::Codec { handler, .. }
            | Error::OutcomeCount { handler, .. }
            | Error::Config { handler, .. }
            | Error::Store { handler, .. } => handler,
        }
    }

    /// The derived key, when there is one.
    ///
    /// # Examples
    ///
    /// ```
    /// let err: idem_runtime::Error<()> = idem_runtime::Error::KeyMissing { handler: "h", part: "coupon" };
    /// assert!(err.key().is_none());
    /// ```
    pub fn key(&self) -> Option<&Key> {
        match self {
            Error::Handler { key, .. }
            | Error::Failed { key, .. }
            | Error::PayloadMismatch { key, .. }
            | Error::Exhausted { key, .. }
            | Error::InProgress { key, .. }
            | Error::LeaseLost { key, .. }
            | Error::NotRecorded { key, .. }
            | Error::Unrecordable { key, .. }
            | Error::Codec { key, .. } => Some(key),
            Error::Store { key, .. } => key.as_ref(),
            Error::KeyMissing { .. } | Error::Config { .. } | Error::OutcomeCount { .. } => None,
        }
    }

    /// The body's own error, if that is what this is: a failure to retry
    /// ([`Error::Handler`]) or a final one ([`Error::Failed`], also when
    /// replayed from the record).
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::{Error, Key};
    /// let key = Key::from_parts(&[&1u8]).unwrap();
    /// let err = Error::Handler { handler: "h", key, error: "out of stock" };
    /// assert_eq!(err.into_handler_error(), Some("out of stock"));
    /// ```
    pub fn into_handler_error(self) -> Option<E> {
        match self {
            Error::Handler { error, .. } | Error::Failed { error, .. } => Some(error),
            _ => None,
        }
    }

    /// A short label of the variant, as used in metrics (`handler_error`,
    /// `failed`, `payload_mismatch`, `exhausted`, `in_progress`, `lease_lost`, `not_recorded`, `key_missing`,
    /// `unrecordable`, `codec`,
    /// `config`, `store`).
    ///
    /// # Examples
    ///
    /// ```
    /// let err: idem_runtime::Error<()> = idem_runtime::Error::KeyMissing { handler: "h", part: "p" };
    /// assert_eq!(err.kind(), "key_missing");
    /// ```
    pub fn kind(&self) -> &'static str {
        match self {
            Error::Handler { .. } => "handler_error",
            Error::Failed { .. } => "failed",
            Error::PayloadMismatch { .. } => "payload_mismatch",
            Error::Exhausted { .. } => "exhausted",
            Error::InProgress { .. } => "in_progress",
            Error::LeaseLost { .. } => "lease_lost",
            Error::NotRecorded { .. } => "not_recorded",
            Error::KeyMissing { .. } => "key_missing",
            Error::Unrecordable { .. } => "unrecordable",
            Error::Codec { .. } => "codec",
            Error::OutcomeCount { .. } => "outcome_count",
            Error::Config { .. } => "config",
            Error::Store { .. } => "store",
        }
    }
}

/// What a store reported, apart from any handler.
///
/// Returned by store set-up (`connect`, `migrate`, the sweeper) and carried by
/// [`Error::Store`] in a handler's call.
///
/// # Examples
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// let err = idem_runtime::SqliteStore::validate_table_name("keys; drop table x").unwrap_err();
/// assert!(matches!(err, idem_runtime::StoreError::InvalidTableName { .. }));
/// # }
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The database or server reported an error, or could not be reached.
    #[error("{0}")]
    Backend(#[source] BoxError),

    /// An operation took longer than the store's timeout.
    #[error("timed out after {0:?}")]
    Timeout(Duration),

    /// The dedup table does not exist: the store was never migrated.
    #[error(
        "the dedup table `{table}` does not exist: call `migrate()` on the store once before handling messages"
    )]
    MissingTable {
        /// The table the store was configured with.
        table: String,
    },

    /// A Redis key prefix that cannot be used.
    #[error("invalid Redis key prefix {prefix:?}: use non-empty text without `{{` or `}}`")]
    InvalidPrefix {
        /// The rejected prefix.
        prefix: String,
    },

    /// A table name that is not a plain SQL identifier.
    #[error(
        "invalid table name {name:?}: use letters, digits and `_` (optionally `schema.table`), at most 63 bytes, not starting with a digit"
    )]
    InvalidTableName {
        /// The rejected name.
        name: String,
    },

    /// The dedup table, or a record in it, has a shape this release does not
    /// read (a missing table is [`StoreError::MissingTable`]).
    #[error("schema: {0}")]
    Schema(String),

    /// The store cannot do what the call asks of it (a store of your own
    /// that does not implement an optional part of the contract).
    #[error("the {store} store cannot {what}")]
    Unsupported {
        /// The store's name.
        store: &'static str,
        /// What it cannot do.
        what: &'static str,
    },

    /// TLS settings that cannot be used: a file that cannot be read, PEM
    /// without a certificate, a `redis://` URL given TLS settings.
    #[cfg(feature = "tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    #[error("TLS: {0}")]
    Tls(#[source] Box<crate::tls::TlsError>),

    /// Two handlers in this binary share a registered name, so their keys
    /// would collide: returned when a store is built; calls report it as
    /// [`Error::Config`].
    #[error("{0}")]
    Registry(#[from] crate::registry::RegistryError),

    /// Transaction mode: a statement of the body met contention in the
    /// call's transaction: it gave up waiting on a row another transaction
    /// holds, the database chose the transaction as a deadlock victim, or
    /// could not serialize it ([`TxStore::contention`] found it in the
    /// body's error). The database's own transient fault, not the
    /// message's: the call's transaction was rolled back (the claim, the
    /// body's writes, and no failure counted against `max_attempts`), and a
    /// redelivery runs the body again.
    ///
    /// [`TxStore::contention`]: crate::store::TxStore::contention
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::{Contention, StoreError};
    ///
    /// let err = StoreError::Contention {
    ///     kind: Contention::LockTimeout,
    ///     error: "sql: canceling statement due to lock timeout".into(),
    /// };
    /// assert_eq!(
    ///     err.to_string(),
    ///     "a lock timeout in the body's transaction, rolled back: sql: canceling statement due to lock timeout"
    /// );
    /// ```
    #[error("a {kind} in the body's transaction, rolled back: {error}")]
    Contention {
        /// What the database reported.
        kind: Contention,
        /// The body's error, as its text (`Display`).
        error: String,
    },
}

/// A database's transient fault in a transaction, which running the
/// transaction again can pass: what [`StoreError::Contention`] says a
/// transaction-mode body met.
///
/// # Examples
///
/// ```
/// use idem_runtime::Contention;
///
/// assert_eq!(Contention::Deadlock.to_string(), "deadlock");
/// assert_eq!(Contention::LockTimeout.to_string(), "lock timeout");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Contention {
    /// The statement gave up waiting on a lock another transaction holds:
    /// PostgreSQL's `lock_not_available` (55P03, past `lock_timeout`),
    /// MySQL's 1205 (past `innodb_lock_wait_timeout`).
    LockTimeout,
    /// The database chose the transaction as a deadlock victim and rolled
    /// it back: PostgreSQL's `deadlock_detected` (40P01), MySQL's 1213.
    Deadlock,
    /// The transaction could not be serialized with concurrent ones:
    /// PostgreSQL's `serialization_failure` (40001).
    Serialization,
    /// The database was locked by another connection past the busy
    /// timeout: SQLite's `SQLITE_BUSY` and `SQLITE_LOCKED`.
    Busy,
}

impl std::fmt::Display for Contention {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Contention::LockTimeout => "lock timeout",
            Contention::Deadlock => "deadlock",
            Contention::Serialization => "serialization failure",
            Contention::Busy => "busy database",
        })
    }
}

#[cfg(feature = "tls")]
impl From<crate::tls::TlsError> for StoreError {
    fn from(e: crate::tls::TlsError) -> Self {
        StoreError::Tls(Box::new(e))
    }
}

impl StoreError {
    /// Wraps a driver error.
    #[cfg_attr(not(any(feature = "_sql", feature = "redis")), allow(dead_code))]
    pub(crate) fn backend(e: impl std::error::Error + Send + Sync + 'static) -> Self {
        StoreError::Backend(Box::new(e))
    }
}
