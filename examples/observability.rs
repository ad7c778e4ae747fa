//! idem's metrics on a live workload, for Prometheus and Grafana: two
//! idempotent handlers behind RabbitMQ consumers, a producer that publishes
//! at a steady rate with a small share of duplicates, and switches for a
//! duplicate storm and a network blip. The metrics are served at
//! `http://127.0.0.1:9464/metrics`.
//!
//! ```sh
//! cargo run -p idem-examples --features rabbitmq --example observability -- \
//!     --storm-after 2m --storm-for 10m --blip-after 1m
//! # in another shell, from the repository's root:
//! prometheus --config.file=observability/prometheus.yml --storage.tsdb.path=/tmp/idem-prometheus
//! ```
//!
//! `observability/` holds the Prometheus configuration that scrapes this
//! example, idem's alerting rules and their unit tests, and a Grafana
//! dashboard.
//!
//! What runs (RabbitMQ at `AMQP_URL`, default
//! `amqp://guest:guest@127.0.0.1:5672/%2f`; the dedup records in a SQLite
//! file of the run's own):
//!
//! * `ship_order` (lease mode) on the queue `<prefix>_orders`, and
//!   `award_points` (lease mode) on `<prefix>_points`; each body works 10 to
//!   40 ms;
//! * a producer publishing `--rate` messages a second to each queue (default
//!   10); one message in 40 is published again at once (its copy meets the
//!   original's claim: `in_progress`, retried, then a duplicate) and one in
//!   40 again 3 s later (a duplicate);
//! * a caller's timeout: about one `points` message in 50 is first run under a
//!   5 ms timeout, shorter than its body, which is dropped halfway
//!   (`idem_bodies_dropped_total`); the second call is refused while the
//!   key is held one more lease (`in_progress`, retried), and a later
//!   delivery awards the points;
//! * failures: one message in 25 has a body that fails every time (retried,
//!   then dead-lettered as `handler_error` after 3 attempts), one `points`
//!   payload in 50 does not decode (dead-lettered as `decode`), and the
//!   store fails one claim in `--store-faults` (default 40; 0: none) with an
//!   injected fault, as a store under a short outage does (`store`: retried);
//! * `--storm-after DURATION`: a duplicate storm on `orders` from then on
//!   (for `--storm-for DURATION`, or until the end): each message is
//!   published three more times, at once, after 1 s and after 2 s; the
//!   duplicate share of `ship_order` goes from about 5 % to about 60 % and
//!   `award_points` stays where it was. `--storm-file PATH` starts it when
//!   the file appears instead (`touch PATH`), and ends it when it goes;
//! * an outbox: for each order the order service stages a receipt in the
//!   SQLite database (`store.outbox`, committed with `Outbox::commit`), and
//!   a relay publishes the receipts to the queue `<prefix>_receipts`, which
//!   is declared only 3 s into the run: until then RabbitMQ returns each
//!   publish (no queue takes it), the rows wait, the relay backs off and
//!   counts the failures, then catches up (the dashboard's Outbox row);
//! * `--blip-after DURATION`: the consumers' connections go through a TCP
//!   relay that cuts them all once at that time (a network blip): they
//!   reconnect, and the broker delivers what was unacknowledged again.
//!
//! Other options: `--listen ADDR` (or `IDEM_METRICS_ADDR`; default
//! `127.0.0.1:9464`), `--prefix NAME` (the queues' names; default
//! `idem_observability`), `--run-for DURATION` (stop by itself). Durations
//! are `500ms`, `20s`, `2m`, `1h` or seconds. Ctrl-C or SIGTERM stops the
//! consumers (they finish what is in flight), prints their reports and
//! deletes the queues the run used.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use idem_examples::TempDb;
use idem_runtime::consume::{
    CancellationToken, ConsumeError, Policy, RETRY_DELAYS, Report, rabbitmq, shutdown_on,
};
use idem_runtime::outbox::{Message, RabbitMqDestination, Relay};
use idem_runtime::registry::HandlerSpec;
use idem_runtime::store::{Claim, Failure, LeaseStore};
use idem_runtime::{Key, SqliteStore, StoreError, idempotent};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use serde::{Deserialize, Serialize};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Histogram buckets for the dedup latencies (claim, body, handling): 0.5 ms
/// to 10 s.
const LATENCY_BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Buckets for the time from publication to settling, which includes the
/// retries' waits (and RabbitMQ's timestamps are whole seconds): up to 5
/// minutes.
const END_TO_END_BUCKETS: [f64; 12] = [
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0,
];

