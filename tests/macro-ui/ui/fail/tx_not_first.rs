// The transaction parameter is replaced by the store, so it comes first.
use idem_runtime::{SqliteTx, idempotent};

struct OrderPlaced {
    order_id: u64,
}

#[idempotent(key = "order_id", ttl = "24h", store = "sqlite")]
async fn deduct_stock(msg: &OrderPlaced, tx: &mut SqliteTx<'_>) -> Result<u64, sqlx::Error> {
    sqlx::query("SELECT 1").execute(&mut **tx).await?;
    Ok(msg.order_id)
}

fn main() {}
