// A key path that starts with a name that is no parameter: the error names
// the parameters and suggests the nearest one.
use idem_runtime::idempotent;

struct OrderPlaced {
    order_id: u64,
}

struct Meta {
    tenant: String,
}

struct Account {
    id: u64,
}

#[idempotent(key = "m.order_id + meta.tenant", ttl = "24h", store = "memory")]
async fn deduct_stock(msg: &OrderPlaced, meta: &Meta) -> Result<usize, std::io::Error> {
    Ok(msg.order_id as usize + meta.tenant.len())
}

// `s` is as near to `src` as to `dst`; `dst` is taken by the other part
#[idempotent(key = "s.id + dst.id", ttl = "24h", store = "memory")]
async fn transfer(src: &Account, dst: &Account) -> Result<u64, std::io::Error> {
    Ok(src.id + dst.id)
}

// `order` is no slip of a parameter's name: perhaps a field
#[idempotent(key = "order.id + meta.tenant", ttl = "24h", store = "memory")]
async fn reserve(msg: &OrderPlaced, meta: &Meta) -> Result<usize, std::io::Error> {
    Ok(msg.order_id as usize + meta.tenant.len())
}

fn main() {}
