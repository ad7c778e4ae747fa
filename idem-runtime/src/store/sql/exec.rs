//! What the store needs of a sqlx driver, stated once.
//!
//! sqlx's drivers share their traits, so the store's execution could be
//! generic over any `DB: Database`; but Rust does not carry the bounds that
//! takes (the connection is an `Executor`, text and integers bind and
//! decode) from one generic item to the next, so every generic impl would
//! repeat them. Instead they are written once, on the blanket impl of
//! [`Exec`] below, whose methods bind a [`Statement`]'s parameters, runs it and
//! decodes what it returns; the store asks only for `D: Dialect`, which
//! implies `Exec`.
//!
//! Every call takes a connection (`&mut *pool::acquire(&pool).await?`, or
//! `&mut *tx`), so no bound on the pool's own executor is needed either.

use std::future::Future;

use sqlx::{ColumnIndex, Database, Decode, Encode, Executor, IntoArguments, Row, Type};

use super::template::{Param, Statement, Values};
use crate::outbox::Outgoing;
use crate::store::{Record, Status};

/// Binds, runs and decodes the store's statements on a database.
pub trait Exec: Database {
    /// `statement` with its parameters bound from `values`.
    fn query<'q>(
        statement: &'q Statement,
        values: &Values<'_>,
    ) -> sqlx::query::Query<'q, Self, Self::Arguments>;

    /// Runs `statement` with `values`.
    fn run<'a>(
        conn: &'a mut Self::Connection,
        statement: &'a Statement,
        values: &'a Values<'a>,
    ) -> impl Future<Output = Result<Self::QueryResult, sqlx::Error>> + Send + 'a;

    /// The record `statement` (the store's `select`) finds for
    /// `values.handler` and `values.key`, with the database's now.
    fn fetch<'a>(
        conn: &'a mut Self::Connection,
        statement: &'a Statement,
        values: &'a Values<'a>,
    ) -> impl Future<Output = Result<Option<Found>, sqlx::Error>> + Send + 'a;

    /// The record the last statement of `message` (statements of this
    /// crate with their values written in, ending with the store's
    /// `select`) finds for `values.handler` and `values.key`, read through
    /// the text protocol in one round trip.
    fn fetch_message<'a>(
        conn: &'a mut Self::Connection,
        message: sqlx::AssertSqlSafe<String>,
        values: &'a Values<'a>,
    ) -> impl Future<Output = Result<Option<Found>, sqlx::Error>> + Send + 'a;

    /// Runs `sql`, a statement of this crate without parameters, through
    /// the text protocol (unprepared).
    fn run_text<'a>(
        conn: &'a mut Self::Connection,
        sql: &'static str,
    ) -> impl Future<Output = Result<Self::QueryResult, sqlx::Error>> + Send + 'a;

    /// Runs `message`, one or more statements of this crate with their
    /// values written in ([`Inline`](super::template::Inline)), through
    /// the text protocol in one round trip.
    fn run_message<'a>(
        conn: &'a mut Self::Connection,
        message: sqlx::AssertSqlSafe<String>,
    ) -> impl Future<Output = Result<Self::QueryResult, sqlx::Error>> + Send + 'a;

    /// The first column of every row `statement` returns, as text.
    fn texts<'a>(
        conn: &'a mut Self::Connection,
        statement: &'a Statement,
    ) -> impl Future<Output = Result<Vec<String>, sqlx::Error>> + Send + 'a;

    /// The one number `statement` returns.
    fn number<'a>(
        conn: &'a mut Self::Connection,
        statement: &'a Statement,
        values: &'a Values<'a>,
    ) -> impl Future<Output = Result<i64, sqlx::Error>> + Send + 'a;

    /// The records `statement` returns: rows of `handler`, the key and the
    /// columns [`fetch`](Self::fetch) reads, in that order.
    fn records<'a>(
        conn: &'a mut Self::Connection,
        statement: &'a Statement,
        values: &'a Values<'a>,
    ) -> impl Future<Output = Result<Vec<Found>, sqlx::Error>> + Send + 'a;

    /// The outbox rows `statement` returns, in the columns of
    /// [`OUTGOING`](super::outbox::OUTGOING), in its order.
    fn outgoing<'a>(
        conn: &'a mut Self::Connection,
        statement: &'a Statement,
        values: &'a Values<'a>,
    ) -> impl Future<Output = Result<Vec<Outgoing>, sqlx::Error>> + Send + 'a;

    /// The rows `statement` returns, each as its first `texts` columns
    /// (text) and the rest (integers or NULL).
    fn cells<'a>(
        conn: &'a mut Self::Connection,
        statement: &'a Statement,
        values: &'a Values<'a>,
        texts: usize,
    ) -> impl Future<Output = Result<Vec<Cells>, sqlx::Error>> + Send + 'a;
}

