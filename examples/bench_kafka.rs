//! Messages per second through Kafka: the same consumer (partitions in
//! order, one lane each) around
//!
//! * `idem`: an idempotent transaction-mode Postgres handler inserting one
//!   business row,
//! * `bare`: a bare transaction doing the same insert (`BEGIN; INSERT;
//!   COMMIT`),
//! * `offsets-in-tx`: the idempotent handler with the consumer's offsets
//!   written in its transaction (`Consumer::offsets_in`);
//! * `limit: + narrow row`: the bare transaction with one more prepared
//!   statement (the order's id and a short text into a table of its own),
//!   the least a dedup record adds;
//! * `limit: idem + narrow row`: the idempotent handler with that
//!   statement in its body, the least the offsets in the transaction (one
//!   more statement) can cost.
//!
//! Rounds are interleaved in one run, in an order rotated each round
//! (idem, bare, offsets-in-tx, the limits; then bare first, ...); the last line is the ratio of the medians
//! idem/bare, after the limits' ratios and idem's and offsets-in-tx's
//! against them.
//!
//! ```sh
//! MESSAGES=5000 ROUNDS=5 cargo run --release -p idem-examples --features kafka,postgres --example bench_kafka
//! ```
//!
//! The broker is `KAFKA_BROKERS` (default `127.0.0.1:9092`); the figures
//! in the benchmarks chapter are on tansu in memory, started with `tansu
//! broker --listener-url tcp://127.0.0.1:9092 --advertised-listener-url
//! tcp://127.0.0.1:9092 --storage-engine memory://tansu/`.
//!
//! Each round publishes `MESSAGES` fresh messages, keyed by order id, to a
//! fresh topic of 3 partitions first (not timed), then starts a consumer in
//! a fresh group, which reads the backlog: the time runs from its first
//! processed message to its last, so the group's join is not in it. The
//! consumer may hold the whole backlog (`buffer`), so that no partition is
//! paused: on tansu, a partition resumed inside a record batch gets no more
//! messages. Each
//! round checks that every message was executed once and its row is there.
//! The CPU's busy, idle and steal shares (from `/proc/stat`, all
//! processes) are printed for each variant's timed part, for each round
//! (its set-up included), marked `STOLEN` above 5 % steal (see
//! `examples/src/cpu.rs`), and for the whole run, with the load average: on
//! a shared machine, a round with high steal, or busy time this run does
//! not account for, measured the neighbours too. The medians are given over
//! all rounds and over the unmarked ones.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem_examples::broker::kafka::{self, Admin};
use idem_examples::cpu::{Conditions, Cpu, Rounds, Watch, load_average};
use idem_examples::env;
use idem_runtime::consume::Policy;
use idem_runtime::consume::kafka::Consumer;
use idem_runtime::{Error, Key, Outcome, PgStore, PgTx, idempotent};
use rdkafka::producer::FutureRecord;
use serde::{Deserialize, Serialize};
use sqlx::{AssertSqlSafe, PgPool};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Debug, Serialize, Deserialize)]
struct OrderPlaced {
    order_id: i64,
    sku: i64,
    /// The run's business table.
    orders: String,
}

/// The business statement: the order's row.
async fn insert(conn: &mut sqlx::PgConnection, msg: &OrderPlaced) -> Result<u64, sqlx::Error> {
    let sql = format!("INSERT INTO {} (order_id, sku) VALUES ($1, $2)", msg.orders);
    let done = sqlx::query(AssertSqlSafe(sql))
        .bind(msg.order_id)
        .bind(msg.sku)
        .execute(conn)
        .await?;
    Ok(done.rows_affected())
}

/// One more prepared statement: a narrow row in `<orders>_notes`.
async fn note(conn: &mut sqlx::PgConnection, msg: &OrderPlaced) -> Result<(), sqlx::Error> {
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO {}_notes (order_id, note) VALUES ($1, $2)",
        msg.orders
    )))
    .bind(msg.order_id)
    .bind("42")
    .execute(conn)
    .await?;
    Ok(())
}

