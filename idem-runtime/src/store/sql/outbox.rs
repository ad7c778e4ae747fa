//! The outbox table: the messages transaction-mode bodies stage, kept in
//! the store's database until a relay has published them.
//!
//! One row per staged message, in the table `<dedup table>_outbox`
//! ([`OutboxTable`]), created by `migrate()` with the dedup table. A
//! body's [`Outbox`](crate::outbox::Outbox) inserts rows in the body's
//! transaction ([`OutboxSql::insert`]); a [`Relay`](crate::outbox::Relay)
//! takes the rows that head their lane ([`OutboxSql::take`], which locks
//! them where the database can), publishes
//! them, and deletes those the broker confirmed ([`OutboxSql::remove`]).
//! The statements differ between the databases only in the dialect's
//! `OUTBOX_*` items.

use std::sync::Arc;
use std::time::Duration;

use sqlx::{Pool, Transaction};

use crate::error::StoreError;
use crate::outbox::{Backlog, Outbox, Outgoing};

use super::pool;
use super::statements::render;
use super::table::{bare, derived_name};
use super::template::{Statement, Values};
use super::{Dialect, SqlStore};

/// The columns a relay reads of a row, in [`Exec::outgoing`](super::exec::Exec::outgoing)'s order.
pub(crate) const OUTGOING: &str = "seq, id, handler, destination, msg_key, lane, payload, headers, staged_at, attempts, last_error";

/// The outbox SQL of one store, rendered once with its dedup statements.
#[derive(Debug)]
pub(crate) struct OutboxSql {
    /// The table's name.
    pub(crate) table: String,
    /// The database's name (`D::STORE`): an outbox refuses a transaction
    /// of another database.
    pub(crate) store: &'static str,
    /// Creates the table and its lane index (several statements, no
    /// parameters).
    pub(crate) create: String,
    /// Inserts a row staged now.
    pub(crate) insert: Statement,
    /// At most `:batch` rows that head their lane (no row of the lane
    /// before them, locked or not), oldest first, but those of `:rows`;
    /// locked where the database locks rows, skipping those another relay
    /// holds (the subquery reads without a lock, so a row another relay
    /// holds still keeps the rest of its lane back).
    pub(crate) take: Statement,
    /// Deletes the rows of the `seq`s of `:rows`.
    pub(crate) remove: Statement,
    /// The `seq`s of `:rows` that no longer head their lane
    /// ([`Dialect::OUTBOX_RECHECK`]).
    pub(crate) behind: Statement,
    /// Counts a failed publish of row `:seq`, with `:error`.
    pub(crate) failed: Statement,
    /// The number of rows, the oldest row's `staged_at` and the database's
    /// now.
    pub(crate) backlog: Statement,
    /// At most `:batch` rows from `:seq` on, oldest first, without a lock.
    pub(crate) list: Statement,
    /// The rows of message id `:id`.
    pub(crate) find: Statement,
    /// Deletes the rows of message id `:id`.
    pub(crate) delete: Statement,
}

