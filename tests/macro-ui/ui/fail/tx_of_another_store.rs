// A transaction parameter of another store than the attribute's.
use idem_runtime::{PgTx, idempotent};

struct OrderPlaced {
    order_id: i64,
}

#[idempotent(key = "order_id", ttl = "24h", store = "sqlite")]
async fn deduct_stock(tx: &mut PgTx<'_>, msg: &OrderPlaced) -> Result<i64, sqlx::Error> {
    sqlx::query("SELECT 1").execute(&mut **tx).await?;
    Ok(msg.order_id)
}

#[idempotent(key = "order_id", ttl = "24h", store = "postgres")]
async fn reserve(
    tx: &mut sqlx::Transaction<'_, sqlx::Sqlite>,
    msg: &OrderPlaced,
) -> Result<i64, sqlx::Error> {
    sqlx::query("SELECT 1").execute(&mut **tx).await?;
    Ok(msg.order_id)
}

fn main() {}
