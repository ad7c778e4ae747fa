// A batch handler takes its messages as a shared slice, `&[M]`, and only so:
// a `Vec`, a reference to one, an array or a `&mut` slice whose fields the
// key reads is refused on its type, saying what to write.
use idem_runtime::idempotent;

#[derive(Clone)]
struct OrderPlaced {
    order_id: u64,
}

#[idempotent(key = "order_id", ttl = "24h", store = "memory")]
async fn by_vec(msgs: Vec<OrderPlaced>) -> Result<Vec<u64>, std::io::Error> {
    Ok(msgs.iter().map(|m| m.order_id).collect())
}

#[idempotent(key = "order_id", ttl = "24h", store = "memory")]
async fn by_vec_ref(msgs: &Vec<OrderPlaced>) -> Result<Vec<u64>, std::io::Error> {
    Ok(msgs.iter().map(|m| m.order_id).collect())
}

#[idempotent(key = "order_id", ttl = "24h", store = "memory")]
async fn by_array(msgs: &[OrderPlaced; 4]) -> Result<Vec<u64>, std::io::Error> {
    Ok(msgs.iter().map(|m| m.order_id).collect())
}

#[idempotent(key = "order_id", ttl = "24h", store = "memory")]
async fn by_mut_slice(msgs: &mut [OrderPlaced]) -> Result<Vec<u64>, std::io::Error> {
    Ok(msgs.iter().map(|m| m.order_id).collect())
}

fn main() {}
