//! Publishing staged messages to RocketMQ (feature `rocketmq`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use rocketmq_model::common::message::message_queue::MessageQueue;

use rocketmq_model::common::message::message_single::Message as RocketMessage;

use super::{Destination, Outgoing};
use crate::consume::rocketmq::client::{Client, Producer};
use crate::error::BoxError;

/// Publishes to RocketMQ: the message's destination is the topic, its id
/// the `KEYS` (what an idem consumer's
/// [`Delivery::id`](crate::consume::Delivery::id) reads, and what the
/// broker indexes, so `mqadmin queryMsgByKey` finds it), its key, when it
/// has one, the tag, and its headers user properties; done once the broker
/// stored it (`SEND_OK`).
///
/// The messages of one lane go to one queue of the topic (chosen by the
/// lane), so they are stored in the order they were staged; idem's
/// RocketMQ consumer hands a queue's messages to its calls in that order,
/// and runs them concurrently.
///
/// # Examples
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
/// use idem_runtime::outbox::{Relay, RocketMqDestination};
///
/// let store = idem_runtime::PgStore::connect("postgres://app@db.internal/shop").await?;
/// let to = RocketMqDestination::connect("127.0.0.1:9876").await?;
/// tokio::spawn(Relay::new(store.outbox_table(), to).run(std::future::pending()));
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RocketMqDestination {
    producer: Producer,
    /// Each topic's queues, looked up once.
    queues: Arc<Mutex<HashMap<String, Vec<MessageQueue>>>>,
    _client: Arc<Client>,
}

impl std::fmt::Debug for RocketMqDestination {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RocketMqDestination")
            .finish_non_exhaustive()
    }
}

impl RocketMqDestination {
    /// A producer (group `idem-outbox`) on the name servers `name_server`
    /// (`host:port`, several joined by `;`).
    ///
    /// # Errors
    ///
    /// The client's, when its runtime cannot be built or the producer not
    /// started. A name server that does not answer is met at the first
    /// publish, which fails and is retried by the relay.
    ///
    /// # Examples
    ///
    /// See [`RocketMqDestination`].
    pub async fn connect(name_server: &str) -> Result<RocketMqDestination, BoxError> {
        let client = Client::new("outbox", 1)?;
        let producer = client.producer(name_server, "idem-outbox").await?;
        Ok(RocketMqDestination {
            producer,
            queues: Arc::default(),
            _client: Arc::new(client),
        })
    }
}

impl RocketMqDestination {
    /// The queue of `topic` that `lane`'s messages go to; `None` while the
    /// topic has none (the send then makes it, where the broker makes
    /// topics).
    async fn queue_of(&self, topic: &str, lane: &str) -> Option<MessageQueue> {
        let known = lock(&self.queues).get(topic).cloned();
        let queues = match known {
            Some(q) if !q.is_empty() => q,
            _ => {
                let mut q = self.producer.queues(topic).await.ok()?;
                q.sort_by(|a, b| {
                    (a.broker_name(), a.queue_id()).cmp(&(b.broker_name(), b.queue_id()))
                });
                lock(&self.queues).insert(topic.to_owned(), q.clone());
                q
            }
        };
        let n = u64::try_from(queues.len()).unwrap_or(1).max(1);
        // The lane is a hex digest: its first 16 digits pick the queue.
        let digits = lane.get(..16).unwrap_or(lane);
        let at = u64::from_str_radix(digits, 16).unwrap_or(0) % n;
        queues.into_iter().nth(usize::try_from(at).unwrap_or(0))
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Destination for RocketMqDestination {
    fn kind(&self) -> &'static str {
        "rocketmq"
    }

    async fn publish(&self, message: &Outgoing) -> Result<(), BoxError> {
        let mut builder = RocketMessage::builder()
            .topic(message.destination.clone())
            .body(message.payload.clone())
            .key(message.id.to_string());
        if let Some(key) = &message.key {
            builder = builder.tags(key.clone());
        }
        for (name, value) in &message.headers {
            builder = builder
                .raw_property(name.clone(), value.clone())
                .map_err(|e| format!("header {name}: {e}"))?;
        }
        let queue = self.queue_of(&message.destination, &message.lane).await;
        let sent = self.producer.send_to(builder.build()?, queue).await;
        if sent.is_err() {
            // The topic's queues may have changed: looked up again next time.
            lock(&self.queues).remove(&message.destination);
        }
        sent
    }
}
