// A user type used as a key part must implement `idem_runtime::KeyPart`.
use idem_runtime::idempotent;

struct CustomerId(u64);

struct PointsEarned {
    customer: CustomerId,
}

#[idempotent(key = "customer", ttl = "7d", store = "memory")]
async fn grant_points(msg: &PointsEarned) -> Result<u64, std::io::Error> {
    Ok(msg.customer.0)
}

fn main() {}
