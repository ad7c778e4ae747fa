// With one message parameter, key paths start at its fields: `order_id`, not
// `msg.order_id` (which reads a field `msg` of the message).
use idem_runtime::idempotent;

struct OrderPlaced {
    order_id: u64,
}

#[idempotent(key = "msg.order_id", ttl = "24h", store = "memory")]
async fn deduct_stock(msg: &OrderPlaced) -> Result<u64, std::io::Error> {
    Ok(msg.order_id)
}

fn main() {}
