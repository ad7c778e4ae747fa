//! The consumer suite (`common/broker.rs`) on RabbitMQ: each test on a work
//! queue of its own (and the retry and dead-letter queues the consumer
//! declares for it), deleted afterwards.

mod common;

use std::future::Future;

use common::AppError;
use common::broker::{self, Broker, DeadLetter, Points, Running};
use futures_util::StreamExt as _;
use idem_runtime::consume::rabbitmq::{Consumer, RETRY_DELAYS};
use idem_runtime::consume::{Broker as Kind, Delivery, Policy};
use idem_runtime::{Error, Outcome};
use idem_tests::brokers::{DeleteQueues, amqp_channel, amqp_url};
use idem_tests::{or_skip, unique_table};
use lapin::options::{BasicConsumeOptions, BasicPublishOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Channel, Connection};

struct Rabbit {
    consumer: Consumer,
    queue: String,
    channel: Channel,
    conn: Connection,
    _cleanup: DeleteQueues,
}

impl Broker for Rabbit {
    async fn open(name: &str) -> Option<Self> {
        let (conn, channel) = amqp_channel().await?;
        let queue = unique_table(name);
        let consumer = Consumer::new(amqp_url(), queue.clone());
        let mut queues = vec![queue.clone(), consumer.dead_letter_queue()];
        queues.extend(RETRY_DELAYS.iter().map(|d| consumer.retry_queue(*d)));
        let cleanup = DeleteQueues::new(queues);
        // The work queue exists before anything is published to it.
        let durable = QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        };
        channel
            .queue_declare(queue.as_str().into(), durable, FieldTable::default())
            .await
            .expect("declare the work queue");
        Some(Rabbit {
            consumer,
            queue,
            channel,
            conn,
            _cleanup: cleanup,
        })
    }

    async fn publish(&self, payload: &[u8]) {
        self.channel
            .basic_publish(
                ShortString::from(""),
                self.queue.as_str().into(),
                BasicPublishOptions::default(),
                payload,
                BasicProperties::default()
                    .with_delivery_mode(2)
                    .with_timestamp(unix_seconds()),
            )
            .await
            .expect("publish")
            .await
            .expect("publish confirmed");
    }

    const KIND: Kind = Kind::RabbitMq;

    fn queue_label(&self) -> String {
        self.queue.clone()
    }

    fn source(&self) -> String {
        self.queue.clone()
    }

    fn start_with_delivery<F, Fut>(&self, policy: Policy, handler: F) -> Running
    where
        F: Fn(Points, Delivery) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Outcome<u32>, Error<AppError>>> + Send + 'static,
    {
        let (stop, signal) = broker::shutdown();
        let consumer = self.consumer.clone().policy(policy);
        Running::new(
            stop,
            tokio::spawn(consumer.run_with_delivery(handler, signal)),
        )
    }

    async fn dead_letters(&self) -> Vec<DeadLetter> {
        let dead = self.consumer.dead_letter_queue();
        let count = self.depth(&dead).await;
        if count == 0 {
            return Vec::new();
        }
        // Read them without taking them: consume, and let the channel's
        // close hand them back.
        let channel = self.conn.create_channel().await.expect("a channel");
        let mut stream = channel
            .basic_consume(
                dead.as_str().into(),
                "inspect".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect("consume the dead letters");
        let mut out = Vec::new();
        while (out.len() as u64) < count {
            let d = stream
                .next()
                .await
                .expect("a dead letter")
                .expect("a delivery");
            let headers = d.properties.headers().clone().unwrap_or_default();
            let text = |name: &str| match headers.inner().get(&ShortString::from(name)) {
                Some(AMQPValue::LongString(s)) => s.to_string(),
                other => format!("{other:?}"),
            };
            let attempts = match headers.inner().get(&ShortString::from("x-idem-failures")) {
                Some(AMQPValue::LongLongInt(n)) => *n as u64,
                _ => 0,
            };
            out.push(DeadLetter {
                payload: d.data.clone(),
                reason: text("x-idem-reason"),
                attempts,
            });
        }
        let _ = channel.close(200, "inspected".into()).await;
        out
    }

    async fn waiting(&self) -> u64 {
        let mut n = self.depth(&self.queue).await;
        for delay in RETRY_DELAYS {
            n += self.depth(&self.consumer.retry_queue(delay)).await;
        }
        n
    }
}

