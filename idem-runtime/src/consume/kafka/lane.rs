//! A lane: the messages of one partition (or, with lanes by key, of the
//! keys that hash to it), handled one after another, each settled before
//! the next: executed, a duplicate, handed to a retry topic or dead-lettered.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use rdkafka::message::{Message as _, OwnedMessage};
use rdkafka::producer::FutureRecord;
use tokio::sync::{mpsc, watch};

use super::lock_std;
use super::state::{Group, Part};
use super::topics::{self, HeaderList, now_ms};
use super::{Retries, offsets};
use crate::consume::dead::cause::HEADERS;
use crate::consume::tiers::{self, DUE_SLACK};
use crate::consume::{Attempts, Broker, Delivery, Handled, Settled, Verdict, lock};

/// Handles the messages `rx` hands it until the partition is revoked or the
/// consumer stops.
pub(crate) async fn lane(
    group: Arc<Group>,
    part: Arc<Part>,
    mut rx: mpsc::UnboundedReceiver<OwnedMessage>,
) {
    let mut revoked = part.revoked.subscribe();
    loop {
        // An idle lane ends with its partition too, and lets the part go.
        let msg = tokio::select! {
            msg = rx.recv() => match msg {
                Some(msg) => msg,
                None => break,
            },
            () = until_revoked(&mut revoked) => break,
        };
        if part.is_revoked() {
            break;
        }
        let headers = HeaderList::of(msg.headers());
        if let Some(due) = headers.number(topics::DUE) {
            match hold(&group, &msg, due, &mut revoked).await {
                Held::Due => {}
                Held::Revoked => break,
                Held::Early(left) => {
                    // Not due yet: on to the tier for what is left, without
                    // a call (its headers, counts and due time, as they are).
                    part.in_flight.fetch_add(1, Ordering::SeqCst);
                    if part.is_revoked() {
                        part.in_flight.fetch_sub(1, Ordering::SeqCst);
                        break;
                    }
                    let to = group.names.retry_topic(left);
                    tracing::debug!(topic = %part.topic, partition = part.partition, ?left, %to, "not due yet: forwarded");
                    let sent = publish(&group, &to, &msg, &headers, &mut revoked).await;
                    if sent.is_some() {
                        lock_std(&part.progress).settled(msg.offset());
                        part.queued.fetch_sub(1, Ordering::SeqCst);
                        tally(&group, Settled::Forwarded);
                    }
                    part.in_flight.fetch_sub(1, Ordering::SeqCst);
                    if sent.is_none() {
                        break;
                    }
                    continue;
                }
            }
        }
        part.in_flight.fetch_add(1, Ordering::SeqCst);
        if part.is_revoked() {
            part.in_flight.fetch_sub(1, Ordering::SeqCst);
            break;
        }
        let settled = settle(&group, &part, &msg, headers, &mut revoked).await;
        // Settled and counted before it stops being in flight: a revoke or
        // a shutdown waiting for the bodies in flight then commits past it,
        // and the report has it.
        let given_up = settled.is_none();
        if let Some(settled) = settled {
            lock_std(&part.progress).settled(msg.offset());
            part.queued.fetch_sub(1, Ordering::SeqCst);
            tally(&group, settled);
        }
        part.in_flight.fetch_sub(1, Ordering::SeqCst);
        if given_up {
            break;
        }
    }
}

/// How a message with a due time fared at the head of its lane.
enum Held {
    /// It is due (or within the slack of it): the handler may run.
    Due,
    /// Its due time is ahead by this much still: it hops on.
    Early(Duration),
    /// Its partition was revoked meanwhile.
    Revoked,
}

/// Holds a retry at the head of its lane until it is due, or, on a retry
/// topic, until the topic's own delay has passed since it was published
/// there, whichever comes first: every message of a retry topic was sent
/// there with at least its delay ahead, so holding one that long never
/// keeps those behind it past their own time. In place (no retry topics)
/// a message waits until it is due.
async fn hold(
    group: &Group,
    msg: &OwnedMessage,
    due: u64,
    revoked: &mut watch::Receiver<bool>,
) -> Held {
    let left = tiers::left_until(due);
    if left.is_zero() {
        return Held::Due;
    }
    if group.retries == Retries::InPlace {
        return if sleep_unless_revoked(left, revoked).await {
            Held::Due
        } else {
            Held::Revoked
        };
    }
    // On a retry topic, released `tier` after it was published there; on
    // any other topic (a copy put back by hand), at once.
    let release = match group.names.tier_of(msg.topic()) {
        Some(tier) => {
            let published = msg
                .timestamp()
                .to_millis()
                .and_then(|ms| u64::try_from(ms).ok())
                .unwrap_or_else(now_ms);
            let by_tier =
                published.saturating_add(u64::try_from(tier.as_millis()).unwrap_or(u64::MAX));
            tiers::left_until(by_tier.min(due))
        }
        None => Duration::ZERO,
    };
    if !release.is_zero() && !sleep_unless_revoked(release, revoked).await {
        return Held::Revoked;
    }
    let left = tiers::left_until(due);
    if left > DUE_SLACK {
        return Held::Early(left);
    }
    if !left.is_zero() && !sleep_unless_revoked(left, revoked).await {
        return Held::Revoked;
    }
    Held::Due
}

