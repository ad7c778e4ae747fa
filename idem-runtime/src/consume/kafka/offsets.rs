//! Offsets kept in the database of a SQL store, written in the handler's
//! transaction ([`Consumer::offsets_in`](super::Consumer::offsets_in)).
//!
//! The table, `<dedup table>_kafka_offsets`, holds one row per consumer
//! group, topic and partition: the next offset to consume. An executed
//! message's transaction writes its row with the body's writes and the
//! dedup record (the store's rider, `store/sql/rider.rs`), so the effect and
//! the position commit together; the consumer also writes the rows of every
//! settled message (duplicates, retries, dead letters) at each commit,
//! before the broker's. A row only ever moves forward.
//!
//! On assignment the rows override the broker's committed offsets.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::BoxError;

/// Where a partition is, as the offsets table holds it.
#[derive(Debug, Clone)]
#[cfg_attr(not(feature = "_sql"), allow(dead_code))]
pub(crate) struct Position {
    pub(crate) group: String,
    pub(crate) topic: String,
    pub(crate) partition: i32,
    /// The offset to consume next: one past the message.
    pub(crate) next: i64,
}

type Fut<'a, T> = Pin<Box<dyn Future<Output = Result<T, BoxError>> + Send + 'a>>;

/// A handler call's verdict and whether it was a duplicate.
type Verdicted = crate::consume::Handled;
/// A handler call, boxed.
type CallFut<'a> = Pin<Box<dyn Future<Output = Verdicted> + Send + 'a>>;
/// A call's verdict and whether the offset rode in its transaction.
type RodeFut<'a> = Pin<Box<dyn Future<Output = (Verdicted, bool)> + Send + 'a>>;

/// One database's offsets table.
trait Table: Send + Sync {
    fn name(&self) -> &str;
    fn create(&self) -> Fut<'_, ()>;
    fn load<'a>(
        &'a self,
        group: &'a str,
        parts: &'a [(String, i32)],
    ) -> Fut<'a, Vec<(String, i32, i64)>>;
    fn save<'a>(&'a self, group: &'a str, rows: &'a [(String, i32, i64)]) -> Fut<'a, ()>;
    /// Runs `call` with `at` written in its outcome's transaction; `true`
    /// when it was (a transaction-mode handler on this database).
    fn in_tx<'a>(&'a self, at: Position, call: CallFut<'a>) -> RodeFut<'a>;
}

/// A consumer's offsets in a SQL store's database: see
/// [`Consumer::offsets_in`](super::Consumer::offsets_in).
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use idem_runtime::SqliteStore;
/// use idem_runtime::consume::kafka::Offsets;
///
/// let store = SqliteStore::connect("sqlite::memory:").await?;
/// let offsets = Offsets::from(&store);
/// assert_eq!(offsets.table(), "idem_keys_kafka_offsets");
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Offsets {
    table: Arc<dyn Table>,
    /// Whether a call was seen whose transaction did not carry the offset.
    warned: Arc<std::sync::atomic::AtomicBool>,
}

impl std::fmt::Debug for Offsets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Offsets")
            .field("table", &self.table.name())
            .finish()
    }
}

impl Offsets {
    /// The table's name: the dedup table's, with `_kafka_offsets`.
    ///
    /// # Examples
    ///
    /// See [`Offsets`].
    pub fn table(&self) -> &str {
        self.table.name()
    }

    pub(crate) async fn create(&self) -> Result<(), BoxError> {
        let name = self.table.name();
        // The dedup table's name was checked; the suffix must still fit.
        if name.rsplit('.').next().map_or(0, str::len) > 63 {
            return Err(format!("the offsets table's name {name} is longer than 63 bytes; name the dedup table shorter").into());
        }
        self.table.create().await
    }

    pub(crate) async fn load(
        &self,
        group: &str,
        parts: &[(String, i32)],
    ) -> Result<Vec<(String, i32, i64)>, BoxError> {
        self.table.load(group, parts).await
    }

