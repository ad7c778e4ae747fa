// A batch body runs once for all the fresh messages of a batch and fails for
// all of them: its failures cannot be counted per message, so `max_attempts`
// is refused on a batch handler, on its value. Its callers, written for the
// rewritten batch signature, report nothing more.
use idem_runtime::{Error, MemoryStore, Outcome, idempotent};

#[derive(Clone)]
struct OrderPlaced {
    order_id: u64,
}

#[idempotent(key = "order_id", ttl = "24h", store = "memory", max_attempts = 5)]
async fn deduct_stock(msgs: &[OrderPlaced]) -> Result<Vec<u64>, std::io::Error> {
    Ok(msgs.iter().map(|m| m.order_id).collect())
}

type Answers = Vec<Result<Outcome<u64>, Error<std::io::Error>>>;

async fn call(store: &MemoryStore, msgs: &[OrderPlaced]) -> Result<Answers, Error<std::io::Error>> {
    deduct_stock(store, msgs).await
}

fn main() {
    let _ = call;
}
