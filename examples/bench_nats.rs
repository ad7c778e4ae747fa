//! Draining a JetStream subject under faults: idem's `nats::Consumer`
//! against hand-written async-nats glue, around the same idempotent
//! transaction-mode Postgres handler.
//!
//! * `idem`: `nats::Consumer` (8 at once, prefetch 32, ack wait 30 s);
//! * `glue`: a pull stream of async-nats with the same batch (32), the same
//!   concurrency (a semaphore of 8 slots, a message taken only once a slot is
//!   free), `ack` on success and a `Nak` with a fixed 1 s delay on any error.
//!
//! Both consume the same durable, made by the bench with the settings
//! idem's consumer asks for (explicit acks, no delivery limit, the ack wait).
//!
//! ```sh
//! MESSAGES=5000 ROUNDS=3 KILL_EVERY_MS=2000 PG_TERMINATE_MS=1000 FAIL_RATE=0.02 \
//!   cargo run --release -p idem-examples --features nats,postgres --example bench_nats
//! ```
//!
//! Each round makes a fresh stream and durable, starts `CONSUMERS` consumer
//! processes (this binary, re-run as a consumer) and publishes `MESSAGES`
//! messages at `RATE` a second (0: all of them before the consumers start);
//! it ends when every message is in the business table. Faults, each off
//! unless set:
//!
//! * `KILL_EVERY_MS`: SIGKILL one consumer process (the oldest) that often
//!   and start another, at most `KILLS` times (default 10);
//! * `PG_TERMINATE_MS`: terminate the consumers' Postgres connections
//!   (`pg_terminate_backend`) that often;
//! * `FAIL_RATE`: the fraction of handler calls that fail at once with a
//!   store error (`Error::Store`), as a lost connection would.
//!
//! Other settings: `CONCURRENCY` (8), `PREFETCH` (32), `ACK_WAIT_S` (30),
//! `VARIANTS` (`idem,glue`). Every message carries its publication time and
//! the handler writes the time it ran into the business row, so the figures
//! come from the table: the drain (first publication to last handled
//! message), the tail after the last publication, the latency from
//! publication to the handling that took effect (the largest, the 99th
//! percentile, and how many took 2–5 s, 5–10 s, 10–30 s and 30 s or more),
//! and the redeliveries (the durable's deliveries beyond one a message). Rounds are interleaved,
//! the order alternating; the CPU's busy, idle and steal shares
//! (`/proc/stat`, all processes) are printed for each variant's run, for
//! each round, marked `STOLEN` above 5 % steal (see `examples/src/cpu.rs`),
//! and for the run; the ratio of the median drains over the unmarked rounds
//! is printed too, and the last line is the ratio of the median drains,
//! idem/glue.

use std::future::Future;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_nats::jetstream::{self, AckKind, consumer::AckPolicy, consumer::pull};
use futures_util::StreamExt;
use idem_examples::cpu::{Conditions, Cpu, Rounds, Watch, load_average};
use idem_examples::{env, median};
use idem_runtime::consume::{Policy, nats};
use idem_runtime::{Error, Outcome, PgStore, PgTx, StoreError, idempotent};
use serde::{Deserialize, Serialize};
use sqlx::AssertSqlSafe;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What the consumer processes' Postgres connections are named, for
/// `pg_terminate_backend`.
const APPLICATION: &str = "idem_bench_nats";

#[derive(Debug, Serialize, Deserialize)]
struct OrderPlaced {
    order_id: i64,
    /// When the bench published it, in microseconds since the epoch.
    published_us: i64,
    /// The run's business table.
    orders: String,
}

fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}

#[idempotent(key = "order_id", ttl = "1h", store = "postgres")]
async fn record_order(tx: &mut PgTx<'_>, msg: &OrderPlaced) -> Result<u64, sqlx::Error> {
    let done = sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO {} (order_id, published_us, handled_us) VALUES ($1, $2, $3)",
        msg.orders
    )))
    .bind(msg.order_id)
    .bind(msg.published_us)
    .bind(now_us())
    .execute(&mut **tx)
    .await?;
    Ok(done.rows_affected())
}

/// The run's settings, from the environment (the consumer processes inherit
/// it).
#[derive(Debug, Clone)]
struct Settings {
    messages: u64,
    rounds: u64,
    rate: u64,
    consumers: usize,
    kill_every: Option<Duration>,
    kills: u32,
    pg_terminate: Option<Duration>,
    fail_rate: f64,
    concurrency: usize,
    prefetch: usize,
    ack_wait: Duration,
    variants: Vec<String>,
    nats: String,
    pg: String,
}