/// How a database binds a batch's rows column by column (`:keys`,
/// `:fingerprints`, `:outcomes`, `:tokens`): as arrays of text where it has
/// them ([`Dialect::ROWS_AS_ARRAYS`](super::Dialect::ROWS_AS_ARRAYS)).
pub trait BindColumn: Database {
    /// `query` with `column` bound as its next parameter.
    fn bind_column<'q>(
        query: sqlx::query::Query<'q, Self, Self::Arguments>,
        column: &[Option<&str>],
    ) -> sqlx::query::Query<'q, Self, Self::Arguments>;
}

/// A record as a statement read it, with the database's now in that
/// statement: what the store decides from the record, it decides at that
/// time.
#[derive(Debug, Clone)]
pub struct Found {
    /// The record.
    pub record: Record,
    /// The database's now (with the test shift), ms since the epoch.
    pub now: i64,
}

/// A row read by [`Exec::cells`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cells {
    /// The text columns, first.
    pub texts: Vec<String>,
    /// The integer columns, after them.
    pub numbers: Vec<Option<i64>>,
}

/// The record in `row`'s columns from `at` on (the columns of
/// [`RECORD`](super::rows::RECORD), in its order), with the now read
/// after them.
fn record<R: Row>(row: &R, at: usize, handler: &str, key: &str) -> Result<Found, sqlx::Error>
where
    usize: ColumnIndex<R>,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> String: Decode<'r, R::Database> + Type<R::Database>,
{
    let status: String = row.try_get(at)?;
    let status = Status::parse(&status)
        .ok_or_else(|| sqlx::Error::Decode(format!("unknown status {status:?}").into()))?;
    let mut record = Record::new(
        handler,
        key,
        status,
        row.try_get(at + 3)?,
        row.try_get(at + 5)?,
    );
    record.outcome = row.try_get(at + 1)?;
    record.attempts = row.try_get(at + 2)?;
    record.updated_at_ms = row.try_get(at + 4)?;
    record.failures = row.try_get(at + 6)?;
    record.last_error = row.try_get(at + 7)?;
    record.fingerprint = row.try_get(at + 8)?;
    record.token = row.try_get(at + 9)?;
    let max: Option<i64> = row.try_get(at + 10)?;
    record.max_attempts = max
        .map(u32::try_from)
        .transpose()
        .map_err(|_| sqlx::Error::Decode(format!("max_attempts {max:?} out of range").into()))?;
    record.trace = row.try_get(at + 11)?;
    Ok(Found {
        record,
        now: row.try_get(at + 12)?,
    })
}

/// Column `at` of `row` as text, whatever its type says: MySQL's `handler`
/// and `key` are `VARBINARY` (compared byte for byte), which sqlx's type
/// check refuses for `String`, though they hold the UTF-8 text the store
/// wrote. The decoding itself still refuses bytes that are not UTF-8.
fn text<R: Row>(row: &R, at: usize) -> Result<String, sqlx::Error>
where
    usize: ColumnIndex<R>,
    for<'r> String: Decode<'r, R::Database>,
{
    row.try_get_unchecked(at)
}

