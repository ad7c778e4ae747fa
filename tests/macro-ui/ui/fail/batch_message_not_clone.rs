// The body of a batch handler is given only the batch's fresh messages,
// cloned out of the batch when some are not: a message type without `Clone`
// is one error, on that type.
use idem_runtime::{SqliteTx, idempotent};

struct OrderPlaced {
    order_id: u64,
}

#[idempotent(key = "order_id", ttl = "24h", store = "memory")]
async fn notify(msgs: &[OrderPlaced]) -> Result<Vec<u64>, std::io::Error> {
    Ok(msgs.iter().map(|m| m.order_id).collect())
}

#[idempotent(key = "order_id", ttl = "24h", store = "sqlite")]
async fn deduct_stock(tx: &mut SqliteTx<'_>, msgs: &[OrderPlaced]) -> Result<Vec<u64>, sqlx::Error> {
    let _ = tx;
    Ok(msgs.iter().map(|m| m.order_id).collect())
}

fn main() {}