    pub(crate) async fn save(
        &self,
        group: &str,
        rows: &[(String, i32, i64)],
    ) -> Result<(), BoxError> {
        self.table.save(group, rows).await
    }

    /// Runs `call` with the offset after it written in its transaction;
    /// also says whether it was (an executed transaction-mode call on this
    /// database), so the consumer need not write it again.
    pub(crate) async fn in_tx(&self, at: Position, call: CallFut<'static>) -> (Verdicted, bool) {
        let (topic, partition, next) = (at.topic.clone(), at.partition, at.next);
        let (out, rode) = self.table.in_tx(at, call).await;
        // Only an executed call commits a transaction the offset can ride
        // in; a duplicate's or a failure's offset is saved at the commit.
        let executed =
            matches!(out.verdict, crate::consume::Verdict::Ack { alert: None }) && !out.duplicate;
        if executed && !rode && !self.warned.swap(true, std::sync::atomic::Ordering::Relaxed) {
            tracing::warn!(
                table = self.table.name(),
                "a handler call was executed without the offset in its transaction: the handler is not a transaction-mode one on this store's pool; offsets are saved after the call instead"
            );
        }
        if rode && !executed {
            // A transaction-mode call committed, with the offset, inside a
            // handler whose own result is not that call's: a consumer that
            // dies before this message settles starts after it.
            tracing::error!(
                %topic,
                partition,
                next,
                "the offset committed with a transaction, but the handler's call did not end executed: the handler must return its one transaction-mode call's result"
            );
        }
        (out, rode)
    }
}

/// The offsets table of one SQL database: its statements and its rider.
macro_rules! sql_table {
    ($feature:literal, $store:ty, $db:ty, $ty:ident, $rider:ident, create: $create:literal, load: $load:literal, upsert: $upsert:literal) => {
        #[cfg(feature = $feature)]
        struct $ty {
            name: String,
            pool: sqlx::Pool<$db>,
            load: String,
            upsert: String,
        }

        #[cfg(feature = $feature)]
        impl From<&$store> for Offsets {
            fn from(store: &$store) -> Self {
                let name = format!("{}_kafka_offsets", store.table());
                let table = $ty {
                    load: $load.replace("{t}", &name),
                    upsert: $upsert.replace("{t}", &name),
                    name,
                    pool: store.pool().clone(),
                };
                Offsets {
                    table: Arc::new(table),
                    warned: Arc::default(),
                }
            }
        }

        #[cfg(feature = $feature)]
        struct $rider {
            upsert: String,
            at: Position,
            pool: sqlx::Pool<$db>,
        }

        #[cfg(feature = $feature)]
        impl crate::store::sql::rider::Rider<$db> for $rider {
            fn rides_with(&self, pool: &sqlx::Pool<$db>) -> bool {
                Arc::ptr_eq(&self.pool.connect_options(), &pool.connect_options())
            }

            fn write<'a>(
                &'a self,
                tx: &'a mut sqlx::Transaction<'static, $db>,
            ) -> Pin<Box<dyn Future<Output = Result<(), sqlx::Error>> + Send + 'a>> {
                Box::pin(async move {
                    sqlx::query(sqlx::AssertSqlSafe(self.upsert.clone()))
                        .bind(&self.at.group)
                        .bind(&self.at.topic)
                        .bind(self.at.partition)
                        .bind(self.at.next)
                        .execute(&mut **tx)
                        .await
                        .map(|_| ())
                })
            }
        }

        #[cfg(feature = $feature)]
        impl Table for $ty {
            fn name(&self) -> &str {
                &self.name
            }

            fn create(&self) -> Fut<'_, ()> {
                Box::pin(async move {
                    let sql = $create.replace("{t}", &self.name);
                    sqlx::query(sqlx::AssertSqlSafe(sql))
                        .execute(&self.pool)
                        .await?;
                    Ok(())
                })
            }

            fn load<'a>(
                &'a self,
                group: &'a str,
                parts: &'a [(String, i32)],
            ) -> Fut<'a, Vec<(String, i32, i64)>> {
                Box::pin(async move {
                    let rows: Vec<(String, i32, i64)> =
                        sqlx::query_as(sqlx::AssertSqlSafe(self.load.clone()))
                            .bind(group)
                            .fetch_all(&self.pool)
                            .await?;
                    Ok(rows
                        .into_iter()
                        .filter(|(t, p, _)| parts.iter().any(|(pt, pp)| pt == t && pp == p))
                        .collect())
                })
            }

            fn save<'a>(&'a self, group: &'a str, rows: &'a [(String, i32, i64)]) -> Fut<'a, ()> {
                Box::pin(async move {
                    let mut tx = self.pool.begin().await?;
                    for (topic, partition, next) in rows {
                        sqlx::query(sqlx::AssertSqlSafe(self.upsert.clone()))
                            .bind(group)
                            .bind(topic)
                            .bind(*partition)
                            .bind(*next)
                            .execute(&mut *tx)
                            .await?;
                    }
                    tx.commit().await?;
                    Ok(())
                })
            }

            fn in_tx<'a>(&'a self, at: Position, call: CallFut<'a>) -> RodeFut<'a> {
                let rider: Box<dyn crate::store::sql::rider::Rider<$db>> = Box::new($rider {
                    upsert: self.upsert.clone(),
                    at,
                    pool: self.pool.clone(),
                });
                Box::pin(crate::store::sql::rider::ride(rider, call))
            }
        }
    };
}

