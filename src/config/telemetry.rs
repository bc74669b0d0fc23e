//! `[tracing]` as the rest of the gateway reads it: validated, typed, immutable (plain data;
//! `crate::telemetry` runs it).

use std::time::Duration;

/// How spans travel to the collector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// OTLP/gRPC (`opentelemetry.proto.collector.trace.v1.TraceService/Export`), port 4317 by
    /// convention.
    Grpc,
    /// OTLP/HTTP with protobuf bodies, POSTed to the endpoint (`…/v1/traces`), port 4318 by
    /// convention.
    HttpProtobuf,
}

impl Protocol {
    /// The name `protocol` takes in gateway.toml (OpenTelemetry's `OTEL_EXPORTER_OTLP_PROTOCOL`
    /// spelling).
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Grpc => "grpc",
            Protocol::HttpProtobuf => "http/protobuf",
        }
    }
}

/// `[tracing]`: where spans go, which requests are sampled, whose trace context is believed.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// The collector's URL (`otlp_endpoint`).
    pub endpoint: String,
    /// gRPC, or HTTP/protobuf (`protocol`; by default HTTP/protobuf when the endpoint's path
    /// is `/v1/traces`, else gRPC).
    pub protocol: Protocol,
    /// `service.name` of the spans' resource.
    pub service_name: String,
    /// The share of new traces sampled (0..=1); a continued trace follows its parent's flag.
    /// Hot-reloaded.
    pub sample_ratio: f64,
    /// Continue the `traceparent` of any client (true), or only of peers in
    /// `server.trusted_proxies` (false, the default). Hot-reloaded.
    pub trust_incoming: bool,
    /// More attributes of the spans' resource (`deployment.environment`, `service.version`, …).
    pub resource_attributes: Vec<(String, String)>,
    /// How long one export (one batch) may take before its spans are counted as dropped.
    pub export_timeout: Duration,
    /// Finished spans waiting for export at most; past it new spans are dropped and counted.
    pub max_queue_size: usize,
    /// Spans per export call at most.
    pub max_export_batch_size: usize,
    /// How often, at most, the exporter looks at the queue (and so the longest a span waits);
    /// sooner when spans come fast enough to fill a quarter of it before then.
    pub schedule_delay: Duration,
}

/// Defaults: those of the OpenTelemetry SDKs' batch processor where the SDKs agree, with a
/// shorter delay so that a trace shows up while its operator is still looking for it.
impl Settings {
    /// `otlp_endpoint` when none is given: a collector on the same host (OTLP/gRPC).
    pub const DEFAULT_ENDPOINT: &'static str = "http://127.0.0.1:4317";
    /// `service_name` when none is given.
    pub const DEFAULT_SERVICE_NAME: &'static str = "floodgate";
    /// `sample_ratio` when none is given: one new trace in a hundred (a caller's sampled
    /// trace is always continued), which keeps the cost under 2% (docs/benchmarks.md).
    pub const DEFAULT_SAMPLE_RATIO: f64 = 0.01;
    /// `export_timeout` when none is given.
    pub const DEFAULT_EXPORT_TIMEOUT: Duration = Duration::from_secs(10);
    /// `max_queue_size` when none is given.
    pub const DEFAULT_MAX_QUEUE_SIZE: usize = 8192;
    /// Largest `max_queue_size`: 1M spans is about 1 GB of memory at worst.
    pub const MAX_QUEUE_SIZE: usize = 1_000_000;
    /// `max_export_batch_size` when none is given.
    pub const DEFAULT_MAX_EXPORT_BATCH_SIZE: usize = 512;
    /// `schedule_delay` when none is given.
    pub const DEFAULT_SCHEDULE_DELAY: Duration = Duration::from_millis(200);
}
