//! Rate-limit algorithms and the stores that keep their counters.
//!
//! Every algorithm is a pure state transition (`algorithm`): given the stored state of one key,
//! the rule's [`Limit`], the time and a cost, it answers a [`Decision`] and an O(1) update to
//! apply if the request is admitted. Stores (`memory` and `redis`, both behind the
//! [`store::SharedStore`] trait; `backend` opens the one `[store]` names) only keep state and
//! make a request's checks atomic: every rule is charged, or none is. The `engine` combines a
//! request's rules over them.

pub mod algorithm;
pub mod backend;
pub mod calendar;
pub mod engine;
#[cfg(test)]
mod fixtures;
pub mod lease;
pub mod memory;
pub mod policy;
pub mod redis;
pub mod reservation;
pub mod settings;
pub mod store;
pub mod true_up;

use std::sync::Arc;
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
        crate::text::names::name_of(Self::NAMES, self)
    }

    /// What this algorithm allows and how it counts: the one place that decides it. The
    /// match has no `_` arm, so a new algorithm does not compile until it states each
    /// capability; validation, [`Limit::new`], leasing, the Redis scripts' parameters and
    /// `describe` all read this instead of naming algorithms.
    pub const fn capabilities(self) -> Capabilities {
        match self {
            Algorithm::FixedWindow => Capabilities {
                window: Window::Required,
                burst: false,
                limit_cap: None,
                shaping: None,
                lease_refused: None,
                lua: LuaFn::new(1, "fixed_window"),
                holds_slots: false,
                calendar: true,
                grant: true,
                settle_refused: None,
                slow_refused: None,
            },
            Algorithm::SlidingWindowLog => Capabilities {
                window: Window::Required,
                burst: false,
                limit_cap: Some(LimitCap {
                    max: algorithm::MAX_SLIDING_LOG_LIMIT,
                    why: "sliding_window_log keeps one timestamp per request",
                    instead: "use sliding_window_counter for larger limits",
                }),
                shaping: None,
                lease_refused: Some("sliding_window_log keeps one timestamp per request, so permits cannot be handed out in advance; use sliding_window_counter"),
                lua: LuaFn::new(2, "sliding_window_log"),
                holds_slots: false,
                calendar: false,
                grant: false,
                settle_refused: None,
                slow_refused: None,
            },
            Algorithm::SlidingWindowCounter => Capabilities {
                window: Window::Required,
                burst: false,
                limit_cap: None,
                shaping: None,
                lease_refused: None,
                lua: LuaFn::new(3, "sliding_window_counter"),
                holds_slots: false,
                calendar: false,
                grant: false,
                settle_refused: None,
                slow_refused: None,
            },
            Algorithm::TokenBucket => Capabilities {
                window: Window::Required,
                burst: true,
                limit_cap: None,
                shaping: None,
                lease_refused: None,
                lua: LuaFn::new(4, "token_bucket"),
                holds_slots: false,
                calendar: false,
                grant: false,
                settle_refused: None,
                slow_refused: None,
            },
            Algorithm::LeakyBucket => Capabilities {
                window: Window::Required,
                burst: true,
                limit_cap: None,
                shaping: Some(Shaping {
                    lua: LuaFn::new(6, "leaky_bucket_shape"),
                    lease_refused: "a shaping leaky bucket spaces requests one by one in a shared queue, which leased permits would jump; use mode = \"police\"",
                }),
                lease_refused: None,
                lua: LuaFn::new(5, "leaky_bucket_police"),
                holds_slots: false,
                calendar: false,
                grant: false,
                settle_refused: None,
                // A slowing leaky bucket polices (counts, never holds) and slows what it
                // would reject; mode = "shape" is the other mode, so the two never meet.
                slow_refused: None,
            },
            Algorithm::Concurrency => Capabilities {
                window: Window::None {
                    why: "concurrency limits requests in flight",
                },
                burst: false,
                limit_cap: None,
                shaping: None,
                lease_refused: Some("concurrency counts requests in flight, not a rate; its slots are already held per request"),
                lua: LuaFn::new(7, "concurrency"),
                holds_slots: true,
                calendar: false,
                grant: false,
                settle_refused: Some("concurrency counts requests in flight, released when each ends; there is no charge for a response to refund"),
                slow_refused: Some("concurrency counts requests in flight, and a slowed request stays in flight longer: slowing would add load instead of shedding it"),
            },
        }
    }

    /// The names of the algorithms that have a capability, for error messages:
    /// `token_bucket and leaky_bucket`, `a, b and c`.
    pub fn names_where(has: fn(Capabilities) -> bool) -> String {
        let names: Vec<&str> = Self::ALL
            .into_iter()
            .filter(|a| has(a.capabilities()))
            .map(Algorithm::as_str)
            .collect();
        match names.split_last() {
            Some((last, [])) => (*last).to_string(),
            Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
            None => String::new(),
        }
    }
}

