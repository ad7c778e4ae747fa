//! The consumer suite (`common/broker.rs`) on RabbitMQ: each test on a work
//! queue of its own (and the retry and dead-letter queues the consumer
//! declares for it), deleted afterwards.

use crate::common;

use std::future::Future;

use common::AppError;
use common::broker::{self, Broker, DeadLetter, Points, Running};
use futures_util::StreamExt as _;
use idem_runtime::consume::rabbitmq::Consumer;
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

impl broker::Proxied for Rabbit {
    const PORT: u16 = 5672;
    const KEEPS_ACKS: bool = false;

    fn start_through(&self, port: u16, handler: broker::Boxed) -> Running {
        let (stop, signal) = broker::shutdown();
        let url = amqp_url().replace(":5672", &format!(":{port}"));
        let consumer = Consumer::new(url, self.queue.clone());
        Running::new(stop, tokio::spawn(consumer.run(handler, signal)))
    }
}

impl Broker for Rabbit {
    const TIERED: bool = true;
    const CUTS_PAST_GRACE: bool = true;

    async fn open(name: &str) -> Option<Self> {
        let (conn, channel) = amqp_channel().await?;
        let queue = unique_table(name);
        let consumer = Consumer::new(amqp_url(), queue.clone());
        let cleanup = DeleteQueues::new(queues_of(&consumer, &queue));
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
        Running::new(stop, tokio::spawn(consumer.run(handler, signal)))
    }

    type To = idem_runtime::outbox::RabbitMqDestination;

    async fn destination(&self) -> Self::To {
        idem_runtime::outbox::RabbitMqDestination::connect(&amqp_url())
            .await
            .expect("connect the destination")
    }

    const DROPS_REPEATED_IDS: bool = false;

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
        for retry in self.consumer.retry_queues() {
            n += self.depth(&retry).await;
        }
        n
    }
}

impl Rabbit {
    /// Ready messages in `queue`; 0 when the consumer has not declared it
    /// yet.
    async fn depth(&self, queue: &str) -> u64 {
        looked_up(&self.conn, queue).await.unwrap_or(0)
    }
}

/// Ready messages in `queue`, or `None` when it does not exist (a passive
/// declare, on a channel of its own: asking for a queue that does not exist
/// closes the channel).
async fn looked_up(conn: &Connection, queue: &str) -> Option<u64> {
    let passive = QueueDeclareOptions {
        passive: true,
        ..QueueDeclareOptions::default()
    };
    let channel = conn.create_channel().await.expect("a channel");
    let count = channel
        .queue_declare(queue.into(), passive, FieldTable::default())
        .await
        .ok()
        .map(|q| u64::from(q.message_count()));
    let _ = channel.close(200, "inspected".into()).await;
    count
}

/// Every queue `consumer` of `queue` declares, for the clean-up.
fn queues_of(consumer: &Consumer, queue: &str) -> Vec<String> {
    let mut queues = vec![queue.to_owned(), consumer.dead_letter_queue()];
    queues.extend(consumer.retry_queues());
    queues
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
    staged_messages_arrive_once_under_their_ids,
    an_undecodable_payload_is_dead_lettered_with_the_reason,
    a_failing_body_is_retried_then_dead_lettered,
    a_panicking_handler_is_retried_then_dead_lettered,
    shutdown_lets_bodies_in_flight_finish_and_acks_them,
    the_token_lets_bodies_in_flight_reach_their_outcome_on_every_store,
    a_stopping_consumer_waits_no_longer_than_its_grace,
    a_connection_lost_mid_body_leaves_only_the_ack_to_the_redelivery,
    the_handler_is_told_about_each_delivery,
    the_consumer_counts_what_it_did,
    a_wait_between_tiers_is_waited_exactly,
    store_faults_back_off_and_are_never_dead_lettered,
);

/// A work queue that exists as a quorum queue is used as it is (declaring
/// it again as a classic queue would be refused by the broker).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_existing_quorum_queue_is_used_as_it_is() {
    let (conn, channel) = or_skip!(amqp_channel().await);
    let queue = unique_table("rmq_quorum");
    let consumer = Consumer::new(amqp_url(), queue.clone());
    let _cleanup = DeleteQueues::new(queues_of(&consumer, &queue));
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
    let _cleanup = DeleteQueues::new(queues_of(&consumer, &queue));
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

