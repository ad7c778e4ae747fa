// Several required arguments missing are reported together, in one error.
use idem_runtime::idempotent;

struct OrderPlaced {
    order_id: u64,
}

#[idempotent]
async fn deduct_stock(msg: &OrderPlaced) -> Result<u64, std::io::Error> {
    Ok(msg.order_id)
}

#[idempotent(key = "order_id")]
async fn reserve(msg: &OrderPlaced) -> Result<u64, std::io::Error> {
    Ok(msg.order_id)
}

fn main() {}