/// What one algorithm allows in a rule and how it counts (see [`Algorithm::capabilities`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capabilities {
    /// Whether a rule needs a `window`. Without one, the limit's window is zero and the
    /// `RateLimit-Policy` header shows no `w`.
    pub window: Window,
    /// Whether a rule may set `burst`: the bucket size, which is then the rule's capacity
    /// (default: `limit`). Such an algorithm is a bucket, whose refill time validation bounds.
    pub burst: bool,
    /// A `limit` bound below [`algorithm::MAX_COUNT`], if the algorithm has one.
    pub limit_cap: Option<LimitCap>,
    /// Whether the algorithm can shape (`mode = "shape"`, `max_delay`, `max_waiting`).
    pub shaping: Option<Shaping>,
    /// Why quota leasing cannot count this algorithm's state (in any mode); `None`: it can.
    pub lease_refused: Option<&'static str>,
    /// Its entry in `lua/algorithms.lua`'s `algorithms` table (police mode, or its only mode).
    pub lua: LuaFn,
    /// Whether an admitted request holds a slot until its exchange ends (`release.lua`).
    pub holds_slots: bool,
    /// Whether a rule may count per calendar period (`calendar`, `timezone`) instead of per
    /// aligned window: only a counter that starts over at a window's end can.
    pub calendar: bool,
    /// Whether the usage API can grant a counter more for its current window
    /// (`POST /usage/grant`): only a count per window can be lowered for that window alone.
    pub grant: bool,
    /// Why a rule of this algorithm cannot learn from the response (`count`, `block_for`;
    /// see [`reservation`]); `None`: it can, its reservation is trued up by
    /// [`true_up::true_up`] and the Redis `true_up.lua`.
    pub settle_refused: Option<&'static str>,
    /// Why a rule of this algorithm cannot slow (`mode = "slow"`) what it would reject;
    /// `None`: it can.
    pub slow_refused: Option<&'static str>,
}

impl Capabilities {
    /// What a rule can ever admit at once (and the quota clients are shown): `burst` for a
    /// bucket, else `limit`, within the algorithm's cap.
    pub fn capacity(self, limit: u64, burst: u64) -> u64 {
        if self.burst {
            burst
        } else {
            self.limit_cap.map_or(limit, |c| limit.min(c.max))
        }
    }

    /// Why a rule of this algorithm in `mode` cannot lease; `None`: it can.
    pub fn lease_refused(self, mode: LeakyMode) -> Option<&'static str> {
        match (mode, self.shaping) {
            (LeakyMode::Shape, Some(s)) => self.lease_refused.or(Some(s.lease_refused)),
            _ => self.lease_refused,
        }
    }

    /// The entry of `lua/algorithms.lua`'s table that decides a rule in `mode`.
    pub fn lua_fn(self, mode: LeakyMode) -> LuaFn {
        match (mode, self.shaping) {
            (LeakyMode::Shape, Some(s)) => s.lua,
            _ => self.lua,
        }
    }
}

/// Whether a rule of an algorithm takes a `window`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Window {
    /// A window of at least 1 ms is required.
    Required,
    /// None may be given, and `why` says so in the error.
    None {
        /// What the algorithm counts instead, e.g. "concurrency limits requests in flight".
        why: &'static str,
    },
}

/// An algorithm's own bound on `limit`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LimitCap {
    /// The largest limit honoured (and accepted by validation).
    pub max: u64,
    /// Why, for the error: "<algorithm> keeps ...".
    pub why: &'static str,
    /// What to use instead, for the error.
    pub instead: &'static str,
}

/// How an algorithm shapes (holds a request until its turn).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shaping {
    /// Its entry in `lua/algorithms.lua`'s table when shaping.
    pub lua: LuaFn,
    /// Why a shaping rule cannot lease.
    pub lease_refused: &'static str,
}

/// One entry of `lua/algorithms.lua`'s `algorithms` table; a unit test in `redis/script.rs`
/// checks the table against every algorithm's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LuaFn {
    /// Its 1-based index, sent as the packed check's first byte.
    pub code: u8,
    /// The Lua function at that index.
    pub name: &'static str,
}

impl LuaFn {
    const fn new(code: u8, name: &'static str) -> Self {
        LuaFn { code, name }
    }
}

/// The algorithms that can shape, for error messages (`leaky_bucket`).
pub fn shaping_names() -> String {
    Algorithm::names_where(|c| c.shaping.is_some())
}

/// What a rule does with a request that does not fit right now (`mode`): refuse it, make it
/// wait (a leaky bucket only), or serve it slowly.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LeakyMode {
    /// Reject when the bucket is full (`burst` requests counted in it).
    Police,
    /// Hold the request until its turn, up to `max_delay` and `burst` waiting, then reject.
    Shape,
    /// Forward what would be rejected, its bodies limited to the rule's `slow_rate`
    /// ([`Limit::slow_rate`]); counted as a rejection is (not charged).
    Slow,
}

