// A `&mut` first parameter is taken for the transaction; a type that is not
// a store's transaction is reported on that type, with what to write.
use idem_runtime::idempotent;

struct Counter(u64);

struct OrderPlaced {
    order_id: u64,
}

#[idempotent(key = "order_id", ttl = "24h", store = "memory")]
async fn count(seen: &mut Counter, msg: &OrderPlaced) -> Result<u64, std::io::Error> {
    seen.0 += 1;
    Ok(msg.order_id)
}

fn main() {}
