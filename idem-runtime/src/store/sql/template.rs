//! The template language of the store's SQL: statements written once with
//! named parameters (`:handler`, `:hold`, ...), rendered in each database's
//! placeholder style ([`Placeholders`]) with the parameters to bind in
//! order ([`Statement`]), or with their values written in as literals for
//! a message sent unprepared ([`Inline`]).
//!
//! Values are always bound parameters (or, in an [`Inline`], literals of
//! hex digits the database decodes). What else a statement's text holds is
//! this crate's SQL, the table name and the dialect's expression of its own
//! clock, which `statements.rs` writes in.

use std::sync::Arc;

use sqlx::AssertSqlSafe;

/// How a database writes the parameters of a prepared statement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placeholders {
    /// `$1`, `$2`, ...: numbered, a parameter used twice is bound once
    /// (PostgreSQL).
    Dollar,
    /// `?1`, `?2`, ...: as `Dollar` (SQLite).
    NumberedQuestion,
    /// `?`: every occurrence is bound anew, in order (MySQL).
    Question,
}

/// A value a statement takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Param {
    /// The handler's registered name (text).
    Handler,
    /// The encoded key (text).
    Key,
    /// The claim's fencing token (text or NULL).
    Token,
    /// The recorded outcome, JSON (text or NULL).
    Outcome,
    /// What tests add to the database's clock, in ms (0 outside tests; see
    /// `SqlStore::with_time_shift`).
    Shift,
    /// How long the lease or the record lasts from the database's now, in
    /// ms (`{until}` is now plus this).
    Hold,
    /// How many rows a sweep deletes, or a listing returns, at most.
    Batch,
    /// The delivery's payload fingerprint (text or NULL).
    Fingerprint,
    /// The handler's `max_attempts` (integer or NULL).
    Max,
    /// The status a failure writes (text).
    Status,
    /// The text of a failure (text or NULL).
    Error,
    /// The `traceparent` of the execution that settles a row (text or
    /// NULL).
    Trace,
    /// The handler's ttl, in ms: `{since}`, the start of the handler's
    /// current window, is the database's now less this; a stalled claim
    /// whose lease ended before it no longer counts.
    Ttl,
    /// A batch's rows: a JSON array of `{"k", "f", "o", "t"}` objects (key,
    /// fingerprint, outcome, token), read as the table `r` of
    /// [`Dialect::BATCH_ROWS`](super::dialect::Dialect::BATCH_ROWS).
    Rows,
    /// A batch's keys, as an array, where the dialect binds a batch's rows
    /// column by column ([`Dialect::ROWS_AS_ARRAYS`](super::dialect::Dialect::ROWS_AS_ARRAYS)).
    Keys,
    /// A batch's fingerprints, as [`Param::Keys`] (empty: all NULL).
    Fingerprints,
    /// A batch's outcomes, as [`Param::Keys`] (empty: all NULL).
    Outcomes,
    /// A batch's tokens, as [`Param::Keys`] (empty: all NULL).
    Tokens,
    /// The consumer whose position an offset table row holds (text).
    Consumer,
    /// The stream (a topic) of an offset table row (text).
    Stream,
    /// The partition of an offset table row (32-bit integer).
    Partition,
    /// The offset to consume next, in an offset table row.
    Next,
    /// An outbox row's message id (text).
    Id,
    /// An outbox row's destination (text).
    Destination,
    /// An outbox row's message key (text or NULL).
    Msgkey,
    /// An outbox row's stored lane (text).
    Lane,
    /// An outbox row's payload (bytes).
    Payload,
    /// An outbox row's headers, JSON (text or NULL).
    Headers,
    /// An outbox row's place in its table (integer).
    Seq,
}

