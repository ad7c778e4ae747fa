// A batch has one key per message, so a batch handler's body cannot take
// "its" key: a `&Key` parameter is refused on its type.
use idem_runtime::{Key, idempotent};

#[derive(Clone)]
struct OrderPlaced {
    order_id: u64,
}

#[idempotent(key = "order_id", ttl = "24h", store = "memory")]
async fn notify(msgs: &[OrderPlaced], key: &Key) -> Result<Vec<String>, std::io::Error> {
    Ok(msgs.iter().map(|m| format!("{}/{}", key.as_str(), m.order_id)).collect())
}

#[idempotent(key = "order_id", ttl = "24h", store = "memory")]
async fn notify_explicit(
    msgs: &[OrderPlaced],
    key: &idem_runtime::Key,
) -> Result<Vec<usize>, std::io::Error> {
    Ok(msgs.iter().map(|_| key.as_str().len()).collect())
}

fn main() {}
