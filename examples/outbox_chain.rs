//! The outbox, end to end: order → stock → notification, on the embedded
//! SQLite store and NATS JetStream (`NATS_URL`, default
//! `nats://127.0.0.1:4222`).
//!
//! ```sh
//! cargo run -p idem-examples --features nats --example outbox_chain
//! ```
//!
//! * The order service (not a handler) writes each order and stages
//!   `OrderPlaced` in one transaction (`store.outbox`, `Outbox::commit`).
//!   It retries one order as a client that timed out would: the same key,
//!   so the same message id, which JetStream's duplicate window drops.
//! * `deduct_stock`, a transaction-mode handler behind a consumer of
//!   `orders`, deducts the stock and stages `StockDeducted` in its own
//!   transaction; the relay publishes it after the commit.
//! * `notify`, behind a consumer of `stock`, is keyed on the message id the
//!   broker carried (`delivery.id`); one `StockDeducted` is published twice
//!   (as by a relay that died after the broker's confirm), and the second
//!   is turned away.
//!
//! One relay publishes the SQLite outbox's rows to NATS. The run ends when
//! every order's notification went out, and checks that each order took
//! stock once and was notified once.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use idem_examples::TempDb;
use idem_runtime::consume::{CancellationToken, Delivery, nats::Consumer};
use idem_runtime::outbox::{Destination, Message, NatsDestination, Outbox, Relay};
use idem_runtime::{BoxError, SqliteStore, SqliteTx, idempotent};
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize)]
struct OrderPlaced {
    order_id: u64,
    sku: String,
    qty: i64,
}

#[derive(Debug, Serialize, Deserialize)]
struct StockDeducted {
    order_id: u64,
    sku: String,
    left: i64,
}

/// How many notifications went out.
static NOTIFIED: AtomicU64 = AtomicU64::new(0);

#[idempotent(key = "msg.order_id", ttl = "1d", store = "sqlite")]
async fn deduct_stock(
    tx: &mut SqliteTx<'_>,
    msg: &OrderPlaced,
    outbox: &mut Outbox,
    stock: &Subjects,
) -> Result<i64, BoxError> {
    let left: i64 =
        sqlx::query_scalar("UPDATE stock SET qty = qty - ?1 WHERE sku = ?2 RETURNING qty")
            .bind(msg.qty)
            .bind(&msg.sku)
            .fetch_one(&mut **tx)
            .await?;
    let deducted = StockDeducted {
        order_id: msg.order_id,
        sku: msg.sku.clone(),
        left,
    };
    outbox
        .stage(
            tx,
            Message::json(&stock.stock, &deducted)?.key(msg.sku.as_str()),
        )
        .await?;
    Ok(left)
}

/// Lease mode: the SMS gateway is outside the database. Keyed on the id
/// the relay gave the message, which the broker carried.
#[idempotent(key = "delivery.id", ttl = "1d", store = "sqlite", lease = "10s")]
async fn notify(msg: &StockDeducted, delivery: &Delivery) -> Result<(), BoxError> {
    NOTIFIED.fetch_add(1, Ordering::Relaxed);
    println!(
        "  sms: order {} took {}, {} left (message {})",
        msg.order_id,
        msg.sku,
        msg.left,
        delivery.id.as_deref().unwrap_or("-")
    );
    Ok(())
}

/// The run's subjects and streams, of its own.
struct Subjects {
    orders: String,
    stock: String,
    orders_stream: String,
    stock_stream: String,
}

