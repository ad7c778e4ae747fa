//! The pool's futures, boxed. sqlx's `begin` future is large: 14 KB on
//! PostgreSQL with sqlx 0.9, the pool's `acquire` (its wait for a
//! connection, its timeout and its checks) inside it. A future that
//! awaits one holds it inline, and so does every future around that one
//! (the store's claim, the runtime's call, the user's handler), each moved
//! by value from one await to the next. The SQL stores take the
//! connections and transactions of their calls here (statements sent to
//! the pool itself, as migrations send some, need none): the 14 KB are
//! built once on the heap (one allocation a call), and the futures around
//! them hold a pointer. The box is allocated before the future is made
//! ([`boxed`]), so that an optimised build can make the future in it:
//! `Box::pin` of a future already made copies its 14 KB from the stack
//! into the box on every call.
//! The benchmarks chapter's instruction counts show what it saved (the
//! copies were 62 % of what idem added to a transaction-mode message).

use std::pin::Pin;

use sqlx::pool::PoolConnection;
use sqlx::{Pool, Transaction};

use super::Dialect;

/// A connection of `pool`.
pub(super) async fn acquire<D: Dialect>(pool: &Pool<D>) -> Result<PoolConnection<D>, sqlx::Error> {
    boxed(|| pool.acquire()).await
}

/// A transaction of `pool`, opened with `statement` (the dialect's
/// `BEGIN`, when it has its own) or sqlx's `BEGIN`.
pub(super) async fn begin<D: Dialect>(
    pool: &Pool<D>,
    statement: Option<&'static str>,
) -> Result<Transaction<'static, D>, sqlx::Error> {
    match statement {
        Some(statement) => boxed(|| pool.begin_with(statement)).await,
        None => boxed(|| pool.begin()).await,
    }
}

/// The future `make` returns, made in a heap slot allocated first, so that
/// the compiler can build it there rather than on the stack and copy it.
/// Not `Box::pin(make())`, which copies: the release build's instruction
/// counts (`scripts/instruction-counts.txt`) show the difference.
fn boxed<F: Future>(make: impl FnOnce() -> F) -> Pin<Box<F>> {
    let slot = Box::<F>::new_uninit();
    Box::into_pin(Box::write(slot, make()))
}
