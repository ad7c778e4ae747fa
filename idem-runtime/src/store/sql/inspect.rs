//! [`Inspect`] for every SQL store, written once: the statements an
//! operator's questions take, in the named-parameter form of
//! `template.rs`, rendered for the store's dialect and table. As
//! everywhere in the store, every value is a bound parameter; the only text
//! spliced in is the validated table name (and fixed fragments of this
//! file, chosen by the filter and the order).

use crate::error::StoreError;
use crate::store::ops::{Filter, Forgot, Inspect, Order, Query, Schema, Stats, Swept, sweep_all};
use crate::store::{Record, Status};

use super::pool;
use super::statements::render;
use super::template::{Statement, Values};
use super::{Dialect, SqlStore};

/// A handler's records, filtered (`{filter}`), sorted (`{dir}`), cut.
const LIST: &str = "SELECT handler, {key}, {record} FROM {t}
                    WHERE handler = :handler{filter}
                    ORDER BY created_at {dir}, {key} {dir} LIMIT :batch";

/// The records by handler and status: how many, the oldest claim, how many
/// expired, and the database's now they were counted at. `COUNT` rather
/// than `SUM`, which MySQL answers as a decimal.
const STATS: &str = "SELECT handler, status, COUNT(*), MIN(created_at),
                            COUNT(CASE WHEN expires_at <= {now} THEN 1 END), MIN({now})
                     FROM {t} GROUP BY handler, status";

/// The database's now, when [`STATS`] found no rows to read it with.
const NOW: &str = "SELECT {now}";

/// The handlers that have records.
const HANDLERS: &str = "SELECT DISTINCT handler FROM {t} ORDER BY handler";

/// Deletes a record, whatever it is (`forget --force`).
const FORGET: &str = "DELETE FROM {t} WHERE handler = :handler AND {key} = :key";

/// Deletes a record unless a live claim holds it.
const FORGET_UNLESS_LIVE: &str = "DELETE FROM {t} WHERE handler = :handler AND {key} = :key
                                  AND NOT (status = 'in_progress' AND expires_at > {now})";

/// The condition `filter` adds to [`LIST`]'s (the rule of
/// [`Filter::matches`], in SQL).
fn condition(filter: Filter) -> &'static str {
    match filter {
        Filter::Any => "",
        Filter::Status(_) => " AND status = :status",
        Filter::Stuck => " AND status = 'in_progress' AND expires_at <= {now}",
        Filter::Failed => " AND (failures > 0 OR status IN ('failed', 'retry'))",
        Filter::Exhausted => {
            " AND status = 'retry' AND expires_at > {now} AND failures >= max_attempts"
        }
    }
}

/// How many times [`Inspect::forget`] reads and deletes again when the
/// record changed in between.
const FORGET_TRIES: usize = 3;

impl<D: Dialect> SqlStore<D> {
    /// `template` rendered for this store's dialect and table.
    fn statement(&self, template: &str) -> Statement {
        render::<D>(self.table(), template)
    }

    /// The values of a statement on `key` of `handler` (its time is the
    /// database's, plus the test shift).
    fn at_now<'a>(&self, handler: &'a str, key: &'a str) -> Values<'a> {
        Values {
            handler,
            key,
            ..self.values()
        }
    }

    /// The record of `key` of `handler`, with the database's now.
    async fn lookup_found(
        &self,
        handler: &str,
        key: &str,
    ) -> Result<Option<super::exec::Found>, StoreError> {
        let values = self.at_now(handler, key);
        let mut conn = pool::acquire(&self.pool).await.map_err(|e| self.err(e))?;
        D::fetch(&mut conn, &self.sql.select, &values)
            .await
            .map_err(|e| self.err(e))
    }
}

impl<D: Dialect> Inspect for SqlStore<D> {
    async fn lookup(&self, handler: &str, key: &str) -> Result<Option<Record>, StoreError> {
        Ok(self
            .lookup_found(handler, key)
            .await?
            .map(|found| found.record))
    }

