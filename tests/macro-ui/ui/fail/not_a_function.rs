use idem_runtime::idempotent;

#[idempotent(key = "order_id", ttl = "24h", store = "memory")]
struct OrderPlaced {
    order_id: u64,
}

fn main() {}