sql_table!(
    "postgres", crate::PgStore, sqlx::Postgres, PgOffsets, PgRider,
    create: "CREATE TABLE IF NOT EXISTS {t} (consumer_group TEXT NOT NULL, topic TEXT NOT NULL, partition_id INTEGER NOT NULL, next_offset BIGINT NOT NULL, PRIMARY KEY (consumer_group, topic, partition_id))",
    load: "SELECT topic, partition_id, next_offset FROM {t} WHERE consumer_group = $1",
    upsert: "INSERT INTO {t} AS o (consumer_group, topic, partition_id, next_offset) VALUES ($1, $2, $3, $4) ON CONFLICT (consumer_group, topic, partition_id) DO UPDATE SET next_offset = GREATEST(o.next_offset, EXCLUDED.next_offset)"
);

sql_table!(
    "mysql", crate::MySqlStore, sqlx::MySql, MySqlOffsets, MySqlRider,
    create: "CREATE TABLE IF NOT EXISTS {t} (consumer_group VARCHAR(255) NOT NULL, topic VARCHAR(249) NOT NULL, partition_id INT NOT NULL, next_offset BIGINT NOT NULL, PRIMARY KEY (consumer_group, topic, partition_id))",
    load: "SELECT topic, partition_id, next_offset FROM {t} WHERE consumer_group = ?",
    upsert: "INSERT INTO {t} (consumer_group, topic, partition_id, next_offset) VALUES (?, ?, ?, ?) ON DUPLICATE KEY UPDATE next_offset = GREATEST(next_offset, VALUES(next_offset))"
);

sql_table!(
    "sqlite", crate::SqliteStore, sqlx::Sqlite, SqliteOffsets, SqliteRider,
    create: "CREATE TABLE IF NOT EXISTS {t} (consumer_group TEXT NOT NULL, topic TEXT NOT NULL, partition_id INTEGER NOT NULL, next_offset INTEGER NOT NULL, PRIMARY KEY (consumer_group, topic, partition_id))",
    load: "SELECT topic, partition_id, next_offset FROM {t} WHERE consumer_group = ?",
    upsert: "INSERT INTO {t} AS o (consumer_group, topic, partition_id, next_offset) VALUES (?, ?, ?, ?) ON CONFLICT (consumer_group, topic, partition_id) DO UPDATE SET next_offset = MAX(o.next_offset, excluded.next_offset)"
);