impl Settings {
    fn from_env() -> Settings {
        let ms = |name: &str| Some(Duration::from_millis(env(name, 0u64))).filter(|d| !d.is_zero());
        Settings {
            messages: env("MESSAGES", 5_000),
            rounds: env("ROUNDS", 3),
            rate: env("RATE", 250),
            consumers: env("CONSUMERS", 2usize).max(1),
            kill_every: ms("KILL_EVERY_MS"),
            kills: env("KILLS", 10),
            pg_terminate: ms("PG_TERMINATE_MS"),
            fail_rate: env("FAIL_RATE", 0.0),
            concurrency: env("CONCURRENCY", 8usize).max(1),
            prefetch: env("PREFETCH", 32usize).max(1),
            ack_wait: Duration::from_secs(env("ACK_WAIT_S", 30u64).max(1)),
            variants: env("VARIANTS", "idem,glue".to_owned())
                .split(',')
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
                .collect(),
            nats: std::env::var("NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into()),
            pg: std::env::var("DATABASE_URL")
                .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into()),
        }
    }
}

/// Injected store faults: each call fails with probability `rate`
/// (splitmix64 over the process id and a counter, so no two processes draw
/// alike).
#[derive(Clone)]
struct Faults {
    rate: f64,
    draws: Arc<AtomicU64>,
}

impl Faults {
    fn strike(&self) -> bool {
        if self.rate <= 0.0 {
            return false;
        }
        let n = self.draws.fetch_add(1, Ordering::Relaxed);
        let mut z = (u64::from(std::process::id()) << 32 ^ n).wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64 <= self.rate
    }
}

type Call = Result<Outcome<u64>, Error<sqlx::Error>>;

/// The consumer process: `variant` on the stream the bench named, until it
/// is killed.
async fn consumer_process(variant: &str) -> Result<(), BoxError> {
    let s = Settings::from_env();
    let var = |name: &str| std::env::var(name).map_err(|_| format!("{name} is not set"));
    let (stream, subject, dedup) = (
        var("BENCH_NATS_STREAM")?,
        var("BENCH_NATS_SUBJECT")?,
        var("BENCH_NATS_DEDUP")?,
    );
    let options = PgConnectOptions::from_str(&s.pg)?.application_name(APPLICATION);
    let pool = PgPoolOptions::new()
        .max_connections(u32::try_from(s.concurrency)?)
        .connect_with(options)
        .await?;
    let store = PgStore::from_pool(pool).with_table(&dedup)?;
    let faults = Faults {
        rate: s.fail_rate,
        draws: Arc::new(AtomicU64::new(0)),
    };
    let call = move |msg: OrderPlaced| {
        let (store, faults) = (store.clone(), faults.clone());
        async move {
            if faults.strike() {
                return Err(Error::Store {
                    handler: "record_order",
                    key: None,
                    source: StoreError::Backend("injected: the connection was reset".into()),
                });
            }
            record_order(&store, &msg).await
        }
    };
    let consumer = nats::Consumer::new(&s.nats, &stream, &subject)
        .policy(Policy {
            concurrency: s.concurrency,
            ..Policy::default()
        })
        .prefetch(s.prefetch)
        .ack_wait(s.ack_wait);
    println!("READY");
    match variant {
        "idem" => {
            consumer
                .run(call, idem_runtime::consume::CancellationToken::new())
                .await?;
            Ok(())
        }
        "glue" => glue(&s, &stream, consumer.durable_name(), call).await,
        other => Err(format!("no variant {other:?} (idem, glue)").into()),
    }
}

/// Hand-written glue: a pull stream, a slot taken before each message, ack
/// on success, a `Nak` with 1 s on any error.
async fn glue<F, Fut>(s: &Settings, stream: &str, durable: &str, call: F) -> Result<(), BoxError>
where
    F: Fn(OrderPlaced) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Call> + Send + 'static,
{
    let js = jetstream::new(async_nats::connect(&s.nats).await?);
    let consumer: jetstream::consumer::PullConsumer =
        js.get_stream(stream).await?.get_consumer(durable).await?;
    let mut messages = consumer
        .stream()
        .max_messages_per_batch(s.prefetch)
        .messages()
        .await?;
    let slots = Arc::new(tokio::sync::Semaphore::new(s.concurrency));
    loop {
        let slot = Arc::clone(&slots).acquire_owned().await?;
        let message = match messages.next().await {
            Some(Ok(m)) => m,
            Some(Err(e)) => {
                eprintln!("glue: {e}");
                continue;
            }
            None => return Err("the message stream ended".into()),
        };
        let call = call.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let Ok(order) = serde_json::from_slice::<OrderPlaced>(&message.payload) else {
                let _ = message.ack_with(AckKind::Term).await;
                return;
            };
            let _ = match call(order).await {
                Ok(_) => message.ack().await,
                Err(_) => {
                    message
                        .ack_with(AckKind::Nak(Some(Duration::from_secs(1))))
                        .await
                }
            };
        });
    }
}

