//! The four scenarios as consumers on real brokers, each with a producer
//! that publishes every message more than once. With no arguments, every
//! scenario on every broker; with a broker, its four scenarios; with both,
//! one:
//!
//! ```sh
//! cargo run -p idem-examples --features rabbitmq,nats,kafka,rocketmq,postgres,redis --example consume
//! cargo run -p idem-examples --features rabbitmq,nats,kafka,rocketmq,postgres,redis --example consume -- kafka
//! cargo run -p idem-examples --features rabbitmq,nats,kafka,rocketmq,postgres,redis --example consume -- nats sms
//! ```
//!
//! Brokers (in [`idem_examples::broker`], one module each): `rabbitmq`
//! (`AMQP_URL`, default `amqp://guest:guest@127.0.0.1:5672/%2f`), `nats`
//! (`NATS_URL`, default `nats://127.0.0.1:4222`, with JetStream), `kafka`
//! (`KAFKA_BROKERS`, default `127.0.0.1:9092`; topics of 3 partitions) and
//! `rocketmq` (`ROCKETMQ_NAMESRV`, default `127.0.0.1:9876`; topics of 4
//! queues; the broker the tests start, with their short delay levels).
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
//! Each run works on queues, streams, topics, consumer groups, tables and
//! keys of its own (named after the broker, the scenario and the process
//! id), waits until the consumer has handled every copy, prints what took
//! effect and what the consumer did, checks that each message took effect
//! exactly once, and removes what it made. The last lines say, per broker
//! and scenario, whether it did.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_examples::broker::{BoxError, Broker, kafka, nats, rabbitmq, rocketmq};
use idem_runtime::consume::{Policy, Report};
use idem_runtime::{Error, Key, Outcome, PgStore, PgTx, RedisStore, idempotent};
use serde::{Deserialize, Serialize};
use sqlx::{AssertSqlSafe, PgPool};