#[derive(Debug, Serialize, Deserialize)]
struct OrderPlaced {
    order_id: u64,
    /// The carrier refuses this one, every time.
    fail: bool,
}

#[derive(Debug, Serialize, Deserialize)]
struct PointsEarned {
    message_id: String,
    user_id: u64,
    points: i64,
    /// The loyalty service refuses this one, every time.
    fail: bool,
}

/// Effects that took place, to print at the end.
static SHIPPED: AtomicU64 = AtomicU64::new(0);
static AWARDED: AtomicU64 = AtomicU64::new(0);

/// A body's work: 10 to 40 ms, depending on the message.
fn work(n: u64) -> Duration {
    Duration::from_millis(10 + (n * 7) % 31)
}

#[idempotent(key = "order_id", ttl = "1h", store = "sqlite", lease = "2s")]
async fn ship_order(msg: &OrderPlaced) -> Result<u64, std::io::Error> {
    tokio::time::sleep(work(msg.order_id)).await;
    if msg.fail {
        return Err(std::io::Error::other("the carrier refused the label"));
    }
    SHIPPED.fetch_add(1, Ordering::Relaxed);
    Ok(msg.order_id)
}

#[idempotent(key = "message_id", ttl = "1h", store = "sqlite", lease = "2s")]
async fn award_points(msg: &PointsEarned) -> Result<i64, std::io::Error> {
    tokio::time::sleep(work(msg.user_id)).await;
    if msg.fail {
        return Err(std::io::Error::other(
            "the loyalty service refused the grant",
        ));
    }
    AWARDED.fetch_add(1, Ordering::Relaxed);
    Ok(msg.points)
}

/// A lease store that fails one claim in `every` with an injected fault and
/// passes everything else to the SQLite store: what a store under short
/// outages answers.
#[derive(Clone)]
struct FaultyStore {
    inner: SqliteStore,
    every: u64,
    claims: Arc<AtomicU64>,
}

impl LeaseStore for FaultyStore {
    fn store_name(&self) -> &'static str {
        self.inner.store_name()
    }

    async fn claim(
        &self,
        spec: &'static HandlerSpec,
        key: &Key,
        fingerprint: Option<&str>,
    ) -> Result<Claim, StoreError> {
        let n = self.claims.fetch_add(1, Ordering::Relaxed) + 1;
        if self.every > 0 && n.is_multiple_of(self.every) {
            return Err(StoreError::Backend(
                "injected fault: the connection to the store was reset".into(),
            ));
        }
        self.inner.claim(spec, key, fingerprint).await
    }

    async fn complete(
        &self,
        spec: &'static HandlerSpec,
        key: &Key,
        token: &str,
        outcome: &str,
    ) -> Result<bool, StoreError> {
        self.inner.complete(spec, key, token, outcome).await
    }

    async fn fail(
        &self,
        spec: &'static HandlerSpec,
        key: &Key,
        token: &str,
        failure: Failure<'_>,
    ) -> Result<bool, StoreError> {
        self.inner.fail(spec, key, token, failure).await
    }

    async fn release(
        &self,
        spec: &'static HandlerSpec,
        key: &Key,
        token: &str,
    ) -> Result<(), StoreError> {
        self.inner.release(spec, key, token).await
    }

    async fn extend(
        &self,
        spec: &'static HandlerSpec,
        key: &Key,
        token: &str,
    ) -> Result<bool, StoreError> {
        self.inner.extend(spec, key, token).await
    }
}

/// The command line.
#[derive(Debug)]
struct Settings {
    listen: SocketAddr,
    amqp_url: String,
    prefix: String,
    rate: u32,
    store_faults: u64,
    storm_after: Option<Duration>,
    storm_for: Option<Duration>,
    storm_file: Option<PathBuf>,
    blip_after: Option<Duration>,
    run_for: Option<Duration>,
}

