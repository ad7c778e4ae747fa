//! The SQL one store runs, built once per table: the statements of single
//! claims ([`Statements`]) and of batches ([`BatchStatements`]), rendered
//! from templates ([`render`]) for the store's dialect.
//!
//! Values are always bound parameters. The only text spliced into a
//! statement is the table name, which
//! [`validate_table_name`](super::table::validate_table_name) restricted to
//! letters, digits, `_` and one `.`, and the dialect's fixed expression of
//! its own clock ([`Dialect::NOW`]).
//!
//! Time is the database's: a template writes `{now}` (the database's clock
//! in ms since the epoch, plus `:shift`, which is 0 outside tests),
//! `{until}` (`{now}` plus `:hold`, the lease or the ttl) and `{since}`
//! (`{now}` less `:ttl`). No time computed by the consumer is ever bound,
//! so consumers whose clocks disagree still agree on every lease and
//! expiry.

use std::sync::Arc;

use super::dialect::Dialect;
use super::outbox::OutboxSql;
use super::partitions::Partitions;
use super::rows::{
    CLAIMED, COLUMNS, COMPLETED, FAILED, NewRow, RECORD, claimable, inserted,
    take_over_assignments, values_of,
};
use super::template::{Inline, Statement};
use crate::store::LEASE_RAN_OUT;

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

/// A claim in two statements, for a database whose insert cannot take
/// over a standing row by itself (MySQL), or may not (a partitioned
/// table, whose insert trigger moves the row it meets): an insert that
/// leaves a standing row alone, and an `UPDATE` that takes it over if a
/// claim may ([`claimable`]).
pub(crate) fn insert_then_take_over<D: Dialect>(row: NewRow) -> (String, Option<String>) {
    (
        D::insert_ignoring(&format!("VALUES {}", inserted(row))),
        Some(format!(
            "UPDATE {{t}} SET {}
             WHERE handler = :handler AND {{key}} = :key AND {}",
            take_over_assignments("", row),
            claimable("", row.fingerprint)
        )),
    )
}

/// How a sweep removes expired records.
#[derive(Debug)]
pub(crate) enum Sweeping {
    /// A `DELETE` of at most `:batch` expired rows: as many as it affected.
    Delete(Statement),
    /// A call of a partitioned table's maintenance function, which answers
    /// how many rows it removed.
    Maintain(Statement),
    /// A store opened without partitions, on a database that has them:
    /// `Maintain` when `partitioned` answers 1 (the table was partitioned
    /// since), `Delete` otherwise.
    Either {
        partitioned: Statement,
        maintain: Statement,
        delete: Statement,
    },
}