impl<DB> Exec for DB
where
    DB: Database + BindColumn,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> Option<&'q str>: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB>,
    for<'q> &'q [u8]: Encode<'q, DB> + Type<DB>,
    for<'r> Vec<u8>: Decode<'r, DB> + Type<DB>,
    for<'q> i32: Encode<'q, DB> + Type<DB>,
    for<'q> Option<i64>: Encode<'q, DB> + Type<DB>,
    for<'r> i64: Decode<'r, DB> + Type<DB>,
    for<'r> String: Decode<'r, DB> + Type<DB>,
    usize: ColumnIndex<DB::Row>,
{
    fn query<'q>(
        statement: &'q Statement,
        values: &Values<'_>,
    ) -> sqlx::query::Query<'q, DB, DB::Arguments> {
        let mut query = sqlx::query(statement.sql());
        for param in statement.params() {
            query = match param {
                Param::Handler => query.bind(values.handler),
                Param::Key => query.bind(values.key),
                Param::Token => query.bind(values.token),
                Param::Outcome => query.bind(values.outcome),
                Param::Shift => query.bind(values.shift),
                Param::Hold => query.bind(values.hold),
                Param::Batch => query.bind(values.batch),
                Param::Fingerprint => query.bind(values.fingerprint),
                Param::Max => query.bind(values.max),
                Param::Status => query.bind(values.status),
                Param::Error => query.bind(values.error),
                Param::Trace => query.bind(values.trace),
                Param::Ttl => query.bind(values.ttl),
                Param::Rows => query.bind(values.rows),
                Param::Keys => DB::bind_column(query, values.keys),
                Param::Fingerprints => DB::bind_column(query, values.fingerprints),
                Param::Outcomes => DB::bind_column(query, values.outcomes),
                Param::Tokens => DB::bind_column(query, values.tokens),
                Param::Consumer => query.bind(values.consumer),
                Param::Stream => query.bind(values.stream),
                Param::Partition => query.bind(values.partition),
                Param::Next => query.bind(values.next),
                Param::Id => query.bind(values.id),
                Param::Destination => query.bind(values.destination),
                Param::Msgkey => query.bind(values.msgkey),
                Param::Lane => query.bind(values.lane),
                Param::Payload => query.bind(values.payload),
                Param::Headers => query.bind(values.headers),
                Param::Seq => query.bind(values.seq),
            };
        }
        query
    }

    fn run<'a>(
        conn: &'a mut DB::Connection,
        statement: &'a Statement,
        values: &'a Values<'a>,
    ) -> impl Future<Output = Result<DB::QueryResult, sqlx::Error>> + Send + 'a {
        Self::query(statement, values).execute(conn)
    }

    async fn fetch<'a>(
        conn: &'a mut DB::Connection,
        statement: &'a Statement,
        values: &'a Values<'a>,
    ) -> Result<Option<Found>, sqlx::Error> {
        let Some(row) = Self::query(statement, values).fetch_optional(conn).await? else {
            return Ok(None);
        };
        record(&row, 0, values.handler, values.key).map(Some)
    }

    async fn fetch_message<'a>(
        conn: &'a mut DB::Connection,
        message: sqlx::AssertSqlSafe<String>,
        values: &'a Values<'a>,
    ) -> Result<Option<Found>, sqlx::Error> {
        // Every result read, to the message's end: the statements before
        // the read return none.
        let rows = sqlx::raw_sql(message).fetch_all(conn).await?;
        rows.first()
            .map(|row| record(row, 0, values.handler, values.key))
            .transpose()
    }

    fn run_text<'a>(
        conn: &'a mut DB::Connection,
        sql: &'static str,
    ) -> impl Future<Output = Result<DB::QueryResult, sqlx::Error>> + Send + 'a {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql)).execute(conn)
    }

    fn run_message<'a>(
        conn: &'a mut DB::Connection,
        message: sqlx::AssertSqlSafe<String>,
    ) -> impl Future<Output = Result<DB::QueryResult, sqlx::Error>> + Send + 'a {
        sqlx::raw_sql(message).execute(conn)
    }

    async fn texts<'a>(
        conn: &'a mut DB::Connection,
        statement: &'a Statement,
    ) -> Result<Vec<String>, sqlx::Error> {
        let rows = Self::query(statement, &Values::default())
            .fetch_all(conn)
            .await?;
        rows.iter().map(|row| row.try_get(0)).collect()
    }

    async fn number<'a>(
        conn: &'a mut DB::Connection,
        statement: &'a Statement,
        values: &'a Values<'a>,
    ) -> Result<i64, sqlx::Error> {
        let row = Self::query(statement, values).fetch_one(conn).await?;
        row.try_get(0)
    }

    async fn records<'a>(
        conn: &'a mut DB::Connection,
        statement: &'a Statement,
        values: &'a Values<'a>,
    ) -> Result<Vec<Found>, sqlx::Error> {
        let rows = Self::query(statement, values).fetch_all(conn).await?;
        rows.iter()
            .map(|row| record(row, 2, &text(row, 0)?, &text(row, 1)?))
            .collect()
    }

    async fn outgoing<'a>(
        conn: &'a mut DB::Connection,
        statement: &'a Statement,
        values: &'a Values<'a>,
    ) -> Result<Vec<Outgoing>, sqlx::Error> {
        let rows = Self::query(statement, values).fetch_all(conn).await?;
        rows.iter()
            .map(|row| {
                Outgoing::from_row(
                    row.try_get(0)?,
                    text(row, 1)?,
                    text(row, 2)?,
                    text(row, 3)?,
                    row.try_get_unchecked(4)?,
                    text(row, 5)?,
                    row.try_get_unchecked(6)?,
                    row.try_get_unchecked(7)?,
                    row.try_get(8)?,
                    row.try_get(9)?,
                    row.try_get_unchecked(10)?,
                )
                .map_err(|e| sqlx::Error::Decode(e.into()))
            })
            .collect()
    }

    async fn cells<'a>(
        conn: &'a mut DB::Connection,
        statement: &'a Statement,
        values: &'a Values<'a>,
        texts: usize,
    ) -> Result<Vec<Cells>, sqlx::Error> {
        let rows = Self::query(statement, values).fetch_all(conn).await?;
        rows.iter()
            .map(|row| {
                Ok(Cells {
                    texts: (0..texts).map(|i| text(row, i)).collect::<Result<_, _>>()?,
                    numbers: (texts..row.len())
                        .map(|i| row.try_get(i))
                        .collect::<Result<_, _>>()?,
                })
            })
            .collect()
    }
}
