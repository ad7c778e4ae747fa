// A store whose cargo feature of idem-runtime is off. (This package enables
// `sqlite` and `postgres`; keep this file on stores it does not enable.)
use idem_runtime::idempotent;

struct OrderPlaced {
    order_id: u64,
}

#[idempotent(key = "order_id", ttl = "24h", store = "mysql")]
async fn deduct_stock(msg: &OrderPlaced) -> Result<u64, std::io::Error> {
    Ok(msg.order_id)
}

#[idempotent(key = "order_id", ttl = "24h", store = "redis")]
async fn notify(msg: &OrderPlaced) -> Result<u64, std::io::Error> {
    Ok(msg.order_id)
}

fn main() {}
