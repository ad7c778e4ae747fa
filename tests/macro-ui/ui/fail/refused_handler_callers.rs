// A handler the macro refuses still has the rewritten signature, so its
// callers report nothing: only the real mistakes are errors.
use idem_runtime::{MemoryStore, Outcome, SqliteStore, SqliteTx, idempotent};

#[derive(serde::Serialize, serde::Deserialize)]
struct StockLeft(i64);

struct OrderPlaced {
    order_id: u64,
}

// a bad ttl; the store is known
#[idempotent(key = "order_id", ttl = "24 hours", store = "sqlite")]
async fn deduct_stock(tx: &mut SqliteTx<'_>, msg: &OrderPlaced) -> Result<StockLeft, sqlx::Error> {
    sqlx::query("SELECT 1").execute(&mut **tx).await?;
    Ok(StockLeft(msg.order_id as i64))
}

// an unknown store: any store is accepted
#[idempotent(key = "order_id", ttl = "24h", store = "mongodb")]
async fn reserve(msg: &OrderPlaced) -> Result<u64, std::io::Error> {
    Ok(msg.order_id)
}

struct Shop;

impl Shop {
    // a method, with its key misspelt
    #[idempotent(key = "order_id +", ttl = "24h", store = "memory")]
    async fn refund(&self, msg: &OrderPlaced) -> Result<u64, std::io::Error> {
        Ok(msg.order_id)
    }
}

// the return type refused: the written type stands in for `T`
#[idempotent(key = "order_id", ttl = "24h", store = "memory")]
async fn release(msg: &OrderPlaced) -> (u64, bool) {
    (msg.order_id, true)
}

// Never run: callers written for the rewritten signatures.
async fn call(
    sqlite: &SqliteStore,
    memory: &MemoryStore,
) -> Result<(), Box<dyn std::error::Error>> {
    let msg = OrderPlaced { order_id: 7 };
    match deduct_stock(sqlite, &msg).await? {
        Outcome::Executed(StockLeft(left)) | Outcome::Duplicate(StockLeft(left)) => {
            let _ = left;
        }
    }
    let _: u64 = reserve(memory, &msg).await?.into_inner();
    let _: u64 = Shop.refund(memory, &msg).await?.into_inner();
    let (_, _): (u64, bool) = release(memory, &msg).await?.into_inner();
    Ok(())
}

fn main() {
    let _ = call;
}
