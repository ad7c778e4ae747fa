//! What a consumer calls for each message: the [`Handler`] shapes, and the
//! one place where a payload is decoded, the handler called (a panic
//! caught), and the call's result turned into a [`Verdict`].

use std::fmt::Display;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Instant;

use futures_util::future::{BoxFuture, FutureExt};
use serde::de::DeserializeOwned;
use tracing::Instrument as _;

use crate::consume::dead::Cause;
use crate::consume::delivery::Delivery;
use crate::consume::meter::Meter;
use crate::consume::policy::{Attempts, Policy};
use crate::consume::verdict::Verdict;
use crate::error::Error;
use crate::outcome::Outcome;

/// A function a consumer runs for each message: a closure that takes the
/// decoded message, `Fn(M) -> Fut`, or the message and what the broker said
/// about it, `Fn(M, Delivery) -> Fut`, where `Fut` resolves to what a
/// rewritten `#[idempotent]` function returns, `Result<Outcome<T>,
/// Error<E>>`. Every consumer's `run` takes either shape; `Args` is only
/// there to tell the two apart (as axum's `Handler<T, S>` does for its
/// extractors), and is never named by a caller.
///
/// `M` is decoded from the payload as JSON; a payload that does not decode
/// is dead-lettered with serde's reason, without a call.
///
/// # Examples
///
/// ```
/// use idem_runtime::consume::{Delivery, Handler};
/// use idem_runtime::{Error, Outcome};
///
/// #[derive(serde::Deserialize)]
/// struct Ping { id: String }
///
/// fn takes<A>(_: impl Handler<A>) {}
///
/// // the message alone...
/// takes(|ping: Ping| async move { Ok::<_, Error<String>>(Outcome::Executed(ping.id)) });
/// // ...or with what the broker said about it
/// takes(|ping: Ping, delivery: Delivery| async move {
///     Ok::<_, Error<String>>(Outcome::Executed((ping.id, delivery.deliveries)))
/// });
/// ```
pub trait Handler<Args>: Send + Sync + 'static {
    /// The message, decoded from the payload (JSON).
    type Message: DeserializeOwned + Send + 'static;
    /// What the handler returns when the body ran or was a duplicate.
    type Output: Send + 'static;
    /// The body's own error.
    type Error: Display + Send + 'static;

    /// Calls the handler with one decoded message.
    fn call(
        &self,
        msg: Self::Message,
        delivery: Delivery,
    ) -> impl Future<Output = Result<Outcome<Self::Output>, Error<Self::Error>>> + Send + 'static;
}

impl<F, Fut, M, T, E> Handler<(M,)> for F
where
    F: Fn(M) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Outcome<T>, Error<E>>> + Send + 'static,
    M: DeserializeOwned + Send + 'static,
    T: Send + 'static,
    E: Display + Send + 'static,
{
    type Message = M;
    type Output = T;
    type Error = E;

    fn call(
        &self,
        msg: M,
        _: Delivery,
    ) -> impl Future<Output = Result<Outcome<T>, Error<E>>> + Send + 'static {
        self(msg)
    }
}

impl<F, Fut, M, T, E> Handler<(M, Delivery)> for F
where
    F: Fn(M, Delivery) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Outcome<T>, Error<E>>> + Send + 'static,
    M: DeserializeOwned + Send + 'static,
    T: Send + 'static,
    E: Display + Send + 'static,
{
    type Message = M;
    type Output = T;
    type Error = E;

    fn call(
        &self,
        msg: M,
        delivery: Delivery,
    ) -> impl Future<Output = Result<Outcome<T>, Error<E>>> + Send + 'static {
        self(msg, delivery)
    }
}

/// What a call made of one delivery.
#[derive(Clone)]
pub(crate) struct Handled {
    pub(crate) verdict: Verdict,
    /// An `Outcome::Duplicate`.
    pub(crate) duplicate: bool,
    /// The idempotent handler the call ran ("" when none ran: a payload
    /// that does not decode).
    pub(crate) handler: &'static str,
    /// What the call returned, for the metrics' `result` and `reason`:
    /// `executed`, `duplicate`, an [`Error::kind`], `decode` or `panic`.
    pub(crate) cause: &'static str,
    /// Why, for the dead letter's headers, when the verdict is a dead
    /// letter.
    pub(crate) dead: Option<Cause>,
}

/// A handler with its types erased: the payload, what the broker said of
/// it and its attempts so far, to what became of the call. Every broker
/// calls its handler through one of these, made by [`erase`].
pub(crate) type Call =
    Arc<dyn Fn(&[u8], Delivery, Attempts) -> BoxFuture<'static, Handled> + Send + Sync>;