const USAGE: &str = "usage: observability [--listen ADDR] [--prefix NAME] [--rate N] \
[--store-faults N] [--storm-after DURATION] [--storm-for DURATION] [--storm-file PATH] \
[--blip-after DURATION] [--run-for DURATION]";

/// `500ms`, `20s`, `2m`, `1h`, or plain seconds.
fn duration(text: &str) -> Result<Duration, String> {
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let n: u64 = number
        .parse()
        .map_err(|_| format!("not a duration: {text:?} (e.g. 500ms, 20s, 2m)"))?;
    match unit {
        "ms" => Ok(Duration::from_millis(n)),
        "" | "s" => Ok(Duration::from_secs(n)),
        "m" => Ok(Duration::from_secs(n * 60)),
        "h" => Ok(Duration::from_secs(n * 3600)),
        _ => Err(format!("not a duration: {text:?} (e.g. 500ms, 20s, 2m)")),
    }
}

impl Settings {
    fn parse(mut args: impl Iterator<Item = String>) -> Result<Settings, String> {
        let listen = std::env::var("IDEM_METRICS_ADDR").unwrap_or_else(|_| "127.0.0.1:9464".into());
        let mut s = Settings {
            listen: listen
                .parse()
                .map_err(|_| format!("IDEM_METRICS_ADDR: not an address: {listen:?}"))?,
            amqp_url: std::env::var("AMQP_URL")
                .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into()),
            prefix: "idem_observability".into(),
            rate: 10,
            store_faults: 40,
            storm_after: None,
            storm_for: None,
            storm_file: None,
            blip_after: None,
            run_for: None,
        };
        while let Some(flag) = args.next() {
            if flag == "--help" || flag == "-h" {
                return Err(USAGE.to_owned());
            }
            let value = args
                .next()
                .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?;
            match flag.as_str() {
                "--listen" => {
                    s.listen = value
                        .parse()
                        .map_err(|_| format!("--listen: not an address: {value:?}"))?
                }
                "--prefix" => s.prefix = value,
                "--rate" => {
                    s.rate = value
                        .parse()
                        .ok()
                        .filter(|r| (1..=1000).contains(r))
                        .ok_or_else(|| format!("--rate: 1 to 1000 a second, not {value:?}"))?
                }
                "--store-faults" => {
                    s.store_faults = value
                        .parse()
                        .map_err(|_| format!("--store-faults: a number, not {value:?}"))?
                }
                "--storm-after" => s.storm_after = Some(duration(&value)?),
                "--storm-for" => s.storm_for = Some(duration(&value)?),
                "--storm-file" => s.storm_file = Some(PathBuf::from(value)),
                "--blip-after" => s.blip_after = Some(duration(&value)?),
                "--run-for" => s.run_for = Some(duration(&value)?),
                other => return Err(format!("unknown option {other:?}\n{USAGE}")),
            }
        }
        Ok(s)
    }
}

/// Whether the duplicate storm is on, `since` the start of the run.
fn storming(s: &Settings, since: Duration) -> bool {
    if let Some(file) = &s.storm_file {
        return file.exists();
    }
    match s.storm_after {
        Some(after) => since >= after && s.storm_for.is_none_or(|lasts| since < after + lasts),
        None => false,
    }
}

/// A TCP relay on loopback to `upstream` (`host:port`); every connection
/// through it is cut when the returned sender is told to.
async fn relay(upstream: String) -> std::io::Result<(SocketAddr, tokio::sync::watch::Sender<u64>)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (cut, _) = tokio::sync::watch::channel(0u64);
    let cuts = cut.clone();
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            let (upstream, mut cut) = (upstream.clone(), cuts.subscribe());
            tokio::spawn(async move {
                let Ok(mut outbound) = tokio::net::TcpStream::connect(&upstream).await else {
                    return;
                };
                tokio::select! {
                    _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                    _ = cut.changed() => {}
                }
            });
        }
    });
    Ok((addr, cut))
}

