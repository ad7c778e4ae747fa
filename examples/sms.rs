//! An SMS notification in lease mode that hands its own key to the sender.
//!
//! ```text
//! cargo run -p idem-examples --example sms
//! ```
//!
//! Sending an SMS is not a database write, so no transaction can undo it.
//! The handler runs in lease mode: the claim is a lease with a fencing token,
//! kept alive while the body runs, and the outcome (the gateway's message id)
//! is recorded when the body returns. The body passes its own idempotency key
//! to the gateway, so even a send that is retried after a crash between the
//! gateway's accept and idem's record is deduplicated by the gateway too.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use idem_examples::TempDb;
use idem_runtime::{Error, Key, Outcome, SqliteStore, idempotent};
use serde::{Deserialize, Serialize};

#[derive(Debug, Deserialize)]
struct OrderShipped {
    order_id: u64,
    phone: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct SmsReceipt {
    gateway_id: String,
}

#[derive(Debug, thiserror::Error)]
#[error("gateway unavailable")]
struct GatewayDown;

/// A local stand-in for an SMS provider's API: it accepts an
/// `Idempotency-Key` and counts what it really sends.
#[derive(Default)]
struct FakeGateway {
    sent: Mutex<HashMap<String, SmsReceipt>>,
    handsets: Mutex<Vec<String>>,
}

impl FakeGateway {
    async fn send(
        &self,
        idempotency_key: &str,
        phone: &str,
        text: &str,
    ) -> Result<SmsReceipt, GatewayDown> {
        tokio::time::sleep(Duration::from_millis(50)).await; // the network
        let mut sent = self.sent.lock().map_err(|_| GatewayDown)?;
        let n = sent.len();
        let receipt = sent
            .entry(idempotency_key.to_owned())
            .or_insert_with(|| {
                if let Ok(mut h) = self.handsets.lock() {
                    h.push(format!("{phone}: {text}"));
                }
                SmsReceipt {
                    gateway_id: format!("sms-{}", n + 1),
                }
            })
            .clone();
        Ok(receipt)
    }
}

struct Notifier {
    gateway: FakeGateway,
}

impl Notifier {
    /// Lease mode: no transaction parameter. `key` is this message's own
    /// idempotency key, derived by idem.
    #[idempotent(
        key = "'shipped' + order_id",
        ttl = "3d",
        store = "sqlite",
        lease = "10s"
    )]
    async fn notify_shipped(
        &self,
        msg: &OrderShipped,
        key: &Key,
    ) -> Result<SmsReceipt, GatewayDown> {
        let text = format!("Order {} is on its way", msg.order_id);
        self.gateway.send(key.as_str(), &msg.phone, &text).await
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let db = TempDb::new("sms");
    let store = SqliteStore::open(db.path()).await?;
    store.migrate().await?;
    let notifier = Notifier {
        gateway: FakeGateway::default(),
    };
    let msg = OrderShipped {
        order_id: 42,
        phone: "+15550100".into(),
    };

    // Two consumers get the same message at the same moment (a rebalance):
    // one sends, the other is told the message is in progress.
    let (a, b) = tokio::join!(
        notifier.notify_shipped(&store, &msg),
        notifier.notify_shipped(&store, &msg)
    );
    for (consumer, r) in [("A", a), ("B", b)] {
        match r {
            Ok(Outcome::Executed(r)) => println!("consumer {consumer}: sent, {}", r.gateway_id),
            Ok(Outcome::Duplicate(r)) => println!(
                "consumer {consumer}: duplicate, already sent as {}",
                r.gateway_id
            ),
            Err(Error::InProgress { retry_after, .. }) => {
                println!(
                    "consumer {consumer}: in progress elsewhere, nack and retry in {retry_after:?}"
                )
            }
            Err(e) => return Err(e.into()),
        }
    }
    // Later redeliveries get the recorded receipt.
    for n in 1..=3 {
        let r = notifier.notify_shipped(&store, &msg).await?;
        println!(
            "redelivery {n}: {} ({})",
            if r.is_duplicate() {
                "duplicate"
            } else {
                "executed"
            },
            r.into_inner().gateway_id
        );
    }

    let handsets = notifier
        .gateway
        .handsets
        .lock()
        .map_err(|_| "poisoned")?
        .clone();
    println!("SMS that reached the handset: {}", handsets.len());
    for sms in &handsets {
        println!("  {sms}");
    }
    assert_eq!(handsets.len(), 1);
    Ok(())
}
