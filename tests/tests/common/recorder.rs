//! A `metrics` recorder that keeps what it is given, for tests that read
//! back the series a dashboard would: counter totals, gauge values (and the
//! highest each reached) and histogram sample counts, by name and labels.
//! It is installed once per test binary ([`capture`]); tests tell their
//! series apart by a label of their own (a handler, a queue).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use metrics::{
    Counter, CounterFn, Gauge, GaugeFn, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder,
    SharedString, Unit,
};

/// One series: its name and labels, and what it holds.
#[derive(Debug, Clone, Default)]
pub(crate) struct Series {
    pub(crate) name: String,
    pub(crate) labels: Vec<(String, String)>,
    /// A counter's total, a gauge's value, or a histogram's sample count.
    pub(crate) value: f64,
    /// A gauge's highest value.
    pub(crate) most: f64,
}

/// What the recorder has seen.
#[derive(Default, Clone)]
pub(crate) struct Seen(Arc<Mutex<HashMap<String, Series>>>);

impl Seen {
    fn update(&self, key: &Key, f: impl FnOnce(&mut Series)) {
        let mut labels: Vec<(String, String)> = key
            .labels()
            .map(|l| (l.key().to_owned(), l.value().to_owned()))
            .collect();
        labels.sort();
        let id = format!("{}{labels:?}", key.name());
        let mut all = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let series = all.entry(id).or_insert_with(|| Series {
            name: key.name().to_owned(),
            labels,
            ..Series::default()
        });
        f(series);
    }

    /// The series called `name` whose labels include every pair of `with`.
    pub(crate) fn series(&self, name: &str, with: &[(&str, &str)]) -> Vec<Series> {
        let all = self.0.lock().unwrap_or_else(|e| e.into_inner());
        all.values()
            .filter(|s| s.name == name)
            .filter(|s| {
                with.iter()
                    .all(|(k, v)| s.labels.iter().any(|(lk, lv)| lk == k && lv == v))
            })
            .cloned()
            .collect()
    }

    /// The sum of those series' values.
    pub(crate) fn sum(&self, name: &str, with: &[(&str, &str)]) -> f64 {
        self.series(name, with).iter().map(|s| s.value).sum()
    }
}

struct Entry(Seen, Key);

impl CounterFn for Entry {
    fn increment(&self, value: u64) {
        self.0.update(&self.1, |s| s.value += value as f64);
    }
    fn absolute(&self, value: u64) {
        self.0.update(&self.1, |s| s.value = value as f64);
    }
}

impl GaugeFn for Entry {
    fn increment(&self, value: f64) {
        self.0.update(&self.1, |s| {
            s.value += value;
            s.most = s.most.max(s.value);
        });
    }
    fn decrement(&self, value: f64) {
        self.0.update(&self.1, |s| s.value -= value);
    }
    fn set(&self, value: f64) {
        self.0.update(&self.1, |s| {
            s.value = value;
            s.most = s.most.max(value);
        });
    }
}

impl HistogramFn for Entry {
    fn record(&self, _: f64) {
        self.0.update(&self.1, |s| s.value += 1.0);
    }
}

struct Capture(Seen);

impl Recorder for Capture {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(Arc::new(Entry(self.0.clone(), key.clone())))
    }
    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::from_arc(Arc::new(Entry(self.0.clone(), key.clone())))
    }
    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::from_arc(Arc::new(Entry(self.0.clone(), key.clone())))
    }
}

/// The process-wide capture, installed at the first call.
pub(crate) fn capture() -> Seen {
    static SEEN: OnceLock<Seen> = OnceLock::new();
    SEEN.get_or_init(|| {
        let seen = Seen::default();
        metrics::set_global_recorder(Capture(seen.clone()))
            .expect("no other recorder in this test binary");
        seen
    })
    .clone()
}