/// `url` cut around its host and port: what comes before, the host and port
/// (with 5672 when it names none), and what comes after.
fn authority(url: &str) -> Result<(&str, String, &str), String> {
    let scheme_end = url
        .find("://")
        .map(|i| i + 3)
        .ok_or_else(|| format!("not an AMQP URL: {url:?}"))?;
    let rest = &url[scheme_end..];
    let authority_end = scheme_end + rest.find('/').unwrap_or(rest.len());
    let host_start = url[..authority_end]
        .rfind('@')
        .map_or(scheme_end, |i| i + 1);
    let host = &url[host_start..authority_end];
    let host = if host.contains(':') {
        host.to_owned()
    } else {
        format!("{host}:5672")
    };
    Ok((&url[..host_start], host, &url[authority_end..]))
}

/// Publishes with publisher confirms, stamping each message with an id and
/// the time (the consumers' end-to-end latency reads it).
#[derive(Clone)]
struct Producer {
    channel: lapin::Channel,
    published: Arc<AtomicU64>,
    /// Copies still to publish are dropped once it is cancelled.
    shutdown: CancellationToken,
}

impl Producer {
    async fn publish(&self, queue: &str, id: &str, payload: &[u8]) -> Result<(), BoxError> {
        let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
        let properties = lapin::BasicProperties::default()
            .with_delivery_mode(2)
            .with_content_type("application/json".into())
            .with_message_id(id.into())
            .with_timestamp(now);
        self.channel
            .basic_publish(
                "".into(),
                queue.into(),
                Default::default(),
                payload,
                properties,
            )
            .await?
            .await?;
        self.published.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Publishes a copy of the message after `delay`, on a task of its own,
    /// unless the run stops first.
    fn again(&self, delay: Duration, queue: String, id: String, payload: Vec<u8>) {
        let this = self.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = this.shutdown.cancelled() => return,
                () = tokio::time::sleep(delay) => {}
            }
            if let Err(e) = this.publish(&queue, &id, &payload).await
                && !this.shutdown.is_cancelled()
            {
                eprintln!("publishing a copy of {id} failed: {e}");
            }
        });
    }
}

/// The producer's loop: `rate` messages a second to each queue until
/// `shutdown`, with the duplicates, failures and storm described at the
/// top of this file.
async fn produce(
    producer: Producer,
    settings: Arc<Settings>,
    orders: String,
    points: String,
    shutdown: CancellationToken,
) -> Result<(), BoxError> {
    let began = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_secs(1) / settings.rate);
    let mut was_storming = false;
    for n in 0u64.. {
        tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            _ = tick.tick() => {}
        }
        let storm = storming(&settings, began.elapsed());
        if storm != was_storming {
            was_storming = storm;
            println!(
                "{:>5.1} s: the duplicate storm on {orders} {}",
                began.elapsed().as_secs_f64(),
                if storm { "starts" } else { "ends" }
            );
        }
        let fail = n % 25 == 12;
        // an order
        let id = format!("order-{n}");
        let payload = serde_json::to_vec(&OrderPlaced { order_id: n, fail })?;
        producer.publish(&orders, &id, &payload).await?;
        if storm {
            for delay in [
                Duration::ZERO,
                Duration::from_secs(1),
                Duration::from_secs(2),
            ] {
                producer.again(delay, orders.clone(), id.clone(), payload.clone());
            }
        } else {
            match n % 40 {
                5 => producer.publish(&orders, &id, &payload).await?,
                25 => producer.again(Duration::from_secs(3), orders.clone(), id, payload),
                _ => {}
            }
        }
        // a purchase's points, or a payload that does not decode
        let id = format!("purchase-{n}");
        let payload = if n % 50 == 30 {
            br#"{"message_id": 30, "points": "ten"}"#.to_vec()
        } else {
            serde_json::to_vec(&PointsEarned {
                message_id: id.clone(),
                user_id: n % 97,
                points: 10,
                fail,
            })?
        };
        producer.publish(&points, &id, &payload).await?;
        match n % 40 {
            15 => producer.publish(&points, &id, &payload).await?,
            35 => producer.again(Duration::from_secs(3), points.clone(), id, payload),
            _ => {}
        }
    }
    Ok(())
}

