// A one-argument `Result<T>` alias as the return type.
use idem_runtime::{Error, MemoryStore, Outcome, idempotent};

#[derive(Debug)]
struct AppError;

type Result<T> = std::result::Result<T, AppError>;

struct OrderPlaced {
    order_id: u64,
}

#[idempotent(key = "order_id", ttl = "24h", store = "memory")]
async fn deduct_stock(msg: &OrderPlaced) -> Result<u64> {
    if msg.order_id == 0 {
        return Err(AppError);
    }
    Ok(msg.order_id)
}

// Never run: it only has to compile against the rewritten signature.
async fn call(store: &MemoryStore) {
    let msg = OrderPlaced { order_id: 7 };
    let _: std::result::Result<Outcome<u64>, Error<AppError>> = deduct_stock(store, &msg).await;
}

fn main() {
    let _ = call;
}
