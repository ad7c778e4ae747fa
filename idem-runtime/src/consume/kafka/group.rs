//! The consumer's membership of its group: the poll thread, the partitions
//! it owns, what it commits, and what a rebalance does to them.
//!
//! librdkafka runs rebalance callbacks on the thread that polls. That thread
//! is a plain one of the consumer's own, not a runtime worker, so a revoke
//! can wait there for the bodies in flight (which run on the runtime) and
//! commit before the partitions go, whatever the runtime's flavour.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer as _, ConsumerContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Message as _, OwnedMessage};
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use tokio::sync::{mpsc, watch};

use super::lane::lane;
use super::lock_std;
use super::offsets::Offsets;
use super::progress::Progress;
use super::state::{Group, Part};
use crate::consume::lock;

impl Group {
    /// Takes ownership of newly assigned partitions: a part and its lanes each.
    fn assigned(self: &Arc<Self>, tpl: &TopicPartitionList) {
        let mut parts = lock_std(&self.parts);
        for e in tpl.elements() {
            let id = (e.topic().to_owned(), e.partition());
            if parts.contains_key(&id) {
                continue;
            }
            let mut senders = Vec::with_capacity(self.lanes);
            let mut receivers = Vec::with_capacity(self.lanes);
            for _ in 0..self.lanes {
                let (tx, rx) = mpsc::unbounded_channel();
                senders.push(tx);
                receivers.push(rx);
            }
            let mut progress = Progress::default();
            // Set only when read back from the offsets table (`read_back`):
            // the broker's commit may be behind it, so it is committed
            // there at the next commit.
            if let Offset::Offset(o) = e.offset() {
                progress.start_at(o);
                progress.stored(o);
            }
            let part = Arc::new(Part {
                topic: id.0.clone(),
                partition: id.1,
                lanes: senders,
                progress: Mutex::new(progress),
                // Assigned while the consumer stops (a rebalance served by
                // the shutdown's last polls): nothing is taken from it.
                revoked: watch::Sender::new(self.stopping()),
                in_flight: AtomicUsize::new(0),
                queued: AtomicUsize::new(0),
                paused: AtomicBool::new(false),
            });
            for rx in receivers {
                self.rt.spawn(lane(Arc::clone(self), Arc::clone(&part), rx));
            }
            parts.insert(id, part);
        }
    }

    /// Gives partitions up: their lanes take nothing more, the bodies in
    /// flight get up to the grace to finish, and what is settled is
    /// committed. A body still running then goes on, but its partition's
    /// offset stays before it: the next owner gets the message again, and
    /// the store's claim keeps the two runs from both taking effect.
    fn revoke(&self, consumer: &BaseConsumer<Ctx>, which: &[(String, i32)], grace: Duration) {
        let gone: Vec<Arc<Part>> = {
            let parts = lock_std(&self.parts);
            which
                .iter()
                .filter_map(|id| parts.get(id).cloned())
                .collect()
        };
        for part in &gone {
            part.revoked.send_replace(true);
        }
        // A grace too long to add is no limit.
        let deadline = Instant::now().checked_add(grace);
        while gone.iter().any(|p| p.in_flight.load(Ordering::SeqCst) > 0)
            && deadline.is_none_or(|d| Instant::now() < d)
        {
            std::thread::sleep(Duration::from_millis(5));
        }
        let running: usize = gone
            .iter()
            .map(|p| p.in_flight.load(Ordering::SeqCst))
            .sum();
        if running > 0 {
            tracing::warn!(
                running,
                ?grace,
                "bodies still running when their partitions went; their messages go to the next owner"
            );
        }
        self.commit(consumer, &gone, CommitMode::Sync);
        let mut parts = lock_std(&self.parts);
        for id in which {
            parts.remove(id);
        }
    }

