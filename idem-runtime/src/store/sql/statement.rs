//! The store's SQL: statements written once with named parameters
//! (`:handler`, `:hold`, ...), rendered in each database's placeholder style,
//! and the set of them a store runs, built once per table.
//!
//! Values are always bound parameters. The only text spliced into a
//! statement is the table name, which
//! [`validate_table_name`](super::table::validate_table_name) restricted to
//! letters, digits, `_` and one `.`, and the dialect's fixed expression of
//! its own clock ([`Dialect::NOW`](super::Dialect::NOW)).
//!
//! Time is the database's: a template writes `{now}` (the database's clock
//! in ms since the epoch, plus `:shift`, which is 0 outside tests),
//! `{until}` (`{now}` plus `:hold`, the lease or the ttl) and `{since}`
//! (`{now}` less `:ttl`). No time computed by the consumer is ever bound,
//! so consumers whose clocks disagree still agree on every lease and
//! expiry.

use std::sync::Arc;

use sqlx::AssertSqlSafe;

use super::dialect::Dialect;

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
    /// The handler's ttl, in ms: `{since}`, the start of the handler's
    /// current window, is the database's now less this; a stalled claim
    /// whose lease ended before it no longer counts.
    Ttl,
    /// A batch's rows: a JSON array of `{"k", "f", "o", "t"}` objects (key,
    /// fingerprint, outcome, token), read as the table `r` of
    /// [`Dialect::BATCH_ROWS`](super::Dialect::BATCH_ROWS).
    Rows,
}

