//! What differs between the SQL databases: the [`Dialect`] trait, which
//! sqlx's database types implement in the store's modules
//! ([`sqlx::Sqlite`] in `sqlite.rs` beside this file, and so on).
//!
//! A dialect says how its statements are written, how a claim's transaction
//! begins, and what its errors mean. Everything else, the claim loop,
//! transaction mode, record decoding, expiry, is written once in
//! [`super::SqlStore`].

use super::exec::Exec;
use super::partitions::{PartitionedSql, Partitions, Upkeep};
use super::rows::NewRow;
use super::template::{Literals, Placeholders};
use crate::error::Contention;

/// A [`Dialect`] of a database server (PostgreSQL, MySQL/MariaDB), whose
/// store takes a lock timeout, a [`ClaimOrder`](super::ClaimOrder) and a
/// [`RoundTrips`](super::RoundTrips) (`with_lock_timeout`,
/// `with_claim_order`, `with_round_trips` on
/// [`SqlStore`](super::SqlStore)). SQLite's is not one: its store learns
/// the lock timeout from its connections and sends every statement apart.
/// Like [`Dialect`], it cannot be implemented outside this crate.
pub trait ServerDialect: Dialect {}

/// The SQL databases a [`SqlStore`](super::SqlStore) runs on: implemented
/// for sqlx's [`Sqlite`](sqlx::Sqlite), [`Postgres`](sqlx::Postgres) and
/// [`MySql`](sqlx::MySql). It can be named as a bound, but not implemented
/// outside this crate: its items use types this crate does not export.
pub trait Dialect: Exec {
    /// The store's name, as written in `store = "..."`.
    const STORE: &'static str;

    /// How statements write their parameters.
    const PLACEHOLDERS: Placeholders;

    /// The database's clock as an SQL expression: milliseconds since the
    /// Unix epoch (UTC, whatever the session's time zone), as an integer,
    /// the same everywhere in one statement. Every lease and expiry is
    /// computed from it in the statement itself (`{now}` in a template), so
    /// that consumers whose clocks disagree agree on them.
    const NOW: &'static str;

    /// The `key` column as statements name it.
    const KEY: &'static str;

    /// The longest handler name the table holds, in bytes.
    const MAX_HANDLER_LEN: usize;

    /// The statement that opens a transaction-mode call's transaction, when
    /// not sqlx's plain `BEGIN`.
    const BEGIN: Option<&'static str>;

    /// What a transaction-mode call's transaction sets up for the call,
    /// sent in the transaction right after its `BEGIN` (so that sqlx counts
    /// the transaction open before the session changes: a call dropped from
    /// then on leaves a `ROLLBACK` queued), when anything.
    const CALL_SESSION: Option<&'static str> = None;

    /// How a transaction-mode call's transaction ends when its
    /// [`CALL_SESSION`](Self::CALL_SESSION) set the session up for the call
    /// and the end sets it back; `None` ends it with sqlx's `COMMIT` and
    /// `ROLLBACK`.
    const END: Option<TxEnd> = None;

    /// The statement that opens a sweep's transaction, when a sweep needs
    /// one; `None` runs it on its own.
    const SWEEP_BEGIN: Option<&'static str>;

    /// What a read of the record after a lost claim appends so that it sees
    /// the latest committed row, not the transaction's snapshot: empty where
    /// every statement reads the latest (PostgreSQL's `READ COMMITTED`,
    /// SQLite's single writer); `LOCK IN SHARE MODE` on InnoDB, whose
    /// `REPEATABLE READ` would otherwise answer from the snapshot of the
    /// body's first read (claiming last), older than the row that beat it.
    const LATEST_READ: &'static str;

    /// How a claim-last dedup row travels in the `COMMIT`'s message, when
    /// the store sends it so ([`RoundTrips::Merged`](super::RoundTrips)):
    /// `None` where the store always sends it on its own.
    const WITH_COMMIT: Option<WithCommit> = None;

    /// The columns later releases added to the table of the first release:
    /// the schema version that added each, its name and its type. `migrate`
    /// adds those a table lacks.
    const ADDED_COLUMNS: &'static [(u32, &'static str, &'static str)];

    /// A batch's rows as a table `r` with the text columns `k` (key), `f`
    /// (fingerprint), `o` (outcome) and `t` (token), NULL where a row has
    /// none: bound to `:rows` as a JSON array of objects with those
    /// members, or, where [`ROWS_AS_ARRAYS`](Self::ROWS_AS_ARRAYS), to
    /// `:keys`, `:fingerprints`, `:outcomes` and `:tokens`, one array each
    /// (an empty one where no row has a value).
    const BATCH_ROWS: &'static str;

