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
//! and keeps `None` (no span objects, no context extraction, no allocation). With it, the
//! sampling decision comes first ([`sampler`]): an unsampled request keeps the two ids
//! propagation needs and nothing else. A sampled request records its spans as plain records
//! ([`span`]: ids, times, typed attributes, nothing formatted) and queues each finished one;
//! the export thread encodes them into OTLP protobuf by hand ([`otlp`]) and sends batches on
//! one kept-alive connection ([`export`]), never blocking the request path.
//!
//! Reload: `sample_ratio` and `trust_incoming` take effect at once; the exporter's settings
//! (`otlp_endpoint`, `protocol`, `service_name`, `resource_attributes`, `export_timeout`,
//! `max_queue_size`, `max_export_batch_size`, `schedule_delay`) are fixed when the first traced
//! request starts the exporter, and need a restart.

mod export;
mod otlp;
pub mod propagation;
mod request;
mod sampler;
mod span;

use std::sync::OnceLock;

pub use crate::config::telemetry::{Protocol, Settings};
pub use request::{Decision, RequestTrace, RuleVerdict, Upstream};

/// The process's exporter, started by the first traced request.
struct Telemetry {
    /// Where finished spans go.
    queue: export::Queue,
    ratio: sampler::Ratio,
}

static TELEMETRY: OnceLock<Option<Telemetry>> = OnceLock::new();

/// The exporter for `settings`, starting it on first use. `None` when the export thread could
/// not start (logged once).
fn tracer(settings: &Settings) -> Option<&'static Telemetry> {
    TELEMETRY
        .get_or_init(|| Telemetry::start(settings))
        .as_ref()
}

impl Telemetry {
    fn start(settings: &Settings) -> Option<Telemetry> {
        let queue = export::start(settings)?;
        tracing::info!(
            endpoint = %settings.endpoint,
            protocol = settings.protocol.as_str(),
            sample_ratio = settings.sample_ratio,
            "trace export started"
        );
        Some(Telemetry {
            queue,
            ratio: sampler::Ratio::new(settings.sample_ratio),
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
