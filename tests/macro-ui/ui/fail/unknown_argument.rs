use idem_runtime::idempotent;

struct OrderPlaced {
    order_id: u64,
}

#[idempotent(key = "order_id", ttl = "24h", store = "memory", retries = 3)]
async fn deduct_stock(msg: &OrderPlaced) -> Result<u64, std::io::Error> {
    Ok(msg.order_id)
}

fn main() {}
