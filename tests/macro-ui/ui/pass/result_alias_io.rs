// A library's one-argument alias, named by its module: `io::Result<T>`.
use std::io;

use idem_runtime::{Error, MemoryStore, Outcome, idempotent};

struct OrderPlaced {
    order_id: u64,
}

#[idempotent(key = "order_id", ttl = "24h", store = "memory")]
async fn deduct_stock(msg: &OrderPlaced) -> io::Result<u64> {
    Ok(msg.order_id)
}

// Never run: it only has to compile against the rewritten signature.
async fn call(store: &MemoryStore) {
    let msg = OrderPlaced { order_id: 7 };
    let _: Result<Outcome<u64>, Error<io::Error>> = deduct_stock(store, &msg).await;
}

fn main() {
    let _ = call;
}
