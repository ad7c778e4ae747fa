//! Writes that ride in the transaction of a transaction-mode call's
//! outcome: a consumer sets one around a handler call, and the SQL store
//! writes it just before the outcome, so that it commits with the body's
//! writes and the dedup record, or not at all.
//!
//! The rider is a task-local, so it reaches the store through the handler
//! the user wrote without a parameter of its own; it rides only on a
//! transaction of its own database type, and only once.

use std::any::Any;
use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;

use sqlx::{Database, Transaction};

/// A write in the outcome's transaction of a `D` database.
pub(crate) trait Rider<D: Database>: Send + Sync {
    fn write<'a>(
        &'a self,
        tx: &'a mut Transaction<'static, D>,
    ) -> Pin<Box<dyn Future<Output = Result<(), sqlx::Error>> + Send + 'a>>;
}

tokio::task_local! {
    static RIDER: RefCell<Option<Box<dyn Any + Send>>>;
}

/// Runs `call` with `rider` waiting for the outcome's transaction of a `D`
/// store; `true` when it rode (the call committed or rolled back with it).
pub(crate) async fn ride<D: Database, F: Future>(
    rider: Box<dyn Rider<D>>,
    call: F,
) -> (F::Output, bool) {
    let boxed: Box<dyn Any + Send> = Box::new(rider);
    RIDER
        .scope(RefCell::new(Some(boxed)), async {
            let out = call.await;
            let left = RIDER.with(|r| r.borrow().is_some());
            (out, !left)
        })
        .await
}

/// The rider waiting for a `D` transaction on this task, taken.
pub(crate) fn take<D: Database>() -> Option<Box<dyn Rider<D>>> {
    RIDER
        .try_with(|r| {
            let mut slot = r.borrow_mut();
            if slot.as_ref().is_some_and(|b| b.is::<Box<dyn Rider<D>>>()) {
                slot.take()
                    .and_then(|b| b.downcast::<Box<dyn Rider<D>>>().ok())
                    .map(|b| *b)
            } else {
                None
            }
        })
        .ok()
        .flatten()
}
