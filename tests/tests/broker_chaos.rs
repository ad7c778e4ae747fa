//! Chaos on real brokers (RabbitMQ, NATS JetStream, RocketMQ): a producer
//! publishes 4,000 messages, a fifth of them twice; three consumer processes (this test binary, re-run as
//! `chaos_consumer`) apply them through a transaction-mode Postgres handler;
//! one of them is killed with SIGKILL every 250 ms and started again, and
//! the consumers' Postgres connections are terminated every half second. At the end the truth is read from the business table:
//! every message applied exactly once (0 doubled, 0 lost), nothing dead-
//! lettered, nothing left in the queues or unacknowledged. Bounded to about
//! a minute per broker; the counts are printed.

// The RocketMQ fixture holds rocketmq-client-rust's types across awaits.
#![recursion_limit = "256"]

mod chaos;
mod common;

use chaos::{Applied, apply};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::str::FromStr;
use std::time::{Duration, Instant};

use idem_runtime::consume::{CancellationToken, Policy, nats, rabbitmq, rocketmq, shutdown_on};
use idem_runtime::{ClaimOrder, MySqlStore, MySqlTx, PgStore, SqliteStore, SqliteTx, idempotent};
use idem_tests::brokers::{DeleteQueues, DeleteStreams, amqp_url, nats_url};
use idem_tests::{DropTables, or_skip, pg_pool, pg_url, unique_table};
use lapin::options::{BasicPublishOptions, QueueDeclareOptions};
use lapin::types::{FieldTable, ShortString};
use sqlx::AssertSqlSafe;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

/// Logical messages, and how many of them are published twice.
const MESSAGES: i64 = 4_000;
const TWICE_EVERY: i64 = 5;
const PUBLISHED_TWICE: i64 = (MESSAGES + TWICE_EVERY - 1) / TWICE_EVERY;
const CONSUMERS: usize = 3;
/// How long the whole run may take before it fails. A run takes about 50 s
/// alone on 2 cores; the SQLite one, whose consumers share one writer,
/// went past 90 s on a slow machine while another chaos run shared the cores.
const DEADLINE: Duration = Duration::from_secs(180);

/// Lease mode: the same effect, written outside any idem transaction (as an
/// SMS or an HTTP call would be), with the claim and the record in Redis.
#[idempotent(
    key = "msg.message_id",
    ttl = "1h",
    store = "redis",
    lease = "5s",
    name = "chaos_apply_lease"
)]
async fn apply_lease(msg: &Applied, pool: &sqlx::PgPool) -> Result<i64, sqlx::Error> {
    let sql = format!(
        "INSERT INTO {} (message_id, applied) VALUES ($1, 1)
         ON CONFLICT (message_id) DO UPDATE SET applied = {0}.applied + 1 RETURNING applied",
        msg.table
    );
    sqlx::query_scalar(AssertSqlSafe(sql))
        .bind(msg.message_id)
        .fetch_one(pool)
        .await
}

/// Transaction mode on MySQL: the business row in the claim's transaction.
#[idempotent(
    key = "message_id",
    ttl = "1h",
    store = "mysql",
    name = "chaos_apply_mysql"
)]
async fn apply_mysql(tx: &mut MySqlTx<'_>, msg: &Applied) -> Result<i64, sqlx::Error> {
    let sql = format!(
        "INSERT INTO {} (message_id, applied) VALUES (?, 1)
         ON DUPLICATE KEY UPDATE applied = applied + 1",
        msg.table
    );
    sqlx::query(AssertSqlSafe(sql))
        .bind(msg.message_id)
        .execute(&mut **tx)
        .await?;
    Ok(1)
}

