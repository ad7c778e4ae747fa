//! A phase: the cluster changed under the traffic, and its report (the
//! counts, what doubled, the message slowest to settle).

use std::collections::{BTreeMap, HashMap};
use std::io::Write as _;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt as _;
use idem_runtime::{Outcome, RedisStore};
use idem_tests::RedisCluster;

use super::{
    Counts, Ids, Msg, SINGLE, Traffic, apply_batch, apply_one, retryable, spawn_consumers,
};

/// How a phase went, for the assertions and the printout.
pub(super) struct Report {
    name: &'static str,
    took: Duration,
    counts: Counts,
    /// Effects per (handler, id).
    runs: HashMap<String, Vec<Instant>>,
    /// The fresh messages handed out, as (handler, id).
    fresh_used: Vec<(&'static str, String)>,
    storms_used: usize,
    /// Last calls after the phase: duplicates (the record was there), and
    /// anything else.
    check_duplicates: usize,
    check_other: Vec<String>,
    error_replies: BTreeMap<String, u64>,
}

impl Report {
    pub(super) fn doubled(&self) -> Vec<(&String, &Vec<Instant>)> {
        let mut d: Vec<_> = self.runs.iter().filter(|(_, r)| r.len() > 1).collect();
        d.sort();
        d
    }

    /// Fresh messages whose body never ran.
    fn lost(&self) -> Vec<String> {
        let mut lost = Vec::new();
        for (handler, id) in &self.fresh_used {
            let key = format!("{handler}/{id}");
            if !self.runs.contains_key(&key) {
                lost.push(key);
            }
        }
        lost
    }

    fn print(&self) {
        let c = &self.counts;
        let line = format!(
            "cluster change: {}: {:.1?}: {} single calls, {} batch calls of {} messages; \
             executed {}, duplicate {}, in_progress {}, store errors {} {:?}, \
             lease_lost {}, not_recorded {}, other {}, unsettled {}; \
             {} keys run ({} fresh messages, {} storm keys called), doubled {}, lost {}; \
             last calls: {} duplicates, {} other; error replies of the servers {:?}; \
             slowest to settle: {:.1?} ({}, {} retries, the first {:?}, the last {:?})\n",
            self.name,
            self.took,
            c.single_calls,
            c.batch_calls,
            c.batch_messages,
            c.executed,
            c.duplicate,
            c.in_progress,
            c.store_errors(),
            c.store,
            c.lease_lost,
            c.not_recorded,
            c.other.len(),
            c.unsettled.len(),
            self.runs.len(),
            self.fresh_used.len(),
            self.storms_used,
            self.doubled().len(),
            self.lost().len(),
            self.check_duplicates,
            self.check_other.len(),
            self.error_replies,
            c.slowest.0,
            c.slowest.1,
            c.slowest.2.len(),
            c.slowest.2.iter().take(4).collect::<Vec<_>>(),
            c.slowest.2.iter().rev().take(2).collect::<Vec<_>>(),
        );
        // Past libtest's capture, so that a plain run shows the counts.
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    }

    /// What holds in every phase: every call ended with an outcome or a
    /// retryable error, and retried ones with an outcome; no body ran
    /// without its call saying so (each run is an `Executed`, a
    /// `LeaseLost` or a `NotRecorded`); every fresh message ran; each key's
    /// record is there afterwards.
    pub(super) fn assert_accounted(&self) {
        let c = &self.counts;
        assert!(
            c.other.is_empty(),
            "{}: unexpected answers: {:?}",
            self.name,
            c.other
        );
        assert!(
            c.unsettled.is_empty(),
            "{}: messages without an outcome: {:?}",
            self.name,
            c.unsettled
        );
        let lost = self.lost();
        assert!(
            lost.is_empty(),
            "{}: fresh messages never run: {lost:?}",
            self.name
        );
        for (key, runs) in &self.runs {
            let [executed, lease_lost, not_recorded] =
                c.by_key.get(key).copied().unwrap_or_default();
            assert_eq!(
                runs.len(),
                executed + lease_lost + not_recorded,
                "{}: {key} ran {} times, answered executed {executed}, lease lost {lease_lost}, not recorded {not_recorded}",
                self.name,
                runs.len()
            );
        }
        assert!(
            self.check_other.is_empty(),
            "{}: last calls: {:?}",
            self.name,
            self.check_other
        );
        assert!(c.executed > 0 && c.duplicate > 0, "{}: {c:?}", self.name);
    }

