// A method's key may read the receiver's fields: `self.tenant` scopes the
// message's id by the service's tenant.
use idem_runtime::{Error, MemoryStore, Outcome, idempotent};

struct Msg {
    id: u64,
}

struct Service {
    tenant: String,
}

impl Service {
    #[idempotent(key = "self.tenant + msg.id", ttl = "1h", store = "memory")]
    async fn handle(&self, msg: &Msg) -> Result<u64, std::io::Error> {
        Ok(msg.id)
    }

    #[idempotent(
        key = "self.tenant + id",
        ttl = "1h",
        store = "memory",
        name = "handle_short"
    )]
    async fn handle_short(&self, msg: &Msg) -> Result<u64, std::io::Error> {
        Ok(msg.id)
    }
}

// Never run: it only has to compile against the rewritten signature.
async fn call(store: &MemoryStore) {
    let service = Service {
        tenant: "acme".into(),
    };
    let msg = Msg { id: 7 };
    let _: Result<Outcome<u64>, Error<std::io::Error>> = service.handle(store, &msg).await;
    let _: Result<Outcome<u64>, Error<std::io::Error>> = service.handle_short(store, &msg).await;
}

fn main() {
    let _ = call;
}
