// A key field needs a message parameter to read it from.
use idem_runtime::idempotent;

#[idempotent(key = "order_id", ttl = "24h", store = "memory")]
async fn tick() -> Result<(), std::io::Error> {
    Ok(())
}

fn main() {}