/// The SQL of one store, built once from a validated table name.
#[derive(Debug)]
pub(crate) struct Statements {
    pub(crate) table: String,
    /// Creates the table and its expiry index, and the outbox table
    /// beside it (several statements, no parameters).
    pub(crate) create: Arc<str>,
    /// The outbox table's SQL.
    pub(crate) outbox: Arc<OutboxSql>,
    /// Takes an absent or expired key as `in_progress` ([`CLAIMED`]).
    pub(crate) claim: Take,
    /// Takes an absent or expired key as `completed` ([`COMPLETED`]).
    pub(crate) claim_with_outcome: Take,
    /// Takes an absent or expired key as `failed` ([`FAILED`]).
    pub(crate) claim_with_failure: Take,
    /// A savepoint (where the dialect sets one), the insert of a new
    /// `completed` row, `COMMIT` and `BEGIN` (or the dialect's own end of
    /// the transaction, [`Dialect::END`]), in one message with its
    /// values written in; failing ([`Fault::Unique`](super::Fault)), and
    /// committing nothing, when a record of the key stands. `None` where
    /// the dialect sends no dedup row with the `COMMIT`
    /// ([`Dialect::WITH_COMMIT`]).
    pub(crate) claim_with_commit: Option<Inline>,
    /// The dialect's session statement for a call
    /// ([`Dialect::CALL_SESSION`]) and `select`, in one message with the
    /// values written in: the read before the body of
    /// [`ClaimOrder::Checked`](super::ClaimOrder::Checked) riding on a
    /// round trip the call makes anyway, in
    /// [`RoundTrips::Merged`](super::RoundTrips::Merged). `None` where the
    /// dialect has no such statement or writes no values in
    /// ([`Dialect::WITH_COMMIT`]).
    pub(crate) session_select: Option<Inline>,
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
    /// claim whose stall was counted as the last failure), keeping the
    /// token in the completed row: a completion retried with it reads back
    /// that it recorded.
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
    /// Removes expired rows: at most `:batch` expired at `{now}`, or, on a
    /// partitioned table, one step of its upkeep.
    pub(crate) sweep: Sweeping,
    /// Counts the rows.
    pub(crate) count: Statement,
    /// The names of the table's columns.
    pub(crate) columns: Statement,
    /// The statements that add each column a table of an earlier release
    /// lacks: (the schema version that added it, column, statement).
    pub(crate) upgrades: Vec<(u32, &'static str, Statement)>,
    /// The statements of batches.
    pub(crate) batch: BatchStatements,
}

/// Records a failure: the `WHERE` says whose claim.
const FAIL: &str = "UPDATE {t} SET status = :status, token = NULL, outcome = :outcome,
                    failures = failures + 1, last_error = :error, traceparent = :trace,
                    updated_at = {now}, expires_at = {until}";

/// Which row a claiming-first transaction holds: its claim, `in_progress`
/// without a token (a lease's has one). Not the row the claim took over: if
/// the database ended the transaction (InnoDB rolls a deadlock victim back
/// whole), that row is back, committed, and must not be written as if the
/// claim held.
const HELD_BY_TX: &str =
    "handler = :handler AND {key} = :key AND status = 'in_progress' AND token IS NULL";

/// Records `:outcome` under the claim this transaction holds.
const COMPLETE_TX: &str = "UPDATE {t} SET status = 'completed', token = NULL, outcome = :outcome,
                                   traceparent = :trace, updated_at = {now}, expires_at = {until}
                           WHERE ";

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
    /// The statements of dialect `D` on `table` (validated by the caller),
    /// partitioned as `partitions` says where the dialect has partitions.
    pub(crate) fn new<D: Dialect>(table: &str, partitions: Option<Partitions>) -> Statements {
        let render = |template: &str| render::<D>(table, template);
        let partitioned = partitions.and_then(|p| D::PARTITIONED.map(|sql| sql(table, p)));
        let take = |row: NewRow| {
            let (insert, take_over) = match partitioned {
                Some(_) => insert_then_take_over::<D>(row),
                None => D::take(row),
            };
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
        let outbox = OutboxSql::new::<D>(table);
        Statements {
            table: table.to_owned(),
            create: match &partitioned {
                Some(sql) => format!("{}; {}", sql.create, outbox.create).into(),
                None => format!("{}; {}", D::create(table), outbox.create).into(),
            },
            outbox: Arc::new(outbox),
            claim: take(CLAIMED),
            claim_with_outcome: take(COMPLETED),
            claim_with_failure: take(FAILED),
            claim_with_commit: D::WITH_COMMIT.map(|with| {
                let savepoint = if with.savepoint {
                    format!("{DEDUP_ROW_SAVEPOINT}; ")
                } else {
                    String::new()
                };
                // The `BEGIN` after sqlx's `COMMIT` leaves the connection
                // where sqlx believes it is, in a transaction (whose
                // `ROLLBACK` of nothing sqlx sends when the transaction is
                // dropped); a dialect's own end leaves none, and its
                // `ROLLBACK` of nothing is silent.
                let end = D::END.map_or("COMMIT; BEGIN", |end| end.commit);
                let message = format!(
                    "{savepoint}INSERT INTO {{t}} ({COLUMNS}) VALUES {}; {end}",
                    inserted(COMPLETED)
                );
                Inline::new(&expand::<D>(table, &message), with.literals)
            }),
            session_select: D::CALL_SESSION.zip(D::WITH_COMMIT).map(|(session, with)| {
                Inline::new(
                    &expand::<D>(table, &format!("{session}; {SELECT}")),
                    with.literals,
                )
            }),
            select: render(SELECT),
            select_latest: render(&format!("{SELECT}{}", D::LATEST_READ)),
            complete_tx: render(&format!("{COMPLETE_TX}{HELD_BY_TX}")),
            complete_lease: render(&format!(
                "UPDATE {{t}} SET status = 'completed', outcome = :outcome, traceparent = :trace,
                                  updated_at = {{now}}, expires_at = {{until}}
                 WHERE {token_settles}"
            )),
            fail_lease: render(&format!("{FAIL} WHERE {token_settles}")),
            fail_tx: render(&format!("{FAIL} WHERE {HELD_BY_TX}")),
            settle_ran_out: render(&format!(
                "UPDATE {{t}} SET status = 'retry', failures = failures + 1,
                                  last_error = '{}', updated_at = {{now}}, expires_at = {{until}},
                                  max_attempts = :max
                 WHERE handler = :handler AND {{key}} = :key
                   AND status = 'in_progress' AND expires_at <= {{now}}
                   AND expires_at > {{since}}",
                LEASE_RAN_OUT
            )),
            release: render(&format!("DELETE FROM {{t}} WHERE {token_holds}")),
            extend: render(&format!(
                "UPDATE {{t}} SET updated_at = {{now}}, expires_at = {{until}} WHERE {token_holds}"
            )),
            sweep: match (&partitioned, D::UPKEEP) {
                (Some(sql), _) => Sweeping::Maintain(render(&sql.sweep)),
                (None, Some(upkeep)) => {
                    let upkeep = upkeep(table);
                    Sweeping::Either {
                        partitioned: render(&upkeep.partitioned),
                        maintain: render(&upkeep.sweep),
                        delete: render(&D::sweep()),
                    }
                }
                (None, None) => Sweeping::Delete(render(&D::sweep())),
            },
            count: render("SELECT COUNT(*) FROM {t}"),
            columns: render(&D::columns(table)),
            upgrades: D::ADDED_COLUMNS
                .iter()
                .map(|(version, column, ty)| {
                    let add = format!("ALTER TABLE {{t}} ADD COLUMN {column} {ty}");
                    (*version, *column, render(&add))
                })
                .collect(),
            batch: BatchStatements::new::<D>(table),
        }
    }
}

/// A claim in progress, one per batch row: its fingerprint is the row's,
/// its token the batch's (`:token`).
const BATCH_CLAIMED: NewRow = NewRow {
    fingerprint: "r.f",
    ..CLAIMED
};

/// A dedup row written with its outcome, one per batch row, marked with
/// the batch's token (`:token`).
const BATCH_COMPLETED: NewRow = NewRow {
    token: ":token",
    outcome: "r.o",
    fingerprint: "r.f",
    ..COMPLETED
};

/// The batch statements of one store, built once per table.
#[derive(Debug)]
pub(crate) struct BatchStatements {
    /// The records of the batch's keys: handler, key and the record's
    /// columns.
    pub(crate) select: Statement,
    /// As `select`, reading the latest committed rows inside a
    /// transaction ([`Dialect::LATEST_READ`]).
    pub(crate) select_latest: Statement,
    /// Inserts every row as a claim in progress.
    pub(crate) insert_claims: Statement,
    /// Inserts every row completed, with its outcome.
    pub(crate) insert_completed: Statement,
    /// Completes the claims the rows' tokens hold, keeping the tokens.
    pub(crate) complete: Statement,
    /// Moves the end of the leases the rows' tokens hold.
    pub(crate) extend: Statement,
    /// Deletes the claims the rows' tokens hold.
    pub(crate) release: Statement,
    /// The keys whose row the row's token holds with status `:status`.
    pub(crate) held: Statement,
}

impl BatchStatements {
    pub(crate) fn new<D: Dialect>(table: &str) -> Self {
        let render = |template: &str| render::<D>(table, template);
        let rows = D::BATCH_ROWS;
        let insert = |row: NewRow| {
            render(&D::insert_ignoring(&format!(
                "SELECT {} FROM {rows} WHERE r.k IS NOT NULL",
                values_of(row, "r.k")
            )))
        };
        let select = D::select_keys("cur.handler, cur.{key}, {record}");
        BatchStatements {
            select_latest: render(&format!("{select}{}", D::LATEST_READ)),
            select: render(&select),
            insert_claims: insert(BATCH_CLAIMED),
            insert_completed: insert(BATCH_COMPLETED),
            complete: render(&D::update_from_rows(
                "status = 'completed', outcome = r.o, traceparent = :trace,
                 updated_at = {now}, expires_at = {until}",
                "cur.token = r.t AND cur.status IN ('in_progress', 'retry')",
            )),
            extend: render(&D::update_from_rows(
                "updated_at = {now}, expires_at = {until}",
                "cur.token = r.t AND cur.status = 'in_progress'",
            )),
            release: render(&D::delete_from_rows(
                "cur.token = r.t AND cur.status = 'in_progress'",
            )),
            held: render(&D::select_from_rows(
                "cur.{key}",
                "cur.token = r.t AND cur.status = :status",
            )),
        }
    }
}
