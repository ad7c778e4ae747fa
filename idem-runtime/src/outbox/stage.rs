//! Staging: what a body calls to send a message on, in its transaction.

use std::sync::Arc;

use sqlx::Transaction;

use super::{Message, MessageId, MessageIds};
use crate::error::StoreError;
use crate::store::sql::Dialect;
use crate::store::sql::outbox::OutboxSql;
use crate::store::sql::template::Values;

/// Stages outgoing messages in a transaction of a SQL store's database:
/// each [`stage`](Self::stage) inserts one row in the store's outbox
/// table, which commits with the transaction (the claim, the body's
/// writes and the outcome, in a transaction-mode handler) or not at all;
/// a [`Relay`](super::Relay) publishes it after the commit.
///
/// A transaction-mode handler takes one as a parameter, `outbox: &mut
/// Outbox`, made for it with the handler's name and the delivery's key; a
/// producer that is not a handler gets one from
/// [`SqlStore::outbox`](crate::store::sql::SqlStore::outbox). Each staged
/// message's id is derived from that name, that key and its place in the
/// body ([`MessageId`]): a body that runs again after a rollback stages
/// the same ids.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use idem_runtime::outbox::{Message, MessageId, Outbox};
/// use idem_runtime::{idempotent, Outcome, SqliteStore, SqliteTx};
///
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct OrderPlaced { order_id: u64, qty: u32 }
///
/// #[idempotent(key = "order_id", ttl = "1d", store = "sqlite")]
/// async fn deduct(tx: &mut SqliteTx<'_>, msg: &OrderPlaced, outbox: &mut Outbox) -> Result<u32, idem_runtime::BoxError> {
///     // ... the body's own writes through `tx` ...
///     outbox.stage(tx, Message::json("stock.deducted", msg)?).await?;
///     Ok(msg.qty)
/// }
///
/// let store = SqliteStore::connect("sqlite::memory:").await?;
/// store.migrate().await?;
/// let msg = OrderPlaced { order_id: 7, qty: 2 };
/// assert_eq!(deduct(&store, &msg).await?, Outcome::Executed(2));
/// assert_eq!(deduct(&store, &msg).await?, Outcome::Duplicate(2)); // stages nothing
///
/// let rows = store.outbox_table().list(0, 10).await?;
/// assert_eq!(rows.len(), 1);
/// // the handler, the delivery's key (stored form) and place 0
/// assert_eq!(rows[0].id, MessageId::derive("deduct", "1:7", 0));
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Outbox {
    sql: Arc<OutboxSql>,
    ids: MessageIds,
    staged: u32,
}

/// A message could not be staged.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use idem_runtime::SqliteStore;
/// use idem_runtime::outbox::{Message, StageError};
///
/// let store = SqliteStore::connect("sqlite::memory:").await?;
/// store.migrate().await?;
/// let mut tx = store.pool().begin().await?;
/// let e = store.outbox("p", "k").stage(&mut tx, Message::new("", "x")).await.unwrap_err();
/// assert!(matches!(e, StageError::Invalid { .. }));
/// assert!(e.to_string().contains("destination is empty"));
/// # Ok(()) }
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StageError {
    /// The message cannot be a row: what is wrong with it (a destination
    /// empty or too long, a header no broker takes).
    #[error("cannot stage a message of `{producer}` (key {key}): {reason}")]
    Invalid {
        /// The handler or producer.
        producer: String,
        /// The key of its call (stored form).
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// The transaction is of another kind of database than the outbox's
    /// store (a transaction of another database of the same kind is not
    /// told apart: stage on the store's own pool).
    #[error(
        "cannot stage a message of `{producer}` on a {given} transaction: its outbox is in a {store} database"
    )]
    OtherDatabase {
        /// The handler or producer.
        producer: String,
        /// The outbox's database.
        store: &'static str,
        /// The transaction's database.
        given: &'static str,
    },
    /// The transaction is over: an HTTP route's response was already taken
    /// ([`RequestTx::stage`](crate::http::RequestTx) after it).
    #[error("cannot stage a message of `{producer}`: the request's transaction is over")]
    Over {
        /// The route.
        producer: String,
    },
    /// The database refused the row: the transaction is to be rolled back.
    #[error("cannot stage a message of `{producer}` (key {key}) in {table}: {source}")]
    Store {
        /// The handler or producer.
        producer: String,
        /// The key of its call (stored form).
        key: String,
        /// The outbox table.
        table: String,
        /// The database's error.
        #[source]
        source: StoreError,
    },
}

