// `fingerprint` and `max_attempts` in every shape a handler takes: parts of
// any `Serialize` type (floats, `Option`s, nested paths), `*` on a message
// taken by reference or by value, paths from several messages or from
// `self`, and transaction mode.
use idem_runtime::{Error, MemoryStore, Outcome, SqliteStore, SqliteTx, idempotent};

#[derive(serde::Serialize)]
struct Line {
    sku: String,
    qty: u32,
}

#[derive(serde::Serialize)]
struct OrderPlaced {
    order_id: u64,
    price: f64,
    coupon: Option<String>,
    lines: (Line, Line),
}

#[derive(serde::Serialize)]
struct Meta {
    tenant: String,
}

#[idempotent(
    key = "order_id",
    ttl = "24h",
    store = "memory",
    fingerprint = "price + coupon + lines.0.qty"
)]
async fn parts(msg: &OrderPlaced) -> Result<f64, std::io::Error> {
    Ok(msg.price)
}

#[idempotent(key = "order_id", ttl = "24h", store = "memory", fingerprint = "price")]
async fn one_part(msg: &OrderPlaced) -> Result<f64, std::io::Error> {
    Ok(msg.price)
}

#[idempotent(
    key = "order_id",
    ttl = "24h",
    store = "memory",
    fingerprint = "*",
    max_attempts = 3
)]
async fn whole_by_reference(msg: &OrderPlaced) -> Result<u64, std::io::Error> {
    Ok(msg.order_id)
}

#[idempotent(key = "order_id", ttl = "24h", store = "memory", fingerprint = " * ")]
async fn whole_by_value(msg: OrderPlaced) -> Result<String, std::io::Error> {
    Ok(msg.lines.1.sku)
}

#[idempotent(
    key = "msg.order_id",
    ttl = "24h",
    store = "memory",
    fingerprint = "msg + meta.tenant"
)]
async fn several(msg: &OrderPlaced, meta: &Meta) -> Result<u64, std::io::Error> {
    Ok(msg.order_id + meta.tenant.len() as u64)
}

// `&mut` state beside the message: `*` is the message
#[idempotent(key = "order_id", ttl = "24h", store = "memory", fingerprint = "*")]
async fn with_state(msg: &OrderPlaced, seen: &mut Vec<u64>) -> Result<usize, std::io::Error> {
    seen.push(msg.order_id);
    Ok(seen.len())
}

struct Shop {
    region: String,
}

impl Shop {
    #[idempotent(
        key = "order_id",
        ttl = "24h",
        store = "memory",
        fingerprint = "self.region + msg.price"
    )]
    async fn method(&self, msg: &OrderPlaced) -> Result<usize, std::io::Error> {
        Ok(self.region.len())
    }

    #[idempotent(key = "order_id", ttl = "24h", store = "memory", fingerprint = "*")]
    async fn method_whole(&self, msg: &OrderPlaced) -> Result<usize, std::io::Error> {
        Ok(self.region.len() + msg.lines.0.sku.len())
    }
}

#[idempotent(
    key = "order_id",
    ttl = "24h",
    store = "sqlite",
    fingerprint = "price + coupon",
    max_attempts = 4294967295
)]
async fn in_transaction(tx: &mut SqliteTx<'_>, msg: &OrderPlaced) -> Result<u64, sqlx::Error> {
    sqlx::query("INSERT INTO orders (id) VALUES (?)")
        .bind(msg.order_id as i64)
        .execute(&mut **tx)
        .await?;
    Ok(msg.order_id)
}

#[idempotent(key = "order_id", ttl = "24h", store = "memory", max_attempts = 1)]
async fn attempts_only(msg: &OrderPlaced) -> Result<u64, std::io::Error> {
    Ok(msg.order_id)
}

// Never run: it only has to compile against the rewritten signature.
async fn call(store: &MemoryStore, sqlite: &SqliteStore, msg: OrderPlaced) {
    let meta = Meta {
        tenant: "acme".into(),
    };
    let _: Result<Outcome<f64>, Error<std::io::Error>> = parts(store, &msg).await;
    let _: Result<Outcome<f64>, Error<std::io::Error>> = one_part(store, &msg).await;
    let _: Result<Outcome<u64>, Error<std::io::Error>> = whole_by_reference(store, &msg).await;
    let _: Result<Outcome<u64>, Error<std::io::Error>> = several(store, &msg, &meta).await;
    let _: Result<Outcome<usize>, Error<std::io::Error>> =
        with_state(store, &msg, &mut Vec::new()).await;
    let shop = Shop {
        region: "eu".into(),
    };
    let _: Result<Outcome<usize>, Error<std::io::Error>> = shop.method(store, &msg).await;
    let _: Result<Outcome<usize>, Error<std::io::Error>> = shop.method_whole(store, &msg).await;
    let _: Result<Outcome<u64>, Error<sqlx::Error>> = in_transaction(sqlite, &msg).await;
    let _: Result<Outcome<u64>, Error<std::io::Error>> = attempts_only(store, &msg).await;
    let _: Result<Outcome<String>, Error<std::io::Error>> = whole_by_value(store, msg).await;
}

fn main() {
    let _ = call;
}