impl LeakyMode {
    /// Every mode with its gateway.toml name.
    pub const NAMES: &'static [(&'static str, LeakyMode)] = &[
        ("police", LeakyMode::Police),
        ("shape", LeakyMode::Shape),
        ("slow", LeakyMode::Slow),
    ];

    /// The name used in gateway.toml.
    pub fn as_str(self) -> &'static str {
        crate::text::names::name_of(Self::NAMES, self)
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
    /// A calendar rule's period and zone (`calendar`, `timezone`); `window` is then the
    /// period's longest length ([`calendar::Period::longest`]).
    calendar: Option<Arc<calendar::Calendar>>,
    /// `block_for`: once this limit rejects a key, the key is refused this long (zero: never
    /// blocked); set by [`Limit::blocking`].
    block_for: Duration,
    /// `mode = "slow"`: bytes per second of a slowed request's bodies (0 in other modes).
    slow_rate: u64,
}

impl Limit {
    /// A limit, or why it cannot be one: `limit` and `burst` at least 1; a window of at least
    /// 1 ms for every algorithm that takes one (see [`Capabilities::window`]; a window given
    /// to one that takes none is dropped, validation refuses it with its location); `mode`
    /// shape only for an algorithm that can shape, and a `max_delay` only with it.
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
        let caps = algorithm.capabilities();
        // An algorithm without a window: whatever is given is not kept.
        let window = match caps.window {
            Window::None { .. } => Duration::ZERO,
            Window::Required if window < Duration::from_millis(1) => {
                return Err("window must be at least 1ms".into());
            }
            Window::Required => window,
        };
        if mode == LeakyMode::Shape && caps.shaping.is_none() {
            return Err(format!("mode applies to {} only", shaping_names()));
        }
        if mode == LeakyMode::Slow {
            if let Some(why) = caps.slow_refused {
                return Err(format!("mode = \"slow\" is not allowed here: {why}"));
            }
        }
        if mode != LeakyMode::Shape && !max_delay.is_zero() {
            return Err(format!(
                "max_delay applies to {} with mode = \"shape\" only",
                shaping_names()
            ));
        }
        Ok(Limit {
            algorithm,
            limit,
            window,
            burst,
            mode,
            max_delay,
            calendar: None,
            block_for: Duration::ZERO,
            slow_rate: 0,
        })
    }

    /// This limit slowing what it would reject to `rate` bytes per second: only a limit in
    /// `mode = "slow"` takes one, and it needs one of at least 1 byte per second (validation
    /// holds `slow_rate` to its documented bounds and names the key's location).
    pub fn slowed_to(self, rate: u64) -> Result<Limit, String> {
        if self.mode != LeakyMode::Slow {
            return Err("slow_rate applies only with mode = \"slow\"".into());
        }
        if rate == 0 {
            return Err("slow_rate must be at least 1 byte per second".into());
        }
        Ok(Limit {
            slow_rate: rate,
            ..self
        })
    }

    /// This limit counted per calendar period of `calendar` instead of per aligned window:
    /// for an algorithm whose capabilities allow it (fixed window) only. Its window becomes
    /// the period's longest length, which bounds what its decisions can announce.
    pub fn with_calendar(self, calendar: calendar::Calendar) -> Result<Limit, String> {
        if !self.algorithm.capabilities().calendar {
            return Err(format!(
                "calendar applies to {} only",
                Algorithm::names_where(|c| c.calendar)
            ));
        }
        Ok(Limit {
            window: calendar.period().longest(),
            calendar: Some(Arc::new(calendar)),
            ..self
        })
    }

    /// The calendar period this limit counts in, if it is a calendar rule.
    pub fn calendar(&self) -> Option<&calendar::Calendar> {
        self.calendar.as_deref()
    }

    /// The window that contains `now_ns` (ns since the epoch): `[start, end)`. The calendar
    /// period for a calendar rule, else the window aligned on multiples of `window`.
    pub fn window_at(&self, now_ns: u64) -> (u64, u64) {
        match &self.calendar {
            Some(c) => c.period_at(now_ns),
            None => {
                let w = algorithm::window_ns(self);
                let start = now_ns - now_ns % w;
                (start, start.saturating_add(w))
            }
        }
    }

    /// This limit, keeping a key it rejects out for `block_for` (`block_for` of a rule; see
    /// [`reservation`]). Validation allows it only where the algorithm can settle.
    pub fn blocking(self, block_for: Duration) -> Limit {
        Limit { block_for, ..self }
    }

    /// How long a key this limit rejects stays refused (zero: not blocked).
    pub fn block_for(&self) -> Duration {
        self.block_for
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

    /// This limit granting `limit` instead (at least 1), its burst scaled alike: a burst equal
    /// to the limit stays equal to it (`limit_from`, a per-caller limit from a token's claim).
    pub fn with_limit(&self, limit: u64) -> Limit {
        let limit = limit.max(1);
        let burst = if self.burst == self.limit {
            limit
        } else {
            let scaled = u128::from(self.burst) * u128::from(limit) / u128::from(self.limit);
            u64::try_from(scaled).unwrap_or(u64::MAX).max(1)
        };
        Limit {
            limit,
            burst,
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

    /// `mode = "slow"`: the bytes per second a request this limit would reject is served at
    /// (`None` in other modes, or before [`Limit::slowed_to`] gave it a rate).
    pub fn slow_rate(&self) -> Option<u64> {
        (self.mode == LeakyMode::Slow && self.slow_rate > 0).then_some(self.slow_rate)
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
