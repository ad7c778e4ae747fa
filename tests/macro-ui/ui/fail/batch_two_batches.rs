// A batch handler takes one batch: a key that reads two slices is refused.
use idem_runtime::idempotent;

#[derive(Clone)]
struct OrderPlaced {
    order_id: u64,
}

#[derive(Clone)]
struct Meta {
    tenant: String,
}

#[idempotent(key = "msgs.order_id + metas.tenant", ttl = "24h", store = "memory")]
async fn deduct_stock(msgs: &[OrderPlaced], metas: &[Meta]) -> Result<Vec<u64>, std::io::Error> {
    Ok(msgs.iter().map(|m| m.order_id + metas.len() as u64).collect())
}

fn main() {}
