// An alias whose error type is a defaulted parameter, as `anyhow::Result<T>`
// is (`type Result<T, E = anyhow::Error>`): written with one argument.
// `pub` items in private modules, as users write them.
#![allow(unreachable_pub)]
use idem_runtime::{Error, MemoryStore, Outcome, idempotent};

mod anyhow {
    #[derive(Debug)]
    pub struct Error;

    pub type Result<T, E = Error> = core::result::Result<T, E>;
}

struct OrderPlaced {
    order_id: u64,
}

#[idempotent(key = "order_id", ttl = "24h", store = "memory")]
async fn deduct_stock(msg: &OrderPlaced) -> anyhow::Result<u64> {
    if msg.order_id == 0 {
        return Err(anyhow::Error);
    }
    Ok(msg.order_id)
}

// Never run: it only has to compile against the rewritten signature.
async fn call(store: &MemoryStore) {
    let msg = OrderPlaced { order_id: 7 };
    let _: Result<Outcome<u64>, Error<anyhow::Error>> = deduct_stock(store, &msg).await;
}

fn main() {
    let _ = call;
}
