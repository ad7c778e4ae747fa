// In transaction mode the open transaction holds the claim; a lease means nothing.
use idem_runtime::{SqliteTx, idempotent};

struct OrderPlaced {
    order_id: u64,
}

#[idempotent(key = "order_id", ttl = "24h", store = "sqlite", lease = "30s")]
async fn deduct_stock(tx: &mut SqliteTx<'_>, msg: &OrderPlaced) -> Result<u64, sqlx::Error> {
    sqlx::query("SELECT 1").execute(&mut **tx).await?;
    Ok(msg.order_id)
}

fn main() {}
