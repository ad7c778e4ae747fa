// An application's own `Key` beside idem's key written with its path: the
// path says which is which.
use idem_runtime::{Error, MemoryStore, Outcome, idempotent};

struct Key {
    id: u64,
}

struct Meta {
    tenant: String,
}

#[idempotent(key = "id", ttl = "24h", store = "memory")]
async fn rotate(msg: &Key, key: &idem_runtime::Key) -> Result<String, std::io::Error> {
    Ok(format!("{} {key}", msg.id))
}

// a key path that starts with the parameter's name makes it a message too
#[idempotent(key = "msg.id + meta.tenant", ttl = "24h", store = "memory")]
async fn revoke(msg: &Key, meta: &Meta) -> Result<u64, std::io::Error> {
    Ok(msg.id + meta.tenant.len() as u64)
}

// Never run: it only has to compile against the rewritten signature.
async fn call(store: &MemoryStore) {
    let msg = Key { id: 7 };
    let meta = Meta { tenant: "t".into() };
    let _: Result<Outcome<String>, Error<std::io::Error>> = rotate(store, &msg).await;
    let _: Result<Outcome<u64>, Error<std::io::Error>> = revoke(store, &msg, &meta).await;
}

fn main() {
    let _ = call;
}
