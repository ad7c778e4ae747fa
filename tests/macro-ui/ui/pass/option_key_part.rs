// `Option` key parts: `None` is `Error::KeyMissing` at run time.
use idem_runtime::{Error, MemoryStore, Outcome, idempotent};

struct PointsEarned {
    customer_id: Option<u64>,
    campaign: Option<String>,
}

#[idempotent(key = "customer_id + campaign", ttl = "7d", store = "memory")]
async fn grant_points(msg: &PointsEarned) -> Result<bool, std::io::Error> {
    Ok(msg.campaign.is_some())
}

// Never run: it only has to compile against the rewritten signature.
async fn call(store: &MemoryStore) {
    let msg = PointsEarned {
        customer_id: Some(7),
        campaign: None,
    };
    let _: Result<Outcome<bool>, Error<std::io::Error>> = grant_points(store, &msg).await;
}

fn main() {
    let _ = call;
}
