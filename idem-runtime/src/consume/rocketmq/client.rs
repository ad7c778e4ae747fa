//! The RocketMQ client's own runtime, which idem builds and owns for each
//! consumer, dead-letter reader and outbox destination: rocketmq-client-rust
//! runs on a Tokio runtime it is given (never the caller's), and calls a
//! push consumer's listener on a blocking lane of that runtime.
//!
//! The lane is sized here for the listener calls idem will make: the
//! client's default lane (twice the cores, eight times the cores queued)
//! is smaller than its default consumer concurrency (20) on a small
//! machine, and a call the lane cannot take fails before the listener
//! runs, is counted as a failed consumption and is sent back without the
//! body ever running. The lane's task timeout (30 s by default) is lifted
//! too, as the consumer lifts the client's `consume_timeout` (15 minutes):
//! a body that runs longer would otherwise be handed back while it still
//! runs.

use std::sync::Arc;
use std::time::Duration;

use std::collections::HashMap;

use futures_util::future::BoxFuture;
use rocketmq_client_rust::{ClientRuntime, ClientRuntimeConfig, DefaultMQProducer};
use rocketmq_model::common::message::message_queue::MessageQueue;
use rocketmq_model::common::message::message_single::Message;
use rocketmq_runtime::{RuntimeConfig, RuntimeOwner};

use crate::BoxError;

/// Blocking calls the client makes for itself beside the listener's
/// (offsets, metadata), on the same lane.
const OWN_CALLS: usize = 4;

/// The longest a listener call may block its lane: a body's own limit is
/// the handler's, not the lane's.
const NO_TASK_TIMEOUT: Duration = Duration::from_secs(7 * 24 * 3600);

/// A RocketMQ client runtime and the Tokio runtime it runs on; shut down
/// with [`close`](Client::close) (dropped, it stops in the background).
///
/// The client's types are deep (a runtime holds its consumers, whose
/// requests hold the runtime): a type that holds one directly makes every
/// crate that proves it `Send` (an application's `tokio::spawn` of a
/// consumer's `run`) need a higher `recursion_limit`. So the runtime, the
/// producers and the readers idem keeps are held behind trait objects,
/// whose `Send` is declared here, once.
pub(crate) struct Client {
    inner: Box<dyn Owned>,
}

/// What a [`Client`] holds.
trait Owned: Send + Sync {
    fn runtime(&self) -> Arc<ClientRuntime>;
    fn close(self: Box<Self>) -> BoxFuture<'static, ()>;
}

struct Inner {
    owner: Option<RuntimeOwner>,
    runtime: Arc<ClientRuntime>,
}

impl Owned for Inner {
    fn runtime(&self) -> Arc<ClientRuntime> {
        Arc::clone(&self.runtime)
    }

    fn close(mut self: Box<Self>) -> BoxFuture<'static, ()> {
        Box::pin(async move {
            let _ = self.runtime.shutdown().await;
            if let Some(owner) = self.owner.take() {
                let _ = owner.shutdown_tasks().await;
                let _ = owner.shutdown_background();
            }
        })
    }
}

/// A started producer (see [`Client`] for why it is a trait object).
pub(crate) type Producer = Arc<dyn Publish>;

/// What idem does with a producer.
pub(crate) trait Publish: Send + Sync {
    /// Sends `msg` and waits for the broker to store it.
    fn send(&self, msg: Message) -> BoxFuture<'_, Result<(), BoxError>> {
        self.send_to(msg, None)
    }
    /// Sends `msg` to `queue` (one the client picks when `None`) and waits
    /// for the broker to store it.
    fn send_to(
        &self,
        msg: Message,
        queue: Option<MessageQueue>,
    ) -> BoxFuture<'_, Result<(), BoxError>>;
    /// The queues of `topic` a producer sends to.
    fn queues<'a>(&'a self, topic: &'a str) -> BoxFuture<'a, Result<Vec<MessageQueue>, BoxError>>;
    /// Makes `topic` where it is missing, and fails when the name server
    /// cannot be reached.
    fn ensure_topic<'a>(&'a self, topic: &'a str) -> BoxFuture<'a, Result<(), BoxError>>;
    /// Stops the producer.
    fn shutdown(&self) -> BoxFuture<'_, ()>;
}

