// Key paths through nested structs and tuple fields.
use idem_runtime::{Error, MemoryStore, Outcome, idempotent};

struct Order {
    id: u64,
}

struct OrderPlaced {
    order: Order,
    items: (String, u32),
}

#[idempotent(key = "order.id + items.0 + items.1", ttl = "24h", store = "memory")]
async fn deduct_stock(msg: &OrderPlaced) -> Result<u64, std::io::Error> {
    Ok(msg.order.id)
}

// Never run: it only has to compile against the rewritten signature.
async fn call(store: &MemoryStore) {
    let msg = OrderPlaced {
        order: Order { id: 7 },
        items: ("apple".into(), 3),
    };
    let _: Result<Outcome<u64>, Error<std::io::Error>> = deduct_stock(store, &msg).await;
}

fn main() {
    let _ = call;
}
