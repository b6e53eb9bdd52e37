//! OpenTelemetry tracing: one span per request, joined to the gateway's trace.
//!
//! Why: a slow request crosses the gateway, epp and a model server; the gateway's trace shows
//! epp as one opaque hop unless epp reports its own spans under the gateway's. The ext_proc
//! stream reads the W3C `traceparent` (and `tracestate`) request header and opens an
//! `epp.request` span whose parent is the gateway's span; the director's routing adds child
//! spans `parse`, `tokenize` and `schedule` (the chosen endpoint and the scores as attributes),
//! and the response phase adds `response`.
//!
//! Configuration is the standard `OTEL_*` environment: tracing is on only when
//! `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set and neither
//! `OTEL_SDK_DISABLED=true` nor `OTEL_TRACES_EXPORTER=none` says otherwise. Export is OTLP over
//! gRPC (tonic, batched); the SDK reads `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`,
//! `OTEL_TRACES_SAMPLER[_ARG]`, `OTEL_BSP_*` and `OTEL_EXPORTER_OTLP_{HEADERS,TIMEOUT}` itself.
//! When off, every hook is one atomic load that finds no tracer: no span, no allocation.
//!
//! The spans are made with the OpenTelemetry API directly rather than through a `tracing`
//! layer: the tracer is owned by [`crate::app::run`] (tests run several epps in one process,
//! which cannot share one global `tracing` subscriber), and routing is synchronous, so the
//! request's context is simply attached to the thread for the duration of the call.

use arc_swap::ArcSwapOption;
use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::{
    get_active_span, Span as _, SpanKind, Status, TraceContextExt, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, ContextGuard, KeyValue};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};
use opentelemetry_sdk::Resource;
use std::sync::Arc;

/// The tracer of the running epp; empty when tracing is off.
static TRACER: ArcSwapOption<SdkTracer> = ArcSwapOption::const_empty();

/// Variables whose presence turns tracing on.
const ENDPOINT_VARS: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
];

#[derive(Debug, thiserror::Error)]
pub(crate) enum TelemetryError {
    #[error("building the OTLP span exporter (check OTEL_EXPORTER_OTLP_ENDPOINT): {0}")]
    Exporter(#[from] opentelemetry_otlp::ExporterBuildError),
}

/// Owns the tracer provider; [`Telemetry::shutdown`] flushes the spans not yet exported.
pub(crate) struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

fn env_set(key: &str) -> bool {
    std::env::var(key).is_ok_and(|v| !v.trim().is_empty())
}

fn env_is(key: &str, value: &str) -> bool {
    std::env::var(key).is_ok_and(|v| v.trim().eq_ignore_ascii_case(value))
}

/// Whether the environment asks for traces to be exported.
pub(crate) fn configured() -> bool {
    !env_is("OTEL_SDK_DISABLED", "true")
        && !env_is("OTEL_TRACES_EXPORTER", "none")
        && ENDPOINT_VARS.iter().any(|k| env_set(k))
}

impl Telemetry {
    /// Tracing as the `OTEL_*` environment configures it. Call inside the tokio runtime (the
    /// gRPC channel's worker is spawned on it).
    pub(crate) fn from_env() -> Result<Self, TelemetryError> {
        if !configured() {
            return Ok(Self { provider: None });
        }
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .build()?;
        let mut resource = Resource::builder();
        let named = env_set("OTEL_SERVICE_NAME")
            || std::env::var("OTEL_RESOURCE_ATTRIBUTES").is_ok_and(|v| v.contains("service.name="));
        if !named {
            resource = resource.with_service_name("epp");
        }
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource.build())
            .build();
        TRACER.store(Some(Arc::new(provider.tracer("epp"))));
        tracing::info!(endpoint = ?ENDPOINT_VARS.iter().find_map(|k| std::env::var(k).ok()), "OpenTelemetry tracing on (OTLP/gRPC)");
        Ok(Self {
            provider: Some(provider),
        })
    }

    /// No tracing (`--tracing=false`), whatever the environment says.
    pub(crate) fn off() -> Self {
        Self { provider: None }
    }

    /// Stops recording and exports what is still buffered (bounded by the exporter timeout).
    pub(crate) async fn shutdown(self) {
        let Some(provider) = self.provider else {
            return;
        };
        TRACER.store(None);
        // The SDK blocks while its export thread drains; keep the runtime's threads free to
        // drive the gRPC connection meanwhile.
        match tokio::task::spawn_blocking(move || provider.shutdown()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "flushing traces at shutdown failed"),
            Err(e) => tracing::warn!(error = %e, "trace flush task failed"),
        }
    }
}

/// The two W3C trace-context headers, as the propagator reads them.
struct TraceHeaders<'a> {
    traceparent: Option<&'a str>,
    tracestate: Option<&'a str>,
}

impl Extractor for TraceHeaders<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        match key {
            "traceparent" => self.traceparent,
            "tracestate" => self.tracestate,
            _ => None,
        }
    }

    fn keys(&self) -> Vec<&str> {
        vec!["traceparent", "tracestate"]
    }
}

/// One request's spans: `epp.request` and, once the response starts, `response`. Dropping it
/// ends them.
pub(crate) struct RequestTrace {
    /// Declared first so it ends before its parent.
    response: Option<Context>,
    cx: Context,
}

impl RequestTrace {
    /// Opens `epp.request` under the gateway's span named by `traceparent` (a new trace when it
    /// is absent or malformed). `None` when tracing is off.
    pub(crate) fn start(traceparent: Option<&str>, tracestate: Option<&str>) -> Option<Self> {
        let tracer = TRACER.load_full()?;
        let parent = match traceparent {
            Some(_) => TraceContextPropagator::new().extract(&TraceHeaders {
                traceparent,
                tracestate,
            }),
            None => Context::new(),
        };
        let span = tracer
            .span_builder("epp.request")
            .with_kind(SpanKind::Server)
            .start_with_context(tracer.as_ref(), &parent);
        Some(Self {
            response: None,
            cx: parent.with_span(span),
        })
    }

