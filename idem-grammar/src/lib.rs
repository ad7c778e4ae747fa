//! The two small languages of idem's `#[idempotent]` attribute, parsed in one
//! place for the macro (at compile time) and the runtime (at run time).
//!
//! * [`parse_key`] reads a key expression: `part (+ part)*`, where a part is a
//!   field path (`order_id`, `order.id`, `items.0`) or a quoted constant
//!   (`'deduct'`).
//! * [`parse_fingerprint`] reads a payload fingerprint: parts in the key's
//!   grammar, or `*` for the whole message.
//! * [`parse_duration`] reads a duration: `90s`, `30m`, `24h`, `7d`, `250ms`,
//!   `1h30m`.
//!
//! Errors carry the byte range of the offending text and a message that says
//! what to write instead; the macro turns them into compile errors on the
//! attribute's literal.
//!
//! # Examples
//!
//! ```
//! use idem_grammar::{parse_duration, parse_key, Part};
//! use std::time::Duration;
//!
//! assert_eq!(parse_duration("1h30m").unwrap(), Duration::from_secs(5400));
//!
//! let key = parse_key("order.id + 'deduct' + sku").unwrap();
//! assert_eq!(key.parts.len(), 3);
//! assert!(matches!(key.parts[1], Part::Const { ref value, .. } if value == "deduct"));
//! assert_eq!(key.to_string(), "order.id + 'deduct' + sku");
//! ```
#![warn(missing_docs, unreachable_pub, clippy::unwrap_used)]

use std::fmt;
use std::ops::Range;
use std::time::Duration;

/// A parse error: what is wrong, and where in the input.
///
/// # Examples
///
/// ```
/// let err = idem_grammar::parse_duration("24x").unwrap_err();
/// assert_eq!(err.span, 2..3);
/// assert!(err.message.contains("unknown unit `x`"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    /// What is wrong and what to write instead.
    pub message: String,
    /// Byte range of the offending text in the input.
    pub span: Range<usize>,
}

