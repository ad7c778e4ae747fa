//! The `Idempotency-Key` request header: a structured-field string
//! (RFC 8941), as the draft defines it, or a bare token, as most clients
//! send it.

use http::HeaderMap;

/// The header's name.
pub const IDEMPOTENCY_KEY: http::HeaderName = http::HeaderName::from_static("idempotency-key");

/// The header a replayed response carries: `true`, or `body-not-stored`
/// when the recorded response was too large to keep its body.
pub const IDEMPOTENT_REPLAYED: http::HeaderName =
    http::HeaderName::from_static("idempotent-replayed");

/// The longest key taken, in characters: the draft leaves it to the
/// server, and Stripe takes 255.
pub const MAX_HEADER_KEY_LEN: usize = 255;

/// What the request's header says.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Sent {
    /// No header.
    Missing,
    /// A header that is not one key (why).
    Malformed(&'static str),
    /// The key.
    Key(String),
}

/// The request's key, read from `headers`.
pub(crate) fn read(headers: &HeaderMap) -> Sent {
    let mut values = headers.get_all(&IDEMPOTENCY_KEY).iter();
    let Some(value) = values.next() else {
        return Sent::Missing;
    };
    if values.next().is_some() {
        return Sent::Malformed("the request has more than one Idempotency-Key header");
    }
    let Ok(text) = value.to_str() else {
        return Sent::Malformed("the Idempotency-Key is not visible ASCII");
    };
    match parse(text.trim_matches(' ')) {
        Ok(key) => Sent::Key(key),
        Err(why) => Sent::Malformed(why),
    }
}

/// The key `text` holds: an sf-string (`"…"`, with `\"` and `\\` escapes)
/// or a bare run of visible ASCII without quotes, commas or spaces.
fn parse(text: &str) -> Result<String, &'static str> {
    let key = if let Some(inner) = text.strip_prefix('"') {
        let mut key = String::with_capacity(inner.len());
        let mut chars = inner.chars();
        loop {
            match chars.next() {
                None => return Err("the Idempotency-Key's string is not closed"),
                Some('"') => break,
                Some('\\') => match chars.next() {
                    Some(c @ ('"' | '\\')) => key.push(c),
                    _ => {
                        return Err(
                            "the Idempotency-Key's string has an escape other than \\\" or \\\\",
                        );
                    }
                },
                Some(c) if (' '..='~').contains(&c) => key.push(c),
                Some(_) => return Err("the Idempotency-Key is not visible ASCII"),
            }
        }
        if chars.next().is_some() {
            return Err("the Idempotency-Key has more after its string (one key, no parameters)");
        }
        key
    } else {
        if text
            .chars()
            .any(|c| !('!'..='~').contains(&c) || matches!(c, '"' | ',' | ';'))
        {
            return Err("the Idempotency-Key is neither a quoted string nor one token");
        }
        text.to_owned()
    };
    if key.is_empty() {
        return Err("the Idempotency-Key is empty");
    }
    if key.len() > MAX_HEADER_KEY_LEN {
        return Err("the Idempotency-Key is longer than 255 characters");
    }
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::{Sent, read};
    use http::{HeaderMap, HeaderValue};

    fn sent(values: &[&[u8]]) -> Sent {
        let mut h = HeaderMap::new();
        for v in values {
            h.append("idempotency-key", HeaderValue::from_bytes(v).unwrap());
        }
        read(&h)
    }

    #[test]
    fn the_drafts_key_and_bare_tokens_are_read() {
        assert_eq!(
            sent(&[b"\"8e03978e-40d5-43e8-bc93-6894a57f9324\""]),
            Sent::Key("8e03978e-40d5-43e8-bc93-6894a57f9324".into())
        );
        assert_eq!(sent(&[b"abc-123"]), Sent::Key("abc-123".into()));
        assert_eq!(
            sent(&[br#""a \"b\" \\ c""#]),
            Sent::Key(r#"a "b" \ c"#.into())
        );
        assert_eq!(sent(&[b"  \"x\"  "]), Sent::Key("x".into()));
    }

    #[test]
    fn anything_else_is_malformed() {
        assert_eq!(sent(&[]), Sent::Missing);
        for bad in [
            &b"\"\""[..],
            b"",
            b"\"open",
            b"\"a\";p=1",
            b"\"a\" \"b\"",
            b"a b",
            b"a,b",
            b"\"\\n\"",
            "\"é\"".as_bytes(),
            b"\"a\tb\"",
        ] {
            assert!(matches!(sent(&[bad]), Sent::Malformed(_)), "{bad:?}");
        }
        assert!(matches!(sent(&[b"a", b"b"]), Sent::Malformed(_)));
        let long = "k".repeat(256);
        assert!(matches!(sent(&[long.as_bytes()]), Sent::Malformed(_)));
        assert_eq!(
            sent(&["k".repeat(255).as_bytes()]),
            Sent::Key("k".repeat(255))
        );
    }
}
