// Several message parameters: each key path starts with its parameter's name.
use idem_runtime::{Error, MemoryStore, Outcome, idempotent};

struct OrderPlaced {
    order_id: u64,
}

struct Meta {
    tenant: String,
}

#[idempotent(key = "msg.order_id + meta.tenant", ttl = "24h", store = "memory")]
async fn deduct_stock(msg: &OrderPlaced, meta: &Meta) -> Result<String, std::io::Error> {
    Ok(format!("{}/{}", meta.tenant, msg.order_id))
}

// Never run: it only has to compile against the rewritten signature.
async fn call(store: &MemoryStore) {
    let msg = OrderPlaced { order_id: 7 };
    let meta = Meta {
        tenant: "acme".into(),
    };
    let _: Result<Outcome<String>, Error<std::io::Error>> = deduct_stock(store, &msg, &meta).await;
}

fn main() {
    let _ = call;
}