impl Param {
    const ALL: [(&'static str, Param); 13] = [
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
        ("ttl", Param::Ttl),
        ("rows", Param::Rows),
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
    /// [`Param::Ttl`].
    pub ttl: i64,
    /// [`Param::Rows`].
    pub rows: &'a str,
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
                Param::Rows => text(Some(values.rows)),
                Param::Shift => (lit.integer)(values.shift),
                Param::Hold => (lit.integer)(values.hold),
                Param::Batch => (lit.integer)(values.batch),
                Param::Ttl => (lit.integer)(values.ttl),
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

/// What a claim writes into the row it takes: as SQL fragments of the
/// `status`, `token` and `outcome` columns, and the failures and last error
/// it adds to those it carries over.
#[derive(Debug, Clone, Copy)]
pub struct NewRow {
    /// The `status` column.
    pub status: &'static str,
    /// The `token` column.
    pub token: &'static str,
    /// The `outcome` column.
    pub outcome: &'static str,
    /// The failures this claim adds.
    pub failures: &'static str,
    /// The last error this claim writes (`NULL`: keep the carried one).
    pub last_error: &'static str,
    /// The delivery's payload fingerprint (`:fingerprint`, or a batch row's
    /// column).
    pub fingerprint: &'static str,
}

/// A claim in progress, carrying its fencing token (lease mode, and
/// transaction mode claiming first with a `NULL` token).
pub(crate) const CLAIMED: NewRow = NewRow {
    status: "'in_progress'",
    token: ":token",
    outcome: "NULL",
    failures: "0",
    last_error: "NULL",
    fingerprint: ":fingerprint",
};

/// A claim written with its outcome (transaction mode claiming last).
pub(crate) const COMPLETED: NewRow = NewRow {
    status: "'completed'",
    token: "NULL",
    outcome: ":outcome",
    failures: "0",
    last_error: "NULL",
    fingerprint: ":fingerprint",
};

/// A claim written with a final failure (transaction mode, once the body's
/// transaction rolled back without a claim row to record it in).
pub(crate) const FAILED: NewRow = NewRow {
    status: "'failed'",
    token: "NULL",
    outcome: ":outcome",
    failures: "1",
    last_error: ":error",
    fingerprint: ":fingerprint",
};

/// The columns of the dedup table, in the order claims insert them.
pub(crate) const COLUMNS: &str = "handler, {key}, status, token, outcome, attempts, failures, \
     last_error, fingerprint, created_at, updated_at, expires_at";

/// The values a claim inserts, in [`COLUMNS`]' order.
pub(crate) fn inserted(row: NewRow) -> String {
    format!("({})", values_of(row, ":key"))
}

/// The values of `row` for the key `key` (`:key`, or a batch row's
/// column), in [`COLUMNS`]' order, without parentheses.
pub(crate) fn values_of(row: NewRow, key: &str) -> String {
    let NewRow {
        status,
        token,
        outcome,
        failures,
        last_error,
        fingerprint,
    } = row;
    format!(
        ":handler, {key}, {status}, {token}, {outcome}, 1, {failures}, {last_error}, \
          {fingerprint}, {{now}}, {{now}}, {{until}}"
    )
}

/// Whether a standing row, its columns read through `cur` (`"cur."`, or
/// `""` in an `UPDATE` of the row itself), may be taken by this claim: it
/// has expired (unless it is a stalled claim whose failure would be the
/// last one allowed, see [`Standing::of_ran_out`](crate::Standing::of_ran_out)),
/// or its last delivery failed with attempts left and the same payload
/// (the delivery's fingerprint is the SQL `fingerprint`: `:fingerprint`,
/// or a batch row's column). [`Standing::of`](crate::Standing::of) is the
/// same rule, read from a record.
pub(crate) fn claimable(cur: &str, fingerprint: &str) -> String {
    format!(
        "(({cur}expires_at <= {{now}} AND ({cur}status <> 'in_progress' OR :max IS NULL \
            OR {cur}expires_at <= {{since}} OR {cur}failures + 1 < :max)) \
          OR ({cur}status = 'retry' \
          AND (:max IS NULL OR {cur}failures < :max) \
          AND ({cur}fingerprint IS NULL OR {fingerprint} IS NULL OR {cur}fingerprint = {fingerprint})))"
    )
}

/// The assignments of a claim that takes over a row (columns read through
/// `cur`, as for [`claimable`]): what it carries over, as
/// [`Carried`](crate::store::rules::Carried) says, then what it writes. Ordered so
/// that MySQL, which assigns left to right and reads updated values, sees
/// the old status and expiry where it reads them.
pub(crate) fn take_over_assignments(cur: &str, row: NewRow) -> String {
    let NewRow {
        status,
        token,
        outcome,
        failures,
        last_error,
        fingerprint,
    } = row;
    let retrying = format!("({cur}status = 'retry' AND {cur}expires_at > {{now}})");
    let ran_out = format!("({cur}status = 'in_progress' AND {cur}expires_at > {{since}})");
    let lease_ran_out = crate::store::LEASE_RAN_OUT;
    format!(
        "attempts = CASE WHEN {retrying} OR {ran_out} THEN {cur}attempts + 1 ELSE 1 END,
         failures = CASE WHEN {retrying} THEN {cur}failures
                         WHEN {ran_out} THEN {cur}failures + 1 ELSE 0 END + {failures},
         last_error = CASE WHEN {retrying} THEN COALESCE({last_error}, {cur}last_error)
                           WHEN {ran_out} THEN COALESCE({last_error}, '{lease_ran_out}')
                           ELSE {last_error} END,
         status = {status}, token = {token}, outcome = {outcome}, fingerprint = {fingerprint},
         created_at = {{now}}, updated_at = {{now}}, expires_at = {{until}}"
    )
}

/// How a database takes a key: one statement that inserts the row or takes
/// over an expired one, or an insert that leaves a standing row alone and a
/// second statement that takes it over if it has expired.
#[derive(Debug)]
pub(crate) struct Take {
    /// Inserts the row; affects no row when one stands (and, for a
    /// one-statement dialect, has not expired).
    pub(crate) insert: Statement,
    /// Takes over the standing row if it has expired (`expires_at <=
    /// {now}`); `None` when `insert` does so itself.
    pub(crate) take_over: Option<Statement>,
}

/// The SQL of one store, built once from a validated table name.
#[derive(Debug)]
pub(crate) struct Statements {
    pub(crate) table: String,
    /// Creates the table and its expiry index (one or several statements,
    /// no parameters).
    pub(crate) create: Arc<str>,
    /// Takes an absent or expired key as `in_progress` ([`CLAIMED`]).
    pub(crate) claim: Take,
    /// Takes an absent or expired key as `completed` ([`COMPLETED`]).
    pub(crate) claim_with_outcome: Take,
    /// Takes an absent or expired key as `failed` ([`FAILED`]).
    pub(crate) claim_with_failure: Take,
    /// A savepoint (where the dialect sets one), the insert of a new
    /// `completed` row, `COMMIT` and `BEGIN`, in one message with its
    /// values written in; failing ([`Fault::Unique`](super::Fault)), and
    /// committing nothing, when a record of the key stands. `None` where
    /// the dialect sends no dedup row with the `COMMIT`
    /// ([`Dialect::WITH_COMMIT`]).
    pub(crate) claim_with_commit: Option<Inline>,
    /// The record of `:handler`, `:key`: the columns
    /// [`super::exec::Exec::fetch`] reads, in its order, and the database's
    /// now.
    pub(crate) select: Statement,
    /// As `select`, reading the latest committed row inside a claim's
    /// transaction ([`Dialect::LATEST_READ`]).
    pub(crate) select_latest: Statement,
    /// Records `:outcome` under the claim this transaction holds.
    pub(crate) complete_tx: Statement,
    /// As `complete_tx`, if `:token` still holds the claim (or held the
    /// claim whose stall was counted as the last failure).
    pub(crate) complete_lease: Statement,
    /// Records a failure (`:status`, `:outcome`, `:error`) under the claim
    /// `:token` holds.
    pub(crate) fail_lease: Statement,
    /// As `fail_lease`, under the claim this transaction holds.
    pub(crate) fail_tx: Statement,
    /// Counts a stalled claim (in progress, its lease run out) as a
    /// failure, leaving the key for no one: its attempts are exhausted. The
    /// claim keeps its token, so that a body that finishes after all still
    /// records what it did.
    pub(crate) settle_ran_out: Statement,
    /// Deletes the claim `:token` holds.
    pub(crate) release: Statement,
    /// Moves the end of the lease `:token` holds to `{until}`.
    pub(crate) extend: Statement,
    /// Deletes at most `:batch` rows expired at `{now}`.
    pub(crate) sweep: Statement,
    /// Counts the rows.
    pub(crate) count: Statement,
    /// The names of the table's columns.
    pub(crate) columns: Statement,
    /// The statements that add each column a table of an earlier release
    /// lacks: (column, statement).
    pub(crate) upgrades: Vec<(&'static str, Statement)>,
    /// The statements of batches.
    pub(crate) batch: super::batch::BatchStatements,
}

/// The columns of a record, in the order [`super::exec::Exec::fetch`]
/// reads them, and last the database's now as the statement reads it: what
/// the store decides from a record (expired? how long is left?) it
/// decides at the database's time, in the same statement.
pub(crate) const RECORD: &str = "status, outcome, attempts, created_at, updated_at, expires_at, \
     failures, last_error, fingerprint, token, {now}";

/// Records a failure: the `WHERE` says whose claim.
const FAIL: &str = "UPDATE {t} SET status = :status, token = NULL, outcome = :outcome,
                    failures = failures + 1, last_error = :error,
                    updated_at = {now}, expires_at = {until}";

/// Records `:outcome` under the claim this transaction holds.
const COMPLETE_TX: &str = "UPDATE {t} SET status = 'completed', token = NULL, outcome = :outcome,
                                   updated_at = {now}, expires_at = {until}
                           WHERE handler = :handler AND {key} = :key";

/// Set before the dedup row sent with the `COMMIT` ([`WithCommit::savepoint`](super::WithCommit)).
pub(crate) const DEDUP_ROW_SAVEPOINT: &str = "SAVEPOINT idem_dedup_row";

/// Undoes the failed insert of a dedup row sent with the `COMMIT`, keeping
/// the body's writes.
pub(crate) const BACK_BEFORE_DEDUP_ROW: &str = "ROLLBACK TO SAVEPOINT idem_dedup_row";

/// The record of `:handler`, `:key`.
const SELECT: &str = "SELECT {record} FROM {t} WHERE handler = :handler AND {key} = :key";

/// Renders `template` for dialect `D` on `table` (validated by the
/// caller): `{t}` is the table, `{key}` the key column as `D` names it
/// (`key` is reserved in MySQL), `{record}` the columns of a record
/// ([`RECORD`]), `{now}`, `{until}` and `{since}` the database's time (see
/// the module's page), `:name` a parameter.
pub(crate) fn render<D: Dialect>(table: &str, template: &str) -> Statement {
    Statement::new(D::PLACEHOLDERS, &expand::<D>(table, template))
}

/// `template` with its `{t}`, `{key}` and `{record}` written out (see
/// [`render`]).
fn expand<D: Dialect>(table: &str, template: &str) -> String {
    template
        .replace("{record}", RECORD)
        .replace("{until}", "({now} + :hold)")
        .replace("{since}", "({now} - :ttl)")
        .replace("{now}", &format!("({} + :shift)", D::NOW))
        .replace("{key}", D::KEY)
        .replace("{t}", table)
}

impl Statements {
    /// The statements of dialect `D` on `table` (validated by the caller).
    pub(crate) fn new<D: Dialect>(table: &str) -> Statements {
        let render = |template: &str| render::<D>(table, template);
        let take = |row: NewRow| {
            let (insert, take_over) = D::take(row);
            Take {
                insert: render(&insert),
                take_over: take_over.as_deref().map(render),
            }
        };
        let token_holds = "handler = :handler AND {key} = :key AND token = :token
                           AND status = 'in_progress'";
        // A claim whose stall was counted as the last failure keeps its
        // token: should its body finish after all, its outcome (or failure)
        // is still recorded.
        let token_settles = "handler = :handler AND {key} = :key AND token = :token
                             AND status IN ('in_progress', 'retry')";
        Statements {
            table: table.to_owned(),
            create: D::create(table).into(),
            claim: take(CLAIMED),
            claim_with_outcome: take(COMPLETED),
            claim_with_failure: take(FAILED),
            claim_with_commit: D::WITH_COMMIT.map(|with| {
                let savepoint = if with.savepoint {
                    format!("{DEDUP_ROW_SAVEPOINT}; ")
                } else {
                    String::new()
                };
                let message = format!(
                    "{savepoint}INSERT INTO {{t}} ({COLUMNS}) VALUES {}; COMMIT; BEGIN",
                    inserted(COMPLETED)
                );
                Inline::new(&expand::<D>(table, &message), with.literals)
            }),
            select: render(SELECT),
            select_latest: render(&format!("{SELECT}{}", D::LATEST_READ)),
            complete_tx: render(COMPLETE_TX),
            complete_lease: render(&format!(
                "UPDATE {{t}} SET status = 'completed', token = NULL, outcome = :outcome,
                                  updated_at = {{now}}, expires_at = {{until}}
                 WHERE {token_settles}"
            )),
            fail_lease: render(&format!("{FAIL} WHERE {token_settles}")),
            fail_tx: render(&format!(
                "{FAIL} WHERE handler = :handler AND {{key}} = :key"
            )),
            settle_ran_out: render(&format!(
                "UPDATE {{t}} SET status = 'retry', failures = failures + 1,
                                  last_error = '{}', updated_at = {{now}}, expires_at = {{until}}
                 WHERE handler = :handler AND {{key}} = :key
                   AND status = 'in_progress' AND expires_at <= {{now}}
                   AND expires_at > {{since}}",
                crate::store::LEASE_RAN_OUT
            )),
            release: render(&format!("DELETE FROM {{t}} WHERE {token_holds}")),
            extend: render(&format!(
                "UPDATE {{t}} SET updated_at = {{now}}, expires_at = {{until}} WHERE {token_holds}"
            )),
            sweep: render(&D::sweep()),
            count: render("SELECT COUNT(*) FROM {t}"),
            columns: render(&D::columns(table)),
            upgrades: D::ADDED_COLUMNS
                .iter()
                .map(|(column, ty)| {
                    let add = format!("ALTER TABLE {{t}} ADD COLUMN {column} {ty}");
                    (*column, render(&add))
                })
                .collect(),
            batch: super::batch::BatchStatements::new::<D>(table),
        }
    }
}

/// The upsert SQLite and PostgreSQL share: inserts `row`, or takes over a
/// row a claim may take ([`claimable`]), carrying over what
/// [`take_over_assignments`] says; any other row is left alone and the
/// statement affects nothing.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) fn insert_or_take_over(row: NewRow) -> String {
    format!(
        "INSERT INTO {{t}} AS cur ({COLUMNS}) VALUES {values}
         ON CONFLICT (handler, {{key}}) DO UPDATE SET {assignments}
         WHERE {claimable}",
        values = inserted(row),
        assignments = take_over_assignments("cur.", row),
        claimable = claimable("cur.", row.fingerprint),
    )
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
