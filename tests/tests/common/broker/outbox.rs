//! The outbox across a real broker hop: what a producer staged reaches an
//! idem consumer with its id in the broker's own field, and a second
//! publish of one id (a relay that died after the broker's confirm and
//! before its delete) takes effect once.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_runtime::consume::{Delivery, Policy};
use idem_runtime::outbox::{Destination, Message, MessageId, Relay};
use idem_runtime::{MemoryStore, SqliteStore, idempotent};

use super::{Broker, Effects, Points};
use crate::common::{AppError, eventually};

/// What the consumer saw of a delivery: the message, its id, its tenant.
type SeenDelivery = (String, Option<String>, Option<String>);

/// Keyed on the producer's id, as the broker carried it.
#[idempotent(
    key = "delivery.id",
    ttl = "1h",
    store = "memory",
    name = "outbox_downstream"
)]
async fn downstream(msg: &Points, delivery: &Delivery, effects: &Effects) -> Result<u32, AppError> {
    effects.apply(&msg.id);
    Ok(msg.points)
}

/// Six messages in two lanes, staged by a producer on SQLite and relayed;
/// each published again by hand. The consumer (one call at a time) runs
/// each body once, is told each message's staged id, sees each lane in
/// staged order, and turns every repeat away (JetStream's duplicate window
/// drops them before any consumer sees them).
pub(crate) async fn staged_messages_arrive_once_under_their_ids<B: Broker>(b: &B) {
    let dir = tempfile::tempdir().expect("a temp dir");
    let store = SqliteStore::open(dir.path().join("producer.db"))
        .await
        .expect("open");
    store.migrate().await.expect("migrate");
    let mut staged: Vec<(String, MessageId)> = Vec::new();
    for (call, lane) in [("o-1", "red"), ("o-2", "blue")] {
        let mut tx = store.pool().begin().await.expect("begin");
        let mut outbox = store.outbox("orders_route", call);
        for n in 0..3 {
            let id = format!("{call}-{n}");
            let m = Message::new(b.source(), Points::payload(&id, n + 1))
                .lane(lane)
                .header("tenant", "acme");
            staged.push((id, outbox.stage(&mut tx, m).await.expect("stage")));
        }
        outbox.commit(tx).await.expect("commit");
    }
    let rows = store.outbox_table().list(0, 100).await.expect("list");
    assert_eq!(rows.len(), 6);

    let to = b.destination().await;
    let relay = Relay::new(store.outbox_table(), b.destination().await);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while store.outbox_table().backlog().await.expect("backlog").rows > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the relay did not publish every row in 30 s"
        );
        let pass = relay.pass().await.expect("a pass");
        assert_eq!(pass.failed, 0, "{pass:?}");
    }
    // A relay that died between the confirm and the delete: the same rows
    // again, the same ids.
    for row in &rows {
        to.publish(row).await.expect("publish again");
    }

    let (memory, effects) = (MemoryStore::new(), Arc::new(Effects::default()));
    let seen: Arc<Mutex<Vec<SeenDelivery>>> = Arc::default();
    let policy = Policy {
        concurrency: 1,
        ..Policy::default()
    };
    let running = {
        let (effects, seen) = (Arc::clone(&effects), Arc::clone(&seen));
        b.start_with_delivery(policy, move |msg: Points, delivery: Delivery| {
            let (memory, effects, seen) = (memory.clone(), Arc::clone(&effects), Arc::clone(&seen));
            async move {
                let tenant = delivery.header("tenant").map(str::to_owned);
                seen.lock()
                    .unwrap()
                    .push((msg.id.clone(), delivery.id.clone(), tenant));
                downstream(&memory, &msg, &delivery, &effects).await
            }
        })
    };
    let deliveries = if B::DROPS_REPEATED_IDS { 6 } else { 12 };
    eventually(Duration::from_secs(30), "every delivery", || async {
        seen.lock().unwrap().len() >= deliveries
    })
    .await;
    // Anything past what was expected would arrive now.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let report = running.stop().await;

    for (id, _) in &staged {
        assert_eq!(effects.of(id), 1, "{id}");
    }
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), deliveries, "{seen:?}");
    assert_eq!(report.duplicates, deliveries as u64 - 6, "{report:?}");
    for (msg, id, tenant) in &seen {
        let staged_id = &staged.iter().find(|(m, _)| m == msg).expect("staged").1;
        assert_eq!(id.as_deref(), Some(staged_id.as_str()), "{msg}");
        assert_eq!(tenant.as_deref(), Some("acme"), "{msg}");
    }
    // Each lane's first deliveries in staged order.
    for call in ["o-1", "o-2"] {
        let firsts: Vec<&str> = seen
            .iter()
            .map(|(m, _, _)| m.as_str())
            .filter(|m| m.starts_with(call))
            .take(3)
            .collect();
        assert_eq!(
            firsts,
            [
                format!("{call}-0"),
                format!("{call}-1"),
                format!("{call}-2")
            ]
        );
    }
}
