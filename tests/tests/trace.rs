//! Trace context across hops (feature `otel`), with OpenTelemetry's SDK
//! and its in-memory exporter under `tracing-opentelemetry`: a message
//! published from a span of the test, with its `traceparent`, is consumed
//! on each real broker by a handler that fails once and is retried, and
//! both attempts' `idem.consume` spans are children of the publishing
//! span, the handler's `idempotent` spans children of theirs. An HTTP
//! request with a `traceparent` gets an `idem.http` span in its trace, and
//! what its route stages in the outbox carries that trace on. One
//! subscriber serves the binary; each test reads the spans of its own
//! trace.

#[path = "trace/records.rs"]
mod records;

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::Duration;

use futures_util::future::BoxFuture;
use idem_runtime::consume::{CancellationToken, ConsumeError, Policy, Report};
use idem_runtime::{Error, MemoryStore, Outcome, idempotent};
use idem_tests::brokers::{
    DeleteQueues, DeleteStreams, DeleteTopics, TANSU_ONE_RECORD_A_BATCH, amqp_channel, amqp_url,
    kafka, kafka_brokers, nats_url, rocketmq, rocketmq_delay_levels,
};
use idem_tests::otel::{exporter, finished, spans_of};
use idem_tests::{HttpClient, Server, or_skip, unique_table};
use opentelemetry::trace::{SpanId, TraceContextExt as _, TraceId};
use opentelemetry_sdk::trace::SpanData;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

/// `spans` as a tree, one line a span (name, span id, fields), children
/// indented under their parent: what a failure prints, and the guide shows.
fn tree(spans: &[SpanData]) -> String {
    fn below(spans: &[SpanData], parent: SpanId, depth: usize, out: &mut String) {
        let mut children: Vec<&SpanData> = spans
            .iter()
            .filter(|s| s.parent_span_id == parent)
            .collect();
        children.sort_by_key(|s| s.start_time);
        for span in children {
            let fields: Vec<String> = span
                .attributes
                .iter()
                .filter(|kv| {
                    let key = kv.key.as_str();
                    !(["target", "busy_ns", "idle_ns"].contains(&key)
                        || key.starts_with("code.")
                        || key.starts_with("thread."))
                })
                .map(|kv| format!("{}={}", kv.key, kv.value))
                .collect();
            let line = format!(
                "{}{} {} {}",
                "  ".repeat(depth),
                span.name,
                span.span_context.span_id(),
                fields.join(" ")
            );
            out.push_str(line.trim_end());
            out.push('\n');
            below(spans, span.span_context.span_id(), depth + 1, out);
        }
    }
    let ids: Vec<SpanId> = spans.iter().map(|s| s.span_context.span_id()).collect();
    let mut out = String::new();
    let mut roots: Vec<SpanId> = Vec::new();
    for span in spans {
        if !ids.contains(&span.parent_span_id) && !roots.contains(&span.parent_span_id) {
            roots.push(span.parent_span_id);
        }
    }
    for root in roots {
        out.push_str(&format!("(parent {root})\n"));
        below(spans, root, 1, &mut out);
    }
    out
}

/// A span of the test that publishes: its trace, its id, and the headers
/// it sends.
fn publishing() -> (TraceId, SpanId, Vec<(String, String)>) {
    exporter();
    let span = tracing::info_span!("publish");
    let headers = span.in_scope(idem_runtime::trace::current_headers);
    let cx = span.context();
    let context = cx.span().span_context().clone();
    assert!(
        headers.iter().any(|(name, _)| name == "traceparent"),
        "{headers:?}"
    );
    (context.trace_id(), context.span_id(), headers)
}

#[derive(Debug, serde::Deserialize)]
struct Ping {
    id: String,
}

/// The ids whose first attempt failed.
static FAILED: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());

