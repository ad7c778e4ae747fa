// A `&self` method: the store follows `self` in the rewritten signature.
use idem_runtime::{Error, MemoryStore, Outcome, idempotent};

struct OrderPlaced {
    order_id: u64,
}

struct Inventory {
    warehouse: u64,
}

impl Inventory {
    #[idempotent(key = "order_id", ttl = "24h", store = "memory")]
    async fn deduct_stock(&self, msg: &OrderPlaced) -> Result<u64, std::io::Error> {
        Ok(self.warehouse + msg.order_id)
    }
}

// Never run: it only has to compile against the rewritten signature.
async fn call(store: &MemoryStore) {
    let inventory = Inventory { warehouse: 1 };
    let msg = OrderPlaced { order_id: 7 };
    let _: Result<Outcome<u64>, Error<std::io::Error>> = inventory.deduct_stock(store, &msg).await;
}

fn main() {
    let _ = call;
}
