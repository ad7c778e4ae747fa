// Quoted constants in the key, before and between field parts.
use idem_runtime::{Error, MemoryStore, Outcome, idempotent};

struct OrderPlaced {
    order_id: u64,
    sku: String,
}

#[idempotent(
    key = "'deduct' + order_id + 'sku' + sku",
    ttl = "24h",
    store = "memory"
)]
async fn deduct_stock(_msg: &OrderPlaced) -> Result<(), std::io::Error> {
    Ok(())
}

// Never run: it only has to compile against the rewritten signature.
async fn call(store: &MemoryStore) {
    let msg = OrderPlaced {
        order_id: 7,
        sku: "apple".into(),
    };
    let _: Result<Outcome<()>, Error<std::io::Error>> = deduct_stock(store, &msg).await;
}

fn main() {
    let _ = call;
}
