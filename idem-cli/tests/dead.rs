//! `idem dead` on the real brokers: a consumer dead-letters two messages
//! (a body that fails, a payload that does not decode), and the binary
//! lists them (text and JSON), shows one, refuses a replay or purge that
//! names nothing, replays one by id (the copy reaches the consumer with
//! `x-idem-replays`), and purges (Kafka: all only). A second scenario
//! groups dead letters by cause (`dead groups`), replays a group (each
//! message once, a producer's second copy removed), leaves a dead letter
//! older than its handler's ttl unless `--expired`, and replays edited
//! payloads (checked by the consumer as any delivery). RocketMQ's run on the
//! broker the tests start. Each test on a queue,
//! stream or topic of its own, deleted afterwards; a broker that is not
//! there is a skip, or a failure under `IDEM_REQUIRE_SERVICES=1`.

mod common;

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::idem;
use idem_runtime::consume::{CancellationToken, ConsumeError, Delivery, Policy, Report};
use idem_runtime::{Error, Key, MemoryStore, Outcome, idempotent};
use idem_tests::brokers::{
    DeleteQueues, DeleteStreams, DeleteTopics, TANSU_ONE_RECORD_A_BATCH, amqp_channel, amqp_url,
    kafka, kafka_brokers, nats_url, rocketmq, rocketmq_delay_levels,
};
use idem_tests::{or_skip, unique_table};

#[derive(Debug, serde::Deserialize)]
struct Order {
    id: String,
}

/// What the consumers' handler is handed: the order, and the delivery's
/// replay header.
type Seen = Arc<Mutex<Vec<(String, Option<String>)>>>;

type Call = std::pin::Pin<Box<dyn Future<Output = Result<Outcome<()>, Error<String>>> + Send>>;

/// A handler whose body fails until `fixed`, noting what it is handed.
fn handler(
    fixed: bool,
    replays: &'static str,
    seen: &Seen,
) -> impl Fn(Order, Delivery) -> Call + Send + Sync + 'static {
    let seen = Arc::clone(seen);
    move |order: Order, delivery: Delivery| {
        seen.lock().unwrap().push((
            order.id.clone(),
            delivery.header(replays).map(str::to_owned),
        ));
        Box::pin(async move {
            if fixed {
                return Ok(Outcome::Executed(()));
            }
            let key = Key::from_parts(&[&order.id]).expect("a key");
            Err(Error::Handler {
                handler: "cli_dead_reserve",
                key,
                error: format!("out of stock for {}", order.id),
            })
        })
    }
}

/// One attempt: the first failure is dead-lettered.
fn policy() -> Policy {
    Policy {
        max_failures: 1,
        ..Policy::default()
    }
}

type Task = tokio::task::JoinHandle<Result<Report, ConsumeError>>;

async fn stop(token: CancellationToken, task: Task) -> Report {
    token.cancel();
    tokio::time::timeout(Duration::from_secs(30), task)
        .await
        .expect("the consumer stopped")
        .expect("the consumer task")
        .expect("the consumer's report")
}

/// Runs `idem` on a thread of its own (the test's runtime goes on).
async fn idem_async(args: Vec<String>) -> common::Run {
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        idem(&args)
    })
    .await
    .expect("the idem binary ran")
}

fn args(at: &[String], rest: &[&str]) -> Vec<String> {
    let mut all: Vec<String> = rest.iter().map(|s| (*s).to_owned()).collect();
    all.extend(at.iter().cloned());
    all
}

