// A `&mut` first parameter before the message is taken for the transaction;
// a standard type there is one error, on that type, saying what a first
// `&mut` parameter must be.
use idem_runtime::idempotent;

struct OrderPlaced {
    order_id: u64,
}

#[idempotent(key = "order_id", ttl = "24h", store = "sqlite")]
async fn deduct_stock(buf: &mut Vec<u8>, msg: &OrderPlaced) -> Result<u64, std::io::Error> {
    buf.push(1);
    Ok(msg.order_id)
}

#[idempotent(key = "order_id", ttl = "24h", store = "postgres")]
async fn reserve(log: &mut String, msg: &OrderPlaced) -> Result<u64, std::io::Error> {
    log.push('r');
    Ok(msg.order_id)
}

fn main() {}
