//! The record keeps the execution that settled it: on every store, a key
//! completed or failed for good inside a trace keeps the `traceparent` of
//! the handler's span (`Record::trace`), and a duplicate delivered later,
//! in another trace, gets a span that links to it. Lease mode runs on
//! each store (one message, and a batch), transaction mode on each SQL
//! store.

use idem_runtime::store::{Inspect, LeaseStore};
use idem_runtime::{
    Error, FinalError, Key, MemoryStore, MySqlStore, MySqlTx, Outcome, PgStore, PgTx, Record,
    SqliteStore, SqliteTx, idempotent,
};
use idem_tests::otel::{in_a_trace, traceparent};
use idem_tests::{
    DeleteKeys, DropMySqlTables, DropTables, mysql_pool, or_skip, pg_pool, redis_store, redis_url,
    unique_prefix, unique_table,
};
use opentelemetry::trace::SpanContext;
use opentelemetry_sdk::trace::SpanData;

#[derive(Debug, Clone)]
struct Order {
    id: String,
    refuse: bool,
}

impl Order {
    fn new(id: &str, refuse: bool) -> Order {
        Order {
            id: id.to_owned(),
            refuse,
        }
    }

    fn key(&self) -> Key {
        Key::from_parts(&[&self.id]).unwrap()
    }
}

/// A refusal is final: recorded, and handed back to duplicates.
#[derive(Debug, Clone, PartialEq, thiserror::Error, serde::Serialize, serde::Deserialize)]
#[error("order {0} refused")]
struct Refused(String);

impl FinalError for Refused {
    fn is_final(&self) -> bool {
        true
    }
}

fn body(msg: &Order) -> Result<u32, Refused> {
    if msg.refuse {
        Err(Refused(msg.id.clone()))
    } else {
        Ok(7)
    }
}

#[idempotent(key = "id", ttl = "1h", store = "memory", name = "trace_settle")]
async fn settle(msg: &Order) -> Result<u32, Refused> {
    body(msg)
}

#[idempotent(key = "id", ttl = "1h", store = "memory", name = "trace_settle_batch")]
async fn settle_batch(msgs: &[Order]) -> Result<Vec<u32>, Refused> {
    Ok(msgs.iter().map(|_| 7).collect())
}

#[idempotent(key = "id", ttl = "1h", store = "sqlite", name = "trace_settle_sqlite")]
async fn settle_sqlite(_tx: &mut SqliteTx<'_>, msg: &Order) -> Result<u32, Refused> {
    body(msg)
}

#[idempotent(key = "id", ttl = "1h", store = "postgres", name = "trace_settle_pg")]
async fn settle_pg(_tx: &mut PgTx<'_>, msg: &Order) -> Result<u32, Refused> {
    body(msg)
}

#[idempotent(key = "id", ttl = "1h", store = "mysql", name = "trace_settle_mysql")]
async fn settle_mysql(_tx: &mut MySqlTx<'_>, msg: &Order) -> Result<u32, Refused> {
    body(msg)
}

/// Asserts that `duplicate` links to `settled`.
fn links_to(duplicate: &SpanData, settled: &SpanData) {
    let wanted: &SpanContext = &settled.span_context;
    assert!(
        duplicate.links.iter().any(|link| {
            link.span_context.trace_id() == wanted.trace_id()
                && link.span_context.span_id() == wanted.span_id()
        }),
        "the duplicate's span {:?} has no link to the span that settled its key ({} {}): {:?}",
        duplicate.span_context.span_id(),
        wanted.trace_id(),
        wanted.span_id(),
        duplicate.links.iter().collect::<Vec<_>>()
    );
}

async fn record_of<S: Inspect>(store: &S, handler: &str, key: &Key) -> Record {
    store
        .lookup(handler, key.as_str())
        .await
        .expect("the store answers")
        .expect("the key's record")
}

