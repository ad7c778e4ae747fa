//! Stopping consumers: the shutdown token, and waiting for a broker or a
//! store to answer at start-up.

use std::fmt::Display;
use std::future::Future;
use std::time::Duration;

/// The shutdown signal of every consumer and of [`until_ok`]: cancel it
/// (from a signal handler, a supervisor, a test) and the consumer stops
/// taking deliveries, lets the ones in flight finish and returns. One token
/// can stop many consumers; [`CancellationToken::child_token`] stops one.
///
/// # Examples
///
/// ```
/// use idem_runtime::consume::CancellationToken;
///
/// let shutdown = CancellationToken::new();
/// let one_consumer = shutdown.child_token();
/// shutdown.cancel();
/// assert!(one_consumer.is_cancelled());
/// ```
pub use tokio_util::sync::CancellationToken;

/// A token cancelled once `signal` resolves (a `ctrl_c`, a `SIGTERM`), for
/// the consumers' `run`; the future runs on a task of its own, so this is
/// called within a Tokio runtime (it panics outside one, as
/// `tokio::spawn` does).
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use idem_runtime::consume::shutdown_on;
///
/// // in a service: shutdown_on(async { tokio::signal::ctrl_c().await.ok(); })
/// let (tx, rx) = tokio::sync::oneshot::channel::<()>();
/// let shutdown = shutdown_on(async move { rx.await.ok(); });
/// assert!(!shutdown.is_cancelled());
/// tx.send(()).unwrap();
/// shutdown.cancelled().await;
/// # }
/// ```
pub fn shutdown_on(signal: impl Future<Output = ()> + Send + 'static) -> CancellationToken {
    let token = CancellationToken::new();
    let cancel = token.clone();
    tokio::spawn(async move {
        signal.await;
        cancel.cancel();
    });
    token
}

/// Retries `op` with a growing pause (100 ms doubling to 5 s) until it
/// succeeds (`Some`) or `shutdown` is cancelled (`None`); for connecting to
/// a broker or a store at start-up, when it may not be up yet. The first
/// failure is logged as a warning, the ones after it at debug level, with a
/// warning every minute that says how long it has been failing.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use idem_runtime::consume::{CancellationToken, until_ok};
///
/// // e.g. `|| PgStore::connect(url)`; here a store that answers at the third try
/// let mut tries = 0;
/// let connect = || {
///     tries += 1;
///     let answer = if tries < 3 { Err("connection refused") } else { Ok(tries) };
///     async move { answer }
/// };
/// let shutdown = CancellationToken::new();
/// assert_eq!(until_ok("the store", connect, &shutdown).await, Some(3));
///
/// // once shutdown is asked for, it gives up
/// shutdown.cancel();
/// let never = || async { Err::<(), _>("connection refused") };
/// assert_eq!(until_ok("the store", never, &shutdown).await, None);
/// # }
/// ```
pub async fn until_ok<T, E, F, Fut>(
    what: &str,
    mut op: F,
    shutdown: &CancellationToken,
) -> Option<T>
where
    E: Display,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let mut shutdown = std::pin::pin!(shutdown.cancelled());
    let mut pause = Duration::from_millis(100);
    let since = std::time::Instant::now();
    let mut warned: Option<std::time::Instant> = None;
    loop {
        // An attempt that hangs (a connection to a black hole) does not
        // hold up a shutdown, nor does a token cancelled already.
        let attempt = tokio::select! {
            biased;
            () = &mut shutdown => return None,
            attempt = op() => attempt,
        };
        match attempt {
            Ok(v) => {
                if warned.is_some() {
                    tracing::info!("{what} is reachable again after {:?}", since.elapsed());
                }
                return Some(v);
            }
            Err(e) => {
                if warned.is_none_or(|at| at.elapsed() >= Duration::from_secs(60)) {
                    warned = Some(std::time::Instant::now());
                    tracing::warn!(error = %e, failing_for = ?since.elapsed(), "{what} is not reachable; retrying (a pause of 100 ms doubling to 5 s)");
                } else {
                    tracing::debug!(error = %e, "{what} is not reachable; retrying in {pause:?}");
                }
            }
        }
        tokio::select! {
            _ = &mut shutdown => return None,
            _ = tokio::time::sleep(pause) => {}
        }
        pause = (pause * 2).min(Duration::from_secs(5));
    }
}
