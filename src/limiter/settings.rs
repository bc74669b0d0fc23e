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
        crate::names::name_of(Self::NAMES, self)
    }
}

/// `[store]`: the limiter's store settings.
#[derive(Debug, Clone)]
pub struct Store {
    /// The backend.
    pub backend: Backend,
    /// Redis URL(s): one for `redis`, the seed nodes for `redis-cluster`, none for memory.
    pub urls: Vec<String>,
    /// `urls` parsed into the client the Redis store connects with, by validation (the same
    /// parser and construction the store would use, so building the store cannot fail on a
    /// config that passed `check`). `None` for memory, and for settings made by hand in tests,
    /// which the store then parses itself.
    pub redis: Option<crate::limiter::redis::RedisClient>,
    /// Budget for one decision.
    pub timeout: Duration,
    /// Prefix of every Redis key.
    pub key_prefix: String,
    /// Gateway instances sharing the limits (divides limits for the `local` fallback).
    pub instances: u64,
    /// Bound of the in-process store (keys), for memory and the local fallback.
    pub max_keys: usize,
}

/// Settings are equal when the file says the same: the parsed client follows from `urls`.
impl PartialEq for Store {
    fn eq(&self, other: &Store) -> bool {
        self.backend == other.backend
            && self.urls == other.urls
            && self.timeout == other.timeout
            && self.key_prefix == other.key_prefix
            && self.instances == other.instances
            && self.max_keys == other.max_keys
    }
}
