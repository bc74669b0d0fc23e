//! Rate-limit algorithms and the stores that keep their counters.
//!
//! Every algorithm is a pure state transition (`algorithm`): given the stored state of one key,
//! the rule's [`Limit`], the time and a cost, it answers a [`Decision`] and an O(1) update to
//! apply if the request is admitted. Stores (`memory`, and behind the [`store::SharedStore`]
//! trait `redis`) only keep state and make a request's checks atomic: every rule is charged,
//! or none is. The `engine` combines a request's rules over them.

pub mod algorithm;
pub mod engine;
pub mod lease;
pub mod memory;
pub mod policy;
pub mod redis;
pub mod settings;
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

/// The numbers of one rule that its algorithm needs. A `Limit` cannot hold a bad value: it is
/// built only by [`Limit::new`] (which validation calls, turning its error into a file:line:col
/// message), so the algorithms and the Lua scripts never guard against a zero limit, burst or
/// window.
#[derive(Clone, Debug, PartialEq)]
pub struct Limit {
    algorithm: Algorithm,
    limit: u64,
    window: Duration,
    burst: u64,
    mode: LeakyMode,
    max_delay: Duration,
}

impl Limit {
    /// A limit, or why it cannot be one: `limit` and `burst` at least 1; a window of at least
    /// 1 ms for every algorithm but concurrency, which has none (a window given to it is
    /// dropped; validation refuses one with its location); `mode` shape only for the leaky
    /// bucket, and a `max_delay` only with it.
    pub fn new(
        algorithm: Algorithm,
        limit: u64,
        window: Duration,
        burst: u64,
        mode: LeakyMode,
        max_delay: Duration,
    ) -> Result<Limit, String> {
        if limit == 0 {
            return Err("limit must be at least 1".into());
        }
        if burst == 0 {
            return Err("burst must be at least 1".into());
        }
        // A concurrency limit has no window: whatever is given is not kept.
        let window = if algorithm == Algorithm::Concurrency {
            Duration::ZERO
        } else if window < Duration::from_millis(1) {
            return Err("window must be at least 1ms".into());
        } else {
            window
        };
        if mode == LeakyMode::Shape && algorithm != Algorithm::LeakyBucket {
            return Err("mode applies to leaky_bucket only".into());
        }
        if mode == LeakyMode::Police && !max_delay.is_zero() {
            return Err("max_delay applies to leaky_bucket with mode = \"shape\" only".into());
        }
        Ok(Limit {
            algorithm,
            limit,
            window,
            burst,
            mode,
            max_delay,
        })
    }

    /// A limit whose leaky bucket, if any, polices (rejects when full) and never holds a
    /// request. For tests and benches, whose numbers are written by hand: panics on a limit
    /// [`Limit::new`] refuses.
    pub fn police(algorithm: Algorithm, limit: u64, window: Duration, burst: u64) -> Self {
        Limit::new(
            algorithm,
            limit,
            window,
            burst,
            LeakyMode::Police,
            Duration::ZERO,
        )
        .expect("a valid hand-written limit")
    }

    /// A shaping leaky bucket: requests wait their turn, up to `max_delay`. For tests and
    /// benches, like [`Limit::police`].
    pub fn shape(limit: u64, window: Duration, burst: u64, max_delay: Duration) -> Self {
        Limit::new(
            Algorithm::LeakyBucket,
            limit,
            window,
            burst,
            LeakyMode::Shape,
            max_delay,
        )
        .expect("a valid hand-written limit")
    }

    /// This limit shared out among `instances` gateways, each getting at least 1 (the `local`
    /// fallback when the store is down).
    pub fn divided(&self, instances: u64) -> Limit {
        let n = instances.max(1);
        Limit {
            limit: (self.limit / n).max(1),
            burst: (self.burst / n).max(1),
            ..self.clone()
        }
    }

    /// The algorithm.
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// Requests per window (concurrency: requests in flight); at least 1.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The window: at least 1 ms, except for concurrency (zero).
    pub fn window(&self) -> Duration {
        self.window
    }

    /// Token bucket: capacity; leaky bucket: how many may be in the bucket; at least 1.
    pub fn burst(&self) -> u64 {
        self.burst
    }

    /// Leaky bucket: police or shape (police for every other algorithm).
    pub fn mode(&self) -> LeakyMode {
        self.mode
    }

    /// Leaky bucket shape mode: the longest a request may be held (zero otherwise).
    pub fn max_delay(&self) -> Duration {
        self.max_delay
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
    /// The counter this request charges: a digest of the rule's key parts' values (already
    /// hashed: network input never reaches a Redis key verbatim). With `rule`, it names one
    /// counter in either store.
    pub counter: u64,
    /// The rule's numbers.
    pub limit: Limit,
    /// How much this request costs (rule `cost`, default 1).
    pub cost: u64,
}
