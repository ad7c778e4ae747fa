//! A future made in its box. Some futures idem awaits or spawns are large:
//! sqlx's `begin` is 14 KB on PostgreSQL, and a request's call, which holds
//! the route's handler and its store's transaction, is kilobytes. Moved by
//! value, each move is a copy of all of it: every await of a future that
//! holds one inline, and every step of a task that runs one (tokio moves a
//! spawned future into its task, and writes the task's stage whole at each
//! change). Boxed, a move is a pointer's. The box is allocated before the
//! future is made, so that an optimised build can make the future in it:
//! `Box::pin(make())` makes it on the stack and copies it into the box. The
//! benchmarks chapter's instruction counts show what each use saved.

use std::future::Future;
use std::pin::Pin;

/// The future `make` returns, made in a heap slot allocated first, so that
/// the compiler can build it there rather than on the stack and copy it.
/// Not `Box::pin(make())`, which copies: the release build's instruction
/// counts (`scripts/instruction-counts.txt`) show the difference.
pub(crate) fn boxed<F: Future>(make: impl FnOnce() -> F) -> Pin<Box<F>> {
    let slot = Box::<F>::new_uninit();
    Box::into_pin(Box::write(slot, make()))
}
