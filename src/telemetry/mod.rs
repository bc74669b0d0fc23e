//! Distributed tracing (`[tracing]`): W3C trace context continued from trusted callers and
//! passed to the upstream, OpenTelemetry spans of every request's work, exported over OTLP.
//!
//! Per request: one server span (`SpanKind::Server`, HTTP server semantic conventions), a child
//! `floodgate.admission` span with the rules that applied and their verdicts (one
//! `floodgate.rule` event each), a `floodgate.store` client span for the shared store's call
//! when there was one, and a client span for the upstream exchange, whose id goes upstream as
//! the `traceparent` parent. The RLS port records its decision the same way, continuing the
//! context Envoy sends in gRPC metadata.
//!
//! Cost: without `[tracing]` nothing here runs: the proxy checks one `Option` of the config
//! and keeps `None` (no span objects, no context extraction, no allocation). With it, spans
//! are built with the OpenTelemetry API and SDK directly (not through `tracing-opentelemetry`,
//! which would turn every `tracing` span of the process into OpenTelemetry work), and the
//! export never blocks the request path ([`export`]).
//!
//! Reload: `sample_ratio` and `trust_incoming` take effect at once; the exporter's settings
//! (`otlp_endpoint`, `protocol`, `service_name`, `resource_attributes`, `export_timeout`,
//! `max_queue_size`, `max_export_batch_size`, `schedule_delay`) are fixed when the first traced
//! request starts the exporter, and need a restart.

mod export;
pub mod propagation;
mod request;
mod sampler;

use std::sync::OnceLock;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry::KeyValue;
use opentelemetry_sdk::trace::{Sampler, SdkTracer, SdkTracerProvider};
use opentelemetry_sdk::Resource;

pub use crate::config::telemetry::{Protocol, Settings};
pub use request::{Decision, RequestTrace, RuleVerdict, Upstream};

/// The process's tracer, started by the first traced request.
struct Telemetry {
    /// Keeps the provider (and so the processor and its queue) alive.
    _provider: SdkTracerProvider,
    tracer: SdkTracer,
    ratio: sampler::Ratio,
}

static TELEMETRY: OnceLock<Option<Telemetry>> = OnceLock::new();

/// The tracer for `settings`, starting the exporter on first use. `None` when the export
/// thread could not start (logged once).
fn tracer(settings: &Settings) -> Option<&'static Telemetry> {
    TELEMETRY
        .get_or_init(|| Telemetry::start(settings))
        .as_ref()
}

impl Telemetry {
    fn start(settings: &Settings) -> Option<Telemetry> {
        let resource = Resource::builder_empty()
            .with_service_name(settings.service_name.clone())
            .with_attributes(
                settings
                    .resource_attributes
                    .iter()
                    .map(|(k, v)| KeyValue::new(k.clone(), v.clone())),
            )
            .with_attribute(KeyValue::new("telemetry.sdk.language", "rust"))
            .with_attribute(KeyValue::new("telemetry.sdk.name", "opentelemetry"))
            .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
            .build();
        let processor = export::start(settings, resource.clone())?;
        let ratio = sampler::Ratio::new(settings.sample_ratio);
        // The decision is floodgate's, made before a span is built (`RequestTrace::start`):
        // the SDK is asked only for sampled traces, whose root it records and whose children
        // follow their parent.
        let provider = SdkTracerProvider::builder()
            .with_sampler(Sampler::ParentBased(Box::new(Sampler::AlwaysOn)))
            .with_span_processor(processor)
            .with_resource(resource)
            .build();
        let tracer = provider.tracer("floodgate");
        tracing::info!(
            endpoint = %settings.endpoint,
            protocol = settings.protocol.as_str(),
            sample_ratio = settings.sample_ratio,
            "trace export started"
        );
        Some(Telemetry {
            _provider: provider,
            tracer,
            ratio,
        })
    }
}

/// A reload put `settings` in force: the sampling ratio follows at once (the rest needs a
/// restart, see the module doc).
pub fn reconfigure(settings: Option<&Settings>) {
    if let (Some(s), Some(Some(t))) = (settings, TELEMETRY.get()) {
        t.ratio.set(s.sample_ratio);
    }
}

/// The `[tracing]` keys whose change needs a restart, as `restart_only_changes` lists them.
pub fn restart_only_changes(old: Option<&Settings>, new: Option<&Settings>) -> Vec<&'static str> {
    // Adding or removing the section is hot: requests are traced while the config in force
    // has one (the exporter starts with the first of them).
    let (Some(a), Some(b)) = (old, new) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut check = |name, changed: bool| {
        if changed {
            out.push(name);
        }
    };
    check("tracing.otlp_endpoint", a.endpoint != b.endpoint);
    check("tracing.protocol", a.protocol != b.protocol);
    check("tracing.service_name", a.service_name != b.service_name);
    check(
        "tracing.resource_attributes",
        a.resource_attributes != b.resource_attributes,
    );
    check(
        "tracing.export_timeout",
        a.export_timeout != b.export_timeout,
    );
    check(
        "tracing.max_queue_size",
        a.max_queue_size != b.max_queue_size,
    );
    check(
        "tracing.max_export_batch_size",
        a.max_export_batch_size != b.max_export_batch_size,
    );
    check(
        "tracing.schedule_delay",
        a.schedule_delay != b.schedule_delay,
    );
    out
}
