//! What a rewritten handler does around its body: [`lease`] mode and
//! [`tx`] (transaction) mode, each for one message (`single.rs`) and for a
//! batch (`batch.rs`); what both modes share is here (single calls) and in
//! [`plan`] (batches). The generated code calls these functions through
//! `__private`.
//!
//! Laid out by mode: a mode is a store trait (`LeaseStore`, `TxStore`) with
//! machinery of its own (the lease keeper); a shape is a smaller difference.

use crate::codec::{Codec, decode};
use crate::error::{Error, StoreError};
use crate::final_error::ErrorCodec;
use crate::key::Key;
use crate::outcome::Outcome;
use crate::registry::{self, HandlerSpec};
use crate::store::contract::Standing;
use crate::store::unrecordable_reason;
use crate::telemetry::finish;

pub(crate) mod lease;
pub(crate) mod plan;
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

/// What a delivery gets when the record that stands does not let it run
/// (or, claiming last, turned it away at the commit): the recorded outcome
/// or final error, decoded, or the error that says why not.
pub(crate) fn refused<T, E>(
    spec: &'static HandlerSpec,
    key: &Key,
    fingerprint: Option<&str>,
    codec: Codec<T>,
    errors: ErrorCodec<E>,
    standing: Standing,
) -> Result<Outcome<T>, Error<E>> {
    #[cfg(feature = "otel")]
    if let Standing::Completed {
        trace: Some(settled_by),
        ..
    }
    | Standing::Failed {
        trace: Some(settled_by),
        ..
    } = &standing
    {
        // The duplicate's span links to the execution whose result it gets.
        crate::trace::link_settled(settled_by);
    }
    match standing {
        Standing::Completed { outcome, .. } => decode(spec, key, codec, &outcome),
        Standing::Failed { error, .. } => match unrecordable_reason(&error) {
            // The body took effect but its value could not be recorded:
            // what the record says of it, whatever the handler's error type.
            Some(why) => Err(Error::Unrecordable {
                handler: spec.name,
                key: key.clone(),
                source: <serde_json::Error as serde::de::Error>::custom(why),
            }),
            None => match errors.decode(&error) {
                Ok(error) => Err(Error::Failed {
                    handler: spec.name,
                    key: key.clone(),
                    error,
                    replayed: true,
                }),
                Err(source) => Err(Error::Codec {
                    handler: spec.name,
                    key: key.clone(),
                    source,
                }),
            },
        },
        Standing::InProgress { retry_after } => Err(Error::InProgress {
            handler: spec.name,
            key: key.clone(),
            retry_after,
        }),
        Standing::Mismatch { recorded } => Err(Error::PayloadMismatch {
            handler: spec.name,
            key: key.clone(),
            recorded,
            given: fingerprint.unwrap_or_default().to_owned(),
        }),
        Standing::Exhausted {
            failures,
            last_error,
        } => Err(Error::Exhausted {
            handler: spec.name,
            key: key.clone(),
            failures,
            last_error,
        }),
    }
}

/// The longest failure text a record keeps, in bytes: an error's `Display`
/// can be a whole HTTP response, and every store must take it (MySQL's
/// `TEXT` holds 64 KiB).
pub(crate) const MAX_ERROR_TEXT: usize = 4_096;

/// `text`, cut to [`MAX_ERROR_TEXT`] bytes at a character boundary, with
/// `…` where it was cut.
pub(crate) fn capped(mut text: String) -> String {
    if text.len() > MAX_ERROR_TEXT {
        let mut end = MAX_ERROR_TEXT - '…'.len_utf8();
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push('…');
    }
    text
}

/// How a failed body is to be recorded: as a final failure (its JSON), as a
/// counted failure (a handler with `max_attempts`), or not at all.
pub(crate) enum Recording {
    /// A final error, encoded.
    Final { text: String, encoded: String },
    /// A failure to count.
    Counted { text: String },
    /// Nothing to record.
    Unrecorded,
}

impl Recording {
    /// How `error` is to be recorded; `Err` when it is final but cannot be
    /// recorded (it does not encode, or would not read back).
    pub(crate) fn of<E>(
        spec: &'static HandlerSpec,
        errors: ErrorCodec<E>,
        error: &E,
    ) -> Result<Recording, serde_json::Error> {
        match errors.final_encoding(error) {
            Some(encoded) => Ok(Recording::Final {
                text: capped((errors.text)(error)),
                encoded: encoded?,
            }),
            None if spec.max_attempts.is_some() => Ok(Recording::Counted {
                text: capped((errors.text)(error)),
            }),
            None => Ok(Recording::Unrecorded),
        }
    }

    /// The failure a store records, if any.
    pub(crate) fn failure(&self) -> Option<crate::store::contract::Failure<'_>> {
        use crate::store::contract::Failure;
        match self {
            Recording::Final { text, encoded } => Some(Failure::Final {
                error: text,
                encoded,
            }),
            Recording::Counted { text } => Some(Failure::Counted { error: text }),
            Recording::Unrecorded => None,
        }
    }

    /// The call's error for the body's `error`, once recorded (or not).
    pub(crate) fn into_error<E>(self, spec: &'static HandlerSpec, key: &Key, error: E) -> Error<E> {
        match self {
            Recording::Final { .. } => Error::Failed {
                handler: spec.name,
                key: key.clone(),
                error,
                replayed: false,
            },
            Recording::Counted { .. } | Recording::Unrecorded => Error::Handler {
                handler: spec.name,
                key: key.clone(),
                error,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{MAX_ERROR_TEXT, capped};

    #[test]
    fn failure_texts_are_cut_at_a_character_boundary() {
        assert_eq!(capped("timeout".to_owned()), "timeout");
        let exact = "a".repeat(MAX_ERROR_TEXT);
        assert_eq!(capped(exact.clone()), exact);
        // Two-byte characters across the limit: the cut never splits one.
        for pad in 0..4 {
            let text = format!("{}{}", "a".repeat(pad), "é".repeat(MAX_ERROR_TEXT));
            let cut = capped(text.clone());
            assert!(cut.len() <= MAX_ERROR_TEXT, "{}", cut.len());
            assert!(cut.len() > MAX_ERROR_TEXT - 8, "{}", cut.len());
            assert!(cut.ends_with('…'));
            assert!(text.starts_with(cut.trim_end_matches('…')));
        }
    }
}