/// Waits until `idem dead list` shows `n` dead letters; the listing.
async fn listed(at: &[String], n: usize) -> serde_json::Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let run = idem_async(args(at, &["--json", "dead", "list"])).await;
        if run.code == 0 {
            let listing: serde_json::Value = serde_json::from_str(&run.stdout).expect("JSON");
            if listing["count"] == n {
                return listing;
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{n} dead letters were not listed: {run:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The scenario, on a broker given by `at` (its `idem dead` arguments),
/// with `start` running its consumer around a handler.
async fn scenario<S>(
    at: Vec<String>,
    described: &str,
    purges_one: bool,
    replays: &'static str,
    start: S,
) where
    S: Fn(Box<dyn Fn(Order, Delivery) -> Call + Send + Sync>) -> (CancellationToken, Task),
{
    let seen: Seen = Arc::default();
    let (token, task) = start(Box::new(handler(false, replays, &seen)));
    let listing = listed(&at, 2).await;
    let report = stop(token, task).await;
    assert_eq!(report.dead_lettered, 2, "{report:?}");

    // JSON: stable fields.
    assert_eq!(listing["total"], 2, "{listing}");
    let items = listing["items"].as_array().expect("items");
    let failed = items
        .iter()
        .find(|d| {
            d["reason"]
                .as_str()
                .unwrap()
                .contains("out of stock for o-1")
        })
        .unwrap_or_else(|| panic!("{listing}"));
    let undecodable = items
        .iter()
        .find(|d| d["reason"].as_str().unwrap().contains("does not decode"))
        .unwrap_or_else(|| panic!("{listing}"));
    assert_eq!(failed["replays"], 0);
    assert!(failed["age_ms"].as_u64().is_some(), "{failed}");
    assert!(
        failed["dead_at"].as_str().unwrap().ends_with('Z'),
        "{failed}"
    );
    assert_eq!(failed["size"], br#"{"id":"o-1"}"#.len());
    let failed_id = failed["id"].as_str().unwrap().to_owned();
    let undecodable_id = undecodable["id"].as_str().unwrap().to_owned();

    // Text: a table as `list` writes records.
    let text = idem_async(args(&at, &["dead", "list"])).await.ok().stdout;
    let mut lines = text.lines();
    assert_eq!(
        lines.next(),
        Some(format!("2 of 2 dead letters in {described}, oldest first:").as_str()),
        "{text}"
    );
    let header = lines.next().unwrap();
    for column in [
        "ID",
        "DEAD-LETTERED",
        "ATTEMPTS",
        "REPLAYS",
        "FROM",
        "SIZE",
        "MESSAGE ID",
        "REASON",
    ] {
        assert!(header.contains(column), "{header}");
    }
    assert!(text.contains(&failed_id), "{text}");
    // Ages as `list` writes them: `now` under a second, then `3m 12s ago`.
    assert!(
        text.contains("  now  ") || text.contains(" ago  "),
        "a human age: {text}"
    );
    let filtered = idem_async(args(&at, &["dead", "list", "--reason", "does not decode"]))
        .await
        .ok()
        .stdout;
    assert!(filtered.starts_with("1 of 2 dead letters"), "{filtered}");
    let row = filtered.lines().nth(2).unwrap_or_default();
    assert!(row.starts_with(&format!("{undecodable_id} ")), "{filtered}");
    let filtered = idem_async(args(
        &at,
        &["--json", "dead", "list", "--reason", "does not decode"],
    ))
    .await
    .json();
    assert_eq!(
        filtered["items"].as_array().map(Vec::len),
        Some(1),
        "{filtered}"
    );
    assert_eq!(filtered["items"][0]["id"], undecodable_id.as_str());
    let none = idem_async(args(&at, &["dead", "list", "--older-than", "1h"]))
        .await
        .ok()
        .stdout;
    assert_eq!(
        none,
        format!("no dead letters matching in {described} (2 in all)\n")
    );

    // One shown: fields, headers and payload.
    let shown = idem_async(args(&at, &["dead", "show", &failed_id]))
        .await
        .ok()
        .stdout;
    assert!(
        shown.starts_with(&format!("id             {failed_id}\n")),
        "{shown}"
    );
    assert!(
        shown.contains("reason         the body failed 1 times"),
        "{shown}"
    );
    assert!(shown.contains("headers:\n"), "{shown}");
    assert!(shown.ends_with("payload:\n{\"id\":\"o-1\"}\n"), "{shown}");
    let shown = idem_async(args(&at, &["--json", "dead", "show", &failed_id]))
        .await
        .json();
    assert_eq!(shown["payload"], serde_json::json!({"id": "o-1"}));
    assert!(
        shown["headers"].as_array().is_some_and(|h| !h.is_empty()),
        "{shown}"
    );

    // A replay or purge that names nothing is refused before connecting.
    for verb in ["replay", "purge"] {
        let line = idem_async(args(&at, &["dead", verb])).await.fails(2);
        assert!(
            line.contains(
                "pass --id ID, --reason TEXT, --older-than AGE or --in-group GROUP, or --all"
            ),
            "{line}"
        );
    }

    // A replay by id: the copy reaches the consumer, counted.
    let done = idem_async(args(&at, &["--json", "dead", "replay", "--id", &failed_id]))
        .await
        .json();
    assert_eq!(done["count"], 1, "{done}");
    assert_eq!(done["replayed"][0]["id"], failed_id.as_str());
    assert_eq!(done["replayed"][0]["replays"], 1);
    seen.lock().unwrap().clear();
    let (token, task) = start(Box::new(handler(true, replays, &seen)));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while seen.lock().unwrap().is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the copy was not delivered"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let report = stop(token, task).await;
    assert_eq!(report.acked, 1, "{report:?}");
    assert_eq!(
        *seen.lock().unwrap(),
        [("o-1".to_owned(), Some("1".to_owned()))]
    );
    let listing = listed(&at, 1).await;
    assert_eq!(listing["items"][0]["id"], undecodable_id.as_str());

    // Purges.
    if purges_one {
        let done = idem_async(args(&at, &["dead", "purge", "--reason", "does not decode"]))
            .await
            .ok()
            .stdout;
        assert_eq!(
            done,
            format!("purged 1 dead letter of {described}\n  {undecodable_id}\n")
        );
    } else {
        let line = idem_async(args(&at, &["dead", "purge", "--id", &undecodable_id]))
            .await
            .fails(4);
        assert!(line.contains("cannot delete one record"), "{line}");
        // Where the broker deletes records; tansu 0.6 does not, and the
        // refusal leaves the dead letter listed.
        let run = idem_async(args(&at, &["--json", "dead", "purge", "--all"])).await;
        if run.code == 4 {
            let line = run.fails(4);
            assert!(line.contains("delete records"), "{line}");
            let listing = listed(&at, 1).await;
            assert_eq!(listing["items"][0]["id"], undecodable_id.as_str());
            return;
        }
        let done = run.json();
        assert_eq!(done["purged"], 1, "{done}");
    }
    listed(&at, 0).await;
    let line = idem_async(args(&at, &["dead", "show", &undecodable_id]))
        .await
        .fails(3);
    assert!(line.contains("no dead letter"), "{line}");
}

/// A work queue, stream or topic of the test's own with `payloads`
/// published, its consumer, and the `idem dead` arguments and description
/// of its dead letters; deleted when dropped.
struct On<C> {
    at: Vec<String>,
    described: String,
    consumer: C,
    _cleanup: Box<dyn std::any::Any + Send>,
}

/// The `start` of a scenario: runs `consumer` around a handler.
macro_rules! starts {
    ($consumer:expr) => {
        |handler| {
            let token = CancellationToken::new();
            let task = tokio::spawn($consumer.clone().run(handler, token.clone()));
            (token, task)
        }
    };
}

async fn on_rabbitmq(
    name: &str,
    payloads: &[&[u8]],
) -> Option<On<idem_runtime::consume::rabbitmq::Consumer>> {
    use idem_runtime::consume::rabbitmq::{Consumer, RETRY_DELAYS};
    let (conn, channel) = amqp_channel().await?;
    let queue = unique_table(name);
    let consumer = Consumer::new(amqp_url(), queue.clone()).policy(policy());
    let mut queues = vec![queue.clone(), consumer.dead_letter_queue()];
    queues.extend(RETRY_DELAYS.iter().map(|d| consumer.retry_queue(*d)));
    let cleanup = DeleteQueues::new(queues);
    channel
        .queue_declare(
            queue.as_str().into(),
            Default::default(),
            Default::default(),
        )
        .await
        .expect("the work queue");
    for payload in payloads {
        channel
            .basic_publish(
                "".into(),
                queue.as_str().into(),
                Default::default(),
                payload,
                Default::default(),
            )
            .await
            .expect("publish");
    }
    Some(On {
        at: vec![
            "--rabbitmq".to_owned(),
            amqp_url(),
            "--queue".to_owned(),
            queue.clone(),
        ],
        described: format!("queue `{queue}.idem.dead` (RabbitMQ)"),
        consumer,
        _cleanup: Box::new((cleanup, conn)),
    })
}

/// `by_name`: the dead letters named with `--dead-letters`, not derived
/// from `--stream`.
async fn on_nats(
    name: &str,
    payloads: &[&[u8]],
    by_name: bool,
) -> Option<On<idem_runtime::consume::nats::Consumer>> {
    use idem_runtime::consume::nats::Consumer;
    let js = idem_tests::brokers::jetstream().await?;
    let stream = unique_table(name);
    let subject = format!("idem.cli.{stream}");
    let consumer = Consumer::new(nats_url(), stream.clone(), subject.clone()).policy(policy());
    let cleanup = DeleteStreams::new(vec![stream.clone(), consumer.dead_letter_stream()]);
    js.get_or_create_stream(async_nats::jetstream::stream::Config {
        name: stream.clone(),
        subjects: vec![subject.clone()],
        ..Default::default()
    })
    .await
    .expect("the stream");
    for payload in payloads {
        js.publish(subject.clone(), payload.to_vec().into())
            .await
            .expect("publish")
            .await
            .expect("acknowledged");
    }
    let at = if by_name {
        vec![
            "--nats".to_owned(),
            nats_url(),
            "--dead-letters".to_owned(),
            consumer.dead_letter_stream(),
        ]
    } else {
        vec![
            "--nats".to_owned(),
            nats_url(),
            "--stream".to_owned(),
            stream.clone(),
        ]
    };
    Some(On {
        at,
        described: format!("stream `{stream}_DEAD` (NATS)"),
        consumer,
        _cleanup: Box::new(cleanup),
    })
}

async fn on_kafka(
    name: &str,
    payloads: &[&[u8]],
) -> Option<On<idem_runtime::consume::kafka::Consumer>> {
    use idem_runtime::consume::kafka::Consumer;
    use idem_runtime::consume::kafka::dead::DeadLetters;
    let kafka = kafka().await?;
    let topic = unique_table(name);
    let consumer = Consumer::new(kafka_brokers(), format!("{topic}-group"), topic.clone())
        .set(TANSU_ONE_RECORD_A_BATCH.0, TANSU_ONE_RECORD_A_BATCH.1)
        .policy(policy());
    let mut topics = vec![
        topic.clone(),
        consumer.dead_letter_topic(),
        DeadLetters::ledger_name(&consumer.dead_letter_topic()),
    ];
    topics.extend(consumer.retry_topics());
    let cleanup = DeleteTopics::new(topics);
    kafka.create_topic(&topic, 1).await;
    let producer = kafka.producer();
    for payload in payloads {
        producer
            .send(
                rdkafka::producer::FutureRecord::<(), _>::to(&topic).payload(*payload),
                Duration::from_secs(10),
            )
            .await
            .expect("publish");
    }
    Some(On {
        at: vec![
            "--kafka".to_owned(),
            kafka_brokers(),
            "--topic".to_owned(),
            topic.clone(),
        ],
        described: format!("topic `{topic}-dlt` (Kafka)"),
        consumer,
        _cleanup: Box::new(cleanup),
    })
}

async fn on_rocketmq(
    name: &str,
    payloads: &[&[u8]],
) -> Option<On<idem_runtime::consume::rocketmq::Consumer>> {
    use idem_runtime::consume::rocketmq::Consumer;
    let mq = rocketmq().await?;
    let topic = unique_table(name);
    let consumer = Consumer::new(mq.name_server(), topic.clone())
        .delay_levels(rocketmq_delay_levels())
        .policy(policy());
    mq.create_topic(&topic, 1).await;
    for payload in payloads {
        mq.publish(&topic, payload, None).await;
    }
    Some(On {
        at: vec![
            "--rocketmq".to_owned(),
            mq.name_server().to_owned(),
            "--group".to_owned(),
            consumer.group_name().to_owned(),
        ],
        described: format!("topic `%DLQ%{}` (RocketMQ)", consumer.group_name()),
        consumer,
        _cleanup: Box::new(mq),
    })
}

/// The first scenario's deliveries: a body that fails, a payload that does
/// not decode.
const PAYLOADS: [&[u8]; 2] = [br#"{"id":"o-1"}"#, br#"{"id": 7}"#];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_dead_letters_through_the_cli() {
    let on = or_skip!(on_rabbitmq("cli_dead_rmq", &PAYLOADS).await);
    let start = starts!(on.consumer);
    scenario(on.at.clone(), &on.described, true, "x-idem-replays", start).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_dead_letters_through_the_cli() {
    let on = or_skip!(on_nats("cli_dead_nats", &PAYLOADS, true).await);
    let start = starts!(on.consumer);
    scenario(on.at.clone(), &on.described, true, "Idem-Replays", start).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_dead_letters_through_the_cli() {
    let on = or_skip!(on_kafka("cli_dead_kafka", &PAYLOADS).await);
    let start = starts!(on.consumer);
    scenario(on.at.clone(), &on.described, false, "x-idem-replays", start).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rocketmq_dead_letters_through_the_cli() {
    let on = or_skip!(on_rocketmq("cli_dead_rocketmq", &PAYLOADS).await);
    let start = starts!(on.consumer);
    scenario(on.at.clone(), &on.described, true, "x-idem-replays", start).await;
}

// ---------------------------------------------------------------------------
// What is said before any broker answers.

#[test]
fn a_broker_and_a_name_are_needed() {
    let run = idem(&["dead", "list"]);
    assert_eq!(run.code, 2, "{run:?}");
    assert!(
        run.stderr
            .contains("--rabbitmq <URL>|--nats <URL>|--kafka <BROKERS>|--rocketmq <NAMESRV>"),
        "{}",
        run.stderr
    );
    let line = idem(&["dead", "list", "--rabbitmq", "amqp://127.0.0.1:1/%2f"]).fails(2);
    assert!(
        line.contains("pass --queue QUEUE") && line.contains("--dead-letters NAME"),
        "{line}"
    );
    let run = idem(&[
        "dead",
        "list",
        "--nats",
        "nats://127.0.0.1:1",
        "--queue",
        "q",
    ]);
    assert_eq!(run.code, 2, "--queue goes with --rabbitmq: {run:?}");
    let run = idem(&[
        "dead", "list", "--nats", "nats://x", "--kafka", "y", "--stream", "S",
    ]);
    assert_eq!(run.code, 2, "one broker: {run:?}");
    let run = idem(&[
        "dead",
        "list",
        "--nats",
        "nats://x",
        "--stream",
        "S",
        "--older-than",
        "soon",
    ]);
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("is not an age"), "{}", run.stderr);
    let run = idem(&[
        "dead", "replay", "--nats", "nats://x", "--stream", "S", "--all", "--id", "3",
    ]);
    assert_eq!(run.code, 2, "--all or a filter: {run:?}");
}

#[test]
fn unreachable_brokers_are_errors_without_passwords() {
    let line = idem(&[
        "--timeout",
        "5",
        "dead",
        "list",
        "--rabbitmq",
        "amqp://guest:s3cr3t@127.0.0.1:1/%2f",
        "--queue",
        "q",
    ])
    .fails(1);
    assert!(
        line.starts_with("idem: cannot reach rabbitmq at amqp://guest:***@127.0.0.1:1/%2f: "),
        "{line}"
    );
    assert!(!line.contains("s3cr3t"), "{line}");
    let line = idem(&[
        "--timeout",
        "5",
        "dead",
        "list",
        "--nats",
        "nats://127.0.0.1:1",
        "--stream",
        "S",
    ])
    .fails(1);
    assert!(
        line.starts_with("idem: cannot reach nats at nats://127.0.0.1:1: "),
        "{line}"
    );
}

// ---------------------------------------------------------------------------
// Groups by cause, copies, expired keys and edited replays: two real
// `#[idempotent]` handlers (a stock reservation kept an hour, a charge kept a
// second), five deliveries: two orders out of stock, one of them sent twice
// by its producer, a declined charge, a payload that does not decode.

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Stock {
    id: String,
    qty: u32,
}

/// Fails until `fixed`; a delivery's quantity is compared with its key's
/// record (`fingerprint`).
#[idempotent(
    key = "msg.id",
    ttl = "1h",
    store = "memory",
    fingerprint = "msg.qty",
    name = "cli_groups_reserve"
)]
async fn reserve_stock(msg: &Stock, fixed: &AtomicBool) -> Result<u32, String> {
    if fixed.load(Ordering::SeqCst) {
        return Ok(msg.qty);
    }
    Err(format!("out of stock for {}", msg.id))
}

/// Fails until `fixed`; a record lives one second.
#[idempotent(
    key = "msg.id",
    ttl = "1s",
    store = "memory",
    name = "cli_groups_charge"
)]
async fn charge(msg: &Stock, fixed: &AtomicBool) -> Result<u32, String> {
    if fixed.load(Ordering::SeqCst) {
        return Ok(msg.qty);
    }
    Err("card declined: 402".to_owned())
}

type StockCall =
    std::pin::Pin<Box<dyn Future<Output = Result<Outcome<u32>, Error<String>>> + Send>>;

/// What the consumers handed the handlers: the id, the quantity and the
/// edited header.
type Handed = Arc<Mutex<Vec<(String, u32, Option<String>)>>>;

/// Orders `c-*` go to `charge`, the others to `reserve_stock`, on one
/// memory store (the consumers' records, kept across their runs).
fn stock_handler(
    store: &MemoryStore,
    fixed: &Arc<AtomicBool>,
    edited: &'static str,
    handed: &Handed,
) -> impl Fn(Stock, Delivery) -> StockCall + Send + Sync + 'static {
    let (store, fixed, handed) = (store.clone(), Arc::clone(fixed), Arc::clone(handed));
    move |msg: Stock, delivery: Delivery| {
        handed.lock().unwrap().push((
            msg.id.clone(),
            msg.qty,
            delivery.header(edited).map(str::to_owned),
        ));
        let (store, fixed) = (store.clone(), Arc::clone(&fixed));
        Box::pin(async move {
            if msg.id.starts_with("c-") {
                charge(&store, &msg, &fixed).await
            } else {
                reserve_stock(&store, &msg, &fixed).await
            }
        })
    }
}

type StockStart<'s> = &'s dyn Fn(
    Box<dyn Fn(Stock, Delivery) -> StockCall + Send + Sync>,
) -> (CancellationToken, Task);

/// The five deliveries, as payloads in the order they are published.
const STOCK_PAYLOADS: [&[u8]; 5] = [
    br#"{"id":"o-1","qty":1}"#,
    br#"{"id":"o-2","qty":1}"#,
    br#"{"id":"o-2","qty":1}"#,
    br#"{"id":"c-1","qty":1}"#,
    br#"{"id":7}"#,
];

/// Runs a consumer with the handler until `until` holds of what it was
/// handed (or 30 s pass), then stops it.
async fn consume_until(
    start: StockStart<'_>,
    store: &MemoryStore,
    fixed: bool,
    edited: &'static str,
    until: impl Fn(&[(String, u32, Option<String>)]) -> bool,
) -> (Report, Vec<(String, u32, Option<String>)>) {
    let handed: Handed = Arc::default();
    let (token, task) = start(Box::new(stock_handler(
        store,
        &Arc::new(AtomicBool::new(fixed)),
        edited,
        &handed,
    )));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !until(&handed.lock().unwrap()) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "not handed what was awaited: {:?}",
            handed.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let report = stop(token, task).await;
    let handed = handed.lock().unwrap().clone();
    (report, handed)
}

/// The group of `groups` (JSON) whose handler is `handler` (`None`: none).
fn group_of<'g>(groups: &'g serde_json::Value, handler: Option<&str>) -> &'g serde_json::Value {
    groups["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .find(|g| g["handler"].as_str() == handler)
        .unwrap_or_else(|| panic!("no group of {handler:?}: {groups}"))
}

