//! Business keys: the parts a handler's key expression names, and their
//! injective encoding into the string a store keeps.
//!
//! # Encoding
//!
//! Each part is written as text (see [`KeyPart`]) and stored as
//! `<byte length>:<text>`, parts separated by `|`: the key `order_id + sku`
//! with `order_id = "A-17"` and `sku = 3` is stored as `4:A-17|1:3`. Because
//! every part carries its length, two different lists of parts never encode
//! alike, whatever characters they hold (`"a:b" + "c"` is `3:a:b|1:c`,
//! `"a" + "b:c"` is `1:a|3:b:c`).
//!
//! An encoding longer than [`MAX_KEY_LEN`] bytes, or holding a NUL byte
//! (which Postgres text refuses), is stored as `#sha256:<64 hex digits>` of
//! the encoding instead, so every stored key fits an index and every column. A plain encoding always starts with a digit, a digest with `#`,
//! so the two forms never meet either.
//!
//! [`StoredKey`] reads a stored key back: its parts, or that it is a digest.

use std::fmt::{self, Write as _};

use sha2::{Digest, Sha256};

mod stored;

pub use stored::{InvalidKey, StoredKey};

/// The longest encoded key stored as it is; longer ones are stored as a digest.
///
/// # Examples
///
/// ```
/// use idem_runtime::{Key, MAX_KEY_LEN};
///
/// let short = Key::from_parts(&[&"A-17"]).unwrap();
/// assert!(short.as_str().len() <= MAX_KEY_LEN);
///
/// let long = Key::from_parts(&[&"x".repeat(MAX_KEY_LEN)]).unwrap();
/// assert!(long.as_str().starts_with("#sha256:"));
/// assert_eq!(long.as_str().len(), "#sha256:".len() + 64);
/// ```
pub const MAX_KEY_LEN: usize = 128;

/// What a key stored as its digest starts with: `#sha256:`, then the
/// SHA-256 of the encoding in 64 lowercase hex digits.
pub(crate) const DIGEST_PREFIX: &str = "#sha256:";

/// A derived idempotency key, as the store keeps it.
///
/// A handler can take `key: &Key` as an extra parameter to read its own key,
/// for example to pass it on as the idempotency key of an external call.
///
/// # Examples
///
/// It displays as the encoding the store keeps ([`as_str`](Key::as_str)),
/// which is unique per key and what to pass on as an external idempotency
/// key; [`shown`](Key::shown) is the parts the way the message holds them
/// (`A-17 + 3`), which is what error messages show. Two keys are equal when
/// their stored forms are.
///
/// ```
/// use idem_runtime::{Key, KeyBuilder};
///
/// let mut b = KeyBuilder::new();
/// b.part(&"A-17").unwrap();
/// b.part(&3u32).unwrap();
/// let key: Key = b.finish();
/// assert_eq!(key.as_str(), "4:A-17|1:3");
/// assert_eq!(key.to_string(), "4:A-17|1:3");
/// assert_eq!(key.shown(), "A-17 + 3");
/// ```
#[derive(Clone)]
pub struct Key {
    stored: String,
    /// The parts for people: see [`Key::shown`].
    shown: String,
}

impl PartialEq for Key {
    fn eq(&self, other: &Self) -> bool {
        self.stored == other.stored
    }
}

impl Eq for Key {}

impl std::hash::Hash for Key {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.stored.hash(state);
    }
}

impl PartialOrd for Key {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Key {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.stored.cmp(&other.stored)
    }
}

impl Key {
    /// The key as stored: the encoding, or its digest for long keys.
    ///
    /// This is the text to look a record up by, e.g. in the dedup table's
    /// `key` column.
    ///
    /// # Examples
    ///
    /// ```
    /// let key = idem_runtime::Key::from_parts(&[&"A-17", &"apple"]).unwrap();
    /// assert_eq!(key.as_str(), "4:A-17|5:apple");
    /// ```
    pub fn as_str(&self) -> &str {
        &self.stored
    }

    /// The parts as the message holds them, joined by ` + `: `A-17 + apple`;
    /// what error messages show.
    ///
    /// A part that is empty, or holds anything but letters, digits and
    /// `- _ . : @ / #`, is quoted with Rust's escapes (`"a b" + 3`), so the
    /// boundaries stay visible; a part longer than 40 characters is cut with
    /// `…`. When a part was cut, or the key is stored as a digest (see
    /// [`MAX_KEY_LEN`]), the shown form ends with the key's
    /// [`digest`](Key::digest), the 16 hex digits tracing spans carry, so two
    /// keys never show alike: `xxxx… + 3 [#3f0a9c…]`.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::Key;
    ///
    /// let key = Key::from_parts(&[&"A-17", &"pear drop", &3u8]).unwrap();
    /// assert_eq!(key.shown(), r#"A-17 + "pear drop" + 3"#);
    /// ```
    pub fn shown(&self) -> &str {
        &self.shown
    }

