// `lease` is a duration like `ttl`.
use idem_runtime::idempotent;

struct SmsRequested {
    message_id: String,
}

#[idempotent(key = "message_id", ttl = "7d", store = "memory", lease = "30")]
async fn send_sms(msg: &SmsRequested) -> Result<usize, std::io::Error> {
    Ok(msg.message_id.len())
}

fn main() {}