impl Param {
    const ALL: [(&'static str, Param); 29] = [
        ("handler", Param::Handler),
        ("key", Param::Key),
        ("token", Param::Token),
        ("outcome", Param::Outcome),
        ("shift", Param::Shift),
        ("hold", Param::Hold),
        ("batch", Param::Batch),
        ("fingerprint", Param::Fingerprint),
        ("max", Param::Max),
        ("status", Param::Status),
        ("error", Param::Error),
        ("trace", Param::Trace),
        ("ttl", Param::Ttl),
        ("rows", Param::Rows),
        ("keys", Param::Keys),
        ("fingerprints", Param::Fingerprints),
        ("outcomes", Param::Outcomes),
        ("tokens", Param::Tokens),
        ("consumer", Param::Consumer),
        ("stream", Param::Stream),
        ("partition", Param::Partition),
        ("next", Param::Next),
        ("id", Param::Id),
        ("destination", Param::Destination),
        ("msgkey", Param::Msgkey),
        ("lane", Param::Lane),
        ("payload", Param::Payload),
        ("headers", Param::Headers),
        ("seq", Param::Seq),
    ];
}

/// The values a statement's parameters are bound from; each statement
/// takes the ones it names.
#[derive(Debug, Clone, Copy, Default)]
pub struct Values<'a> {
    /// [`Param::Handler`].
    pub handler: &'a str,
    /// [`Param::Key`].
    pub key: &'a str,
    /// [`Param::Token`].
    pub token: Option<&'a str>,
    /// [`Param::Outcome`].
    pub outcome: Option<&'a str>,
    /// [`Param::Shift`].
    pub shift: i64,
    /// [`Param::Hold`].
    pub hold: i64,
    /// [`Param::Batch`].
    pub batch: i64,
    /// [`Param::Fingerprint`].
    pub fingerprint: Option<&'a str>,
    /// [`Param::Max`].
    pub max: Option<i64>,
    /// [`Param::Status`].
    pub status: &'a str,
    /// [`Param::Error`].
    pub error: Option<&'a str>,
    /// [`Param::Trace`].
    pub trace: Option<&'a str>,
    /// [`Param::Ttl`].
    pub ttl: i64,
    /// [`Param::Rows`].
    pub rows: &'a str,
    /// [`Param::Keys`].
    pub keys: &'a [Option<&'a str>],
    /// [`Param::Fingerprints`].
    pub fingerprints: &'a [Option<&'a str>],
    /// [`Param::Outcomes`].
    pub outcomes: &'a [Option<&'a str>],
    /// [`Param::Tokens`].
    pub tokens: &'a [Option<&'a str>],
    /// [`Param::Consumer`].
    pub consumer: &'a str,
    /// [`Param::Stream`].
    pub stream: &'a str,
    /// [`Param::Partition`].
    pub partition: i32,
    /// [`Param::Next`].
    pub next: i64,
    /// [`Param::Id`].
    pub id: &'a str,
    /// [`Param::Destination`].
    pub destination: &'a str,
    /// [`Param::Msgkey`].
    pub msgkey: Option<&'a str>,
    /// [`Param::Lane`].
    pub lane: &'a str,
    /// [`Param::Payload`].
    pub payload: &'a [u8],
    /// [`Param::Headers`].
    pub headers: Option<&'a str>,
    /// [`Param::Seq`].
    pub seq: i64,
}

/// One statement, rendered for its database, with the parameters to bind in
/// order.
#[derive(Debug)]
pub struct Statement {
    sql: Arc<str>,
    params: Box<[Param]>,
}

impl Statement {
    /// Renders `template`, whose parameters are written `:name` (see
    /// [`Param`]). An unknown `:name` is a bug in this crate's SQL: it
    /// panics, so every test that builds a store finds it.
    pub(crate) fn new(style: Placeholders, template: &str) -> Statement {
        let (pieces, tail) = split(template);
        let mut sql = String::with_capacity(template.len());
        let mut params: Vec<Param> = Vec::new();
        for (text, param) in pieces {
            sql.push_str(&text);
            match style {
                Placeholders::Question => {
                    sql.push('?');
                    params.push(param);
                }
                Placeholders::Dollar | Placeholders::NumberedQuestion => {
                    let n = match params.iter().position(|p| *p == param) {
                        Some(i) => i + 1,
                        None => {
                            params.push(param);
                            params.len()
                        }
                    };
                    sql.push(if style == Placeholders::Dollar {
                        '$'
                    } else {
                        '?'
                    });
                    sql.push_str(&n.to_string());
                }
            }
        }
        sql.push_str(&tail);
        Statement {
            sql: sql.into(),
            params: params.into(),
        }
    }