    /// Commits every part's watermark that moved, to the broker and, with
    /// offsets in the store, to the store too.
    fn commit(&self, consumer: &BaseConsumer<Ctx>, parts: &[Arc<Part>], mode: CommitMode) {
        let mut tpl = TopicPartitionList::new();
        let mut marks = Vec::new();
        for part in parts {
            let mark = lock_std(&part.progress).to_commit();
            if let Some(mark) = mark
                && tpl
                    .add_partition_offset(&part.topic, part.partition, Offset::Offset(mark))
                    .is_ok()
            {
                marks.push((Arc::clone(part), mark));
            }
        }
        if marks.is_empty() {
            return;
        }
        if let Some(offsets) = &self.offsets {
            // Only what no executed message's transaction wrote already.
            let rows: Vec<(String, i32, i64)> = parts
                .iter()
                .filter_map(|p| {
                    let mark = lock_std(&p.progress).to_store()?;
                    Some((p.topic.clone(), p.partition, mark))
                })
                .collect();
            if !rows.is_empty() {
                if let Err(e) = self.rt.block_on(offsets.save(&self.group, &rows)) {
                    tracing::warn!(error = %e, "could not save offsets in the store; retried at the next commit");
                    return;
                }
                for part in parts {
                    if let Some((_, _, mark)) = rows
                        .iter()
                        .find(|(t, p, _)| *t == part.topic && *p == part.partition)
                    {
                        lock_std(&part.progress).stored(*mark);
                    }
                }
            }
        }
        match consumer.commit(&tpl, mode) {
            Ok(()) => {
                for (part, mark) in marks {
                    lock_std(&part.progress).committed(mark);
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "offset commit failed; retried at the next commit")
            }
        }
    }

    /// Hands a message to its lane, and pauses its partition once too many
    /// wait there.
    fn route(&self, consumer: &BaseConsumer<Ctx>, msg: OwnedMessage) {
        let part = lock_std(&self.parts)
            .get(&(msg.topic().to_owned(), msg.partition()))
            .cloned();
        let Some(part) = part else {
            // A late message of a partition already revoked: not ours.
            return;
        };
        if part.is_revoked() {
            return;
        }
        let lane = match msg.key() {
            _ if part.lanes.len() == 1 => 0,
            Some(key) => lane_of(key, part.lanes.len()),
            None => 0,
        };
        lock_std(&part.progress).took(msg.offset());
        let queued = part.queued.fetch_add(1, Ordering::SeqCst) + 1;
        if part.lanes[lane].send(msg).is_err() {
            return;
        }
        if queued >= self.prefetch && !part.paused.swap(true, Ordering::SeqCst) {
            let _ = consumer.pause(&one(&part));
        }
    }

    /// Resumes paused partitions whose lanes caught up.
    fn resume_caught_up(&self, consumer: &BaseConsumer<Ctx>) {
        for part in self.parts() {
            if part.paused.load(Ordering::SeqCst)
                && part.queued.load(Ordering::SeqCst) <= self.prefetch / 2
            {
                part.paused.store(false, Ordering::SeqCst);
                let _ = consumer.resume(&one(&part));
            }
        }
    }
}

/// The lane of a message key: its FNV-1a hash, spread over `lanes`; the
/// same key always takes the same lane, on every member and every build.
fn lane_of(key: &[u8], lanes: usize) -> usize {
    let hash = key.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    });
    usize::try_from(hash % lanes as u64).unwrap_or(0)
}

fn one(part: &Part) -> TopicPartitionList {
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(&part.topic, part.partition);
    tpl
}

/// The librdkafka context: rebalances and commits, handed to the group.
pub(crate) struct Ctx {
    pub(crate) group: Arc<Group>,
}

impl ClientContext for Ctx {
    /// librdkafka's log, as tracing events (target `librdkafka`), beside
    /// the consumer's own.
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, message: &str) {
        super::heard::trace(level, fac, message);
    }

    /// librdkafka's statistics (every `statistics.interval.ms`): the lag
    /// gauge, the partitions' high watermarks minus their commits.
    fn stats(&self, statistics: rdkafka::Statistics) {
        let waiting: i64 = statistics
            .topics
            .values()
            .flat_map(|topic| topic.partitions.values())
            .filter(|p| p.partition >= 0 && p.consumer_lag > 0)
            .map(|p| p.consumer_lag)
            .sum();
        self.group
            .meter
            .lag(u64::try_from(waiting).unwrap_or_default());
    }
}