/// Transaction mode on SQLite: one file shared by the consumer processes.
#[idempotent(
    key = "message_id",
    ttl = "1h",
    store = "sqlite",
    name = "chaos_apply_sqlite"
)]
async fn apply_sqlite(tx: &mut SqliteTx<'_>, msg: &Applied) -> Result<i64, sqlx::Error> {
    let sql = format!(
        "INSERT INTO {} (message_id, applied) VALUES (?, 1)
         ON CONFLICT (message_id) DO UPDATE SET applied = applied + 1",
        msg.table
    );
    sqlx::query(AssertSqlSafe(sql))
        .bind(msg.message_id)
        .execute(&mut **tx)
        .await?;
    Ok(1)
}

/// The transaction-mode store of a consumer process
/// (`IDEM_CHAOS_STORE`: `mysql`, `sqlite:<path>`, or PostgreSQL).
#[derive(Clone)]
enum TxStore {
    Pg(PgStore),
    MySql(MySqlStore),
    Sqlite(SqliteStore),
}

/// The consumer process: runs until it is killed, or until SIGINT, which
/// shuts it down gracefully.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by the chaos tests as a child process"]
async fn chaos_consumer() {
    let Ok(broker) = std::env::var("IDEM_CHAOS_BROKER") else {
        return;
    };
    let dedup = std::env::var("IDEM_CHAOS_DEDUP").expect("dedup table");
    let name = std::env::var("IDEM_CHAOS_NAME").expect("queue or stream");
    let options = PgConnectOptions::from_str(&pg_url())
        .expect("DATABASE_URL")
        .application_name("idem_chaos");
    let connect = || {
        PgPoolOptions::new()
            .max_connections(8)
            .connect_with(options.clone())
    };
    let pool = idem_runtime::consume::until_ok("postgres", connect, &CancellationToken::new())
        .await
        .expect("a pool");
    let redis = match std::env::var("IDEM_CHAOS_REDIS") {
        Ok(url) => Some(
            idem_runtime::RedisStore::connect(&url)
                .await
                .expect("redis")
                .with_prefix(&dedup)
                .expect("prefix"),
        ),
        Err(_) => None,
    };
    let store = match std::env::var("IDEM_CHAOS_STORE").ok().as_deref() {
        Some("mysql") => TxStore::MySql(
            MySqlStore::connect(&idem_tests::mysql_url())
                .await
                .expect("mysql")
                .with_table(&dedup)
                .expect("table"),
        ),
        Some(spec) if spec.starts_with("sqlite:") => TxStore::Sqlite(
            SqliteStore::open(&spec["sqlite:".len()..])
                .await
                .expect("sqlite")
                .with_table(&dedup)
                .expect("table"),
        ),
        _ => TxStore::Pg(
            PgStore::from_pool(pool.clone())
                .with_table(&dedup)
                .expect("table")
                .with_claim_order(ClaimOrder::Last),
        ),
    };
    let handler = move |msg: Applied| {
        let (store, redis, pool) = (store.clone(), redis.clone(), pool.clone());
        async move {
            let result = match (&redis, &store) {
                (Some(redis), _) => apply_lease(redis, &msg, &pool).await,
                (None, TxStore::Pg(store)) => apply(store, &msg).await,
                (None, TxStore::MySql(store)) => apply_mysql(store, &msg).await,
                (None, TxStore::Sqlite(store)) => apply_sqlite(store, &msg).await,
            };
            // What this delivery came to, for the run's counts (lost when
            // the connection or the process dies first: the counts are a
            // floor).
            let kind = match &result {
                Ok(o) if o.is_duplicate() => "duplicate",
                Ok(_) => "executed",
                Err(e) => e.kind(),
            };
            let _ = sqlx::query(AssertSqlSafe(format!(
                "INSERT INTO {}_seen (kind) VALUES ($1)",
                msg.table
            )))
            .bind(kind)
            .execute(&pool)
            .await;
            result
        }
    };
    let policy = Policy {
        first_delay: Duration::from_millis(100),
        max_delay: Duration::from_secs(1),
        max_failures: 1_000,
        concurrency: 8,
        max_store_delay: Duration::from_secs(1),
        ..Policy::default()
    };
    println!("READY");
    let forever = shutdown_on(async {
        let _ = tokio::signal::ctrl_c().await;
    });
    let report = match broker.as_str() {
        "rabbitmq" => {
            rabbitmq::Consumer::new(amqp_url(), name)
                .policy(policy)
                .run(handler, forever)
                .await
        }
        "rocketmq" => {
            rocketmq::Consumer::new(idem_tests::brokers::rocketmq_name_server(), name)
                .delay_levels(idem_tests::brokers::rocketmq_delay_levels())
                .policy(policy)
                .run(handler, forever)
                .await
        }
        _ => {
            nats::Consumer::new(nats_url(), name.clone(), format!("idem.chaos.{name}"))
                .policy(policy)
                .ack_wait(Duration::from_secs(2))
                .run(handler, forever)
                .await
        }
    };
    println!("consumer done: {report:?}");
}

