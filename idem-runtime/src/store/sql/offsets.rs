//! Offset tables: where a consumer is in a partitioned source (a Kafka
//! topic, say), kept in the store's database so that it can commit with a
//! handler's writes.
//!
//! An [`OffsetTable`] holds one row per consumer, stream and partition: the
//! next offset to consume. Its statements are the dialect's
//! ([`Dialect::OFFSETS_CREATE`], [`Dialect::OFFSETS_LOAD`],
//! [`Dialect::OFFSETS_UPSERT`]); a row only ever moves forward.
//! [`OffsetTable::ride`] writes a row in the transaction of a
//! transaction-mode call's outcome on the store's pool (the rider,
//! `rider.rs`), so the effect and the position commit together or not at
//! all.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use sqlx::{Pool, Transaction};

use crate::error::StoreError;

use super::pool;
use super::rider::{self, Rider};
use super::statements::render;
use super::template::{Statement, Values};
use super::{Dialect, SqlStore};

/// The longest table name the SQL databases all take, in bytes.
const MAX_NAME_LEN: usize = 63;

/// A consumer's offsets in a [`SqlStore`]'s database: one row per consumer,
/// stream and partition, the next offset to consume. Made by
/// [`SqlStore::offset_table`].
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use idem_runtime::SqliteStore;
///
/// let store = SqliteStore::connect("sqlite::memory:").await?;
/// let offsets = store.offset_table("orders");
/// assert_eq!(offsets.name(), "idem_keys_orders_offsets");
/// offsets.create().await?;
/// offsets.save("billing", &[("orders".into(), 0, 42)]).await?;
/// // a row only moves forward
/// offsets.save("billing", &[("orders".into(), 0, 7)]).await?;
/// assert_eq!(offsets.load("billing").await?, [("orders".to_owned(), 0, 42)]);
/// # Ok(()) }
/// ```
pub struct OffsetTable<D: Dialect> {
    name: String,
    pool: Pool<D>,
    create: Arc<Statement>,
    load: Arc<Statement>,
    upsert: Arc<Statement>,
}

impl<D: Dialect> Clone for OffsetTable<D> {
    fn clone(&self) -> Self {
        OffsetTable {
            name: self.name.clone(),
            pool: self.pool.clone(),
            create: Arc::clone(&self.create),
            load: Arc::clone(&self.load),
            upsert: Arc::clone(&self.upsert),
        }
    }
}

impl<D: Dialect> std::fmt::Debug for OffsetTable<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OffsetTable")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl<D: Dialect> SqlStore<D> {
    /// The offset table of `source` (a name of the consumer's choosing,
    /// such as `kafka`) in this store's database: the dedup table's name,
    /// then `_<source>_offsets`. Nothing is created until
    /// [`OffsetTable::create`].
    ///
    /// # Examples
    ///
    /// See [`OffsetTable`].
    pub fn offset_table(&self, source: &str) -> OffsetTable<D> {
        let name = format!("{}_{source}_offsets", self.table());
        let render = |template: &str| Arc::new(render::<D>(&name, template));
        OffsetTable {
            create: render(D::OFFSETS_CREATE),
            load: render(D::OFFSETS_LOAD),
            upsert: render(D::OFFSETS_UPSERT),
            pool: self.pool().clone(),
            name,
        }
    }
}

impl<D: Dialect> OffsetTable<D> {
    /// The table's name.
    ///
    /// # Examples
    ///
    /// See [`OffsetTable`].
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Creates the table if it does not exist.
    ///
    /// # Errors
    ///
    /// [`StoreError::Schema`] when its name (without a schema) is longer
    /// than 63 bytes; the database's error otherwise.
    ///
    /// # Examples
    ///
    /// See [`OffsetTable`].
    pub async fn create(&self) -> Result<(), StoreError> {
        // The dedup table's name was checked; the suffix must still fit.
        if self.name.rsplit('.').next().map_or(0, str::len) > MAX_NAME_LEN {
            return Err(StoreError::Schema(format!(
                "the offsets table's name {} is longer than {MAX_NAME_LEN} bytes; name the dedup table shorter",
                self.name
            )));
        }
        let mut conn = pool::acquire(&self.pool)
            .await
            .map_err(StoreError::backend)?;
        D::run(&mut *conn, &self.create, &Values::default())
            .await
            .map_err(StoreError::backend)?;
        Ok(())
    }

