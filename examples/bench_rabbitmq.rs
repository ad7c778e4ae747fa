//! Messages per second through RabbitMQ: the same consumer (8 at once,
//! prefetch 64) around a bare stock transaction (`BEGIN; UPDATE; COMMIT`)
//! and around the same transaction as an idempotent Postgres handler.
//! Rounds are interleaved in one run; the last line is the ratio of the
//! medians.
//!
//! ```sh
//! MESSAGES=3000 ROUNDS=5 cargo run --release -p idem-examples --features rabbitmq,postgres --example bench_rabbitmq
//! ```
//!
//! Each round publishes `MESSAGES` fresh messages first (not timed), then
//! times the consumer from its first processed message to its last. Each
//! round (both variants) ends with what the machine did meanwhile (busy,
//! idle and steal shares from `/proc/stat`, marked `STOLEN` above 5 %
//! steal; see `examples/src/cpu.rs`), and the medians are given over all
//! rounds and over the unmarked ones.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem_examples::cpu::{Rounds, Watch};
use idem_examples::env;
use idem_runtime::consume::{Policy, rabbitmq};
use idem_runtime::{Error, Outcome, PgStore, PgTx, idempotent};
use serde::{Deserialize, Serialize};
use sqlx::{AssertSqlSafe, PgPool};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const SKUS: u32 = 1_000;

#[derive(Debug, Serialize, Deserialize)]
struct OrderLine {
    order_id: u64,
    sku: u32,
    inventory: String,
}

fn update(inventory: &str) -> String {
    format!("UPDATE {inventory} SET stock = stock - 1 WHERE sku = $1 RETURNING stock")
}

#[idempotent(key = "order_id", ttl = "1h", store = "postgres")]
async fn deduct(tx: &mut PgTx<'_>, msg: &OrderLine) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(AssertSqlSafe(update(&msg.inventory)))
        .bind(i64::from(msg.sku))
        .fetch_one(&mut **tx)
        .await
}

async fn deduct_bare(pool: &PgPool, msg: &OrderLine) -> Result<i64, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let left = sqlx::query_scalar(AssertSqlSafe(update(&msg.inventory)))
        .bind(i64::from(msg.sku))
        .fetch_one(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(left)
}

/// When the first and the last message of a round were processed.
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

#[derive(Clone, Copy, PartialEq)]
enum Variant {
    Bare,
    Idem,
}

#[allow(clippy::too_many_arguments)]
async fn round(
    variant: Variant,
    round: u64,
    messages: u64,
    url: &str,
    queue: &str,
    channel: &lapin::Channel,
    pool: &PgPool,
    store: &PgStore,
    inventory: &str,
) -> Result<f64, BoxError> {
    for i in 0..messages {
        let line = OrderLine {
            order_id: round * 1_000_000 + i,
            sku: (i % u64::from(SKUS)) as u32,
            inventory: inventory.to_owned(),
        };
        channel
            .basic_publish(
                "".into(),
                queue.into(),
                Default::default(),
                &serde_json::to_vec(&line)?,
                lapin::BasicProperties::default().with_delivery_mode(2),
            )
            .await?
            .await?;
    }
    let clock = Arc::new(Clock::default());
    let stop = idem_runtime::consume::CancellationToken::new();
    let consumer = rabbitmq::Consumer::new(url, queue)
        .policy(Policy {
            concurrency: 8,
            ..Policy::default()
        })
        .prefetch(64);
    let running = {
        let (clock, pool, store) = (Arc::clone(&clock), pool.clone(), store.clone());
        tokio::spawn(consumer.run(
            move |msg: OrderLine| {
                let (clock, pool, store) = (Arc::clone(&clock), pool.clone(), store.clone());
                async move {
                    let r = match variant {
                        Variant::Idem => deduct(&store, &msg).await,
                        Variant::Bare => deduct_bare(&pool, &msg)
                            .await
                            .map(Outcome::Executed)
                            .map_err(|error| Error::Handler {
                                handler: "bare",
                                key: idem_runtime::Key::from_parts(&[&msg.order_id])
                                    .expect("a key"),
                                error,
                            }),
                    };
                    if r.is_ok() {
                        clock.tick();
                    }
                    r
                }
            },
            stop.clone(),
        ))
    };
    let deadline = Instant::now() + Duration::from_secs(300);
    while clock.done.load(Ordering::SeqCst) < messages {
        if Instant::now() > deadline {
            return Err("a round did not finish within 300 s".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.cancel();
    running.await??;
    Ok(clock.rate(messages))
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let messages: u64 = env("MESSAGES", 3_000);
    let rounds: u64 = env("ROUNDS", 5);
    let amqp = std::env::var("AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into());
    let pg = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let run_id = format!("bench_{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let (queue, inventory, dedup) = (
        format!("{run_id}_orders"),
        format!("{run_id}_inventory"),
        format!("{run_id}_dedup"),
    );

    let pool = sqlx::postgres::PgPoolOptions::new()
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

    let conn = lapin::Connection::connect(&amqp, Default::default()).await?;
    let channel = conn.create_channel().await?;
    channel.confirm_select(Default::default()).await?;
    let durable = lapin::options::QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    channel
        .queue_declare(queue.as_str().into(), durable, Default::default())
        .await?;

    let (mut bare, mut idem) = (Vec::new(), Vec::new());
    let mut marks = Rounds::default();
    let result: Result<(), BoxError> = async {
        for r in 0..rounds {
            let watch = Watch::start()?;
            for variant in [Variant::Bare, Variant::Idem] {
                let round_id = r * 2 + u64::from(variant == Variant::Idem);
                let rate = round(
                    variant, round_id, messages, &amqp, &queue, &channel, &pool, &store, &inventory,
                )
                .await?;
                let name = if variant == Variant::Bare {
                    "bare"
                } else {
                    "idem"
                };
                println!("round {r} {name}: {rate:.0} msg/s");
                match variant {
                    Variant::Bare => bare.push(rate),
                    Variant::Idem => idem.push(rate),
                }
            }
            println!("round {r}: {}", marks.push(watch.stop()?));
        }
        Ok(())
    }
    .await;

    let consumer = rabbitmq::Consumer::new(&amqp, &queue);
    let mut queues = vec![queue.clone(), consumer.dead_letter_queue()];
    queues.extend(
        rabbitmq::RETRY_DELAYS
            .iter()
            .map(|d| consumer.retry_queue(*d)),
    );
    for q in queues {
        let _ = channel
            .queue_delete(q.as_str().into(), Default::default())
            .await;
    }
    let _ = conn.close(200, "done".into()).await;
    let _ = sqlx::query(AssertSqlSafe(format!(
        "DROP TABLE IF EXISTS {inventory}, {dedup}, {dedup}_outbox"
    )))
    .execute(&pool)
    .await;
    result?;

    println!("{}", marks.summary());
    let (bare, idem) = (marks.medians(&bare), marks.medians(&idem));
    println!("median: bare {bare} msg/s, idem {idem} msg/s");
    if let Some(quiet) = idem.ratio(&bare).quiet {
        println!("idem/bare over unmarked rounds {quiet:.3}");
    }
    println!("idem/bare {:.3}", idem.all / bare.all);
    Ok(())
}
