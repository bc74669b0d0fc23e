//! The service's own metrics; per-limit decisions are counted on the rules' series
//! (`floodgate_ratelimit_decisions_total{rule}` and `floodgate_failure_mode_decisions_total`,
//! labelled with the limit's name), by the engine, as for rules.

use std::sync::LazyLock;

use prometheus::{IntCounter, IntCounterVec, Opts};

use crate::metrics::metrics;

/// `floodgate_rls_requests_total{result}` and
/// `floodgate_rls_unmatched_descriptors_total{domain}`.
pub struct RlsMetrics {
    /// `result`: `ok`, `over_limit`, `unavailable` (a closed limit and a failing store) or
    /// `invalid` (refused before matching).
    pub requests: IntCounterVec,
    /// `requests` of each result, looked up once: every call counts one, and a label lookup
    /// (hashing the label, a read lock) per call is a cost all the service's threads share.
    pub answered: Answered,
    /// Descriptors no limit matched, by domain: a configured domain, or `other` for any
    /// domain no limit names (the label never takes a client's text).
    pub unmatched: IntCounterVec,
}

/// The handles of `floodgate_rls_requests_total`, one per result.
pub struct Answered {
    /// `result="ok"`.
    pub ok: IntCounter,
    /// `result="over_limit"`.
    pub over_limit: IntCounter,
    /// `result="unavailable"`.
    pub unavailable: IntCounter,
    /// `result="invalid"`.
    pub invalid: IntCounter,
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
        let answered = Answered {
            ok: requests.with_label_values(&["ok"]),
            over_limit: requests.with_label_values(&["over_limit"]),
            unavailable: requests.with_label_values(&["unavailable"]),
            invalid: requests.with_label_values(&["invalid"]),
        };
        metrics().register(Box::new(requests.clone()));
        metrics().register(Box::new(unmatched.clone()));
        RlsMetrics {
            requests,
            answered,
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