/// Writes order `n` and stages its `OrderPlaced`, in one transaction.
async fn place_order(store: &SqliteStore, subjects: &Subjects, n: u64) -> Result<(), BoxError> {
    let order = OrderPlaced {
        order_id: n,
        sku: if n.is_multiple_of(2) { "apple" } else { "pear" }.into(),
        qty: 1,
    };
    let mut tx = store.pool().begin().await?;
    sqlx::query("INSERT INTO orders (id, sku) VALUES (?1, ?2) ON CONFLICT (id) DO NOTHING")
        .bind(i64::try_from(n)?)
        .bind(&order.sku)
        .execute(&mut *tx)
        .await?;
    let mut outbox = store.outbox("order_service", &n.to_string());
    outbox
        .stage(
            &mut tx,
            Message::json(&subjects.orders, &order)?.key(order.sku.as_str()),
        )
        .await?;
    outbox.commit(tx).await?;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let url = std::env::var("NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into());
    let run = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();
    let subjects = Arc::new(Subjects {
        orders: format!("chain.{run}.orders"),
        stock: format!("chain.{run}.stock"),
        orders_stream: format!("CHAIN_{run}_ORDERS"),
        stock_stream: format!("CHAIN_{run}_STOCK"),
    });

    let db = TempDb::new("outbox_chain");
    let store = SqliteStore::open(db.path()).await?;
    store.migrate().await?;
    sqlx::query("CREATE TABLE stock (sku TEXT PRIMARY KEY, qty INTEGER NOT NULL)")
        .execute(store.pool())
        .await?;
    sqlx::query("INSERT INTO stock VALUES ('apple', 100), ('pear', 100)")
        .execute(store.pool())
        .await?;
    sqlx::query("CREATE TABLE orders (id INTEGER PRIMARY KEY, sku TEXT NOT NULL)")
        .execute(store.pool())
        .await?;

    // The streams first: what the relay publishes has a stream to go to.
    let orders = Consumer::new(
        url.as_str(),
        subjects.orders_stream.as_str(),
        subjects.orders.as_str(),
    );
    let stock = Consumer::new(
        url.as_str(),
        subjects.stock_stream.as_str(),
        subjects.stock.as_str(),
    );
    orders.declare().await?;
    stock.declare().await?;
    let streams = [
        subjects.orders_stream.clone(),
        orders.dead_letter_stream(),
        subjects.stock_stream.clone(),
        stock.dead_letter_stream(),
    ];

    let stop = CancellationToken::new();
    let relay = tokio::spawn(
        Relay::new(store.outbox_table(), NatsDestination::connect(&url).await?)
            .run(stop.clone().cancelled_owned()),
    );
    let deducting = {
        let (store, subjects) = (store.clone(), Arc::clone(&subjects));
        tokio::spawn(orders.run(
            move |msg: OrderPlaced| {
                let (store, subjects) = (store.clone(), Arc::clone(&subjects));
                async move { deduct_stock(&store, &msg, &subjects).await }
            },
            stop.clone(),
        ))
    };
    let notifying = {
        let store = store.clone();
        tokio::spawn(stock.run(
            move |msg: StockDeducted, delivery: Delivery| {
                let store = store.clone();
                async move { notify(&store, &msg, &delivery).await }
            },
            stop.clone(),
        ))
    };

    const ORDERS: u64 = 10;
    println!("placing {ORDERS} orders; order 3 is placed twice (a client's retry)");
    for n in 0..ORDERS {
        place_order(&store, &subjects, n).await?;
    }
    place_order(&store, &subjects, 3).await?;

    // A relay that died after the broker's confirm and before its delete
    // publishes a row again: here, by hand, once the first StockDeducted
    // is staged.
    let began = Instant::now();
    let again = loop {
        let rows = store.outbox_table().list(0, 100).await?;
        if let Some(row) = rows.into_iter().find(|r| r.destination == subjects.stock) {
            break row;
        }
        if began.elapsed() > Duration::from_secs(30) {
            return Err("no StockDeducted was staged within 30 s".into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };

    while NOTIFIED.load(Ordering::Relaxed) < ORDERS {
        if began.elapsed() > Duration::from_secs(60) {
            return Err("the notifications did not all go out within 60 s".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!(
        "publishing message {} again, as a relay that died after the confirm would",
        again.id
    );
    NatsDestination::connect(&url)
        .await?
        .publish(&again)
        .await?;
    tokio::time::sleep(Duration::from_millis(500)).await;

    stop.cancel();
    let _ = relay.await;
    let (deducted, notified) = (deducting.await??, notifying.await??);
    let orders: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM orders")
        .fetch_one(store.pool())
        .await?;
    let left: i64 = sqlx::query_scalar("SELECT SUM(qty) FROM stock")
        .fetch_one(store.pool())
        .await?;
    println!(
        "{orders} orders, {} units deducted, {} notifications; the order consumer acked {} ({} duplicates), the notifier {} ({} duplicates)",
        200 - left,
        NOTIFIED.load(Ordering::Relaxed),
        deducted.acked,
        deducted.duplicates,
        notified.acked,
        notified.duplicates,
    );

    let client = async_nats::connect(&url).await?;
    let js = async_nats::jetstream::new(client);
    for stream in &streams {
        let _ = js.delete_stream(stream).await;
    }
    let ok = u64::try_from(orders)? == ORDERS
        && 200 - left == i64::try_from(ORDERS)?
        && NOTIFIED.load(Ordering::Relaxed) == ORDERS;
    if !ok {
        return Err("an order took effect other than once".into());
    }
    println!("each order took stock once and was notified once");
    Ok(())
}