async fn publish_to(channel: &Channel, queue: &str, payload: &[u8]) {
    channel
        .basic_publish(
            ShortString::from(""),
            queue.into(),
            BasicPublishOptions::default(),
            payload,
            BasicProperties::default().with_delivery_mode(2),
        )
        .await
        .expect("publish")
        .await
        .expect("publish confirmed");
}

/// `declare` makes the topology, with the names and delays it was given,
/// before any consumer runs: what is published then waits in the work
/// queue, where without it RabbitMQ drops it (the default exchange routes a
/// message for a queue that does not exist nowhere, and says nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declare_makes_the_topology_so_nothing_published_before_a_consumer_is_lost() {
    let (conn, channel) = or_skip!(amqp_channel().await);
    channel
        .confirm_select(lapin::options::ConfirmSelectOptions::default())
        .await
        .expect("confirms");
    let queue = unique_table("rmq_declare");
    let consumer = Consumer::new(amqp_url(), queue.clone())
        .dead_letters(format!("{queue}.parked"))
        .retry_queues_named(format!("{queue}.wait.{{ms}}"))
        .retry_delays([
            std::time::Duration::from_millis(200),
            std::time::Duration::from_secs(2),
        ]);
    let _cleanup = DeleteQueues::new(queues_of(&consumer, &queue));
    // Before `declare`: confirmed by the broker, and gone.
    publish_to(&channel, &queue, &Points::payload("before", 1)).await;
    assert_eq!(looked_up(&conn, &queue).await, None, "no queue yet");

    consumer.declare().await.expect("declared");
    assert_eq!(
        consumer.retry_queues(),
        [format!("{queue}.wait.200"), format!("{queue}.wait.2000")]
    );
    for name in consumer.retry_queues() {
        assert_eq!(looked_up(&conn, &name).await, Some(0), "{name}");
    }
    assert_eq!(
        looked_up(&conn, &format!("{queue}.parked")).await,
        Some(0),
        "the dead-letter queue"
    );
    assert_eq!(
        looked_up(&conn, &format!("{queue}.idem.dead")).await,
        None,
        "no queue of the default names"
    );
    // Declaring again is harmless.
    consumer.declare().await.expect("declared again");

    for i in 0..3 {
        publish_to(&channel, &queue, &Points::payload(&format!("after-{i}"), 1)).await;
    }
    publish_to(&channel, &queue, b"not points").await;
    assert_eq!(
        looked_up(&conn, &queue).await,
        Some(4),
        "kept for the consumer"
    );

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
    let running = Running::new(stop, tokio::spawn(consumer.clone().run(handler, signal)));
    common::eventually(
        std::time::Duration::from_secs(20),
        "three effects and a dead letter",
        || async {
            effects.total() == 3 && looked_up(&conn, &format!("{queue}.parked")).await == Some(1)
        },
    )
    .await;
    let report = running.stop().await;
    assert_eq!((report.acked, report.dead_lettered), (3, 1), "{report:?}");
    assert_eq!(effects.of("before"), 0, "dropped before the queue existed");
    for i in 0..3 {
        assert_eq!(effects.of(&format!("after-{i}")), 1);
    }
}

/// A topology that cannot be declared is refused by `declare` and `run`
/// alike, before the broker is asked: here no retry delays, and a template
/// without `{ms}`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topology_that_cannot_be_declared_is_refused_before_connecting() {
    // nothing listens there: a refusal that needed the broker would fail
    // to connect instead
    let nowhere = "amqp://guest:guest@127.0.0.1:1/%2f";
    for (consumer, says) in [
        (
            Consumer::new(nowhere, "orders").retry_delays(Vec::new()),
            "at least one",
        ),
        (
            Consumer::new(nowhere, "orders").retry_queues_named("orders.wait"),
            "{ms}",
        ),
        (
            Consumer::new(nowhere, "orders").dead_letters("amq.dead"),
            "amq.",
        ),
    ] {
        match consumer.declare().await {
            Err(idem_runtime::consume::ConsumeError::Setup(e)) => {
                assert!(e.to_string().contains(says), "{e}")
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
        let run = consumer.run(
            |_: Points| async { Ok::<_, Error<AppError>>(Outcome::Executed(0u32)) },
            idem_runtime::consume::CancellationToken::new(),
        );
        match tokio::time::timeout(std::time::Duration::from_secs(5), run).await {
            Ok(Err(idem_runtime::consume::ConsumeError::Setup(e))) => {
                assert!(e.to_string().contains(says), "{e}")
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
    }
}
