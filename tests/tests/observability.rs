//! The metrics a consumer's dashboard reads: calls by result, claim and body
//! latency. Own binary, because it installs the process-wide recorder.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use idem_runtime::{Error, MemoryStore, idempotent, metric};
use metrics::{
    Counter, CounterFn, Gauge, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder,
    SharedString, Unit,
};

/// Counter totals and histogram sample counts by name and labels.
#[derive(Default, Clone)]
struct Seen(Arc<Mutex<HashMap<String, f64>>>);

impl Seen {
    fn add(&self, id: &str, by: f64) {
        if let Ok(mut m) = self.0.lock() {
            *m.entry(id.to_owned()).or_default() += by;
        }
    }

    fn get(&self, id: &str) -> f64 {
        self.0
            .lock()
            .map(|m| m.get(id).copied().unwrap_or(0.0))
            .unwrap_or(0.0)
    }
}

fn id(key: &Key) -> String {
    let mut labels: Vec<String> = key
        .labels()
        .map(|l| format!("{}={}", l.key(), l.value()))
        .collect();
    labels.sort();
    format!("{}{{{}}}", key.name(), labels.join(","))
}

struct Entry(Seen, String);

impl CounterFn for Entry {
    fn increment(&self, value: u64) {
        self.0.add(&self.1, value as f64);
    }
    fn absolute(&self, _: u64) {}
}

impl HistogramFn for Entry {
    fn record(&self, _: f64) {
        self.0.add(&self.1, 1.0);
    }
}

struct Capture(Seen);

impl Recorder for Capture {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(Arc::new(Entry(self.0.clone(), id(key))))
    }
    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::noop()
    }
    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::from_arc(Arc::new(Entry(self.0.clone(), id(key))))
    }
}

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
    let seen = Seen::default();
    metrics::set_global_recorder(Capture(seen.clone())).expect("first recorder in this binary");
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
        seen.get(&format!(
            "{}{{handler=obs_handler,result={result}}}",
            metric::CALLS
        ))
    };
    assert_eq!(calls("executed"), 1.0);
    assert_eq!(calls("duplicate"), 3.0, "the duplicate rate is visible");
    assert_eq!(calls("handler_error"), 1.0);
    assert_eq!(calls("key_missing"), 1.0);
    // Every call that reached the store was timed claiming; two bodies ran.
    assert_eq!(
        seen.get(&format!("{}{{handler=obs_handler}}", metric::CLAIM_SECONDS)),
        5.0
    );
    assert_eq!(
        seen.get(&format!("{}{{handler=obs_handler}}", metric::BODY_SECONDS)),
        2.0
    );
}
