//! The service's own metrics; per-limit decisions are counted on the rules' series
//! (`floodgate_ratelimit_decisions_total{rule}` and `floodgate_failure_mode_decisions_total`,
//! labelled with the limit's name), by the engine, as for rules.

use std::sync::LazyLock;

use prometheus::{IntCounterVec, Opts};

use crate::metrics::metrics;

/// `floodgate_rls_requests_total{result}` and
/// `floodgate_rls_unmatched_descriptors_total{domain}`.
pub struct RlsMetrics {
    /// `result`: `ok`, `over_limit`, `unavailable` (a closed limit and a failing store) or
    /// `invalid` (refused before matching).
    pub requests: IntCounterVec,
    /// Descriptors no limit matched, by domain: a configured domain, or `other` for any
    /// domain no limit names (the label never takes a client's text).
    pub unmatched: IntCounterVec,
}

/// The label of descriptors of a domain no limit names.
pub const OTHER_DOMAIN: &str = "other";

/// The process-wide RLS metrics, registered on first use.
pub fn rls_metrics() -> &'static RlsMetrics {
    static M: LazyLock<RlsMetrics> = LazyLock::new(|| {
        let requests = IntCounterVec::new(
            Opts::new(
                "floodgate_rls_requests_total",
                "ShouldRateLimit calls answered by the rate-limit service, by result (ok, over_limit, unavailable, invalid).",
            ),
            &["result"],
        )
        .expect("valid metric");
        let unmatched = IntCounterVec::new(
            Opts::new(
                "floodgate_rls_unmatched_descriptors_total",
                "Descriptors that matched no [[rls.limits]] entry (answered OK), by domain (other: a domain no limit names).",
            ),
            &["domain"],
        )
        .expect("valid metric");
        for result in ["ok", "over_limit", "unavailable", "invalid"] {
            requests.with_label_values(&[result]);
        }
        metrics().register(Box::new(requests.clone()));
        metrics().register(Box::new(unmatched.clone()));
        RlsMetrics {
            requests,
            unmatched,
        }
    });
    &M
}

/// Exports the series of a config's `[rls]` at 0 as it is put in force (every result, the
/// `other` domain and each configured one), so that a panel shows 0 before the first call.
pub fn register(rls: Option<&super::limits::Settings>) {
    let m = rls_metrics();
    m.unmatched.with_label_values(&[OTHER_DOMAIN]);
    for l in rls.iter().flat_map(|r| &r.limits) {
        m.unmatched.with_label_values(&[&l.domain]);
    }
}
