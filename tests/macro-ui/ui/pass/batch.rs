// Batch handlers: the key's message parameter is a slice `&[M]`; the key
// and the fingerprint read each element, the body gets the fresh messages
// and returns one value per message, and the rewritten function answers one
// result per message. In lease and transaction mode, with a fingerprint,
// `Option` key parts, parts from another parameter and from `self`, result
// aliases, and parameters beside the batch. No warning either (the file
// denies them).
#![deny(warnings)]
// The rewritten results spelled out in full, as the compiler checks them.
#![allow(clippy::type_complexity)]

use idem_runtime::{Error, MemoryStore, Outcome, SqliteStore, SqliteTx, idempotent};
use serde::{Deserialize, Serialize};

#[derive(Clone, Serialize)]
struct OrderPlaced {
    order_id: u64,
    sku: String,
    qty: u32,
    price: f64,
    coupon: Option<String>,
}

#[derive(Serialize, Deserialize)]
struct StockLeft {
    sku: String,
    left: i64,
}

struct Meta {
    tenant: String,
}

#[derive(Debug, thiserror::Error)]
enum AppError {
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

type AppResult<T> = Result<T, AppError>;
type Lefts = Vec<i64>;

// Lease mode, with a fingerprint and an `Option` key part.
#[idempotent(
    key = "order_id + coupon",
    ttl = "24h",
    store = "memory",
    fingerprint = "qty + price"
)]
async fn notify(msgs: &[OrderPlaced]) -> Result<Vec<String>, std::io::Error> {
    Ok(msgs
        .iter()
        .map(|m| format!("{} x{}", m.sku, m.qty))
        .collect())
}

// Lease mode, parameters beside the batch (a key part read once for every
// message, state, a value), each message fingerprinted whole, a result alias.
#[idempotent(
    key = "msgs.order_id + meta.tenant",
    ttl = "24h",
    store = "memory",
    fingerprint = "msgs + meta.tenant"
)]
async fn count(
    msgs: &[OrderPlaced],
    meta: &Meta,
    seen: &mut Vec<u64>,
    factor: String,
) -> AppResult<Vec<u64>> {
    seen.extend(msgs.iter().map(|m| m.order_id));
    Ok(msgs
        .iter()
        .map(|m| m.order_id * factor.len() as u64 + meta.tenant.len() as u64)
        .collect())
}

// Transaction mode: the body may run again, so it borrows its references
// afresh and copies what it takes by value.
#[idempotent(
    key = "msgs.order_id + msgs.sku",
    ttl = "1h",
    store = "sqlite",
    fingerprint = "msgs.qty"
)]
async fn deduct_stock(
    tx: &mut SqliteTx<'_>,
    msgs: &[OrderPlaced],
    meta: &Meta,
    seen: &mut Vec<u64>,
    mut limit: u32,
) -> Result<Vec<StockLeft>, AppError> {
    let mut out = Vec::with_capacity(msgs.len());
    for msg in msgs {
        limit = limit.saturating_sub(msg.qty);
        seen.push(msg.order_id);
        let left: i64 = sqlx::query_scalar("SELECT stock FROM inventory WHERE sku = ? AND ? > 0")
            .bind(&msg.sku)
            .bind(limit)
            .fetch_one(&mut **tx)
            .await?;
        out.push(StockLeft {
            sku: format!("{}/{}", meta.tenant, msg.sku),
            left,
        });
    }
    Ok(out)
}

// Transaction mode, an `Ok` type through an alias of `Vec`, messages as
// references.
#[idempotent(key = "order_id", ttl = "1h", store = "sqlite")]
async fn lefts(tx: &mut SqliteTx<'_>, msgs: &[&OrderPlaced]) -> AppResult<Lefts> {
    let _ = tx;
    Ok(msgs.iter().map(|m| i64::from(m.qty)).collect())
}

struct Inventory {
    warehouse: String,
    runs: u32,
}

impl Inventory {
    // A method: `self` parts are the same for every message.
    #[idempotent(key = "self.warehouse + msgs.sku", ttl = "1h", store = "sqlite")]
    async fn reserve(
        &mut self,
        tx: &mut SqliteTx<'_>,
        msgs: &[OrderPlaced],
    ) -> Result<Vec<u32>, AppError> {
        self.runs += 1;
        sqlx::query("SELECT 1").execute(&mut **tx).await?;
        Ok(msgs.iter().map(|m| m.qty).collect())
    }
}

// Never run: it only has to compile against the rewritten signatures.
async fn call(memory: &MemoryStore, sqlite: &SqliteStore) {
    let msgs = vec![OrderPlaced {
        order_id: 7,
        sku: "apple".into(),
        qty: 2,
        price: 9.5,
        coupon: None,
    }];
    let meta = Meta {
        tenant: "acme".into(),
    };
    let mut seen = Vec::new();
    let _: Result<Vec<Result<Outcome<String>, Error<std::io::Error>>>, Error<std::io::Error>> =
        notify(memory, &msgs).await;
    let _: Result<Vec<Result<Outcome<u64>, Error<AppError>>>, Error<AppError>> =
        count(memory, &msgs, &meta, &mut seen, "x".into()).await;
    let _: Result<Vec<Result<Outcome<StockLeft>, Error<AppError>>>, Error<AppError>> =
        deduct_stock(sqlite, &msgs, &meta, &mut seen, 10).await;
    let refs: Vec<&OrderPlaced> = msgs.iter().collect();
    let _: Result<Vec<Result<Outcome<i64>, Error<AppError>>>, Error<AppError>> =
        lefts(sqlite, &refs).await;
    let mut inventory = Inventory {
        warehouse: "north".into(),
        runs: 0,
    };
    let _: Result<Vec<Result<Outcome<u32>, Error<AppError>>>, Error<AppError>> =
        inventory.reserve(sqlite, &msgs).await;
}

fn main() {
    let _ = call;
}