/// Lease mode: a completion, a final failure and a batch's completions
/// keep the settling span; each duplicate links to it.
async fn lease_mode_keeps_the_settling_trace<S: LeaseStore + Inspect>(store: &S) {
    let id = unique_table("trace_settle");
    let done = Order::new(&format!("{id}-done"), false);
    let refused = Order::new(&format!("{id}-refused"), true);

    let (first, settled) = in_a_trace("idempotent", settle(store, &done)).await;
    assert_eq!(first.unwrap(), Outcome::Executed(7));
    let record = record_of(store, "trace_settle", &done.key()).await;
    assert_eq!(
        record.trace.as_deref(),
        Some(traceparent(&settled).as_str())
    );
    assert_eq!(
        record.trace_id(),
        Some(settled.span_context.trace_id().to_string().as_str())
    );
    let (again, duplicate) = in_a_trace("idempotent", settle(store, &done)).await;
    assert_eq!(again.unwrap(), Outcome::Duplicate(7));
    links_to(&duplicate, &settled);
    // The duplicate changed nothing.
    let after = record_of(store, "trace_settle", &done.key()).await;
    assert_eq!(after.trace, record.trace);

    let (first, settled) = in_a_trace("idempotent", settle(store, &refused)).await;
    assert!(
        matches!(
            first,
            Err(Error::Failed {
                replayed: false,
                ..
            })
        ),
        "{first:?}"
    );
    let record = record_of(store, "trace_settle", &refused.key()).await;
    assert_eq!(
        record.trace.as_deref(),
        Some(traceparent(&settled).as_str())
    );
    let (again, duplicate) = in_a_trace("idempotent", settle(store, &refused)).await;
    assert!(
        matches!(again, Err(Error::Failed { replayed: true, .. })),
        "{again:?}"
    );
    links_to(&duplicate, &settled);

    let batch = [
        Order::new(&format!("{id}-b1"), false),
        Order::new(&format!("{id}-b2"), false),
    ];
    let (first, settled) = in_a_trace("idempotent_batch", settle_batch(store, &batch)).await;
    for answer in first.unwrap() {
        assert_eq!(answer.unwrap(), Outcome::Executed(7));
    }
    for msg in &batch {
        let record = record_of(store, "trace_settle_batch", &msg.key()).await;
        assert_eq!(
            record.trace.as_deref(),
            Some(traceparent(&settled).as_str())
        );
    }
    let (again, duplicate) = in_a_trace("idempotent_batch", settle_batch(store, &batch[..1])).await;
    assert_eq!(again.unwrap().remove(0).unwrap(), Outcome::Duplicate(7));
    links_to(&duplicate, &settled);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_records_keep_the_settling_trace() {
    lease_mode_keeps_the_settling_trace(&MemoryStore::new()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_records_keep_the_settling_trace() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("idem.db")).await.unwrap();
    store.migrate().await.unwrap();
    lease_mode_keeps_the_settling_trace(&store).await;
    tx_mode_keeps_the_settling_trace(&store, "trace_settle_sqlite", |msg| {
        let store = store.clone();
        async move { settle_sqlite(&store, &msg).await }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_records_keep_the_settling_trace() {
    let pool = or_skip!(pg_pool(4).await);
    let table = unique_table("trace_pg");
    let _drop = DropTables::new(&[&table]);
    let store = PgStore::from_pool(pool).with_table(&table).unwrap();
    store.migrate().await.unwrap();
    lease_mode_keeps_the_settling_trace(&store).await;
    tx_mode_keeps_the_settling_trace(&store, "trace_settle_pg", |msg| {
        let store = store.clone();
        async move { settle_pg(&store, &msg).await }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_records_keep_the_settling_trace() {
    let pool = or_skip!(mysql_pool(4, 5).await);
    let table = unique_table("trace_my");
    let _drop = DropMySqlTables::new(&[&table]);
    let store = MySqlStore::from_pool(pool).with_table(&table).unwrap();
    store.migrate().await.unwrap();
    lease_mode_keeps_the_settling_trace(&store).await;
    tx_mode_keeps_the_settling_trace(&store, "trace_settle_mysql", |msg| {
        let store = store.clone();
        async move { settle_mysql(&store, &msg).await }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_records_keep_the_settling_trace() {
    let prefix = unique_prefix("trace_redis");
    let _delete = DeleteKeys::new(&redis_url(), &prefix);
    let store = or_skip!(redis_store(&prefix).await);
    lease_mode_keeps_the_settling_trace(&store).await;
    // A completion sent again with its token (its reply lost) reads the
    // traced record it wrote, and answers that it recorded it.
    let msg = Order::new(&unique_table("trace_again"), false);
    let (_, settled) = in_a_trace("idempotent", settle(&store, &msg)).await;
    let record = record_of(&store, "trace_settle", &msg.key()).await;
    let token = record.token.clone().expect("the completing claim's token");
    let spec = idem_runtime::registry::find("trace_settle").expect("registered");
    assert!(
        store
            .complete(spec, &msg.key(), &token, "7")
            .await
            .expect("the store answers")
    );
    assert_eq!(
        record_of(&store, "trace_settle", &msg.key()).await.trace,
        Some(traceparent(&settled))
    );
}

/// Transaction mode: the outcome committed with the body keeps the
/// settling span, and so does a final failure; each duplicate links to
/// it, whether it was turned away before its body or at its commit.
async fn tx_mode_keeps_the_settling_trace<S, C, F>(store: &S, handler: &str, call: C)
where
    S: Inspect,
    C: Fn(Order) -> F,
    F: std::future::Future<Output = Result<Outcome<u32>, Error<Refused>>>,
{
    let id = unique_table("trace_tx");
    for refuse in [false, true] {
        let msg = Order::new(&format!("{id}-{refuse}"), refuse);
        let (first, settled) = in_a_trace("idempotent", call(msg.clone())).await;
        match refuse {
            false => assert_eq!(first.unwrap(), Outcome::Executed(7)),
            true => assert!(
                matches!(
                    first,
                    Err(Error::Failed {
                        replayed: false,
                        ..
                    })
                ),
                "{first:?}"
            ),
        }
        let record = record_of(store, handler, &msg.key()).await;
        assert_eq!(
            record.trace.as_deref(),
            Some(traceparent(&settled).as_str())
        );
        let (again, duplicate) = in_a_trace("idempotent", call(msg.clone())).await;
        match refuse {
            false => assert_eq!(again.unwrap(), Outcome::Duplicate(7)),
            true => assert!(
                matches!(again, Err(Error::Failed { replayed: true, .. })),
                "{again:?}"
            ),
        }
        links_to(&duplicate, &settled);
    }
}
