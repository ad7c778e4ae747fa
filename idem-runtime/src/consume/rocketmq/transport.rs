//! The RocketMQ consumer as the front's [`Transport`]: a push consumer whose
//! listener hands each message to the driver ([`listener`](super::listener)),
//! and a producer that sends retries to the group's retry topic and dead
//! letters to its dead-letter topic, each confirmed by the broker before the
//! original is acked.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt as _;
use futures_util::future::BoxFuture;
use rocketmq_client_rust::{DefaultMQPushConsumer, MQPushConsumer as _};
use rocketmq_model::common::consumer::consume_from_where::ConsumeFromWhere;
use rocketmq_model::common::message::message_ext::MessageExt;
use rocketmq_model::common::message::message_single::Message;

use super::client::{Client, Producer};
use super::listener::{Answer, CloseOnDrop, Gate, Listener, Taken};
use super::{Consumer, DUE, PUBLISHED, TOPIC};
use crate::BoxError;
use crate::consume::dead::cause::HEADERS;
use crate::consume::front::transport::{Dead, Opening, Read, Retry, Session, Transport};
use crate::consume::{Attempts, Broker, ConsumeError, Delivery, Meter, Policy, tiers};

/// How many times the broker would send a message back before moving it to
/// `%DLQ%` itself: never, in practice; idem moves it first.
const MAX_RECONSUME: i32 = 10_000;

/// The client's `consume_timeout`, in minutes: a week.
const NO_CONSUME_TIMEOUT_MINUTES: u64 = 7 * 24 * 60;

/// How long a stopping consumer waits for the client's calls that were
/// handed a message after the stop (they are handed back once it is shut
/// down, and their offsets left uncommitted).
const PARKED_WAIT: Duration = Duration::from_secs(1);

/// A connection: the client's runtime and a producer for the copies.
pub(crate) struct Connection {
    client: Client,
    producer: Producer,
}

impl Transport for Consumer {
    type Connection = Connection;
    type Link = Producer;
    type Message = Taken;

    const BROKER: Broker = Broker::RocketMq;

    fn queue(&self) -> &str {
        &self.group
    }

    fn policy(&self) -> &Policy {
        &self.policy
    }

    fn check(&self) -> Result<(), ConsumeError> {
        self.check_topology()
    }

    async fn connect(&self) -> Result<Connection, BoxError> {
        self.connecting().await
    }

    async fn open(&self, conn: &Connection, _: &Meter) -> Result<Session<Self>, Opening> {
        self.opening(conn).await
    }

    async fn close(&self, conn: Connection) {
        let Connection { client, producer } = conn;
        producer.shutdown().await;
        client.close().await;
    }

    fn read<'m>(&self, taken: &'m Taken) -> Read<'m> {
        let msg = &taken.msg;
        let failures = property_u32(msg, "x-idem-failures");
        let retries = property_u32(msg, "x-idem-retries");
        Read {
            payload: msg.message.body_slice(),
            delivery: describe(msg, retries),
            attempts: Attempts {
                failures,
                retries,
                ..Attempts::default()
            },
            due: property(msg, DUE).and_then(|v| v.parse().ok()),
            // What the client saw behind it in its queue when it pulled it.
            waiting: property(msg, "MAX_OFFSET")
                .and_then(|v| v.parse::<i64>().ok())
                .and_then(|max| u64::try_from(max - msg.queue_offset() - 1).ok()),
        }
    }

    async fn ack(&self, _: &Producer, taken: &Taken) -> Result<(), BoxError> {
        taken.answer(Answer::Consumed);
        Ok(())
    }

    async fn retry(
        &self,
        producer: &Producer,
        taken: &Taken,
        retry: Retry<'_>,
    ) -> Result<(), BoxError> {
        let mut set = HashMap::new();
        set.insert("x-idem-failures", retry.failures.to_string());
        set.insert("x-idem-retries", retry.retries.to_string());
        set.insert("x-idem-last-error", retry.reason.to_owned());
        // Due after the wait asked for, not the level's: an early one is
        // sent on when it comes back.
        set.insert(DUE, tiers::due_after(retry.after).to_string());
        set.insert(TOPIC, self.topic.clone());
        set.insert(PUBLISHED, published_ms(&taken.msg).to_string());
        self.send_back(producer, taken, retry.after, &set).await
    }

    async fn dead_letter(
        &self,
        producer: &Producer,
        taken: &Taken,
        dead: Dead<'_>,
    ) -> Result<(), BoxError> {
        let mut set = HashMap::new();
        set.insert("x-idem-reason", dead.reason.to_owned());
        set.insert(TOPIC, self.topic.clone());
        set.insert("x-idem-failures", dead.failures.to_string());
        for (name, value) in dead.cause.map(|c| c.headers(HEADERS)).unwrap_or_default() {
            set.insert(name, value);
        }
        set.insert(super::DEAD_ID, uuid::Uuid::new_v4().to_string());
        set.insert(
            "x-idem-dead-at",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_millis()
                .to_string(),
        );
        let copy = copy_of(&taken.msg, &self.dead_letter_topic(), &set, &[DUE])?;
        producer.send(copy).await?;
        taken.answer(Answer::Consumed);
        Ok(())
    }

    async fn forward(
        &self,
        producer: &Producer,
        taken: &Taken,
        left: Duration,
    ) -> Result<(), BoxError> {
        // Its properties (counts, due time) as they are.
        self.send_back(producer, taken, left, &HashMap::new()).await
    }

    fn waits_here(&self) -> Duration {
        // What is left below the shortest level would wait a whole level.
        self.levels
            .first()
            .copied()
            .unwrap_or_default()
            .max(tiers::DUE_SLACK)
    }

    async fn give_back(&self, taken: &Taken, _: Option<Duration>) {
        taken.answer(Answer::Later);
    }
}