#[idempotent(key = "order_id", ttl = "1h", store = "postgres")]
async fn record(tx: &mut PgTx<'_>, msg: &OrderPlaced) -> Result<u64, sqlx::Error> {
    insert(tx, msg).await
}

/// [`record`] with one more statement in its transaction ([`note`]): the
/// limit of the offsets in the transaction, which add one.
#[idempotent(key = "order_id", ttl = "1h", store = "postgres")]
async fn record_noted(tx: &mut PgTx<'_>, msg: &OrderPlaced) -> Result<u64, sqlx::Error> {
    let done = insert(tx, msg).await?;
    note(tx, msg).await?;
    Ok(done)
}

/// The business statement in a transaction of its own; with `extra`, one
/// more prepared statement beside it ([`note`]).
async fn record_bare(pool: &PgPool, msg: &OrderPlaced, extra: bool) -> Result<u64, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let done = insert(&mut tx, msg).await?;
    if extra {
        note(&mut tx, msg).await?;
    }
    tx.commit().await?;
    Ok(done)
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
    Idem,
    Bare,
    OffsetsInTx,
    Extra,
    IdemExtra,
}

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::Idem => "idem",
            Variant::Bare => "bare",
            Variant::OffsetsInTx => "offsets-in-tx",
            Variant::Extra => "limit: + narrow row",
            Variant::IdemExtra => "limit: idem + narrow row",
        }
    }

    /// Its part of a topic's name.
    fn tag(self) -> &'static str {
        match self {
            Variant::Idem => "idem",
            Variant::Bare => "bare",
            Variant::OffsetsInTx => "offsets_in_tx",
            Variant::Extra => "extra",
            Variant::IdemExtra => "idem_extra",
        }
    }
}

/// What a round leaves to delete: its topics and its group.
struct Made {
    topics: Vec<String>,
    groups: Vec<String>,
}

/// The run's database side: the pool, the store and the business table.
struct Db {
    pool: PgPool,
    store: PgStore,
    orders: String,
}

/// Publishes `messages` orders to `topic` and waits for every
/// acknowledgement.
async fn publish(
    producer: &rdkafka::producer::FutureProducer,
    topic: &str,
    first_id: i64,
    messages: u64,
    orders: &str,
) -> Result<(), BoxError> {
    let mut pending = Vec::new();
    for i in 0..messages {
        let order_id = first_id + i64::try_from(i)?;
        let payload = serde_json::to_vec(&OrderPlaced {
            order_id,
            sku: order_id % 1_000,
            orders: orders.to_owned(),
        })?;
        let key = order_id.to_string();
        let record = FutureRecord::to(topic).key(&key).payload(&payload);
        pending.push(producer.send_result(record).map_err(|(e, _)| e)?);
    }
    for delivery in pending {
        delivery.await?.map_err(|(e, _)| e)?;
    }
    Ok(())
}

