//! The sampler: parent-based over a trace-id ratio that a reload can change.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use opentelemetry::trace::{Link, SpanKind, TraceId};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::{Sampler, SamplingResult, ShouldSample};

/// The root sampler of [`Sampler::ParentBased`]: `TraceIdRatioBased` at the ratio in force
/// (the SDK's own ratio sampler is fixed when the provider is built; `sample_ratio` is
/// hot-reloaded).
#[derive(Debug, Clone)]
pub(super) struct Ratio(Arc<AtomicU64>);

impl Ratio {
    /// A sampler at `ratio`.
    pub(super) fn new(ratio: f64) -> Self {
        Ratio(Arc::new(AtomicU64::new(ratio.to_bits())))
    }

    /// Puts `ratio` in force for traces started from now on.
    pub(super) fn set(&self, ratio: f64) {
        self.0.store(ratio.to_bits(), Ordering::Relaxed);
    }

    fn get(&self) -> f64 {
        f64::from_bits(self.0.load(Ordering::Relaxed))
    }
}

impl ShouldSample for Ratio {
    fn should_sample(
        &self,
        parent_context: Option<&Context>,
        trace_id: TraceId,
        name: &str,
        span_kind: &SpanKind,
        attributes: &[KeyValue],
        links: &[Link],
    ) -> SamplingResult {
        Sampler::TraceIdRatioBased(self.get()).should_sample(
            parent_context,
            trace_id,
            name,
            span_kind,
            attributes,
            links,
        )
    }
}