    /// Makes the request span current on this thread until the guard drops.
    pub(crate) fn enter(&self) -> ContextGuard {
        self.cx.clone().attach()
    }

    /// Opens the `response` span (once).
    pub(crate) fn response_started(&mut self, status: Option<u16>) {
        if self.response.is_some() {
            return;
        }
        let Some(tracer) = TRACER.load_full() else {
            return;
        };
        let mut span = tracer.start_with_context("response", &self.cx);
        if let Some(s) = status {
            span.set_attribute(KeyValue::new("http.response.status_code", i64::from(s)));
        }
        self.response = Some(self.cx.with_span(span));
    }

    /// Marks the request span failed (epp answered the request itself).
    pub(crate) fn fail(&self, message: String) {
        self.cx.span().set_status(Status::error(message));
    }
}

/// Runs `f` with the request's span current (or as is, without a trace).
pub(crate) fn in_scope<R>(trace: Option<&RequestTrace>, f: impl FnOnce() -> R) -> R {
    let _entered = trace.map(RequestTrace::enter);
    f()
}

/// A child span of the current span, current itself until the guard drops; `None` (free) when
/// tracing is off or no request span is current.
#[must_use = "the span ends when the guard drops"]
pub(crate) fn child(name: &'static str) -> Option<ContextGuard> {
    let tracer = TRACER.load();
    let tracer = tracer.as_ref()?;
    let parent = Context::current();
    if !parent.has_active_span() {
        return None;
    }
    let span = tracer.start_with_context(name, &parent);
    Some(parent.with_span(span).attach())
}

/// The `parse` span of an early decision: the body was scanned incrementally as its chunks
/// arrived, so this span marks the scan's result (the model, the stream flag and how much of
/// the body it had read) at the moment of the decision rather than timing one parse.
pub(crate) fn parsed_early(model: &str, stream: bool, body_bytes_seen: usize) {
    let Some(_span) = child("parse") else { return };
    annotate(|| {
        vec![
            KeyValue::new("epp.model", model.to_owned()),
            KeyValue::new("epp.stream", stream),
            KeyValue::new("epp.early_decision", true),
            KeyValue::new(
                "epp.body_bytes_seen",
                i64::try_from(body_bytes_seen).unwrap_or(i64::MAX),
            ),
        ]
    });
}

/// Adds attributes to the current span; `attrs` runs only when that span records.
pub(crate) fn annotate(attrs: impl FnOnce() -> Vec<KeyValue>) {
    if TRACER.load().is_none() {
        return;
    }
    get_active_span(|span| {
        if span.is_recording() {
            span.set_attributes(attrs());
        }
    });
}

/// The scheduling decision as span attributes: the chosen endpoint, the ranked destinations
/// and every candidate's final score.
pub(crate) fn annotate_decision<E: std::fmt::Display>(destinations: &[E], scores: &[(E, f64)]) {
    annotate(|| {
        let primary = destinations
            .first()
            .map(ToString::to_string)
            .unwrap_or_default();
        let ranked: Vec<String> = destinations.iter().map(ToString::to_string).collect();
        let scored: Vec<String> = scores.iter().map(|(e, s)| format!("{e}={s:.4}")).collect();
        vec![
            KeyValue::new("epp.endpoint", primary),
            KeyValue::new("epp.destinations", ranked.join(",")),
            KeyValue::new("epp.scores", scored.join(",")),
            KeyValue::new("epp.candidates", scores.len() as i64),
        ]
    });
}

/// Lets one log line through per period and counts the ones held back, so a peer that keeps
/// failing, a stream of bad messages or a render server that is down cannot flood the log.
pub struct LogLimit {
    every: std::time::Duration,
    /// When a line last went out, and how many were held back since.
    state: std::sync::Mutex<(Option<std::time::Instant>, u64)>,
}

impl LogLimit {
    pub(crate) fn new(every: std::time::Duration) -> Self {
        Self {
            every,
            state: std::sync::Mutex::new((None, 0)),
        }
    }

    /// `Some(lines held back since the last one)` when a line may go out now.
    pub(crate) fn allow(&self) -> Option<u64> {
        self.allow_at(std::time::Instant::now())
    }

    pub(crate) fn allow_at(&self, now: std::time::Instant) -> Option<u64> {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        match s.0 {
            Some(last) if now.saturating_duration_since(last) < self.every => {
                s.1 += 1;
                None
            }
            _ => {
                let skipped = s.1;
                *s = (Some(now), 0);
                Some(skipped)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_without_a_tracer() {
        // No test in this crate installs a tracer: every hook is inert.
        assert!(RequestTrace::start(
            Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
            None
        )
        .is_none());
        assert!(child("parse").is_none());
        annotate(|| panic!("attributes built while tracing is off"));
        assert_eq!(in_scope(None, || 7), 7);
    }

    #[test]
    fn traceparent_is_extracted() {
        let h = TraceHeaders {
            traceparent: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
            tracestate: Some("k=v"),
        };
        let cx = TraceContextPropagator::new().extract(&h);
        let sc = cx.span().span_context().clone();
        assert!(sc.is_valid() && sc.is_remote());
        assert_eq!(
            sc.trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(sc.span_id().to_string(), "00f067aa0ba902b7");
        let bad = TraceContextPropagator::new().extract(&TraceHeaders {
            traceparent: Some("garbage"),
            tracestate: None,
        });
        assert!(!bad.span().span_context().is_valid());
    }
}
