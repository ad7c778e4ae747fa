//! The four scenarios as consumers on a real broker, each with a producer
//! that publishes every message more than once:
//!
//! ```sh
//! cargo run -p idem-examples --features rabbitmq,nats,postgres,redis --example consume -- rabbitmq stock
//! cargo run -p idem-examples --features rabbitmq,nats,postgres,redis --example consume -- nats sms
//! ```
//!
//! Brokers: `rabbitmq` (`AMQP_URL`, default `amqp://guest:guest@127.0.0.1:5672/%2f`)
//! or `nats` (`NATS_URL`, default `nats://127.0.0.1:4222`, with JetStream).
//! Scenarios:
//!
//! * `stock`: an order line deducts stock (transaction mode, Postgres at
//!   `DATABASE_URL`);
//! * `points`: a purchase grants loyalty points, keyed by message id
//!   (transaction mode, Postgres);
//! * `sms`: a shipment sends an SMS (lease mode, Redis at `REDIS_URL`); the
//!   gateway receives idem's key as its own idempotency key;
//! * `statistic`: an order is counted once in its day's statistic, keyed by
//!   message id plus the aggregation key (transaction mode, Postgres).
//!
//! Each run works on queues, streams, tables and keys of its own, prints
//! what it published and what took effect, and removes what it made.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use idem_runtime::consume::{Policy, Report, nats, rabbitmq};
use idem_runtime::{Error, Key, Outcome, PgStore, PgTx, RedisStore, idempotent};
use serde::{Deserialize, Serialize};
use sqlx::{AssertSqlSafe, PgPool};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Messages per scenario, and how many times each is published.
const MESSAGES: u32 = 40;
const COPIES: u32 = 3;

#[derive(Debug, Serialize, Deserialize)]
struct OrderPlaced {
    order_id: u32,
    sku: String,
    qty: i64,
    /// The run's inventory table.
    inventory: String,
}

#[idempotent(key = "order_id + sku", ttl = "24h", store = "postgres")]
async fn deduct_stock(tx: &mut PgTx<'_>, msg: &OrderPlaced) -> Result<i64, sqlx::Error> {
    let sql = format!(
        "UPDATE {} SET stock = stock - $1 WHERE sku = $2 RETURNING stock",
        msg.inventory
    );
    sqlx::query_scalar(AssertSqlSafe(sql))
        .bind(msg.qty)
        .bind(&msg.sku)
        .fetch_one(&mut **tx)
        .await
}

#[derive(Debug, Serialize, Deserialize)]
struct PointsEarned {
    message_id: String,
    user_id: u32,
    points: i64,
    balances: String,
}

#[idempotent(key = "message_id", ttl = "7d", store = "postgres")]
async fn grant_points(tx: &mut PgTx<'_>, msg: &PointsEarned) -> Result<i64, sqlx::Error> {
    let sql = format!(
        "INSERT INTO {} (user_id, points) VALUES ($1, $2)
         ON CONFLICT (user_id) DO UPDATE SET points = {0}.points + $2 RETURNING points",
        msg.balances
    );
    sqlx::query_scalar(AssertSqlSafe(sql))
        .bind(i64::from(msg.user_id))
        .bind(msg.points)
        .fetch_one(&mut **tx)
        .await
}

#[derive(Debug, Serialize, Deserialize)]
struct OrderShipped {
    order_id: u32,
    phone: String,
}

/// An SMS provider that honours an idempotency key, as real ones do.
#[derive(Default)]
struct Gateway {
    by_key: Mutex<HashMap<String, u32>>,
}

impl Gateway {
    fn send(&self, idempotency_key: &str, phone: &str) -> String {
        let mut sent = self.by_key.lock().expect("gateway");
        *sent.entry(idempotency_key.to_owned()).or_default() += 1;
        format!("sms to {phone}")
    }

    fn sends(&self) -> u32 {
        self.by_key.lock().expect("gateway").values().sum()
    }
}

static GATEWAY: std::sync::LazyLock<Gateway> = std::sync::LazyLock::new(Gateway::default);

