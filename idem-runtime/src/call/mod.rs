//! What a rewritten handler does around its body: [`lease`] mode and
//! [`tx`] (transaction) mode, and what both share. The generated code calls
//! these functions through `__private`.

use crate::error::{Error, StoreError};
use crate::key::Key;
use crate::outcome::Outcome;
use crate::registry::{self, HandlerSpec};
use crate::telemetry::finish;

pub(crate) mod lease;
pub(crate) mod tx;

pub(crate) fn store_err<E>(spec: &'static HandlerSpec, key: &Key, source: StoreError) -> Error<E> {
    Error::Store {
        handler: spec.name,
        key: Some(key.clone()),
        source,
    }
}

pub(crate) fn check_registry<E>(spec: &'static HandlerSpec) -> Result<(), Error<E>> {
    registry::check().map_err(|source| Error::Config {
        handler: spec.name,
        source,
    })
}

/// Reports a `None` key part (the body does not run).
#[doc(hidden)]
pub fn key_missing<T, E>(
    spec: &'static HandlerSpec,
    part: &'static str,
) -> Result<Outcome<T>, Error<E>> {
    let err = Error::KeyMissing {
        handler: spec.name,
        part,
    };
    finish(spec, Err(err))
}
