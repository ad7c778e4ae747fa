// Key syntax mistakes other than an empty key or a trailing `+`.
use idem_runtime::idempotent;

struct OrderPlaced {
    order_id: u64,
    sku: String,
}

// a constant in double quotes
#[idempotent(key = r#""deduct" + order_id"#, ttl = "24h", store = "memory")]
async fn double_quoted(msg: &OrderPlaced) -> Result<u64, std::io::Error> {
    Ok(msg.order_id)
}

// parts not joined by `+`
#[idempotent(key = "order_id, sku", ttl = "24h", store = "memory")]
async fn comma(msg: &OrderPlaced) -> Result<usize, std::io::Error> {
    Ok(msg.sku.len())
}

// a path ending in `.`
#[idempotent(key = "order_id.", ttl = "24h", store = "memory")]
async fn trailing_dot(msg: &OrderPlaced) -> Result<u64, std::io::Error> {
    Ok(msg.order_id)
}

fn main() {}
