//! Order: one lane a partition (or a key), and commits that never pass a
//! message still running.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem_runtime::MemoryStore;
use idem_tests::or_skip;

use super::{BoxedCall, Seen, recording, start, topic};
use crate::common::broker::Points;
use crate::common::{broker, eventually};

/// One partition, one lane: the bodies run one at a time, in the order the
/// messages were published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_is_handled_in_order_one_message_at_a_time() {
    let t = or_skip!(topic("kafka_order", 1).await);
    let ids: Vec<String> = (0..30).map(|i| format!("o-{i}")).collect();
    for id in &ids {
        t.send(Some(id), &Points::payload(id, 1)).await;
    }
    let (store, seen) = (MemoryStore::new(), Arc::new(Seen::default()));
    let running = start(t.consumer.clone(), recording(&store, &seen));
    eventually(Duration::from_secs(20), "30 bodies", || async {
        seen.order().len() == 30
    })
    .await;
    let report = running.stop().await;
    assert_eq!(seen.order(), ids);
    assert_eq!(seen.most.load(Ordering::SeqCst), 1, "one body at a time");
    assert_eq!(report.acked, 30, "{report:?}");
    assert_eq!(t.main_lag().await, 0);
}

/// Lanes by key: bodies of one partition run side by side, and each key's
/// messages still run in their order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lanes_run_keys_side_by_side_each_in_order() {
    let t = or_skip!(topic("kafka_lanes", 1).await);
    let keys = ["a", "b", "c", "d"];
    for i in 0..10 {
        for k in keys {
            let id = format!("{k}-{i}");
            t.send(Some(k), &Points::payload(&id, 1)).await;
        }
    }
    let (store, seen) = (MemoryStore::new(), Arc::new(Seen::default()));
    let running = start(t.consumer.clone().lanes(8), recording(&store, &seen));
    eventually(Duration::from_secs(20), "40 bodies", || async {
        seen.order().len() == 40
    })
    .await;
    let report = running.stop().await;
    let order = seen.order();
    for k in keys {
        let of_key: Vec<&String> = order.iter().filter(|id| id.starts_with(k)).collect();
        let want: Vec<String> = (0..10).map(|i| format!("{k}-{i}")).collect();
        assert_eq!(of_key, want.iter().collect::<Vec<_>>(), "key {k} in order");
    }
    assert!(
        seen.most.load(Ordering::SeqCst) > 1,
        "bodies of one partition ran side by side"
    );
    assert_eq!(report.acked, 40, "{report:?}");
    assert_eq!(t.main_lag().await, 0);
}

/// With lanes, a later message can settle before an earlier one: the
/// commit stays at the earlier one until it settles.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_commit_never_passes_a_message_still_running() {
    let t = or_skip!(topic("kafka_commit", 1).await);
    t.send(Some("held"), &Points::payload("held", 1)).await;
    for i in 0..3 {
        t.send(Some("free"), &Points::payload(&format!("free-{i}"), 1))
            .await;
    }
    let release = Arc::new(tokio::sync::Notify::new());
    let done = Arc::new(AtomicUsize::new(0));
    let store = MemoryStore::new();
    let handler = {
        let (release, done) = (Arc::clone(&release), Arc::clone(&done));
        move |msg: Points| -> BoxedCall {
            let (store, release, done) = (store.clone(), Arc::clone(&release), Arc::clone(&done));
            Box::pin(async move {
                if msg.id == "held" {
                    release.notified().await;
                }
                let r = broker::grant(&store, &msg, &broker::Effects::default()).await;
                done.fetch_add(1, Ordering::SeqCst);
                r
            })
        }
    };
    let running = start(t.consumer.clone().lanes(4), handler);
    eventually(
        Duration::from_secs(20),
        "the three free messages",
        || async { done.load(Ordering::SeqCst) == 3 },
    )
    .await;
    // Several commit rounds (every 200 ms) pass: none goes past offset 0.
    tokio::time::sleep(Duration::from_millis(800)).await;
    let committed = t.kafka.committed(&t.group, &t.topic).await;
    assert!(
        matches!(committed.as_slice(), [(0, None)] | [(0, Some(0))]),
        "committed past a running message: {committed:?}"
    );
    release.notify_one();
    eventually(Duration::from_secs(20), "the commit at the end", || async {
        t.kafka.committed(&t.group, &t.topic).await == vec![(0, Some(4))]
    })
    .await;
    let report = running.stop().await;
    assert_eq!(report.acked, 4, "{report:?}");
}