#[idempotent(
    key = "'shipped' + order_id",
    ttl = "3d",
    store = "redis",
    lease = "10s"
)]
async fn send_sms(msg: &OrderShipped, key: &Key) -> Result<String, std::io::Error> {
    Ok(GATEWAY.send(key.as_str(), &msg.phone))
}

#[derive(Debug, Serialize, Deserialize)]
struct OrderCounted {
    message_id: String,
    day: String,
    stats: String,
}

#[idempotent(key = "message_id + day", ttl = "2d", store = "postgres")]
async fn count_order(tx: &mut PgTx<'_>, msg: &OrderCounted) -> Result<i64, sqlx::Error> {
    let sql = format!(
        "INSERT INTO {} (day, orders) VALUES ($1, 1)
         ON CONFLICT (day) DO UPDATE SET orders = {0}.orders + 1 RETURNING orders",
        msg.stats
    );
    sqlx::query_scalar(AssertSqlSafe(sql))
        .bind(&msg.day)
        .fetch_one(&mut **tx)
        .await
}

/// A broker, with the queue or stream of this run.
enum Broker {
    Rabbit {
        consumer: rabbitmq::Consumer,
        channel: lapin::Channel,
        conn: lapin::Connection,
        queue: String,
    },
    Nats {
        consumer: nats::Consumer,
        js: async_nats::jetstream::Context,
        stream: String,
        subject: String,
    },
}

impl Broker {
    async fn open(kind: &str, name: &str) -> Result<Broker, BoxError> {
        match kind {
            "rabbitmq" => {
                let url = std::env::var("AMQP_URL")
                    .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into());
                let conn = lapin::Connection::connect(&url, Default::default()).await?;
                let channel = conn.create_channel().await?;
                channel.confirm_select(Default::default()).await?;
                let durable = lapin::options::QueueDeclareOptions {
                    durable: true,
                    ..Default::default()
                };
                channel
                    .queue_declare(name.into(), durable, Default::default())
                    .await?;
                Ok(Broker::Rabbit {
                    consumer: rabbitmq::Consumer::new(url, name),
                    channel,
                    conn,
                    queue: name.to_owned(),
                })
            }
            "nats" => {
                let url =
                    std::env::var("NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into());
                let js = async_nats::jetstream::new(async_nats::connect(&url).await?);
                let subject = format!("idem.example.{name}");
                js.get_or_create_stream(async_nats::jetstream::stream::Config {
                    name: name.to_owned(),
                    subjects: vec![subject.clone()],
                    ..Default::default()
                })
                .await?;
                Ok(Broker::Nats {
                    consumer: nats::Consumer::new(url, name, subject.clone()),
                    js,
                    stream: name.to_owned(),
                    subject,
                })
            }
            other => Err(format!("unknown broker {other:?}: rabbitmq or nats").into()),
        }
    }

    async fn publish<M: Serialize>(&self, msg: &M) -> Result<(), BoxError> {
        let payload = serde_json::to_vec(msg)?;
        match self {
            Broker::Rabbit { channel, queue, .. } => {
                channel
                    .basic_publish(
                        "".into(),
                        queue.as_str().into(),
                        Default::default(),
                        &payload,
                        lapin::BasicProperties::default().with_delivery_mode(2),
                    )
                    .await?
                    .await?;
            }
            Broker::Nats { js, subject, .. } => {
                js.publish(subject.clone(), payload.into()).await?.await?;
            }
        }
        Ok(())
    }

