use idem_runtime::idempotent;

#[derive(serde::Serialize)]
struct OrderPlaced {
    order_id: u64,
    qty: u32,
}

#[idempotent(key = "order_id", ttl = "24h", store = "memory", fingerprint = "qty", fingerprint = "*")]
async fn deduct_stock(msg: &OrderPlaced) -> Result<u32, std::io::Error> {
    Ok(msg.qty)
}

fn main() {}
