// A fingerprint field that the message does not have: rustc's own "no field"
// error, with its suggestion, lands on the fingerprint.
use idem_runtime::idempotent;

#[derive(serde::Serialize)]
struct OrderPlaced {
    order_id: u64,
    qty: u32,
    price: f64,
}

#[idempotent(key = "order_id", ttl = "24h", store = "memory", fingerprint = "qty + prise")]
async fn deduct_stock(msg: &OrderPlaced) -> Result<u32, std::io::Error> {
    Ok(msg.qty)
}

fn main() {}
