//! Dead letters by cause: the fingerprint of an error, the group it puts a
//! dead letter in, and the groups of a listing.
//!
//! A failure that hit 4,000 messages is one group, not 4,000 lines. A
//! group is the handler, the error's kind and the error's text with what
//! differs from one message to the next taken out ([`fingerprint`]):
//! numbers, ids, quoted values. Its id ([`Group::id`], 12 hex digits) is
//! what [`Selection::group`](super::Selection::group) and `idem dead
//! replay --group` take.
//!
//! A dead letter can arrive twice: a consumer killed between writing it and
//! settling the message writes it again when the message comes back, and a
//! producer that retried sends the message twice. Two dead letters from the
//! same queue, subject or topic with the same payload and replay count are
//! one message ([`DeadLetter::message_digest`]): idem derives a key from
//! the payload alone, so the second is a duplicate of the first whatever
//! happens. (A message that came back after a replay has one replay more,
//! and is a dead letter of its own.) A group counts both its dead letters
//! and its messages, and a replay runs each message once (see
//! [`Replayed::copies`](super::Replayed::copies)).

use std::collections::{BTreeMap, BTreeSet};

use sha2::{Digest as _, Sha256};

use super::DeadLetter;

/// How long a fingerprint may be, in characters.
const FINGERPRINT_MAX: usize = 300;

/// `text` with what differs from one message to the next taken out, so
/// that one failure met by many messages reads the same for all: a word
/// that holds a digit (a number, an id such as `o-17` or a UUID, an
/// address) becomes `#`, a quoted value (in backticks or double quotes)
/// becomes `…` in its quotes, runs of white space become one space, and the
/// whole is cut to 300 characters.
///
/// # Examples
///
/// ```
/// use idem_runtime::consume::dead::fingerprint;
///
/// assert_eq!(fingerprint("out of stock for sku-1234"), "out of stock for #");
/// assert_eq!(fingerprint("out of stock for sku-88"), "out of stock for #");
/// assert_eq!(
///     fingerprint("invalid type: integer `7`, expected a string at line 1 column 9"),
///     "invalid type: integer `…`, expected a string at line # column #"
/// );
/// assert_eq!(fingerprint("card declined:  402."), "card declined: #.");
/// assert_eq!(fingerprint("order 5b0e1c9e-4d1f-4a51-9a37-0e3c8b5d2f10 refused"), "order # refused");
/// ```
pub fn fingerprint(text: &str) -> String {
    let mut out = String::with_capacity(text.len().min(FINGERPRINT_MAX));
    let mut chars = text.chars().peekable();
    let mut word = String::new();
    let flush = |word: &mut String, out: &mut String| {
        if word.is_empty() {
            return;
        }
        // Trailing punctuation ends a sentence, not an id.
        let kept = word.trim_end_matches(['.', ':', '/', '-', '+']);
        let tail = &word[kept.len()..];
        if kept.chars().any(|c| c.is_ascii_digit()) {
            out.push('#');
        } else {
            out.push_str(kept);
        }
        out.push_str(tail);
        word.clear();
    };
    while let Some(c) = chars.next() {
        if c.is_alphanumeric() || matches!(c, '_' | '-' | '.' | ':' | '/' | '+' | '@' | '#') {
            word.push(c);
            continue;
        }
        flush(&mut word, &mut out);
        match c {
            '`' | '"' => {
                // A quoted value: its content goes, its quotes stay; an
                // unclosed quote is kept as written.
                match chars.clone().position(|x| x == c) {
                    Some(inside) => {
                        out.push(c);
                        out.push('…');
                        out.push(c);
                        // The quoted characters and the closing quote.
                        for _ in 0..=inside {
                            chars.next();
                        }
                    }
                    None => out.push(c),
                }
            }
            c if c.is_whitespace() => {
                while chars.peek().is_some_and(|n| n.is_whitespace()) {
                    chars.next();
                }
                if !out.is_empty() {
                    out.push(' ');
                }
            }
            c => out.push(c),
        }
    }
    flush(&mut word, &mut out);
    let out = out.trim_end();
    match out.char_indices().nth(FINGERPRINT_MAX) {
        Some((cut, _)) => out[..cut].trim_end().to_owned(),
        None => out.to_owned(),
    }
}