/// A consumer process of this binary.
struct Consumer {
    child: Child,
}

impl Consumer {
    fn start(broker: &str, name: &str, dedup: &str, store: Option<&str>) -> Consumer {
        Self::start_with(broker, name, dedup, None, store)
    }

    /// A consumer whose handler runs in lease mode on the Redis at `redis`,
    /// or in transaction mode on `store` (`IDEM_CHAOS_STORE`; PostgreSQL
    /// when `None`).
    fn start_with(
        broker: &str,
        name: &str,
        dedup: &str,
        redis: Option<&str>,
        store: Option<&str>,
    ) -> Consumer {
        let exe = std::env::current_exe().expect("test binary");
        let mut command = Command::new(exe);
        command
            .args([
                "chaos_consumer",
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("IDEM_CHAOS_BROKER", broker)
            .env("IDEM_CHAOS_NAME", name)
            .env("IDEM_CHAOS_DEDUP", dedup);
        if let Some(store) = store {
            command.env("IDEM_CHAOS_STORE", store);
        }
        if let Some(url) = redis {
            command.env("IDEM_CHAOS_REDIS", url);
        }
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start a consumer");
        let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        loop {
            match lines.next() {
                Some(Ok(line)) if line.contains("READY") => break,
                Some(_) => {}
                None => panic!("a consumer exited before it was ready"),
            }
        }
        // Keep reading so the child never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        Consumer { child }
    }

    fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGINT: the consumer stops taking, settles what is in flight and
    /// exits.
    fn stop(mut self) {
        let _ = Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("a consumer did not shut down within 20 s of SIGINT");
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What the run did, printed at the end.
#[derive(Debug, Default)]
struct Counts {
    // Read by the summary the run prints.
    #[allow(dead_code)]
    published: i64,
    #[allow(dead_code)]
    published_twice: i64,
    kills: u32,
    connections_terminated: i64,
    end: End,
}

/// What a run left, read once every consumer was stopped gracefully.
#[derive(Debug, Default)]
struct End {
    /// Deliveries the consumers saw, by what they came to (a floor: a
    /// delivery whose consumer died before it was counted is not). Read by
    /// the summary the run prints.
    #[allow(dead_code)]
    seen: Seen,
    #[allow(dead_code)]
    applied_rows: i64,
    doubled: i64,
    lost: i64,
    dead_lettered: u64,
    waiting_at_end: u64,
}

impl End {
    /// Stops `consumers` (each settles what it has in flight), then reads
    /// the business table, the counts and the broker.
    async fn after<B: ChaosBroker>(
        b: &B,
        consumers: Vec<Consumer>,
        admin: &sqlx::PgPool,
        truth: &Truth,
        table: &str,
    ) -> End {
        for c in consumers {
            tokio::task::spawn_blocking(move || c.stop())
                .await
                .expect("stop");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        let rows = truth.rows(table).await;
        End {
            seen: Seen::read(admin, table).await,
            applied_rows: rows.len() as i64,
            doubled: rows.iter().filter(|(_, n)| *n > 1).count() as i64,
            lost: MESSAGES - rows.len() as i64,
            dead_lettered: b.dead_letters().await,
            waiting_at_end: b.waiting().await,
        }
    }

    /// Every message took effect once, nothing was dead-lettered, nothing
    /// is left waiting.
    fn assert_exactly_once(&self) {
        assert_eq!(self.doubled, 0, "{self:?}");
        assert_eq!(self.lost, 0, "{self:?}");
        assert_eq!(self.dead_lettered, 0, "{self:?}");
        assert_eq!(self.waiting_at_end, 0, "{self:?}");
    }
}

/// Publishes every message, a fifth of them twice.
async fn produce<B: ChaosBroker>(b: &B, table: &str) {
    for id in 0..MESSAGES {
        let payload = serde_json::to_vec(&Applied {
            message_id: id,
            table: table.to_owned(),
        })
        .expect("encode");
        b.publish(payload.clone()).await;
        if id % TWICE_EVERY == 0 {
            b.publish(payload).await;
        }
    }
}

/// Where a run's business table is: where its transaction-mode handler
/// writes, in the claim's transaction.
enum Truth {
    Pg(sqlx::PgPool),
    MySql(sqlx::MySqlPool),
    /// The pool, and the file the consumer processes share.
    Sqlite(sqlx::SqlitePool, String),
}

impl Truth {
    /// What the consumer processes are told (`IDEM_CHAOS_STORE`).
    fn spec(&self) -> Option<&str> {
        match self {
            Truth::Pg(_) => None,
            Truth::MySql(_) => Some("mysql"),
            Truth::Sqlite(_, spec) => Some(spec),
        }
    }

    /// The business table's rows: message id, times applied.
    async fn rows(&self, table: &str) -> Vec<(i64, i64)> {
        let sql = format!("SELECT message_id, applied FROM {table}");
        match self {
            Truth::Pg(p) => sqlx::query_as(AssertSqlSafe(sql)).fetch_all(p).await,
            Truth::MySql(p) => sqlx::query_as(AssertSqlSafe(sql)).fetch_all(p).await,
            Truth::Sqlite(p, _) => sqlx::query_as(AssertSqlSafe(sql)).fetch_all(p).await,
        }
        .expect("read the business table")
    }
}

/// How many messages took effect so far.
async fn applied(admin: &sqlx::PgPool, table: &str) -> i64 {
    sqlx::query_scalar(AssertSqlSafe(format!("SELECT COUNT(*) FROM {table}")))
        .fetch_one(admin)
        .await
        .expect("count")
}

/// What the consumers' deliveries came to.
#[derive(Debug, Default)]
struct Seen {
    delivered: i64,
    executed: i64,
    duplicates: i64,
    /// Handed back to be retried: in progress elsewhere, or the store failed.
    retried: i64,
}

impl Seen {
    async fn read(admin: &sqlx::PgPool, table: &str) -> Seen {
        let rows: Vec<(String, i64)> = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT kind, COUNT(*) FROM {table}_seen GROUP BY kind"
        )))
        .fetch_all(admin)
        .await
        .expect("read the counts");
        let mut seen = Seen::default();
        for (kind, n) in rows {
            seen.delivered += n;
            match kind.as_str() {
                "executed" => seen.executed += n,
                "duplicate" => seen.duplicates += n,
                _ => seen.retried += n,
            }
        }
        seen
    }
}

/// The broker side of a run: publishing, and what is left at the end.
trait ChaosBroker {
    const NAME: &'static str;
    async fn publish(&self, payload: Vec<u8>);
    /// Messages waiting or unacknowledged anywhere (work, retry queues).
    async fn waiting(&self) -> u64;
    async fn dead_letters(&self) -> u64;
}

struct Rabbit {
    queue: String,
    conn: lapin::Connection,
    channel: lapin::Channel,
    consumer: rabbitmq::Consumer,
}

impl ChaosBroker for Rabbit {
    const NAME: &'static str = "rabbitmq";

    async fn publish(&self, payload: Vec<u8>) {
        self.channel
            .basic_publish(
                ShortString::from(""),
                self.queue.as_str().into(),
                BasicPublishOptions::default(),
                &payload,
                lapin::BasicProperties::default().with_delivery_mode(2),
            )
            .await
            .expect("publish")
            .await
            .expect("confirmed");
    }

    async fn waiting(&self) -> u64 {
        let mut queues = vec![self.queue.clone()];
        queues.extend(
            rabbitmq::RETRY_DELAYS
                .iter()
                .map(|d| self.consumer.retry_queue(*d)),
        );
        let mut n = 0;
        for q in queues {
            n += self.depth(&q).await;
        }
        n
    }

    async fn dead_letters(&self) -> u64 {
        self.depth(&self.consumer.dead_letter_queue()).await
    }
}

impl Rabbit {
    /// Ready and unacknowledged messages of a queue (the management view
    /// is not needed: a passive declare counts ready ones, and unacked ones
    /// come back as ready once their consumer is gone).
    async fn depth(&self, queue: &str) -> u64 {
        let channel = self.conn.create_channel().await.expect("a channel");
        let passive = QueueDeclareOptions {
            passive: true,
            ..QueueDeclareOptions::default()
        };
        let n = channel
            .queue_declare(queue.into(), passive, FieldTable::default())
            .await
            .map(|q| u64::from(q.message_count()))
            .unwrap_or(0);
        let _ = channel.close(200, "counted".into()).await;
        n
    }
}

struct Nats {
    stream: String,
    js: async_nats::jetstream::Context,
    consumer: nats::Consumer,
}

impl ChaosBroker for Nats {
    const NAME: &'static str = "nats";

    async fn publish(&self, payload: Vec<u8>) {
        self.js
            .publish(format!("idem.chaos.{}", self.stream), payload.into())
            .await
            .expect("publish")
            .await
            .expect("acknowledged");
    }

    async fn waiting(&self) -> u64 {
        let Ok(mut stream) = self.js.get_stream(&self.stream).await else {
            return 0;
        };
        match stream
            .get_consumer::<async_nats::jetstream::consumer::pull::Config>(
                self.consumer.durable_name(),
            )
            .await
        {
            Ok(mut c) => {
                let info = c.info().await.expect("consumer info");
                info.num_pending + info.num_ack_pending as u64
            }
            Err(_) => stream.info().await.expect("stream info").state.messages,
        }
    }

    async fn dead_letters(&self) -> u64 {
        match self.js.get_stream(self.consumer.dead_letter_stream()).await {
            Ok(mut s) => s.info().await.map(|i| i.state.messages).unwrap_or(0),
            Err(_) => 0,
        }
    }
}

struct Rocket {
    mq: idem_tests::brokers::RocketMq,
    topic: String,
    consumer: rocketmq::Consumer,
}

impl ChaosBroker for Rocket {
    const NAME: &'static str = "rocketmq";

    async fn publish(&self, payload: Vec<u8>) {
        self.mq.publish(&self.topic, &payload, None).await;
    }

    async fn waiting(&self) -> u64 {
        // The topic, idem's retry topic and the broker's, as the group's
        // committed offsets say.
        let group = self.consumer.group_name();
        let mut n = 0;
        for topic in [
            self.topic.clone(),
            self.consumer.retry_topic(),
            format!("%RETRY%{group}"),
        ] {
            n += self.mq.lag(group, &topic).await;
        }
        n
    }

    async fn dead_letters(&self) -> u64 {
        self.mq.read(&self.consumer.dead_letter_topic()).await.len() as u64
    }
}

/// A RocketMQ topic of the test's own, with 4 queues.
async fn rocket(prefix: &str) -> Option<Rocket> {
    let mq = idem_tests::brokers::rocketmq().await?;
    let topic = unique_table(prefix);
    mq.create_topic(&topic, 4).await;
    let consumer = rocketmq::Consumer::new(mq.name_server(), topic.clone());
    Some(Rocket {
        mq,
        topic,
        consumer,
    })
}

async fn run<B: ChaosBroker>(
    b: &B,
    name: &str,
    admin: &sqlx::PgPool,
    truth: &Truth,
    dedup: &str,
    table: &str,
) {
    let started = Instant::now();
    let mut counts = Counts {
        published: MESSAGES + PUBLISHED_TWICE,
        published_twice: PUBLISHED_TWICE,
        ..Counts::default()
    };
    let mut consumers: Vec<Consumer> = (0..CONSUMERS)
        .map(|_| Consumer::start(B::NAME, name, dedup, truth.spec()))
        .collect();

    let chaos = async {
        let mut tick = 0u32;
        let mut next_kill = 0usize;
        loop {
            tokio::time::sleep(Duration::from_millis(250)).await;
            tick += 1;
            if truth.rows(table).await.len() as i64 >= MESSAGES && b.waiting().await == 0 {
                break;
            }
            assert!(
                started.elapsed() < DEADLINE,
                "the run did not finish: {counts:?}"
            );
            // Kill one consumer with SIGKILL and start another, every tick
            // (bounded, so a slow machine still finishes).
            if tick < 80 {
                let victim = consumers.remove(next_kill % consumers.len());
                tokio::task::spawn_blocking(move || victim.kill())
                    .await
                    .expect("kill");
                counts.kills += 1;
                next_kill += 1;
                let (broker, name, dedup) = (B::NAME, name.to_owned(), dedup.to_owned());
                let spec = truth.spec().map(str::to_owned);
                let fresh = tokio::task::spawn_blocking(move || {
                    Consumer::start(broker, &name, &dedup, spec.as_deref())
                })
                .await
                .expect("restart");
                consumers.push(fresh);
            }
            // Terminate the consumers' Postgres connections.
            if tick % 2 == 1 && tick < 80 {
                let n: i64 = sqlx::query_scalar(
                    "SELECT COUNT(pg_terminate_backend(pid)) FROM pg_stat_activity
                     WHERE application_name = 'idem_chaos' AND pid <> pg_backend_pid()",
                )
                .fetch_one(admin)
                .await
                .expect("terminate");
                counts.connections_terminated += n;
            }
        }
    };
    // The producer publishes while the chaos runs.
    tokio::join!(produce(b, table), chaos);
    counts.end = End::after(b, consumers, admin, truth, table).await;
    println!("{} chaos in {:?}: {counts:?}", B::NAME, started.elapsed());
    counts.end.assert_exactly_once();
    assert!(counts.kills >= 5, "{counts:?}");
    assert!(counts.connections_terminated > 0, "{counts:?}");
}

/// The business and dedup tables of one run.
async fn tables(admin: &sqlx::PgPool) -> (String, String, DropTables) {
    let (table, dedup) = (unique_table("chaos_effects"), unique_table("chaos_dedup"));
    let seen = format!("{table}_seen");
    let guard = DropTables::new(&[&table, &dedup, &seen]);
    sqlx::query(AssertSqlSafe(format!(
        "CREATE TABLE {seen} (kind TEXT NOT NULL)"
    )))
    .execute(admin)
    .await
    .expect("counts table");
    sqlx::query(AssertSqlSafe(format!(
        "CREATE TABLE {table} (message_id BIGINT PRIMARY KEY, applied BIGINT NOT NULL)"
    )))
    .execute(admin)
    .await
    .expect("business table");
    let store = PgStore::from_pool(admin.clone())
        .with_table(&dedup)
        .expect("table");
    store.migrate().await.expect("migrate");
    (table, dedup, guard)
}

/// Lease mode under store outages: the consumers run the whole time, and
/// their Redis (a server of the test's own, with an fsync'd append-only
/// file, as the Redis chapter of the guide advises) is killed with SIGKILL and restarted three
/// times while the messages flow. Each outage is far shorter than the 5 s
/// lease, so a body whose completion meets it keeps retrying until Redis is
/// back: no effect is doubled. Doubled effects are counted and printed.
async fn run_lease<B: ChaosBroker>(
    b: &B,
    name: &str,
    admin: &sqlx::PgPool,
    prefix: &str,
    table: &str,
) {
    let started = Instant::now();
    let mut server = or_skip!(idem_tests::RedisServer::start_persistent());
    let redis = server.url();
    let consumers: Vec<Consumer> = (0..CONSUMERS)
        .map(|_| Consumer::start_with(B::NAME, name, prefix, Some(&redis), None))
        .collect();
    let mut restarts = 0u32;
    let chaos = async {
        let mut tick = 0u32;
        loop {
            tokio::time::sleep(Duration::from_millis(250)).await;
            tick += 1;
            if restarts == 3 && applied(admin, table).await >= MESSAGES && b.waiting().await == 0 {
                break;
            }
            assert!(
                started.elapsed() < DEADLINE,
                "the lease-mode run did not finish"
            );
            if tick % 3 == 1 && restarts < 3 {
                server.kill();
                tokio::time::sleep(Duration::from_millis(300)).await;
                server = tokio::task::spawn_blocking(move || {
                    server.restart();
                    server
                })
                .await
                .expect("restart redis");
                restarts += 1;
            }
        }
    };
    tokio::join!(produce(b, table), chaos);
    let end = End::after(b, consumers, admin, &Truth::Pg(admin.clone()), table).await;
    println!(
        "{} lease-mode chaos in {:?}: published {}, redis restarts {restarts}, {end:?}",
        B::NAME,
        started.elapsed(),
        MESSAGES + PUBLISHED_TWICE,
    );
    end.assert_exactly_once();
}

/// A RabbitMQ work queue of the test's own (and the queues the consumer
/// declares for it, deleted afterwards).
async fn rabbit(prefix: &str) -> Option<(Rabbit, DeleteQueues)> {
    let (conn, channel) = idem_tests::brokers::amqp_channel().await?;
    let queue = unique_table(prefix);
    let consumer = rabbitmq::Consumer::new(amqp_url(), queue.clone());
    let mut queues = vec![queue.clone(), consumer.dead_letter_queue()];
    queues.extend(
        rabbitmq::RETRY_DELAYS
            .iter()
            .map(|d| consumer.retry_queue(*d)),
    );
    let guard = DeleteQueues::new(queues);
    channel
        .confirm_select(Default::default())
        .await
        .expect("confirms");
    let durable = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    channel
        .queue_declare(queue.as_str().into(), durable, FieldTable::default())
        .await
        .expect("declare");
    let b = Rabbit {
        queue,
        conn,
        channel,
        consumer,
    };
    Some((b, guard))
}

/// A JetStream stream of the test's own (and the dead-letter stream,
/// deleted afterwards).
async fn jetstream(prefix: &str) -> Option<(Nats, DeleteStreams)> {
    let js = idem_tests::brokers::jetstream().await?;
    let stream = unique_table(prefix);
    let subject = format!("idem.chaos.{stream}");
    let consumer = nats::Consumer::new(nats_url(), stream.clone(), subject.clone());
    let guard = DeleteStreams::new(vec![stream.clone(), consumer.dead_letter_stream()]);
    idem_tests::brokers::create_stream(
        &js,
        async_nats::jetstream::stream::Config {
            name: stream.clone(),
            subjects: vec![subject],
            ..Default::default()
        },
    )
    .await;
    Some((
        Nats {
            stream,
            js,
            consumer,
        },
        guard,
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_on_rabbitmq_with_consumers_killed_and_connections_dropped() {
    let admin = or_skip!(pg_pool(4).await);
    let (b, _queues) = or_skip!(rabbit("chaos").await);
    let (table, dedup, _tables) = tables(&admin).await;
    run(
        &b,
        &b.queue,
        &admin,
        &Truth::Pg(admin.clone()),
        &dedup,
        &table,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_on_jetstream_with_consumers_killed_and_connections_dropped() {
    let admin = or_skip!(pg_pool(4).await);
    let (b, _streams) = or_skip!(jetstream("chaos").await);
    let (table, dedup, _tables) = tables(&admin).await;
    run(
        &b,
        &b.stream,
        &admin,
        &Truth::Pg(admin.clone()),
        &dedup,
        &table,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_on_rocketmq_with_members_killed_and_connections_dropped() {
    let admin = or_skip!(pg_pool(4).await);
    let b = or_skip!(rocket("chaos").await);
    let (table, dedup, _tables) = tables(&admin).await;
    run(
        &b,
        &b.topic,
        &admin,
        &Truth::Pg(admin.clone()),
        &dedup,
        &table,
    )
    .await;
}

/// The RocketMQ chaos with the transaction-mode handler on MySQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_on_rocketmq_with_mysql_handlers() {
    let admin = or_skip!(pg_pool(4).await);
    let mysql = or_skip!(idem_tests::mysql_pool(4, 5).await);
    let b = or_skip!(rocket("chaos_mysql").await);
    let (table, dedup, _tables) = tables(&admin).await;
    let _mysql_tables = idem_tests::DropMySqlTables::new(&[&table, &dedup]);
    sqlx::query(AssertSqlSafe(format!(
        "CREATE TABLE {table} (message_id BIGINT PRIMARY KEY, applied BIGINT NOT NULL)"
    )))
    .execute(&mysql)
    .await
    .expect("business table");
    MySqlStore::from_pool(mysql.clone())
        .with_table(&dedup)
        .expect("table")
        .migrate()
        .await
        .expect("migrate");
    run(&b, &b.topic, &admin, &Truth::MySql(mysql), &dedup, &table).await;
}

/// The RocketMQ chaos with the transaction-mode handler on SQLite: one
/// file, three consumer processes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_on_rocketmq_with_sqlite_handlers() {
    let admin = or_skip!(pg_pool(4).await);
    let b = or_skip!(rocket("chaos_sqlite").await);
    let (table, dedup, _tables) = tables(&admin).await;
    let dir = tempfile::tempdir().expect("a directory");
    let path = dir.path().join("chaos.db");
    let store = SqliteStore::open(&path)
        .await
        .expect("sqlite")
        .with_table(&dedup)
        .expect("table");
    store.migrate().await.expect("migrate");
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .connect_with(
            sqlx::sqlite::SqliteConnectOptions::new()
                .filename(&path)
                .busy_timeout(Duration::from_secs(10)),
        )
        .await
        .expect("a pool");
    sqlx::query(AssertSqlSafe(format!(
        "CREATE TABLE {table} (message_id INTEGER PRIMARY KEY, applied INTEGER NOT NULL)"
    )))
    .execute(&pool)
    .await
    .expect("business table");
    let spec = format!("sqlite:{}", path.display());
    run(
        &b,
        &b.topic,
        &admin,
        &Truth::Sqlite(pool, spec),
        &dedup,
        &table,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_mode_on_rocketmq_with_redis_restarts_doubles_nothing() {
    let admin = or_skip!(pg_pool(4).await);
    let b = or_skip!(rocket("chaos_lease").await);
    let (table, prefix, _tables) = tables(&admin).await;
    run_lease(&b, &b.topic, &admin, &prefix, &table).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_mode_on_rabbitmq_with_redis_restarts_doubles_nothing() {
    let admin = or_skip!(pg_pool(4).await);
    let (b, _queues) = or_skip!(rabbit("chaos_lease").await);
    let (table, prefix, _tables) = tables(&admin).await;
    run_lease(&b, &b.queue, &admin, &prefix, &table).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_mode_on_jetstream_with_redis_restarts_doubles_nothing() {
    let admin = or_skip!(pg_pool(4).await);
    let (b, _streams) = or_skip!(jetstream("chaos_lease").await);
    let (table, prefix, _tables) = tables(&admin).await;
    run_lease(&b, &b.stream, &admin, &prefix, &table).await;
}