    /// The text for sqlx. Built only from this crate's SQL and a validated
    /// identifier; every value is a bound parameter.
    pub(crate) fn sql(&self) -> AssertSqlSafe<Arc<str>> {
        AssertSqlSafe(Arc::clone(&self.sql))
    }

    /// The parameters to bind, in order.
    pub(crate) fn params(&self) -> &[Param] {
        &self.params
    }
}

/// Splits `template` at its `:name` parameters: the text before each one
/// with the parameter, and the text after the last. `::` is PostgreSQL's
/// cast (`column_name::text`), not a parameter.
fn split(template: &str) -> (Vec<(String, Param)>, String) {
    let mut pieces = Vec::new();
    let mut text = String::new();
    let mut rest = template;
    while let Some(at) = rest.find(':') {
        text.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(cast) = after.strip_prefix(':') {
            text.push_str("::");
            rest = cast;
            continue;
        }
        let len = after
            .find(|c: char| !c.is_ascii_lowercase())
            .unwrap_or(after.len());
        let name = &after[..len];
        let Some(&(_, param)) = Param::ALL.iter().find(|(n, _)| *n == name) else {
            panic!("unknown statement parameter `:{name}` in {template}");
        };
        pieces.push((std::mem::take(&mut text), param));
        rest = &after[len..];
    }
    text.push_str(rest);
    (pieces, text)
}

/// How a database writes values as literals, for the statements a store
/// sends unprepared in one message with others (see [`Inline`]).
#[derive(Debug, Clone, Copy)]
pub struct Literals {
    /// Text, as a literal of hex digits the database decodes, and nothing
    /// of the text itself: [`unicode_escapes`] in `U&'...'` on PostgreSQL,
    /// its UTF-8 bytes in `X'...'` on MySQL.
    pub text: fn(&str) -> String,
    /// A text `NULL`, typed where the database needs it.
    pub null_text: &'static str,
    /// An integer.
    pub integer: fn(i64) -> String,
    /// An integer `NULL`.
    pub null_integer: &'static str,
}

/// A statement whose values are written into its text as literals, for a
/// message of several statements sent through the text protocol in one
/// round trip (which takes no bound parameters).
///
/// Nothing a user wrote reaches the text as SQL: every text value is
/// written as hex digits the database decodes ([`Literals::text`]), and
/// every number as the decimal digits of an `i64`. The rest is this
/// crate's SQL and a validated table name.
#[derive(Debug)]
pub(crate) struct Inline {
    pieces: Box<[(Box<str>, Param)]>,
    tail: Box<str>,
    literals: Literals,
}

impl Inline {
    /// `template` (`:name` parameters, as for [`Statement::new`]) with its
    /// values to be written by `literals`.
    pub(crate) fn new(template: &str, literals: Literals) -> Inline {
        let (pieces, tail) = split(template);
        Inline {
            pieces: pieces
                .into_iter()
                .map(|(text, param)| (text.into_boxed_str(), param))
                .collect(),
            tail: tail.into(),
            literals,
        }
    }

    /// The statement's text with `values` written in.
    pub(crate) fn text(&self, values: &Values<'_>) -> AssertSqlSafe<String> {
        let lit = &self.literals;
        let text = |v: Option<&str>| v.map_or_else(|| lit.null_text.to_owned(), |v| (lit.text)(v));
        let mut sql = String::with_capacity(self.tail.len() + 64 * self.pieces.len());
        for (before, param) in &self.pieces {
            sql.push_str(before);
            sql.push_str(&match param {
                Param::Handler => text(Some(values.handler)),
                Param::Key => text(Some(values.key)),
                Param::Token => text(values.token),
                Param::Outcome => text(values.outcome),
                Param::Fingerprint => text(values.fingerprint),
                Param::Status => text(Some(values.status)),
                Param::Error => text(values.error),
                Param::Trace => text(values.trace),
                Param::Rows => text(Some(values.rows)),
                Param::Consumer => text(Some(values.consumer)),
                Param::Stream => text(Some(values.stream)),
                Param::Id => text(Some(values.id)),
                Param::Destination => text(Some(values.destination)),
                Param::Msgkey => text(values.msgkey),
                Param::Lane => text(Some(values.lane)),
                Param::Headers => text(values.headers),
                Param::Seq => (lit.integer)(values.seq),
                // No message written with its values in carries a payload.
                Param::Payload => lit.null_text.to_owned(),
                // No message written with its values in carries a batch.
                Param::Keys | Param::Fingerprints | Param::Outcomes | Param::Tokens => {
                    lit.null_text.to_owned()
                }
                Param::Shift => (lit.integer)(values.shift),
                Param::Hold => (lit.integer)(values.hold),
                Param::Batch => (lit.integer)(values.batch),
                Param::Ttl => (lit.integer)(values.ttl),
                Param::Partition => (lit.integer)(i64::from(values.partition)),
                Param::Next => (lit.integer)(values.next),
                Param::Max => values
                    .max
                    .map_or_else(|| lit.null_integer.to_owned(), lit.integer),
            });
        }
        sql.push_str(&self.tail);
        AssertSqlSafe(sql)
    }
}

