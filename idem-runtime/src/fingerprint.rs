//! Payload fingerprints: what a handler declares must not change between
//! deliveries of one key (`fingerprint = "qty + price"`, or `"*"` for the
//! whole message), as a digest the store keeps with the record.
//!
//! The digest is the first 128 bits of the SHA-256 of the parts' JSON (a
//! JSON array of the declared parts, or the message itself), in 32 hex
//! digits. Any part that implements `serde::Serialize` can be
//! fingerprinted, floats included: a fingerprint is compared, never looked
//! up, so `0.1 + 0.2` and `0.3` differing is what it should say.
//!
//! A `HashMap` serializes in an order that differs between processes: a
//! fingerprint over one would differ between deliveries of one message.
//! Fingerprint a `BTreeMap`, or name the fields that matter.

use serde::Serialize;
use sha2::{Digest, Sha256};

/// The fingerprint of `value`: 32 hex digits of the SHA-256 of its JSON.
///
/// A value serde_json cannot write (a map with non-string keys) gets the
/// digest of serde's error message instead, prefixed so that it equals no
/// value's: deliveries of such a message are still compared with each other.
///
/// # Examples
///
/// ```
/// use idem_runtime::fingerprint;
///
/// #[derive(serde::Serialize)]
/// struct Order { qty: u32, price: f64 }
///
/// let a = fingerprint(&Order { qty: 2, price: 9.5 });
/// assert_eq!(a, fingerprint(&Order { qty: 2, price: 9.5 }));
/// assert_ne!(a, fingerprint(&Order { qty: 3, price: 9.5 }));
/// assert_eq!(a.len(), 32);
/// // the parts `qty + price` are fingerprinted as the tuple of both
/// assert_eq!(fingerprint(&(2u32, 9.5f64)), fingerprint(&[serde_json::json!(2), serde_json::json!(9.5)]));
/// ```
pub fn fingerprint<T: Serialize + ?Sized>(value: &T) -> String {
    let digest = match serde_json::to_vec(value) {
        Ok(json) => Sha256::digest(&json),
        Err(e) => Sha256::digest(format!("\0unserializable: {e}").as_bytes()),
    };
    crate::key::hex(&digest[..16])
}