/// Fails the first time it meets an id, so that each message is retried
/// once.
#[idempotent(key = "id", ttl = "1h", store = "memory", name = "trace_ping")]
async fn ping(msg: &Ping) -> Result<u32, String> {
    if FAILED.lock().unwrap().insert(msg.id.clone()) {
        return Err("not yet".into());
    }
    Ok(1)
}

type Call = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<Outcome<u32>, Error<String>>> + Send>,
>;
type Task = tokio::task::JoinHandle<Result<Report, ConsumeError>>;
type Handler = Box<dyn Fn(Ping) -> Call + Send + Sync>;

fn handler() -> Handler {
    let store = MemoryStore::new();
    Box::new(move |msg: Ping| {
        let store = store.clone();
        Box::pin(async move { ping(&store, &msg).await })
    })
}

fn policy() -> Policy {
    Policy {
        max_failures: 3,
        ..Policy::default()
    }
}

/// One message with the test's trace context, published by `publish`,
/// consumed by what `start` runs: both attempts are in the trace.
async fn across_a_broker(
    publish: impl FnOnce(Vec<u8>, Vec<(String, String)>) -> BoxFuture<'static, ()>,
    start: impl FnOnce(Handler) -> (CancellationToken, Task),
) {
    let (trace, publisher, headers) = publishing();
    let id = unique_table("trace_ping");
    publish(format!(r#"{{"id":"{id}"}}"#).into_bytes(), headers).await;
    let (token, task) = start(handler());
    // `idem.consume` closes after the call under it.
    let spans = finished(trace, "idem.consume", 2).await;
    token.cancel();
    let report = tokio::time::timeout(Duration::from_secs(30), task)
        .await
        .expect("the consumer stopped")
        .expect("its task")
        .expect("its report");
    assert_eq!((report.acked, report.retried), (1, 1), "{report:?}");
    eprintln!("trace {trace}:\n{}", tree(&spans));
    let consumes: Vec<&SpanData> = spans.iter().filter(|s| s.name == "idem.consume").collect();
    assert_eq!(consumes.len(), 2, "both attempts: {spans:?}");
    for consume in &consumes {
        assert_eq!(consume.parent_span_id, publisher, "{consume:?}");
    }
    let consume_ids: Vec<SpanId> = consumes.iter().map(|s| s.span_context.span_id()).collect();
    for call in spans.iter().filter(|s| s.name == "idempotent") {
        assert!(consume_ids.contains(&call.parent_span_id), "{call:?}");
    }
}

/// The `start` of [`across_a_broker`]: runs `consumer` around a handler.
macro_rules! starts {
    ($consumer:expr) => {
        |handler| {
            let token = CancellationToken::new();
            let task = tokio::spawn($consumer.clone().run(handler, token.clone()));
            (token, task)
        }
    };
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trace_crosses_rabbitmq() {
    use idem_runtime::consume::rabbitmq::{Consumer, RETRY_DELAYS};
    use lapin::types::{AMQPValue, FieldTable};
    let (_conn, channel) = or_skip!(amqp_channel().await);
    let queue = unique_table("trace_rmq");
    let consumer = Consumer::new(amqp_url(), queue.clone()).policy(policy());
    let mut queues = vec![queue.clone(), consumer.dead_letter_queue()];
    queues.extend(RETRY_DELAYS.iter().map(|d| consumer.retry_queue(*d)));
    let _cleanup = DeleteQueues::new(queues);
    consumer.declare().await.expect("the queues");
    let publish = |payload: Vec<u8>, headers: Vec<(String, String)>| -> BoxFuture<'static, ()> {
        let (channel, queue) = (channel.clone(), queue.clone());
        Box::pin(async move {
            let mut table = FieldTable::default();
            for (name, value) in headers {
                table.insert(name.into(), AMQPValue::LongString(value.into()));
            }
            channel
                .basic_publish(
                    "".into(),
                    queue.as_str().into(),
                    Default::default(),
                    &payload,
                    lapin::BasicProperties::default().with_headers(table),
                )
                .await
                .expect("publish")
                .await
                .expect("confirmed");
        })
    };
    across_a_broker(publish, starts!(consumer)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trace_crosses_nats() {
    use idem_runtime::consume::nats::Consumer;
    let js = or_skip!(idem_tests::brokers::jetstream().await);
    let stream = unique_table("trace_nats");
    let subject = format!("idem.trace.{stream}");
    let consumer = Consumer::new(nats_url(), stream.clone(), subject.clone()).policy(policy());
    let _cleanup = DeleteStreams::new(vec![stream.clone(), consumer.dead_letter_stream()]);
    consumer.declare().await.expect("the streams");
    let publish = |payload: Vec<u8>, headers: Vec<(String, String)>| -> BoxFuture<'static, ()> {
        Box::pin(async move {
            let mut map = async_nats::HeaderMap::new();
            for (name, value) in &headers {
                map.insert(name.as_str(), value.as_str());
            }
            js.publish_with_headers(subject, map, payload.into())
                .await
                .expect("publish")
                .await
                .expect("acknowledged");
        })
    };
    across_a_broker(publish, starts!(consumer)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trace_crosses_kafka() {
    use idem_runtime::consume::kafka::Consumer;
    use rdkafka::message::{Header, OwnedHeaders};
    let kafka = or_skip!(kafka().await);
    let topic = unique_table("trace_kafka");
    let consumer = Consumer::new(kafka_brokers(), format!("{topic}-group"), topic.clone())
        .set(TANSU_ONE_RECORD_A_BATCH.0, TANSU_ONE_RECORD_A_BATCH.1)
        .policy(policy());
    let mut topics = vec![topic.clone(), consumer.dead_letter_topic()];
    topics.extend(consumer.retry_topics());
    let _cleanup = DeleteTopics::new(topics);
    kafka.create_topic(&topic, 1).await;
    let producer = kafka.producer();
    let publish = |payload: Vec<u8>, headers: Vec<(String, String)>| -> BoxFuture<'static, ()> {
        Box::pin(async move {
            let mut owned = OwnedHeaders::new();
            for (name, value) in &headers {
                owned = owned.insert(Header {
                    key: name,
                    value: Some(value.as_bytes()),
                });
            }
            producer
                .send(
                    rdkafka::producer::FutureRecord::<(), _>::to(&topic)
                        .payload(&payload)
                        .headers(owned),
                    Duration::from_secs(10),
                )
                .await
                .expect("publish");
        })
    };
    across_a_broker(publish, starts!(consumer)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trace_crosses_rocketmq() {
    use idem_runtime::consume::rocketmq::Consumer;
    let mq = or_skip!(rocketmq().await);
    let topic = unique_table("trace_rocketmq");
    let consumer = Consumer::new(mq.name_server(), topic.clone())
        .delay_levels(rocketmq_delay_levels())
        .policy(policy());
    mq.create_topic(&topic, 1).await;
    let publish = |payload: Vec<u8>, headers: Vec<(String, String)>| -> BoxFuture<'static, ()> {
        Box::pin(async move { mq.publish_with(&topic, &payload, None, &headers).await })
    };
    across_a_broker(publish, starts!(consumer)).await;
}

/// An HTTP hop: the layer's `idem.http` span is a child of the request's
/// `traceparent`, and a message the route stages carries the trace on (a
/// span under the request's as its parent).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trace_crosses_an_http_route_into_the_outbox() {
    use idem_runtime::SqliteStore;
    use idem_runtime::http::{Idempotency, RequestTx};
    use idem_runtime::outbox::Message;

    let (trace, publisher, headers) = publishing();
    let dir = tempfile::tempdir().expect("a directory");
    let store = SqliteStore::open(dir.path().join("trace.db"))
        .await
        .expect("a SQLite store");
    store.migrate().await.expect("the tables");
    let layer = Idempotency::unscoped("trace_http_orders", Duration::from_secs(60))
        .transaction(store.clone())
        .expect("a name of its own");
    let router = axum::Router::new().route(
        "/orders",
        axum::routing::post(|tx: RequestTx<SqliteStore>, body: String| async move {
            let staged = tx
                .stage(Message::new("orders.placed", body))
                .await
                .expect("staged");
            staged.to_string()
        })
        .route_layer(layer),
    );
    let server = Server::start(router).await;
    let mut sent: Vec<(&str, &str)> = headers
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_str()))
        .collect();
    sent.extend([
        ("idempotency-key", "\"k-trace\""),
        ("content-type", "application/json"),
    ]);
    let reply = HttpClient::new(server.addr)
        .send("POST", "/orders", &sent, "\"o-1\"")
        .await
        .expect("an answer");
    assert_eq!(reply.status, 200, "{}", reply.text());
    let spans = finished(trace, "idem.http", 1).await;
    eprintln!("trace {trace}:\n{}", tree(&spans));
    let http = spans
        .iter()
        .find(|s| s.name == "idem.http")
        .expect("the route's span");
    assert_eq!(http.parent_span_id, publisher, "{http:?}");
    // The staged message's trace context: the request's trace, from a span
    // of the request.
    let rows = store.outbox_table().list(0, 10).await.expect("rows");
    let traceparent = rows[0]
        .headers
        .iter()
        .find(|(n, _)| n == "traceparent")
        .map(|(_, v)| v.clone())
        .unwrap_or_else(|| panic!("no traceparent: {:?}", rows[0].headers));
    let parts: Vec<&str> = traceparent.split('-').collect();
    assert_eq!(parts[1], trace.to_string(), "{traceparent}");
    let request_spans: Vec<String> = spans_of(trace)
        .iter()
        .filter(|s| s.span_context.span_id() != publisher)
        .map(|s| s.span_context.span_id().to_string())
        .collect();
    assert!(
        request_spans.contains(&parts[2].to_owned()),
        "{traceparent} names none of {request_spans:?}"
    );
}

/// The application's own server span, continued from the request's
/// `traceparent` by a layer before idem's (as tower-http's `TraceLayer`
/// with OpenTelemetry does).
async fn server_span(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use tracing::Instrument as _;
    let span = tracing::info_span!("server");
    idem_runtime::trace::adopt(
        &span,
        request
            .headers()
            .iter()
            .map(|(name, value)| (name.as_str(), value.as_bytes())),
    );
    next.run(request).instrument(span).await
}

/// Behind a layer that continued the trace already, `idem.http` is a child
/// of that layer's span, not a sibling of it under the remote parent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_route_behind_a_traced_layer_stays_under_its_span() {
    use idem_runtime::http::Idempotency;

    let (trace, publisher, headers) = publishing();
    let layer = Idempotency::unscoped("trace_http_behind", Duration::from_secs(60))
        .lease(MemoryStore::new())
        .expect("a name of its own");
    let router = axum::Router::new()
        .route(
            "/notify",
            axum::routing::post(|| async { "sent" }).route_layer(layer),
        )
        .layer(axum::middleware::from_fn(server_span));
    let server = Server::start(router).await;
    let mut sent: Vec<(&str, &str)> = headers
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_str()))
        .collect();
    sent.push(("idempotency-key", "\"k-behind\""));
    let reply = HttpClient::new(server.addr)
        .send("POST", "/notify", &sent, "")
        .await
        .expect("an answer");
    assert_eq!(reply.status, 200, "{}", reply.text());
    let spans = finished(trace, "server", 1).await;
    eprintln!("trace {trace}:\n{}", tree(&spans));
    let server = spans
        .iter()
        .find(|s| s.name == "server")
        .expect("the server span");
    assert_eq!(server.parent_span_id, publisher, "{server:?}");
    let http = spans
        .iter()
        .find(|s| s.name == "idem.http")
        .expect("the route's span");
    assert_eq!(
        http.parent_span_id,
        server.span_context.span_id(),
        "{http:?}"
    );
}
