// With several messages, a fingerprint path starts with a parameter's name,
// as a key path does; a keyword is no field name.
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

#[idempotent(key = "msg.order_id", ttl = "24h", store = "memory", fingerprint = "m.qty + meta.tenant")]
async fn deduct_stock(msg: &OrderPlaced, meta: &Meta) -> Result<usize, std::io::Error> {
    Ok(meta.tenant.len())
}

#[idempotent(key = "msg.order_id", ttl = "24h", store = "memory", fingerprint = "qty")]
async fn reserve(msg: &OrderPlaced, meta: &Meta) -> Result<usize, std::io::Error> {
    Ok(meta.tenant.len())
}

#[idempotent(key = "order_id", ttl = "24h", store = "memory", fingerprint = "self.qty")]
async fn bill(msg: &OrderPlaced) -> Result<u32, std::io::Error> {
    Ok(msg.qty)
}

fn main() {}
