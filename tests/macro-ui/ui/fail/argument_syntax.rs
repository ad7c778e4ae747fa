// Arguments are `name = "value"` pairs.
use idem_runtime::idempotent;

struct OrderPlaced {
    order_id: u64,
}

// a bare value, without its name
#[idempotent("order_id", ttl = "24h", store = "memory")]
async fn positional(msg: &OrderPlaced) -> Result<u64, std::io::Error> {
    Ok(msg.order_id)
}

// a name without `=`
#[idempotent(key "order_id", ttl = "24h", store = "memory")]
async fn no_equals(msg: &OrderPlaced) -> Result<u64, std::io::Error> {
    Ok(msg.order_id)
}

fn main() {}
