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
/// use idem_runtime::Error;
///
/// fn decide<E: std::fmt::Display>(err: &Error<E>) -> &'static str {
///     match err {
///         Error::Handler { .. } => "nack: the body failed and left nothing behind, retry",
///         Error::InProgress { .. } => "nack with delay: another consumer is on it",
///         Error::Store { .. } => "nack: the store is unreachable, retry later",
///         _ => "dead-letter and alert",
///     }
/// }
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error<E> {
    /// The body returned `Err`. Nothing was recorded: in transaction mode the
    /// claim rolled back with the body's writes, in lease mode the claim was
    /// released, so a redelivery runs the body again.
    #[error("handler `{handler}` failed for key {key}: {error}")]
    Handler {
        /// The handler's registered name.
        handler: &'static str,
        /// The derived key.
        key: Key,
        /// The body's own error.
        #[source]
        error: E,
    },

    /// Another delivery of the same key is being processed right now (a live
    /// lease, or a transaction holding the key past the lock timeout). Nack
    /// and redeliver after `retry_after`.
    #[error(
        "handler `{handler}`: key {key} is being processed by another consumer; retry after {retry_after:?}"
    )]
    InProgress {
        /// The handler's registered name.
        handler: &'static str,
        /// The derived key.
        key: Key,
        /// A hint for the redelivery delay: what is left of the other claim's
        /// lease, or the lock timeout.
        retry_after: Duration,
    },

    /// Lease mode: the body finished, but its lease had run out and another
    /// consumer took the key over, so this result was not recorded. The body's
    /// external effect may have happened twice; the record holds the other
    /// consumer's result.
    #[error(
        "handler `{handler}`: lease on key {key} was lost to another consumer; this result was not recorded"
    )]
    LeaseLost {
        /// The handler's registered name.
        handler: &'static str,
        /// The derived key.
        key: Key,
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

    /// The recorded outcome could not be encoded, or no longer decodes into
    /// the handler's return type (the type changed since it was recorded).
    #[error("handler `{handler}`: outcome for key {key} does not (de)serialize: {source}")]
    Codec {
        /// The handler's registered name.
        handler: &'static str,
        /// The derived key.
        key: Key,
        /// The serde error.
        #[source]
        source: serde_json::Error,
    },

    /// The store failed: connection, timeout, schema, configuration.
    #[error("handler `{handler}`: store error{}: {source}", key.as_ref().map(|k| format!(" for key {k}")).unwrap_or_default())]
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
            | Error::InProgress { handler, .. }
            | Error::LeaseLost { handler, .. }
            | Error::KeyMissing { handler, .. }
            | Error::Codec { handler, .. }
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
            | Error::InProgress { key, .. }
            | Error::LeaseLost { key, .. }
            | Error::Codec { key, .. } => Some(key),
            Error::Store { key, .. } => key.as_ref(),
            Error::KeyMissing { .. } => None,
        }
    }

    /// The body's own error, if that is what this is.
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
            Error::Handler { error, .. } => Some(error),
            _ => None,
        }
    }

    /// A short label of the variant, as used in metrics (`handler_error`,
    /// `in_progress`, `lease_lost`, `key_missing`, `codec`, `store`).
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
            Error::InProgress { .. } => "in_progress",
            Error::LeaseLost { .. } => "lease_lost",
            Error::KeyMissing { .. } => "key_missing",
            Error::Codec { .. } => "codec",
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

    /// A table name that is not a plain SQL identifier.
    #[error(
        "invalid table name {name:?}: use letters, digits and `_` (optionally `schema.table`), at most 63 bytes, not starting with a digit"
    )]
    InvalidTableName {
        /// The rejected name.
        name: String,
    },

    /// The dedup table is missing or has another shape; run `migrate()`.
    #[error("schema: {0}")]
    Schema(String),

    /// Two handlers in this binary share a registered name, so their keys
    /// would collide.
    #[error("{0}")]
    Registry(#[from] crate::registry::RegistryError),
}

impl StoreError {
    /// Wraps a driver error.
    pub(crate) fn backend(e: impl std::error::Error + Send + Sync + 'static) -> Self {
        StoreError::Backend(Box::new(e))
    }
}
