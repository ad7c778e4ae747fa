// A path return type is taken for a `Result` alias; when it is not one,
// rustc says so on the type, once.
use idem_runtime::{MemoryStore, SqliteTx, idempotent};

struct OrderPlaced {
    order_id: u64,
}

#[idempotent(key = "order_id", ttl = "24h", store = "memory")]
async fn deduct_stock(msg: &OrderPlaced) -> Option<u64> {
    Some(msg.order_id)
}

#[idempotent(key = "order_id", ttl = "24h", store = "memory")]
async fn reserve(msg: &OrderPlaced) -> u64 {
    msg.order_id
}

type Reserved = Option<u64>;

#[idempotent(key = "order_id", ttl = "24h", store = "memory")]
async fn release(msg: &OrderPlaced) -> Reserved {
    Some(msg.order_id)
}

// transaction mode
#[idempotent(key = "order_id", ttl = "24h", store = "sqlite")]
async fn restock(tx: &mut SqliteTx<'_>, msg: &OrderPlaced) -> Option<u64> {
    let _ = tx;
    Some(msg.order_id)
}

// Never run: callers written for the rewritten signature.
async fn call(store: &MemoryStore) -> Result<(), Box<dyn std::error::Error>> {
    let msg = OrderPlaced { order_id: 7 };
    let _ = deduct_stock(store, &msg).await;
    let _ = reserve(store, &msg).await;
    let _ = release(store, &msg).await;
    Ok(())
}

fn main() {
    let _ = call;
}