async fn round(
    variant: Variant,
    round: u64,
    messages: u64,
    run_id: &str,
    admin: &Admin,
    db: &Db,
    made: &mut Made,
) -> Result<(f64, Conditions), BoxError> {
    let topic = format!("{run_id}_r{round}_{}", variant.tag());
    let consumer = Consumer::new(kafka::brokers(), &topic, &topic);
    made.topics.push(topic.clone());
    made.topics.extend(kafka::made_by(&consumer));
    admin.create_topic(&topic).await?;
    made.groups.push(topic.clone());
    let first_id = i64::try_from(round)? * 1_000_000;
    publish(&kafka::producer()?, &topic, first_id, messages, &db.orders).await?;

    // The whole backlog may wait in the consumer: a paused partition is
    // resumed from inside a record batch, which the test broker (tansu 0.6)
    // answers with nothing, for good.
    let consumer = consumer
        .prefetch(usize::try_from(messages)?)
        .policy(Policy {
            concurrency: 8,
            ..Policy::default()
        });
    let consumer = match variant {
        Variant::OffsetsInTx => consumer.offsets_in(&db.store),
        Variant::Idem | Variant::Bare | Variant::Extra | Variant::IdemExtra => consumer,
    };
    let clock = Arc::new(Clock::default());
    let stop = idem_runtime::consume::CancellationToken::new();
    let running = {
        let (clock, pool, store) = (Arc::clone(&clock), db.pool.clone(), db.store.clone());
        tokio::spawn(consumer.run(
            move |msg: OrderPlaced| {
                let (clock, pool, store) = (Arc::clone(&clock), pool.clone(), store.clone());
                async move {
                    let r = match variant {
                        Variant::Idem | Variant::OffsetsInTx => record(&store, &msg).await,
                        Variant::IdemExtra => record_noted(&store, &msg).await,
                        Variant::Bare | Variant::Extra => {
                            let done = record_bare(&pool, &msg, variant == Variant::Extra).await;
                            done.map(Outcome::Executed).map_err(|error| Error::Handler {
                                handler: variant.name(),
                                key: Key::from_parts(&[&msg.order_id]).expect("a key"),
                                error,
                            })
                        }
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
    // The CPU over the timed part, to within a tick of its ends.
    let (mut began, deadline) = (None, Instant::now() + Duration::from_secs(300));
    while clock.done.load(Ordering::SeqCst) < messages && !running.is_finished() {
        if Instant::now() > deadline {
            stop.cancel();
            let _ = running.await;
            let done = clock.done.load(Ordering::SeqCst);
            return Err(format!(
                "round {round} {}: {done} of {messages} messages within 300 s",
                variant.name()
            )
            .into());
        }
        if began.is_none() && clock.done.load(Ordering::SeqCst) > 0 {
            began = Some(Cpu::now()?);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let cpu = Cpu::now()?.conditions_since(began.ok_or("the round ended within a tick")?);
    stop.cancel();
    let report = running.await??;

    let rows: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT count(*) FROM {} WHERE order_id >= $1 AND order_id < $2",
        db.orders
    )))
    .bind(first_id)
    .bind(first_id + 1_000_000)
    .fetch_one(&db.pool)
    .await?;
    let executed = report.acked - report.duplicates;
    if executed != messages || u64::try_from(rows)? != messages || report.retried > 0 {
        return Err(format!(
            "round {round} {}: {executed} executed, {rows} rows, {} retried, {} dead-lettered, of {messages}",
            variant.name(),
            report.retried,
            report.dead_lettered
        )
        .into());
    }
    if variant == Variant::OffsetsInTx {
        let table = kafka_offsets_table(&db.store);
        let next: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT COALESCE(SUM(next_offset), 0)::BIGINT FROM {table} WHERE consumer_group = $1 AND topic = $1"
        )))
        .bind(&topic)
        .fetch_one(&db.pool)
        .await?;
        if u64::try_from(next)? != messages {
            return Err(format!(
                "round {round}: the offsets in {table} add up to {next}, not {messages}"
            )
            .into());
        }
    }
    Ok((clock.rate(messages), cpu))
}

fn kafka_offsets_table(store: &PgStore) -> String {
    idem_runtime::consume::kafka::Offsets::from(store)
        .table()
        .to_owned()
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let messages: u64 = env("MESSAGES", 5_000);
    let rounds: u64 = env("ROUNDS", 5);
    let pg = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let run_id = format!("bench_kafka_{}", std::process::id());
    let (orders, dedup) = (format!("{run_id}_orders"), format!("{run_id}_dedup"));

    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(16)
        .connect(&pg)
        .await?;
    sqlx::raw_sql(AssertSqlSafe(format!(
        "CREATE TABLE {orders} (order_id BIGINT PRIMARY KEY, sku BIGINT NOT NULL);
         CREATE TABLE {orders}_notes (order_id BIGINT PRIMARY KEY, note TEXT NOT NULL)"
    )))
    .execute(&pool)
    .await?;
    let store = PgStore::from_pool(pool.clone()).with_table(&dedup)?;
    store.migrate().await?;
    let offsets = kafka_offsets_table(&store);
    let db = Db {
        pool: pool.clone(),
        store,
        orders: orders.clone(),
    };
    let admin = Admin::connect()?;

    println!(
        "{messages} messages a round on {} partitions, {rounds} rounds; {} cores, load average {}",
        kafka::PARTITIONS,
        std::thread::available_parallelism().map_or(0, usize::from),
        load_average()
    );
    let variants = [
        Variant::Idem,
        Variant::Bare,
        Variant::OffsetsInTx,
        Variant::Extra,
        Variant::IdemExtra,
    ];
    let mut rates: [Vec<f64>; 5] = Default::default();
    let mut made = Made {
        topics: Vec::new(),
        groups: Vec::new(),
    };
    let run = Watch::start()?;
    let mut marks = Rounds::default();
    let result: Result<(), BoxError> = async {
        for r in 0..rounds {
            let watch = Watch::start()?;
            // The order rotates each round, so that no variant always
            // runs first (or after the same one).
            for i in 0..variants.len() {
                let v = (i + r as usize) % variants.len();
                let variant = &variants[v];
                let id = r * variants.len() as u64 + v as u64;
                let (rate, cpu) =
                    round(*variant, id, messages, &run_id, &admin, &db, &mut made).await?;
                println!("round {r} {}: {rate:.0} msg/s ({cpu})", variant.name());
                rates[v].push(rate);
            }
            println!("round {r}, set-up included: {}", marks.push(watch.stop()?));
        }
        Ok(())
    }
    .await;
    let over_run = run.stop()?;

    if let Err(e) = admin.delete_topics(&made.topics).await {
        eprintln!("{e}");
    }
    for group in &made.groups {
        if let Err(e) = admin.delete_group(group).await {
            eprintln!("{e}");
        }
    }
    let _ = sqlx::query(AssertSqlSafe(format!(
        "DROP TABLE IF EXISTS {orders}, {orders}_notes, {dedup}, {dedup}_outbox, {offsets}"
    )))
    .execute(&pool)
    .await;
    result?;

    let [idem, bare, in_tx, extra, idem_extra] = rates.map(|r| marks.medians(&r));
    println!("{}", marks.summary());
    println!(
        "cpu over the run: {over_run}; load average after {}",
        load_average()
    );
    println!(
        "median: idem {idem} msg/s, bare {bare} msg/s, offsets-in-tx {in_tx} msg/s, \
         limit: + narrow row {extra} msg/s, limit: idem + narrow row {idem_extra} msg/s"
    );
    println!(
        "over all rounds and unmarked ones: offsets-in-tx/idem {:.3}, idem/bare {:.3}, \
         limit/bare {:.3}, idem/limit {:.3}, (idem + narrow row)/idem {:.3}, \
         offsets-in-tx/(idem + narrow row) {:.3}",
        in_tx.ratio(&idem),
        idem.ratio(&bare),
        extra.ratio(&bare),
        idem.ratio(&extra),
        idem_extra.ratio(&idem),
        in_tx.ratio(&idem_extra)
    );
    println!("offsets-in-tx/idem {:.3}", in_tx.all / idem.all);
    println!(
        "limit/bare {:.3}, idem/limit {:.3}; (idem + narrow row)/idem {:.3}, \
         offsets-in-tx/(idem + narrow row) {:.3}",
        extra.all / bare.all,
        idem.all / extra.all,
        idem_extra.all / idem.all,
        in_tx.all / idem_extra.all
    );
    println!("idem/bare {:.3}", idem.all / bare.all);
    Ok(())
}
