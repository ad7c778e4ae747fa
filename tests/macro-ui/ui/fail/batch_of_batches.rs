// The elements of a batch are its messages: a slice of slices (or of `Vec`s,
// or of arrays) is refused on the element type.
use idem_runtime::idempotent;

#[derive(Clone)]
struct OrderPlaced {
    order_id: u64,
}

#[idempotent(key = "order_id", ttl = "24h", store = "memory")]
async fn nested(msgs: &[&[OrderPlaced]]) -> Result<Vec<usize>, std::io::Error> {
    Ok(msgs.iter().map(|m| m.len()).collect())
}

#[idempotent(key = "order_id", ttl = "24h", store = "memory")]
async fn vecs(msgs: &[Vec<OrderPlaced>]) -> Result<Vec<usize>, std::io::Error> {
    Ok(msgs.iter().map(|m| m.len()).collect())
}

fn main() {}
