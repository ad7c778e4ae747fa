// `fingerprint = "*"` fingerprints the whole message, which must then
// implement `serde::Serialize`.
use idem_runtime::idempotent;

struct OrderPlaced {
    order_id: u64,
    qty: u32,
}

#[idempotent(key = "order_id", ttl = "24h", store = "memory", fingerprint = "*")]
async fn deduct_stock(msg: &OrderPlaced) -> Result<u32, std::io::Error> {
    Ok(msg.qty)
}

// taken by value, the same
#[idempotent(key = "order_id", ttl = "24h", store = "memory", fingerprint = "*")]
async fn reserve(msg: OrderPlaced) -> Result<u32, std::io::Error> {
    Ok(msg.qty)
}

fn main() {}
