//! Rate-limit algorithms and the stores that keep their counters.
//!
//! Every algorithm is a pure state transition (`algorithm`): given the stored state of one key,
//! the rule's [`Limit`], the time and a cost, it answers a [`Decision`] and an O(1) update to
//! apply if the request is admitted. Stores (`memory`, and behind the [`store::SharedStore`]
//! trait `redis`) only keep state and make a request's checks atomic: every rule is charged,
//! or none is. The `engine` combines a request's rules over them.

pub mod algorithm;
pub mod engine;
pub mod memory;
pub mod redis;
pub mod store;

use std::time::Duration;

/// Which algorithm a rule uses. See the README's "Algorithms" section for each one's guarantee.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// A counter per aligned window: cheap, admits up to `2 * limit` across a window boundary.
    FixedWindow,
    /// Exact: at most `limit` in any interval of length `window`; memory grows with `limit`.
    SlidingWindowLog,
    /// Previous window weighted by its overlap plus the current one: an estimate in O(1) memory.
    SlidingWindowCounter,
    /// Refills `limit / window` tokens per second up to `burst`.
    TokenBucket,
    /// Drains `limit / window` per second with room for `burst` (police or shape).
    LeakyBucket,
    /// At most `limit` requests in flight; released when the exchange ends.
    Concurrency,
}

impl Algorithm {
    /// Every algorithm, in the order the README lists them.
    pub const ALL: [Algorithm; 6] = [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindowLog,
        Algorithm::SlidingWindowCounter,
        Algorithm::TokenBucket,
        Algorithm::LeakyBucket,
        Algorithm::Concurrency,
    ];

    /// Every algorithm with its name in gateway.toml, metrics and the admin API.
    pub const NAMES: &'static [(&'static str, Algorithm)] = &[
        ("fixed_window", Algorithm::FixedWindow),
        ("sliding_window_log", Algorithm::SlidingWindowLog),
        ("sliding_window_counter", Algorithm::SlidingWindowCounter),
        ("token_bucket", Algorithm::TokenBucket),
        ("leaky_bucket", Algorithm::LeakyBucket),
        ("concurrency", Algorithm::Concurrency),
    ];

    /// The name used in gateway.toml, metrics and the admin API.
    pub fn as_str(self) -> &'static str {
        crate::names::name_of(Self::NAMES, self)
    }
}

/// What a leaky bucket does with a request that does not fit right now.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LeakyMode {
    /// Reject when the bucket is full (`burst` requests counted in it).
    Police,
    /// Hold the request until its turn, up to `max_delay` and `burst` waiting, then reject.
    Shape,
}

impl LeakyMode {
    /// Every mode with its gateway.toml name.
    pub const NAMES: &'static [(&'static str, LeakyMode)] =
        &[("police", LeakyMode::Police), ("shape", LeakyMode::Shape)];

    /// The name used in gateway.toml.
    pub fn as_str(self) -> &'static str {
        crate::names::name_of(Self::NAMES, self)
    }
}

/// The numbers of one rule that its algorithm needs, validated by `config`.
#[derive(Clone, Debug, PartialEq)]
pub struct Limit {
    /// The algorithm.
    pub algorithm: Algorithm,
    /// Requests per window (concurrency: requests in flight). Always at least 1.
    pub limit: u64,
    /// The window (unused by concurrency). Always at least 1 ms for windowed algorithms.
    pub window: Duration,
    /// Token bucket: capacity; leaky bucket: how many may be in the bucket. Defaults to `limit`.
    pub burst: u64,
    /// Leaky bucket only.
    pub mode: LeakyMode,
    /// Leaky bucket shape mode: the longest a request may be held.
    pub max_delay: Duration,
}

impl Limit {
    /// A limit whose leaky bucket, if any, polices (rejects when full) and never holds a
    /// request.
    pub fn police(algorithm: Algorithm, limit: u64, window: Duration, burst: u64) -> Self {
        Limit {
            algorithm,
            limit,
            window,
            burst,
            mode: LeakyMode::Police,
            max_delay: Duration::ZERO,
        }
    }

    /// A shaping leaky bucket: requests wait their turn, up to `max_delay`.
    pub fn shape(limit: u64, window: Duration, burst: u64, max_delay: Duration) -> Self {
        Limit {
            mode: LeakyMode::Shape,
            max_delay,
            ..Limit::police(Algorithm::LeakyBucket, limit, window, burst)
        }
    }
}

/// The answer of one rule for one request: pure data, from any algorithm and any store, read
/// by the response builder.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// Whether this rule lets the request through.
    pub allowed: bool,
    /// The rule's quota (`q` of `RateLimit-Policy`): limit, or burst where burst is the
    /// bucket size.
    pub limit: u64,
    /// Quota left after this request (`r` of `RateLimit`), 0 when rejected.
    pub remaining: u64,
    /// Time until the quota is fully back (`t` of `RateLimit`).
    pub reset: Duration,
    /// When rejected: time after which the same request would be admitted.
    pub retry_after: Duration,
    /// Leaky bucket shape mode: how long to hold the admitted request before forwarding it.
    pub delay: Duration,
}

impl Decision {
    /// A decision that admits without counting (fail-open): the quota is shown as full.
    pub fn unlimited(limit: u64) -> Self {
        Decision {
            allowed: true,
            limit,
            remaining: limit,
            reset: Duration::ZERO,
            retry_after: Duration::ZERO,
            delay: Duration::ZERO,
        }
    }
}

/// One rule's question to a store: may `cost` more be charged to `key` under `limit`?
#[derive(Clone, Debug)]
pub struct Check {
    /// The rule's name: state is keyed by it, so a reload that changes the rule's numbers keeps
    /// its counters.
    pub rule: std::sync::Arc<str>,
    /// A digest of the rule's key values (already hashed: network input never reaches a store
    /// key verbatim).
    pub key: u64,
    /// The rule's numbers.
    pub limit: Limit,
    /// How much this request costs (rule `cost`, default 1).
    pub cost: u64,
}