/// The order service's receipts, through the outbox: one staged (and
/// committed) per tick, a relay publishing them to `queue`, which is
/// declared 3 s into the run. Returns how many were staged.
async fn receipts_through_the_outbox(
    store: SqliteStore,
    settings: Arc<Settings>,
    channel: lapin::Channel,
    queue: String,
    shutdown: CancellationToken,
) -> Result<u64, BoxError> {
    let to = RabbitMqDestination::connect(&settings.amqp_url).await?;
    let relay = Relay::new(store.outbox_table(), to).with_poll(Duration::from_millis(200));
    let relay = tokio::spawn(relay.run(shutdown.clone().cancelled_owned()));
    let declare = {
        let (queue, shutdown) = (queue.clone(), shutdown.clone());
        tokio::spawn(async move {
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(Duration::from_secs(3)) => {}
            }
            let durable = lapin::options::QueueDeclareOptions {
                durable: true,
                ..Default::default()
            };
            if let Err(e) = channel
                .queue_declare(queue.as_str().into(), durable, Default::default())
                .await
            {
                eprintln!("cannot declare {queue}: {e}");
            }
        })
    };
    let mut tick = tokio::time::interval(Duration::from_secs(1) / settings.rate);
    let mut staged = 0u64;
    for n in 0u64.. {
        tokio::select! {
            () = shutdown.cancelled() => break,
            _ = tick.tick() => {}
        }
        let order = format!("order-{n}");
        let mut tx = store.pool().begin().await?;
        let mut outbox = store.outbox("order_service", &order);
        let receipt = serde_json::json!({ "order_id": n });
        outbox
            .stage(
                &mut tx,
                Message::json(&queue, &receipt)?.key(order.as_str()),
            )
            .await?;
        outbox.commit(tx).await?;
        staged += 1;
    }
    let _ = (relay.await, declare.await);
    Ok(staged)
}

/// The queues a consumer of `queue` uses: the queue, its retry queues and
/// its dead letters.
fn queues_of(consumer: &rabbitmq::Consumer, queue: &str) -> Vec<String> {
    let mut all = vec![queue.to_owned(), consumer.dead_letter_queue()];
    all.extend(RETRY_DELAYS.iter().map(|d| consumer.retry_queue(*d)));
    all
}

