// `&mut` parameters that are not transactions: state after the message, a
// message taken by `&mut` as the only parameter, a parenthesized trait
// object and a type holding `impl Trait`. No warning either (the file
// denies them).
#![deny(warnings)]
// `&mut Vec` as a user writes it, which clippy would make a slice.
#![allow(clippy::ptr_arg)]

use std::any::Any;
use std::fmt::Display;

use idem_runtime::{MemoryStore, idempotent};

struct Msg {
    id: u64,
}

#[idempotent(key = "id", ttl = "1h", store = "memory")]
async fn with_state(msg: &Msg, seen: &mut Vec<u64>) -> Result<u64, std::io::Error> {
    seen.push(msg.id);
    Ok(msg.id)
}

#[idempotent(key = "id", ttl = "1h", store = "memory")]
async fn only_mut(msg: &mut Msg) -> Result<u64, std::io::Error> {
    msg.id += 1;
    Ok(msg.id)
}

#[idempotent(key = "id", ttl = "1h", store = "memory")]
async fn trait_objects(
    msg: &Msg,
    any: &mut (dyn Any + Send),
    shown: &mut Vec<impl Display + Send>,
) -> Result<u64, std::io::Error> {
    let _ = (any, shown.len());
    Ok(msg.id)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let store = std::sync::Arc::new(MemoryStore::new());
    let mut seen = Vec::new();
    assert!(
        with_state(&store, &Msg { id: 1 }, &mut seen)
            .await
            .unwrap()
            .is_executed()
    );
    assert_eq!(seen, [1]);
    let mut msg = Msg { id: 7 };
    assert_eq!(only_mut(&store, &mut msg).await.unwrap().into_inner(), 8);
    let mut any = 5u8;
    let mut shown = vec!["a"];
    assert!(
        trait_objects(&*store, &Msg { id: 3 }, &mut any, &mut shown)
            .await
            .unwrap()
            .is_executed()
    );
}
