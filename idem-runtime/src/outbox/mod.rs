//! The producer side: a transactional outbox whose outgoing ids derive
//! from the incoming key.
//!
//! A transaction-mode body stages what it sends on through its own
//! transaction ([`Outbox::stage`]): the rows commit with the claim, the
//! body's writes and the outcome, or not at all, and a duplicate stages
//! nothing. Each message's id is derived from the handler, the delivery's
//! key and the message's place in the body ([`MessageId`]), so a body that
//! runs again after a rollback stages the same ids. A [`Relay`] publishes
//! the rows after the commit to a [`Destination`] (Kafka, RabbitMQ, NATS
//! JetStream, or one of your own), with the id in the broker's own field,
//! and deletes each row once the broker confirmed it.
//!
//! | piece | what it is |
//! | --- | --- |
//! | [`Outbox`] | stages [`Message`]s in a transaction: a handler's `outbox: &mut Outbox` parameter, or [`SqlStore::outbox`](crate::store::sql::SqlStore::outbox) |
//! | [`MessageId`], [`MessageIds`] | the derived ids; `MessageIds` for a lease-mode body that publishes directly |
//! | [`OutboxTable`](crate::store::sql::OutboxTable) | the rows, for relays and operators ([`SqlStore::outbox_table`](crate::store::sql::SqlStore::outbox_table)) |
//! | [`Relay`], [`Destination`] | publishing, and where to |
//!
//! What is atomic with what, what the ids are, and what a crash at each
//! step leaves: [`guide::outbox`](crate::guide::outbox).
//!
//! # Examples
//!
//! A handler that deducts stock and sends `StockDeducted` on, and a relay
//! that publishes it (here to a destination in memory):
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::{Arc, Mutex};
//! use idem_runtime::outbox::{Destination, Message, Outbox, Outgoing, Relay};
//! use idem_runtime::{idempotent, BoxError, Outcome, SqliteStore, SqliteTx};
//!
//! #[derive(serde::Deserialize)]
//! struct OrderPlaced { order_id: u64, sku: String, qty: i64 }
//!
//! #[derive(serde::Serialize)]
//! struct StockDeducted { order_id: u64, left: i64 }
//!
//! #[idempotent(key = "order_id + sku", ttl = "1d", store = "sqlite")]
//! async fn deduct_and_send(tx: &mut SqliteTx<'_>, msg: &OrderPlaced, outbox: &mut Outbox) -> Result<i64, BoxError> {
//!     let left: i64 = sqlx::query_scalar("UPDATE stock SET qty = qty - ?1 WHERE sku = ?2 RETURNING qty")
//!         .bind(msg.qty)
//!         .bind(&msg.sku)
//!         .fetch_one(&mut **tx)
//!         .await?;
//!     let sent = StockDeducted { order_id: msg.order_id, left };
//!     outbox.stage(tx, Message::json("stock.deducted", &sent)?.key(msg.sku.as_str())).await?;
//!     Ok(left)
//! }
//!
//! #[derive(Default, Clone)]
//! struct Sent(Arc<Mutex<Vec<Outgoing>>>);
//! impl Destination for Sent {
//!     fn kind(&self) -> &'static str { "memory" }
//!     async fn publish(&self, m: &Outgoing) -> Result<(), BoxError> {
//!         self.0.lock().unwrap().push(m.clone());
//!         Ok(())
//!     }
//! }
//!
//! let store = SqliteStore::connect("sqlite::memory:").await?;
//! store.migrate().await?;
//! sqlx::query("CREATE TABLE stock (sku TEXT PRIMARY KEY, qty INTEGER)").execute(store.pool()).await?;
//! sqlx::query("INSERT INTO stock VALUES ('apple', 10)").execute(store.pool()).await?;
//!
//! let msg = OrderPlaced { order_id: 7, sku: "apple".into(), qty: 3 };
//! assert_eq!(deduct_and_send(&store, &msg).await?, Outcome::Executed(7));
//! assert_eq!(deduct_and_send(&store, &msg).await?, Outcome::Duplicate(7));
//!
//! let sent = Sent::default();
//! Relay::new(store.outbox_table(), sent.clone()).pass().await?;
//! let sent = sent.0.lock().unwrap();
//! assert_eq!(sent.len(), 1); // once, though the message came twice
//! assert_eq!(sent[0].payload, br#"{"order_id":7,"left":7}"#);
//! assert_eq!(sent[0].key.as_deref(), Some("apple"));
//! # Ok(()) }
//! ```

mod id;
#[cfg(feature = "kafka")]
mod kafka;
mod message;
mod metrics;
#[cfg(feature = "nats")]
mod nats;
#[cfg(feature = "rabbitmq")]
mod rabbitmq;
mod relay;
#[cfg(feature = "rocketmq")]
mod rocketmq;
mod stage;

use std::time::Duration;

pub use id::{MessageId, MessageIds};
#[cfg(feature = "kafka")]
#[cfg_attr(docsrs, doc(cfg(feature = "kafka")))]
pub use kafka::{KAFKA_ID_HEADER, KafkaDestination};
pub use message::{MAX_DESTINATION_LEN, Message, Outgoing};
#[cfg(feature = "nats")]
#[cfg_attr(docsrs, doc(cfg(feature = "nats")))]
pub use nats::NatsDestination;
#[cfg(feature = "rabbitmq")]
#[cfg_attr(docsrs, doc(cfg(feature = "rabbitmq")))]
pub use rabbitmq::RabbitMqDestination;
pub use relay::{Destination, Pass, Relay};
#[cfg(feature = "rocketmq")]
#[cfg_attr(docsrs, doc(cfg(feature = "rocketmq")))]
pub use rocketmq::RocketMqDestination;
pub use stage::{Outbox, StageError};

/// `n` messages of `producer` were committed: counted, and the relays of
/// this process woken.
pub(crate) fn committed(producer: &str, n: u32) {
    if n > 0 {
        metrics::staged(producer, n);
        relay::wake();
    }
}

/// The rows of an outbox table waiting to be published.
///
/// # Examples
///
/// See [`OutboxTable`](crate::store::sql::OutboxTable).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Backlog {
    /// How many rows wait.
    pub rows: u64,
    /// How long the oldest has waited (zero when none waits).
    pub oldest_age: Duration,
}

/// A store whose transactions can stage outgoing messages: what a
/// handler's `outbox: &mut Outbox` parameter needs of its store. The SQL
/// stores implement it.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use idem_runtime::outbox::OutboxStore;
///
/// let store = idem_runtime::SqliteStore::connect("sqlite::memory:").await?;
/// let outbox = OutboxStore::outbox_for(&store, "deduct", "1:7");
/// assert_eq!(outbox.staged(), 0);
/// # Ok(()) }
/// ```
pub trait OutboxStore {
    /// An outbox for `handler`'s call of `key` (its stored form).
    fn outbox_for(&self, handler: &str, key: &str) -> Outbox;
}

impl<D: crate::store::sql::Dialect> OutboxStore for crate::store::sql::SqlStore<D> {
    fn outbox_for(&self, handler: &str, key: &str) -> Outbox {
        self.outbox(handler, key)
    }
}
