// One transaction holds the claim; a second transaction parameter has no source.
use idem_runtime::{SqliteTx, idempotent};

struct OrderPlaced {
    order_id: u64,
}

#[idempotent(key = "order_id", ttl = "24h", store = "sqlite")]
async fn deduct_stock(
    tx: &mut SqliteTx<'_>,
    audit: &mut SqliteTx<'_>,
    msg: &OrderPlaced,
) -> Result<u64, sqlx::Error> {
    sqlx::query("SELECT 1").execute(&mut **tx).await?;
    sqlx::query("SELECT 1").execute(&mut **audit).await?;
    Ok(msg.order_id)
}

fn main() {}