impl Publish for DefaultMQProducer {
    fn send_to(
        &self,
        msg: Message,
        queue: Option<MessageQueue>,
    ) -> BoxFuture<'_, Result<(), BoxError>> {
        use rocketmq_model::result::SendStatus;
        let producer = self.clone();
        Box::pin(async move {
            let topic = msg.topic().to_string();
            let sent = match queue {
                Some(queue) => producer.send_to_queue(msg, queue).await?,
                None => DefaultMQProducer::send(&producer, msg).await?,
            };
            match sent {
                Some(r) if r.send_status == SendStatus::SendOk => Ok(()),
                Some(r) => Err(format!("{topic}: the broker answered {:?}", r.send_status).into()),
                None => Err(format!("{topic}: the broker gave no answer").into()),
            }
        })
    }

    fn queues<'a>(&'a self, topic: &'a str) -> BoxFuture<'a, Result<Vec<MessageQueue>, BoxError>> {
        let mut producer = self.clone();
        Box::pin(async move { Ok(producer.fetch_publish_message_queues(topic).await?) })
    }

    fn ensure_topic<'a>(&'a self, topic: &'a str) -> BoxFuture<'a, Result<(), BoxError>> {
        let mut producer = self.clone();
        Box::pin(async move {
            // rocketmq-client-rust 1.0.0 words a missing topic as it words
            // other failures ("Argument is invalid"): any failed look-up is
            // taken for a missing topic, and one that cannot be made fails.
            if producer.fetch_publish_message_queues(topic).await.is_ok() {
                return Ok(());
            }
            producer
                .create_topic("TBW102", topic, QUEUES, HashMap::new())
                .await?;
            Ok(())
        })
    }

    fn shutdown(&self) -> BoxFuture<'_, ()> {
        let mut producer = self.clone();
        // The client's own (inherent) shutdown, not this trait's.
        Box::pin(async move { DefaultMQProducer::shutdown(&mut producer).await })
    }
}

/// Queues a topic idem makes is made with.
const QUEUES: i32 = 4;

impl Client {
    /// A runtime whose listener lane runs `listeners` calls at once, none
    /// of them timed out by the lane.
    pub(crate) fn new(name: &str, listeners: usize) -> Result<Client, BoxError> {
        let cores = std::thread::available_parallelism().map_or(2, usize::from);
        let mut config = RuntimeConfig::for_parallelism(format!("idem-rocketmq-{name}"), cores);
        let lanes = &mut config.blocking_lane_policies;
        lanes.metadata_io.max_concurrency = listeners.max(1) + OWN_CALLS;
        lanes.metadata_io.max_queue_depth = lanes.metadata_io.max_queue_depth.max(2 * listeners);
        lanes.metadata_io.task_timeout = NO_TASK_TIMEOUT;
        let total = lanes.storage_io.max_concurrency
            + lanes.metadata_io.max_concurrency
            + lanes.cpu_crypto.max_concurrency;
        let threads = total.max(config.max_blocking_threads);
        let config = config.with_max_blocking_threads(threads)?;
        let owner = RuntimeOwner::plan(config)?.build()?;
        let runtime = ClientRuntime::try_new(
            owner.root_context().component("client"),
            ClientRuntimeConfig::default(),
            rocketmq_observability::TelemetryHandle::default(),
        )?;
        Ok(Client {
            inner: Box::new(Inner {
                owner: Some(owner),
                runtime,
            }),
        })
    }

    /// The client runtime, for the client's builders.
    pub(crate) fn runtime(&self) -> Arc<ClientRuntime> {
        self.inner.runtime()
    }

    /// A started producer of group `group`, sending through the name
    /// servers `name_server` (`host:port`, several joined by `;`).
    pub(crate) fn producer(
        &self,
        name_server: &str,
        group: &str,
    ) -> BoxFuture<'static, Result<Producer, BoxError>> {
        let mut producer = DefaultMQProducer::builder(self.runtime())
            .producer_group(group.to_owned())
            .name_server_addr(name_server.to_owned())
            .send_msg_timeout(10_000)
            .build();
        Box::pin(async move {
            producer.start().await?;
            Ok(Arc::new(producer) as Producer)
        })
    }

    /// Stops the client runtime and the tasks and threads it ran on.
    pub(crate) fn close(self) -> BoxFuture<'static, ()> {
        self.inner.close()
    }
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").finish_non_exhaustive()
    }
}