    /// Whether a batch's rows are bound column by column, as arrays, rather
    /// than as one JSON document: what the database reads with less work
    /// (PostgreSQL: `unnest` of text arrays, against `json_to_recordset`
    /// parsing a document).
    const ROWS_AS_ARRAYS: bool = false;

    /// Whether a batch's updates and deletes reach each row by its place
    /// (PostgreSQL's `ctid`), found by a lookup of its key before the
    /// write; a row another transaction changed while the write waited for
    /// it has then moved and may be passed over, and a write that changed
    /// fewer rows than it was given runs again (see `batch.rs`).
    const REACHES_BY_PLACE: bool = false;

    /// Whether `column` holds one of the batch's keys: a condition the
    /// database answers from the primary key's index, one lookup per key,
    /// whatever the size of the table.
    fn in_batch(column: &str) -> String;

    /// Reads `columns` of the table's rows, as `cur`, of the batch's rows
    /// `r` matched on `:handler` and the key, where `condition` holds.
    fn select_from_rows(columns: &str, condition: &str) -> String {
        format!(
            "SELECT {columns} FROM {{t}} AS cur JOIN {}
               ON cur.handler = :handler AND {} AND cur.{{key}} = r.k
             WHERE {condition}",
            Self::BATCH_ROWS,
            Self::in_batch("cur.{key}")
        )
    }

    /// Reads `columns` of the table's rows, as `cur`, of `:handler` and the
    /// batch's keys: what a batch's read of its records runs.
    fn select_keys(columns: &str) -> String {
        Self::select_from_rows(columns, "TRUE")
    }

    /// Inserts what `select` yields into the table (in the order of the
    /// columns claims insert), leaving every row that stands alone: the
    /// statement affects as many rows as it inserted.
    fn insert_ignoring(select: &str) -> String;

    /// Updates the table, as `cur`, from the batch's rows `r` matched on
    /// `:handler` and the key: `assignments` where `condition` holds.
    fn update_from_rows(assignments: &str, condition: &str) -> String;

    /// Deletes, from the table as `cur`, the rows of the batch's rows `r`
    /// matched on `:handler` and the key where `condition` holds.
    fn delete_from_rows(condition: &str) -> String;

    /// Creates the table `table` and its expiry index if they do not exist
    /// (one or more statements, no parameters), as this release writes it.
    fn create(table: &str) -> String;

    /// Creates an offset table (`offsets.rs`), `{t}`, if it does not
    /// exist: one row per consumer, stream and partition, holding the
    /// offset to consume next.
    const OFFSETS_CREATE: &'static str;

    /// The rows of `:consumer` in an offset table: stream, partition (as a
    /// 64-bit integer) and next offset.
    const OFFSETS_LOAD: &'static str;

    /// Writes the row of `:consumer`, `:stream` and `:partition` with
    /// `:next`, moving a row that exists only forward.
    const OFFSETS_UPSERT: &'static str;

    /// Creates an outbox table (`outbox.rs`), `{t}` (`{b}` without its
    /// schema, `{s}` the schema and a dot, or nothing), and its index on
    /// `(lane, seq)`, `{i}`, if they do not exist (one or more statements,
    /// no parameters). Columns: `seq` (the row's place, growing), `id`,
    /// `handler`, `destination`, `msg_key`, `lane` (32 hex digits),
    /// `payload` (bytes), `headers` (JSON), `staged_at` (ms), `attempts`,
    /// `last_error`.
    const OUTBOX_CREATE: &'static str;

    /// The `seq`s bound to `:rows`, a JSON array of integers, as a
    /// subquery: `seq IN <this>`.
    const OUTBOX_SEQS: &'static str;

    /// Deletes the rows of the `seq`s bound to `:rows` (`{seqs}` is
    /// [`OUTBOX_SEQS`](Self::OUTBOX_SEQS)).
    const OUTBOX_REMOVE: &'static str = "DELETE FROM {t} WHERE seq IN {seqs}";

    /// Whether a relay checks again, in a statement of its own, that the
    /// rows it locked still head their lanes: where the locking read's
    /// subquery reads an older snapshot than the rows it locks (InnoDB),
    /// a row of the lane committed meanwhile would not keep a later one
    /// back.
    const OUTBOX_RECHECK: bool = false;

    /// What a relay's read of the rows it publishes appends: a lock that
    /// other relays skip (`FOR UPDATE SKIP LOCKED`), where the database
    /// has one; empty elsewhere.
    const OUTBOX_LOCK: &'static str;

