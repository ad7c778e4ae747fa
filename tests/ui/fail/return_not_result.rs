// The handler's result decides what is recorded: it must be a `Result`.
use idem_runtime::idempotent;

struct OrderPlaced {
    order_id: u64,
}

#[idempotent(key = "order_id", ttl = "24h", store = "memory")]
async fn deduct_stock(msg: &OrderPlaced) -> u64 {
    msg.order_id
}

// `Result` is recognized by name, so an alias must keep that name
type AppResult<T> = Result<T, std::io::Error>;

#[idempotent(key = "order_id", ttl = "24h", store = "memory")]
async fn reserve(msg: &OrderPlaced) -> AppResult<u64> {
    Ok(msg.order_id)
}

// `fmt::Result` has no `Ok` type to record
#[idempotent(key = "order_id", ttl = "24h", store = "memory")]
async fn render(msg: &OrderPlaced) -> std::fmt::Result {
    let _ = msg.order_id;
    Ok(())
}

fn main() {}
