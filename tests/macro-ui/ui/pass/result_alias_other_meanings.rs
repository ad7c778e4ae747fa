// Aliases named `Result` whose parameters mean something else, and a
// parenthesised return type: the parts are named by the runtime, not read
// by position.
// `pub` items in private modules, as users write them.
#![allow(unreachable_pub)]
use idem_runtime::{Error, MemoryStore, Outcome, idempotent};

#[derive(Debug)]
pub struct Wrap<C>(C);

mod x {
    /// The second parameter is a code that the error wraps.
    pub type Result<T, C> = std::result::Result<T, super::Wrap<C>>;
}

mod y {
    /// Error first, value second.
    pub type Result<E, T> = std::result::Result<T, E>;
}

#[derive(Debug)]
struct AppError;

struct Msg {
    id: u64,
}

#[idempotent(key = "id", ttl = "1h", store = "memory")]
async fn wrapped(msg: &Msg) -> x::Result<u64, u8> {
    Ok(msg.id)
}

#[idempotent(key = "id", ttl = "1h", store = "memory")]
async fn swapped(msg: &Msg) -> y::Result<AppError, u64> {
    Ok(msg.id)
}

#[idempotent(key = "id", ttl = "1h", store = "memory")]
async fn parenthesised(msg: &Msg) -> (Result<u64, AppError>) {
    Ok(msg.id)
}

// Never run: it only has to compile against the rewritten signature.
async fn call(store: &MemoryStore) {
    let msg = Msg { id: 7 };
    let _: Result<Outcome<u64>, Error<Wrap<u8>>> = wrapped(store, &msg).await;
    let _: Result<Outcome<u64>, Error<AppError>> = swapped(store, &msg).await;
    let _: Result<Outcome<u64>, Error<AppError>> = parenthesised(store, &msg).await;
}

fn main() {
    let _ = call;
}