impl ParseError {
    fn new(message: impl Into<String>, span: Range<usize>) -> Self {
        Self {
            message: message.into(),
            span,
        }
    }
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ParseError {}

// ---------------------------------------------------------------------------
// Durations
// ---------------------------------------------------------------------------

const UNITS: &[(&str, u64)] = &[
    ("d", 86_400_000),
    ("h", 3_600_000),
    ("m", 60_000),
    ("s", 1_000),
    ("ms", 1),
];

/// Parses a duration such as `90s`, `30m`, `24h`, `7d`, `250ms` or `1h30m`.
///
/// Each component is a whole number followed by a unit (`d`, `h`, `m`, `s`,
/// `ms`); units appear at most once, largest first. Empty input, zero, a sign,
/// spaces, fractions and unknown units are errors.
///
/// # Examples
///
/// ```
/// use idem_grammar::parse_duration;
/// use std::time::Duration;
///
/// assert_eq!(parse_duration("24h").unwrap(), Duration::from_secs(86_400));
/// assert_eq!(parse_duration("1m30s").unwrap(), Duration::from_secs(90));
/// assert!(parse_duration("0s").is_err());
/// assert!(parse_duration("-1h").is_err());
/// assert!(parse_duration("").is_err());
/// ```
pub fn parse_duration(input: &str) -> Result<Duration, ParseError> {
    if input.trim().is_empty() {
        return Err(ParseError::new(
            "the duration is empty: write a number and a unit, e.g. \"24h\", \"30m\" or \"1h30m\"",
            0..input.len(),
        ));
    }
    let bytes = input.as_bytes();
    let mut pos = 0;
    let mut total: u64 = 0;
    // index into UNITS of the last unit seen; units must come largest first
    let mut last_unit: Option<usize> = None;
    while pos < bytes.len() {
        let start = pos;
        let c = bytes[pos];
        if c == b'-' || c == b'+' {
            return Err(ParseError::new(
                "a duration cannot be signed: write a positive amount such as \"1h\"",
                pos..pos + 1,
            ));
        }
        if c.is_ascii_whitespace() {
            return Err(ParseError::new(
                "a duration cannot contain spaces: write e.g. \"1h30m\"",
                pos..pos + 1,
            ));
        }
        while pos < bytes.len() && bytes[pos].is_ascii_digit() {
            pos += 1;
        }
        if pos == start {
            let end = next_char_end(input, pos);
            return Err(ParseError::new(
                format!(
                    "expected a number, found `{}`: write e.g. \"24h\"",
                    &input[pos..end]
                ),
                pos..end,
            ));
        }
        let digits = &input[start..pos];
        let unit_start = pos;
        while pos < bytes.len() && bytes[pos].is_ascii_alphabetic() {
            pos += 1;
        }
        let unit = &input[unit_start..pos];
        if unit.is_empty() {
            if pos < bytes.len() && (bytes[pos] == b'.' || bytes[pos] == b',') {
                return Err(ParseError::new(
                    "a duration takes whole numbers: write \"1h30m\" rather than \"1.5h\", or use a smaller unit",
                    pos..pos + 1,
                ));
            }
            return Err(ParseError::new(
                format!(
                    "`{digits}` has no unit: write `{digits}s`, `{digits}m`, `{digits}h` or `{digits}d`"
                ),
                start..pos,
            ));
        }
        let Some(index) = UNITS.iter().position(|(name, _)| *name == unit) else {
            return Err(ParseError::new(
                format!(
                    "unknown unit `{unit}`: use ms, s, m, h or d (e.g. \"90s\", \"24h\", \"1h30m\")"
                ),
                unit_start..pos,
            ));
        };
        if let Some(last) = last_unit
            && index <= last
        {
            return Err(ParseError::new(
                format!(
                    "`{unit}` comes after `{}`: write each unit once, largest first, as in \"1d12h\" or \"1h30m\"",
                    UNITS[last].0
                ),
                unit_start..pos,
            ));
        }
        last_unit = Some(index);
        let amount: u64 = digits.parse().map_err(|_| too_long(start..pos))?;
        total = amount
            .checked_mul(UNITS[index].1)
            .and_then(|ms| total.checked_add(ms))
            .ok_or_else(|| too_long(start..pos))?;
    }
    if total == 0 {
        return Err(ParseError::new(
            "a duration must be longer than zero",
            0..input.len(),
        ));
    }
    Ok(Duration::from_millis(total))
}

fn too_long(span: Range<usize>) -> ParseError {
    ParseError::new("this duration is too long to represent", span)
}

fn next_char_end(input: &str, pos: usize) -> usize {
    input[pos..]
        .chars()
        .next()
        .map_or(input.len(), |c| pos + c.len_utf8())
}

/// Formats a duration the way [`parse_duration`] reads it (`1h30m`, `250ms`).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// assert_eq!(idem_grammar::format_duration(Duration::from_secs(5400)), "1h30m");
/// assert_eq!(idem_grammar::format_duration(Duration::from_millis(1500)), "1s500ms");
/// assert_eq!(idem_grammar::format_duration(Duration::ZERO), "0s");
/// ```
pub fn format_duration(duration: Duration) -> String {
    let mut ms = u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
    if ms == 0 {
        return "0s".to_owned();
    }
    let mut out = String::new();
    for (name, unit) in UNITS {
        let n = ms / unit;
        if n > 0 {
            out.push_str(&n.to_string());
            out.push_str(name);
            ms -= n * unit;
        }
    }
    out
}

// ---------------------------------------------------------------------------
// Key expressions
// ---------------------------------------------------------------------------

/// A parsed key expression: one or more parts joined by `+`.
///
/// Its `Display` writes it back in canonical form.
///
/// # Examples
///
/// ```
/// use idem_grammar::{parse_key, KeyExpr};
///
/// let key: KeyExpr = parse_key("order_id+  'deduct'").unwrap();
/// assert_eq!(key.parts.len(), 2);
/// assert_eq!(key.to_string(), "order_id + 'deduct'");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyExpr {
    /// The parts in order; never empty.
    pub parts: Vec<Part>,
}

/// One part of a key expression.
///
/// # Examples
///
/// ```
/// use idem_grammar::{parse_key, Part};
///
/// let key = parse_key("order.id + 'it\\'s'").unwrap();
/// for part in &key.parts {
///     match part {
///         Part::Path { segments, .. } => assert_eq!(segments.len(), 2),
///         Part::Const { value, .. } => assert_eq!(value, "it's"),
///     }
/// }
/// // `Display` quotes and escapes constants again
/// assert_eq!(key.parts[1].to_string(), "'it\\'s'");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    /// A field path such as `order.id` or `items.0`.
    Path {
        /// The segments; never empty.
        segments: Vec<Segment>,
        /// Byte range of the whole path in the input.
        span: Range<usize>,
    },
    /// A quoted constant such as `'deduct'`.
    Const {
        /// The constant's text, without quotes and with escapes resolved.
        value: String,
        /// Byte range of the constant, quotes included.
        span: Range<usize>,
    },
}

