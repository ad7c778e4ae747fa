//! What the poll thread, the lanes and the rebalance callbacks share: the
//! consumer's [`Group`], built from its [`Settings`], and each [`Part`]ition
//! it owns.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::message::OwnedMessage;
use rdkafka::producer::FutureProducer;
use tokio::sync::{Semaphore, mpsc, watch};

use super::offsets::Offsets;
use super::progress::Progress;
use super::topics::Names;
use super::{Retries, lock_std};
use crate::consume::front::handler::Call;
use crate::consume::{CancellationToken, Meter, Report};

/// What the consumer's settings give its group.
pub(crate) struct Settings {
    /// The retry and dead-letter topics, and the retry delays.
    pub(crate) names: Names,
    /// The consumer group's id.
    pub(crate) group: String,
    pub(crate) retries: Retries,
    /// Lanes per partition (by key).
    pub(crate) lanes: usize,
    /// Bodies at once, over all partitions (the policy's concurrency).
    pub(crate) concurrency: usize,
    /// How long a revoke waits for the bodies in flight.
    pub(crate) grace: Duration,
    /// How long a shutdown waits for them (the policy's grace).
    pub(crate) shutdown_grace: Duration,
    /// Messages queued per partition before it is paused.
    pub(crate) prefetch: usize,
    pub(crate) offsets: Option<Offsets>,
}

/// A partition the consumer owns, from its assignment to its revocation.
pub(crate) struct Part {
    pub(crate) topic: String,
    pub(crate) partition: i32,
    /// One sender per lane; a message goes to the lane of its key.
    pub(crate) lanes: Vec<mpsc::UnboundedSender<OwnedMessage>>,
    pub(crate) progress: Mutex<Progress>,
    /// Set when the partition is revoked or the consumer stops: lanes take
    /// nothing more and give up their waits.
    pub(crate) revoked: watch::Sender<bool>,
    /// Bodies running now.
    pub(crate) in_flight: AtomicUsize,
    /// Messages taken and not yet settled or given up, for the pause.
    pub(crate) queued: AtomicUsize,
    pub(crate) paused: AtomicBool,
}

impl Part {
    pub(crate) fn is_revoked(&self) -> bool {
        *self.revoked.borrow()
    }
}

/// What the poll thread, the lanes and the rebalance callbacks share.
pub(crate) struct Group {
    /// The retry and dead-letter topics, and the retry delays.
    pub(crate) names: Names,
    pub(crate) group: String,
    pub(crate) call: Call,
    pub(crate) producer: FutureProducer,
    pub(crate) retries: Retries,
    pub(crate) lanes: usize,
    /// Bodies at once, over all partitions (the policy's concurrency).
    pub(crate) permits: Arc<Semaphore>,
    pub(crate) report: Arc<Mutex<Report>>,
    pub(crate) meter: Meter,
    pub(crate) shutdown: CancellationToken,
    /// Why the consumer must stop (`Error::Config`), once a call said so.
    pub(crate) halt: Mutex<Option<String>>,
    pub(crate) halted: AtomicBool,
    /// How long a revoke waits for the bodies in flight.
    pub(crate) grace: Duration,
    /// How long a shutdown waits for them.
    pub(crate) shutdown_grace: Duration,
    /// Messages queued per partition before it is paused.
    pub(crate) prefetch: usize,
    pub(crate) offsets: Option<Offsets>,
    pub(crate) rt: tokio::runtime::Handle,
    pub(crate) parts: Mutex<HashMap<(String, i32), Arc<Part>>>,
}

impl Group {
    /// The group of a consumer with `settings`, calling `call`, publishing
    /// retries and dead letters with `producer`.
    pub(crate) fn new(
        settings: Settings,
        call: Call,
        producer: FutureProducer,
        meter: Meter,
        shutdown: CancellationToken,
    ) -> Self {
        let Settings {
            names,
            group,
            retries,
            lanes,
            concurrency,
            grace,
            shutdown_grace,
            prefetch,
            offsets,
        } = settings;
        Group {
            names,
            group,
            call,
            producer,
            retries,
            lanes: lanes.max(1),
            permits: Arc::new(Semaphore::new(concurrency.max(1))),
            report: Arc::new(Mutex::new(Report::default())),
            meter,
            shutdown,
            halt: Mutex::new(None),
            halted: AtomicBool::new(false),
            grace,
            shutdown_grace,
            prefetch: prefetch.max(1),
            offsets,
            rt: tokio::runtime::Handle::current(),
            parts: Mutex::new(HashMap::new()),
        }
    }

    /// A call reported the binary misconfigured: the consumer stops.
    pub(crate) fn stop(&self, reason: String) {
        lock_std(&self.halt).get_or_insert(reason);
        self.halted.store(true, Ordering::SeqCst);
    }

    /// The consumer's `run` is gone (its future dropped): the poll thread
    /// stops as on shutdown.
    pub(crate) fn abandon(&self) {
        self.halted.store(true, Ordering::SeqCst);
    }

    pub(crate) fn stopping(&self) -> bool {
        self.halted.load(Ordering::SeqCst) || self.shutdown.is_cancelled()
    }

    pub(crate) fn parts(&self) -> Vec<Arc<Part>> {
        lock_std(&self.parts).values().cloned().collect()
    }
}
