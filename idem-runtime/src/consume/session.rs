//! The life of a consumer on a connection-based broker (RabbitMQ, NATS):
//! sessions on a connection, reconnected after a loss, each driving
//! deliveries through the handler, a bounded number at once.

use std::fmt::Display;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::stream::{Stream, StreamExt};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use super::{CancellationToken, ConsumeError, Meter, Report, Settled, lock, until_ok};
use crate::BoxError;

/// How a run of [`drive`] ended.
pub(crate) enum Ended {
    Shutdown,
    Stopped(String),
    Lost(BoxError),
}

/// Adds one delivery's end to the report; `Some` when the consumer must stop.
fn tally(report: &Mutex<Report>, done: Result<Settled, tokio::task::JoinError>) -> Option<String> {
    let mut r = lock(report);
    match done {
        Ok(Settled::Acked { duplicate, alert }) => {
            r.acked += 1;
            r.duplicates += u64::from(duplicate);
            r.alerts += u64::from(alert);
        }
        Ok(Settled::Retried) => r.retried += 1,
        Ok(Settled::DeadLettered) => r.dead_lettered += 1,
        Ok(Settled::Forwarded) => r.forwarded += 1,
        Ok(Settled::Unsettled) => {}
        Ok(Settled::Stop(reason)) => return Some(reason),
        // A panicking handler: its delivery stays unsettled and comes back.
        Err(e) => tracing::error!(error = %e, "a handler task failed"),
    }
    None
}

/// Takes deliveries from `deliveries` and settles each on a task of its own,
/// at most `concurrency` at once: a delivery is only taken once a slot is
/// free, so nothing waits inside the consumer for one. It runs until
/// shutdown, a stop or a failed stream; then runs `stop_taking`, lets the
/// bodies in flight finish, and says how it ended.
pub(crate) async fn drive<D, Err, S, Fut>(
    deliveries: S,
    concurrency: usize,
    report: &Arc<Mutex<Report>>,
    shutdown: CancellationToken,
    settle: impl Fn(D) -> Fut,
    stop_taking: impl Future<Output = ()>,
) -> Ended
where
    D: Send + 'static,
    Err: Into<BoxError>,
    S: Stream<Item = Result<D, Err>>,
    Fut: Future<Output = Settled> + Send + 'static,
{
    let permits = Arc::new(Semaphore::new(concurrency.max(1)));
    let mut tasks: JoinSet<Settled> = JoinSet::new();
    let mut stop = None;
    let mut lost: Option<BoxError> = None;
    let mut deliveries = Box::pin(deliveries);
    let mut shutdown = std::pin::pin!(shutdown.cancelled());
    'taking: loop {
        // A free slot first, then a delivery for it.
        let permit = tokio::select! {
            biased;
            () = &mut shutdown => break,
            Some(done) = tasks.join_next() => {
                if let Some(reason) = tally(report, done) {
                    stop = Some(reason);
                    break;
                }
                continue;
            }
            permit = Arc::clone(&permits).acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
        };
        loop {
            tokio::select! {
                biased;
                () = &mut shutdown => break 'taking,
                Some(done) = tasks.join_next() => {
                    if let Some(reason) = tally(report, done) {
                        stop = Some(reason);
                        break 'taking;
                    }
                }
                next = deliveries.next() => {
                    match next {
                        Some(Ok(delivery)) => {
                            let work = settle(delivery);
                            tasks.spawn(async move {
                                let settled = work.await;
                                drop(permit);
                                settled
                            });
                        }
                        Some(Err(e)) => lost = Some(e.into()),
                        None => lost = Some("the broker ended the stream of deliveries".into()),
                    }
                    if lost.is_some() {
                        break 'taking;
                    }
                    break;
                }
            }
        }
    }
    // Take nothing more; let what is in flight finish and settle.
    drop(deliveries);
    stop_taking.await;
    while let Some(done) = tasks.join_next().await {
        if let Some(reason) = tally(report, done) {
            stop.get_or_insert(reason);
        }
    }
    match (stop, lost) {
        (Some(reason), _) => Ended::Stopped(reason),
        (None, Some(e)) => Ended::Lost(e),
        (None, None) => Ended::Shutdown,
    }
}

/// The pause before a consumer reconnects after a lost session: growing
/// (100 ms doubling to 5 s) while sessions keep failing quickly, so a broker
/// that accepts connections but fails every session is not hammered; back
/// to 100 ms after a session that lasted.
pub(crate) struct Reconnect {
    pause: Duration,
}

impl Reconnect {
    pub(crate) fn new() -> Self {
        Reconnect {
            pause: Duration::from_millis(100),
        }
    }

    /// Waits before the next session; `false` when shutdown came first.
    pub(crate) async fn wait(
        &mut self,
        session_lasted: Duration,
        shutdown: &CancellationToken,
    ) -> bool {
        if session_lasted > Duration::from_secs(10) {
            self.pause = Duration::from_millis(100);
        }
        let pause = self.pause;
        self.pause = (self.pause * 2).min(Duration::from_secs(5));
        tokio::select! {
            () = shutdown.cancelled() => false,
            () = tokio::time::sleep(pause) => true,
        }
    }
}

/// The life of a consumer: connects with `connect` (retried with a growing
/// pause until the broker answers), runs a `session` on the connection, and
/// after a lost session pauses ([`Reconnect`]) and starts again, until
/// shutdown, a stop (`Error::Config`) or a refusal (a session's `Err`).
pub(crate) async fn sessions<C, CFut, CErr, SFut>(
    broker: &str,
    shutdown: CancellationToken,
    report: &Arc<Mutex<Report>>,
    meter: &Meter,
    mut connect: impl FnMut() -> CFut,
    mut session: impl FnMut(C, CancellationToken) -> SFut,
) -> Result<Report, ConsumeError>
where
    CFut: Future<Output = Result<C, CErr>>,
    CErr: Display,
    SFut: Future<Output = Result<Ended, BoxError>>,
{
    let mut reconnect = Reconnect::new();
    loop {
        let Some(conn) = until_ok(broker, &mut connect, &shutdown).await else {
            break;
        };
        let began = std::time::Instant::now();
        match session(conn, shutdown.clone()).await {
            Ok(Ended::Shutdown) => break,
            Ok(Ended::Stopped(reason)) => return Err(ConsumeError::Stopped { reason }),
            Ok(Ended::Lost(e)) => {
                tracing::warn!(error = %e, "the consumer lost its session with {broker}; reconnecting");
                lock(report).reconnects += 1;
                meter.reconnected();
                if !reconnect.wait(began.elapsed(), &shutdown).await {
                    break;
                }
            }
            Err(e) => return Err(ConsumeError::Setup(e)),
        }
        if shutdown.is_cancelled() {
            break;
        }
    }
    Ok(lock(report).clone())
}
