// A bare `&Key` beside another parameter is taken for idem's key parameter;
// when `Key` is the application's own type, rustc says so on that type.
use idem_runtime::idempotent;

struct Key {
    id: u64,
}

struct Meta {
    tenant: String,
}

#[idempotent(key = "tenant", ttl = "24h", store = "memory")]
async fn rotate(msg: &Key, meta: &Meta) -> Result<usize, std::io::Error> {
    Ok(msg.id as usize + meta.tenant.len())
}

fn main() {}
