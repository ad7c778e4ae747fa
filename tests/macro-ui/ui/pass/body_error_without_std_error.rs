// The body's error need only be Display + Debug (as anyhow::Error and
// Box<dyn Error + Send + Sync> are): the call's error then converts with `?`
// into the caller's Box<dyn Error> or anyhow::Error.
use idem_runtime::{MemoryStore, idempotent};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Like anyhow::Error: Display and Debug, but not std::error::Error.
#[derive(Debug)]
struct Opaque(String);

impl std::fmt::Display for Opaque {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

struct Msg {
    id: u64,
}

#[idempotent(key = "id", ttl = "1h", store = "memory")]
async fn boxed(msg: &Msg) -> Result<u64, BoxError> {
    Ok(msg.id)
}

#[idempotent(key = "id", ttl = "1h", store = "memory")]
async fn opaque(msg: &Msg) -> Result<u64, Opaque> {
    Ok(msg.id)
}

async fn caller(store: &MemoryStore) -> Result<u64, BoxError> {
    let msg = Msg { id: 1 };
    let a = boxed(store, &msg).await?.into_inner();
    let b = opaque(store, &msg).await?.into_inner();
    Ok(a + b)
}

fn main() {
    let _ = caller;
}
