// Floats are not key parts: equal amounts can print differently.
use idem_runtime::idempotent;

struct PaymentReceived {
    id: u64,
    amount: f64,
    fee: Option<f32>,
}

#[idempotent(key = "amount", ttl = "1h", store = "memory")]
async fn book_payment(msg: &PaymentReceived) -> Result<f64, std::io::Error> {
    Ok(msg.amount)
}

// an `Option` of a float is refused the same way
#[idempotent(key = "id + fee", ttl = "1h", store = "memory")]
async fn book_fee(msg: &PaymentReceived) -> Result<u64, std::io::Error> {
    Ok(msg.id)
}

fn main() {}