    /// Whether a relay holds the rows it publishes, locked in a
    /// transaction, until it deletes them: so that two relays never
    /// publish one row at once. SQLite's single writer would stop every
    /// handler while a relay waits on its broker: there a relay reads the
    /// rows, publishes them and deletes them in statements of their own.
    const OUTBOX_HOLDS: bool;

    /// The statement that opens a relay's transaction, when not sqlx's
    /// plain `BEGIN`.
    const RELAY_BEGIN: Option<&'static str> = None;

    /// The SQL of a table partitioned by time ([`Partitions`]), where the
    /// database has partitions (`None` elsewhere). Claims on such a table
    /// insert, then take over a claimable row with an `UPDATE`, as the
    /// claims of a dialect whose [`take`](Self::take) has two statements.
    const PARTITIONED: Option<fn(&str, Partitions) -> PartitionedSql> = None;

    /// Where the database has partitions, how a store opened without them
    /// sweeps a table that may have been partitioned since (the `Upkeep` of `partitions.rs`):
    /// by the table's own function when it is, with a `DELETE` otherwise.
    const UPKEEP: Option<fn(&str) -> Upkeep> = None;

    /// Lists the names of `table`'s columns, one per row (no parameters;
    /// `table` is a validated identifier, safe to write as a literal).
    fn columns(table: &str) -> String;

    /// How a claim takes a key and writes `row`: the insert and, for a
    /// database whose insert cannot take over an expired row by itself, the
    /// takeover of an expired row.
    /// Templates: `{t}` is the table, `{key}` the key column, `:name` a
    /// parameter.
    fn take(row: NewRow) -> (String, Option<String>);

    /// Deletes at most `:batch` rows expired at `{now}`, oldest first, without
    /// waiting on rows that claims hold where the database allows (a
    /// template, as for [`take`](Self::take)).
    fn sweep() -> String;

    /// What a database error means to the store.
    fn fault(error: &dyn sqlx::error::DatabaseError) -> Fault;

    /// The contention `error` reports, when it is this database's (its
    /// driver's error type) and says a statement met contention in its
    /// transaction: what [`TxStore::contention`](crate::store::TxStore::contention)
    /// answers for a body's error.
    fn contention(error: &dyn sqlx::error::DatabaseError) -> Option<Contention>;

    /// How many rows a statement wrote (for an `UPDATE`, matched).
    fn rows_affected(done: &Self::QueryResult) -> u64;
}

/// What a dialect needs to send a transaction-mode dedup row in the
/// message of the `COMMIT`: see [`Dialect::WITH_COMMIT`].
#[derive(Debug, Clone, Copy)]
pub struct WithCommit {
    /// Whether the message sets a savepoint before its dedup `INSERT`,
    /// which fails ([`Fault::Unique`]) when a record of the key stands:
    /// rolling back to it keeps the body's writes, and the claim goes on as
    /// a statement of its own. Not needed where a failed statement undoes
    /// only itself and leaves the transaction usable (MySQL).
    pub savepoint: bool,
    /// How values are written into the message.
    pub literals: Literals,
}

/// The texts that end a transaction-mode call's transaction and set the
/// session back to what it was before the call's `BEGIN`: see
/// [`Dialect::END`]. Each is sent through the text protocol, in one round
/// trip.
#[derive(Debug, Clone, Copy)]
pub struct TxEnd {
    /// Commits the transaction and restores the session.
    pub commit: &'static str,
    /// Rolls the transaction back and restores the session.
    pub rollback: &'static str,
}

/// A database error, as the store acts on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// The statement gave up waiting on a row another transaction holds:
    /// someone is working on the key right now (`InProgress`).
    LockWait,
    /// The transaction was chosen as a deadlock victim and rolled back by the
    /// server: nothing of it remains, and running it again is safe.
    Deadlock,
    /// The statement gave up waiting on a lock of the whole database
    /// (SQLite): a timeout, saying nothing about the key.
    Busy,
    /// A table is missing: the one named (as the database reports it).
    MissingTable(String),
    /// A column is missing: a table of an earlier release, not migrated.
    MissingColumn,
    /// An `INSERT` met a row of the same key: the dedup `INSERT` sent
    /// with the `COMMIT` found a record standing ([`WithCommit`]), or the
    /// `COMMIT` itself found a deferred unique constraint of the body's
    /// tables violated. Nothing after it in the message ran.
    Unique,
    /// A statement that needs a transaction found none: the `COMMIT` of a
    /// message failed and ended it.
    NoTransaction,
    /// Anything else.
    Other,
}
