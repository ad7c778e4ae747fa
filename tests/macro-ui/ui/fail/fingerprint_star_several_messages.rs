// With several messages, `*` does not say which: name the parts.
use idem_runtime::idempotent;

#[derive(serde::Serialize)]
struct OrderPlaced {
    order_id: u64,
    qty: u32,
}

#[derive(serde::Serialize)]
struct Meta {
    tenant: String,
}

#[idempotent(key = "msg.order_id", ttl = "24h", store = "memory", fingerprint = "*")]
async fn deduct_stock(msg: &OrderPlaced, meta: &Meta) -> Result<u32, std::io::Error> {
    Ok(msg.qty + meta.tenant.len() as u32)
}

fn main() {}
