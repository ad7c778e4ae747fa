// An alias with no type argument at all names the whole `Result`.
use idem_runtime::{Error, MemoryStore, Outcome, idempotent};

#[derive(Debug)]
struct AppError;

type Handled = Result<u64, AppError>;

struct OrderPlaced {
    order_id: u64,
}

#[idempotent(key = "order_id", ttl = "24h", store = "memory")]
async fn deduct_stock(msg: &OrderPlaced) -> Handled {
    if msg.order_id == 0 {
        return Err(AppError);
    }
    Ok(msg.order_id)
}

// `std::fmt::Result` is such an alias too: `Ok(())` is recorded.
#[idempotent(key = "order_id", ttl = "24h", store = "memory")]
async fn render(msg: &OrderPlaced) -> std::fmt::Result {
    let _ = msg.order_id;
    Ok(())
}

// Never run: it only has to compile against the rewritten signature.
async fn call(store: &MemoryStore) {
    let msg = OrderPlaced { order_id: 7 };
    let _: Result<Outcome<u64>, Error<AppError>> = deduct_stock(store, &msg).await;
    let _: Result<Outcome<()>, Error<std::fmt::Error>> = render(store, &msg).await;
}

fn main() {
    let _ = call;
}
