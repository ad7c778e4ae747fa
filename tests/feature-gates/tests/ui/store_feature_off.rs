// idem-runtime with default features off: only the memory store is there.
use idem_runtime::idempotent;

struct OrderPlaced {
    order_id: u64,
}

#[idempotent(key = "order_id", ttl = "24h", store = "sqlite")]
async fn embedded(msg: &OrderPlaced) -> Result<u64, std::io::Error> {
    Ok(msg.order_id)
}

#[idempotent(key = "order_id", ttl = "24h", store = "postgres")]
async fn relational(msg: &OrderPlaced) -> Result<u64, std::io::Error> {
    Ok(msg.order_id)
}

#[idempotent(key = "order_id", ttl = "24h", store = "mysql")]
async fn maria(msg: &OrderPlaced) -> Result<u64, std::io::Error> {
    Ok(msg.order_id)
}

#[idempotent(key = "order_id", ttl = "24h", store = "redis")]
async fn cache(msg: &OrderPlaced) -> Result<u64, std::io::Error> {
    Ok(msg.order_id)
}

#[idempotent(key = "order_id", ttl = "24h", store = "memory")]
async fn fine(msg: &OrderPlaced) -> Result<u64, std::io::Error> {
    Ok(msg.order_id)
}

fn main() {}
