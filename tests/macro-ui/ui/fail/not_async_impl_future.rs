// A function that returns a future is not an `async fn`: the macro awaits
// around the body, so the handler itself must be `async fn` returning the
// `Result`. One error each, on `fn`, saying what to write.
use std::future::Future;
use std::pin::Pin;

use idem_runtime::idempotent;

struct OrderPlaced {
    order_id: u64,
}

#[idempotent(key = "order_id", ttl = "24h", store = "memory")]
fn deduct_stock(msg: &OrderPlaced) -> impl Future<Output = Result<u64, std::io::Error>> + '_ {
    async move { Ok(msg.order_id) }
}

struct Points;

impl Points {
    #[idempotent(key = "order_id", ttl = "24h", store = "memory")]
    fn grant<'a>(
        &'a self,
        msg: &'a OrderPlaced,
    ) -> Pin<Box<dyn Future<Output = Result<u64, std::io::Error>> + Send + 'a>> {
        Box::pin(async move { Ok(msg.order_id * 10) })
    }
}

fn main() {}