    /// The rows of `consumer`: stream, partition and the next offset.
    ///
    /// # Examples
    ///
    /// See [`OffsetTable`].
    pub async fn load(&self, consumer: &str) -> Result<Vec<(String, i32, i64)>, StoreError> {
        let values = Values {
            consumer,
            ..Values::default()
        };
        let mut conn = pool::acquire(&self.pool)
            .await
            .map_err(StoreError::backend)?;
        let rows = D::cells(&mut *conn, &self.load, &values, 1)
            .await
            .map_err(StoreError::backend)?;
        rows.into_iter()
            .map(|cells| {
                let stream = cells.texts.into_iter().next();
                match (stream, cells.numbers.as_slice()) {
                    (Some(stream), &[Some(partition), Some(next)]) => {
                        let partition = i32::try_from(partition).map_err(|_| {
                            StoreError::Schema(format!("partition {partition} out of range"))
                        })?;
                        Ok((stream, partition, next))
                    }
                    _ => Err(StoreError::Schema(format!(
                        "unexpected row in the offsets table {}",
                        self.name
                    ))),
                }
            })
            .collect()
    }

    /// Writes the rows of `consumer` (stream, partition, next offset) in
    /// one transaction; a row already further on stays where it is.
    ///
    /// # Examples
    ///
    /// See [`OffsetTable`].
    pub async fn save(
        &self,
        consumer: &str,
        rows: &[(String, i32, i64)],
    ) -> Result<(), StoreError> {
        let mut tx = pool::begin(&self.pool, None)
            .await
            .map_err(StoreError::backend)?;
        for (stream, partition, next) in rows {
            let values = Values {
                consumer,
                stream,
                partition: *partition,
                next: *next,
                ..Values::default()
            };
            D::run(&mut *tx, &self.upsert, &values)
                .await
                .map_err(StoreError::backend)?;
        }
        tx.commit().await.map_err(StoreError::backend)
    }

    /// Runs `call` with the row of `consumer`, `stream` and `partition`
    /// (`next`) waiting for the transaction of a transaction-mode call's
    /// outcome on this store's pool (or a clone's), written in it just
    /// before the outcome; `true` when it was, and that transaction
    /// committed. A call on another pool, or in lease mode, leaves the row
    /// unwritten: save it after the call.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_runtime::SqliteStore;
    ///
    /// let store = SqliteStore::connect("sqlite::memory:").await?;
    /// let offsets = store.offset_table("orders");
    /// offsets.create().await?;
    /// // no transaction-mode call: the row waits in vain
    /// let ((), rode) = offsets.ride("billing", "orders", 0, 42, async {}).await;
    /// assert!(!rode);
    /// assert!(offsets.load("billing").await?.is_empty());
    /// # Ok(()) }
    /// ```
    pub async fn ride<F: Future>(
        &self,
        consumer: &str,
        stream: &str,
        partition: i32,
        next: i64,
        call: F,
    ) -> (F::Output, bool) {
        let write = OffsetWrite {
            upsert: Arc::clone(&self.upsert),
            pool: self.pool.clone(),
            consumer: consumer.to_owned(),
            stream: stream.to_owned(),
            partition,
            next,
        };
        rider::ride(Box::new(write), call).await
    }
}

/// One row of an offset table, waiting for an outcome's transaction.
struct OffsetWrite<D: Dialect> {
    upsert: Arc<Statement>,
    pool: Pool<D>,
    consumer: String,
    stream: String,
    partition: i32,
    next: i64,
}

impl<D: Dialect> Rider<D> for OffsetWrite<D> {
    fn rides_with(&self, pool: &Pool<D>) -> bool {
        Arc::ptr_eq(&self.pool.connect_options(), &pool.connect_options())
    }

    fn write<'a>(
        &'a self,
        tx: &'a mut Transaction<'static, D>,
    ) -> Pin<Box<dyn Future<Output = Result<(), sqlx::Error>> + Send + 'a>> {
        Box::pin(async move {
            let values = Values {
                consumer: &self.consumer,
                stream: &self.stream,
                partition: self.partition,
                next: self.next,
                ..Values::default()
            };
            D::run(&mut **tx, &self.upsert, &values).await.map(|_| ())
        })
    }
}
