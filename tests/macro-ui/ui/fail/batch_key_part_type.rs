// A batch handler's key parts are checked on the element type as a single
// handler's are on its message: a float and a type without `KeyPart` are
// refused on the key, naming the part's type.
use idem_runtime::idempotent;

#[derive(Clone)]
struct Payment {
    amount: f64,
    lines: Vec<String>,
}

#[idempotent(key = "amount", ttl = "24h", store = "memory")]
async fn pay(msgs: &[Payment]) -> Result<Vec<f64>, std::io::Error> {
    Ok(msgs.iter().map(|m| m.amount).collect())
}

#[idempotent(key = "lines", ttl = "24h", store = "memory")]
async fn ship(msgs: &[Payment]) -> Result<Vec<usize>, std::io::Error> {
    Ok(msgs.iter().map(|m| m.lines.len()).collect())
}

fn main() {}
