// A key part must implement `idem_runtime::KeyPart`; the error says nothing
// about floats unless the part is one.
use std::collections::HashMap;

use idem_runtime::idempotent;

struct CustomerId(u64);

struct PointsEarned {
    customer: CustomerId,
    payload: Vec<u8>,
    labels: HashMap<String, String>,
}

#[idempotent(key = "customer", ttl = "7d", store = "memory")]
async fn grant_points(msg: &PointsEarned) -> Result<u64, std::io::Error> {
    Ok(msg.customer.0)
}

#[idempotent(key = "payload", ttl = "7d", store = "memory")]
async fn archive(msg: &PointsEarned) -> Result<usize, std::io::Error> {
    Ok(msg.payload.len())
}

#[idempotent(key = "labels", ttl = "7d", store = "memory")]
async fn label(msg: &PointsEarned) -> Result<usize, std::io::Error> {
    Ok(msg.labels.len())
}

fn main() {}
