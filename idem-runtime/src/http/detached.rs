//! A request's call on a task of its own: what the client or the server
//! stack does to the request (a hang-up, a timeout layer, a graceful
//! shutdown that drops it) never stops the handler halfway. The call goes
//! on to its recorded outcome, for up to the route's
//! [`grace`](super::Idempotency::grace) once nobody waits for it.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{oneshot, watch};

use crate::boxed::boxed;

/// The calls of a layer that run now, those whose caller went away among
/// them: a server that stops waits for them with
/// [`finished`](RunningCalls::finished) before its runtime ends, which
/// would drop them.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use idem_runtime::MemoryStore;
/// use idem_runtime::http::Idempotency;
///
/// let layer = Idempotency::unscoped("http_running_doc", Duration::from_secs(600)).lease(MemoryStore::new())?;
/// let running = layer.running();
/// // axum::serve(listener, app).with_graceful_shutdown(signal).await?;
/// // then, for the calls whose clients hung up:
/// running.finished().await;
/// assert_eq!(running.count(), 0);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Default)]
pub struct RunningCalls {
    count: Arc<watch::Sender<usize>>,
}

impl RunningCalls {
    /// How many calls run now.
    ///
    /// # Examples
    ///
    /// ```
    /// let running = idem_runtime::http::RunningCalls::default();
    /// assert_eq!(running.count(), 0);
    /// ```
    pub fn count(&self) -> usize {
        *self.count.borrow()
    }

    /// Resolves once no call runs: each one that ran ended, recorded or
    /// dropped past its grace. Calls that start meanwhile are waited for
    /// too.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let running = idem_runtime::http::RunningCalls::default();
    /// running.finished().await; // none ran
    /// # }
    /// ```
    pub async fn finished(&self) {
        let mut count = self.count.subscribe();
        // The sender lives as long as `self`: the wait cannot fail.
        let _ = count.wait_for(|n| *n == 0).await;
        // A lease-mode call dropped past its grace holds its key one more
        // lease: that extension is under way on a task of its own.
        crate::call::lease::keeper::last_extensions_done().await;
    }

    fn started(&self) -> Started {
        self.count.send_modify(|n| *n += 1);
        Started {
            count: Arc::clone(&self.count),
        }
    }
}

/// One running call, counted until it is dropped.
struct Started {
    count: Arc<watch::Sender<usize>>,
}

impl Drop for Started {
    fn drop(&mut self) {
        self.count.send_modify(|n| *n = n.saturating_sub(1));
    }
}

/// Why a detached call gave no answer to its caller.
#[derive(Debug)]
pub(crate) struct Gone;

/// Runs the future `make` makes (the work) on a task of its own and waits
/// for it. Dropped (its caller went away), the wait leaves the work running
/// for up to `grace`; then it is dropped, and `route` is named in the
/// warning. A panic in the work goes on in the caller; `Err(Gone)` when
/// the runtime dropped the task (it is shutting down).
///
/// The work is made in its box ([`boxed`]): it holds the route's handler
/// and its store's transaction, kilobytes that the task would otherwise
/// copy as tokio moves it in and writes its stage (most of what the layer
/// cost a request in copies, by the benchmarks chapter's counts).
pub(crate) async fn run<F>(
    route: &'static str,
    grace: Duration,
    running: &RunningCalls,
    make: impl FnOnce() -> F,
) -> Result<F::Output, Gone>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let mut work = boxed(make);
    // Dropped with this future: the caller went away.
    let (_caller, left) = oneshot::channel::<()>();
    let started = running.started();
    // In the request's span and under its subscriber, as it ran before: the
    // handler's logs keep the middleware's fields, and reach a subscriber
    // set for this thread only (`tracing::subscriber::set_default`).
    let call = async move {
        let _started = started;
        tokio::select! {
            biased;
            out = &mut work => Some(out),
            () = async {
                let _ = left.await;
                tokio::time::sleep(grace).await;
            } => {
                tracing::warn!(
                    route,
                    ?grace,
                    "a request's call still ran when its grace after the client went away ran out: dropped"
                );
                None
            }
        }
    };
    let call = tracing::Instrument::in_current_span(call);
    let task = tokio::spawn(tracing::instrument::WithSubscriber::with_current_subscriber(call));
    match task.await {
        Ok(Some(out)) => Ok(out),
        // The grace only starts once this future is gone.
        Ok(None) => Err(Gone),
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(_) => Err(Gone),
    }
}
