//! The contract between the runtime and a store: what a claim, a
//! completion and a commit must guarantee, in two traits.
//!
//! [`LeaseStore`] is what lease mode needs (every store of this crate
//! implements it), [`TxStore`] what transaction mode needs (the SQL stores),
//! and [`StoreTransaction`] marks the transaction a [`TxStore`] hands to a
//! handler's body. All three are public, in [`crate::store`], and can be
//! implemented outside this crate.
//!
//! A rewritten handler takes its store generically: a lease-mode handler
//! takes `&impl LeaseStore`, so any lease store runs it (a test can run a
//! `store = "redis"` handler on [`MemoryStore`](crate::MemoryStore)); a
//! transaction-mode handler takes `&impl TxStore<Tx = T>`, where `T` is the
//! transaction type its first parameter names. A store of your own is named
//! by its path: `store = "crate::MyStore"`.

mod lease;
mod tx;

use std::time::Duration;

pub(crate) use crate::store::batch::{BatchItem, Held, TxBatch, TxBatchCommit};
pub use lease::LeaseStore;
pub(crate) use lease::held;
pub use tx::{StoreTransaction, TxClaim, TxCommit, TxStore};

/// What a record says to a delivery that may not run its body: the answer
/// a claim, a commit or a rollback returns instead of running or recording.
///
/// # Examples
///
/// What the call makes of each:
///
/// ```
/// use idem_runtime::store::Standing;
///
/// fn action(standing: &Standing) -> &'static str {
///     match standing {
///         Standing::Completed { .. } => "duplicate: hand the recorded outcome back",
///         Standing::Failed { .. } => "duplicate of a final failure: hand the recorded error back",
///         Standing::InProgress { .. } => "busy: redeliver later",
///         Standing::Mismatch { .. } => "another payload under this key: dead-letter",
///         Standing::Exhausted { .. } => "failed too often: dead-letter",
///     }
/// }
/// assert_eq!(action(&Standing::Mismatch { recorded: "9f2c".into() }), "another payload under this key: dead-letter");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Standing {
    /// A completed record: `outcome` is its serialized result (JSON).
    Completed {
        /// The outcome as the store keeps it (JSON).
        outcome: String,
        /// The `traceparent` of the execution that recorded it
        /// ([`Record::trace`](crate::store::Record::trace)), where the
        /// store keeps one: the duplicate's span links to it.
        trace: Option<String>,
    },
    /// A final failure is recorded: `error` is the body's error, serialized
    /// (JSON); duplicates get it back until the ttl ends.
    Failed {
        /// The error as the store keeps it (JSON).
        error: String,
        /// The `traceparent` of the execution that recorded it, as for
        /// [`Completed`](Standing::Completed).
        trace: Option<String>,
    },
    /// Another delivery holds the key: a live lease (lease mode), or a
    /// transaction holding the key past the lock timeout (transaction mode).
    InProgress {
        /// Lease mode: what is left of the other claim's lease (the runtime
        /// turns it into the caller's redelivery hint). Transaction mode: the
        /// lock timeout, as a redelivery hint.
        retry_after: Duration,
    },
    /// The record was written for a delivery with another payload
    /// fingerprint: the same key names two different messages.
    Mismatch {
        /// The fingerprint the record holds.
        recorded: String,
    },
    /// The body failed on as many deliveries as the handler's
    /// `max_attempts` allows.
    Exhausted {
        /// How many deliveries failed.
        failures: u32,
        /// The text of the last failure, as the record keeps it.
        last_error: Option<String>,
    },
}

/// What became of a lease-mode claim.
///
/// # Examples
///
/// What the generated code does with each answer of [`LeaseStore::claim`]:
///
/// ```
/// # use idem_runtime::registry::{HandlerSpec, Mode};
/// # use std::time::Duration;
/// # static SPEC: HandlerSpec = HandlerSpec {
/// #     name: "notify", function: "notify", key: "message_id",
/// #     ttl: Duration::from_secs(3_600), lease: Duration::from_secs(30),
/// #     store: "memory", mode: Mode::Lease, module: "app", file: "src/app.rs", line: 1,
/// #     fingerprint: None, max_attempts: None,
/// # };
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use idem_runtime::store::{Claim, LeaseStore, Standing};
/// use idem_runtime::{Key, MemoryStore};
///
/// let store = MemoryStore::new();
/// let key = Key::from_parts(&[&"m-1"])?;
/// match store.claim(&SPEC, &key, None).await? {
///     Claim::Fresh { token } => {
///         // run the body, then record its result under the token
///         assert!(store.complete(&SPEC, &key, &token, "42").await?);
///     }
///     Claim::Refused(standing) => println!("not this time: {standing:?}"),
/// }
/// // the next delivery gets the recorded result
/// assert_eq!(
///     store.claim(&SPEC, &key, None).await?,
///     Claim::Refused(Standing::Completed { outcome: "42".into(), trace: None })
/// );
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// The key was absent, expired, its lease had run out, or its last
    /// delivery failed and may be retried: this caller holds it now,
    /// identified by `token`.
    Fresh {
        /// The fencing token of this claim; completion, failure, release and
        /// lease extension only succeed while the record still holds it.
        token: String,
    },
    /// The record that stands does not let this delivery run.
    Refused(Standing),
}

/// A failed body, as a store records it.
///
/// # Examples
///
/// ```
/// use idem_runtime::store::Failure;
///
/// let retry = Failure::Counted { error: "connection reset by peer" };
/// assert_eq!(retry.text(), "connection reset by peer");
/// let last = Failure::Final { error: "unknown SKU pear-9", encoded: r#"{"UnknownSku":"pear-9"}"# };
/// assert_eq!(last.text(), "unknown SKU pear-9");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure<'a> {
    /// The error may pass on a redelivery: the store counts it (one more
    /// failure, `error` as the last error) and lets the next delivery claim
    /// the key, until the handler's `max_attempts`.
    Counted {
        /// The error's text (`Display`).
        error: &'a str,
    },
    /// The error is final: the store records it like an outcome
    /// (`encoded`, JSON), and duplicates get it back until the ttl ends.
    Final {
        /// The error's text (`Display`), kept as the last error.
        error: &'a str,
        /// The error, serialized (JSON).
        encoded: &'a str,
    },
}

impl Failure<'_> {
    /// The error's text.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(idem_runtime::store::Failure::Counted { error: "timeout" }.text(), "timeout");
    /// ```
    pub fn text(&self) -> &str {
        match self {
            Failure::Counted { error } | Failure::Final { error, .. } => error,
        }
    }

    /// The status the record takes: [`Retry`](crate::store::Status::Retry)
    /// or [`Failed`](crate::store::Status::Failed).
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::store::{Failure, Status};
    /// assert_eq!(Failure::Counted { error: "timeout" }.status(), Status::Retry);
    /// ```
    pub fn status(&self) -> crate::store::Status {
        match self {
            Failure::Counted { .. } => crate::store::Status::Retry,
            Failure::Final { .. } => crate::store::Status::Failed,
        }
    }

    /// What the record keeps as its outcome: the final error's JSON, or
    /// nothing for a failure that may pass.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::store::Failure;
    /// let last = Failure::Final { error: "unknown SKU", encoded: r#""pear""# };
    /// assert_eq!(last.recorded(), Some(r#""pear""#));
    /// assert_eq!(Failure::Counted { error: "timeout" }.recorded(), None);
    /// ```
    pub fn recorded(&self) -> Option<&str> {
        match self {
            Failure::Counted { .. } => None,
            Failure::Final { encoded, .. } => Some(encoded),
        }
    }
}
