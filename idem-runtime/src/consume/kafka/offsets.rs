//! Offsets kept in the database of a SQL store, written in the handler's
//! transaction ([`Consumer::offsets_in`](super::Consumer::offsets_in)).
//!
//! The table is the store's offset table of source `kafka`
//! ([`SqlStore::offset_table`](crate::store::sql::SqlStore::offset_table):
//! `<dedup table>_kafka_offsets`, its SQL the store's), one row per
//! consumer group, topic and partition: the next offset to consume. An
//! executed message's transaction writes its row with the body's writes
//! and the dedup record ([`OffsetTable::ride`](crate::store::sql::OffsetTable::ride)),
//! so the effect and the position commit together; the consumer also
//! writes the rows of every settled message (duplicates, retries, dead
//! letters) at each commit, before the broker's. A row only ever moves
//! forward.
//!
//! On assignment the rows override the broker's committed offsets.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::BoxError;
#[cfg(feature = "_sql")]
use crate::store::sql::{Dialect, OffsetTable, SqlStore};

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

/// The offsets table of a SQL store: the store's [`OffsetTable`].
#[cfg(feature = "_sql")]
struct SqlOffsets<D: Dialect>(OffsetTable<D>);

#[cfg(feature = "_sql")]
impl<D: Dialect> From<&SqlStore<D>> for Offsets {
    fn from(store: &SqlStore<D>) -> Self {
        Offsets {
            table: Arc::new(SqlOffsets(store.offset_table("kafka"))),
            warned: Arc::default(),
        }
    }
}

#[cfg(feature = "_sql")]
impl<D: Dialect> Table for SqlOffsets<D> {
    fn name(&self) -> &str {
        self.0.name()
    }

    fn create(&self) -> Fut<'_, ()> {
        Box::pin(async move { Ok(self.0.create().await?) })
    }

    fn load<'a>(
        &'a self,
        group: &'a str,
        parts: &'a [(String, i32)],
    ) -> Fut<'a, Vec<(String, i32, i64)>> {
        Box::pin(async move {
            let rows = self.0.load(group).await?;
            Ok(rows
                .into_iter()
                .filter(|(t, p, _)| parts.iter().any(|(pt, pp)| pt == t && pp == p))
                .collect())
        })
    }

    fn save<'a>(&'a self, group: &'a str, rows: &'a [(String, i32, i64)]) -> Fut<'a, ()> {
        Box::pin(async move { Ok(self.0.save(group, rows).await?) })
    }

    fn in_tx<'a>(&'a self, at: Position, call: CallFut<'a>) -> RodeFut<'a> {
        Box::pin(async move {
            self.0
                .ride(&at.group, &at.topic, at.partition, at.next, call)
                .await
        })
    }
}