impl OutboxSql {
    /// The outbox SQL of dialect `D` beside the dedup table `dedup`.
    pub(crate) fn new<D: Dialect>(dedup: &str) -> OutboxSql {
        let table = outbox_name(dedup);
        let render = |template: &str| render::<D>(&table, template);
        let index = derived_name(bare(&table), "_lane");
        OutboxSql {
            create: D::OUTBOX_CREATE
                .replace("{i}", &index)
                .replace("{s}", schema_prefix(&table))
                .replace("{b}", bare(&table))
                .replace("{t}", &table),
            store: D::STORE,
            insert: render(
                "INSERT INTO {t} (id, handler, destination, msg_key, lane, payload, headers, staged_at) \
                 VALUES (:id, :handler, :destination, :msgkey, :lane, :payload, :headers, {now})",
            ),
            take: render(&format!(
                "SELECT {OUTGOING} FROM {{t}} AS o WHERE NOT EXISTS \
                 (SELECT 1 FROM {{t}} AS e WHERE e.lane = o.lane AND e.seq < o.seq) \
                 AND o.seq NOT IN {} ORDER BY o.seq LIMIT :batch{}",
                D::OUTBOX_SEQS,
                D::OUTBOX_LOCK
            )),
            remove: render(&D::OUTBOX_REMOVE.replace("{seqs}", D::OUTBOX_SEQS)),
            behind: render(&format!(
                "SELECT seq FROM {{t}} AS o WHERE o.seq IN {} AND EXISTS \
                 (SELECT 1 FROM {{t}} AS e WHERE e.lane = o.lane AND e.seq < o.seq)",
                D::OUTBOX_SEQS
            )),
            failed: render(
                "UPDATE {t} SET attempts = attempts + 1, last_error = :error WHERE seq = :seq",
            ),
            backlog: render("SELECT COUNT(*), COALESCE(MIN(staged_at), {now}), {now} FROM {t}"),
            list: render(&format!(
                "SELECT {OUTGOING} FROM {{t}} WHERE seq >= :seq ORDER BY seq LIMIT :batch"
            )),
            find: render(&format!(
                "SELECT {OUTGOING} FROM {{t}} WHERE id = :id ORDER BY seq"
            )),
            delete: render("DELETE FROM {t} WHERE id = :id"),
            table,
        }
    }
}

/// The outbox table's name beside the dedup table `dedup` (validated):
/// `<dedup>_outbox`, in the dedup table's schema, shortened as index names
/// are where it would pass 63 bytes.
fn outbox_name(dedup: &str) -> String {
    let name = derived_name(bare(dedup), "_outbox");
    match dedup.rsplit_once('.') {
        Some((schema, _)) => format!("{schema}.{name}"),
        None => name,
    }
}

/// `schema.` of a schema-qualified `table`, or nothing.
fn schema_prefix(table: &str) -> &str {
    match table.rfind('.') {
        Some(at) => &table[..=at],
        None => "",
    }
}

/// A store's outbox table, for relays and operators: made by
/// [`SqlStore::outbox_table`].
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use idem_runtime::SqliteStore;
/// use idem_runtime::outbox::Message;
///
/// let store = SqliteStore::connect("sqlite::memory:").await?;
/// store.migrate().await?; // creates the outbox table too
/// let table = store.outbox_table();
/// assert_eq!(table.name(), "idem_keys_outbox");
///
/// // a producer that is not a handler stages on its own transaction
/// let mut tx = store.pool().begin().await?;
/// let mut outbox = store.outbox("place_order", "A-17");
/// let id = outbox.stage(&mut tx, Message::new("orders", "{}")).await?;
/// tx.commit().await?;
///
/// let rows = table.list(0, 10).await?;
/// assert_eq!(rows.len(), 1);
/// assert_eq!(rows[0].id, id);
/// assert_eq!(table.backlog().await?.rows, 1);
/// # Ok(()) }
/// ```
pub struct OutboxTable<D: Dialect> {
    pool: Pool<D>,
    sql: Arc<OutboxSql>,
}

impl<D: Dialect> Clone for OutboxTable<D> {
    fn clone(&self) -> Self {
        OutboxTable {
            pool: self.pool.clone(),
            sql: Arc::clone(&self.sql),
        }
    }
}

impl<D: Dialect> std::fmt::Debug for OutboxTable<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutboxTable")
            .field("name", &self.sql.table)
            .finish_non_exhaustive()
    }
}

impl<D: Dialect> SqlStore<D> {
    /// The store's outbox table, `<dedup table>_outbox`: what a
    /// [`Relay`](crate::outbox::Relay) publishes from and operators list.
    ///
    /// # Examples
    ///
    /// See [`OutboxTable`].
    pub fn outbox_table(&self) -> OutboxTable<D> {
        OutboxTable {
            pool: self.pool().clone(),
            sql: Arc::clone(&self.sql.outbox),
        }
    }

    /// An [`Outbox`] to stage messages on a transaction of this store's
    /// database, with ids derived from `producer` and `key`: what a
    /// producer that is not a handler uses (a handler takes an `outbox:
    /// &mut Outbox` parameter instead, made for it with the handler's name
    /// and the delivery's key).
    ///
    /// # Examples
    ///
    /// See [`OutboxTable`].
    pub fn outbox(&self, producer: &str, key: &str) -> Outbox {
        self.outbox_at(producer, key, 0)
    }

