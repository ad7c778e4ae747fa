// The macro reads `max_attempts` at compile time: a constant's name or an
// expression cannot stand for it, nor can a suffix that the count overflows.
use idem_runtime::idempotent;

const ATTEMPTS: u32 = 5;

struct OrderPlaced {
    order_id: u64,
}

#[idempotent(key = "order_id", ttl = "24h", store = "memory", max_attempts = ATTEMPTS)]
async fn deduct_stock(msg: &OrderPlaced) -> Result<u64, std::io::Error> {
    Ok(msg.order_id + u64::from(ATTEMPTS))
}

#[idempotent(key = "order_id", ttl = "24h", store = "memory", max_attempts = 300u8)]
async fn reserve(msg: &OrderPlaced) -> Result<u64, std::io::Error> {
    Ok(msg.order_id)
}

#[idempotent(key = "order_id", ttl = "24h", store = "memory", max_attempts = "five")]
async fn bill(msg: &OrderPlaced) -> Result<u64, std::io::Error> {
    Ok(msg.order_id)
}

fn main() {}
