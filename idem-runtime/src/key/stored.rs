//! The decoder of stored keys: a key an operator pastes, read back into the
//! parts [`KeyBuilder`](super::KeyBuilder) encoded.

use super::{DIGEST_PREFIX, Key, KeyPart, MAX_KEY_LEN};

/// A stored key read back: the parts it encodes, or the digest a key too
/// long to store plainly became (see [`Key`]). What an operator's tool
/// makes of a key pasted from a log line or a table.
///
/// # Examples
///
/// ```
/// use idem_runtime::store::StoredKey;
/// use idem_runtime::Key;
///
/// let key = StoredKey::parse("4:A-17|5:apple")?;
/// assert_eq!(key.parts(), Some(&["A-17".to_owned(), "apple".to_owned()][..]));
/// assert_eq!(key.shown(), "A-17 + apple");
/// assert_eq!(key.as_str(), Key::from_parts(&[&"A-17", &"apple"])?.as_str());
///
/// let long = Key::from_parts(&[&"x".repeat(200)])?;
/// assert_eq!(StoredKey::parse(long.as_str())?.parts(), None);
///
/// assert!(StoredKey::parse("A-17").is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoredKey {
    /// An encoding of parts.
    Parts {
        /// The key the parts make.
        key: Key,
        /// The parts, as the message held them.
        parts: Vec<String>,
    },
    /// `#sha256:<64 hex digits>`: the digest of an encoding longer than
    /// [`MAX_KEY_LEN`] bytes (or holding a NUL byte); its parts cannot be
    /// read back.
    Digest(String),
}

/// Text that is not a key as the runtime stores it.
///
/// # Examples
///
/// ```
/// use idem_runtime::store::StoredKey;
/// let err = StoredKey::parse("4:A-17|").unwrap_err();
/// assert_eq!(err.to_string(), "\"4:A-17|\" is not a stored key: a `|` must be followed by another part");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key:?} is not a stored key: {reason}")]
#[non_exhaustive]
pub struct InvalidKey {
    /// The text given.
    pub key: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

impl StoredKey {
    /// Reads a stored key (`4:A-17|5:apple`, or `#sha256:<hex>`): each part
    /// is its byte length, `:` and its text, parts separated by `|`. Only
    /// what the runtime writes is accepted: the parts must encode back to
    /// the same text (no leading zeros, at most [`MAX_KEY_LEN`] bytes, no NUL).
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::store::StoredKey;
    ///
    /// // a part may hold the separators: its length says where it ends
    /// let key = StoredKey::parse("3:a|b|1:c")?;
    /// assert_eq!(key.parts().unwrap(), ["a|b", "c"]);
    /// assert!(StoredKey::parse("").is_err());
    /// assert!(StoredKey::parse("9:short").is_err());
    /// assert!(StoredKey::parse("01:a").is_err());
    /// # Ok::<(), idem_runtime::store::InvalidKey>(())
    /// ```
    pub fn parse(stored: &str) -> Result<StoredKey, InvalidKey> {
        let invalid = |reason| InvalidKey {
            key: stored.to_owned(),
            reason,
        };
        if stored.is_empty() {
            return Err(invalid("it is empty"));
        }
        if let Some(hex) = stored.strip_prefix(DIGEST_PREFIX) {
            if hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
                return Ok(StoredKey::Digest(stored.to_owned()));
            }
            return Err(invalid(
                "a digest is `#sha256:` and 64 lowercase hexadecimal digits",
            ));
        }
        let mut parts = Vec::new();
        let mut rest = stored;
        loop {
            let malformed =
                || invalid("each part is its byte length, `:` and its text (`4:A-17|5:apple`)");
            let (digits, after) = rest.split_once(':').ok_or_else(malformed)?;
            // Written by `{}` of a usize: digits only, no sign, no leading zero.
            let len = digits
                .parse::<usize>()
                .ok()
                .filter(|len| len.to_string() == digits)
                .ok_or_else(malformed)?;
            if after.len() < len || !after.is_char_boundary(len) {
                return Err(invalid("a part's length runs past the end of the key"));
            }
            parts.push(after[..len].to_owned());
            rest = &after[len..];
            if rest.is_empty() {
                break;
            }
            rest = rest
                .strip_prefix('|')
                .ok_or_else(|| invalid("a part must be followed by `|` or the end of the key"))?;
            if rest.is_empty() {
                return Err(invalid("a `|` must be followed by another part"));
            }
        }
        let refs: Vec<&dyn KeyPart> = parts.iter().map(|p| p as &dyn KeyPart).collect();
        let key = Key::from_parts(&refs).map_err(|_| invalid("a part is missing"))?;
        if key.as_str() != stored {
            return Err(invalid(
                "it is not how the runtime stores these parts (longer than 128 bytes or holding a NUL byte, they are stored as a digest)",
            ));
        }
        debug_assert!(stored.len() <= MAX_KEY_LEN);
        Ok(StoredKey::Parts { key, parts })
    }