fn print_report(
    queue: &str,
    report: &Result<Result<Report, ConsumeError>, tokio::task::JoinError>,
) {
    match report {
        Ok(Ok(r)) => println!(
            "{queue}: acked {} ({} duplicates, {} with an alert), retried {}, dead-lettered {}, reconnected {}",
            r.acked, r.duplicates, r.alerts, r.retried, r.dead_lettered, r.reconnects
        ),
        Ok(Err(e)) => println!("{queue}: the consumer stopped: {e}"),
        Err(e) => println!("{queue}: the consumer task failed: {e}"),
    }
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let settings = Arc::new(Settings::parse(std::env::args().skip(1))?);

    PrometheusBuilder::new()
        .with_http_listener(settings.listen)
        .set_buckets(&LATENCY_BUCKETS)?
        .set_buckets_for_metric(
            Matcher::Full(idem_runtime::metric::CONSUMER_END_TO_END_SECONDS.into()),
            &END_TO_END_BUCKETS,
        )?
        .install()?;
    println!("metrics at http://{}/metrics", settings.listen);

    let db = TempDb::new("observability");
    let sqlite = SqliteStore::open(db.path()).await?;
    sqlite.migrate().await?;
    let store = FaultyStore {
        inner: sqlite.clone(),
        every: settings.store_faults,
        claims: Arc::new(AtomicU64::new(0)),
    };

    let orders = format!("{}_orders", settings.prefix);
    let points = format!("{}_points", settings.prefix);
    let conn = lapin::Connection::connect(&settings.amqp_url, Default::default()).await?;
    let channel = conn.create_channel().await?;
    channel.confirm_select(Default::default()).await?;
    let durable = lapin::options::QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    for queue in [&orders, &points] {
        channel
            .queue_declare(queue.as_str().into(), durable, Default::default())
            .await?;
    }

    let stop = {
        let run_for = settings.run_for;
        shutdown_on(async move {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                    .expect("a SIGTERM handler");
            let out_of_time = async {
                match run_for {
                    Some(d) => tokio::time::sleep(d).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
                () = out_of_time => {}
            }
        })
    };

    // The consumers' broker: RabbitMQ itself, or a relay to it that cuts
    // their connections once.
    let consumer_url = match settings.blip_after {
        None => settings.amqp_url.clone(),
        Some(after) => {
            let (before, upstream, after_host) = authority(&settings.amqp_url)?;
            let (addr, cut) = relay(upstream).await?;
            let url = format!("{before}{addr}{after_host}");
            tokio::spawn(async move {
                tokio::time::sleep(after).await;
                println!(
                    "{:>5.1} s: the network blips: the consumers' connections are cut",
                    after.as_secs_f64()
                );
                cut.send_modify(|n| *n += 1);
            });
            url
        }
    };
    let policy = Policy {
        max_failures: 3,
        first_delay: Duration::from_millis(200),
        ..Policy::default()
    };
    let order_consumer =
        rabbitmq::Consumer::new(consumer_url.as_str(), orders.as_str()).policy(policy.clone());
    let points_consumer =
        rabbitmq::Consumer::new(consumer_url.as_str(), points.as_str()).policy(policy);
    let mut made = queues_of(&order_consumer, &orders);
    made.extend(queues_of(&points_consumer, &points));
    let receipts = format!("{}_receipts", settings.prefix);
    made.push(receipts.clone());
    let outbox = tokio::spawn(receipts_through_the_outbox(
        sqlite.clone(),
        Arc::clone(&settings),
        channel.clone(),
        receipts,
        stop.clone(),
    ));
    let ship = {
        let store = store.clone();
        tokio::spawn(order_consumer.run(
            move |msg: OrderPlaced| {
                let store = store.clone();
                async move { ship_order(&store, &msg).await }
            },
            stop.clone(),
        ))
    };
    let award = {
        let store = store.clone();
        let cut = Arc::new(std::sync::Mutex::new(std::collections::HashSet::new()));
        tokio::spawn(points_consumer.run(
            move |msg: PointsEarned| {
                let (store, cut) = (store.clone(), Arc::clone(&cut));
                async move {
                    // About one message in 50, the first time: a caller that
                    // gives up before the body ends (what the guide's
                    // cancellation section warns against) drops it
                    // halfway (`idem_bodies_dropped_total`); the key is
                    // held one more lease, and a later delivery awards the
                    // points once.
                    let first = msg.user_id % 60 == 7
                        && cut
                            .lock()
                            .is_ok_and(|mut cut| cut.insert(msg.message_id.clone()));
                    if first {
                        let call = award_points(&store, &msg);
                        if let Ok(done) = tokio::time::timeout(Duration::from_millis(5), call).await
                        {
                            return done;
                        }
                    }
                    award_points(&store, &msg).await
                }
            },
            stop.clone(),
        ))
    };

    let producer = Producer {
        channel: channel.clone(),
        published: Arc::new(AtomicU64::new(0)),
        shutdown: stop.clone(),
    };
    println!(
        "publishing {} messages a second to {orders} and to {points}",
        settings.rate
    );
    let produced = produce(
        producer.clone(),
        Arc::clone(&settings),
        orders.clone(),
        points.clone(),
        stop.clone(),
    )
    .await;
    if let Err(e) = &produced {
        eprintln!("the producer failed: {e}");
        stop.cancel();
    }
    let (ship, award) = (ship.await, award.await);
    match outbox.await {
        Ok(Ok(sent)) => println!("{sent} receipts staged through the outbox"),
        Ok(Err(e)) => eprintln!("the receipts' outbox failed: {e}"),
        Err(e) => eprintln!("the receipts' outbox failed: {e}"),
    }
    println!(
        "published {} messages; {} orders shipped, {} grants of points",
        producer.published.load(Ordering::Relaxed),
        SHIPPED.load(Ordering::Relaxed),
        AWARDED.load(Ordering::Relaxed)
    );
    print_report(&orders, &ship);
    print_report(&points, &award);
    for queue in &made {
        let _ = channel
            .queue_delete(queue.as_str().into(), Default::default())
            .await;
    }
    let _ = conn.close(200, "done".into()).await;
    produced
}
