//! The dedup row in SQL: its columns, what a claim writes into the row it
//! takes ([`NewRow`]), and when a claim may take a standing row and what it
//! carries over from it: the claim rules of `store/rules.rs`, written as
//! SQL fragments the dialects' claim statements are built from.

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
    /// The `traceparent` column: the execution that settled the row
    /// (`:trace`), `NULL` for a claim in progress.
    pub trace: &'static str,
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
    trace: "NULL",
};

/// A claim written with its outcome (transaction mode claiming last).
pub(crate) const COMPLETED: NewRow = NewRow {
    status: "'completed'",
    token: "NULL",
    outcome: ":outcome",
    failures: "0",
    last_error: "NULL",
    fingerprint: ":fingerprint",
    trace: ":trace",
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
    trace: ":trace",
};

/// The columns of the dedup table, in the order claims insert them. Every
/// claim writes the handler's `max_attempts` (`:max`, NULL without it).
pub(crate) const COLUMNS: &str = "handler, {key}, status, token, outcome, attempts, failures, \
     last_error, fingerprint, created_at, updated_at, expires_at, max_attempts, traceparent";

/// The columns of a record, in the order [`super::exec::Exec::fetch`]
/// reads them, and last the database's now as the statement reads it: what
/// the store decides from a record (expired? how long is left?) it
/// decides at the database's time, in the same statement.
pub(crate) const RECORD: &str = "status, outcome, attempts, created_at, updated_at, expires_at, \
     failures, last_error, fingerprint, token, max_attempts, traceparent, {now}";

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
        trace,
    } = row;
    format!(
        ":handler, {key}, {status}, {token}, {outcome}, 1, {failures}, {last_error}, \
          {fingerprint}, {{now}}, {{now}}, {{until}}, :max, {trace}"
    )
}

/// Whether a standing row, its columns read through `cur` (`"cur."`, or
/// `""` in an `UPDATE` of the row itself), may be taken by this claim: it
/// has expired (unless it is a stalled claim whose failure would be the
/// last one allowed, see [`Standing::of_ran_out`](crate::store::Standing::of_ran_out)),
/// or its last delivery failed with attempts left and the same payload
/// (the delivery's fingerprint is the SQL `fingerprint`: `:fingerprint`,
/// or a batch row's column). [`Standing::of`](crate::store::Standing::of) is the
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
        trace,
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
         created_at = {{now}}, updated_at = {{now}}, expires_at = {{until}}, max_attempts = :max,
         traceparent = {trace}"
    )
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
