// A fingerprint part must implement `serde::Serialize`: the error is on the
// fingerprint, naming the part's type; the other parts are fine.
use idem_runtime::idempotent;

struct Warehouse(u32);

#[derive(serde::Serialize)]
struct OrderPlaced {
    order_id: u64,
    qty: u32,
    #[serde(skip)]
    warehouse: Warehouse,
}

#[idempotent(key = "order_id", ttl = "24h", store = "memory", fingerprint = "qty + warehouse")]
async fn deduct_stock(msg: &OrderPlaced) -> Result<u32, std::io::Error> {
    Ok(msg.qty + msg.warehouse.0)
}

fn main() {}