impl Part {
    /// Byte range of this part in the input.
    ///
    /// # Examples
    ///
    /// ```
    /// let key = idem_grammar::parse_key("a + 'b'").unwrap();
    /// assert_eq!(key.parts[1].span(), 4..7);
    /// ```
    pub fn span(&self) -> Range<usize> {
        match self {
            Part::Path { span, .. } | Part::Const { span, .. } => span.clone(),
        }
    }
}

/// One segment of a field path.
///
/// # Examples
///
/// ```
/// use idem_grammar::{parse_key, Part, Segment};
///
/// let key = parse_key("items.0.sku").unwrap();
/// let Part::Path { segments, .. } = &key.parts[0] else { unreachable!() };
/// assert_eq!(
///     segments,
///     &[Segment::Field("items".into()), Segment::Index(0), Segment::Field("sku".into())]
/// );
/// assert_eq!(segments[1].to_string(), "0");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Segment {
    /// A named field, e.g. `order_id`.
    Field(String),
    /// A tuple field, e.g. the `0` in `items.0`.
    Index(u32),
}

impl fmt::Display for Segment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Segment::Field(name) => f.write_str(name),
            Segment::Index(i) => write!(f, "{i}"),
        }
    }
}

impl fmt::Display for Part {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Part::Path { segments, .. } => {
                for (i, s) in segments.iter().enumerate() {
                    if i > 0 {
                        f.write_str(".")?;
                    }
                    write!(f, "{s}")?;
                }
                Ok(())
            }
            Part::Const { value, .. } => {
                f.write_str("'")?;
                for c in value.chars() {
                    if c == '\'' || c == '\\' {
                        f.write_str("\\")?;
                    }
                    write!(f, "{c}")?;
                }
                f.write_str("'")
            }
        }
    }
}

impl fmt::Display for KeyExpr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, p) in self.parts.iter().enumerate() {
            if i > 0 {
                f.write_str(" + ")?;
            }
            write!(f, "{p}")?;
        }
        Ok(())
    }
}

/// Parses a key expression: `part (+ part)*`.
///
/// A part is a field path — segments separated by `.`, each a field name
/// (`order_id`) or a tuple index (`0`) — or a constant in single quotes
/// (`'deduct'`; `\'` and `\\` escape a quote and a backslash). Spaces around
/// parts are ignored.
///
/// # Examples
///
/// ```
/// use idem_grammar::{parse_key, Part, Segment};
///
/// let key = parse_key("order.id + items.0").unwrap();
/// let Part::Path { segments, .. } = &key.parts[1] else { unreachable!() };
/// assert_eq!(segments, &[Segment::Field("items".into()), Segment::Index(0)]);
///
/// assert!(parse_key("").is_err());
/// assert!(parse_key("order_id +").is_err());
/// ```
pub fn parse_key(input: &str) -> Result<KeyExpr, ParseError> {
    parse_parts(input, Noun::Key)
}

/// A parsed payload fingerprint: what must not change between deliveries
/// of one key.
///
/// # Examples
///
/// ```
/// use idem_grammar::{parse_fingerprint, FingerprintExpr};
///
/// assert_eq!(parse_fingerprint(" * ").unwrap(), FingerprintExpr::Message);
/// let FingerprintExpr::Parts(parts) = parse_fingerprint("qty+price").unwrap() else { unreachable!() };
/// assert_eq!(parts.to_string(), "qty + price");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FingerprintExpr {
    /// `*`: the whole message.
    Message,
    /// Parts in the key's grammar, e.g. `qty + price`.
    Parts(KeyExpr),
}

