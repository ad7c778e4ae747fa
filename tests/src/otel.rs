//! Spans as OpenTelemetry exports them: one global `tracing` subscriber
//! with `tracing-opentelemetry`'s layer over the SDK's in-memory exporter,
//! installed by the first test of a binary that asks for it. Each test
//! reads the spans of its own trace.

use std::sync::OnceLock;
use std::time::Duration;

use opentelemetry::trace::{TraceContextExt as _, TraceId, TracerProvider as _};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use tracing::Instrument as _;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;
use tracing_subscriber::layer::SubscriberExt as _;

/// The binary's exporter, under its one global subscriber (installed on
/// the first call).
pub fn exporter() -> &'static InMemorySpanExporter {
    static EXPORTER: OnceLock<(InMemorySpanExporter, SdkTracerProvider)> = OnceLock::new();
    &EXPORTER
        .get_or_init(|| {
            let exporter = InMemorySpanExporter::default();
            let provider = SdkTracerProvider::builder()
                .with_simple_exporter(exporter.clone())
                .build();
            let tracer = provider.tracer("idem-tests");
            let subscriber = tracing_subscriber::registry()
                .with(tracing_opentelemetry::layer().with_tracer(tracer));
            tracing::subscriber::set_global_default(subscriber).expect("one subscriber");
            (exporter, provider)
        })
        .0
}

/// The finished spans of `trace`.
pub fn spans_of(trace: TraceId) -> Vec<SpanData> {
    exporter()
        .get_finished_spans()
        .expect("the exporter's spans")
        .into_iter()
        .filter(|s| s.span_context.trace_id() == trace)
        .collect()
}

/// Waits (30 s at most) until `trace` has `n` finished spans named
/// `name`; its spans.
pub async fn finished(trace: TraceId, name: &str, n: usize) -> Vec<SpanData> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let spans = spans_of(trace);
        if spans.iter().filter(|s| s.name == name).count() >= n {
            return spans;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{n} `{name}` spans were not finished in trace {trace}: {:?}",
            spans.iter().map(|s| &s.name).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Runs `call` in a root span of its own, `delivery` (so in a trace of its
/// own): its output, and the first finished span named `name` in that
/// trace.
pub async fn in_a_trace<F: std::future::Future>(name: &str, call: F) -> (F::Output, SpanData) {
    exporter();
    let root = tracing::info_span!(parent: None, "delivery");
    let trace = root.context().span().span_context().trace_id();
    assert_ne!(
        trace,
        TraceId::INVALID,
        "an OpenTelemetry layer is installed"
    );
    let out = call.instrument(root).await;
    let span = finished(trace, name, 1)
        .await
        .into_iter()
        .find(|s| s.name == name)
        .expect("the span");
    (out, span)
}

/// The W3C `traceparent` of `span`, as idem's stores keep it.
pub fn traceparent(span: &SpanData) -> String {
    let cx = &span.span_context;
    format!(
        "00-{}-{}-{:02x}",
        cx.trace_id(),
        cx.span_id(),
        cx.trace_flags().to_u8()
    )
}
