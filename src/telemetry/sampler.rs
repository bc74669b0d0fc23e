//! The sampling decision: parent-based over a trace-id ratio that a reload can change. It is
//! made before anything of a span is built ([`super::RequestTrace`]): an unsampled request
//! builds no span at all, only the ids propagation needs.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The ratio in force (`sample_ratio`, hot-reloaded): the decision is made
/// before anything of a span is built.
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

    /// Whether a new trace is sampled at the ratio in force, drawn from the random `trace_id`
    /// the trace would have unsampled (its low 63 bits against the ratio, as OpenTelemetry's
    /// `TraceIdRatioBased` reads an id).
    pub(super) fn samples(&self, trace_id: [u8; 16]) -> bool {
        let ratio = self.get();
        if ratio >= 1.0 {
            return true;
        }
        let bound = (ratio.max(0.0) * (1u64 << 63) as f64) as u64;
        let low = u64::from_be_bytes(trace_id[8..].try_into().unwrap_or_default());
        (low >> 1) < bound
    }
}
