// An application's own message type named `Key`: as the only parameter it is
// the message, not idem's key parameter.
use idem_runtime::{Error, MemoryStore, Outcome, idempotent};

struct Key {
    id: u64,
}

#[idempotent(key = "id", ttl = "24h", store = "memory")]
async fn rotate(msg: &Key) -> Result<u64, std::io::Error> {
    Ok(msg.id)
}

// Never run: it only has to compile against the rewritten signature.
async fn call(store: &MemoryStore) {
    let msg = Key { id: 7 };
    let _: Result<Outcome<u64>, Error<std::io::Error>> = rotate(store, &msg).await;
}

fn main() {
    let _ = call;
}