/// The id of the group of `handler`, `kind` and `fingerprint`: 12 hex
/// digits of their SHA-256, the same wherever it is computed.
fn group_id(handler: Option<&str>, kind: Option<&str>, fingerprint: &str) -> String {
    let mut hash = Sha256::new();
    for part in [handler.unwrap_or(""), kind.unwrap_or(""), fingerprint] {
        hash.update(part.as_bytes());
        hash.update([0]);
    }
    hash.finalize()[..6]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

impl DeadLetter {
    /// The fingerprint ([`fingerprint`]) of the error that dead-lettered it:
    /// of [`error`](Self::error), the error alone, where the consumer wrote
    /// it; of the [`reason`](Self::reason) otherwise (a dead letter of an
    /// older consumer, or one written by something else).
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::consume::{Broker, dead::DeadLetter};
    /// let mut d = DeadLetter::new(Broker::Nats, "1", Vec::new());
    /// d.reason = Some("the body failed 3 times; the last error: out of stock for o-17".into());
    /// assert_eq!(d.fingerprint(), "the body failed # times; the last error: out of stock for #");
    /// d.error = Some("out of stock for o-17".into());
    /// assert_eq!(d.fingerprint(), "out of stock for #");
    /// ```
    pub fn fingerprint(&self) -> String {
        fingerprint(
            self.error
                .as_deref()
                .or(self.reason.as_deref())
                .unwrap_or_default(),
        )
    }

    /// The id of its group: its handler, its error's kind and its
    /// [`fingerprint`](Self::fingerprint), as [`Group::id`] has it.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::consume::{Broker, dead::DeadLetter};
    /// let mut a = DeadLetter::new(Broker::Kafka, "0:1", Vec::new());
    /// a.error = Some("out of stock for o-1".into());
    /// let mut b = DeadLetter::new(Broker::Kafka, "0:2", Vec::new());
    /// b.error = Some("out of stock for o-2".into());
    /// assert_eq!(a.group(), b.group());
    /// b.handler = Some("reserve".into());
    /// assert_ne!(a.group(), b.group());
    /// assert_eq!(a.group().len(), 12);
    /// ```
    pub fn group(&self) -> String {
        group_id(
            self.handler.as_deref(),
            self.error_kind.as_deref(),
            &self.fingerprint(),
        )
    }

    /// What makes two dead letters one message: 16 hex digits of the
    /// SHA-256 of where it came from ([`origin`](Self::origin)), its
    /// [`replays`](Self::replays) and its payload. Two dead letters with one
    /// digest are copies of one message (see the [groups](super#groups)); a
    /// message that came back after a replay is another.
    ///
    /// # Examples
    ///
    /// ```
    /// use idem_runtime::consume::{Broker, dead::DeadLetter};
    /// let mut a = DeadLetter::new(Broker::Kafka, "0:1", b"{\"id\":\"o-1\"}".to_vec());
    /// let mut b = DeadLetter::new(Broker::Kafka, "0:2", b"{\"id\":\"o-1\"}".to_vec());
    /// a.origin = Some("orders".into());
    /// b.origin = Some("orders".into());
    /// assert_eq!(a.message_digest(), b.message_digest());
    /// b.origin = Some("refunds".into());
    /// assert_ne!(a.message_digest(), b.message_digest());
    /// b.origin = a.origin.clone();
    /// b.replays = 1; // it came back after a replay
    /// assert_ne!(a.message_digest(), b.message_digest());
    /// ```
    pub fn message_digest(&self) -> String {
        let mut hash = Sha256::new();
        hash.update(self.origin.as_deref().unwrap_or_default().as_bytes());
        hash.update([0]);
        hash.update(self.replays.to_be_bytes());
        hash.update(&self.payload);
        hash.finalize()[..8]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }
}

/// Dead letters of one cause: one handler, one kind of error, one
/// [`fingerprint`].
///
/// # Examples
///
/// ```
/// use idem_runtime::consume::{Broker, dead::{DeadLetter, groups}};
///
/// let dead: Vec<DeadLetter> = (1..=3)
///     .map(|n| {
///         let mut d = DeadLetter::new(Broker::RabbitMq, n.to_string(), format!("{{\"id\":{n}}}").into_bytes());
///         d.handler = Some("reserve".into());
///         d.error_kind = Some("handler_error".into());
///         d.error = Some(format!("out of stock for sku-{n}"));
///         d.dead_at_ms = Some(n * 1_000);
///         d
///     })
///     .collect();
/// let found = groups(&dead);
/// assert_eq!(found.len(), 1);
/// let g = &found[0];
/// assert_eq!((g.dead_letters, g.messages), (3, 3));
/// assert_eq!(g.fingerprint, "out of stock for #");
/// assert_eq!((g.first_seen_ms, g.last_seen_ms), (Some(1_000), Some(3_000)));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Group {
    /// Its id: 12 hex digits, stable (the same handler, kind and
    /// fingerprint make the same id in every listing).
    pub id: String,
    /// The handler, where the consumer wrote it (`None` for a payload that
    /// did not decode, which no handler saw, and for older dead letters).
    pub handler: Option<String>,
    /// The error's kind: an [`Error::kind`](crate::Error::kind) such as
    /// `handler_error`, `failed` or `payload_mismatch`, or `decode` or
    /// `panic`; `None` for older dead letters.
    pub kind: Option<String>,
    /// The error with numbers and ids taken out.
    pub fingerprint: String,
    /// Its dead letters.
    pub dead_letters: u64,
    /// Its messages: its dead letters with copies counted once.
    pub messages: u64,
    /// How often its messages came back after a replay: the sum of their
    /// [`replays`](DeadLetter::replays).
    pub replays: u64,
    /// When its oldest dead letter was written (ms since the epoch).
    pub first_seen_ms: Option<i64>,
    /// When its newest dead letter was written.
    pub last_seen_ms: Option<i64>,
    /// The id of its oldest dead letter, to `show` as an example.
    pub example: String,
    /// The reason of that dead letter, as written.
    pub example_reason: Option<String>,
}

