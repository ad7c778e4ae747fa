// The fingerprint's grammar is the key's, or `*` alone; its errors name the
// fingerprint.
use idem_runtime::idempotent;

#[derive(serde::Serialize)]
struct OrderPlaced {
    order_id: u64,
    qty: u32,
    price: f64,
}

#[idempotent(key = "order_id", ttl = "24h", store = "memory", fingerprint = "qty + *")]
async fn deduct_stock(msg: &OrderPlaced) -> Result<u32, std::io::Error> {
    Ok(msg.qty)
}

#[idempotent(key = "order_id", ttl = "24h", store = "memory", fingerprint = "qty price")]
async fn reserve(msg: &OrderPlaced) -> Result<u32, std::io::Error> {
    Ok(msg.qty)
}

// a constant is the same in every delivery: it compares nothing
#[idempotent(key = "order_id", ttl = "24h", store = "memory", fingerprint = "'v2' + price")]
async fn bill(msg: &OrderPlaced) -> Result<f64, std::io::Error> {
    Ok(msg.price)
}

fn main() {}
