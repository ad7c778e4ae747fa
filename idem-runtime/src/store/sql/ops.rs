//! `SqlStore`'s operator side: sweeping expired records, reading one
//! record, counting, the table's schema version and its upgrade.

use std::time::Duration;

use crate::error::StoreError;
use crate::key::Key;
use crate::store::{Record, Sweep};

use super::exec::Found;
use super::pool;
use super::statements::Sweeping;
use super::template::{Statement, Values};
use super::{Dialect, MAINTENANCE_STEPS, SCHEMA_VERSION, SqlStore};

impl<D: Dialect> SqlStore<D> {
    /// Deletes at most `batch` expired records, oldest first; returns how
    /// many.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = tempfile::tempdir()?;
    /// # let store = idem_runtime::SqliteStore::open(dir.path().join("idem.db")).await?;
    /// # store.migrate().await?;
    /// let deleted = store.sweep_expired(1_000).await?;
    /// assert_eq!(deleted, 0); // nothing has expired yet
    /// # Ok(()) }
    /// ```
    pub async fn sweep_expired(&self, batch: u32) -> Result<u64, StoreError> {
        let by_partitions = self.swept_by_partitions().await?;
        self.sweep_step(batch, by_partitions).await
    }

    /// One sweep of at most `batch` rows, by partitions or by a delete as
    /// [`swept_by_partitions`](Self::swept_by_partitions) answered.
    pub(crate) async fn sweep_step(
        &self,
        batch: u32,
        by_partitions: bool,
    ) -> Result<u64, StoreError> {
        let values = Values {
            batch: i64::from(batch),
            ..self.values()
        };
        match (&self.sql.sweep, by_partitions) {
            (Sweeping::Delete(delete), _) | (Sweeping::Either { delete, .. }, false) => {
                self.write(delete, &values, D::SWEEP_BEGIN).await
            }
            (Sweeping::Maintain(call), _) | (Sweeping::Either { maintain: call, .. }, true) => {
                self.maintain(call, &values).await
            }
        }
    }

    /// Whether the table is swept by partitions: a store opened with them,
    /// or one opened without them on a table partitioned since (asked of
    /// the database, where it has partitions).
    pub(crate) async fn swept_by_partitions(&self) -> Result<bool, StoreError> {
        match &self.sql.sweep {
            Sweeping::Delete(_) => Ok(false),
            Sweeping::Maintain(_) => Ok(true),
            Sweeping::Either { partitioned, .. } => {
                let mut conn = pool::acquire(&self.pool).await.map_err(|e| self.err(e))?;
                let answer = D::number(&mut conn, partitioned, &self.values())
                    .await
                    .map_err(|e| self.err(e))?;
                Ok(answer > 0)
            }
        }
    }

    /// Sweeps a partitioned table by its maintenance function's steps
    /// (`call`): as many rows as it removed.
    pub(super) async fn maintain(
        &self,
        call: &Statement,
        values: &Values<'_>,
    ) -> Result<u64, StoreError> {
        let mut conn = pool::acquire(&self.pool).await.map_err(|e| self.err(e))?;
        // Each step is a statement, and so a transaction, of its own: a
        // partition made or dropped releases the table's lock before the
        // next step. A bound on the steps keeps a call short (a partition
        // a step).
        for _ in 0..MAINTENANCE_STEPS {
            let removed = D::number(&mut conn, call, values)
                .await
                .map_err(|e| self.err(e))?;
            if removed >= 0 {
                return Ok(u64::try_from(removed).unwrap_or(0));
            }
        }
        Ok(0)
    }

    /// The record of `key` under handler `handler`, if any.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = tempfile::tempdir()?;
    /// # let store = idem_runtime::SqliteStore::open(dir.path().join("idem.db")).await?;
    /// # store.migrate().await?;
    /// use idem_runtime::Key;
    ///
    /// let key = Key::from_parts(&[&1u64, &"apple"])?;
    /// match store.record("deduct_stock", &key).await? {
    ///     Some(r) => println!("{:?} at {}: {:?}", r.status, r.updated_at_ms, r.outcome),
    ///     None => println!("not seen within its ttl"),
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn record(&self, handler: &str, key: &Key) -> Result<Option<Record>, StoreError> {
        Ok(self.found(handler, key).await?.map(|found| found.record))
    }