/// Parses a payload fingerprint: `*` for the whole message, or parts in the
/// grammar of [`parse_key`] (`qty + price`, `order.lines`). Errors name the
/// fingerprint rather than the key.
///
/// # Examples
///
/// ```
/// use idem_grammar::{parse_fingerprint, FingerprintExpr};
///
/// assert_eq!(parse_fingerprint("*").unwrap(), FingerprintExpr::Message);
/// assert!(matches!(parse_fingerprint("lines.0 + price").unwrap(), FingerprintExpr::Parts(p) if p.parts.len() == 2));
/// assert!(parse_fingerprint("").unwrap_err().message.contains("the fingerprint is empty"));
/// assert!(parse_fingerprint("qty + *").unwrap_err().message.contains("stands alone"));
/// ```
pub fn parse_fingerprint(input: &str) -> Result<FingerprintExpr, ParseError> {
    if input.trim() == "*" {
        return Ok(FingerprintExpr::Message);
    }
    parse_parts(input, Noun::Fingerprint).map(FingerprintExpr::Parts)
}

/// What an expression of parts is, for the words of its errors.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Noun {
    Key,
    Fingerprint,
}

impl Noun {
    fn as_str(self) -> &'static str {
        match self {
            Noun::Key => "key",
            Noun::Fingerprint => "fingerprint",
        }
    }
}

fn parse_parts(input: &str, noun: Noun) -> Result<KeyExpr, ParseError> {
    let mut p = KeyParser {
        input,
        pos: 0,
        noun,
    };
    let what = noun.as_str();
    p.skip_ws();
    if p.at_end() {
        return Err(ParseError::new(
            match noun {
                Noun::Key => {
                    "the key is empty: name the message fields that identify it, e.g. key = \"order_id\" or key = \"order_id + sku\""
                }
                Noun::Fingerprint => {
                    "the fingerprint is empty: name the message fields that must not change between deliveries of one key, e.g. fingerprint = \"qty + price\", or write fingerprint = \"*\" for the whole message"
                }
            },
            0..input.len(),
        ));
    }
    let mut parts = Vec::new();
    loop {
        p.skip_ws();
        parts.push(p.part(parts.is_empty())?);
        p.skip_ws();
        if p.at_end() {
            break;
        }
        let c = p.peek_char();
        if c == Some('+') {
            let plus = p.pos;
            p.pos += 1;
            p.skip_ws();
            if p.at_end() {
                return Err(ParseError::new(
                    format!("dangling `+`: add a {what} part after it or remove it"),
                    plus..plus + 1,
                ));
            }
        } else {
            let start = p.pos;
            let end = next_char_end(input, start);
            return Err(ParseError::new(
                format!(
                    "expected `+` between {what} parts, found `{}`",
                    &input[start..end]
                ),
                start..end,
            ));
        }
    }
    Ok(KeyExpr { parts })
}

struct KeyParser<'a> {
    input: &'a str,
    pos: usize,
    noun: Noun,
}