impl Outbox {
    /// An outbox on `sql`'s table for `producer`'s call of `key`, whose
    /// next message is at `place`.
    pub(crate) fn new(sql: Arc<OutboxSql>, producer: &str, key: &str, place: u32) -> Outbox {
        Outbox {
            sql,
            ids: MessageIds::starting_at(producer, key, place),
            staged: 0,
        }
    }

    /// Stages `message` in `tx`: one row in the outbox table, published by
    /// a relay once `tx` commits. Returns the message's id, which the
    /// relay hands the broker in its own field (AMQP `message_id`, NATS
    /// `Nats-Msg-Id`, the Kafka header `x-idem-message-id`). With the
    /// feature `otel`, a message without a `traceparent` of its own carries
    /// the current span's (see `idem_runtime::trace`), so that its
    /// consumer continues the trace.
    ///
    /// # Errors
    ///
    /// [`StageError::Invalid`] for an empty or over-long destination (see
    /// [`MAX_DESTINATION_LEN`](super::MAX_DESTINATION_LEN)) or a header no
    /// broker takes (see [`Message::header`]); [`StageError::OtherDatabase`]
    /// for a transaction of another kind of database; [`StageError::Store`] when the insert fails (the
    /// table is missing: `migrate()` creates it).
    ///
    /// # Examples
    ///
    /// See [`Outbox`].
    pub async fn stage<D: Dialect>(
        &mut self,
        tx: &mut Transaction<'_, D>,
        message: Message,
    ) -> Result<MessageId, StageError> {
        if D::STORE != self.sql.store {
            return Err(StageError::OtherDatabase {
                producer: self.ids.handler().to_owned(),
                store: self.sql.store,
                given: D::STORE,
            });
        }
        #[cfg(feature = "otel")]
        let message = crate::trace::stamped(message);
        if let Err(reason) = message.check() {
            return Err(StageError::Invalid {
                producer: self.ids.handler().to_owned(),
                key: self.ids.key().to_owned(),
                reason,
            });
        }
        let id = self.ids.next_id();
        let lane = message.stored_lane(self.ids.key());
        let headers = message.stored_headers();
        let values = Values {
            id: id.as_str(),
            handler: self.ids.handler(),
            destination: message.destination(),
            msgkey: message.message_key(),
            lane: &lane,
            payload: message.payload(),
            headers: headers.as_deref(),
            ..Values::default()
        };
        if let Err(e) = D::run(&mut **tx, &self.sql.insert, &values).await {
            return Err(StageError::Store {
                producer: self.ids.handler().to_owned(),
                key: self.ids.key().to_owned(),
                table: self.sql.table.clone(),
                source: StoreError::backend(e),
            });
        }
        self.staged += 1;
        Ok(id)
    }

    /// How many messages this outbox staged.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = idem_runtime::SqliteStore::connect("sqlite::memory:").await?;
    /// assert_eq!(store.outbox("p", "k").staged(), 0);
    /// # Ok(()) }
    /// ```
    pub fn staged(&self) -> u32 {
        self.staged
    }

    /// Commits `tx`, which holds this outbox's rows, and wakes the relays
    /// of this process to publish them at once: what a producer that is
    /// not a handler ends with. (A handler's outbox is committed with its
    /// outcome; a transaction committed otherwise is published at the
    /// relays' next poll.)
    ///
    /// # Errors
    ///
    /// The database's, as [`StoreError::Backend`]: nothing was committed.
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
    /// store.migrate().await?;
    /// let mut tx = store.pool().begin().await?;
    /// // ... the producer's own writes ...
    /// let mut outbox = store.outbox("place_order", "A-17");
    /// outbox.stage(&mut tx, Message::new("orders", r#"{"order_id":17}"#)).await?;
    /// outbox.commit(tx).await?;
    /// assert_eq!(store.outbox_table().backlog().await?.rows, 1);
    /// # Ok(()) }
    /// ```
    pub async fn commit<D: Dialect>(self, tx: Transaction<'_, D>) -> Result<(), StoreError> {
        tx.commit().await.map_err(StoreError::backend)?;
        self.committed();
        Ok(())
    }

    /// This outbox's rows committed: counted, and the relays woken.
    pub(crate) fn committed(&self) {
        super::committed(self.ids.handler(), self.staged);
    }
}