    /// A short, stable fingerprint of the key (16 hex digits of its SHA-256),
    /// used in tracing spans so logs do not carry business data.
    ///
    /// # Examples
    ///
    /// ```
    /// let key = idem_runtime::Key::from_parts(&[&"A-17"]).unwrap();
    /// assert_eq!(key.digest().len(), 16);
    /// assert_eq!(key.digest(), key.clone().digest());
    /// ```
    pub fn digest(&self) -> String {
        let hash = Sha256::digest(self.stored.as_bytes());
        hex(&hash[..8])
    }

    /// Builds a key from parts, as the generated code does; handy in tests and
    /// operator tooling that look a record up.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::Key;
    /// let key = Key::from_parts(&[&"A-17", &3u32]).unwrap();
    /// assert_eq!(key.as_str(), "4:A-17|1:3");
    /// assert!(Key::from_parts(&[&None::<u32>]).is_err());
    /// ```
    pub fn from_parts(parts: &[&dyn KeyPart]) -> Result<Key, KeyMissing> {
        let mut b = KeyBuilder::new();
        for p in parts {
            b.part(*p)?;
        }
        Ok(b.finish())
    }
}

/// The stored encoding, as [`Key::as_str`].
///
/// # Examples
///
/// ```
/// let key = idem_runtime::Key::from_parts(&[&"A-17", &3u8]).unwrap();
/// assert_eq!(format!("{key}"), "4:A-17|1:3");
/// ```
impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.stored)
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key({:?})", self.stored)
    }
}

/// Longest part shown in full by [`Key::shown`].
const SHOWN_PART_LEN: usize = 40;

/// Appends one part to a key's shown form; `true` when it was cut.
fn show_part(shown: &mut String, part: &str) -> bool {
    if !shown.is_empty() {
        shown.push_str(" + ");
    }
    let plain = !part.is_empty()
        && part
            .chars()
            .all(|c| c.is_alphanumeric() || "-_.:@/#".contains(c));
    let cut: String = part.chars().take(SHOWN_PART_LEN).collect();
    let ellipsis = if cut.len() < part.len() { "…" } else { "" };
    if plain {
        let _ = write!(shown, "{cut}{ellipsis}");
    } else {
        let quoted = format!("{cut:?}");
        let _ = write!(shown, "{}{ellipsis}\"", &quoted[..quoted.len() - 1]);
    }
    !ellipsis.is_empty()
}

/// `bytes` as lowercase hex digits, two a byte.
pub(crate) fn hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// A key part was an `Option` holding `None`.
///
/// The generated code turns it into [`Error::KeyMissing`](crate::Error::KeyMissing),
/// naming the handler and the part.
///
/// # Examples
///
/// ```
/// use idem_runtime::{KeyBuilder, KeyMissing};
/// let mut b = KeyBuilder::new();
/// assert_eq!(b.part(&None::<String>), Err(KeyMissing));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyMissing;

impl fmt::Display for KeyMissing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a key part is None")
    }
}

impl std::error::Error for KeyMissing {}

/// Builds a [`Key`] part by part.
///
/// # Examples
///
/// ```
/// use idem_runtime::KeyBuilder;
/// let mut b = KeyBuilder::new();
/// b.constant("deduct");
/// b.part(&42u64).unwrap();
/// assert_eq!(b.finish().as_str(), "6:deduct|2:42");
/// ```
#[derive(Debug, Default)]
pub struct KeyBuilder {
    encoded: String,
    shown: String,
    /// Whether a part was cut in `shown`.
    cut: bool,
    scratch: String,
    parts: usize,
}