impl ConsumerContext for Ctx {
    /// A periodic (asynchronous) commit that failed is made again at the
    /// next round.
    fn commit_callback(
        &self,
        result: rdkafka::error::KafkaResult<()>,
        offsets: &TopicPartitionList,
    ) {
        if let Err(e) = result {
            tracing::warn!(error = %e, "offset commit failed; made again at the next commit");
            let parts = lock_std(&self.group.parts);
            for e in offsets.elements() {
                if let Some(part) = parts.get(&(e.topic().to_owned(), e.partition())) {
                    lock_std(&part.progress).commit_failed();
                }
            }
        }
    }

    fn rebalance(
        &self,
        consumer: &BaseConsumer<Self>,
        err: RDKafkaRespErr,
        tpl: &mut TopicPartitionList,
    ) {
        match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                lock(&self.group.report).rebalances += 1;
                self.group.meter.rebalanced();
                if let Some(offsets) = &self.group.offsets {
                    self.read_back(offsets, tpl);
                }
                // Cooperative rebalancing (`partition.assignment.strategy=
                // cooperative-sticky`) hands over only what moves.
                let taken = if cooperative(consumer) {
                    consumer.incremental_assign(tpl)
                } else {
                    consumer.assign(tpl)
                };
                if let Err(e) = taken {
                    tracing::error!(error = %e, "could not take the assigned partitions");
                    return;
                }
                self.group.assigned(tpl);
                // A partition paused before a rebalance could stay paused.
                let _ = consumer.resume(tpl);
                tracing::info!(partitions = %names(tpl), "partitions assigned");
            }
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => {
                let which: Vec<(String, i32)> = tpl
                    .elements()
                    .iter()
                    .map(|e| (e.topic().to_owned(), e.partition()))
                    .collect();
                tracing::info!(partitions = %names(tpl), "partitions revoked");
                // Partitions lost (the session timed out) are another
                // member's already: committing for them would fail.
                if consumer.assignment_lost() {
                    self.group.revoke_lost(&which);
                } else {
                    // Leaving at shutdown: the shutdown's grace was waited
                    // already.
                    let grace = if self.group.stopping() {
                        Duration::ZERO
                    } else {
                        self.group.grace
                    };
                    self.group.revoke(consumer, &which, grace);
                }
                let _ = if cooperative(consumer) {
                    consumer.incremental_unassign(tpl)
                } else {
                    consumer.unassign()
                };
            }
            other => {
                let code: RDKafkaErrorCode = other.into();
                tracing::error!(error = %code, "rebalance failed; every partition is given up");
                let all: Vec<(String, i32)> = self
                    .group
                    .parts()
                    .iter()
                    .map(|p| (p.topic.clone(), p.partition))
                    .collect();
                self.group.revoke_lost(&all);
                let _ = consumer.unassign();
            }
        }
    }
}

impl Ctx {
    /// Offsets in the store override the broker's: they were written with
    /// the effects.
    fn read_back(&self, offsets: &Offsets, tpl: &mut TopicPartitionList) {
        let wanted: Vec<(String, i32)> = tpl
            .elements()
            .iter()
            .map(|e| (e.topic().to_owned(), e.partition()))
            .collect();
        // The broker's offsets may be behind the table's (the table is
        // written first), so starting from them would run again what the
        // table says is done: wait for the table instead.
        let mut pause = Duration::from_millis(100);
        loop {
            match self
                .group
                .rt
                .block_on(offsets.load(&self.group.group, &wanted))
            {
                Ok(stored) => {
                    for (topic, partition, offset) in stored {
                        let _ = tpl.set_partition_offset(&topic, partition, Offset::Offset(offset));
                    }
                    return;
                }
                Err(e) if self.group.stopping() => {
                    tracing::warn!(error = %e, "could not read the offsets in the store; stopping");
                    return;
                }
                Err(e) => tracing::error!(
                    error = %e,
                    "could not read the offsets in the store; trying again in {pause:?}"
                ),
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_secs(5));
        }
    }
}

