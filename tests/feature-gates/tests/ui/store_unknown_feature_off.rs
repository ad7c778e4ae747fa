// idem-runtime with default features off: an unknown or missing store lists
// only the memory store, and a slip names the feature the store needs.
use idem_runtime::idempotent;

struct OrderPlaced {
    order_id: u64,
}

#[idempotent(key = "order_id", ttl = "24h", store = "mongodb")]
async fn unknown(msg: &OrderPlaced) -> Result<u64, std::io::Error> {
    Ok(msg.order_id)
}

#[idempotent(key = "order_id", ttl = "24h")]
async fn missing(msg: &OrderPlaced) -> Result<u64, std::io::Error> {
    Ok(msg.order_id)
}

#[idempotent(key = "order_id", ttl = "24h", store = "Postgres")]
async fn slip(msg: &OrderPlaced) -> Result<u64, std::io::Error> {
    Ok(msg.order_id)
}

fn main() {}
