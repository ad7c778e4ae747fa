//! Transaction mode: the claim, the body's writes and the outcome in one
//! database transaction. [`single`] runs one message, [`batch`] a batch of
//! them.

pub(crate) mod batch;
pub(crate) mod single;

use crate::error::Contention;
use crate::final_error::ErrorCodec;
use crate::store::contract::TxStore;

/// How many links of an error's `source` chain the store is asked about: a
/// chain that leads back to itself ends there all the same.
const MAX_SOURCES: usize = 32;

/// The contention `store` tells in a failed body's `error`, asking about
/// the error, then each of its sources in turn; `None` when it tells none,
/// or when the error's type does not let the runtime see it as a
/// `std::error::Error` (see `ErrorCodec::view`).
pub(crate) fn contention<S: TxStore, E>(
    store: &S,
    errors: ErrorCodec<E>,
    error: &E,
) -> Option<Contention> {
    let mut link = errors.view(error);
    for _ in 0..MAX_SOURCES {
        let e = link?;
        if let Some(kind) = store.contention(e) {
            return Some(kind);
        }
        link = e.source();
    }
    None
}
