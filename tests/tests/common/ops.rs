//! What the suites share about failures and payloads: the message, the
//! error type (some of whose errors are final), and a consumer's loop that
//! redelivers until the call settles. The scenarios themselves are in the
//! lease suite (`lease.rs`, every lease store) and the transaction suite
//! (`tx.rs`, every SQL store and claim order), each written once.

use std::future::Future;
use std::time::{Duration, Instant};

use idem_runtime::{Error, FinalError, Key, Outcome};

/// A reservation: keyed by `order_id`, fingerprinted by what it reserves.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct Reserve {
    pub(crate) order_id: String,
    pub(crate) sku: String,
    pub(crate) qty: i64,
    pub(crate) price: f64,
    /// An optional part of the fingerprint (`None` is a value like any).
    pub(crate) note: Option<String>,
}

impl Reserve {
    pub(crate) fn new(order_id: &str, sku: &str, qty: i64, price: f64) -> Self {
        Reserve {
            order_id: order_id.into(),
            sku: sku.into(),
            qty,
            price,
            note: None,
        }
    }

    /// The key `msg.order_id` derives.
    pub(crate) fn key(&self) -> Key {
        Key::from_parts(&[&self.order_id]).unwrap()
    }
}

/// The `i`th of concurrent deliveries of order `r-1` that carry two
/// payloads, one price for even `i`, another for odd.
pub(crate) fn two_payloads(i: usize) -> Reserve {
    let price = if i.is_multiple_of(2) { 9.5 } else { 9.75 };
    Reserve::new("r-1", "apple", 2, price)
}

/// The bodies' error: an unknown SKU is final, anything else may pass.
#[derive(Debug, Clone, PartialEq, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub(crate) enum OpsError {
    #[error("unknown SKU {0}")]
    UnknownSku(String),
    #[error("warehouse unavailable: {0}")]
    Unavailable(String),
}

impl FinalError for OpsError {
    fn is_final(&self) -> bool {
        matches!(self, OpsError::UnknownSku(_))
    }
}

impl From<sqlx::Error> for OpsError {
    fn from(e: sqlx::Error) -> Self {
        OpsError::Unavailable(e.to_string())
    }
}

impl From<super::AppError> for OpsError {
    fn from(e: super::AppError) -> Self {
        OpsError::Unavailable(e.to_string())
    }
}

/// What a delivery of these handlers returns.
pub(crate) type Settled<T> = Result<Outcome<T>, Error<OpsError>>;

/// Calls `call` as a consumer redelivers: again after the hint while the
/// key is in progress, and, with `through_failures`, again at once after a
/// body error that may pass; until anything else comes back. Gives up (a
/// panic) after 60 s.
pub(crate) async fn redeliver<T, F, Fut>(through_failures: bool, mut call: F) -> Settled<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Settled<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        assert!(Instant::now() < deadline, "the call never settled");
        match call().await {
            Err(Error::InProgress { retry_after, .. }) => {
                tokio::time::sleep(retry_after.min(Duration::from_millis(20))).await;
            }
            Err(Error::Handler { .. }) if through_failures => {}
            // A claim-first transaction waiting on another past the lock
            // timeout, or SQLite's write lock: the store is busy, redeliver.
            Err(Error::Store { .. }) if through_failures => {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            settled => return settled,
        }
    }
}

/// How the settled deliveries of one key ended, counted.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Ends {
    pub(crate) executed: usize,
    pub(crate) duplicate: usize,
    pub(crate) mismatch: usize,
    pub(crate) exhausted: usize,
    pub(crate) failed: usize,
    pub(crate) replayed: usize,
    /// Anything else, printed.
    pub(crate) other: Vec<String>,
}

impl Ends {
    pub(crate) fn of<T: std::fmt::Debug>(results: impl IntoIterator<Item = Settled<T>>) -> Ends {
        let mut ends = Ends::default();
        for r in results {
            match r {
                Ok(Outcome::Executed(_)) => ends.executed += 1,
                Ok(Outcome::Duplicate(_)) => ends.duplicate += 1,
                Err(Error::PayloadMismatch { .. }) => ends.mismatch += 1,
                Err(Error::Exhausted { .. }) => ends.exhausted += 1,
                Err(Error::Failed {
                    replayed: false, ..
                }) => ends.failed += 1,
                Err(Error::Failed { replayed: true, .. }) => ends.replayed += 1,
                other => ends.other.push(format!("{other:?}")),
            }
        }
        ends
    }
}
