// The handler's result decides what is recorded: it must be a `Result`.
use idem_runtime::idempotent;

struct OrderPlaced {
    order_id: u64,
}

// surely not a `Result`: refused by the macro
#[idempotent(key = "order_id", ttl = "24h", store = "memory")]
async fn deduct_stock(msg: &OrderPlaced) -> (u64, bool) {
    (msg.order_id, true)
}

#[idempotent(key = "order_id", ttl = "24h", store = "memory")]
async fn reserve(msg: &OrderPlaced) -> impl std::fmt::Debug {
    msg.order_id
}

fn main() {}
