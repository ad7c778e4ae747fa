//! Messages per second through RocketMQ, with the same idempotent
//! transaction-mode Postgres handler (a stock deduction) behind idem's
//! `rocketmq::Consumer` and behind hand-written rocketmq-client-rust glue:
//!
//! * `idem`: `rocketmq::Consumer` with 8 at once;
//! * `glue`: a push consumer of the same client with 8 consumer threads and
//!   a blocking lane sized for them (as idem sizes it: the client's default
//!   lane runs twice the cores), whose listener runs the handler on the
//!   bench's Tokio runtime (`Handle::block_on`) and answers
//!   `CONSUME_SUCCESS`, or `RECONSUME_LATER` on an error.
//!
//! ```sh
//! MESSAGES=3000 ROUNDS=5 cargo run --release -p idem-examples --features rocketmq,postgres --example bench_rocketmq
//! ```
//!
//! Each round publishes `MESSAGES` fresh messages to a topic of its own
//! (4 queues; not timed), then times the consumer from its first handled
//! message to its last, so the group's start and first rebalance are left
//! out. Rounds alternate which variant goes first. Each round ends with
//! what the machine did meanwhile (busy, idle and steal shares from
//! `/proc/stat`, marked `STOLEN` above 5 % steal; see `examples/src/cpu.rs`);
//! the medians are given over all rounds and over the unmarked ones, and
//! the last line is the ratio of the medians, idem/glue.

// The glue holds rocketmq-client-rust's types, whose futures are deep.
#![recursion_limit = "256"]

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem_examples::cpu::{Rounds, Watch};
use idem_examples::env;
use idem_runtime::consume::{Policy, rocketmq};
use idem_runtime::{PgStore, PgTx, idempotent};
use rocketmq_client_rust::{
    ClientRuntime, ClientRuntimeConfig, ConsumeConcurrentlyContext, ConsumeConcurrentlyStatus,
    DefaultMQProducer, DefaultMQPushConsumer, MQPushConsumer as _, MessageListenerConcurrently,
};
use rocketmq_model::common::consumer::consume_from_where::ConsumeFromWhere;
use rocketmq_model::common::message::message_ext::MessageExt;
use rocketmq_model::common::message::message_single::Message;
use rocketmq_runtime::{RuntimeConfig, RuntimeOwner};
use serde::{Deserialize, Serialize};
use sqlx::{AssertSqlSafe, PgPool};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const SKUS: u32 = 1_000;
const CONCURRENCY: usize = 8;

#[derive(Debug, Serialize, Deserialize)]
struct OrderLine {
    order_id: u64,
    sku: u32,
    inventory: String,
}

#[idempotent(key = "order_id", ttl = "1h", store = "postgres")]
async fn deduct(tx: &mut PgTx<'_>, msg: &OrderLine) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(AssertSqlSafe(format!(
        "UPDATE {} SET stock = stock - 1 WHERE sku = $1 RETURNING stock",
        msg.inventory
    )))
    .bind(i64::from(msg.sku))
    .fetch_one(&mut **tx)
    .await
}

/// When the first and the last message of a round were handled.
#[derive(Default)]
struct Clock {
    done: AtomicU64,
    first: Mutex<Option<Instant>>,
    last: Mutex<Option<Instant>>,
}

impl Clock {
    fn tick(&self) {
        let now = Instant::now();
        self.first.lock().expect("clock").get_or_insert(now);
        *self.last.lock().expect("clock") = Some(now);
        self.done.fetch_add(1, Ordering::SeqCst);
    }

