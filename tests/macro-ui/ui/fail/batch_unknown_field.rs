// A batch handler's key reads each message: a field the element type does
// not have is rustc's own "no field" error on the key, naming that type.
use idem_runtime::idempotent;

#[derive(Clone)]
struct OrderPlaced {
    order_id: u64,
}

#[idempotent(key = "ordr_id", ttl = "24h", store = "memory")]
async fn deduct_stock(msgs: &[OrderPlaced]) -> Result<Vec<u64>, std::io::Error> {
    Ok(msgs.iter().map(|m| m.order_id).collect())
}

#[idempotent(key = "order_id", ttl = "24h", store = "memory", fingerprint = "qty")]
async fn priced(msgs: &[OrderPlaced]) -> Result<Vec<u64>, std::io::Error> {
    Ok(msgs.iter().map(|m| m.order_id).collect())
}

fn main() {}