/// The [`Call`] of `handler` under `policy`; each call's time goes to
/// `meter`, and its store faults to the meter's store health.
pub(crate) fn erase<H, A>(handler: H, policy: Policy, meter: Meter) -> Call
where
    H: Handler<A>,
{
    let (handler, policy) = (Arc::new(handler), Arc::new(policy));
    Arc::new(
        move |payload: &[u8], delivery: Delivery, attempts: Attempts| {
            let began = Instant::now();
            // Decoded now (the payload is borrowed); the handler is called on
            // the future's first poll, where the caller runs it (a Kafka
            // offset's transaction, a NATS heartbeat).
            let msg = decode_payload::<H::Message>(payload);
            let (handler, policy, meter) =
                (Arc::clone(&handler), Arc::clone(&policy), meter.clone());
            let span = consume_span(&delivery);
            let call = async move {
                let handled = match msg {
                    Err(reason) => Handled {
                        dead: Some(Cause::undecodable(&reason)),
                        verdict: Verdict::DeadLetter {
                            reason,
                            failed: false,
                        },
                        duplicate: false,
                        handler: "",
                        cause: "decode",
                    },
                    Ok(msg) => {
                        // A panicking handler is a failed attempt like any
                        // other, so its delivery is settled (retried, then
                        // dead-lettered) instead of held.
                        let call = std::panic::catch_unwind(AssertUnwindSafe(|| {
                            handler.call(msg, delivery)
                        }));
                        let (result, called) = match call {
                            Ok(call) => {
                                crate::telemetry::noting_handler(
                                    AssertUnwindSafe(call).catch_unwind(),
                                )
                                .await
                            }
                            Err(panic) => (Err(panic), None),
                        };
                        judge(result, called.unwrap_or(""), attempts, &policy, &meter)
                    }
                };
                meter.handled(&handled, began);
                handled
            };
            Box::pin(call.instrument(span))
        },
    )
}

/// The span of one message's call: its broker and source. With the
/// feature `otel` it is a root, made a child of the trace context the
/// message's headers carry, if any: each message is in the trace it came
/// with, or starts its own, never in the span the consumer runs in (which
/// would make one endless trace of everything it consumes).
fn consume_span(delivery: &Delivery) -> tracing::Span {
    let broker = delivery.broker.map_or("", |b| b.as_str());
    #[cfg(not(feature = "otel"))]
    let span = tracing::info_span!("idem.consume", broker, source = %delivery.source);
    #[cfg(feature = "otel")]
    let span = {
        let span =
            tracing::info_span!(parent: None, "idem.consume", broker, source = %delivery.source);
        crate::trace::adopt(&span, delivery.headers.iter().map(|(n, v)| (n.as_str(), v)));
        span
    };
    span
}

/// The verdict on a call that returned (or panicked).
fn judge<T, E: Display>(
    result: Result<Result<Outcome<T>, Error<E>>, Box<dyn std::any::Any + Send>>,
    handler: &'static str,
    attempts: Attempts,
    policy: &Policy,
    meter: &Meter,
) -> Handled {
    match result {
        Ok(result) => {
            let cause = match &result {
                Ok(Outcome::Executed(_)) => "executed",
                Ok(Outcome::Duplicate(_)) => "duplicate",
                Err(e) => e.kind(),
            };
            let attempts = match result {
                Err(Error::Store { .. }) => Attempts {
                    store_failing_for: meter.store.fault(),
                    ..attempts
                },
                _ => {
                    meter.store.ok();
                    attempts
                }
            };
            let verdict = Verdict::of(&result, attempts, policy);
            let dead = match (&verdict, &result) {
                (Verdict::DeadLetter { .. }, Err(e)) => Some(Cause::of(e)),
                _ => None,
            };
            Handled {
                verdict,
                duplicate: matches!(result, Ok(Outcome::Duplicate(_))),
                handler,
                cause,
                dead,
            }
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".to_owned());
            let reason = format!("the handler panicked: {what}");
            tracing::error!(%reason, "a handler panicked");
            let verdict = Verdict::body_failed(&reason, attempts.failures, policy);
            let dead = matches!(verdict, Verdict::DeadLetter { .. })
                .then(|| Cause::panicked(handler, what));
            Handled {
                verdict,
                duplicate: false,
                handler,
                cause: "panic",
                dead,
            }
        }
    }
}

/// Decodes a payload (JSON) into the handler's message type; the error says
/// what the consumer dead-letters.
pub(crate) fn decode_payload<M: DeserializeOwned>(payload: &[u8]) -> Result<M, String> {
    serde_json::from_slice(payload).map_err(|e| {
        format!(
            "the payload does not decode as {}: {e}",
            std::any::type_name::<M>()
        )
    })
}
