// The body reads its own derived key, e.g. to pass it on as the idempotency
// key of an external call; the `&Key` parameter leaves the signature.
use idem_runtime::{Error, MemoryStore, Outcome, idempotent};

struct SmsRequested {
    message_id: String,
}

#[idempotent(key = "message_id", ttl = "7d", store = "memory", lease = "10s")]
async fn send_sms(msg: &SmsRequested, key: &idem_runtime::Key) -> Result<String, std::io::Error> {
    Ok(format!("{} {}", msg.message_id, key.digest()))
}

// Never run: it only has to compile against the rewritten signature.
async fn call(store: &MemoryStore) {
    let msg = SmsRequested {
        message_id: "m-1".into(),
    };
    let _: Result<Outcome<String>, Error<std::io::Error>> = send_sms(store, &msg).await;
}

fn main() {
    let _ = call;
}
