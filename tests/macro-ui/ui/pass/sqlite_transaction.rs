// Transaction mode: the `&mut SqliteTx<'_>` parameter becomes `&SqliteStore`,
// and a serde struct is the recorded outcome.
use idem_runtime::{Error, Outcome, SqliteStore, SqliteTx, idempotent};
use serde::{Deserialize, Serialize};

struct OrderPlaced {
    order_id: u64,
    sku: String,
}

#[derive(Serialize, Deserialize)]
struct StockLeft {
    sku: String,
    left: i64,
}

#[derive(Debug, thiserror::Error)]
enum AppError {
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

#[idempotent(
    key = "order_id + sku",
    ttl = "1h30m",
    store = "sqlite",
    name = "inventory.deduct"
)]
async fn deduct_stock(tx: &mut SqliteTx<'_>, msg: &OrderPlaced) -> Result<StockLeft, AppError> {
    let left: i64 = sqlx::query_scalar("SELECT stock FROM inventory WHERE sku = ?")
        .bind(&msg.sku)
        .fetch_one(&mut **tx)
        .await?;
    Ok(StockLeft {
        sku: msg.sku.clone(),
        left,
    })
}

// Never run: it only has to compile against the rewritten signature.
async fn call(store: &SqliteStore) {
    let msg = OrderPlaced {
        order_id: 7,
        sku: "apple".into(),
    };
    let _: Result<Outcome<StockLeft>, Error<AppError>> = deduct_stock(store, &msg).await;
}

fn main() {
    let _ = call;
}