impl KeyParser<'_> {
    fn at_end(&self) -> bool {
        self.pos >= self.input.len()
    }

    fn peek_char(&self) -> Option<char> {
        self.input[self.pos..].chars().next()
    }

    fn skip_ws(&mut self) {
        while let Some(c) = self.peek_char() {
            if c.is_whitespace() {
                self.pos += c.len_utf8();
            } else {
                break;
            }
        }
    }

    fn part(&mut self, first: bool) -> Result<Part, ParseError> {
        let what = self.noun.as_str();
        match self.peek_char() {
            Some('\'') => self.constant(),
            Some('"') => {
                let start = self.pos;
                Err(ParseError::new(
                    format!("constants in a {what} use single quotes, e.g. 'deduct'"),
                    start..start + 1,
                ))
            }
            Some('+') => {
                let start = self.pos;
                Err(ParseError::new(
                    if first {
                        format!("the {what} starts with `+`: write a {what} part before it")
                    } else {
                        format!("two `+` in a row: write a {what} part between them")
                    },
                    start..start + 1,
                ))
            }
            Some('*') if self.noun == Noun::Fingerprint => {
                let start = self.pos;
                Err(ParseError::new(
                    "`*` stands alone: fingerprint = \"*\" is the whole message; to fingerprint some of it, name its fields, e.g. fingerprint = \"qty + price\"",
                    start..start + 1,
                ))
            }
            _ => self.path(),
        }
    }

    fn constant(&mut self) -> Result<Part, ParseError> {
        let start = self.pos;
        self.pos += 1; // opening quote
        let mut value = String::new();
        loop {
            let Some(c) = self.peek_char() else {
                return Err(ParseError::new(
                    "unterminated constant: close it with `'`",
                    start..self.input.len(),
                ));
            };
            self.pos += c.len_utf8();
            match c {
                '\'' => break,
                '\\' => match self.peek_char() {
                    Some(e @ ('\'' | '\\')) => {
                        self.pos += 1;
                        value.push(e);
                    }
                    _ => {
                        return Err(ParseError::new(
                            format!(
                                "in a {} constant, `\\` escapes only `'` and `\\`",
                                self.noun.as_str()
                            ),
                            self.pos - 1..self.pos,
                        ));
                    }
                },
                c => value.push(c),
            }
        }
        if value.is_empty() {
            return Err(ParseError::new(
                format!(
                    "an empty constant '' adds nothing to the {}: remove it or write some text",
                    self.noun.as_str()
                ),
                start..self.pos,
            ));
        }
        Ok(Part::Const {
            value,
            span: start..self.pos,
        })
    }

    fn path(&mut self) -> Result<Part, ParseError> {
        let start = self.pos;
        let mut segments = Vec::new();
        loop {
            segments.push(self.segment()?);
            if self.peek_char() == Some('.') {
                let dot = self.pos;
                self.pos += 1;
                match self.peek_char() {
                    Some(c) if c == '_' || c.is_alphanumeric() => {}
                    _ => {
                        return Err(ParseError::new(
                            "a path cannot end with `.`: name a field after it",
                            dot..dot + 1,
                        ));
                    }
                }
            } else {
                break;
            }
        }
        Ok(Part::Path {
            segments,
            span: start..self.pos,
        })
    }

    fn segment(&mut self) -> Result<Segment, ParseError> {
        let start = self.pos;
        let rest = &self.input[start..];
        let len = rest
            .char_indices()
            .find(|&(_, c)| !(c == '_' || c.is_alphanumeric()))
            .map_or(rest.len(), |(i, _)| i);
        if len == 0 {
            let end = next_char_end(self.input, start);
            let found = &self.input[start..end];
            return Err(ParseError::new(
                format!(
                    "expected a field name or a quoted constant, found `{found}`: {} parts are field paths such as `order.id` or constants such as 'deduct', joined by `+`",
                    self.noun.as_str()
                ),
                start..end,
            ));
        }
        self.pos += len;
        let text = &rest[..len];
        let first = text.chars().next().unwrap_or('_');
        if first.is_ascii_digit() {
            if !text.bytes().all(|b| b.is_ascii_digit()) || (text.len() > 1 && first == '0') {
                return Err(ParseError::new(
                    format!("`{text}` is neither a field name nor a tuple index"),
                    start..self.pos,
                ));
            }
            let index = text.parse().map_err(|_| {
                ParseError::new(
                    format!("tuple index `{text}` is too large"),
                    start..self.pos,
                )
            })?;
            return Ok(Segment::Index(index));
        }
        if !(first == '_' || first.is_alphabetic()) {
            return Err(ParseError::new(
                format!("`{text}` is not a field name"),
                start..self.pos,
            ));
        }
        Ok(Segment::Field(text.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key_err(s: &str) -> String {
        parse_key(s).unwrap_err().message
    }

    fn dur_err(s: &str) -> String {
        parse_duration(s).unwrap_err().message
    }

    #[test]
    fn durations() {
        let ok = |s: &str, ms: u64| assert_eq!(parse_duration(s).unwrap().as_millis() as u64, ms);
        ok("90s", 90_000);
        ok("30m", 1_800_000);
        ok("24h", 86_400_000);
        ok("7d", 604_800_000);
        ok("1h30m", 5_400_000);
        ok("250ms", 250);
        ok("1d2h3m4s5ms", 93_784_005);
        ok("0h5m", 300_000);
    }

    #[test]
    fn duration_errors() {
        assert!(dur_err("").contains("empty"));
        assert!(dur_err("0s").contains("longer than zero"));
        assert!(dur_err("-1h").contains("signed"));
        assert!(dur_err("24x").contains("unknown unit `x`"));
        assert!(dur_err("24").contains("no unit"));
        assert!(dur_err("1.5h").contains("whole numbers"));
        assert!(dur_err("30m1h").contains("largest first"));
        assert!(dur_err("1h1h").contains("largest first"));
        assert!(dur_err("1h 30m").contains("spaces"));
        assert!(dur_err("h").contains("expected a number"));
        assert!(dur_err("99999999999999999999d").contains("too long"));
        assert!(dur_err("999999999999999d").contains("too long"));
    }

    #[test]
    fn duration_round_trip() {
        for ms in [1u64, 999, 1000, 61_001, 5_400_000, 90_061_001] {
            let d = Duration::from_millis(ms);
            assert_eq!(parse_duration(&format_duration(d)).unwrap(), d);
        }
    }

    #[test]
    fn keys() {
        let k = parse_key("  order_id+sku ").unwrap();
        assert_eq!(k.to_string(), "order_id + sku");
        let k = parse_key("'it''s'").unwrap_err();
        assert!(k.message.contains("expected `+`"), "{}", k.message);
        let k = parse_key(r"'it\'s' + a.0.b").unwrap();
        assert_eq!(k.to_string(), r"'it\'s' + a.0.b");
        assert_eq!(
            k.parts[1],
            Part::Path {
                segments: vec![
                    Segment::Field("a".into()),
                    Segment::Index(0),
                    Segment::Field("b".into())
                ],
                span: 10..15
            }
        );
        let k = parse_key("名前 + _x").unwrap();
        assert_eq!(k.parts.len(), 2);
    }

    #[test]
    fn key_errors() {
        assert!(key_err("").contains("empty"));
        assert!(key_err("   ").contains("empty"));
        assert!(key_err("order_id +").contains("dangling `+`"));
        assert!(key_err("+ order_id").contains("starts with `+`"));
        assert!(key_err("a ++ b").contains("two `+` in a row"));
        assert!(key_err("a b").contains("expected `+`"));
        assert!(key_err("a.").contains("cannot end with `.`"));
        assert!(key_err("a..b").contains("cannot end with `.`"));
        assert!(key_err("'abc").contains("unterminated"));
        assert!(key_err("''").contains("empty constant"));
        assert!(key_err("\"x\"").contains("single quotes"));
        assert!(key_err("a.01").contains("neither"));
        assert!(key_err("1a").contains("neither"));
        assert!(key_err("a - b").contains("expected `+`"));
        assert!(key_err("a + -b").contains("expected a field name"));
        assert!(key_err(r"'a\n'").contains("escapes only"));
    }

    fn fingerprint_err(s: &str) -> String {
        parse_fingerprint(s).unwrap_err().message
    }

    #[test]
    fn fingerprints() {
        assert_eq!(parse_fingerprint("*").unwrap(), FingerprintExpr::Message);
        assert_eq!(
            parse_fingerprint("  *\t").unwrap(),
            FingerprintExpr::Message
        );
        assert_eq!(
            parse_fingerprint("qty+price.0").unwrap(),
            FingerprintExpr::Parts(parse_key("qty+price.0").unwrap())
        );
    }

    #[test]
    fn fingerprint_errors() {
        assert!(fingerprint_err("").contains("the fingerprint is empty"));
        assert!(fingerprint_err(" ").contains("fingerprint = \"*\""));
        assert!(fingerprint_err("qty +").contains("add a fingerprint part"));
        assert!(fingerprint_err("qty price").contains("between fingerprint parts"));
        assert!(fingerprint_err("* + qty").contains("`*` stands alone"));
        assert!(fingerprint_err("qty + *").contains("`*` stands alone"));
        assert!(fingerprint_err("**").contains("`*` stands alone"));
        assert!(fingerprint_err("\"x\"").contains("constants in a fingerprint"));
        // the key's own messages are unchanged
        assert!(key_err("*").contains("key parts are field paths"));
        assert!(key_err("a +").contains("add a key part"));
    }

    proptest::proptest! {
        #[test]
        fn parse_key_never_panics(s in "\\PC{0,40}") {
            let _ = parse_key(&s);
        }

        #[test]
        fn parse_fingerprint_never_panics(s in "[ *+.'a-z0-9]{0,20}|\\PC{0,40}") {
            let _ = parse_fingerprint(&s);
        }

        #[test]
        fn parse_duration_never_panics(s in "\\PC{0,20}") {
            let _ = parse_duration(&s);
        }

        #[test]
        fn constants_round_trip(v in "\\PC{1,20}") {
            let expr = KeyExpr { parts: vec![Part::Const { value: v.clone(), span: 0..0 }] };
            let parsed = parse_key(&expr.to_string()).unwrap();
            let Part::Const { value, .. } = &parsed.parts[0] else { panic!("not a constant") };
            proptest::prop_assert_eq!(value, &v);
        }
    }
}
