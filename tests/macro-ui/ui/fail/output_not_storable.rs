// The `Ok` value is recorded for duplicates, so serde must be able to store it.
use idem_runtime::{SqliteTx, idempotent};

struct OrderPlaced {
    order_id: u64,
}

struct StockLeft {
    left: u64,
}

// lease mode
#[idempotent(key = "order_id", ttl = "24h", store = "memory")]
async fn deduct_stock(msg: &OrderPlaced) -> Result<StockLeft, std::io::Error> {
    Ok(StockLeft { left: msg.order_id })
}

// transaction mode
#[idempotent(key = "order_id", ttl = "24h", store = "sqlite")]
async fn deduct_stock_tx(
    tx: &mut SqliteTx<'_>,
    msg: &OrderPlaced,
) -> Result<StockLeft, sqlx::Error> {
    sqlx::query("SELECT 1").execute(&mut **tx).await?;
    Ok(StockLeft { left: msg.order_id })
}

// half of what is needed: still one error
#[derive(serde::Serialize)]
struct Reserved {
    order_id: u64,
}

#[idempotent(key = "order_id", ttl = "24h", store = "memory")]
async fn reserve(msg: &OrderPlaced) -> Result<Reserved, std::io::Error> {
    Ok(Reserved {
        order_id: msg.order_id,
    })
}


// a type of the standard library that serde cannot store, in both modes
#[idempotent(key = "order_id", ttl = "24h", store = "memory")]
async fn stamp(msg: &OrderPlaced) -> Result<std::time::Instant, std::io::Error> {
    let _ = msg;
    Ok(std::time::Instant::now())
}

#[idempotent(key = "order_id", ttl = "24h", store = "sqlite")]
async fn stamp_tx(
    tx: &mut SqliteTx<'_>,
    msg: &OrderPlaced,
) -> Result<std::time::Instant, sqlx::Error> {
    let _ = (tx, msg);
    Ok(std::time::Instant::now())
}

fn main() {}
