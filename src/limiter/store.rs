//! The shared store as the engine sees it: a small trait (as envoyproxy/ratelimit's
//! `RateLimitCache`), so that the engine depends on what a shared store promises, not on Redis.
//!
//! [`super::redis::RedisStore`] is the one implementation the gateway runs; the engine's unit
//! tests drive the engine through an in-test implementation to exercise every failure mode,
//! partial admits and lease release without a server.

use std::time::Duration;

use async_trait::async_trait;

use super::{Check, Decision};

/// Why the store could not decide.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// No answer within `store.timeout`.
    #[error("store timed out")]
    Timeout,
    /// The circuit breaker is open: the store is not being called for a cool-down.
    #[error("store circuit breaker open")]
    CircuitOpen,
    /// Redis answered with an error, or the connection failed.
    #[error("store error: {0}")]
    Redis(String),
}

/// How the shared store stands, for `/readyz` and tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreStatus {
    /// Usable right now: connected, the last call succeeded and no circuit breaker holds
    /// calls off.
    pub up: bool,
    /// A connection has been established at least once (it may be failing now).
    pub connected: bool,
    /// Where the store is (`host:port`, comma-separated): safe to log, never a password.
    pub endpoint: String,
    /// The store may evict floodgate's counters under memory pressure (Redis'
    /// `maxmemory-policy`), which silently resets limits.
    pub evicting: bool,
}

/// A store that several gateways share: decides a request's global checks all or nothing,
/// and gives back concurrency slots when the request ends.
#[async_trait]
pub trait SharedStore: Send + Sync {
    /// Decides `checks` (one decision each, in order), giving up after `timeout`. `lease`
    /// identifies this request's concurrency slots: unique per request (a random `u64`), and
    /// passed again to [`SharedStore::release`] once the request ends.
    ///
    /// All or nothing: when any check rejects, the request keeps no concurrency slot in the
    /// store. A store whose atomic steps do not span every key (Redis Cluster: one call per
    /// hash slot) may have charged the steps that admitted; it gives their concurrency slots
    /// back by itself, while the rate units they charged stay charged. On an error the store
    /// likewise gives back whatever the failed call may have taken (only the store knows
    /// whether the call went out). So the engine releases a lease only for requests it kept.
    async fn decide(
        &self,
        checks: &[Check],
        lease: u64,
        timeout: Duration,
    ) -> Result<Vec<Decision>, StoreError>;

    /// Gives back the concurrency slots that `lease` took for `checks` (other checks are
    /// ignored). Best effort: a slot that cannot be released expires with its lease. Called off
    /// the request path, when the request's leases are dropped.
    async fn release(&self, checks: &[Check], lease: u64);

    /// How the store stands right now.
    fn status(&self) -> StoreStatus;

    /// Whether the store is usable right now (what `/readyz` reports): [`StoreStatus::up`].
    fn is_up(&self) -> bool {
        self.status().up
    }
}
