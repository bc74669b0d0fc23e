//! Token metrics, registered in the process registry the first time they are used:
//!
//! - `floodgate_jwt_verifications_total{issuer,result}`: tokens by outcome, `ok` (verified),
//!   `cached` (verified before, still valid) or the reason a token was refused
//!   ([`super::Reason::as_str`]); `issuer` is `unknown` for a token no configured issuer signs.
//! - `floodgate_jwks_fetches_total{issuer,result}`: JWK Set fetches, `ok` or `error`.
//! - `floodgate_jwks_refetch_skipped_total{issuer}`: fetches for an unknown `kid` not made
//!   because one started less than `min_refetch` before.
//! - `floodgate_jwks_age_seconds{issuer}`: seconds since the set was last fetched (set when
//!   the metrics are read; absent before a first success).
//! - `floodgate_jwks_keys{issuer}`: keys in the set in force.

use std::sync::LazyLock;

use prometheus::{IntGaugeVec, Opts};

use crate::metrics::shards::CounterVec;

/// The token metric families.
pub struct JwtMetrics {
    /// `floodgate_jwt_verifications_total{issuer,result}`.
    pub verifications: CounterVec,
    /// `floodgate_jwks_fetches_total{issuer,result}`.
    pub fetches: CounterVec,
    /// `floodgate_jwks_refetch_skipped_total{issuer}`.
    pub refetch_skipped: CounterVec,
    /// `floodgate_jwks_age_seconds{issuer}`.
    pub age: IntGaugeVec,
    /// `floodgate_jwks_keys{issuer}`.
    pub keys: IntGaugeVec,
}

/// The process-wide token metrics.
pub fn jwt_metrics() -> &'static JwtMetrics {
    static M: LazyLock<JwtMetrics> = LazyLock::new(|| {
        let counter = |name: &str, help: &str, labels: &[&str]| {
            let c =
                CounterVec::new(Opts::new(name, help), labels).expect("static metric definition");
            crate::metrics::metrics().register(Box::new(c.clone()));
            c
        };
        let gauge = |name: &str, help: &str| {
            let g = IntGaugeVec::new(Opts::new(name, help), &["issuer"])
                .expect("static metric definition");
            crate::metrics::metrics().register(Box::new(g.clone()));
            g
        };
        JwtMetrics {
            verifications: counter(
                "floodgate_jwt_verifications_total",
                "Bearer tokens by outcome: ok, cached, or the reason the token was refused.",
                &["issuer", "result"],
            ),
            fetches: counter(
                "floodgate_jwks_fetches_total",
                "JWK Set fetches by result (ok, error).",
                &["issuer", "result"],
            ),
            refetch_skipped: counter(
                "floodgate_jwks_refetch_skipped_total",
                "Fetches for a token's unknown kid not made: one started less than min_refetch before.",
                &["issuer"],
            ),
            age: gauge(
                "floodgate_jwks_age_seconds",
                "Seconds since the issuer's JWK Set was last fetched.",
            ),
            keys: gauge("floodgate_jwks_keys", "Keys in the issuer's JWK Set in force."),
        }
    });
    &M
}
