// A user newtype becomes a key part by implementing `KeyPart`.
use idem_runtime::{Error, KeyMissing, KeyPart, MemoryStore, Outcome, PartWriter, idempotent};

struct OrderId(u64);

impl KeyPart for OrderId {
    fn write_key_part(&self, out: &mut PartWriter<'_>) -> Result<(), KeyMissing> {
        self.0.write_key_part(out)
    }
}

struct OrderPlaced {
    order_id: OrderId,
}

#[idempotent(key = "order_id", ttl = "24h", store = "memory")]
async fn deduct_stock(msg: &OrderPlaced) -> Result<u64, std::io::Error> {
    Ok(msg.order_id.0)
}

// Never run: it only has to compile against the rewritten signature.
async fn call(store: &MemoryStore) {
    let msg = OrderPlaced {
        order_id: OrderId(7),
    };
    let _: Result<Outcome<u64>, Error<std::io::Error>> = deduct_stock(store, &msg).await;
}

fn main() {
    let _ = call;
}
