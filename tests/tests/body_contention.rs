//! A transaction-mode body whose own statement meets the database's
//! contention (a lock wait past the lock timeout, a deadlock, a
//! serialization failure) gets the store's error, not its own:
//! `Error::Store` with `StoreError::Contention`, its transaction rolled
//! back and no failure counted against `max_attempts`. Driven through a
//! real consumer on RabbitMQ, with real concurrency on PostgreSQL and
//! MariaDB, past the handler's attempt limit: every message is applied
//! once after the contention ends, and none is dead-lettered. Each test has
//! tables and queues of its own and removes them.

#[path = "body_contention/borrowed.rs"]
mod borrowed;
#[path = "body_contention/mysql.rs"]
mod mysql;
#[path = "body_contention/postgres.rs"]
mod postgres;

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use idem_runtime::consume::rabbitmq::Consumer;
use idem_runtime::consume::{CancellationToken, ConsumeError, Policy, Report};
use idem_runtime::{Error, Key, Outcome};
use idem_tests::brokers::{DeleteQueues, amqp_channel, amqp_url};
use idem_tests::unique_table;
use lapin::options::{BasicPublishOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Connection};
use serde::{Deserialize, Serialize};
use tokio::task::JoinHandle;

/// A message: its id is its key.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Credit {
    id: String,
}

/// The test handlers' error: a wrapper whose `source` is sqlx's error.
#[derive(Debug, thiserror::Error)]
enum AppError {
    #[error("sql: {0}")]
    Sql(#[from] sqlx::Error),
}

/// What the bodies share: the business tables and how often each
/// message's body ran.
#[derive(Default)]
struct Scene {
    /// `id TEXT/VARCHAR PRIMARY KEY, n BIGINT`: rows `hot`, `a` and `b`.
    rows: String,
    /// One row per effect: the message id.
    effects: String,
    runs: Mutex<HashMap<String, u32>>,
    /// A body that locks two rows holds the first one.
    holds_first: tokio::sync::Notify,
}

impl Scene {
    fn ran(&self, id: &str) {
        *self.runs.lock().unwrap().entry(id.to_owned()).or_default() += 1;
    }

    fn runs(&self, id: &str) -> u32 {
        self.runs.lock().unwrap().get(id).copied().unwrap_or(0)
    }
}

/// Waits until `cond` holds, for at most `within`; `false` if it never did.
async fn until<F, Fut>(within: Duration, mut cond: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + within;
    while tokio::time::Instant::now() < deadline {
        if cond().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

// ---------------------------------------------------------------------------
// RabbitMQ

/// A work queue of the test's own, its consumer's retry and dead-letter
/// queues, deleted at the end.
struct Queue {
    consumer: Consumer,
    queue: String,
    channel: Channel,
    conn: Connection,
    _cleanup: DeleteQueues,
}

/// What the consumers run with: the handler's limit and the consumer's are
/// both 2 failed attempts; retries come quickly.
fn policy() -> Policy {
    Policy {
        max_failures: 2,
        first_delay: Duration::from_millis(100),
        max_store_delay: Duration::from_millis(500),
        concurrency: 4,
        ..Policy::default()
    }
}

impl Queue {
    async fn open(name: &str) -> Option<Queue> {
        let (conn, channel) = amqp_channel().await?;
        let queue = unique_table(name);
        let consumer = Consumer::new(amqp_url(), queue.clone()).policy(policy());
        let mut queues = vec![queue.clone(), consumer.dead_letter_queue()];
        queues.extend(consumer.retry_queues());
        let cleanup = DeleteQueues::new(queues);
        consumer.declare().await.expect("declare the queues");
        Some(Queue {
            consumer,
            queue,
            channel,
            conn,
            _cleanup: cleanup,
        })
    }

    async fn publish(&self, id: &str) {
        let payload = serde_json::to_vec(&Credit { id: id.to_owned() }).unwrap();
        self.channel
            .basic_publish(
                "".into(),
                self.queue.as_str().into(),
                BasicPublishOptions::default(),
                &payload,
                BasicProperties::default().with_delivery_mode(2),
            )
            .await
            .expect("publish")
            .await
            .expect("publish confirmed");
    }

    /// Messages in the dead-letter queue.
    async fn dead_letters(&self) -> u64 {
        let passive = QueueDeclareOptions {
            passive: true,
            ..QueueDeclareOptions::default()
        };
        let channel = self.conn.create_channel().await.expect("a channel");
        let count = channel
            .queue_declare(
                self.consumer.dead_letter_queue().as_str().into(),
                passive,
                FieldTable::default(),
            )
            .await
            .map(|q| u64::from(q.message_count()))
            .expect("the dead-letter queue exists: the consumer declared it");
        let _ = channel.close(200, "inspected".into()).await;
        count
    }

    /// Runs the consumer around `call` until stopped.
    fn start<F, Fut>(&self, call: F) -> Running
    where
        F: Fn(Credit) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = Result<Outcome<u32>, Error<AppError>>> + Send + 'static,
    {
        let stop = CancellationToken::new();
        let task = tokio::spawn(self.consumer.clone().run(call, stop.clone()));
        Running { stop, task }
    }
}

struct Running {
    stop: CancellationToken,
    task: JoinHandle<Result<Report, ConsumeError>>,
}

impl Running {
    async fn stop(self) -> Report {
        self.stop.cancel();
        tokio::time::timeout(Duration::from_secs(30), self.task)
            .await
            .expect("the consumer stops within 30 s")
            .expect("the consumer's task")
            .expect("the consumer ends without an error")
    }
}

/// What [`settles_once`] reads of a database.
trait Fixture {
    fn scene(&self) -> &Scene;
    /// Effects by message id.
    async fn effects(&self) -> HashMap<String, i64>;
    /// The record of `id` under `handler`, which must exist.
    async fn record(&self, handler: &str, id: &str) -> idem_runtime::Record;
}

/// After the contention is over: waits until every message of `ids` took
/// effect (or one was dead-lettered), stops the consumer, and checks that
/// each took effect exactly once, its record (of `handler`) completed with
/// no failure counted, and that nothing was dead-lettered.
async fn settles_once(
    queue: &Queue,
    running: Running,
    ids: &[&str],
    fx: &impl Fixture,
    handler: &str,
) {
    let settled = until(Duration::from_secs(30), || async {
        fx.effects().await.len() == ids.len() || queue.dead_letters().await > 0
    })
    .await;
    let report = running.stop().await;
    let dead = queue.dead_letters().await;
    let runs: Vec<u32> = ids.iter().map(|id| fx.scene().runs(id)).collect();
    assert_eq!(
        (dead, report.dead_lettered),
        (0, 0),
        "a healthy message met contention and was dead-lettered (runs {runs:?}, {report:?})"
    );
    assert!(
        settled,
        "every message took effect (runs {runs:?}, {report:?})"
    );
    let effects = fx.effects().await;
    for id in ids {
        assert_eq!(effects.get(*id), Some(&1), "{id} took effect once");
        let record = fx.record(handler, id).await;
        assert_eq!(record.status, idem_runtime::Status::Completed, "{id}");
        assert_eq!(record.failures, 0, "{id}: contention is not charged");
    }
}

fn key(id: &str) -> Key {
    Key::from_parts(&[&id]).expect("a key")
}
