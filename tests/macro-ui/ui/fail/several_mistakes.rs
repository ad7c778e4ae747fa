// Every mistake of one attribute, and of the function under it, is reported
// in the same build.
use idem_runtime::idempotent;

struct OrderPlaced {
    order_id: u64,
}

#[idempotent(key = "", ttl = "24x", store = "postgresql")]
async fn deduct_stock(msg: &OrderPlaced) -> Result<u64, std::io::Error> {
    Ok(msg.order_id)
}

#[idempotent(key = "order_id +", tll = "24h", store = "memory", lease = "0s")]
fn grant_points(msg: &OrderPlaced) -> u64 {
    msg.order_id
}

fn main() {}