    /// As [`outbox`](Self::outbox), its next message at `place`.
    pub(crate) fn outbox_at(&self, producer: &str, key: &str, place: u32) -> Outbox {
        Outbox::new(Arc::clone(&self.sql.outbox), producer, key, place)
    }
}

impl<D: Dialect> OutboxTable<D> {
    /// The table's name.
    ///
    /// # Examples
    ///
    /// See [`OutboxTable`].
    pub fn name(&self) -> &str {
        &self.sql.table
    }

    /// How many rows wait and how old the oldest is.
    ///
    /// # Errors
    ///
    /// The database's, as [`StoreError::Backend`].
    ///
    /// # Examples
    ///
    /// See [`OutboxTable`].
    pub async fn backlog(&self) -> Result<Backlog, StoreError> {
        let mut conn = pool::acquire(&self.pool)
            .await
            .map_err(StoreError::backend)?;
        let rows = D::cells(&mut *conn, &self.sql.backlog, &Values::default(), 0)
            .await
            .map_err(StoreError::backend)?;
        match rows.first().map(|c| c.numbers.as_slice()) {
            Some(&[Some(count), Some(oldest), Some(now)]) => Ok(Backlog {
                rows: u64::try_from(count).unwrap_or(0),
                oldest_age: Duration::from_millis(u64::try_from(now - oldest).unwrap_or(0)),
            }),
            _ => Err(StoreError::Schema(format!(
                "unexpected answer to the backlog of {}",
                self.sql.table
            ))),
        }
    }

    /// At most `limit` rows from place `from` on, oldest first: what is
    /// still to be published (or is being published now).
    ///
    /// # Errors
    ///
    /// The database's, as [`StoreError::Backend`].
    ///
    /// # Examples
    ///
    /// See [`OutboxTable`].
    pub async fn list(&self, from: i64, limit: u32) -> Result<Vec<Outgoing>, StoreError> {
        let values = Values {
            seq: from,
            batch: i64::from(limit),
            ..Values::default()
        };
        let mut conn = pool::acquire(&self.pool)
            .await
            .map_err(StoreError::backend)?;
        D::outgoing(&mut *conn, &self.sql.list, &values)
            .await
            .map_err(StoreError::backend)
    }

    /// The rows of message `id` (one, unless a producer staged it twice).
    ///
    /// # Errors
    ///
    /// The database's, as [`StoreError::Backend`].
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_runtime::SqliteStore;
    /// use idem_runtime::outbox::{Message, MessageId};
    ///
    /// let store = SqliteStore::connect("sqlite::memory:").await?;
    /// store.migrate().await?;
    /// let mut tx = store.pool().begin().await?;
    /// let id = store.outbox("refund", "R-1").stage(&mut tx, Message::new("refunds", "{}")).await?;
    /// tx.commit().await?;
    /// assert_eq!(id, MessageId::derive("refund", "R-1", 0));
    /// assert_eq!(store.outbox_table().find(&id).await?.len(), 1);
    /// assert_eq!(store.outbox_table().delete(&id).await?, 1);
    /// assert!(store.outbox_table().find(&id).await?.is_empty());
    /// # Ok(()) }
    /// ```
    pub async fn find(&self, id: &crate::outbox::MessageId) -> Result<Vec<Outgoing>, StoreError> {
        let values = Values {
            id: id.as_str(),
            ..Values::default()
        };
        let mut conn = pool::acquire(&self.pool)
            .await
            .map_err(StoreError::backend)?;
        D::outgoing(&mut *conn, &self.sql.find, &values)
            .await
            .map_err(StoreError::backend)
    }

    /// Deletes the rows of message `id` without publishing them: the
    /// number of rows deleted.
    ///
    /// # Errors
    ///
    /// The database's, as [`StoreError::Backend`].
    ///
    /// # Examples
    ///
    /// See [`find`](Self::find).
    pub async fn delete(&self, id: &crate::outbox::MessageId) -> Result<u64, StoreError> {
        let values = Values {
            id: id.as_str(),
            ..Values::default()
        };
        let mut conn = pool::acquire(&self.pool)
            .await
            .map_err(StoreError::backend)?;
        let done = D::run(&mut *conn, &self.sql.delete, &values)
            .await
            .map_err(StoreError::backend)?;
        Ok(D::rows_affected(&done))
    }
}

