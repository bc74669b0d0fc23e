//! The limiter's own settings: where shared counters live and how the stores are bounded.
//! `[store]` of gateway.toml is validated into these (see `crate::config`), and the limiter
//! reads nothing else of the config.

use std::time::Duration;

/// Where global counters live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// In process (default): one instance.
    Memory,
    /// One Redis server.
    Redis,
    /// A Redis Cluster.
    RedisCluster,
}

impl Backend {
    /// Every backend with its gateway.toml name.
    pub const NAMES: &'static [(&'static str, Backend)] = &[
        ("memory", Backend::Memory),
        ("redis", Backend::Redis),
        ("redis-cluster", Backend::RedisCluster),
    ];

    /// The name used in gateway.toml.
    pub fn as_str(self) -> &'static str {
        crate::text::names::name_of(Self::NAMES, self)
    }
}

/// `[store]`: the limiter's store settings. Backend-neutral: what a Redis client needs is
/// made from `urls` by the Redis store itself ([`crate::limiter::backend::open`]), with the
/// same parser validation judged them by, so opening cannot fail on a config that passed
/// `check`.
#[derive(Debug, Clone, PartialEq)]
pub struct Store {
    /// The backend.
    pub backend: Backend,
    /// Redis URL(s): one for `redis`, the seed nodes for `redis-cluster`, none for memory.
    pub urls: Vec<String>,
    /// Budget for one decision.
    pub timeout: Duration,
    /// Prefix of every Redis key.
    pub key_prefix: String,
    /// Gateway instances sharing the limits (divides limits for the `local` fallback).
    pub instances: u64,
    /// Bound of the in-process store (keys), for memory and the local fallback.
    pub max_keys: usize,
    /// Bound of the in-process ban tables (`block_for` bans, and bans remembered from Redis),
    /// apart from `max_keys` so that a flood of counters never evicts a ban.
    pub max_bans: usize,
    /// How long a start waits for Redis (connected, scripts loaded, a cluster's slots read)
    /// before the proxy listeners accept; past it they accept anyway and each rule's
    /// `on_store_error` applies until Redis answers.
    pub connect_timeout: Duration,
}

/// `[store] max_bans` when not set.
pub const DEFAULT_MAX_BANS: usize = 100_000;

/// `[store] connect_timeout` when not set.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
