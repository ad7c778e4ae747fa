// The body type-checks against the written return type, and rustc's errors
// land in the body, not on the macro.
use idem_runtime::idempotent;

struct OrderPlaced {
    order_id: u64,
}

#[derive(Debug)]
struct OutOfStock;

#[idempotent(key = "order_id", ttl = "24h", store = "memory")]
async fn deduct_stock(msg: &OrderPlaced) -> Result<u64, OutOfStock> {
    let n: u64 = "17".parse()?;
    Ok(msg.order_id + n)
}

fn main() {}