    async fn list(&self, handler: &str, query: Query) -> Result<Vec<Record>, StoreError> {
        let dir = match query.order {
            Order::OldestFirst => "ASC",
            Order::NewestFirst => "DESC",
        };
        let statement = self.statement(
            &LIST
                .replace("{filter}", condition(query.filter))
                .replace("{dir}", dir),
        );
        let values = Values {
            status: match query.filter {
                Filter::Status(status) => status.as_str(),
                _ => "",
            },
            batch: i64::from(query.limit),
            ..self.at_now(handler, "")
        };
        let mut conn = pool::acquire(&self.pool).await.map_err(|e| self.err(e))?;
        let found = D::records(&mut conn, &statement, &values)
            .await
            .map_err(|e| self.err(e))?;
        Ok(found.into_iter().map(|f| f.record).collect())
    }

    async fn stats(&self) -> Result<Stats, StoreError> {
        let values = self.at_now("", "");
        let mut conn = pool::acquire(&self.pool).await.map_err(|e| self.err(e))?;
        let rows = D::cells(&mut conn, &self.statement(STATS), &values, 2)
            .await
            .map_err(|e| self.err(e))?;
        let at = match rows.first().and_then(|row| row.numbers.last()) {
            Some(Some(at)) => *at,
            _ => D::number(&mut conn, &self.statement(NOW), &values)
                .await
                .map_err(|e| self.err(e))?,
        };
        let mut stats = Stats::new(at);
        for row in rows {
            let ([handler, status], [Some(records), oldest, Some(expired), _]) =
                (row.texts.as_slice(), row.numbers.as_slice())
            else {
                return Err(StoreError::Schema(format!("unexpected counts: {row:?}")));
            };
            let status = Status::parse(status)
                .ok_or_else(|| StoreError::Schema(format!("unknown status {status:?}")))?;
            let count = |n: i64| u64::try_from(n).unwrap_or(0);
            stats
                .entry(handler)
                .add_group(status, count(*records), *oldest, count(*expired));
        }
        Ok(stats)
    }

    async fn forget(&self, handler: &str, key: &str, force: bool) -> Result<Forgot, StoreError> {
        let delete = self.statement(if force { FORGET } else { FORGET_UNLESS_LIVE });
        for _ in 0..FORGET_TRIES {
            let values = self.at_now(handler, key);
            let Some(found) = self.lookup_found(handler, key).await? else {
                return Ok(Forgot::Absent);
            };
            let record = found.record;
            // Live at the database's now: the delete's own condition.
            let live = record.status == Status::InProgress && !record.is_expired(found.now);
            if live && !force {
                return Ok(Forgot::Refused(record));
            }
            if self.write(&delete, &values, None).await? == 1 {
                return Ok(Forgot::Deleted(record));
            }
            // Claimed (or deleted) between the read and the delete: again.
        }
        Err(StoreError::Backend(Box::from(
            "the record kept changing while it was being forgotten; try again",
        )))
    }

    async fn sweep(&self) -> Result<Swept, StoreError> {
        // Asked once for the whole sweep: should the table be partitioned
        // meanwhile, the delete still takes expired rows only.
        let partitioned = self.swept_by_partitions().await?;
        sweep_all(partitioned, |batch| self.sweep_step(batch, partitioned)).await
    }

    async fn handlers(&self) -> Result<Vec<String>, StoreError> {
        let mut conn = pool::acquire(&self.pool).await.map_err(|e| self.err(e))?;
        let rows = D::cells(&mut conn, &self.statement(HANDLERS), &self.values(), 1)
            .await
            .map_err(|e| self.err(e))?;
        Ok(rows.into_iter().flat_map(|row| row.texts).collect())
    }

    async fn schema(&self) -> Result<Schema, StoreError> {
        Ok(match self.schema_version().await? {
            Some(version) => Schema::Version { version },
            None => Schema::NoTable,
        })
    }
}