fn tally(group: &Group, settled: Settled) {
    lock(&group.report).count(&settled);
}

/// Runs one message through the handler until its delivery is settled;
/// `None` when it was given up (its partition revoked, or the consumer
/// stopping), to be delivered again to whoever owns the partition next.
async fn settle(
    group: &Group,
    part: &Part,
    msg: &OwnedMessage,
    headers: HeaderList,
    revoked: &mut watch::Receiver<bool>,
) -> Option<Settled> {
    let described = describe(msg, &headers);
    let published_at = described.published_at;
    group.meter.delivered(&described);
    let mut last = None;
    let settled = settle_calls(group, part, msg, headers, described, revoked, &mut last).await;
    if let (Some(settled), Some(handled)) = (&settled, &last) {
        group.meter.settled(handled, settled, published_at);
    }
    settled
}

/// What the broker said about `msg`: where it was first consumed, for a
/// retry's copy.
fn describe(msg: &OwnedMessage, headers: &HeaderList) -> Delivery {
    let retries = u32::try_from(headers.number(topics::RETRIES).unwrap_or(0)).unwrap_or(u32::MAX);
    let published_ms = headers.number(topics::PUBLISHED).or_else(|| {
        msg.timestamp()
            .to_millis()
            .and_then(|ms| u64::try_from(ms).ok())
    });
    Delivery {
        broker: Some(Broker::Kafka),
        source: headers
            .text(topics::TOPIC)
            .map_or_else(|| msg.topic().to_owned(), str::to_owned),
        partition: Some(
            headers
                .text(topics::PARTITION)
                .and_then(|p| p.parse().ok())
                .unwrap_or(msg.partition()),
        ),
        offset: Some(
            headers
                .text(topics::OFFSET)
                .and_then(|o| o.parse().ok())
                .unwrap_or(msg.offset()),
        ),
        retries,
        deliveries: retries.saturating_add(1),
        published_at: published_ms
            .and_then(|ms| std::time::UNIX_EPOCH.checked_add(Duration::from_millis(ms))),
        id: headers.text(topics::MESSAGE_ID).map(str::to_owned),
        headers: headers.pairs(),
        ..Delivery::default()
    }
}

async fn settle_calls(
    group: &Group,
    part: &Part,
    msg: &OwnedMessage,
    mut headers: HeaderList,
    described: Delivery,
    revoked: &mut watch::Receiver<bool>,
    last: &mut Option<Handled>,
) -> Option<Settled> {
    let payload = msg.payload().unwrap_or_default();
    let mut failures =
        u32::try_from(headers.number(topics::FAILURES).unwrap_or(0)).unwrap_or(u32::MAX);
    let retries = headers.number(topics::RETRIES).unwrap_or(0);
    let mut waited = 0u32;
    loop {
        // A slot of the policy's concurrency for the call only: a message
        // waiting in place, or publishing its copy, holds none.
        let permit = tokio::select! {
            permit = Arc::clone(&group.permits).acquire_owned() => permit.ok()?,
            () = until_revoked(revoked) => return None,
        };
        let attempts = Attempts {
            failures,
            retries: u32::try_from(retries)
                .unwrap_or(u32::MAX)
                .saturating_add(waited),
            ..Attempts::default()
        };
        // In flight while it holds a slot: waiting for one, or in place, is not.
        let in_flight = group.meter.in_flight();
        let mut delivery = described.clone();
        // An in-place wait is a retry the broker does not see.
        delivery.retries = attempts.retries;
        delivery.deliveries = attempts.retries.saturating_add(1);
        let call = (group.call)(payload, delivery, attempts);
        let (handled, rode) = match &group.offsets {
            Some(store) => {
                let at = offsets::Position {
                    group: group.group.clone(),
                    topic: part.topic.clone(),
                    partition: part.partition,
                    next: msg.offset() + 1,
                };
                store.in_tx(at, call).await
            }
            None => (call.await, false),
        };
        drop(permit);
        drop(in_flight);
        if rode {
            // Written with the effects: the next commit need not save it.
            lock_std(&part.progress).stored(msg.offset() + 1);
        }
        let (verdict, duplicate) = (handled.verdict.clone(), handled.duplicate);
        if group.retries == Retries::InPlace && matches!(verdict, Verdict::Retry { .. }) {
            group.meter.settled(&handled, &Settled::Retried, None);
        }
        *last = Some(handled);
        match verdict {
            Verdict::Ack { alert } => {
                if let Some(alert) = &alert {
                    tracing::error!(topic = %part.topic, partition = part.partition, offset = msg.offset(), "settled, but look: {alert}");
                }
                return Some(Settled::Acked {
                    duplicate,
                    alert: alert.is_some(),
                });
            }
            Verdict::Retry {
                after,
                failed,
                reason,
            } => {
                failures = failures.saturating_add(u32::from(failed));
                match group.retries {
                    Retries::InPlace => {
                        tracing::debug!(topic = %part.topic, partition = part.partition, ?after, %reason, "waiting in place");
                        if !sleep_unless_revoked(after, revoked).await {
                            return None;
                        }
                        waited = waited.saturating_add(1);
                    }
                    Retries::Topics => {
                        let to = group.names.retry_topic(after);
                        mark_origin(&mut headers, group, msg);
                        headers.set(topics::FAILURES, failures.to_string());
                        headers.set(topics::RETRIES, (retries + 1).to_string());
                        headers.set_text(topics::LAST_ERROR, &reason);
                        // Due after the wait asked for, not the tier's: an
                        // early one hops on when it comes back (`hold`).
                        headers.set(topics::DUE, tiers::due_after(after).to_string());
                        tracing::debug!(topic = %part.topic, partition = part.partition, %to, %reason, "retrying later");
                        publish(group, &to, msg, &headers, revoked).await?;
                        return Some(Settled::Retried);
                    }
                }
            }
            Verdict::DeadLetter { reason, failed } => {
                failures = failures.saturating_add(u32::from(failed));
                mark_origin(&mut headers, group, msg);
                headers.set(topics::FAILURES, failures.to_string());
                headers.set(topics::RETRIES, retries.to_string());
                headers.set_text(topics::REASON, &reason);
                headers.set_text(topics::DLT_MESSAGE, &reason);
                headers.set(topics::DLT_GROUP, &group.group);
                let cause = last.as_ref().and_then(|h| h.dead.as_ref());
                for (name, value) in cause.map(|c| c.headers(HEADERS)).unwrap_or_default() {
                    headers.set_text(name, &value);
                }
                let to = group.names.dead_letter_topic();
                tracing::warn!(topic = %part.topic, partition = part.partition, offset = msg.offset(), %reason, "dead-lettered");
                publish(group, &to, msg, &headers, revoked).await?;
                return Some(Settled::DeadLettered);
            }
            Verdict::Stop { reason } => {
                group.stop(reason);
                return None;
            }
        }
    }
}

