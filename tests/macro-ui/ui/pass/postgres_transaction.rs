// Transaction mode on Postgres (this package enables the `postgres` feature):
// `&mut PgTx<'_>` becomes `&PgStore`. The tx parameter may also be written
// as sqlx's own `Transaction<'_, Postgres>`.
use idem_runtime::{Error, Outcome, PgStore, PgTx, idempotent};

struct OrderPlaced {
    order_id: i64,
    qty: i32,
}

#[idempotent(key = "order_id", ttl = "24h", store = "postgres")]
async fn deduct_stock(tx: &mut PgTx<'_>, msg: &OrderPlaced) -> Result<i32, sqlx::Error> {
    sqlx::query_scalar("UPDATE inventory SET stock = stock - $1 WHERE id = $2 RETURNING stock")
        .bind(msg.qty)
        .bind(msg.order_id)
        .fetch_one(&mut **tx)
        .await
}

#[idempotent(key = "'audit' + order_id", ttl = "7d", store = "postgres")]
async fn audit(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    msg: &OrderPlaced,
) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO audit (order_id) VALUES ($1)")
        .bind(msg.order_id)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

// Never run: it only has to compile against the rewritten signature.
async fn call(store: &PgStore) {
    let msg = OrderPlaced {
        order_id: 7,
        qty: 1,
    };
    let _: Result<Outcome<i32>, Error<sqlx::Error>> = deduct_stock(store, &msg).await;
    let _: Result<Outcome<()>, Error<sqlx::Error>> = audit(store, &msg).await;
}

fn main() {
    let _ = call;
}