/// Messages per scenario, how many times each is published, and so the
/// deliveries per scenario.
const MESSAGES: u32 = 40;
const COPIES: u32 = 3;
const PUBLISHED: u32 = MESSAGES * COPIES;

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

    fn keys(&self) -> u32 {
        u32::try_from(self.by_key.lock().expect("gateway").len()).unwrap_or(u32::MAX)
    }

    /// Forgets what was sent, for the next run.
    fn clear(&self) {
        self.by_key.lock().expect("gateway").clear();
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

/// Runs the consumer around `handler` until every delivery was handled
/// (executed or a duplicate), then shuts it down and returns its report.
async fn consume<B, M, T, E, F, Fut>(broker: &B, handler: F) -> Result<Report, BoxError>
where
    B: Broker,
    M: serde::de::DeserializeOwned + Send + 'static,
    T: Send + 'static,
    E: std::fmt::Display + Send + 'static,
    F: Fn(M) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<Outcome<T>, Error<E>>> + Send + 'static,
{
    let handled = Arc::new(AtomicU32::new(0));
    let counted = {
        let handled = Arc::clone(&handled);
        move |msg: M| {
            let (call, handled) = (handler(msg), Arc::clone(&handled));
            async move {
                let result = call.await;
                if result.is_ok() {
                    handled.fetch_add(1, Ordering::SeqCst);
                }
                result
            }
        }
    };
    let stop = idem_runtime::consume::CancellationToken::new();
    let policy = Policy {
        first_delay: Duration::from_millis(200),
        ..Policy::default()
    };
    let running = tokio::spawn(broker.consume(policy, counted, stop.clone()));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while handled.load(Ordering::SeqCst) < PUBLISHED && !running.is_finished() {
        if tokio::time::Instant::now() > deadline {
            stop.cancel();
            let _ = running.await;
            let n = handled.load(Ordering::SeqCst);
            return Err(
                format!("only {n} of {PUBLISHED} deliveries were handled within 60 s").into(),
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.cancel();
    Ok(running.await??)
}

async fn scalar(pool: &PgPool, sql: String) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(AssertSqlSafe(sql)).fetch_one(pool).await
}

/// Runs `scenario` on a destination of its own on broker `B`, prints what
/// took effect and what the consumer did, and checks that every message
/// took effect once.
async fn on<B: Broker>(scenario: &str) -> Result<(), BoxError> {
    let run_id = format!("idem_{}_{scenario}_{}", B::NAME, std::process::id());
    let broker = B::open(&run_id).await?;
    let result = run(&broker, scenario, &run_id).await;
    broker.remove().await;
    let (effect, report) = result?;
    let name = format!("{}/{scenario}", B::NAME);
    println!("{name}: {effect}");
    let executed = report.acked - report.duplicates - report.alerts;
    println!(
        "{name}: {PUBLISHED} deliveries: {executed} executed, {} duplicates, {} retried, {} dead-lettered, {} alerts",
        report.duplicates, report.retried, report.dead_lettered, report.alerts
    );
    if executed != u64::from(MESSAGES) || report.dead_lettered + report.alerts > 0 {
        return Err(format!("{name}: {executed} of {MESSAGES} messages executed").into());
    }
    Ok(())
}

/// What took effect, once checked, and the consumer's report.
type Ran = (String, Report);

/// Sets up `scenario`'s store and tables, runs it, and removes them.
async fn run<B: Broker>(broker: &B, scenario: &str, run_id: &str) -> Result<Ran, BoxError> {
    if scenario == "sms" {
        let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
        let store = RedisStore::connect(&url).await?.with_prefix(run_id)?;
        let result = sms(broker, store).await;
        idem_examples::delete_redis_prefix(&url, run_id).await?;
        return result;
    }
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
    result
}

/// Publishes each message `COPIES` times, keyed by its number (so that on
/// Kafka its copies go to one partition, as a producer's retries do).
async fn publish_all<B: Broker, M: Serialize>(
    broker: &B,
    make: impl Fn(u32) -> M,
) -> Result<(), BoxError> {
    for _ in 0..COPIES {
        for i in 0..MESSAGES {
            let payload = serde_json::to_vec(&make(i))?;
            broker.publish(&i.to_string(), payload).await?;
        }
    }
    Ok(())
}

async fn stock<B: Broker>(
    broker: &B,
    pool: &PgPool,
    store: PgStore,
    table: &str,
) -> Result<Ran, BoxError> {
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
    let report = consume(broker, move |msg: OrderPlaced| {
        let store = store.clone();
        async move { deduct_stock(&store, &msg).await }
    })
    .await?;
    let left = scalar(pool, format!("SELECT stock FROM {table}")).await?;
    let expected = 1000 - 2 * i64::from(MESSAGES);
    if left != expected {
        return Err(format!("stock: 1000 -> {left}, not {expected}").into());
    }
    let effect = format!(
        "{MESSAGES} order lines of 2 apples each, published {COPIES} times: stock 1000 -> {left} (each deducted once)"
    );
    Ok((effect, report))
}

async fn points<B: Broker>(
    broker: &B,
    pool: &PgPool,
    store: PgStore,
    table: &str,
) -> Result<Ran, BoxError> {
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
    let report = consume(broker, move |msg: PointsEarned| {
        let store = store.clone();
        async move { grant_points(&store, &msg).await }
    })
    .await?;
    let total = scalar(
        pool,
        format!("SELECT COALESCE(SUM(points), 0)::BIGINT FROM {table}"),
    )
    .await?;
    let expected = 10 * i64::from(MESSAGES);
    if total != expected {
        return Err(format!("points: {total} granted, not {expected}").into());
    }
    let effect = format!(
        "{MESSAGES} purchases of 10 points over 4 users, published {COPIES} times: {total} points granted"
    );
    Ok((effect, report))
}

async fn statistic<B: Broker>(
    broker: &B,
    pool: &PgPool,
    store: PgStore,
    table: &str,
) -> Result<Ran, BoxError> {
    sqlx::query(AssertSqlSafe(format!(
        "CREATE TABLE {table} (day TEXT PRIMARY KEY, orders BIGINT NOT NULL)"
    )))
    .execute(pool)
    .await?;
    let day = |i: u32| format!("2026-11-{:02}", 28 + i % 3);
    publish_all(broker, |i| OrderCounted {
        message_id: format!("order-{i}"),
        day: day(i),
        stats: table.to_owned(),
    })
    .await?;
    let report = consume(broker, move |msg: OrderCounted| {
        let store = store.clone();
        async move { count_order(&store, &msg).await }
    })
    .await?;
    let rows: Vec<(String, i64)> = sqlx::query_as(AssertSqlSafe(format!(
        "SELECT day, orders FROM {table} ORDER BY day"
    )))
    .fetch_all(pool)
    .await?;
    let mut expected = std::collections::BTreeMap::<String, i64>::new();
    for i in 0..MESSAGES {
        *expected.entry(day(i)).or_default() += 1;
    }
    if rows != expected.into_iter().collect::<Vec<_>>() {
        return Err(format!("statistic: counted {rows:?}").into());
    }
    let effect = format!("{MESSAGES} orders published {COPIES} times, counted per day: {rows:?}");
    Ok((effect, report))
}

async fn sms<B: Broker>(broker: &B, store: RedisStore) -> Result<Ran, BoxError> {
    GATEWAY.clear();
    publish_all(broker, |i| OrderShipped {
        order_id: i,
        phone: format!("+1555{i:07}"),
    })
    .await?;
    let report = consume(broker, move |msg: OrderShipped| {
        let store = store.clone();
        async move { send_sms(&store, &msg).await }
    })
    .await?;
    let (sends, keys) = (GATEWAY.sends(), GATEWAY.keys());
    if sends != MESSAGES || keys != MESSAGES {
        return Err(format!("sms: the gateway sent {sends} messages under {keys} keys").into());
    }
    let effect =
        format!("{MESSAGES} shipments published {COPIES} times: the gateway sent {sends} messages");
    Ok((effect, report))
}

/// The brokers and the scenarios, as the command line names them.
const BROKERS: [&str; 4] = ["rabbitmq", "nats", "kafka", "rocketmq"];
const SCENARIOS: [&str; 4] = ["stock", "points", "sms", "statistic"];

/// Runs `scenario` on the broker named `kind`.
async fn on_broker(kind: &str, scenario: &str) -> Result<(), BoxError> {
    match kind {
        "rabbitmq" => on::<rabbitmq::Queue>(scenario).await,
        "nats" => on::<nats::Stream>(scenario).await,
        "rocketmq" => on::<rocketmq::Topic>(scenario).await,
        _ => on::<kafka::Topic>(scenario).await,
    }
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (brokers, scenarios): (Vec<&str>, Vec<&str>) = match args.as_slice() {
        [] => (BROKERS.to_vec(), SCENARIOS.to_vec()),
        [kind] => (vec![kind.as_str()], SCENARIOS.to_vec()),
        [kind, scenario] => (vec![kind.as_str()], vec![scenario.as_str()]),
        _ => {
            return Err(
                "usage: consume [rabbitmq|nats|kafka|rocketmq [stock|points|sms|statistic]]".into(),
            );
        }
    };
    if let Some(b) = brokers.iter().find(|b| !BROKERS.contains(b)) {
        return Err(format!("unknown broker {b:?}: rabbitmq, nats, kafka or rocketmq").into());
    }
    if let Some(s) = scenarios.iter().find(|s| !SCENARIOS.contains(s)) {
        return Err(format!("unknown scenario {s:?}: stock, points, sms or statistic").into());
    }
    let mut outcomes = Vec::new();
    for kind in &brokers {
        for scenario in &scenarios {
            let outcome = on_broker(kind, scenario).await;
            if let Err(e) = &outcome {
                println!("{kind}/{scenario}: FAILED: {e}");
            }
            outcomes.push((*kind, *scenario, outcome.is_ok()));
        }
    }
    println!("outcome (every message took effect once?):");
    for kind in &brokers {
        let line: Vec<String> = outcomes
            .iter()
            .filter(|(k, _, _)| k == kind)
            .map(|(_, s, ok)| format!("{s} {}", if *ok { "yes" } else { "NO" }))
            .collect();
        println!("  {kind:<8} {}", line.join(", "));
    }
    let failed = outcomes.iter().filter(|(_, _, ok)| !ok).count();
    if failed > 0 {
        return Err(format!("{failed} of {} runs failed", outcomes.len()).into());
    }
    Ok(())
}