impl Rabbit {
    /// Ready messages in `queue` (a passive declare, on a channel of its
    /// own: asking for a queue that does not exist yet closes the channel);
    /// 0 when the consumer has not declared it yet.
    async fn depth(&self, queue: &str) -> u64 {
        let passive = QueueDeclareOptions {
            passive: true,
            ..QueueDeclareOptions::default()
        };
        let channel = self.conn.create_channel().await.expect("a channel");
        let count = match channel
            .queue_declare(queue.into(), passive, FieldTable::default())
            .await
        {
            Ok(q) => u64::from(q.message_count()),
            Err(_) => 0,
        };
        let _ = channel.close(200, "inspected".into()).await;
        count
    }
}

macro_rules! on_rabbitmq {
    ($($scenario:ident),* $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $scenario() {
            let b = or_skip!(Rabbit::open(concat!("rmq_", stringify!($scenario))).await);
            broker::$scenario(&b).await;
        }
    )*};
}

on_rabbitmq!(
    every_message_takes_effect_once,
    an_undecodable_payload_is_dead_lettered_with_the_reason,
    a_failing_body_is_retried_then_dead_lettered,
    a_panicking_handler_is_retried_then_dead_lettered,
    shutdown_lets_bodies_in_flight_finish_and_acks_them,
    the_handler_is_told_about_each_delivery,
    the_consumer_counts_what_it_did,
);

/// A work queue that exists as a quorum queue is used as it is (declaring
/// it again as a classic queue would be refused by the broker).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_existing_quorum_queue_is_used_as_it_is() {
    let (conn, channel) = or_skip!(amqp_channel().await);
    let queue = unique_table("rmq_quorum");
    let consumer = Consumer::new(amqp_url(), queue.clone());
    let mut queues = vec![queue.clone(), consumer.dead_letter_queue()];
    queues.extend(RETRY_DELAYS.iter().map(|d| consumer.retry_queue(*d)));
    let _cleanup = DeleteQueues::new(queues);
    let mut args = FieldTable::default();
    args.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("quorum".into()),
    );
    let durable = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    channel
        .queue_declare(queue.as_str().into(), durable, args)
        .await
        .expect("a quorum queue");
    channel
        .basic_publish(
            ShortString::from(""),
            queue.as_str().into(),
            BasicPublishOptions::default(),
            &Points::payload("q-1", 5),
            BasicProperties::default().with_delivery_mode(2),
        )
        .await
        .expect("publish");
    let store = idem_runtime::MemoryStore::new();
    let effects = std::sync::Arc::new(common::broker::Effects::default());
    let handler = {
        let effects = std::sync::Arc::clone(&effects);
        move |msg: Points| {
            let (store, effects) = (store.clone(), std::sync::Arc::clone(&effects));
            async move { common::broker::grant(&store, &msg, &effects).await }
        }
    };
    let (stop, signal) = broker::shutdown();
    let running = Running::new(stop, tokio::spawn(consumer.run(handler, signal)));
    common::eventually(
        std::time::Duration::from_secs(20),
        "the message from the quorum queue",
        || async { effects.of("q-1") == 1 },
    )
    .await;
    let report = running.stop().await;
    assert_eq!(report.acked, 1, "{report:?}");
    drop(conn);
}

/// A set-up the broker refuses for good (here, the dead-letter queue exists
/// with other arguments) ends `run` with `ConsumeError::Setup` instead of
/// reconnecting forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_topology_is_a_setup_error() {
    let (conn, channel) = or_skip!(amqp_channel().await);
    let queue = unique_table("rmq_refused");
    let consumer = Consumer::new(amqp_url(), queue.clone());
    let mut queues = vec![queue.clone(), consumer.dead_letter_queue()];
    queues.extend(RETRY_DELAYS.iter().map(|d| consumer.retry_queue(*d)));
    let _cleanup = DeleteQueues::new(queues);
    let mut args = FieldTable::default();
    args.insert("x-max-length".into(), AMQPValue::LongLongInt(10));
    let durable = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    channel
        .queue_declare(consumer.dead_letter_queue().as_str().into(), durable, args)
        .await
        .expect("a dead-letter queue with other arguments");
    let store = idem_runtime::MemoryStore::new();
    let effects = std::sync::Arc::new(common::broker::Effects::default());
    let run = consumer.run(
        move |msg: Points| {
            let (store, effects) = (store.clone(), std::sync::Arc::clone(&effects));
            async move { common::broker::grant(&store, &msg, &effects).await }
        },
        idem_runtime::consume::CancellationToken::new(),
    );
    match tokio::time::timeout(std::time::Duration::from_secs(20), run).await {
        Ok(Err(idem_runtime::consume::ConsumeError::Setup(e))) => {
            assert!(e.to_string().contains("PRECONDITION_FAILED"), "{e}")
        }
        other => panic!("expected a set-up error, got {other:?}"),
    }
    drop(conn);
}

/// Now, as AMQP's `timestamp` property has it: whole seconds.
fn unix_seconds() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