    /// Phases where no acknowledged write is lost: no body ran twice.
    pub(super) fn assert_exactly_once(&self) {
        self.assert_accounted();
        let doubled = self.doubled();
        assert!(doubled.is_empty(), "{}: run twice: {doubled:?}", self.name);
        assert_eq!(self.counts.lease_lost, 0, "{}", self.name);
        assert_eq!(self.counts.not_recorded, 0, "{}", self.name);
        assert_eq!(
            self.check_duplicates,
            self.runs.len(),
            "{}: every key's record is there afterwards",
            self.name
        );
    }
}

/// The longest a last call may take: its lease, its store's timeouts and
/// retries many times over.
const CALL_BOUND: Duration = Duration::from_secs(60);

/// Runs the consumers over the ids of `slots` while `change` (blocking: it
/// drives the cluster) runs on a thread of its own, stops them when it
/// returns and `linger` has passed, lets every message settle, and makes a
/// last call of each key the phase ran.
pub(super) async fn phase(
    name: &'static str,
    stores: &[RedisStore],
    cluster: &Arc<Mutex<RedisCluster>>,
    slots: &[u16],
    linger: Duration,
    change: impl FnOnce(&Mutex<RedisCluster>) -> Result<(), String> + Send + 'static,
) -> Report {
    let t0 = Instant::now();
    cluster.lock().unwrap().reset_stats();
    let traffic = Arc::new(Traffic::new(name, stores, slots));
    let tasks = spawn_consumers(&traffic);
    let c = Arc::clone(cluster);
    let changed = tokio::task::spawn_blocking(move || change(&c))
        .await
        .expect("the change's thread");
    if let Err(e) = changed {
        traffic.stop.store(true, Ordering::Relaxed);
        panic!("{name}: {e}");
    }
    tokio::time::sleep(linger).await;
    traffic.stop.store(true, Ordering::Relaxed);
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(60), t)
            .await
            .unwrap_or_else(|_| panic!("{name}: a consumer did not finish within 60 s"))
            .expect("a consumer panicked");
    }
    // The cluster's own refusals and redirections; plain `ERR`s (which
    // the test's own connections' handshakes add) are left out.
    let error_replies: BTreeMap<String, u64> = cluster
        .lock()
        .unwrap()
        .error_replies()
        .into_iter()
        .filter(|(kind, _)| kind != "ERR")
        .collect();
    let runs = traffic.ledger.snapshot();

    // A last call of every key that ran, after the change: each must find
    // its record (a duplicate), retried while the cluster answers so.
    let checks: Vec<Result<(), String>> = futures_util::stream::iter(runs.keys().cloned())
        .map(|key| {
            let traffic = Arc::clone(&traffic);
            async move {
                let (handler, id) = key.split_once('/').expect("handler/id");
                let msg = Msg::new(id);
                // Longer than a lease: a claim whose completion was lost
                // with a killed master stands until its lease runs out.
                let deadline = Instant::now() + Duration::from_secs(15);
                loop {
                    let call = async {
                        if handler == SINGLE {
                            apply_one(&traffic.stores[0], &msg, &traffic.ledger).await
                        } else {
                            apply_batch(
                                &traffic.stores[0],
                                std::slice::from_ref(&msg),
                                &traffic.ledger,
                            )
                            .await
                            .and_then(|mut a| a.pop().expect("one answer"))
                        }
                    };
                    // A call that never answers fails the phase with its
                    // key, rather than leaving the test waiting.
                    let Ok(r) = tokio::time::timeout(CALL_BOUND, call).await else {
                        return Err(format!(
                            "{key}: no answer within {CALL_BOUND:?} (the store's \
                             commands time out after 2 s)"
                        ));
                    };
                    match r {
                        Ok(Outcome::Duplicate(_)) => return Ok(()),
                        Err(e) if retryable(&e) && Instant::now() < deadline => {
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                        other => return Err(format!("{key}: {other:?}")),
                    }
                }
            }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    let check_duplicates = checks.iter().filter(|c| c.is_ok()).count();
    let check_other: Vec<String> = checks.into_iter().filter_map(Result::err).collect();

    let counts = std::mem::take(&mut *traffic.counts());
    let issued = |ids: &Mutex<Ids>| {
        let ids = ids.lock().unwrap();
        ids.issued
            .iter()
            .map(|id| (ids.handler, id.clone()))
            .collect::<Vec<_>>()
    };
    let mut fresh_used = issued(&traffic.fresh[0]);
    fresh_used.extend(issued(&traffic.fresh[1]));
    let storms_used = traffic
        .storms
        .iter()
        .map(|s| s.lock().unwrap().issued.len())
        .sum();
    let report = Report {
        name,
        took: t0.elapsed(),
        counts,
        runs: traffic.ledger.snapshot(),
        fresh_used,
        storms_used,
        check_duplicates,
        check_other,
        error_replies,
    };
    report.print();
    report
}
