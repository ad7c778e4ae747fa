// A batch handler returns one value per message it is given: an `Ok` type
// that is not a `Vec` is one error, on that type (or on the alias that
// names it).
use idem_runtime::{SqliteTx, idempotent};

#[derive(Clone)]
struct OrderPlaced {
    order_id: u64,
}

type AppResult<T> = Result<T, std::io::Error>;

#[idempotent(key = "order_id", ttl = "24h", store = "memory")]
async fn total(msgs: &[OrderPlaced]) -> Result<u64, std::io::Error> {
    Ok(msgs.iter().map(|m| m.order_id).sum())
}

#[idempotent(key = "order_id", ttl = "24h", store = "sqlite")]
async fn pair(tx: &mut SqliteTx<'_>, msgs: &[OrderPlaced]) -> Result<(u64, u64), sqlx::Error> {
    let _ = tx;
    Ok((msgs.len() as u64, 0))
}

#[idempotent(key = "order_id", ttl = "24h", store = "memory")]
async fn aliased(msgs: &[OrderPlaced]) -> AppResult<usize> {
    Ok(msgs.len())
}

fn main() {}