/// `remembers`: the broker's ledger remembers what earlier replays ran
/// (Kafka, RocketMQ), so a copy of one is removed by a later replay.
async fn groups_scenario(
    at: Vec<String>,
    edited: &'static str,
    remembers: bool,
    start: StockStart<'_>,
) {
    let store = MemoryStore::new();
    // Every delivery fails once and is dead-lettered.
    let handed: Handed = Arc::default();
    let (token, task) = start(Box::new(stock_handler(
        &store,
        &Arc::new(AtomicBool::new(false)),
        edited,
        &handed,
    )));
    let listing = listed(&at, 5).await;
    let report = stop(token, task).await;
    assert_eq!(report.dead_lettered, 5, "{report:?}");

    // Three groups: the stock shortage (two messages, three dead letters),
    // the declined charge, the payload that does not decode.
    let groups = idem_async(args(&at, &["--json", "dead", "groups"]))
        .await
        .json();
    assert_eq!(groups["count"], 3, "{groups}");
    let stock = group_of(&groups, Some("cli_groups_reserve"));
    assert_eq!(stock["kind"], "handler_error", "{stock}");
    assert_eq!(stock["fingerprint"], "out of stock for #", "{stock}");
    assert_eq!(
        (stock["messages"].as_u64(), stock["dead_letters"].as_u64()),
        (Some(2), Some(3))
    );
    assert!(
        stock["first_seen"]
            .as_str()
            .is_some_and(|t| t.ends_with('Z')),
        "{stock}"
    );
    assert_eq!(
        groups["groups"][0]["id"], stock["id"],
        "the biggest first: {groups}"
    );
    let card = group_of(&groups, Some("cli_groups_charge"));
    assert_eq!(card["fingerprint"], "card declined: #", "{card}");
    let undecodable = group_of(&groups, None);
    assert_eq!(undecodable["kind"], "decode", "{undecodable}");
    let (stock_id, card_id) = (
        stock["id"].as_str().unwrap().to_owned(),
        card["id"].as_str().unwrap().to_owned(),
    );
    let undecodable_dead = undecodable["example"].as_str().unwrap().to_owned();
    let card_dead = card["example"].as_str().unwrap().to_owned();
    // The listing names each dead letter's group, key, handler and ttl.
    let o1 = listing["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["key"] == "o-1")
        .unwrap_or_else(|| panic!("{listing}"));
    assert_eq!(o1["group"], stock_id.as_str());
    assert_eq!(o1["ttl_ms"], 3_600_000);
    assert_eq!(o1["error"], "out of stock for o-1");
    // As text: a table, the biggest first.
    let text = idem_async(args(&at, &["dead", "groups"])).await.ok().stdout;
    assert!(text.starts_with("3 groups of dead letters in "), "{text}");
    let header = text.lines().nth(1).unwrap_or_default();
    for column in [
        "GROUP",
        "MESSAGES",
        "DEAD LETTERS",
        "REPLAYS",
        "FIRST SEEN",
        "HANDLER",
        "KIND",
        "ERROR",
    ] {
        assert!(header.contains(column), "{header}");
    }
    assert!(
        text.lines()
            .nth(2)
            .unwrap_or_default()
            .starts_with(&stock_id),
        "{text}"
    );
    let only = idem_async(args(
        &at,
        &["--json", "dead", "list", "--in-group", &card_id],
    ))
    .await
    .json();
    assert_eq!(only["count"], 1, "{only}");

    // The charge's ttl (1 s) has passed since it was dead-lettered: a replay
    // of its group says so and leaves it.
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let left = idem_async(args(
        &at,
        &["--json", "dead", "replay", "--in-group", &card_id],
    ))
    .await
    .json();
    assert_eq!(left["count"], 0, "{left}");
    assert_eq!(left["skipped"][0]["id"], card_dead.as_str(), "{left}");
    assert!(
        left["skipped"][0]["why"]
            .as_str()
            .unwrap()
            .contains("older than its handler's ttl"),
        "{left}"
    );
    let text = idem_async(args(&at, &["dead", "replay", "--in-group", &card_id]))
        .await
        .ok()
        .stdout;
    assert!(text.contains("--expired"), "{text}");
    listed(&at, 5).await;

    // The stock group replayed: each message once, the copy removed. Where
    // the ledger remembers, o-2 is replayed first on its own, and the group's
    // replay then removes its copy all the same.
    let first_o2 = listing["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["key"] == "o-2")
        .unwrap_or_else(|| panic!("{listing}"))["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut replayed = 0;
    if remembers {
        let done = idem_async(args(&at, &["--json", "dead", "replay", "--id", &first_o2]))
            .await
            .json();
        assert_eq!(done["count"], 1, "{done}");
        replayed = 1;
    }
    let done = idem_async(args(
        &at,
        &["--json", "dead", "replay", "--in-group", &stock_id],
    ))
    .await
    .json();
    assert_eq!(done["count"], 2 - replayed, "{done}");
    assert_eq!(done["copies"].as_array().map(Vec::len), Some(1), "{done}");
    assert_eq!(done["copies"][0]["of"], first_o2.as_str(), "{done}");
    listed(&at, 2).await;
    let (report, handed) = consume_until(start, &store, true, edited, |h| h.len() == 2).await;
    let mut ids: Vec<&str> = handed.iter().map(|(id, _, _)| id.as_str()).collect();
    ids.sort_unstable();
    assert_eq!(ids, ["o-1", "o-2"], "{handed:?}");
    assert_eq!(report.acked, 2, "{report:?}");

    // The payload that did not decode, replayed edited into an order whose
    // key has a record with another payload: the consumer checks it as any
    // delivery and dead-letters it as a mismatch, marked edited.
    let file = tempfile::NamedTempFile::new().expect("a file");
    std::fs::write(file.path(), br#"{"id":"o-1","qty":9}"#).expect("written");
    let path = file.path().to_str().unwrap().to_owned();
    let done = idem_async(args(
        &at,
        &[
            "--json",
            "dead",
            "replay",
            "--id",
            &undecodable_dead,
            "--payload",
            &path,
        ],
    ))
    .await
    .json();
    assert_eq!(done["replayed"][0]["edited"], true, "{done}");
    let (_, handed) = consume_until(start, &store, true, edited, |h| !h.is_empty()).await;
    assert_eq!(handed[0].0, "o-1");
    assert_eq!(handed[0].1, 9);
    assert!(
        handed[0]
            .2
            .as_deref()
            .is_some_and(|d| d.starts_with("sha256:")),
        "{handed:?}"
    );
    let listing = listed(&at, 2).await;
    let mismatch = listing["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["error_kind"] == "payload_mismatch")
        .unwrap_or_else(|| panic!("{listing}"));
    assert!(mismatch["edited"].as_str().is_some(), "{mismatch}");

    // The expired charge, replayed edited with --expired: it takes effect.
    std::fs::write(file.path(), br#"{"id":"c-2","qty":1}"#).expect("written");
    let run = idem_async(args(
        &at,
        &[
            "--json",
            "dead",
            "replay",
            "--id",
            &card_dead,
            "--payload",
            &path,
        ],
    ))
    .await
    .json();
    assert_eq!(run["count"], 0, "an expired one needs --expired: {run}");
    let done = idem_async(args(
        &at,
        &[
            "--json",
            "dead",
            "replay",
            "--id",
            &card_dead,
            "--payload",
            &path,
            "--expired",
        ],
    ))
    .await
    .json();
    assert_eq!(done["count"], 1, "{done}");
    let (report, handed) = consume_until(start, &store, true, edited, |h| !h.is_empty()).await;
    assert_eq!(handed[0].0, "c-2");
    assert_eq!(report.acked, 1, "{report:?}");
    // What is left: the mismatch alone.
    let listing = listed(&at, 1).await;
    assert_eq!(listing["items"][0]["error_kind"], "payload_mismatch");
    // An edited replay of an id that is not there.
    let missing = if at.iter().any(|a| a == "--kafka") {
        "0:999999"
    } else if at.iter().any(|a| a == "--nats") {
        "999999"
    } else {
        "no-such-id"
    };
    let line = idem_async(args(
        &at,
        &["dead", "replay", "--id", missing, "--payload", &path],
    ))
    .await
    .fails(3);
    assert!(line.contains("no dead letter"), "{line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_dead_letters_by_cause() {
    let on = or_skip!(on_rabbitmq("cli_groups_rmq", &STOCK_PAYLOADS).await);
    groups_scenario(on.at.clone(), "x-idem-edited", false, &starts!(on.consumer)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_dead_letters_by_cause() {
    let on = or_skip!(on_nats("cli_groups_nats", &STOCK_PAYLOADS, false).await);
    groups_scenario(on.at.clone(), "Idem-Edited", false, &starts!(on.consumer)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_dead_letters_by_cause() {
    let on = or_skip!(on_kafka("cli_groups_kafka", &STOCK_PAYLOADS).await);
    groups_scenario(on.at.clone(), "x-idem-edited", true, &starts!(on.consumer)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rocketmq_dead_letters_by_cause() {
    let on = or_skip!(on_rocketmq("cli_groups_rocketmq", &STOCK_PAYLOADS).await);
    groups_scenario(on.at.clone(), "x-idem-edited", true, &starts!(on.consumer)).await;
}
