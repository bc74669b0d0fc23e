//! Per-upstream and per-target metrics, registered in the process registry
//! ([`crate::metrics::Metrics::register`]) the first time they are used.
//!
//! - `floodgate_upstream_target_healthy{upstream,target}`: 1 when the target may get traffic
//!   (resolved, passing its active checks, not ejected), 0 when not.
//! - `floodgate_upstream_target_responses_total{upstream,target,class}`: attempts by outcome,
//!   `class` = `1xx`, `2xx`, `3xx`, `4xx`, `5xx`, or `error` (no response: connect failure, reset,
//!   timeout).
//! - `floodgate_upstream_target_duration_seconds{upstream,target}`: from sending a request to
//!   the target to its response header.

use std::sync::LazyLock;

use prometheus::{HistogramOpts, IntGaugeVec, Opts};

use crate::metrics::shards::{Counter, CounterVec, Histogram, HistogramVec};

/// The upstream metric families.
pub struct UpstreamMetrics {
    /// `floodgate_upstream_target_healthy{upstream,target}`.
    pub healthy: IntGaugeVec,
    /// `floodgate_upstream_target_responses_total{upstream,target,class}`.
    pub responses: CounterVec,
    /// `floodgate_upstream_target_duration_seconds{upstream,target}`.
    pub seconds: HistogramVec,
}

/// The process-wide upstream metrics.
pub fn upstream_metrics() -> &'static UpstreamMetrics {
    static M: LazyLock<UpstreamMetrics> = LazyLock::new(|| {
        let healthy = IntGaugeVec::new(
            Opts::new(
                "floodgate_upstream_target_healthy",
                "1 when an upstream target may get traffic (resolved, passing health checks, not ejected).",
            ),
            &["upstream", "target"],
        )
        .expect("static metric definition");
        let responses = CounterVec::new(
            Opts::new(
                "floodgate_upstream_target_responses_total",
                "Attempts sent to an upstream target, by outcome class (2xx, 3xx, 4xx, 5xx, error).",
            ),
            &["upstream", "target", "class"],
        )
        .expect("static metric definition");
        let seconds = crate::metrics::shards::histogram_vec(
            HistogramOpts::new(
                "floodgate_upstream_target_duration_seconds",
                "Time from sending a request to an upstream target to its response header.",
            )
            .buckets(vec![
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                10.0, 30.0,
            ]),
            &["upstream", "target"],
        )
        .expect("static metric definition");
        let m = crate::metrics::metrics();
        m.register(Box::new(healthy.clone()));
        m.register(Box::new(responses.clone()));
        m.register(Box::new(seconds.clone()));
        UpstreamMetrics {
            healthy,
            responses,
            seconds,
        }
    });
    &M
}

/// The `class` label of a status.
pub fn class(status: u16) -> &'static str {
    match status {
        100..=199 => "1xx",
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        500..=599 => "5xx",
        _ => "error",
    }
}

/// One target's counters and histogram, looked up once (the request path then increments
/// handles it holds instead of hashing labels per request).
pub struct TargetMetrics {
    /// By class: `1xx`, `2xx`, `3xx`, `4xx`, `5xx`, `error`.
    classes: [Counter; 6],
    seconds: Histogram,
}

impl std::fmt::Debug for TargetMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TargetMetrics")
    }
}

const CLASSES: [&str; 6] = ["1xx", "2xx", "3xx", "4xx", "5xx", "error"];

impl TargetMetrics {
    /// The handles of (`upstream`, `target`).
    pub fn new(upstream: &str, target: &str) -> TargetMetrics {
        let m = upstream_metrics();
        TargetMetrics {
            classes: CLASSES.map(|c| m.responses.with_label_values(&[upstream, target, c])),
            seconds: m.seconds.with_label_values(&[upstream, target]),
        }
    }

    /// Counts one attempt: its status (`None`: no response) and time to the response header.
    pub fn count(&self, status: Option<u16>, took: Option<std::time::Duration>) {
        let class = class(status.unwrap_or(0));
        let i = CLASSES.iter().position(|c| *c == class).unwrap_or(5);
        self.classes[i].inc();
        if let Some(d) = took {
            self.seconds.observe(d.as_secs_f64());
        }
    }
}
