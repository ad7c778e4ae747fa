// A store named by its path must be a store of the handler's mode.
use idem_runtime::idempotent;

struct NotAStore;

struct OrderPlaced {
    order_id: u64,
}

#[idempotent(key = "order_id", ttl = "24h", store = "crate::NotAStore")]
async fn notify(msg: &OrderPlaced) -> Result<u64, std::io::Error> {
    Ok(msg.order_id)
}

#[idempotent(key = "order_id", ttl = "24h", store = "idem_runtime::MemoryStore")]
async fn deduct(tx: &mut idem_runtime::SqliteTx<'_>, msg: &OrderPlaced) -> Result<u64, std::io::Error> {
    let _ = tx;
    Ok(msg.order_id)
}

fn main() {}