    /// Runs a consumer around `handler` until `done` says everything took
    /// effect, then shuts it down and returns its report.
    async fn consume<M, T, E, F, Fut, D, DFut>(
        &self,
        handler: F,
        done: D,
    ) -> Result<Report, BoxError>
    where
        M: serde::de::DeserializeOwned + Send + 'static,
        T: Send + 'static,
        E: std::fmt::Display + Send + 'static,
        F: Fn(M) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = Result<Outcome<T>, Error<E>>> + Send + 'static,
        D: Fn() -> DFut,
        DFut: std::future::Future<Output = bool>,
    {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let signal = async move {
            let _ = stopped.await;
        };
        let policy = Policy {
            first_delay: Duration::from_millis(200),
            ..Policy::default()
        };
        let running = match self {
            Broker::Rabbit { consumer, .. } => {
                tokio::spawn(consumer.clone().policy(policy).run(handler, signal))
            }
            Broker::Nats { consumer, .. } => {
                tokio::spawn(consumer.clone().policy(policy).run(handler, signal))
            }
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while !done().await {
            if tokio::time::Instant::now() > deadline {
                return Err("the messages did not all take effect within 60 s".into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // Let the last copies arrive and be acked as duplicates.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let _ = stop.send(());
        Ok(running.await??)
    }

    /// Removes the queues or streams of this run.
    async fn remove(self) {
        match self {
            Broker::Rabbit {
                consumer,
                channel,
                conn,
                queue,
            } => {
                let mut queues = vec![queue, consumer.dead_letter_queue()];
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
            }
            Broker::Nats {
                consumer,
                js,
                stream,
                ..
            } => {
                let _ = js.delete_stream(&stream).await;
                let _ = js.delete_stream(consumer.dead_letter_stream()).await;
            }
        }
    }
}

async fn scalar(pool: &PgPool, sql: String) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(AssertSqlSafe(sql)).fetch_one(pool).await
}

async fn run(broker: &Broker, scenario: &str, run_id: &str) -> Result<(), BoxError> {
    let published = MESSAGES * COPIES;
    let report = match scenario {
        "stock" | "points" | "statistic" => {
            let url = std::env::var("DATABASE_URL")
                .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
            let pool = PgPool::connect(&url).await?;
            let (table, dedup) = (format!("{run_id}_business"), format!("{run_id}_dedup"));
            let store = PgStore::from_pool(pool.clone()).with_table(&dedup)?;
            store.migrate().await?;
            let result = match scenario {
                "stock" => stock(broker, &pool, store, &table).await,
                "points" => points(broker, &pool, store, &table).await,
                _ => statistic(broker, &pool, store, &table).await,
            };
            let _ = sqlx::query(AssertSqlSafe(format!(
                "DROP TABLE IF EXISTS {table}, {dedup}"
            )))
            .execute(&pool)
            .await;
            result?
        }
        "sms" => {
            let url =
                std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
            let store = RedisStore::connect(&url).await?.with_prefix(run_id)?;
            let result = sms(broker, store).await;
            idem_examples::delete_redis_prefix(&url, run_id).await?;
            result?
        }
        other => {
            return Err(
                format!("unknown scenario {other:?}: stock, points, sms or statistic").into(),
            );
        }
    };
    println!(
        "published {published} deliveries of {MESSAGES} messages; the consumer acked {} ({} duplicates), retried {}, dead-lettered {}",
        report.acked, report.duplicates, report.retried, report.dead_lettered
    );
    Ok(())
}

async fn publish_all<M: Serialize>(
    broker: &Broker,
    make: impl Fn(u32) -> M,
) -> Result<(), BoxError> {
    for _ in 0..COPIES {
        for i in 0..MESSAGES {
            broker.publish(&make(i)).await?;
        }
    }
    Ok(())
}

async fn stock(
    broker: &Broker,
    pool: &PgPool,
    store: PgStore,
    table: &str,
) -> Result<Report, BoxError> {
    sqlx::query(AssertSqlSafe(format!(
        "CREATE TABLE {table} (sku TEXT PRIMARY KEY, stock BIGINT NOT NULL)"
    )))
    .execute(pool)
    .await?;
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO {table} VALUES ('apple', 1000)"
    )))
    .execute(pool)
    .await?;
    publish_all(broker, |i| OrderPlaced {
        order_id: i,
        sku: "apple".into(),
        qty: 2,
        inventory: table.to_owned(),
    })
    .await?;
    let expected = 1000 - 2 * i64::from(MESSAGES);
    let report = broker
        .consume(
            move |msg: OrderPlaced| {
                let store = store.clone();
                async move { deduct_stock(&store, &msg).await }
            },
            || async {
                scalar(pool, format!("SELECT stock FROM {table}"))
                    .await
                    .ok()
                    == Some(expected)
            },
        )
        .await?;
    let left = scalar(pool, format!("SELECT stock FROM {table}")).await?;
    println!(
        "stock: {MESSAGES} order lines of 2 apples each, published {COPIES} times: 1000 -> {left} (each deducted once)"
    );
    Ok(report)
}