/// `text` as one Unicode escape per character, `\XXXX` (4 hex digits) or
/// `\+XXXXXX` (6, beyond the Basic Multilingual Plane): the inside of a
/// PostgreSQL `U&'...'` literal.
#[cfg(any(feature = "postgres", test))]
pub(crate) fn unicode_escapes(text: &str) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(text.len() * 5);
    for c in text.chars() {
        let _ = match u32::from(c) {
            n @ 0..=0xFFFF => write!(out, "\\{n:04x}"),
            n => write!(out, "\\+{n:06x}"),
        };
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{Param, Placeholders, Statement};

    #[test]
    fn placeholders() {
        let t = "UPDATE t SET a = :hold, b = :hold WHERE k = :key AND u = :ttl";
        let pg = Statement::new(Placeholders::Dollar, t);
        assert_eq!(
            &*pg.sql,
            "UPDATE t SET a = $1, b = $1 WHERE k = $2 AND u = $3"
        );
        assert_eq!(pg.params(), [Param::Hold, Param::Key, Param::Ttl]);
        let lite = Statement::new(Placeholders::NumberedQuestion, t);
        assert_eq!(
            &*lite.sql,
            "UPDATE t SET a = ?1, b = ?1 WHERE k = ?2 AND u = ?3"
        );
        let my = Statement::new(Placeholders::Question, t);
        assert_eq!(&*my.sql, "UPDATE t SET a = ?, b = ? WHERE k = ? AND u = ?");
        assert_eq!(
            my.params(),
            [Param::Hold, Param::Hold, Param::Key, Param::Ttl]
        );
    }

    #[test]
    fn casts_are_not_parameters() {
        let t = "SELECT column_name::text FROM c WHERE k = :key AND n = 1::bigint";
        let pg = Statement::new(Placeholders::Dollar, t);
        assert_eq!(
            &*pg.sql,
            "SELECT column_name::text FROM c WHERE k = $1 AND n = 1::bigint"
        );
        assert_eq!(pg.params(), [Param::Key]);
    }

    #[test]
    fn inline_writes_text_as_escapes_and_numbers_as_digits() {
        use super::{Inline, Literals, Values};
        let literals = Literals {
            text: |v| format!("U&'{}'", super::unicode_escapes(v)),
            null_text: "NULL::text",
            integer: |n| format!("({n})::bigint"),
            null_integer: "NULL::bigint",
        };
        let inline = Inline::new(
            "INSERT INTO t VALUES (:key, :outcome, :token, :hold, :max); COMMIT",
            literals,
        );
        let values = Values {
            key: "x'; --",
            outcome: Some("é🦀"),
            hold: -7,
            ..Values::default()
        };
        assert_eq!(
            inline.text(&values).0,
            r"INSERT INTO t VALUES (U&'\0078\0027\003b\0020\002d\002d', U&'\00e9\+01f980', NULL::text, (-7)::bigint, NULL::bigint); COMMIT"
        );
    }

    #[test]
    #[should_panic(expected = "unknown statement parameter `:nwo`")]
    fn unknown_parameter() {
        Statement::new(Placeholders::Dollar, "SELECT :nwo");
    }
}
