// A key field that the message does not have: rustc's own "no field" error,
// with its "a field with a similar name exists" suggestion, lands on the key.
use idem_runtime::idempotent;

struct OrderPlaced {
    order_id: u64,
    sku: String,
}

#[idempotent(key = "ordr_id", ttl = "24h", store = "memory")]
async fn deduct_stock(msg: &OrderPlaced) -> Result<u64, std::io::Error> {
    Ok(msg.order_id)
}

#[idempotent(key = "order_id + skus", ttl = "24h", store = "memory")]
async fn reserve(msg: &OrderPlaced) -> Result<usize, std::io::Error> {
    Ok(msg.sku.len())
}

fn main() {}
