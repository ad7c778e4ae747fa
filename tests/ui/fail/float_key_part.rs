// Floats are not key parts: equal amounts can print differently.
use idem_runtime::idempotent;

struct PaymentReceived {
    amount: f64,
}

#[idempotent(key = "amount", ttl = "1h", store = "memory")]
async fn book_payment(msg: &PaymentReceived) -> Result<f64, std::io::Error> {
    Ok(msg.amount)
}

fn main() {}