impl KeyBuilder {
    /// An empty builder.
    ///
    /// # Examples
    ///
    /// ```
    /// let mut b = idem_runtime::KeyBuilder::new();
    /// b.part(&7u8).unwrap();
    /// assert_eq!(b.finish().as_str(), "1:7");
    /// ```
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends one part taken from the message.
    ///
    /// Fails with [`KeyMissing`] when the part is an `Option` holding `None`.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::{KeyBuilder, KeyMissing};
    ///
    /// let mut b = KeyBuilder::new();
    /// b.part("A-17")?;
    /// b.part(&Some(3u32))?;
    /// assert_eq!(b.part(&None::<u32>), Err(KeyMissing));
    /// assert_eq!(b.finish().as_str(), "4:A-17|1:3");
    /// # Ok::<(), KeyMissing>(())
    /// ```
    pub fn part<P: KeyPart + ?Sized>(&mut self, part: &P) -> Result<(), KeyMissing> {
        self.scratch.clear();
        part.write_key_part(&mut PartWriter {
            buf: &mut self.scratch,
        })?;
        self.push_scratch();
        Ok(())
    }

    /// Appends a constant part (`'deduct'` in a key expression).
    ///
    /// # Examples
    ///
    /// ```
    /// // the key expression `'refund' + order_id`
    /// let mut b = idem_runtime::KeyBuilder::new();
    /// b.constant("refund");
    /// b.part(&17u64).unwrap();
    /// assert_eq!(b.finish().as_str(), "6:refund|2:17");
    /// ```
    pub fn constant(&mut self, text: &str) {
        self.scratch.clear();
        self.scratch.push_str(text);
        self.push_scratch();
    }

    fn push_scratch(&mut self) {
        if self.parts > 0 {
            self.encoded.push('|');
        }
        let _ = write!(self.encoded, "{}:", self.scratch.len());
        self.encoded.push_str(&self.scratch);
        self.cut |= show_part(&mut self.shown, &self.scratch);
        self.parts += 1;
    }

    /// The finished key; long encodings become a digest (see [`MAX_KEY_LEN`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::KeyBuilder;
    ///
    /// let mut b = KeyBuilder::new();
    /// b.part("A-17").unwrap();
    /// assert_eq!(b.finish().as_str(), "4:A-17");
    ///
    /// let mut b = KeyBuilder::new();
    /// b.part(&"x".repeat(200)).unwrap();
    /// assert!(b.finish().as_str().starts_with("#sha256:"));
    /// ```
    pub fn finish(self) -> Key {
        // A NUL byte is refused by Postgres text columns, so such keys are
        // stored as their digest too.
        if self.encoded.len() <= MAX_KEY_LEN && !self.encoded.contains('\0') {
            return Key::with_shown(self.encoded, self.shown, self.cut);
        }
        let hash = Sha256::digest(self.encoded.as_bytes());
        Key::with_shown(format!("{DIGEST_PREFIX}{}", hex(&hash)), self.shown, true)
    }
}

impl Key {
    /// A key whose shown form gets the digest when it is not the whole
    /// story.
    fn with_shown(stored: String, mut shown: String, partial: bool) -> Key {
        let mut key = Key {
            stored,
            shown: String::new(),
        };
        if partial {
            let _ = write!(shown, " [#{}]", key.digest());
        }
        key.shown = shown;
        key
    }
}

/// Receives the text of one key part; see [`KeyPart`].
///
/// It implements [`std::fmt::Write`], so `write!(out, "{}", value)` works.
///
/// # Examples
///
/// A part made of two fields, formatted with `write!`:
///
/// ```
/// use idem_runtime::{Key, KeyMissing, KeyPart, PartWriter};
/// use std::fmt::Write as _;
///
/// struct Version { major: u16, minor: u16 }
///
/// impl KeyPart for Version {
///     fn write_key_part(&self, out: &mut PartWriter<'_>) -> Result<(), KeyMissing> {
///         let _ = write!(out, "{}.{}", self.major, self.minor);
///         Ok(())
///     }
/// }
///
/// let key = Key::from_parts(&[&Version { major: 2, minor: 14 }]).unwrap();
/// assert_eq!(key.as_str(), "4:2.14");
/// ```
#[derive(Debug)]
pub struct PartWriter<'a> {
    buf: &'a mut String,
}

impl PartWriter<'_> {
    /// Appends text to this part.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::{Key, KeyMissing, KeyPart, PartWriter};
    ///
    /// enum Channel { Sms, Email }
    ///
    /// impl KeyPart for Channel {
    ///     fn write_key_part(&self, out: &mut PartWriter<'_>) -> Result<(), KeyMissing> {
    ///         out.write_str(match self {
    ///             Channel::Sms => "sms",
    ///             Channel::Email => "email",
    ///         });
    ///         Ok(())
    ///     }
    /// }
    ///
    /// let key = Key::from_parts(&[&Channel::Email, &Channel::Sms]).unwrap();
    /// assert_eq!(key.as_str(), "5:email|3:sms");
    /// ```
    pub fn write_str(&mut self, s: &str) {
        self.buf.push_str(s);
    }
}