/// The groups of `dead`, the biggest first (by messages, then by dead
/// letters, then the oldest first).
///
/// # Examples
///
/// See [`Group`].
pub fn groups(dead: &[DeadLetter]) -> Vec<Group> {
    let mut found: BTreeMap<String, (Group, BTreeSet<String>)> = BTreeMap::new();
    for d in dead {
        let id = d.group();
        let (group, messages) = found.entry(id.clone()).or_insert_with(|| {
            (
                Group {
                    id,
                    handler: d.handler.clone(),
                    kind: d.error_kind.clone(),
                    fingerprint: d.fingerprint(),
                    dead_letters: 0,
                    messages: 0,
                    replays: 0,
                    first_seen_ms: None,
                    last_seen_ms: None,
                    example: d.id.clone(),
                    example_reason: d.reason.clone(),
                },
                BTreeSet::new(),
            )
        });
        group.dead_letters += 1;
        if messages.insert(d.message_digest()) {
            group.messages += 1;
        }
        group.replays += u64::from(d.replays);
        if let Some(at) = d.dead_at_ms {
            if group.first_seen_ms.is_none_or(|first| at < first) {
                group.first_seen_ms = Some(at);
                group.example = d.id.clone();
                group.example_reason = d.reason.clone();
            }
            group.last_seen_ms = Some(group.last_seen_ms.map_or(at, |last| last.max(at)));
        }
    }
    let mut groups: Vec<Group> = found.into_values().map(|(g, _)| g).collect();
    groups.sort_by(|a, b| {
        b.messages
            .cmp(&a.messages)
            .then(b.dead_letters.cmp(&a.dead_letters))
            .then(a.first_seen_ms.cmp(&b.first_seen_ms))
    });
    groups
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::consume::Broker;

    #[test]
    fn fingerprints_keep_words_and_drop_what_varies() {
        assert_eq!(fingerprint(""), "");
        assert_eq!(fingerprint("  timed out  "), "timed out");
        assert_eq!(fingerprint("an unclosed `quote"), "an unclosed `quote");
        assert_eq!(
            fingerprint("cannot reach 10.0.0.7:5432 (v2 API)"),
            "cannot reach # (# API)"
        );
        assert_eq!(
            fingerprint("handler `reserve`: key \"o-1\" failed"),
            "handler `…`: key \"…\" failed"
        );
        assert_eq!(fingerprint("it doesn't fit"), "it doesn't fit");
        assert_eq!(fingerprint("été 2026 — ok"), "été # — ok");
        let long = "x ".repeat(400);
        assert_eq!(fingerprint(&long).chars().count(), FINGERPRINT_MAX - 1);
        assert_eq!(fingerprint(&"é".repeat(400)).chars().count(), 300);
    }

    #[test]
    fn copies_are_one_message_and_groups_sort_by_size() {
        let make = |id: &str, error: &str, payload: &str, at: i64| {
            let mut d = DeadLetter::new(Broker::Kafka, id, payload.as_bytes().to_vec());
            d.origin = Some("orders".into());
            d.handler = Some("reserve".into());
            d.error_kind = Some("handler_error".into());
            d.error = Some(error.into());
            d.dead_at_ms = Some(at);
            d
        };
        let dead = [
            make("0:1", "declined 402", "{\"id\":1}", 5),
            make("0:2", "out of stock for 7", "{\"id\":2}", 3),
            make("0:3", "out of stock for 8", "{\"id\":3}", 9),
            make("0:4", "out of stock for 8", "{\"id\":3}", 10),
        ];
        let found = groups(&dead);
        assert_eq!(found.len(), 2);
        assert_eq!(found[0].fingerprint, "out of stock for #");
        assert_eq!((found[0].dead_letters, found[0].messages), (3, 2));
        assert_eq!(found[0].example, "0:2");
        assert_eq!(
            (found[0].first_seen_ms, found[0].last_seen_ms),
            (Some(3), Some(10))
        );
        assert_eq!((found[1].dead_letters, found[1].messages), (1, 1));
        assert_eq!(found[1].id, dead[0].group());
    }
}
