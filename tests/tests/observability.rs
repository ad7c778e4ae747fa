//! The metrics a consumer's dashboard reads: calls by result, claim and body
//! latency, read back from the process-wide recorder (`common/recorder.rs`),
//! whose series these tests tell apart by handler names of their own (`obs_*`).

use crate::common;

use common::recorder::capture;
use idem_runtime::{Error, MemoryStore, idempotent, metric};

#[derive(serde::Deserialize)]
struct Msg {
    id: String,
    coupon: Option<String>,
    fail: bool,
}

#[derive(Debug, thiserror::Error)]
#[error("refused")]
struct Refused;

#[idempotent(
    key = "id + coupon",
    ttl = "1h",
    store = "memory",
    name = "obs_handler"
)]
async fn handle(msg: &Msg) -> Result<u32, Refused> {
    if msg.fail {
        return Err(Refused);
    }
    Ok(1)
}

#[tokio::test]
async fn calls_are_counted_by_result_and_latencies_recorded() {
    let seen = capture();
    let store = MemoryStore::new();
    let msg = |id: &str, coupon: Option<&str>, fail| Msg {
        id: id.into(),
        coupon: coupon.map(Into::into),
        fail,
    };

    assert!(
        handle(&store, &msg("a", Some("c"), false))
            .await
            .expect("first")
            .is_executed()
    );
    for _ in 0..3 {
        assert!(
            handle(&store, &msg("a", Some("c"), false))
                .await
                .expect("dup")
                .is_duplicate()
        );
    }
    assert!(matches!(
        handle(&store, &msg("b", Some("c"), true)).await,
        Err(Error::Handler { .. })
    ));
    assert!(matches!(
        handle(&store, &msg("b", None, false)).await,
        Err(Error::KeyMissing { .. })
    ));

    let calls = |result: &str| {
        seen.sum(
            metric::CALLS,
            &[("handler", "obs_handler"), ("result", result)],
        )
    };
    assert_eq!(calls("executed"), 1.0);
    assert_eq!(calls("duplicate"), 3.0, "the duplicate rate is visible");
    assert_eq!(calls("handler_error"), 1.0);
    assert_eq!(calls("key_missing"), 1.0);
    // Every call that reached the store was timed claiming; two bodies ran.
    assert_eq!(
        seen.sum(metric::CLAIM_SECONDS, &[("handler", "obs_handler")]),
        5.0
    );
    assert_eq!(
        seen.sum(metric::BODY_SECONDS, &[("handler", "obs_handler")]),
        2.0
    );
}

#[idempotent(key = "id", ttl = "1h", store = "sqlite", name = "obs_outage")]
async fn during_an_outage(msg: &Msg) -> Result<u32, Refused> {
    let _ = msg;
    Ok(1)
}

/// Counts the warnings the runtime logs.
#[derive(Default)]
struct Warnings(std::sync::atomic::AtomicUsize);

impl tracing::Subscriber for Warnings {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let meta = event.metadata();
        if *meta.level() == tracing::Level::WARN && meta.target().starts_with("idem_runtime") {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// A store that is down fails every call: the calls say so, each with
/// `Error::Store`, but the log warns once per 10 s per handler, not once a
/// call.
#[tokio::test]
async fn store_faults_are_warned_once_per_window_not_once_per_call() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let store = idem_runtime::SqliteStore::open(dir.path().join("outage.db"))
        .await
        .expect("open");
    store.migrate().await.expect("migrate");
    store.pool().close().await;
    let warnings = std::sync::Arc::new(Warnings::default());
    let _log = tracing::subscriber::set_default(std::sync::Arc::clone(&warnings));
    for i in 0..30 {
        let msg = Msg {
            id: format!("o-{i}"),
            coupon: None,
            fail: false,
        };
        let err = during_an_outage(&store, &msg)
            .await
            .expect_err("the store is down");
        assert!(matches!(err, Error::Store { .. }), "{err:?}");
    }
    assert_eq!(
        warnings.0.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "one warning for 30 store faults"
    );
}

#[derive(serde::Deserialize)]
struct Paid {
    id: String,
    /// How long the body holds its transaction open.
    hold_ms: u64,
}

#[idempotent(
    key = "id",
    ttl = "1h",
    store = "postgres",
    name = "obs_duplicate_body"
)]
async fn record_payment(tx: &mut idem_runtime::PgTx<'_>, msg: &Paid) -> Result<u32, sqlx::Error> {
    sqlx::query("SELECT 1").execute(&mut **tx).await?;
    tokio::time::sleep(std::time::Duration::from_millis(msg.hold_ms)).await;
    Ok(1)
}

/// Bodies that ran for a duplicate and rolled back are counted: claiming
/// last every duplicate's; reading first only the one that raced the first
/// delivery's open transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_that_ran_for_a_duplicate_are_counted() {
    use idem_runtime::{ClaimOrder, PgStore};
    let seen = capture();
    let pool = idem_tests::or_skip!(idem_tests::pg_pool(4).await);
    let (last_t, checked_t) = (
        idem_tests::unique_table("obs_dup_last"),
        idem_tests::unique_table("obs_dup_checked"),
    );
    let _drop = idem_tests::DropTables::new(&[&last_t, &checked_t]);
    let store = |table: &str, order| {
        PgStore::from_pool(pool.clone())
            .with_table(table)
            .expect("a valid table name")
            .with_claim_order(order)
    };
    let (last, checked) = (
        store(&last_t, ClaimOrder::Last),
        store(&checked_t, ClaimOrder::Checked),
    );
    last.migrate().await.expect("migrate");
    checked.migrate().await.expect("migrate");
    let ran = || {
        seen.sum(
            metric::DUPLICATE_BODIES,
            &[("handler", "obs_duplicate_body")],
        )
    };
    let paid = |id: &str, hold_ms| Paid {
        id: id.into(),
        hold_ms,
    };

    // Claiming last: each duplicate of a settled key runs its body.
    assert!(
        record_payment(&last, &paid("p-1", 0))
            .await
            .unwrap()
            .is_executed()
    );
    for _ in 0..2 {
        assert!(
            record_payment(&last, &paid("p-1", 0))
                .await
                .unwrap()
                .is_duplicate()
        );
    }
    assert_eq!(ran(), 2.0, "claiming last, both duplicates' bodies ran");

    // Reading first: a settled key's duplicate is turned away before it.
    assert!(
        record_payment(&checked, &paid("p-2", 0))
            .await
            .unwrap()
            .is_executed()
    );
    assert!(
        record_payment(&checked, &paid("p-2", 0))
            .await
            .unwrap()
            .is_duplicate()
    );
    assert_eq!(ran(), 2.0, "reading first, no settled duplicate's body ran");

    // Two deliveries at once, neither settled when the other reads: both
    // bodies run; claiming last, the one that commits second finds the
    // other's record, and its body's writes roll back.
    let slow = tokio::spawn({
        let checked = checked.clone();
        async move { record_payment(&checked, &paid("p-3", 600)).await }
    });
    tokio::time::sleep(std::time::Duration::from_millis(150)).await;
    let fast = record_payment(&checked, &paid("p-3", 0)).await.unwrap();
    let slow = slow.await.unwrap().unwrap();
    assert!(
        fast.is_executed() != slow.is_executed() && fast.is_duplicate() != slow.is_duplicate(),
        "one executed, one duplicate: {fast:?}, {slow:?}"
    );
    assert_eq!(
        ran(),
        3.0,
        "the racing duplicate's body ran and rolled back"
    );
}