/// The rows a relay's pass took: held in `tx` (locked) until the pass
/// settles them where the dialect holds rows, read apart otherwise.
pub(crate) struct Taken<D: Dialect> {
    tx: Option<Transaction<'static, D>>,
    pub(crate) rows: Vec<Outgoing>,
}

/// The `seq`s as a JSON array, for `:rows`.
fn seq_list(seqs: impl Iterator<Item = i64>) -> String {
    let list: Vec<String> = seqs.map(|s| s.to_string()).collect();
    format!("[{}]", list.join(","))
}

impl<D: Dialect> OutboxTable<D> {
    /// Takes at most `batch` rows that head their lane, oldest first, but
    /// those of `skip` (rows whose next attempt is not due):
    /// locked in a transaction of their own where the dialect holds rows
    /// ([`Dialect::OUTBOX_LOCK`]), skipping those another relay holds.
    pub(crate) async fn take(&self, batch: u32, skip: &[i64]) -> Result<Taken<D>, sqlx::Error> {
        let skipped = seq_list(skip.iter().copied());
        let values = Values {
            batch: i64::from(batch),
            rows: &skipped,
            ..Values::default()
        };
        if D::OUTBOX_HOLDS {
            let mut tx = pool::begin(&self.pool, D::RELAY_BEGIN).await?;
            let mut rows = D::outgoing(&mut *tx, &self.sql.take, &values).await?;
            if D::OUTBOX_RECHECK && !rows.is_empty() {
                // Locked rows that a row committed meanwhile puts behind:
                // left for a later pass (the commit lets them go).
                let taken = seq_list(rows.iter().map(|r| r.seq));
                let values = Values {
                    rows: &taken,
                    ..Values::default()
                };
                let behind = D::cells(&mut *tx, &self.sql.behind, &values, 0).await?;
                let behind: Vec<i64> = behind
                    .iter()
                    .filter_map(|c| c.numbers.first().copied().flatten())
                    .collect();
                rows.retain(|r| !behind.contains(&r.seq));
            }
            if rows.is_empty() {
                tx.rollback().await?;
                return Ok(Taken { tx: None, rows });
            }
            Ok(Taken { tx: Some(tx), rows })
        } else {
            let mut conn = pool::acquire(&self.pool).await?;
            let rows = D::outgoing(&mut *conn, &self.sql.take, &values).await?;
            Ok(Taken { tx: None, rows })
        }
    }

    /// Ends a pass: deletes the rows `sent` (the broker confirmed them) and
    /// counts a failed publish of each of `failed`, then commits, which
    /// lets go of the rows not deleted.
    pub(crate) async fn settle(
        &self,
        taken: Taken<D>,
        sent: &[i64],
        failed: &[(i64, String)],
    ) -> Result<(), sqlx::Error> {
        match taken.tx {
            Some(mut tx) => {
                self.write_settled(&mut tx, sent, failed).await?;
                tx.commit().await
            }
            None => {
                let mut conn = pool::acquire(&self.pool).await?;
                self.write_settled(&mut conn, sent, failed).await
            }
        }
    }

    /// Deletes the rows `sent` and counts a failed publish of each of
    /// `failed`, on `conn` (the pass's transaction, or a connection of
    /// its own).
    async fn write_settled(
        &self,
        conn: &mut D::Connection,
        sent: &[i64],
        failed: &[(i64, String)],
    ) -> Result<(), sqlx::Error> {
        if !sent.is_empty() {
            let seqs = seq_list(sent.iter().copied());
            let remove = Values {
                rows: &seqs,
                ..Values::default()
            };
            D::run(conn, &self.sql.remove, &remove).await?;
        }
        for (seq, error) in failed {
            let values = Values {
                seq: *seq,
                error: Some(error),
                ..Values::default()
            };
            D::run(conn, &self.sql.failed, &values).await?;
        }
        Ok(())
    }
}
