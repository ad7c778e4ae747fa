//! `idem outbox` on a SQLite store's outbox: counted, listed, shown,
//! deleted, and sent now to real brokers (NATS JetStream by id, RabbitMQ
//! all of them), each row deleted once the broker confirmed it.

mod common;

use std::time::Duration;

use idem_runtime::SqliteStore;
use idem_runtime::outbox::{Message, MessageId};
use idem_tests::brokers::{DeleteQueues, DeleteStreams, amqp_channel, amqp_url, nats_url};
use idem_tests::unique_table;

use common::idem;

/// A SQLite store in a file of its own, with `n` messages staged by
/// `place_order` for key `A-17` (lane `red`), and their ids.
async fn staged(
    dir: &tempfile::TempDir,
    destination: &str,
    n: u32,
) -> (SqliteStore, String, Vec<MessageId>) {
    let path = dir.path().join("outbox.db");
    let store = SqliteStore::open(&path).await.expect("open");
    store.migrate().await.expect("migrate");
    let mut tx = store.pool().begin().await.expect("begin");
    let mut outbox = store.outbox("place_order", "A-17");
    let mut ids = Vec::new();
    for i in 0..n {
        let m = Message::new(destination, format!("{{\"n\":{i}}}"))
            .lane("red")
            .header("tenant", "acme");
        ids.push(outbox.stage(&mut tx, m).await.expect("stage"));
    }
    outbox.commit(tx).await.expect("commit");
    (store, format!("sqlite:{}", path.display()), ids)
}

#[tokio::test]
async fn stats_list_show_and_delete() {
    let dir = tempfile::tempdir().expect("a dir");
    let (store, url, ids) = staged(&dir, "orders.placed", 3).await;
    let stats = idem(&["--store", &url, "--json", "outbox", "stats"]).json();
    assert_eq!(stats["rows"], 3, "{stats}");
    assert_eq!(stats["table"], "idem_keys_outbox");
    let text = idem(&["--store", &url, "outbox", "stats"]).ok().stdout;
    assert!(
        text.starts_with("idem_keys_outbox: 3 waiting, the oldest for "),
        "{text}"
    );

    let list = idem(&["--store", &url, "--json", "outbox", "list"]).json();
    let listed: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap())
        .collect();
    let expected: Vec<&str> = ids.iter().map(MessageId::as_str).collect();
    assert_eq!(listed, expected);
    assert_eq!(list[0]["producer"], "place_order");
    assert_eq!(list[0]["headers"][0][1], "acme");
    let text = idem(&["--store", &url, "outbox", "list", "--limit", "1"])
        .ok()
        .stdout;
    assert!(
        text.contains(ids[0].as_str()) && !text.contains(ids[1].as_str()),
        "{text}"
    );

    let shown = idem(&["--store", &url, "outbox", "show", ids[1].as_str()])
        .ok()
        .stdout;
    assert!(shown.contains("payload      {\"n\":1}"), "{shown}");
    assert!(shown.contains("header       tenant: acme"), "{shown}");
    let line = idem(&["--store", &url, "outbox", "show", "no-such-id"]).fails(3);
    assert!(
        line.contains("no message no-such-id waits in idem_keys_outbox"),
        "{line}"
    );

    let deleted = idem(&["--store", &url, "outbox", "delete", ids[0].as_str()])
        .ok()
        .stdout;
    assert_eq!(deleted, "1 deleted\n");
    assert_eq!(store.outbox_table().backlog().await.unwrap().rows, 2);
    idem(&["--store", &url, "outbox", "delete", ids[0].as_str()]).fails(3);
}

#[tokio::test]
async fn send_by_id_to_nats_and_all_to_rabbitmq() {
    let Some(js) = idem_tests::brokers::jetstream().await else {
        return;
    };
    let Some((_conn, channel)) = amqp_channel().await else {
        return;
    };
    let name = unique_table("cli_outbox");
    let subject = format!("idem.cli.{name}");
    let _streams = DeleteStreams::new(vec![name.clone()]);
    let stream = idem_tests::brokers::create_stream(
        &js,
        async_nats::jetstream::stream::Config {
            name: name.clone(),
            subjects: vec![subject.clone()],
            ..Default::default()
        },
    )
    .await;
    let dir = tempfile::tempdir().expect("a dir");
    let (store, url, ids) = staged(&dir, &subject, 2).await;
    // one by id, to NATS: the stream has it under its id, the row is gone
    let sent = idem(&[
        "--store",
        &url,
        "outbox",
        "send",
        ids[1].as_str(),
        "--nats",
        &nats_url(),
    ])
    .ok()
    .stdout;
    assert_eq!(sent, "1 sent\n");
    let got = stream
        .get_last_raw_message_by_subject(&subject)
        .await
        .expect("the message");
    assert_eq!(
        got.headers.get("Nats-Msg-Id").map(|v| v.as_str()),
        Some(ids[1].as_str())
    );
    assert_eq!(store.outbox_table().list(0, 10).await.unwrap().len(), 1);

    // the other, with --all, to a RabbitMQ queue named after the destination
    let durable = lapin::options::QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    channel
        .queue_declare(
            subject.as_str().into(),
            durable,
            lapin::types::FieldTable::default(),
        )
        .await
        .expect("a queue");
    let _queues = DeleteQueues::new(vec![subject.clone()]);
    let sent = idem(&[
        "--store",
        &url,
        "outbox",
        "send",
        "--all",
        "--rabbitmq",
        &amqp_url(),
    ])
    .ok()
    .stdout;
    assert_eq!(sent, "1 sent\n");
    assert_eq!(store.outbox_table().backlog().await.unwrap().rows, 0);
    let mut got = None;
    for _ in 0..50 {
        got = channel
            .basic_get(
                subject.as_str().into(),
                lapin::options::BasicGetOptions { no_ack: true },
            )
            .await
            .expect("basic.get");
        if got.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let got = got.expect("the message in the queue");
    assert_eq!(
        got.delivery
            .properties
            .message_id()
            .as_ref()
            .map(|s| s.as_str()),
        Some(ids[0].as_str())
    );

    // a queue no one declared: RabbitMQ returns it, the row stays, exit 1
    let dir2 = tempfile::tempdir().expect("a dir");
    let (_, url2, left) = staged(&dir2, "no-such-queue-at-all", 1).await;
    let line = idem(&[
        "--store",
        &url2,
        "outbox",
        "send",
        "--all",
        "--rabbitmq",
        &amqp_url(),
    ])
    .fails(1);
    assert!(line.contains("1 failed"), "{line}");
    let _ = left;
}

#[test]
fn a_redis_store_has_no_outbox() {
    let line = idem(&["--store", "redis://127.0.0.1:6379", "outbox", "stats"]).fails(2);
    assert!(line.contains("a Redis store has no outbox"), "{line}");
}