    /// The record of `key` under `handler`, with the database's now.
    pub(super) async fn found(
        &self,
        handler: &str,
        key: &Key,
    ) -> Result<Option<Found>, StoreError> {
        let values = self.stamped(handler, key, Duration::ZERO)?;
        let mut conn = pool::acquire(&self.pool).await.map_err(|e| self.err(e))?;
        D::fetch(&mut conn, &self.sql.select, &values)
            .await
            .map_err(|e| self.err(e))
    }

    /// How many records the table holds, expired or not.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = tempfile::tempdir()?;
    /// # let store = idem_runtime::SqliteStore::open(dir.path().join("idem.db")).await?;
    /// # store.migrate().await?;
    /// assert_eq!(store.count().await?, 0);
    /// # Ok(()) }
    /// ```
    pub async fn count(&self) -> Result<i64, StoreError> {
        let mut conn = pool::acquire(&self.pool).await.map_err(|e| self.err(e))?;
        D::number(&mut conn, &self.sql.count, &Values::default())
            .await
            .map_err(|e| self.err(e))
    }

    /// The version of this store's table: [`SCHEMA_VERSION`] once
    /// migrated by this release; an earlier one (1 for a table of the first
    /// release, 2 for one without `max_attempts`, 3 for one without
    /// `traceparent`), which `migrate` upgrades
    /// in place; `None` when there is no table.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = tempfile::tempdir()?;
    /// use idem_runtime::store::sql::SCHEMA_VERSION;
    ///
    /// let store = idem_runtime::SqliteStore::open(dir.path().join("idem.db")).await?;
    /// assert_eq!(store.schema_version().await?, None);
    /// store.migrate().await?;
    /// assert_eq!(store.schema_version().await?, Some(SCHEMA_VERSION));
    /// # Ok(()) }
    /// ```
    pub async fn schema_version(&self) -> Result<Option<u32>, StoreError> {
        let mut conn = pool::acquire(&self.pool).await.map_err(|e| self.err(e))?;
        let columns = D::texts(&mut conn, &self.sql.columns)
            .await
            .map_err(|e| self.err(e))?;
        if columns.is_empty() {
            return Ok(None);
        }
        // The last version whose columns, and every earlier one's, are all there.
        let has = |column: &str| columns.iter().any(|c| c.eq_ignore_ascii_case(column));
        let complete = |version: u32| {
            self.sql
                .upgrades
                .iter()
                .filter(|(added_in, _, _)| *added_in == version)
                .all(|(_, column, _)| has(column))
        };
        Ok(Some(
            (2..=SCHEMA_VERSION)
                .take_while(|v| complete(*v))
                .last()
                .unwrap_or(1),
        ))
    }

    /// The statements adding the columns of this release that `columns`
    /// (a table's) lacks.
    pub(super) fn missing_columns<'s>(
        &'s self,
        columns: &'s [String],
    ) -> impl Iterator<Item = &'s Statement> + 's {
        self.sql
            .upgrades
            .iter()
            .filter(|(_, column, _)| !columns.iter().any(|c| c.eq_ignore_ascii_case(column)))
            .map(|(_, _, add)| add)
    }

    /// Adds the columns a table of an earlier release lacks, on `conn`,
    /// which holds the store's migration lock. The columns are added with
    /// defaults that read as "no failure, no fingerprint, limit unknown", so
    /// every record keeps its meaning and goes on suppressing its
    /// duplicates.
    pub(crate) async fn upgrade(&self, conn: &mut D::Connection) -> Result<(), StoreError> {
        let columns = D::texts(conn, &self.sql.columns)
            .await
            .map_err(|e| self.err(e))?;
        for add in self.missing_columns(&columns) {
            D::run(conn, add, &Values::default())
                .await
                .map_err(|e| self.err(e))?;
        }
        Ok(())
    }
}

impl<D: Dialect> Sweep for SqlStore<D> {
    async fn sweep_expired(&self, batch: u32) -> Result<u64, StoreError> {
        SqlStore::sweep_expired(self, batch).await
    }
}
