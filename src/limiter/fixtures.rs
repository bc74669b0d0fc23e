//! What the limiter's unit tests build again and again, built once: a check of a policing
//! rule, a policy with the gateway's defaults.

use std::sync::Arc;
use std::time::Duration;

use super::policy::{Policy, Scope};
use super::{Algorithm, Check, Limit};

/// A check of rule `rule` on counter `counter` (cost 1) by `algorithm`, `limit` per `window`
/// with a burst of `burst`, rejecting past it.
pub fn check(
    rule: &str,
    counter: u64,
    algorithm: Algorithm,
    limit: u64,
    window: Duration,
    burst: u64,
) -> Check {
    Check {
        rule: Arc::from(rule),
        counter,
        limit: Limit::police(algorithm, limit, window, burst),
        cost: 1,
    }
}

/// A local policy named `name`: a fixed window of `limit` a second, every other option at its
/// gateway.toml default.
pub fn policy(name: &str, limit: u64) -> Arc<Policy> {
    let limit = Limit::police(Algorithm::FixedWindow, limit, Duration::from_secs(1), 1);
    Arc::new(Policy::with_defaults(name, limit, Scope::Local))
}