impl fmt::Write for PartWriter<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.buf.push_str(s);
        Ok(())
    }
}

/// A value that can be part of an idempotency key.
///
/// Implemented for strings, integers, `bool`, `char`, [`uuid::Uuid`],
/// references and smart pointers to these, and `Option`s of these (`None` is
/// [`Error::KeyMissing`](crate::Error::KeyMissing) at run time). Floats are
/// deliberately not key parts: equal amounts can print differently
/// (`0.1 + 0.2` and `0.3`, `-0.0` and `0.0`), so a redelivery could miss its
/// record. Use integer minor units or a string instead.
///
/// A part writes its text once; the encoding adds its length, so a part's text
/// may contain any character.
///
/// # Examples
///
/// A newtype delegates to its inner value:
///
/// ```
/// use idem_runtime::{KeyMissing, KeyPart, PartWriter};
///
/// struct OrderId(u64);
///
/// impl KeyPart for OrderId {
///     fn write_key_part(&self, out: &mut PartWriter<'_>) -> Result<(), KeyMissing> {
///         self.0.write_key_part(out)
///     }
/// }
///
/// let key = idem_runtime::Key::from_parts(&[&OrderId(17)]).unwrap();
/// assert_eq!(key.as_str(), "2:17");
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be part of an idempotency key",
    label = "this key part is a `{Self}`",
    note = "key parts are strings, integers, bool, char, uuid::Uuid, Options of these, and types that implement `idem_runtime::KeyPart`"
)]
pub trait KeyPart {
    /// Writes this part's text, or reports that it is missing.
    ///
    /// # Examples
    ///
    /// A part that may be absent reports [`KeyMissing`] instead of writing:
    ///
    /// ```
    /// use idem_runtime::{Key, KeyMissing, KeyPart, PartWriter};
    ///
    /// struct CouponCode(String);
    ///
    /// impl KeyPart for CouponCode {
    ///     fn write_key_part(&self, out: &mut PartWriter<'_>) -> Result<(), KeyMissing> {
    ///         if self.0.is_empty() {
    ///             return Err(KeyMissing);
    ///         }
    ///         out.write_str(&self.0.to_uppercase());
    ///         Ok(())
    ///     }
    /// }
    ///
    /// assert_eq!(Key::from_parts(&[&CouponCode("spring".into())]).unwrap().as_str(), "6:SPRING");
    /// assert_eq!(Key::from_parts(&[&CouponCode(String::new())]), Err(KeyMissing));
    /// ```
    fn write_key_part(&self, out: &mut PartWriter<'_>) -> Result<(), KeyMissing>;
}

impl KeyPart for str {
    fn write_key_part(&self, out: &mut PartWriter<'_>) -> Result<(), KeyMissing> {
        out.write_str(self);
        Ok(())
    }
}

impl KeyPart for String {
    fn write_key_part(&self, out: &mut PartWriter<'_>) -> Result<(), KeyMissing> {
        out.write_str(self);
        Ok(())
    }
}

macro_rules! display_parts {
    ($($t:ty),*) => {$(
        impl KeyPart for $t {
            fn write_key_part(&self, out: &mut PartWriter<'_>) -> Result<(), KeyMissing> {
                let _ = write!(out, "{self}");
                Ok(())
            }
        }
    )*};
}

display_parts!(
    u8,
    u16,
    u32,
    u64,
    u128,
    usize,
    i8,
    i16,
    i32,
    i64,
    i128,
    isize,
    bool,
    char,
    std::num::NonZeroU32,
    std::num::NonZeroU64,
    std::num::NonZeroI64,
    uuid::Uuid
);

impl<T: KeyPart + ?Sized> KeyPart for &T {
    fn write_key_part(&self, out: &mut PartWriter<'_>) -> Result<(), KeyMissing> {
        (**self).write_key_part(out)
    }
}

impl<T: KeyPart + ?Sized> KeyPart for Box<T> {
    fn write_key_part(&self, out: &mut PartWriter<'_>) -> Result<(), KeyMissing> {
        (**self).write_key_part(out)
    }
}

impl<T: KeyPart + ?Sized> KeyPart for std::sync::Arc<T> {
    fn write_key_part(&self, out: &mut PartWriter<'_>) -> Result<(), KeyMissing> {
        (**self).write_key_part(out)
    }
}

impl<T: KeyPart + ToOwned + ?Sized> KeyPart for std::borrow::Cow<'_, T> {
    fn write_key_part(&self, out: &mut PartWriter<'_>) -> Result<(), KeyMissing> {
        (**self).write_key_part(out)
    }
}

