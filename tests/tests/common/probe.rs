//! A probe a test hands to its handlers: it counts how often a body ran,
//! remembers what the body saw, and can park a body until the test lets it go.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

/// Counts how often a body ran, remembers what it saw, and can park a body
/// until the test lets it go.
#[derive(Debug, Default)]
pub(crate) struct Probe {
    runs: AtomicUsize,
    entered: Notify,
    gate: Notify,
    seen: Mutex<Vec<String>>,
}

impl Probe {
    pub(crate) fn new() -> Arc<Probe> {
        Arc::new(Probe::default())
    }

    /// Called by a body when it starts; returns the run number (from 1).
    pub(crate) fn hit(&self) -> usize {
        self.runs.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// How often a body ran.
    pub(crate) fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }

    /// Called by a body: tells the test it is inside, then waits for
    /// [`open_gate`](Self::open_gate). The wait is bounded, so a test that
    /// fails before it opens the gate cannot leave a body (and the locks of
    /// its transaction) parked for ever.
    pub(crate) async fn park(&self) {
        self.entered.notify_one();
        tokio::time::timeout(Duration::from_secs(30), self.gate.notified())
            .await
            .expect("the test never opened the gate");
    }

    /// Waits until a body is parked (a permit is kept, so no wake-up is lost).
    pub(crate) async fn wait_parked(&self) {
        tokio::time::timeout(Duration::from_secs(10), self.entered.notified())
            .await
            .expect("the body never parked");
    }

    /// Lets one parked body go on.
    pub(crate) fn open_gate(&self) {
        self.gate.notify_one();
    }

    /// Remembers a string the body saw (e.g. its key).
    pub(crate) fn see(&self, s: impl Into<String>) {
        self.seen.lock().expect("probe lock").push(s.into());
    }

    pub(crate) fn seen(&self) -> Vec<String> {
        self.seen.lock().expect("probe lock").clone()
    }
}