/// Where the message was first consumed, written once: a retry's copy keeps
/// its origin through every retry topic to the dead letters.
fn mark_origin(headers: &mut HeaderList, group: &Group, msg: &OwnedMessage) {
    let (topic, partition, offset) = (msg.topic(), msg.partition(), msg.offset());
    let first = headers.text(topics::TOPIC).is_none();
    if let Some(ms) = msg.timestamp().to_millis() {
        headers.keep_or_set(topics::PUBLISHED, ms.to_string());
    }
    headers.keep_or_set(topics::TOPIC, topic);
    headers.keep_or_set(topics::PARTITION, partition.to_string());
    headers.keep_or_set(topics::OFFSET, offset.to_string());
    if first {
        headers.set(topics::DLT_TOPIC, topic);
        headers.set(topics::DLT_PARTITION, partition.to_be_bytes());
        headers.set(topics::DLT_OFFSET, offset.to_be_bytes());
    }
    let _ = group;
}

/// Publishes a copy of `msg` (its key and payload) with `headers` to `to`,
/// until the broker acknowledges it; `None` when the partition was revoked
/// or the consumer stops first (the original is then delivered again).
async fn publish(
    group: &Group,
    to: &str,
    msg: &OwnedMessage,
    headers: &HeaderList,
    revoked: &mut watch::Receiver<bool>,
) -> Option<()> {
    let payload = msg.payload().unwrap_or_default();
    let mut pause = Duration::from_millis(100);
    loop {
        let mut record = FutureRecord::to(to)
            .payload(payload)
            .headers(headers.to_owned_headers());
        if let Some(key) = msg.key() {
            record = record.key(key);
        }
        match group.producer.send(record, Duration::from_secs(30)).await {
            Ok(_) => return Some(()),
            // The first failure of a copy is a warning; the tries after it
            // (the broker is away) are not, one each.
            Err((e, _)) if pause == Duration::from_millis(100) => {
                tracing::warn!(error = %e, %to, "could not publish; trying again with a pause of up to 5 s");
            }
            Err((e, _)) => {
                tracing::debug!(error = %e, %to, "could not publish; trying again in {pause:?}");
            }
        }
        if !sleep_unless_revoked(pause, revoked).await {
            return None;
        }
        pause = (pause * 2).min(Duration::from_secs(5));
    }
}

/// Sleeps `wait`; `false` when the partition was revoked first.
async fn sleep_unless_revoked(wait: Duration, revoked: &mut watch::Receiver<bool>) -> bool {
    tokio::select! {
        () = tokio::time::sleep(wait) => true,
        () = until_revoked(revoked) => false,
    }
}

async fn until_revoked(revoked: &mut watch::Receiver<bool>) {
    let _ = revoked.wait_for(|r| *r).await;
}