impl<T: KeyPart> KeyPart for Option<T> {
    fn write_key_part(&self, out: &mut PartWriter<'_>) -> Result<(), KeyMissing> {
        match self {
            Some(v) => v.write_key_part(out),
            None => Err(KeyMissing),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn encode(parts: &[String]) -> String {
        let mut b = KeyBuilder::new();
        for p in parts {
            b.part(p).unwrap();
        }
        b.finish().stored
    }

    #[test]
    fn separators_inside_parts_do_not_collide() {
        let a = encode(&["a:b".into(), "c".into()]);
        let b = encode(&["a".into(), "b:c".into()]);
        let c = encode(&["a|1:b".into()]);
        let d = encode(&["a".into(), "b".into()]);
        assert_ne!(a, b);
        assert_ne!(c, d);
    }

    #[test]
    fn long_keys_become_a_fixed_size_digest() {
        let k = encode(&["x".repeat(500)]);
        assert!(k.starts_with("#sha256:"));
        assert_eq!(k.len(), "#sha256:".len() + 64);
        assert_ne!(k, encode(&["x".repeat(501)]));
        // the longest plain key stays plain
        let plain = encode(&["y".repeat(MAX_KEY_LEN - 4)]);
        assert_eq!(plain.len(), MAX_KEY_LEN);
        assert!(!plain.starts_with('#'));
    }

    #[test]
    fn nul_bytes_go_to_the_digest_form() {
        let k = encode(&["a\0b".into()]);
        assert!(k.starts_with("#sha256:"), "{k}");
        assert_ne!(k, encode(&["a\0c".into()]));
    }

    #[test]
    fn keys_are_shown_as_their_parts() {
        let key = Key::from_parts(&[&"p-1"]).unwrap();
        assert_eq!(key.shown(), "p-1");
        assert_eq!(key.to_string(), "3:p-1");
        let key = Key::from_parts(&[&"", &"a + b", &"tab\t", &7u8, &"日本"]).unwrap();
        assert_eq!(key.shown(), r#""" + "a + b" + "tab\t" + 7 + 日本"#);
        let long = Key::from_parts(&[&"x".repeat(200), &"y"]).unwrap();
        assert_eq!(
            long.shown(),
            format!("{}… + y [#{}]", "x".repeat(SHOWN_PART_LEN), long.digest())
        );
        let quoted_long = Key::from_parts(&[&" ".repeat(50)]).unwrap();
        assert_eq!(
            quoted_long.shown(),
            format!(
                "\"{}…\" [#{}]",
                " ".repeat(SHOWN_PART_LEN),
                quoted_long.digest()
            )
        );
    }

    #[test]
    fn keys_cut_for_showing_never_show_alike() {
        let a = Key::from_parts(&[&format!("{}A", "x".repeat(40))]).unwrap();
        let b = Key::from_parts(&[&format!("{}B", "x".repeat(40))]).unwrap();
        assert!(a.as_str().len() < MAX_KEY_LEN, "stored plainly");
        assert_ne!(a.shown(), b.shown());
    }

    #[test]
    fn values_print_canonically() {
        let k = Key::from_parts(&[&-5i64, &true, &'x', &uuid::Uuid::nil(), &Some("s")]).unwrap();
        assert_eq!(
            k.as_str(),
            "2:-5|4:true|1:x|36:00000000-0000-0000-0000-000000000000|1:s"
        );
    }

    proptest! {
        /// No two different lists of parts encode alike.
        #[test]
        fn encoding_is_injective(
            a in proptest::collection::vec(".{0,12}", 0..5),
            b in proptest::collection::vec(".{0,12}", 0..5),
        ) {
            if a != b {
                prop_assert_ne!(encode(&a), encode(&b));
            } else {
                prop_assert_eq!(encode(&a), encode(&b));
            }
        }

        /// Lists that differ only by where a separator-like character falls.
        #[test]
        fn moved_boundaries_never_collide(s in "[a:|0-9]{0,16}", cut in 0usize..17, cut2 in 0usize..17) {
            let cut = cut.min(s.len());
            let cut2 = cut2.min(s.len());
            prop_assume!(cut != cut2);
            let x = encode(&[s[..cut].to_string(), s[cut..].to_string()]);
            let y = encode(&[s[..cut2].to_string(), s[cut2..].to_string()]);
            prop_assert_ne!(x, y);
        }
    }
}