    /// The stored form: what [`Inspect`](crate::store::Inspect) takes.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::store::StoredKey;
    /// assert_eq!(StoredKey::parse("2:17")?.as_str(), "2:17");
    /// # Ok::<(), idem_runtime::store::InvalidKey>(())
    /// ```
    pub fn as_str(&self) -> &str {
        match self {
            StoredKey::Parts { key, .. } => key.as_str(),
            StoredKey::Digest(digest) => digest,
        }
    }

    /// The parts, unless the key is a digest.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::store::StoredKey;
    /// assert_eq!(StoredKey::parse("2:17|0:")?.parts().unwrap(), ["17", ""]);
    /// # Ok::<(), idem_runtime::store::InvalidKey>(())
    /// ```
    pub fn parts(&self) -> Option<&[String]> {
        match self {
            StoredKey::Parts { parts, .. } => Some(parts),
            StoredKey::Digest(_) => None,
        }
    }

    /// The key for people: its parts as [`Key::shown`] writes them
    /// (`A-17 + apple`), or the digest.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::store::StoredKey;
    /// assert_eq!(StoredKey::parse("3:a b|1:7")?.shown(), "\"a b\" + 7");
    /// # Ok::<(), idem_runtime::store::InvalidKey>(())
    /// ```
    pub fn shown(&self) -> String {
        match self {
            StoredKey::Parts { key, .. } => key.shown().to_owned(),
            StoredKey::Digest(digest) => digest.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_keys_read_back_what_the_runtime_writes() {
        for parts in [
            vec!["A-17", "apple"],
            vec![""],
            vec!["a|1:b", "|", ":"],
            vec!["日本", "x"],
        ] {
            let refs: Vec<&dyn KeyPart> = parts.iter().map(|p| p as &dyn KeyPart).collect();
            let key = Key::from_parts(&refs).unwrap();
            let parsed = StoredKey::parse(key.as_str()).unwrap();
            assert_eq!(parsed.parts().unwrap(), parts.as_slice());
            assert_eq!(parsed.shown(), key.shown());
        }
        let digest = Key::from_parts(&[&"x".repeat(300)]).unwrap();
        assert!(matches!(
            StoredKey::parse(digest.as_str()),
            Ok(StoredKey::Digest(_))
        ));
        let nul = Key::from_parts(&[&"a\0b"]).unwrap();
        assert!(matches!(
            StoredKey::parse(nul.as_str()),
            Ok(StoredKey::Digest(_))
        ));
    }

    #[test]
    fn malformed_stored_keys_are_refused() {
        let long_plain = format!("200:{}", "x".repeat(200));
        for bad in [
            "",
            "A-17",
            ":x",
            "x:y",
            "-1:a",
            "+1:a",
            "01:a",
            "2:a",
            "1:ab",
            "1:a|",
            "1:a||1:b",
            "1:\u{e9}",
            "1:\0",
            "#sha256:",
            "#sha256:ABCDEF0000000000000000000000000000000000000000000000000000000000",
            "#sha256:00",
            "99999999999999999999999:a",
            long_plain.as_str(),
        ] {
            assert!(StoredKey::parse(bad).is_err(), "{bad:?} was accepted");
        }
    }
}
