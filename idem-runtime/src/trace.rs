//! W3C trace context across hops (feature `otel`): one trace follows a
//! message from the service that published it, through its consumer and
//! what that consumer sends on.
//!
//! | hop | what idem does |
//! | --- | --- |
//! | a consumer (RabbitMQ, NATS, Kafka, RocketMQ) takes a message | its `idem.consume` span, and so the handler's `idempotent` span, is a child of the `traceparent` (and `tracestate`) in the message's headers |
//! | an HTTP route with the `Idempotency-Key` layer takes a request | its `idem.http` span is a child of the request's `traceparent`, or of the application's server span where a layer before it continued the trace already |
//! | a handler stages an outbox message | the message carries the staging span's `traceparent` and `tracestate` (unless it has a `traceparent` of its own), which the relay publishes with it |
//! | a consumer retries or dead-letters a message | the copy keeps the message's headers, its `traceparent` included: every attempt and the dead letter belong to the trace the message came with |
//!
//! The spans are `tracing` spans; [`tracing-opentelemetry`](https://docs.rs/tracing-opentelemetry)
//! turns them into OpenTelemetry spans for whatever exporter the
//! application installs (OTLP, Jaeger, ...). The format is always W3C's
//! (`opentelemetry_sdk`'s `TraceContextPropagator`), whatever propagator is
//! installed globally: it is the one every broker client and HTTP stack of
//! the field reads. A message without a `traceparent`, or with one that
//! does not parse, starts a trace of its own: `idem.consume` is a root
//! span, not a child of the span the consumer runs in.
//!
//! # Examples
//!
//! ```
//! use idem_runtime::trace;
//!
//! // What a producer sends: the current span's context, as headers.
//! let headers = trace::current_headers();
//! // Without an OpenTelemetry layer there is no trace to pass on.
//! assert!(headers.is_empty());
//!
//! // What a consumer reads back.
//! let remote = trace::context_of([(
//!     "traceparent",
//!     "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".as_bytes(),
//! )]);
//! use opentelemetry::trace::TraceContextExt as _;
//! assert_eq!(
//!     remote.span().span_context().trace_id().to_string(),
//!     "4bf92f3577b34da6a3ce929d0e0e4736"
//! );
//! ```

use opentelemetry::Context;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator as _};
use opentelemetry::trace::TraceContextExt as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

/// The header of a W3C trace context: `00-<trace id>-<span id>-<flags>`.
///
/// # Examples
///
/// ```
/// assert_eq!(idem_runtime::trace::TRACEPARENT, "traceparent");
/// ```
pub const TRACEPARENT: &str = "traceparent";

/// Headers as pairs of names and values, read as W3C's propagator asks
/// (names ignoring case).
struct Pairs<'a>(Vec<(&'a str, &'a str)>);

impl Extractor for Pairs<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case(key))
            .map(|(_, value)| *value)
    }

    fn keys(&self) -> Vec<&str> {
        self.0.iter().map(|(name, _)| *name).collect()
    }
}

/// Headers being written.
struct Written(Vec<(String, String)>);

impl Injector for Written {
    fn set(&mut self, key: &str, value: String) {
        self.0.push((key.to_owned(), value));
    }
}

/// The trace context `headers` carry (an empty context when they carry
/// none, or one that does not parse). Values that are not UTF-8 are left
/// out.
///
/// # Examples
///
/// See the [module docs](self).
pub fn context_of<'a, I, V>(headers: I) -> Context
where
    I: IntoIterator<Item = (&'a str, &'a V)>,
    V: AsRef<[u8]> + ?Sized + 'a,
{
    let pairs = headers
        .into_iter()
        .filter_map(|(name, value)| Some((name, std::str::from_utf8(value.as_ref()).ok()?)))
        .collect();
    TraceContextPropagator::new().extract(&Pairs(pairs))
}

/// Makes `span` a child of the trace context `headers` carry, if they
/// carry a valid one; returns whether they did.
///
/// # Examples
///
/// ```
/// let span = tracing::info_span!("work");
/// let none: [(&str, &[u8]); 0] = [];
/// assert!(!idem_runtime::trace::adopt(&span, none));
/// ```
pub fn adopt<'a, I, V>(span: &tracing::Span, headers: I) -> bool
where
    I: IntoIterator<Item = (&'a str, &'a V)>,
    V: AsRef<[u8]> + ?Sized + 'a,
{
    let remote = context_of(headers);
    if !remote.span().span_context().is_valid() {
        return false;
    }
    // An error only says there is no OpenTelemetry layer to tell.
    let _ = span.set_parent(remote);
    true
}

/// The current span's trace context as W3C headers (`traceparent`, and
/// `tracestate` when there is one), for a message or request sent from it;
/// empty when the current span is not in an OpenTelemetry trace.
///
/// # Examples
///
/// See the [module docs](self).
pub fn current_headers() -> Vec<(String, String)> {
    let cx = tracing::Span::current().context();
    if !cx.span().span_context().is_valid() {
        return Vec::new();
    }
    let mut written = Written(Vec::new());
    TraceContextPropagator::new().inject_context(&cx, &mut written);
    written.0.retain(|(_, value)| !value.is_empty());
    written.0
}

/// The current span's `traceparent` (`00-<trace id>-<span id>-<flags>`),
/// or `None` when it is in no OpenTelemetry trace.
///
/// # Examples
///
/// ```
/// // No OpenTelemetry layer here.
/// assert_eq!(idem_runtime::trace::current_traceparent(), None);
/// ```
pub fn current_traceparent() -> Option<String> {
    let cx = tracing::Span::current().context();
    let span = cx.span();
    let sc = span.span_context();
    sc.is_valid().then(|| {
        format!(
            "00-{}-{}-{:02x}",
            sc.trace_id(),
            sc.span_id(),
            sc.trace_flags().to_u8()
        )
    })
}

/// Links the current span to the execution whose `traceparent` is
/// `settled_by` (a duplicate's span to the span that settled its key);
/// nothing when it does not parse.
pub(crate) fn link_settled(settled_by: &str) {
    let remote = context_of([(TRACEPARENT, settled_by.as_bytes())]);
    let span = remote.span();
    let sc = span.span_context();
    if sc.is_valid() {
        tracing::Span::current().add_link(sc.clone());
    }
}

/// Whether the current span is in an OpenTelemetry trace.
#[cfg_attr(not(feature = "http"), allow(dead_code))]
pub(crate) fn in_trace() -> bool {
    tracing::Span::current()
        .context()
        .span()
        .span_context()
        .is_valid()
}

/// `message` with the current span's trace context, unless it carries a
/// `traceparent` of its own.
#[cfg(feature = "_sql")]
pub(crate) fn stamped(message: crate::outbox::Message) -> crate::outbox::Message {
    if message
        .headers()
        .iter()
        .any(|(name, _)| name.eq_ignore_ascii_case(TRACEPARENT))
    {
        return message;
    }
    current_headers()
        .into_iter()
        .fold(message, |m, (name, value)| m.header(name, value))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_traceparent_is_no_parent() {
        let span = tracing::Span::none();
        for bad in [
            "",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "zz-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "not a trace",
        ] {
            assert!(!adopt(&span, [("traceparent", bad.as_bytes())]), "{bad}");
        }
        assert!(adopt(
            &span,
            [(
                "TraceParent",
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".as_bytes()
            )]
        ));
    }
}
