//! Final errors: a body's error that no redelivery can cure (the SKU does
//! not exist, the account is closed), recorded like an outcome so that
//! duplicates get it back (without running the body, but claiming last; see
//! [`FinalError`]).

use serde::Serialize;
use serde::de::DeserializeOwned;

/// An error type whose values can say they are final.
///
/// Implement it on a handler's error type, and a final error is recorded
/// like an outcome: the call returns [`Error::Failed`](crate::Error::Failed),
/// and every delivery of the key until the ttl ends gets the same error
/// back, decoded from the record, without running the body (in transaction
/// mode claiming last, `ClaimOrder::Last`, or, under the default
/// `ClaimOrder::Checked`, when the delivery races the first one's open
/// transaction, a delivery's body runs before the record is found and its
/// writes roll back). In transaction mode the failing body's writes are
/// rolled back all the same. An error for which
/// [`is_final`](FinalError::is_final) is `false` keeps the usual behaviour:
/// nothing recorded (or, with `max_attempts`, a failure counted), and a
/// redelivery runs the body again.
///
/// The error is stored as JSON, so the type also implements `Serialize` and
/// `Deserialize`, and reads back what it wrote; `Display` is its text in the
/// record's `last_error`. An error type without this trait has no final
/// errors. In transaction mode, an error the store tells as its own
/// contention (a lock wait, a deadlock) is never final: the call reports it
/// as the store's ([`StoreError::Contention`](crate::StoreError::Contention))
/// before it asks `is_final`.
///
/// # Examples
///
/// ```standalone_crate
/// use idem_runtime::{idempotent, Error, FinalError, MemoryStore};
///
/// #[derive(Debug, thiserror::Error, serde::Serialize, serde::Deserialize)]
/// enum StockError {
///     #[error("unknown SKU {0}")]
///     UnknownSku(String),
///     #[error("warehouse unreachable")]
///     Unreachable,
/// }
///
/// impl FinalError for StockError {
///     fn is_final(&self) -> bool {
///         matches!(self, StockError::UnknownSku(_))
///     }
/// }
///
/// #[derive(serde::Deserialize)]
/// struct Reserve { order_id: u64, sku: String }
///
/// #[idempotent(key = "order_id", ttl = "1d", store = "memory")]
/// async fn reserve(msg: &Reserve) -> Result<u32, StockError> {
///     Err(StockError::UnknownSku(msg.sku.clone()))
/// }
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let store = MemoryStore::new();
/// let msg = Reserve { order_id: 7, sku: "pear-9".into() };
/// let first = reserve(&store, &msg).await.unwrap_err();
/// assert!(matches!(first, Error::Failed { replayed: false, .. }));
/// // the redelivery does not run the body: it gets the recorded error
/// let again = reserve(&store, &msg).await.unwrap_err();
/// assert!(matches!(again, Error::Failed { error: StockError::UnknownSku(ref s), replayed: true, .. } if s == "pear-9"));
/// # }
/// ```
pub trait FinalError: std::fmt::Display + Serialize + DeserializeOwned {
    /// Whether no redelivery can cure this error.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::FinalError;
    ///
    /// #[derive(Debug, serde::Serialize, serde::Deserialize)]
    /// struct Declined { permanent: bool }
    /// impl std::fmt::Display for Declined {
    ///     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
    ///         f.write_str("card declined")
    ///     }
    /// }
    /// impl FinalError for Declined {
    ///     fn is_final(&self) -> bool { self.permanent }
    /// }
    /// assert!(Declined { permanent: true }.is_final());
    /// ```
    fn is_final(&self) -> bool;
}

/// How a handler's error type is recorded: its text, and, for a
/// [`FinalError`], its finality and JSON; in transaction mode also how to
/// see it as a `std::error::Error`, when its type is one or holds one.
/// Made by the generated code, where the type is known
/// (`__private::ErrorProbe`), and handed to the call paths, which then need
/// no bounds on the error type.
#[doc(hidden)]
pub struct ErrorCodec<E> {
    pub(crate) text: fn(&E) -> String,
    pub(crate) finals: Option<FinalCodec<E>>,
    pub(crate) view: Option<ErrorView<E>>,
}

/// A handler's error seen as a `std::error::Error` (itself, or the error
/// it holds), for the store to tell its own contention in it.
#[doc(hidden)]
pub type ErrorView<E> = fn(&E) -> &(dyn std::error::Error + 'static);

impl<E> Clone for ErrorCodec<E> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<E> Copy for ErrorCodec<E> {}

impl<E> ErrorCodec<E> {
    /// A codec from its parts (what the probes found).
    pub fn new(finals: Option<FinalCodec<E>>, text: fn(&E) -> String) -> Self {
        ErrorCodec {
            text,
            finals,
            view: None,
        }
    }

    /// The codec, with how to see an error as a `std::error::Error` (what
    /// the probe found, in transaction mode).
    pub fn with_view(self, view: Option<ErrorView<E>>) -> Self {
        ErrorCodec { view, ..self }
    }

    /// `error` as a `std::error::Error`, when its type lets it be seen so.
    pub(crate) fn view<'e>(&self, error: &'e E) -> Option<&'e (dyn std::error::Error + 'static)> {
        self.view.map(|view| view(error))
    }

    /// The error as a final failure's JSON, when it is final; `Err` when it
    /// is final but does not encode or read back.
    pub(crate) fn final_encoding(&self, error: &E) -> Option<Result<String, serde_json::Error>> {
        let finals = self.finals?;
        (finals.is_final)(error).then(|| (finals.encode)(error))
    }

    /// A recorded final error, decoded.
    pub(crate) fn decode(&self, encoded: &str) -> Result<E, serde_json::Error> {
        match self.finals {
            Some(finals) => (finals.decode)(encoded),
            None => Err(<serde_json::Error as serde::de::Error>::custom(
                "a final error is recorded, but the handler's error type no longer implements `FinalError`",
            )),
        }
    }
}

/// The functions of a [`FinalError`] type.
#[doc(hidden)]
pub struct FinalCodec<E> {
    is_final: fn(&E) -> bool,
    encode: fn(&E) -> Result<String, serde_json::Error>,
    decode: fn(&str) -> Result<E, serde_json::Error>,
}

impl<E> Clone for FinalCodec<E> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<E> Copy for FinalCodec<E> {}

impl<E: FinalError> FinalCodec<E> {
    /// The codec of `E`: JSON, checked to read back.
    pub fn new() -> Self {
        FinalCodec {
            is_final: E::is_final,
            encode: |error| {
                let encoded = serde_json::to_string(error)?;
                serde_json::from_str::<E>(&encoded).map_err(|e| {
                    <serde_json::Error as serde::ser::Error>::custom(format_args!(
                        "the final error would not read back: {e}"
                    ))
                })?;
                Ok(encoded)
            },
            decode: |s| serde_json::from_str(s),
        }
    }
}

impl<E: FinalError> Default for FinalCodec<E> {
    fn default() -> Self {
        Self::new()
    }
}
