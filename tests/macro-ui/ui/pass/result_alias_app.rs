// A result alias under the application's own name: `AppResult<T>`.
use idem_runtime::{Error, MemoryStore, Outcome, idempotent};

#[derive(Debug)]
struct AppError;

type AppResult<T> = Result<T, AppError>;

struct OrderPlaced {
    order_id: u64,
}

#[idempotent(key = "order_id", ttl = "24h", store = "memory")]
async fn deduct_stock(msg: &OrderPlaced) -> AppResult<u64> {
    if msg.order_id == 0 {
        return Err(AppError);
    }
    Ok(msg.order_id)
}

// Never run: it only has to compile against the rewritten signature.
async fn call(store: &MemoryStore) {
    let msg = OrderPlaced { order_id: 7 };
    let _: Result<Outcome<u64>, Error<AppError>> = deduct_stock(store, &msg).await;
}

fn main() {
    let _ = call;
}
