//! Writes that ride in the transaction of a transaction-mode call's
//! outcome: a consumer sets one around a handler call, and the SQL store
//! writes it just before the outcome, so that it commits with the body's
//! writes and the dedup record, or not at all.
//!
//! The rider is a task-local, so it reaches the store through the handler
//! the user wrote without a parameter of its own; it rides only on a
//! transaction of its own pool (the store it was made for, or a clone), and
//! only once.

use std::any::Any;
use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;

use sqlx::{Database, Transaction};

/// A write in the outcome's transaction of a `D` database.
pub(crate) trait Rider<D: Database>: Send + Sync {
    /// Whether this rider belongs in a transaction of `pool`'s: the same
    /// pool (a store and its clones), not merely the same kind of database.
    fn rides_with(&self, pool: &sqlx::Pool<D>) -> bool;

    fn write<'a>(
        &'a self,
        tx: &'a mut Transaction<'static, D>,
    ) -> Pin<Box<dyn Future<Output = Result<(), sqlx::Error>> + Send + 'a>>;
}

/// The rider waiting on a task, and whether the transaction it rode in
/// committed.
struct Slot {
    rider: Option<Box<dyn Any + Send>>,
    committed: bool,
}

tokio::task_local! {
    static RIDER: RefCell<Slot>;
}

/// Runs `call` with `rider` waiting for the outcome's transaction of its
/// pool; `true` when it rode in a transaction that committed.
pub(crate) async fn ride<D: Database, F: Future>(
    rider: Box<dyn Rider<D>>,
    call: F,
) -> (F::Output, bool) {
    let boxed: Box<dyn Any + Send> = Box::new(rider);
    let slot = Slot {
        rider: Some(boxed),
        committed: false,
    };
    RIDER
        .scope(RefCell::new(slot), async {
            let out = call.await;
            let committed = RIDER.with(|r| r.borrow().committed);
            (out, committed)
        })
        .await
}

/// The transaction the rider was taken into committed.
pub(crate) fn committed() {
    let _ = RIDER.try_with(|r| r.borrow_mut().committed = true);
}

/// The rider waiting for a transaction of `pool`'s on this task, taken; a
/// rider of another database stays (and its consumer writes the offset
/// after the call instead).
pub(crate) fn take<D: Database>(pool: &sqlx::Pool<D>) -> Option<Box<dyn Rider<D>>> {
    RIDER
        .try_with(|r| {
            let mut slot = r.borrow_mut();
            let ours = slot
                .rider
                .as_ref()
                .and_then(|b| b.downcast_ref::<Box<dyn Rider<D>>>())
                .is_some_and(|rider| rider.rides_with(pool));
            if ours {
                slot.rider
                    .take()
                    .and_then(|b| b.downcast::<Box<dyn Rider<D>>>().ok())
                    .map(|b| *b)
            } else {
                None
            }
        })
        .ok()
        .flatten()
}