impl Group {
    /// Partitions lost with the session: nothing to commit, nothing to wait for.
    fn revoke_lost(&self, which: &[(String, i32)]) {
        let mut parts = lock_std(&self.parts);
        for id in which {
            if let Some(part) = parts.remove(id) {
                part.revoked.send_replace(true);
            }
        }
    }
}

fn cooperative(consumer: &BaseConsumer<Ctx>) -> bool {
    matches!(
        consumer.rebalance_protocol(),
        rdkafka::consumer::RebalanceProtocol::Cooperative
    )
}

fn names(tpl: &TopicPartitionList) -> String {
    tpl.elements()
        .iter()
        .map(|e| format!("{}/{}", e.topic(), e.partition()))
        .collect::<Vec<_>>()
        .join(",")
}

/// How long the poll loop waits for a message before it looks at commits,
/// pauses and shutdown again.
const TICK: Duration = Duration::from_millis(50);
/// How often settled offsets are committed while running.
const COMMIT_EVERY: Duration = Duration::from_millis(200);

/// The poll loop, on its own thread: takes messages, routes them to lanes,
/// commits, and on shutdown or a stop lets the bodies in flight finish,
/// commits and leaves the group.
pub(crate) fn poll(consumer: BaseConsumer<Ctx>, group: Arc<Group>) {
    let mut last_commit = Instant::now();
    let mut brokers_down = false;
    while !group.stopping() {
        match consumer.poll(TICK) {
            Some(Ok(msg)) => {
                brokers_down = false;
                group.route(&consumer, msg.detach());
            }
            Some(Err(KafkaError::MessageConsumption(RDKafkaErrorCode::AllBrokersDown)))
                if !brokers_down =>
            {
                tracing::warn!("every broker is down; librdkafka reconnects");
                lock(&group.report).reconnects += 1;
                group.meter.reconnected();
                brokers_down = true;
            }
            Some(Err(e)) => tracing::warn!(error = %e, "consumer error"),
            None => {}
        }
        group.resume_caught_up(&consumer);
        if last_commit.elapsed() >= COMMIT_EVERY {
            // Asynchronous: a broker without a coordinator does not hold
            // the poll thread; a failure is seen by `commit_callback`.
            group.commit(&consumer, &group.parts(), CommitMode::Async);
            last_commit = Instant::now();
        }
    }
    // Take nothing more; let what runs finish (its waits are given up) for
    // up to the grace, then commit and leave, which revokes what is left
    // without waiting again.
    let parts = group.parts();
    for part in &parts {
        part.revoked.send_replace(true);
    }
    // A grace too long to add is no limit.
    let deadline = Instant::now().checked_add(group.shutdown_grace);
    let running = || -> usize {
        parts
            .iter()
            .map(|p| p.in_flight.load(Ordering::SeqCst))
            .sum()
    };
    while running() > 0 && deadline.is_none_or(|d| Instant::now() < d) {
        // Serve the group (heartbeats go on by themselves) while waiting.
        let _ = consumer.poll(Duration::ZERO).map(|m| m.map(|_| ()));
        std::thread::sleep(Duration::from_millis(5));
    }
    if running() > 0 {
        tracing::warn!(
            running = running(),
            grace = ?group.shutdown_grace,
            "bodies still running when the shutdown's grace ran out: their offsets stay before them, so the next owner gets their messages again"
        );
    }
    // What is still ours (a rebalance during the wait may have taken some).
    group.commit(&consumer, &group.parts(), CommitMode::Sync);
    drop(consumer);
}

#[cfg(test)]
mod tests {
    use super::lane_of;

    #[test]
    fn a_key_always_takes_the_same_lane() {
        // FNV-1a: fixed, so these hold on every build and every member.
        let lanes: Vec<usize> = ["held", "k1", "k2", "k3"]
            .iter()
            .map(|k| lane_of(k.as_bytes(), 4))
            .collect();
        assert_eq!(lanes, [2, 1, 0, 3]);
        assert_eq!(lane_of(b"anything", 1), 0);
    }
}
