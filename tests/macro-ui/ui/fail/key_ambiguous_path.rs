// With two message parameters a key path must start with the parameter's name.
use idem_runtime::idempotent;

struct OrderPlaced {
    order_id: u64,
}

struct Meta {
    tenant: String,
}

#[idempotent(key = "order_id + meta.tenant", ttl = "24h", store = "memory")]
async fn deduct_stock(msg: &OrderPlaced, meta: &Meta) -> Result<usize, std::io::Error> {
    Ok(msg.order_id as usize + meta.tenant.len())
}

// a misspelt parameter name
#[idempotent(key = "mgs.order_id + meta.tenant", ttl = "24h", store = "memory")]
async fn reserve(msg: &OrderPlaced, meta: &Meta) -> Result<usize, std::io::Error> {
    Ok(msg.order_id as usize + meta.tenant.len())
}

fn main() {}
