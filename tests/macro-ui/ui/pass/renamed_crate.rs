// `crate = "..."` names the runtime when it is reached under another name.
extern crate idem_runtime as my_idem;

struct OrderPlaced {
    order_id: u64,
}

#[my_idem::idempotent(key = "order_id", ttl = "24h", store = "memory", crate = "my_idem")]
async fn deduct_stock(msg: &OrderPlaced) -> Result<u64, std::io::Error> {
    Ok(msg.order_id)
}

// Never run: it only has to compile against the rewritten signature.
async fn call(store: &my_idem::MemoryStore) {
    let msg = OrderPlaced { order_id: 7 };
    let _: Result<my_idem::Outcome<u64>, my_idem::Error<std::io::Error>> =
        deduct_stock(store, &msg).await;
}

fn main() {
    let _ = call;
}
