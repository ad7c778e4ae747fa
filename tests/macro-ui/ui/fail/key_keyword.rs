// `self` starts a key path only in a method; `self`, `super`, `crate` and
// `Self` are never field names. Each is a pointed error, not a crash, and
// the callers written for the rewritten signature get no second error.
use idem_runtime::{MemoryStore, idempotent};

struct Msg {
    id: u64,
}

#[idempotent(key = "self.id", ttl = "1h", store = "memory")]
async fn not_a_method(msg: &Msg) -> Result<u64, std::io::Error> {
    Ok(msg.id)
}

#[idempotent(key = "crate.id + id", ttl = "1h", store = "memory")]
async fn crate_field(msg: &Msg) -> Result<u64, std::io::Error> {
    Ok(msg.id)
}

struct Service;

impl Service {
    #[idempotent(key = "self + msg.id", ttl = "1h", store = "memory")]
    async fn receiver_alone(&self, msg: &Msg) -> Result<u64, std::io::Error> {
        Ok(msg.id)
    }

    #[idempotent(key = "msg.self.id", ttl = "1h", store = "memory")]
    async fn self_inside(&self, msg: &Msg) -> Result<u64, std::io::Error> {
        Ok(msg.id)
    }
}

async fn call(store: &MemoryStore) {
    let msg = Msg { id: 1 };
    let _ = not_a_method(store, &msg).await;
    let _ = crate_field(store, &msg).await;
    let _ = Service.receiver_alone(store, &msg).await;
    let _ = Service.self_inside(store, &msg).await;
}

fn main() {
    let _ = call;
}
