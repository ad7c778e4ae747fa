//! The life of a consumer on a connection-based broker, written once:
//! connect (again after a loss), open a session, take messages while a
//! slot of the policy's concurrency is free, run each through the handler
//! on a task of its own, settle it as its verdict says, and at shutdown
//! let the bodies in flight finish.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::stream::StreamExt;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use super::handler::{Call, Handled, Handler, erase};
use super::transport::{Dead, Opening, Retry, Session, Transport};
use crate::BoxError;
use crate::consume::lock;
use crate::consume::meter::Meter;
use crate::consume::policy::Attempts;
use crate::consume::report::{ConsumeError, Report, Settled};
use crate::consume::shutdown::{CancellationToken, until_ok};
use crate::consume::tiers;
use crate::consume::verdict::Verdict;

/// Consumes from `transport` with `handler` until `shutdown` is cancelled,
/// a call reports the binary misconfigured ([`ConsumeError::Stopped`]) or
/// the broker refuses the set-up ([`ConsumeError::Setup`]).
pub(crate) async fn run<T, H, A>(
    transport: T,
    handler: H,
    shutdown: CancellationToken,
) -> Result<Report, ConsumeError>
where
    T: Transport,
    H: Handler<A>,
{
    transport.check()?;
    let transport = Arc::new(transport);
    let report = Arc::new(Mutex::new(Report::default()));
    let meter = Meter::new(T::BROKER, transport.queue());
    let call = erase(handler, transport.policy().clone(), meter.clone());
    let broker = broker_name(&*transport);
    let mut reconnect = Reconnect::new();
    loop {
        let Some(conn) = until_ok(&broker, || transport.connect(), &shutdown).await else {
            break;
        };
        let began = std::time::Instant::now();
        let ended = match transport.open(&conn, &meter).await {
            Ok(session) => {
                drive(
                    &transport,
                    session,
                    &call,
                    &meter,
                    &report,
                    shutdown.clone(),
                )
                .await
            }
            Err(Opening::Refused(e)) => {
                transport.close(conn).await;
                return Err(ConsumeError::Setup(e));
            }
            Err(Opening::Lost(e)) => Ended::Lost(e),
        };
        transport.close(conn).await;
        match ended {
            Ended::Shutdown => break,
            Ended::Stopped(reason) => return Err(ConsumeError::Stopped { reason }),
            Ended::Lost(e) => {
                tracing::warn!(error = %e, "the consumer lost its session with {broker}; reconnecting");
                lock(&report).reconnects += 1;
                meter.reconnected();
                if !reconnect.wait(began.elapsed(), &shutdown).await {
                    break;
                }
            }
        }
        if shutdown.is_cancelled() {
            break;
        }
    }
    Ok(lock(&report).clone())
}

/// The broker's name for logs, with the queue (stream, durable) the
/// consumer takes from: `RabbitMQ (orders)`.
fn broker_name<T: Transport>(transport: &T) -> String {
    let name = match T::BROKER {
        crate::consume::Broker::RabbitMq => "RabbitMQ",
        crate::consume::Broker::Nats => "NATS",
        crate::consume::Broker::Kafka => "Kafka",
        crate::consume::Broker::RocketMq => "RocketMQ",
    };
    format!("{name} ({})", transport.queue())
}

/// How a session ended.
enum Ended {
    Shutdown,
    Stopped(String),
    Lost(BoxError),
}