    fn rate(&self, messages: u64) -> f64 {
        let first = self.first.lock().expect("clock").expect("a first message");
        let last = self.last.lock().expect("clock").expect("a last message");
        (messages - 1) as f64 / (last - first).as_secs_f64()
    }
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Variant {
    Glue,
    Idem,
}

/// The hand-written listener: the handler on the bench's runtime.
struct Glue {
    handle: tokio::runtime::Handle,
    store: PgStore,
    clock: Arc<Clock>,
}

impl MessageListenerConcurrently for Glue {
    fn consume_message(
        &self,
        msgs: &[&MessageExt],
        _: &ConsumeConcurrentlyContext,
    ) -> rocketmq_client_rust::ClientResult<ConsumeConcurrentlyStatus> {
        for msg in msgs {
            let Ok(line) = serde_json::from_slice::<OrderLine>(msg.message.body_slice()) else {
                continue; // a payload that does not decode is dropped
            };
            if self.handle.block_on(deduct(&self.store, &line)).is_err() {
                return Ok(ConsumeConcurrentlyStatus::ReconsumeLater);
            }
            self.clock.tick();
        }
        Ok(ConsumeConcurrentlyStatus::ConsumeSuccess)
    }
}

/// A client runtime whose listener lane runs `CONCURRENCY` calls.
fn client(name: &str) -> Result<(RuntimeOwner, Arc<ClientRuntime>), BoxError> {
    let mut config = RuntimeConfig::for_parallelism(name, 2);
    config.blocking_lane_policies.metadata_io.max_concurrency = CONCURRENCY + 4;
    let lanes = &config.blocking_lane_policies;
    let total = lanes.storage_io.max_concurrency
        + lanes.metadata_io.max_concurrency
        + lanes.cpu_crypto.max_concurrency;
    let config = config.with_max_blocking_threads(total)?;
    let owner = RuntimeOwner::plan(config)?.build()?;
    let runtime = ClientRuntime::try_new(
        owner.root_context().component("bench"),
        ClientRuntimeConfig::default(),
        rocketmq_observability::TelemetryHandle::default(),
    )?;
    Ok((owner, runtime))
}

#[allow(clippy::too_many_arguments)]
async fn round(
    variant: Variant,
    round: u64,
    messages: u64,
    name_server: &str,
    producer: &DefaultMQProducer,
    store: &PgStore,
    inventory: &str,
) -> Result<f64, BoxError> {
    let topic = format!("{inventory}_{round}_{variant:?}");
    let mut made = producer.clone();
    {
        let topic = topic.clone();
        Box::pin(async move { made.create_topic("TBW102", &topic, 4, HashMap::new()).await })
            .await?;
    }
    for i in 0..messages {
        let line = OrderLine {
            order_id: round * 10_000_000
                + i
                + if variant == Variant::Glue {
                    5_000_000
                } else {
                    0
                },
            sku: (i % u64::from(SKUS)) as u32,
            inventory: inventory.to_owned(),
        };
        let msg = Message::builder()
            .topic(topic.clone())
            .body(serde_json::to_vec(&line)?)
            .build()?;
        let p = producer.clone();
        Box::pin(async move { p.send(msg).await }).await?;
    }
    let clock = Arc::new(Clock::default());
    let group = format!("{topic}_group");
    let deadline = Instant::now() + Duration::from_secs(300);
    match variant {
        Variant::Idem => {
            let stop = idem_runtime::consume::CancellationToken::new();
            let consumer = rocketmq::Consumer::new(name_server, topic.clone())
                .group(group)
                .policy(Policy {
                    concurrency: CONCURRENCY,
                    ..Policy::default()
                });
            let running = {
                let (clock, store) = (Arc::clone(&clock), store.clone());
                tokio::spawn(consumer.run(
                    move |msg: OrderLine| {
                        let (clock, store) = (Arc::clone(&clock), store.clone());
                        async move {
                            let r = deduct(&store, &msg).await;
                            if r.is_ok() {
                                clock.tick();
                            }
                            r
                        }
                    },
                    stop.clone(),
                ))
            };
            wait(&clock, messages, deadline).await?;
            stop.cancel();
            running.await??;
        }
        Variant::Glue => {
            let (owner, runtime) = client("idem-bench-glue")?;
            let threads = u32::try_from(CONCURRENCY)?;
            let mut consumer = DefaultMQPushConsumer::builder(runtime)
                .consumer_group(group)
                .name_server_addr(name_server.to_owned())
                .consume_from_where(ConsumeFromWhere::ConsumeFromFirstOffset)
                .consume_thread_min(threads)
                .consume_thread_max(threads)
                .build();
            consumer.register_message_listener_concurrently(Glue {
                handle: tokio::runtime::Handle::current(),
                store: store.clone(),
                clock: Arc::clone(&clock),
            });
            let topic = topic.clone();
            let mut consumer = Box::pin(async move {
                consumer.subscribe(topic.as_str(), "*").await?;
                consumer.start().await?;
                Ok::<_, BoxError>(consumer)
            })
            .await?;
            wait(&clock, messages, deadline).await?;
            Box::pin(async move { consumer.shutdown().await }).await;
            let _ = owner.shutdown_background();
        }
    }
    Ok(clock.rate(messages))
}

async fn wait(clock: &Clock, messages: u64, deadline: Instant) -> Result<(), BoxError> {
    while clock.done.load(Ordering::SeqCst) < messages {
        if Instant::now() > deadline {
            return Err("a round did not finish within 300 s".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let messages: u64 = env("MESSAGES", 3_000);
    let rounds: u64 = env("ROUNDS", 5);
    let name_server = std::env::var("ROCKETMQ_NAMESRV").unwrap_or_else(|_| "127.0.0.1:9876".into());
    let pg = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let run_id = format!("bench_{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let (inventory, dedup) = (format!("{run_id}_inventory"), format!("{run_id}_dedup"));

    let pool: PgPool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(16)
        .connect(&pg)
        .await?;
    sqlx::query(AssertSqlSafe(format!(
        "CREATE TABLE {inventory} (sku BIGINT PRIMARY KEY, stock BIGINT NOT NULL)"
    )))
    .execute(&pool)
    .await?;
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO {inventory} SELECT g, 1000000000 FROM generate_series(0, {}) g",
        SKUS - 1
    )))
    .execute(&pool)
    .await?;
    let store = PgStore::from_pool(pool.clone()).with_table(&dedup)?;
    store.migrate().await?;

    let (_owner, runtime) = client("idem-bench-producer")?;
    let mut producer = DefaultMQProducer::builder(runtime)
        .producer_group(format!("{run_id}_producer"))
        .name_server_addr(name_server.clone())
        .build();
    Box::pin(producer.start()).await?;

    println!(
        "{messages} messages a round, {rounds} rounds, {CONCURRENCY} at once, topics of 4 queues"
    );
    let mut cpu = Rounds::default();
    let (mut glue, mut idem) = (Vec::new(), Vec::new());
    for r in 0..rounds {
        let watch = Watch::start()?;
        let order = if r % 2 == 0 {
            [Variant::Idem, Variant::Glue]
        } else {
            [Variant::Glue, Variant::Idem]
        };
        let mut rates = HashMap::new();
        for v in order {
            let rate = round(v, r, messages, &name_server, &producer, &store, &inventory).await?;
            rates.insert(format!("{v:?}"), rate);
        }
        let conditions = cpu.push(watch.stop()?);
        let (g, i) = (rates["Glue"], rates["Idem"]);
        println!(
            "round {}: glue {g:.0} msg/s, idem {i:.0} msg/s, idem/glue {:.3} ({conditions})",
            r + 1,
            i / g
        );
        glue.push(g);
        idem.push(i);
    }
    println!("{}", cpu.summary());
    let (g, i) = (cpu.medians(&glue), cpu.medians(&idem));
    println!("median glue {g} msg/s");
    println!("median idem {i} msg/s");
    println!("idem/glue: {:.3}", i.ratio(&g));

    Box::pin(async move { producer.shutdown().await }).await;
    // The outbox table is the one the store's migration makes.
    let outbox = format!("{dedup}_outbox");
    for table in [&inventory, &dedup, &outbox] {
        let _ = sqlx::query(AssertSqlSafe(format!("DROP TABLE IF EXISTS {table}")))
            .execute(&pool)
            .await;
    }
    Ok(())
}
