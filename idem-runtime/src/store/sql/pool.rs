//! The pool's futures, boxed. sqlx's `begin` future is large: 14 KB on
//! PostgreSQL with sqlx 0.9, the pool's `acquire` (its wait for a
//! connection, its timeout and its checks) inside it. A future that
//! awaits one holds it inline, and so does every future around that one
//! (the store's claim, the runtime's call, the user's handler), each moved
//! by value from one await to the next. The SQL stores take the
//! connections and transactions of their calls here (statements sent to
//! the pool itself, as migrations send some, need none): the 14 KB are
//! made once in a box of their own ([`boxed`](crate::boxed::boxed): one
//! allocation a call), and the futures around them hold a pointer. The
//! benchmarks chapter's instruction counts show what it saved (the copies
//! were 62 % of what idem added to a transaction-mode message).

use sqlx::pool::PoolConnection;
use sqlx::{Pool, Transaction};

use super::Dialect;
use crate::boxed::boxed;

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