/// Takes messages from `session` and settles each on a task of its own, at
/// most the policy's concurrency at once: a message is only taken once a
/// slot is free, so nothing waits inside the consumer for one. It runs
/// until shutdown, a stop or a failed stream; then asks the broker to send
/// no more, lets the bodies in flight finish (for up to the policy's
/// grace: then they are dropped), closes the session, and says how it
/// ended.
async fn drive<T: Transport>(
    transport: &Arc<T>,
    session: Session<T>,
    call: &Call,
    meter: &Meter,
    report: &Mutex<Report>,
    shutdown: CancellationToken,
) -> Ended {
    let Session {
        mut messages,
        link,
        stop_taking,
        closing,
    } = session;
    let permits = Arc::new(Semaphore::new(transport.policy().concurrency.max(1)));
    // Cancelled past the grace: the calls still running are dropped.
    let cut = CancellationToken::new();
    let mut tasks: JoinSet<Settled> = JoinSet::new();
    let mut stop = None;
    let mut lost: Option<BoxError> = None;
    let mut shutdown = std::pin::pin!(shutdown.cancelled());
    'taking: loop {
        // A free slot first, then a message for it.
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
                next = messages.next() => {
                    match next {
                        Some(Ok(msg)) => {
                            let (transport, link, call, meter, cut) = (
                                Arc::clone(transport),
                                link.clone(),
                                Arc::clone(call),
                                meter.clone(),
                                cut.clone(),
                            );
                            tasks.spawn(async move {
                                let settled =
                                    settle(&*transport, &link, msg, &call, &meter, &cut).await;
                                drop(permit);
                                settled
                            });
                        }
                        Some(Err(e)) => lost = Some(e),
                        None => lost = Some("the broker ended the stream of messages".into()),
                    }
                    if lost.is_some() {
                        break 'taking;
                    }
                    break;
                }
            }
        }
    }
    // Take nothing more (the broker told first, then the messages it had
    // handed over and were not taken dropped); let what is in flight
    // finish and settle, for up to the grace.
    stop_taking.await;
    drop(messages);
    let grace = transport.policy().grace;
    // A grace too long to add is no limit.
    let past_grace = match tokio::time::Instant::now().checked_add(grace) {
        Some(at) => futures_util::future::Either::Left(tokio::time::sleep_until(at)),
        None => futures_util::future::Either::Right(std::future::pending::<()>()),
    };
    let mut past_grace = std::pin::pin!(past_grace);
    loop {
        tokio::select! {
            biased;
            done = tasks.join_next() => match done {
                Some(done) => {
                    if let Some(reason) = tally(report, done) {
                        stop.get_or_insert(reason);
                    }
                }
                None => break,
            },
            () = &mut past_grace, if !tasks.is_empty() && !cut.is_cancelled() => {
                tracing::warn!(
                    queue = transport.queue(),
                    running = tasks.len(),
                    ?grace,
                    "bodies still running when the grace ran out: dropped, and their messages handed back"
                );
                // Each task hands its message back and ends; they are
                // joined (and counted) above.
                cut.cancel();
            }
        }
    }
    if cut.is_cancelled() {
        // The cut lease-mode calls hold their keys one more lease: let
        // those extensions be sent before the consumer returns.
        crate::call::lease::keeper::last_extensions_done().await;
    }
    closing.await;
    match (stop, lost) {
        (Some(reason), _) => Ended::Stopped(reason),
        (None, Some(e)) => Ended::Lost(e),
        (None, None) => Ended::Shutdown,
    }
}

/// Adds one message's end to the report; `Some` when the consumer must stop.
fn tally(report: &Mutex<Report>, done: Result<Settled, tokio::task::JoinError>) -> Option<String> {
    match done {
        Ok(Settled::Stop(reason)) => Some(reason),
        Ok(settled) => {
            lock(report).count(&settled);
            None
        }
        // A task that failed: its message stays unsettled and comes back.
        Err(e) => {
            tracing::error!(error = %e, "a handler task failed");
            None
        }
    }
}

