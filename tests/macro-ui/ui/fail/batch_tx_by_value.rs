// The body of a transaction-mode batch handler may run again (after another
// delivery recorded a key of the batch first), so each run gets a copy of the
// parameters taken by value: one whose type is not `Copy` is refused on its
// type, saying to take it by reference.
use idem_runtime::{SqliteTx, idempotent};

#[derive(Clone)]
struct OrderPlaced {
    order_id: u64,
}

#[idempotent(key = "msgs.order_id", ttl = "24h", store = "sqlite")]
async fn deduct_stock(
    tx: &mut SqliteTx<'_>,
    msgs: &[OrderPlaced],
    tenant: String,
    limit: u32,
) -> Result<Vec<String>, sqlx::Error> {
    let _ = (tx, limit);
    Ok(msgs.iter().map(|m| format!("{tenant}/{}", m.order_id)).collect())
}

// A pattern is checked as a whole.
#[idempotent(key = "msgs.order_id", ttl = "24h", store = "sqlite")]
async fn tagged(
    tx: &mut SqliteTx<'_>,
    msgs: &[OrderPlaced],
    (tag, n): (String, u32),
) -> Result<Vec<String>, sqlx::Error> {
    let _ = tx;
    Ok(msgs.iter().map(|m| format!("{tag}/{n}/{}", m.order_id)).collect())
}

fn main() {}
