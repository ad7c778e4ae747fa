//! Two members of one group sharing the partitions, with eager and
//! cooperative rebalancing.

use std::sync::Arc;
use std::time::Duration;

use idem_runtime::MemoryStore;
use idem_tests::or_skip;

use super::{Seen, Topic, recording, short_sessions, start, topic};
use crate::common::broker::Points;
use crate::common::eventually;

/// Two members of one group: the second's arrival rebalances the first,
/// both consume, and every message takes effect once; with eager
/// rebalancing (every partition revoked, then assigned again) and with
/// cooperative rebalancing (only what moves).
async fn two_members_share_the_partitions(t: &Topic, strategy: &str) {
    let member =
        || short_sessions(t.consumer.clone()).set("partition.assignment.strategy", strategy);
    let store = MemoryStore::new();
    let (seen_a, seen_b) = (Arc::new(Seen::default()), Arc::new(Seen::default()));
    let first = start(member(), recording(&store, &seen_a));
    let mut sent = 0;
    while seen_a.order().len() < 10 {
        t.send(
            Some(&format!("m-{sent}")),
            &Points::payload(&format!("m-{sent}"), 1),
        )
        .await;
        sent += 1;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let second = start(member(), recording(&store, &seen_b));
    let joined = std::time::Instant::now();
    // Keep publishing until the second member has consumed some.
    while seen_b.order().len() < 10 {
        assert!(
            joined.elapsed() < Duration::from_secs(60),
            "the second member got nothing in 60 s"
        );
        t.send(
            Some(&format!("m-{sent}")),
            &Points::payload(&format!("m-{sent}"), 1),
        )
        .await;
        sent += 1;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    eprintln!(
        "the second member consumed {:?} after it started",
        joined.elapsed()
    );
    eventually(
        Duration::from_secs(60),
        "every message's effect",
        || async { seen_a.order().len() + seen_b.order().len() >= sent },
    )
    .await;
    let (a, b) = (first.stop().await, second.stop().await);
    let mut ids: Vec<String> = seen_a.order();
    ids.extend(seen_b.order());
    let all = ids.len();
    ids.sort();
    ids.dedup();
    assert_eq!(
        (ids.len(), all),
        (sent, sent),
        "each message took effect once"
    );
    assert!(
        a.rebalances >= 2,
        "the second member's arrival rebalanced the first: {a:?}"
    );
    assert_eq!(
        a.acked + b.acked - a.duplicates - b.duplicates,
        sent as u64,
        "{a:?} {b:?}"
    );
    assert_eq!(t.kafka.lag(&t.group, &t.all_topics()).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_members_share_the_partitions_with_eager_rebalancing() {
    let t = or_skip!(topic("kafka_members", 4).await);
    two_members_share_the_partitions(&t, "range,roundrobin").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_members_share_the_partitions_with_cooperative_rebalancing() {
    let t = or_skip!(topic("kafka_members_coop", 4).await);
    two_members_share_the_partitions(&t, "cooperative-sticky").await;
}

/// Lease mode on Redis: the effect (an SMS sent) is counted outside any
/// store; the provider answers 3 s later.
#[idem_runtime::idempotent(
    key = "msg.id",
    ttl = "1h",
    store = "redis",
    name = "kafka_revoked_mid_body"
)]
async fn sms_then_wait(
    msg: &Points,
    sent: &std::sync::atomic::AtomicUsize,
) -> Result<u32, crate::common::AppError> {
    sent.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(3)).await;
    Ok(msg.points)
}

/// A rebalance while a body runs: a second member joins while the first
/// runs a body that took its effect and waits 3 s for its provider, longer
/// than the revoke's grace (500 ms). The revoke lets the partition go with
/// the body still running; the body runs on to its recorded outcome, and
/// its offset stays uncommitted, so the partition's next owner gets the
/// message again and is answered the recorded outcome: the SMS went once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_revoked_mid_body_leaves_only_the_offset_to_the_next_owner() {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use idem_runtime::Outcome;

    use crate::common::RedisFx;
    use crate::common::lease::{LeaseFixture, Time};

    let t = or_skip!(topic("kafka_revoked_mid_body", 1).await);
    let redis = Arc::new(or_skip!(RedisFx::open(Time::Real).await));
    let (sent, duplicates) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let handler = || {
        let (redis, sent, duplicates) = (
            Arc::clone(&redis),
            Arc::clone(&sent),
            Arc::clone(&duplicates),
        );
        move |msg: Points| -> super::BoxedCall {
            let (redis, sent, duplicates) = (
                Arc::clone(&redis),
                Arc::clone(&sent),
                Arc::clone(&duplicates),
            );
            Box::pin(async move {
                let out = sms_then_wait(redis.store(), &msg, &sent).await;
                if matches!(out, Ok(Outcome::Duplicate(_))) {
                    duplicates.fetch_add(1, Ordering::SeqCst);
                }
                out
            })
        }
    };
    let member = || {
        short_sessions(t.consumer.clone())
            .set("partition.assignment.strategy", "range,roundrobin")
            .revoke_grace(Duration::from_millis(500))
    };
    let first = start(member(), handler());
    t.send(Some("revoked-1"), &Points::payload("revoked-1", 3))
        .await;
    eventually(Duration::from_secs(30), "the SMS sent", || async {
        sent.load(Ordering::SeqCst) == 1
    })
    .await;
    let second = start(member(), handler());
    eventually(
        Duration::from_secs(60),
        "the message delivered again and answered the recorded outcome",
        || async { duplicates.load(Ordering::SeqCst) >= 1 },
    )
    .await;
    let (a, b) = (first.stop().await, second.stop().await);
    assert_eq!(
        sent.load(Ordering::SeqCst),
        1,
        "the SMS went once: {a:?} {b:?}"
    );
    assert!(
        a.rebalances >= 2,
        "the second member's arrival rebalanced the first: {a:?}"
    );
    assert_eq!(t.kafka.lag(&t.group, &t.all_topics()).await, 0);
}