/// Runs one message through the handler and settles it with the broker;
/// hands it back unsettled, its call dropped, once `cut` is cancelled.
async fn settle<T: Transport>(
    transport: &T,
    link: &T::Link,
    msg: T::Message,
    call: &Call,
    meter: &Meter,
    cut: &CancellationToken,
) -> Settled {
    let read = transport.read(&msg);
    // A retry back before its due time waits on in the retry tier for what
    // is left, without a call; one due within the broker's slack waits here.
    if let Some(due) = read.due {
        let left = tiers::left_until(due);
        if left > transport.waits_here() {
            tracing::debug!(queue = transport.queue(), ?left, "not due yet: forwarded");
            return match transport.forward(link, &msg, left).await {
                Ok(()) => Settled::Forwarded,
                Err(e) => unsettled(transport, &msg, meter, &e).await,
            };
        }
        tokio::select! {
            () = tokio::time::sleep(left) => {}
            () = cut.cancelled() => {}
        }
    }
    if cut.is_cancelled() {
        // Past the grace before its call began: never started.
        return handed_back(transport, &msg).await;
    }
    if let Some(waiting) = read.waiting {
        meter.lag(waiting);
    }
    let attempts = read.attempts;
    let published_at = read.delivery.published_at;
    meter.delivered(&read.delivery);
    let _in_flight = meter.in_flight();
    let work = call(read.payload, read.delivery, attempts);
    let work = async {
        match transport.keep_alive() {
            None => work.await,
            Some(beat) => {
                let mut work = std::pin::pin!(work);
                let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + beat, beat);
                loop {
                    tokio::select! {
                        done = &mut work => break done,
                        _ = ticks.tick() => transport.still_working(&msg).await,
                    }
                }
            }
        }
    };
    let handled = tokio::select! {
        biased;
        handled = work => handled,
        // Past the grace of a consumer that stops: the body is dropped
        // (counted by the call), and its message goes back.
        () = cut.cancelled() => return handed_back(transport, &msg).await,
    };
    let told = tell(transport, link, &msg, &handled, attempts).await;
    let settled = match told {
        Ok(settled) => settled,
        Err(e) => unsettled(transport, &msg, meter, &e).await,
    };
    meter.settled(&handled, &settled, published_at);
    settled
}

/// Gives back the message of a call cut past the grace: after a second,
/// not to a pull the stopping session left open.
async fn handed_back<T: Transport>(transport: &T, msg: &T::Message) -> Settled {
    transport.give_back(msg, Some(Duration::from_secs(1))).await;
    Settled::Unsettled
}

/// Tells the broker what `verdict` says of `msg`.
async fn tell<T: Transport>(
    transport: &T,
    link: &T::Link,
    msg: &T::Message,
    handled: &Handled,
    attempts: Attempts,
) -> Result<Settled, BoxError> {
    let queue = transport.queue();
    let duplicate = handled.duplicate;
    Ok(match &handled.verdict {
        Verdict::Ack { alert } => {
            if let Some(alert) = alert {
                tracing::error!(queue, "acked, but look: {alert}");
            }
            transport.ack(link, msg).await?;
            Settled::Acked {
                duplicate,
                alert: alert.is_some(),
            }
        }
        Verdict::Retry {
            after,
            failed,
            reason,
        } => {
            tracing::debug!(queue, ?after, %reason, "retrying later");
            let retry = Retry {
                after: *after,
                failures: attempts.failures.saturating_add(u32::from(*failed)),
                retries: attempts.retries.saturating_add(1),
                reason,
            };
            transport.retry(link, msg, retry).await?;
            Settled::Retried
        }
        Verdict::DeadLetter { reason, failed } => {
            tracing::warn!(queue, %reason, "dead-lettered");
            let dead = Dead {
                reason,
                failures: attempts.failures.saturating_add(u32::from(*failed)),
                cause: handled.dead.as_ref(),
            };
            transport.dead_letter(link, msg, dead).await?;
            Settled::DeadLettered
        }
        Verdict::Stop { reason } => {
            transport.give_back(msg, None).await;
            Settled::Stop(reason.clone())
        }
    })
}

/// The broker could not be told: the message goes back (where the
/// connection still works; where it does not, the broker takes it back as
/// the connection goes).
async fn unsettled<T: Transport>(
    transport: &T,
    msg: &T::Message,
    meter: &Meter,
    error: &BoxError,
) -> Settled {
    meter.settle_failed(error);
    transport.give_back(msg, Some(Duration::from_secs(1))).await;
    Settled::Unsettled
}

/// The pause before a consumer reconnects after a lost session: growing
/// (100 ms doubling to 5 s) while sessions keep failing quickly, so a broker
/// that accepts connections but fails every session is not hammered; back
/// to 100 ms after a session that lasted.
struct Reconnect {
    pause: Duration,
}

impl Reconnect {
    fn new() -> Self {
        Reconnect {
            pause: Duration::from_millis(100),
        }
    }

    /// Waits before the next session; `false` when shutdown came first.
    async fn wait(&mut self, session_lasted: Duration, shutdown: &CancellationToken) -> bool {
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