impl Consumer {
    /// [`Transport::connect`], boxed (see [`Client::producer`]).
    fn connecting(&self) -> BoxFuture<'_, Result<Connection, BoxError>> {
        Box::pin(async move {
            let client = Client::new(&self.group, self.policy.concurrency)?;
            let producer = match client
                .producer(&self.name_server, &format!("{}-idem", self.group))
                .await
            {
                Ok(p) => p,
                Err(e) => {
                    client.close().await;
                    return Err(e);
                }
            };
            // The name server answers, and the topics exist (made where
            // missing): a consumer of a topic nobody made would wait for it
            // silently, and take a retry topic made later only at its next
            // rebalance.
            for topic in [self.topic.clone(), self.retry_topic()] {
                if let Err(e) = producer.ensure_topic(&topic).await {
                    producer.shutdown().await;
                    client.close().await;
                    return Err(e);
                }
            }
            // The dead-letter topic too, for a broker that makes no topic
            // on a send (`autoCreateTopicEnable = false`); one that refuses
            // to make it is told at the first dead letter.
            let dead = self.dead_letter_topic();
            if let Err(e) = producer.ensure_topic(&dead).await {
                tracing::warn!(topic = %dead, error = %e, "the dead-letter topic could not be made");
            }
            Ok(Connection { client, producer })
        })
    }

    /// [`Transport::open`], boxed (see [`Client::producer`]).
    fn opening<'a>(
        &'a self,
        conn: &'a Connection,
    ) -> BoxFuture<'a, Result<Session<Self>, Opening>> {
        Box::pin(async move {
            let threads = u32::try_from(self.policy.concurrency.max(1)).unwrap_or(u32::MAX);
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            let gate = Arc::new(Gate::default());
            let mut consumer = DefaultMQPushConsumer::builder(conn.client.runtime())
                .consumer_group(self.group.clone())
                .name_server_addr(self.name_server.clone())
                .consume_from_where(ConsumeFromWhere::ConsumeFromFirstOffset)
                .consume_thread_min(threads)
                .consume_thread_max(threads)
                .consume_message_batch_max_size(1)
                .max_reconsume_times(MAX_RECONSUME)
                // A body's limit is the handler's: the client would otherwise
                // hand back a message whose body ran 15 minutes, while it runs.
                .consume_timeout(NO_CONSUME_TIMEOUT_MINUTES)
                .await_termination_millis_when_shutdown(
                    u64::try_from(PARKED_WAIT.as_millis()).unwrap_or(u64::MAX),
                )
                .build();
            consumer
                .subscribe(self.topic.as_str(), self.tags.as_str())
                .await
                .map_err(|e| Opening::Refused(Box::new(e)))?;
            // The copies keep their tags: the retry topic's are all ours.
            consumer
                .subscribe(self.retry_topic(), "*")
                .await
                .map_err(|e| Opening::Refused(Box::new(e)))?;
            consumer.register_message_listener_concurrently(Listener::new(tx, Arc::clone(&gate)));
            consumer
                .start()
                .await
                .map_err(|e| Opening::Lost(Box::new(e)))?;
            let consumer = Arc::new(tokio::sync::Mutex::new(consumer));
            let stop_taking = {
                let (gate, consumer) = (Arc::clone(&gate), Arc::clone(&consumer));
                async move {
                    gate.stop();
                    consumer.lock().await.suspend().await;
                }
            };
            let closes = CloseOnDrop(Arc::clone(&gate));
            let closing = async move {
                let _closes = closes;
                // The calls in flight are settled: shutting down commits their
                // offsets. Calls handed a message after the stop wait, so the
                // shutdown leaves their offsets behind them; they are released
                // once it is over.
                gate.stop();
                consumer.lock().await.shutdown().await;
                gate.close();
            };
            let messages = futures_util::stream::unfold(rx, |mut rx| async move {
                rx.recv().await.map(|m| (m, rx))
            });
            Ok(Session {
                messages: Box::pin(messages),
                link: conn.producer.clone(),
                stop_taking: stop_taking.boxed(),
                closing: closing.boxed(),
            })
        })
    }

    /// Sends a copy of `taken` to the retry topic at the level for `wait`,
    /// with `set` over its properties, and acks the original once the broker
    /// has it.
    async fn send_back(
        &self,
        producer: &Producer,
        taken: &Taken,
        wait: Duration,
        set: &HashMap<&str, String>,
    ) -> Result<(), BoxError> {
        let mut copy = copy_of(&taken.msg, &self.retry_topic(), set, &[])?;
        copy.set_delay_time_level(self.delay_level(wait));
        producer.send(copy).await?;
        taken.answer(Answer::Consumed);
        Ok(())
    }
}