async fn points(
    broker: &Broker,
    pool: &PgPool,
    store: PgStore,
    table: &str,
) -> Result<Report, BoxError> {
    sqlx::query(AssertSqlSafe(format!(
        "CREATE TABLE {table} (user_id BIGINT PRIMARY KEY, points BIGINT NOT NULL)"
    )))
    .execute(pool)
    .await?;
    publish_all(broker, |i| PointsEarned {
        message_id: format!("purchase-{i}"),
        user_id: i % 4,
        points: 10,
        balances: table.to_owned(),
    })
    .await?;
    let expected = 10 * i64::from(MESSAGES);
    let report = broker
        .consume(
            move |msg: PointsEarned| {
                let store = store.clone();
                async move { grant_points(&store, &msg).await }
            },
            || async {
                scalar(
                    pool,
                    format!("SELECT COALESCE(SUM(points), 0)::BIGINT FROM {table}"),
                )
                .await
                .ok()
                    == Some(expected)
            },
        )
        .await?;
    let total = scalar(pool, format!("SELECT SUM(points)::BIGINT FROM {table}")).await?;
    println!(
        "points: {MESSAGES} purchases of 10 points over 4 users, published {COPIES} times: {total} points granted"
    );
    Ok(report)
}

async fn statistic(
    broker: &Broker,
    pool: &PgPool,
    store: PgStore,
    table: &str,
) -> Result<Report, BoxError> {
    sqlx::query(AssertSqlSafe(format!(
        "CREATE TABLE {table} (day TEXT PRIMARY KEY, orders BIGINT NOT NULL)"
    )))
    .execute(pool)
    .await?;
    publish_all(broker, |i| OrderCounted {
        message_id: format!("order-{i}"),
        day: format!("2026-11-{:02}", 28 + i % 3),
        stats: table.to_owned(),
    })
    .await?;
    let expected = i64::from(MESSAGES);
    let report = broker
        .consume(
            move |msg: OrderCounted| {
                let store = store.clone();
                async move { count_order(&store, &msg).await }
            },
            || async {
                scalar(
                    pool,
                    format!("SELECT COALESCE(SUM(orders), 0)::BIGINT FROM {table}"),
                )
                .await
                .ok()
                    == Some(expected)
            },
        )
        .await?;
    let rows: Vec<(String, i64)> = sqlx::query_as(AssertSqlSafe(format!(
        "SELECT day, orders FROM {table} ORDER BY day"
    )))
    .fetch_all(pool)
    .await?;
    println!("statistic: {MESSAGES} orders published {COPIES} times, counted per day: {rows:?}");
    Ok(report)
}

async fn sms(broker: &Broker, store: RedisStore) -> Result<Report, BoxError> {
    publish_all(broker, |i| OrderShipped {
        order_id: i,
        phone: format!("+1555{i:07}"),
    })
    .await?;
    let report = broker
        .consume(
            move |msg: OrderShipped| {
                let store = store.clone();
                async move { send_sms(&store, &msg).await }
            },
            || async { GATEWAY.sends() >= MESSAGES },
        )
        .await?;
    println!(
        "sms: {MESSAGES} shipments published {COPIES} times: the gateway sent {} messages",
        GATEWAY.sends()
    );
    Ok(report)
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (kind, scenario) = match args.as_slice() {
        [kind, scenario] => (kind.as_str(), scenario.as_str()),
        _ => {
            return Err("usage: consume <rabbitmq|nats> <stock|points|sms|statistic>".into());
        }
    };
    let run_id = format!(
        "idem_{scenario}_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    let broker = Broker::open(kind, &run_id).await?;
    let result = run(&broker, scenario, &run_id).await;
    broker.remove().await;
    result
}
