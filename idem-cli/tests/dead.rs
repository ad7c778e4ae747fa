//! `idem dead` on the real brokers: a consumer dead-letters two messages
//! (a body that fails, a payload that does not decode), and the binary
//! lists them (text and JSON), shows one, refuses a replay or purge that
//! names nothing, replays one by id (the copy reaches the consumer with
//! `x-idem-replays`), and purges (Kafka: all only). RocketMQ's run on the
//! broker the tests start. Each test on a queue,
//! stream or topic of its own, deleted afterwards; a broker that is not
//! there is a skip, or a failure under `IDEM_REQUIRE_SERVICES=1`.

mod common;

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::idem;
use idem_runtime::consume::{CancellationToken, ConsumeError, Delivery, Policy, Report};
use idem_runtime::{Error, Key, Outcome};
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
            line.contains("pass --id ID, --reason TEXT or --older-than AGE, or --all"),
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_dead_letters_through_the_cli() {
    use idem_runtime::consume::rabbitmq::{Consumer, RETRY_DELAYS};
    let (_conn, channel) = or_skip!(amqp_channel().await);
    let queue = unique_table("cli_dead_rmq");
    let consumer = Consumer::new(amqp_url(), queue.clone()).policy(policy());
    let mut queues = vec![queue.clone(), consumer.dead_letter_queue()];
    queues.extend(RETRY_DELAYS.iter().map(|d| consumer.retry_queue(*d)));
    let _cleanup = DeleteQueues::new(queues);
    channel
        .queue_declare(
            queue.as_str().into(),
            Default::default(),
            Default::default(),
        )
        .await
        .expect("the work queue");
    for payload in [&br#"{"id":"o-1"}"#[..], br#"{"id": 7}"#] {
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
    let at = vec![
        "--rabbitmq".to_owned(),
        amqp_url(),
        "--queue".to_owned(),
        queue.clone(),
    ];
    let described = format!("queue `{queue}.idem.dead` (RabbitMQ)");
    scenario(at, &described, true, "x-idem-replays", |handler| {
        let token = CancellationToken::new();
        let task = tokio::spawn(consumer.clone().run(handler, token.clone()));
        (token, task)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_dead_letters_through_the_cli() {
    use idem_runtime::consume::nats::Consumer;
    let js = or_skip!(idem_tests::brokers::jetstream().await);
    let stream = unique_table("cli_dead_nats");
    let subject = format!("idem.cli.{stream}");
    let consumer = Consumer::new(nats_url(), stream.clone(), subject.clone()).policy(policy());
    let _cleanup = DeleteStreams::new(vec![stream.clone(), consumer.dead_letter_stream()]);
    js.get_or_create_stream(async_nats_config(&stream, &subject))
        .await
        .expect("the stream");
    for payload in [&br#"{"id":"o-1"}"#[..], br#"{"id": 7}"#] {
        js.publish(subject.clone(), payload.to_vec().into())
            .await
            .expect("publish")
            .await
            .expect("acknowledged");
    }
    // The dead letters' own name, given instead of the stream's.
    let at = vec![
        "--nats".to_owned(),
        nats_url(),
        "--dead-letters".to_owned(),
        consumer.dead_letter_stream(),
    ];
    let described = format!("stream `{stream}_DEAD` (NATS)");
    scenario(at, &described, true, "Idem-Replays", |handler| {
        let token = CancellationToken::new();
        let task = tokio::spawn(consumer.clone().run(handler, token.clone()));
        (token, task)
    })
    .await;
}

fn async_nats_config(stream: &str, subject: &str) -> async_nats::jetstream::stream::Config {
    async_nats::jetstream::stream::Config {
        name: stream.to_owned(),
        subjects: vec![subject.to_owned()],
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_dead_letters_through_the_cli() {
    use idem_runtime::consume::kafka::Consumer;
    use idem_runtime::consume::kafka::dead::DeadLetters;
    let kafka = or_skip!(kafka().await);
    let topic = unique_table("cli_dead_kafka");
    let consumer = Consumer::new(kafka_brokers(), format!("{topic}-group"), topic.clone())
        .set(TANSU_ONE_RECORD_A_BATCH.0, TANSU_ONE_RECORD_A_BATCH.1)
        .policy(policy());
    let mut topics = vec![
        topic.clone(),
        consumer.dead_letter_topic(),
        DeadLetters::ledger_name(&consumer.dead_letter_topic()),
    ];
    topics.extend(consumer.retry_topics());
    let _cleanup = DeleteTopics::new(topics);
    kafka.create_topic(&topic, 1).await;
    let producer = kafka.producer();
    for payload in [&br#"{"id":"o-1"}"#[..], br#"{"id": 7}"#] {
        producer
            .send(
                rdkafka::producer::FutureRecord::<(), _>::to(&topic).payload(payload),
                Duration::from_secs(10),
            )
            .await
            .expect("publish");
    }
    let at = vec![
        "--kafka".to_owned(),
        kafka_brokers(),
        "--topic".to_owned(),
        topic.clone(),
    ];
    let described = format!("topic `{topic}-dlt` (Kafka)");
    scenario(at, &described, false, "x-idem-replays", |handler| {
        let token = CancellationToken::new();
        let task = tokio::spawn(consumer.clone().run(handler, token.clone()));
        (token, task)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rocketmq_dead_letters_through_the_cli() {
    use idem_runtime::consume::rocketmq::Consumer;
    let mq = or_skip!(rocketmq().await);
    let topic = unique_table("cli_dead_rocketmq");
    let consumer = Consumer::new(mq.name_server(), topic.clone())
        .delay_levels(rocketmq_delay_levels())
        .policy(policy());
    mq.create_topic(&topic, 1).await;
    for payload in [&br#"{"id":"o-1"}"#[..], br#"{"id": 7}"#] {
        mq.publish(&topic, payload, None).await;
    }
    let at = vec![
        "--rocketmq".to_owned(),
        mq.name_server().to_owned(),
        "--group".to_owned(),
        consumer.group_name().to_owned(),
    ];
    let described = format!("topic `%DLQ%{}` (RocketMQ)", consumer.group_name());
    scenario(at, &described, true, "x-idem-replays", |handler| {
        let token = CancellationToken::new();
        let task = tokio::spawn(consumer.clone().run(handler, token.clone()));
        (token, task)
    })
    .await;
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