/// A copy of `msg` for `topic`: its body, `KEYS`, `TAGS` and user
/// properties, with `set` over them and `drop` left out.
fn copy_of(
    msg: &MessageExt,
    topic: &str,
    set: &HashMap<&str, String>,
    drop: &[&str],
) -> Result<Message, BoxError> {
    use rocketmq_model::common::message::message_property::MessagePropertyKey;
    let mut builder = Message::builder()
        .topic(topic.to_owned())
        .body(msg.message.body().unwrap_or_default());
    if let Some(tags) = msg.get_tags() {
        builder = builder.tags(tags);
    }
    if let Some(keys) = property(msg, "KEYS") {
        builder = builder.property(MessagePropertyKey::Keys, keys.to_owned());
    }
    for (name, value) in msg.properties() {
        let name = name.as_str();
        if is_system(name) || set.contains_key(name) || drop.contains(&name) || value.is_empty() {
            continue;
        }
        builder = builder.raw_property(name.to_owned(), value.clone())?;
    }
    for (name, value) in set {
        let value = clean(value);
        if !value.is_empty() {
            builder = builder.raw_property((*name).to_owned(), value)?;
        }
    }
    Ok(builder.build()?)
}

/// `value` as a property may hold it: RocketMQ separates properties with
/// two control characters, so control characters become spaces, and a
/// value is cut at 4,000 bytes (on a character's boundary): the broker
/// refuses a message whose properties pass 32 KiB.
fn clean(value: &str) -> String {
    let mut out = String::new();
    for c in value.chars() {
        if out.len() + c.len_utf8() > 4_000 {
            break;
        }
        out.push(if c.is_control() { ' ' } else { c });
    }
    out
}

/// Whether `name` is a property of RocketMQ's own, which a copy must not
/// carry as a user's: the client's list, and the broker's and
/// transactions' own (`__`-prefixed, the multi-dispatch and trace ones).
pub(crate) fn is_system(name: &str) -> bool {
    use rocketmq_model::common::message::STRING_HASH_SET;
    STRING_HASH_SET.contains(name)
        || name.starts_with("__")
        || matches!(
            name,
            "INNER_MULTI_DISPATCH"
                | "INNER_NUM"
                | "INNER_BASE"
                | "TRANSACTION_CHECK_TIMES"
                | "TRACE_CONTEXT"
                | "REDIRECT"
        )
}

/// The property `name` of `msg`.
pub(crate) fn property<'m>(msg: &'m MessageExt, name: &str) -> Option<&'m str> {
    msg.properties().get(name).map(|v| v.as_str())
}

fn property_u32(msg: &MessageExt, name: &str) -> u32 {
    property(msg, name)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// When `msg` was first published, in ms since the Unix epoch: a retry's
/// copy carries its original's time.
fn published_ms(msg: &MessageExt) -> i64 {
    property(msg, PUBLISHED)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| msg.born_timestamp())
}

/// What the broker said about `msg`, for the handler.
fn describe(msg: &MessageExt, retries: u32) -> Delivery {
    let bounced = u32::try_from(msg.reconsume_times().max(0)).unwrap_or(0);
    let deliveries = retries.saturating_add(bounced).saturating_add(1);
    Delivery {
        broker: Some(Broker::RocketMq),
        // A retry's copy says where it came from.
        source: property(msg, TOPIC).map_or_else(|| msg.topic().to_string(), str::to_owned),
        redelivered: deliveries > 1,
        retries: retries.saturating_add(bounced),
        deliveries,
        id: property(msg, "KEYS")
            .filter(|k| !k.trim().is_empty())
            .or_else(|| property(msg, "UNIQ_KEY"))
            .map(str::to_owned),
        partition: Some(msg.queue_id()),
        offset: Some(msg.queue_offset()),
        published_at: u64::try_from(published_ms(msg))
            .ok()
            .and_then(|ms| std::time::UNIX_EPOCH.checked_add(Duration::from_millis(ms))),
        headers: msg
            .properties()
            .iter()
            .map(|(n, v)| (n.to_string(), v.as_bytes().to_vec()))
            .collect(),
    }
}