/// A consumer process of this binary.
struct Process {
    child: Child,
}

impl Process {
    fn start(variant: &str, stream: &str, subject: &str, dedup: &str) -> Result<Process, BoxError> {
        let child = Command::new(std::env::current_exe()?)
            .env("BENCH_NATS_CONSUMER", variant)
            .env("BENCH_NATS_STREAM", stream)
            .env("BENCH_NATS_SUBJECT", subject)
            .env("BENCH_NATS_DEDUP", dedup)
            .stdout(Stdio::piped())
            .stderr(if std::env::var_os("VERBOSE").is_some() {
                Stdio::inherit()
            } else {
                Stdio::null()
            })
            .spawn()?;
        // Killed on drop, also when it fails to start.
        let mut process = Process { child };
        let stdout = process.child.stdout.take().ok_or("no stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        loop {
            match lines.next() {
                Some(Ok(line)) if line.contains("READY") => break,
                Some(_) => {}
                None => return Err("a consumer process exited before it was ready".into()),
            }
        }
        // Keep reading, so the child never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        Ok(process)
    }
}

impl Drop for Process {
    /// SIGKILL: what the broker sees of a crash.
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The run's shared pieces.
struct Run {
    s: Settings,
    id: String,
    js: jetstream::Context,
    pool: sqlx::PgPool,
    orders: String,
    dedup: String,
}

/// What one round measured.
#[derive(Debug, Clone, Copy)]
struct Figures {
    drain: f64,
    tail: f64,
    max_latency: f64,
    p99_latency: f64,
    /// Messages handled 2–5 s, 5–10 s, 10–30 s and 30 s or more after
    /// their publication.
    late: [i64; 4],
    redeliveries: u64,
    kills: u32,
    terminated: i64,
    cpu: Conditions,
}

async fn round(run: &Run, variant: &str, r: u64) -> Result<Figures, BoxError> {
    let s = &run.s;
    let stream_name = format!("{}_R{r}_{}", run.id, variant.to_uppercase());
    let subject = format!("bench.{}.r{r}.{variant}", run.id);
    let stream = run
        .js
        .create_stream(jetstream::stream::Config {
            name: stream_name.clone(),
            subjects: vec![subject.clone()],
            ..Default::default()
        })
        .await?;
    // The durable both variants consume, made as idem's consumer makes it.
    let durable = nats::Consumer::new(&s.nats, &stream_name, &subject);
    stream
        .create_consumer(pull::Config {
            durable_name: Some(durable.durable_name().to_owned()),
            ack_policy: AckPolicy::Explicit,
            ack_wait: s.ack_wait,
            max_deliver: -1,
            filter_subject: subject.clone(),
            ..Default::default()
        })
        .await?;
    let result = drain(
        run,
        variant,
        r,
        &stream_name,
        &subject,
        durable.durable_name(),
    )
    .await;
    let _ = run.js.delete_stream(&stream_name).await;
    let _ = run.js.delete_stream(durable.dead_letter_stream()).await;
    result
}

async fn drain(
    run: &Run,
    variant: &str,
    r: u64,
    stream_name: &str,
    subject: &str,
    durable: &str,
) -> Result<Figures, BoxError> {
    let s = &run.s;
    let first_id = i64::try_from(r)? * 1_000_000;
    let messages = i64::try_from(s.messages)?;
    let start = || {
        let (v, st, su, d) = (
            variant.to_owned(),
            stream_name.to_owned(),
            subject.to_owned(),
            run.dedup.clone(),
        );
        tokio::task::spawn_blocking(move || Process::start(&v, &st, &su, &d))
    };
    let publish = async {
        let began = Instant::now();
        for i in 0..messages {
            if s.rate > 0 {
                let due = Duration::from_secs_f64(i as f64 / s.rate as f64);
                tokio::time::sleep_until((began + due).into()).await;
            }
            let payload = serde_json::to_vec(&OrderPlaced {
                order_id: first_id + i,
                published_us: now_us(),
                orders: run.orders.clone(),
            })?;
            run.js
                .publish(subject.to_owned(), payload.into())
                .await?
                .await?;
        }
        Ok::<(), BoxError>(())
    };
    let handled = || async {
        sqlx::query_scalar::<_, i64>(AssertSqlSafe(format!(
            "SELECT count(*) FROM {} WHERE order_id >= $1 AND order_id < $2",
            run.orders
        )))
        .bind(first_id)
        .bind(first_id + messages)
        .fetch_one(&run.pool)
        .await
    };

    if s.rate == 0 {
        publish.await?;
        let backlog = async { Ok(()) };
        return consume(
            run,
            &start,
            &handled,
            backlog,
            first_id,
            stream_name,
            durable,
        )
        .await;
    }
    consume(
        run,
        &start,
        &handled,
        publish,
        first_id,
        stream_name,
        durable,
    )
    .await
}

async fn consume<St, StFut, H, HFut>(
    run: &Run,
    start: &St,
    handled: &H,
    publish: impl Future<Output = Result<(), BoxError>>,
    first_id: i64,
    stream_name: &str,
    durable: &str,
) -> Result<Figures, BoxError>
where
    St: Fn() -> StFut,
    StFut: Future<Output = Result<Result<Process, BoxError>, tokio::task::JoinError>>,
    H: Fn() -> HFut,
    HFut: Future<Output = Result<i64, sqlx::Error>>,
{
    let s = &run.s;
    let messages = i64::try_from(s.messages)?;
    let mut processes = Vec::new();
    for _ in 0..s.consumers {
        processes.push(start().await??);
    }
    let cpu = Cpu::now()?;
    let (mut kills, mut terminated) = (0u32, 0i64);
    let chaos = async {
        let deadline = Instant::now() + Duration::from_secs(600);
        let began = Instant::now();
        let (mut next_kill, mut next_terminate) = (s.kill_every, s.pg_terminate);
        loop {
            tokio::time::sleep(Duration::from_millis(50)).await;
            if handled().await? >= messages {
                return Ok::<(), BoxError>(());
            }
            if Instant::now() > deadline {
                return Err(
                    format!("{} of {messages} handled within 600 s", handled().await?).into(),
                );
            }
            let t = began.elapsed();
            if let (Some(at), Some(every)) = (next_kill, s.kill_every)
                && t >= at
                && kills < s.kills
            {
                let victim = processes.remove(0);
                tokio::task::spawn_blocking(move || drop(victim)).await?;
                kills += 1;
                processes.push(start().await??);
                next_kill = Some(at + every);
            }
            if let (Some(at), Some(every)) = (next_terminate, s.pg_terminate)
                && t >= at
            {
                terminated += sqlx::query_scalar::<_, i64>(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
                     WHERE application_name = $1",
                )
                .bind(APPLICATION)
                .fetch_one(&run.pool)
                .await?;
                next_terminate = Some(at + every);
            }
        }
    };
    let (published, drained) = tokio::join!(publish, chaos);
    published?;
    drained?;
    let cpu = Cpu::now()?.conditions_since(cpu);
    // The durable's deliveries, read before the consumers go.
    let stream = run.js.get_stream(stream_name).await?;
    let mut consumer: jetstream::consumer::PullConsumer = stream.get_consumer(durable).await?;
    let delivered = consumer.info().await?.delivered.consumer_sequence;
    for p in processes {
        tokio::task::spawn_blocking(move || drop(p)).await?;
    }

    #[allow(clippy::type_complexity)]
    let (count, drain, tail, max_latency, p99_latency, l2, l5, l10, l30): (
        i64,
        i64,
        i64,
        i64,
        i64,
        i64,
        i64,
        i64,
        i64,
    ) = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT count(*),
                    max(handled_us) - min(published_us),
                    max(handled_us) - max(published_us),
                    max(handled_us - published_us),
                    (percentile_disc(0.99) WITHIN GROUP (ORDER BY handled_us - published_us))::BIGINT,
                    count(*) FILTER (WHERE handled_us - published_us >= 2000000 AND handled_us - published_us < 5000000),
                    count(*) FILTER (WHERE handled_us - published_us >= 5000000 AND handled_us - published_us < 10000000),
                    count(*) FILTER (WHERE handled_us - published_us >= 10000000 AND handled_us - published_us < 30000000),
                    count(*) FILTER (WHERE handled_us - published_us >= 30000000)
             FROM {} WHERE order_id >= $1 AND order_id < $2",
            run.orders
        )))
        .bind(first_id)
        .bind(first_id + messages)
        .fetch_one(&run.pool)
        .await?;
    if count != messages {
        return Err(format!("{count} of {messages} messages in the business table").into());
    }
    let secs = |us: i64| us as f64 / 1e6;
    Ok(Figures {
        drain: secs(drain),
        tail: secs(tail),
        max_latency: secs(max_latency),
        p99_latency: secs(p99_latency),
        late: [l2, l5, l10, l30],
        redeliveries: delivered.saturating_sub(u64::try_from(messages)?),
        kills,
        terminated,
        cpu,
    })
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    if let Ok(variant) = std::env::var("BENCH_NATS_CONSUMER") {
        return consumer_process(&variant).await;
    }
    let s = Settings::from_env();
    let id = format!("bench_nats_{}", std::process::id());
    let (orders, dedup) = (format!("{id}_orders"), format!("{id}_dedup"));
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .connect(&s.pg)
        .await?;
    sqlx::query(AssertSqlSafe(format!(
        "CREATE TABLE {orders} (order_id BIGINT PRIMARY KEY, published_us BIGINT NOT NULL, handled_us BIGINT NOT NULL)"
    )))
    .execute(&pool)
    .await?;
    let store = PgStore::from_pool(pool.clone()).with_table(&dedup)?;
    store.migrate().await?;
    let js = jetstream::new(async_nats::connect(&s.nats).await?);
    println!(
        "{} messages a round at {} a second, {} consumer processes, {} at once each, prefetch {}, ack wait {:?}; faults: kill every {:?} (at most {}), Postgres connections terminated every {:?}, {}% of calls failing; {} rounds; {} cores, load average {}",
        s.messages,
        s.rate,
        s.consumers,
        s.concurrency,
        s.prefetch,
        s.ack_wait,
        s.kill_every,
        s.kills,
        s.pg_terminate,
        s.fail_rate * 100.0,
        s.rounds,
        std::thread::available_parallelism().map_or(0, usize::from),
        load_average()
    );
    let run = Run {
        s: s.clone(),
        id: id.to_uppercase(),
        js,
        pool: pool.clone(),
        orders: orders.clone(),
        dedup: dedup.clone(),
    };
    let mut figures: Vec<Vec<Figures>> = vec![Vec::new(); s.variants.len()];
    let started = Watch::start()?;
    let mut marks = Rounds::default();
    let result: Result<(), BoxError> = async {
        for r in 0..s.rounds {
            let watch = Watch::start()?;
            let mut order: Vec<usize> = (0..s.variants.len()).collect();
            if r % 2 == 1 {
                order.reverse();
            }
            for v in order {
                let variant = &s.variants[v];
                let id = r * s.variants.len() as u64 + v as u64;
                let f = round(&run, variant, id).await?;
                println!(
                    "round {r} {variant}: drain {:.1} s (tail {:.1} s), latency max {:.1} s, p99 {:.2} s, late {:?} (2–5, 5–10, 10–30, 30+ s); {} redeliveries; {} kills, {} connections terminated ({})",
                    f.drain,
                    f.tail,
                    f.max_latency,
                    f.p99_latency,
                    f.late,
                    f.redeliveries,
                    f.kills,
                    f.terminated,
                    f.cpu
                );
                figures[v].push(f);
            }
            println!("round {r}: {}", marks.push(watch.stop()?));
        }
        Ok(())
    }
    .await;
    let over_run = started.stop()?;
    let _ = sqlx::query(AssertSqlSafe(format!(
        "DROP TABLE IF EXISTS {orders}, {dedup}, {dedup}_outbox"
    )))
    .execute(&pool)
    .await;
    result?;

    println!("{}", marks.summary());
    println!(
        "cpu over the run: {over_run}; load average after {}",
        load_average()
    );
    let medians: Vec<(f64, f64)> = figures
        .iter()
        .map(|f| {
            (
                median(f.iter().map(|f| f.drain).collect()),
                median(f.iter().map(|f| f.max_latency).collect()),
            )
        })
        .collect();
    for (variant, (drain, latency)) in s.variants.iter().zip(&medians) {
        let redeliveries = median(
            figures[s.variants.iter().position(|v| v == variant).unwrap_or(0)]
                .iter()
                .map(|f| f.redeliveries as f64)
                .collect(),
        );
        println!(
            "median {variant}: drain {drain:.1} s, max latency {latency:.1} s, {redeliveries:.0} redeliveries"
        );
    }
    let drains: Vec<_> = figures
        .iter()
        .map(|f| marks.medians(&f.iter().map(|f| f.drain).collect::<Vec<_>>()))
        .collect();
    if let [idem, glue] = &drains[..]
        && let Some(quiet) = idem.ratio(glue).quiet
    {
        println!("idem/glue drain over unmarked rounds {quiet:.3}");
    }
    if let [(idem, _), (glue, _)] = medians[..] {
        println!("idem/glue drain {:.3}", idem / glue);
    }
    Ok(())
}
