//! The rate-limit algorithms as pure state transitions.
//!
//! Every function here answers one question about one key: may `cost` more be charged at
//! `now_ns` under `limit`, given the key's stored [`State`]? Time is passed in, never read, so
//! that tests drive it exactly and the store alone decides what "now" is.
//!
//! Deciding and charging are split in two steps because a request is charged to every rule it
//! matched or to none (all-or-nothing is the store's job):
//! 1. [`decide`] reads the state and returns the [`Decision`] together with an [`Update`], a
//!    description of the charge in O(1) space;
//! 2. only if every rule of the request admitted it, the store applies each rule's update with
//!    [`Update::apply`] (key present) or [`Update::into_state`] (key absent).
//!
//! Returning the whole new state instead would be simpler but would copy the sliding log,
//! whose size grows with `limit`, on every request.
//!
//! Time and durations are `u64` nanoseconds on the store's clock. Arithmetic that could
//! overflow with absurd numbers is done in `u128` and saturated, so no input panics.
//!
//! A state left by a rule whose algorithm has since changed (a reload) does not fit the
//! algorithm any more and is treated as no state. A reload that only changes the numbers keeps
//! the state and reinterprets it, as described for each algorithm.

use std::collections::VecDeque;
use std::time::Duration;

use super::{Algorithm, Decision, LeakyMode, Limit};

/// What a store keeps for one `(rule, key)`: the smallest state each algorithm needs.
///
/// Every variant carries its own expiry horizon (see [`expires_at`]) so that a store can drop
/// idle keys without knowing the rule they belong to. `State` is at most 32 bytes so that a
/// memory-store entry (64-bit key + state + one hash-table control byte) stays at 41 bytes a
/// slot; only the sliding log keeps a heap allocation, of 8 bytes per admitted unit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum State {
    /// Fixed window: `count` charged in the aligned window that ends at `window_end`.
    FixedWindow {
        /// End of the window the count belongs to (exclusive); it identifies the window.
        window_end: u64,
        /// Units charged in that window, less the units granted for it by the usage API
        /// (`POST /usage/grant`): below zero when more was granted than used.
        count: i64,
    },
    /// Sliding window log: for every admitted unit, the instant it stops counting
    /// (`admitted_at + window`), oldest first, and the debt of extra charges (see [`Log`]).
    ///
    /// Boxed so that this variant does not make every state bigger.
    SlidingWindowLog(Box<Log>),
    /// Sliding window counter: counts of the current aligned window and the one before it.
    SlidingWindowCounter {
        /// `current window start + 2 * window`: when both counts stop mattering. The window
        /// start is derived from it with the rule's window.
        expires: u64,
        /// Units charged in the previous window.
        previous: u64,
        /// Units charged in the current window.
        current: u64,
    },
    /// Token bucket: the instant the bucket is full again (in the past: it is full).
    TokenBucket {
        /// When the bucket holds `burst` tokens again if nothing more is taken.
        full_at: u64,
        /// Nanoseconds per token when `full_at` was computed: a reload that changes the rate
        /// converts the missing time with it, so the number of missing tokens is kept.
        interval: u64,
    },
    /// Leaky bucket (GCRA): the theoretical arrival time of the next request.
    LeakyBucket {
        /// When the bucket will be empty (police) / the next free departure slot (shape).
        tat: u64,
        /// Nanoseconds per request when `tat` was computed (see the token bucket's).
        interval: u64,
    },
    /// Concurrency: requests in flight.
    Concurrency {
        /// Units admitted and not yet released.
        in_flight: u64,
    },
}

/// A sliding window log's state: one entry per admitted unit, and one debt for the extra
/// charges of `cost_from` true-ups.
///
/// Expiry instants rather than admission instants are stored so that the state alone knows
/// when it is empty. An extra charge is not one entry per unit: a hostile upstream's cost of
/// 10^15 would make 8 PB of log. It is a debt instead, `debt` units that count until
/// `debt_until` (the window end of the reservation it trues up), so a key holds at most
/// `limit` entries and 16 bytes of debt. Two extra charges of one key merge into one debt
/// that lasts until the later one's end (the earlier one is kept a little too long, never too
/// short), capped at [`MAX_SLIDING_LOG_DEBT`]: a debt above `limit` refuses everything until
/// it ends, whatever its size.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Log {
    /// Per admitted unit, the instant it stops counting, oldest first.
    pub entries: VecDeque<u64>,
    /// Units charged on top of the entries by true-ups, counting until `debt_until`.
    pub debt: u64,
    /// When the debt stops counting (0: no debt).
    pub debt_until: u64,
}

impl Log {
    /// A log of these entries and no debt.
    pub fn of(entries: impl Into<VecDeque<u64>>) -> Log {
        Log {
            entries: entries.into(),
            ..Log::default()
        }
    }

    /// The debt that still counts at `now_ns`.
    pub fn debt_at(&self, now_ns: u64) -> u64 {
        if self.debt_until > now_ns {
            self.debt
        } else {
            0
        }
    }

    /// Charges `extra` units on top that count until `until`, merged into the debt (see the
    /// type's doc comment).
    pub fn owe(&mut self, now_ns: u64, extra: u64, until: u64) {
        self.debt = self
            .debt_at(now_ns)
            .saturating_add(extra)
            .min(MAX_SLIDING_LOG_DEBT);
        self.debt_until = self.debt_until.max(until);
    }
}

/// The largest debt a sliding log keeps (one more than its largest limit): a debt above the
/// limit refuses every request until it ends, so more would change no decision. It also keeps
/// the Redis scripts' numbers small.
pub const MAX_SLIDING_LOG_DEBT: u64 = MAX_SLIDING_LOG_LIMIT + 1;

// The memory store's bytes-per-key budget depends on this; see the type's doc comment.
const _: () = assert!(std::mem::size_of::<State>() <= 32);

impl State {
    /// The algorithm this state belongs to. A state whose algorithm differs from the rule's
    /// (the rule changed on reload) is treated as no state.
    pub fn algorithm(&self) -> Algorithm {
        match self {
            State::FixedWindow { .. } => Algorithm::FixedWindow,
            State::SlidingWindowLog(_) => Algorithm::SlidingWindowLog,
            State::SlidingWindowCounter { .. } => Algorithm::SlidingWindowCounter,
            State::TokenBucket { .. } => Algorithm::TokenBucket,
            State::LeakyBucket { .. } => Algorithm::LeakyBucket,
            State::Concurrency { .. } => Algorithm::Concurrency,
        }
    }
}

/// How to charge an admitted request to a key, as computed by [`decide`].
///
/// Apply it only to the state `decide` was given, under the same lock: it is a delta against
/// that state (for the sliding log) or its replacement.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Update {
    /// Rejected: nothing is charged.
    Nothing,
    /// Replace the state with this one (every algorithm but the sliding log).
    Set(State),
    /// Sliding log: drop the `expired` oldest entries, then append `count` entries that stop
    /// counting at `expires`.
    Log {
        /// Leading entries of the log that no longer count.
        expired: usize,
        /// Units to append (the request's cost).
        count: u64,
        /// `now + window` for the appended entries.
        expires: u64,
    },
}

impl Update {
    /// Charges the key whose stored state is `state`: what the store does for a key it holds
    /// once every rule of the request admitted it.
    pub fn apply(self, state: &mut State) {
        match self {
            Update::Nothing => {}
            Update::Set(new) => *state = new,
            Update::Log {
                expired,
                count,
                expires,
            } => match state {
                State::SlidingWindowLog(log) => {
                    let entries = &mut log.entries;
                    entries.drain(..expired.min(entries.len()));
                    push_log(entries, count, expires);
                }
                // `decide` saw no log here and answered as for an empty one.
                other => *other = new_log(count, expires),
            },
        }
    }

    /// The state to store for a key that has none: what the store does for a new key once
    /// every rule of the request admitted it. `None`: store nothing.
    pub fn into_state(self) -> Option<State> {
        match self {
            Update::Nothing => None,
            Update::Set(new) => Some(new),
            Update::Log { count, expires, .. } => Some(new_log(count, expires)),
        }
    }
}

/// The largest `limit` the sliding window log honours; above it the log acts as if the limit
/// were this. The log keeps 8 bytes per unit admitted in the last window, so this bounds one
/// key to 8 MB; config validation should reject larger limits for this algorithm.
pub const MAX_SLIDING_LOG_LIMIT: u64 = 1_000_000;

/// The longest window a rule may have, and the longest a bucket may take to refill from empty
/// (`burst × window / limit`): ten years. Instants and durations then stay within what the
/// Redis scripts hold exactly, to the nanosecond (see `lua/common.lua`); validation refuses
/// more.
pub const MAX_WINDOW: Duration = Duration::from_secs(3650 * 86_400);

/// The largest `limit` and `burst` a rule may have: 10^15. Counts and their sums then stay
/// exact in the Redis scripts' numbers (doubles, exact below 2^53); validation refuses more.
pub const MAX_COUNT: u64 = 1_000_000_000_000_000;

fn new_log(count: u64, expires: u64) -> State {
    let mut log = VecDeque::new();
    push_log(&mut log, count, expires);
    State::SlidingWindowLog(Box::new(Log::of(log)))
}

fn push_log(log: &mut VecDeque<u64>, count: u64, expires: u64) {
    // `count` fits the limit (`decide` admitted it), so the log stays bounded by the limit.
    let count = usize::try_from(count).unwrap_or(usize::MAX);
    log.extend(std::iter::repeat_n(expires, count));
}

/// Decides one request against one rule: the [`Decision`] and the [`Update`] to apply if every
/// rule of the request admits it. Dispatches to the algorithm's own function, whose doc
/// comment states its exact semantics.
///
/// A `state` of another algorithm (the rule changed on reload) counts as no state.
pub fn decide(state: Option<&State>, limit: &Limit, now_ns: u64, cost: u64) -> (Decision, Update) {
    match limit.algorithm {
        Algorithm::FixedWindow => fixed_window(state, limit, now_ns, cost),
        Algorithm::SlidingWindowLog => sliding_window_log(state, limit, now_ns, cost),
        Algorithm::SlidingWindowCounter => sliding_window_counter(state, limit, now_ns, cost),
        Algorithm::TokenBucket => token_bucket(state, limit, now_ns, cost),
        Algorithm::LeakyBucket => leaky_bucket(state, limit, now_ns, cost),
        Algorithm::Concurrency => concurrency(state, limit, cost),
    }
}

/// Fixed window: one counter per window aligned on multiples of `window` since the clock's
/// origin (`floor(now / window)`); admitted if `count + cost <= limit`.
///
/// - `limit` = `limit`; `remaining` = `limit - count` after the charge.
/// - `reset` = time to the end of the window (the counter starts again from 0 then).
/// - rejected: `retry_after` = time to the end of the window. A `cost > limit` is never
///   admitted; its `retry_after` is the window, as there is no true answer.
///
/// Known weakness: up to `2 * limit` pass within a moment across a boundary (`limit` at the
/// end of one window, `limit` at the start of the next).
///
/// Reload: a changed `limit` keeps the count; a changed `window` moves the boundaries, and a
/// count that belongs to no current window is dropped.
///
/// Calendar rules ([`Limit::calendar`]): the window is the calendar period holding `now`
/// (a day of 23 or 25 hours across DST), so `reset` is the time to the period's end.
pub fn fixed_window(
    state: Option<&State>,
    limit: &Limit,
    now_ns: u64,
    cost: u64,
) -> (Decision, Update) {
    // A calendar rule's window is the period of its zone that holds `now`.
    let (window_start, window_end) = limit.window_at(now_ns);
    let window = window_end - window_start;
    let quota = limit.limit;
    let count = match state {
        Some(State::FixedWindow {
            window_end: end,
            count,
        }) if *end == window_end => *count,
        _ => 0,
    };
    let reset = u128::from(window_end - now_ns);
    let charged = count.saturating_add(signed(cost));
    if charged <= signed(quota) {
        // Below zero after a grant: more than `limit` remains, until the window ends.
        let decision = allowed(
            quota,
            signed(quota).saturating_sub(charged).unsigned_abs(),
            reset,
            0,
        );
        let update = Update::Set(State::FixedWindow {
            window_end,
            count: charged,
        });
        (decision, update)
    } else if cost > quota {
        (rejected(quota, reset, u128::from(window)), Update::Nothing)
    } else {
        (rejected(quota, reset, reset), Update::Nothing)
    }
}

/// Sliding window log: exact. Keeps, per admitted unit, the instant it stops counting
/// (admission + `window`); admitted if `live + cost <= limit`, where `live` counts the units
/// admitted during the last `window` (`(now - window, now]`), plus the debt of extra charges
/// while it lasts ([`Log`]). Hence never more than `limit` in any interval of length
/// `window` (but for the extra charges of true-ups), and the log never holds more than
/// `limit` live entries.
///
/// - `limit` = `limit`; `remaining` = `limit - live - cost` after the charge.
/// - `reset` = time until the newest entry (or the debt) stops counting.
/// - rejected: `retry_after` = time until enough of the oldest entries (and the debt) stop
///   counting for `cost` to fit. A `cost > limit` is never admitted; its `retry_after` is
///   the window.
///
/// Memory: 8 bytes per live unit, so this algorithm suits small limits (a login rule); a
/// `limit` above [`MAX_SLIDING_LOG_LIMIT`] acts as that. Reload: entries keep the window they were admitted under; a lower `limit` applies at once.
pub fn sliding_window_log(
    state: Option<&State>,
    limit: &Limit,
    now_ns: u64,
    cost: u64,
) -> (Decision, Update) {
    let window = window_ns(limit);
    let quota = limit.limit.min(MAX_SLIDING_LOG_LIMIT);
    let empty = Log::default();
    let state = match state {
        Some(State::SlidingWindowLog(log)) => log.as_ref(),
        _ => &empty,
    };
    let log = &state.entries;
    // Entries are in admission order, hence sorted by expiry (the clock never goes back).
    let expired = log.partition_point(|&expires| expires <= now_ns);
    let units = (log.len() - expired) as u64;
    let debt = state.debt_at(now_ns);
    let live = units.saturating_add(debt);
    let mut last_expiry = log.back().copied().unwrap_or(now_ns).max(now_ns);
    if debt > 0 {
        last_expiry = last_expiry.max(state.debt_until);
    }
    let charged = live.saturating_add(cost);
    if charged <= quota {
        let expires = now_ns.saturating_add(window);
        let newest = if cost > 0 { expires } else { last_expiry };
        let decision = allowed(quota, quota - charged, u128::from(newest - now_ns), 0);
        let update = Update::Log {
            expired,
            count: cost,
            expires,
        };
        return (decision, update);
    }
    let reset = u128::from(last_expiry - now_ns);
    if cost > quota {
        return (rejected(quota, reset, u128::from(window)), Update::Nothing);
    }
    // The instant the `n`th oldest live entry stops counting (`None`: there is no such
    // entry; 0 entries need to stop: now).
    let after = |n: u64| match n.checked_sub(1) {
        None => Some(now_ns),
        Some(i) => usize::try_from(i)
            .ok()
            .and_then(|i| expired.checked_add(i))
            .and_then(|i| log.get(i))
            .copied(),
    };
    // `cost` fits once enough of the oldest live entries have stopped counting: while the
    // debt still counts, `units + debt + cost - quota` of them; once it has ended, `units +
    // cost - quota` (and not before the debt's end). The earlier of the two that exists.
    let room = quota - cost;
    let during = room
        .checked_sub(debt)
        .and_then(|room| after(units.saturating_sub(room)));
    let past = (debt > 0)
        .then(|| after(units.saturating_sub(room)))
        .flatten()
        .map(|at| at.max(state.debt_until));
    let retry_after = match (during, past) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
    .map_or(u128::from(window), |at| {
        u128::from(at.saturating_sub(now_ns))
    });
    (rejected(quota, reset, retry_after), Update::Nothing)
}

/// Sliding window counter (Cloudflare's): an O(1) estimate of the last `window`, from the
/// counts of the current aligned window and the previous one, assuming the previous window's
/// requests were spread evenly: `estimate = previous * (window - elapsed) / window + current`
/// where `elapsed` is the time since the current window started. Admitted if
/// `estimate + cost <= limit`, computed exactly in integers (no floating point).
///
/// - `limit` = `limit`; `remaining` = `floor(limit - estimate)` after the charge.
/// - `reset` = time until both counts stop mattering: the end of the next window if the
///   current window counted anything, else the end of the current one, else 0.
/// - rejected: `retry_after` = the earliest instant at which the estimate, decaying with no
///   further requests, leaves room for `cost`. A `cost > limit` is never admitted; its
///   `retry_after` is the window.
///
/// It is an estimate: when traffic in the previous window was bunched up it admits somewhat
/// more or fewer than an exact log would; within one aligned window it never admits more
/// than `limit`.
///
/// Reload: a changed `limit` keeps the counts; a changed `window` drops them.
pub fn sliding_window_counter(
    state: Option<&State>,
    limit: &Limit,
    now_ns: u64,
    cost: u64,
) -> (Decision, Update) {
    let window = window_ns(limit);
    let quota = limit.limit;
    let start = now_ns - now_ns % window;
    let (previous, current) = match state {
        Some(State::SlidingWindowCounter {
            expires,
            previous,
            current,
        }) => match expires.checked_sub(window.saturating_mul(2)) {
            Some(stored) if stored == start => (*previous, *current),
            Some(stored) if stored.checked_add(window) == Some(start) => (*current, 0),
            _ => (0, 0),
        },
        _ => (0, 0),
    };
    let (w, l, c) = (u128::from(window), u128::from(quota), u128::from(cost));
    let (prev, cur) = (u128::from(previous), u128::from(current));
    let elapsed = u128::from(now_ns - start);
    let left_in_window = w - elapsed;
    // All in units of 1/window of a request, so the weighting stays exact.
    let weighted_previous = prev.saturating_mul(left_in_window);
    let capacity = l.saturating_mul(w);
    let used = weighted_previous.saturating_add((cur + c).saturating_mul(w));
    if used <= capacity {
        let remaining = (capacity - used) / w;
        let reset = if cur + c > 0 {
            left_in_window + w
        } else if prev > 0 {
            left_in_window
        } else {
            0
        };
        let decision = allowed(quota, sat(remaining), reset, 0);
        let update = Update::Set(State::SlidingWindowCounter {
            expires: start.saturating_add(window.saturating_mul(2)),
            previous,
            current: current.saturating_add(cost),
        });
        return (decision, update);
    }
    let reset = if cur > 0 {
        left_in_window + w
    } else {
        left_in_window
    };
    if c > l {
        return (rejected(quota, reset, w), Update::Nothing);
    }
    // Still in this window: need prev * (left - r) + (cur + c) * w <= l * w.
    if cur + c <= l && prev > 0 {
        let excess = weighted_previous - (l - cur - c) * w;
        let r = excess.div_ceil(prev);
        if r < left_in_window {
            return (rejected(quota, reset, r), Update::Nothing);
        }
    }
    // In the next window, x into it: need cur * (w - x) + c * w <= l * w.
    let x = if cur + c <= l {
        0
    } else {
        (w * (cur + c - l)).div_ceil(cur)
    };
    (rejected(quota, reset, left_in_window + x), Update::Nothing)
}

/// Token bucket: holds up to `burst` tokens, refilled continuously at `limit` per `window`;
/// admitted if at least `cost` tokens are there, which are then taken.
///
/// Stored as the instant the bucket is full again (`full_at`), which makes it GCRA: with
/// `interval = window / limit` (time per token), `tokens = burst - max(0, full_at - now) /
/// interval`. `interval` is rounded up to a whole nanosecond, so the refill rate is never
/// faster than configured (below 1 µs per token the error is under 0.1%; rates above 10⁹
/// tokens a second are capped to that). Over any span `t`, at most `burst + rate * t` units
/// are admitted.
///
/// - `limit` = `burst`; `remaining` = whole tokens left after the charge.
/// - `reset` = time until the bucket is full again.
/// - rejected: `retry_after` = time until `cost` tokens are there. A `cost > burst` is never
///   admitted; its `retry_after` is the window.
///
/// Reload: the number of missing tokens is kept (rounded up to whole tokens when the rate
/// changes, and then at most `burst`), refilled at the new rate; a smaller `burst` applies at
/// once.
pub fn token_bucket(
    state: Option<&State>,
    limit: &Limit,
    now_ns: u64,
    cost: u64,
) -> (Decision, Update) {
    let debt = match state {
        Some(State::TokenBucket { full_at, interval }) => {
            backlog(*full_at, *interval, limit, now_ns)
        }
        _ => 0,
    };
    let (decision, new_full_at) = gcra_police(debt, limit, now_ns, cost);
    let update = match new_full_at {
        Some(full_at) => Update::Set(State::TokenBucket {
            full_at,
            interval: interval_ns(limit),
        }),
        None => Update::Nothing,
    };
    (decision, update)
}

/// Leaky bucket, GCRA-style: requests drain at `limit` per `window`, one every
/// `interval = window / limit` (rounded up to a whole nanosecond, as for the token bucket).
/// The state is the theoretical arrival time `tat`: when the bucket is empty again, which is
/// also the first free departure slot.
///
/// **Police** ([`LeakyMode::Police`]): the bucket level is `max(0, tat - now) / interval`
/// requests; admitted if `level + cost <= burst`, then `tat = max(tat, now) + cost * interval`.
/// Exactly the token bucket's arithmetic, seen from the other side: `burst` requests may be
/// in the bucket. `limit` = `burst`; `remaining` = whole free places after the charge;
/// `reset` = time until the bucket is empty; rejected: `retry_after` = time until `cost`
/// fits (a `cost > burst` never does: `retry_after` is the window).
///
/// **Shape** ([`LeakyMode::Shape`]): a request departs at its slot `max(tat, now)`, after
/// `delay = slot - now`, and then `tat = slot + cost * interval`, so departures are spaced by
/// `cost * interval`. Admitted if `delay <= max_delay` and `delay <= burst * interval`: since
/// the requests waiting their turn each hold one interval of the line (cost 1),
/// the second bound means at most `burst` requests are waiting at any time, this one
/// included, while the one departing now waits not at all. (With `limit = 10/s, burst = 20`
/// the 20th waiting request departs 2 s later.) The cost of a request lengthens the wait of
/// those behind it, not its own. Admitted: `delay` = `delay`; `limit` = `burst`;
/// `remaining` = how many more cost-1 requests would be admitted right now; `reset` = time
/// until the line is empty. Rejected: `retry_after` = time until the wait is short enough.
///
/// Reload: the number of requests in the bucket is kept (rounded up to whole requests when the
/// rate changes, and then at most `burst`) and drains at the new rate; a change of mode keeps
/// it too.
pub fn leaky_bucket(
    state: Option<&State>,
    limit: &Limit,
    now_ns: u64,
    cost: u64,
) -> (Decision, Update) {
    let backlog = match state {
        Some(State::LeakyBucket { tat, interval }) => backlog(*tat, *interval, limit, now_ns),
        _ => 0,
    };
    let (decision, new_tat) = match limit.mode {
        // A slowing bucket counts as a policing one; what it refuses is slowed instead.
        LeakyMode::Police | LeakyMode::Slow => gcra_police(backlog, limit, now_ns, cost),
        LeakyMode::Shape => gcra_shape(backlog, limit, now_ns, cost),
    };
    let update = match new_tat {
        Some(tat) => Update::Set(State::LeakyBucket {
            tat,
            interval: interval_ns(limit),
        }),
        None => Update::Nothing,
    };
    (decision, update)
}

/// The time still to drain from a stored `tat` (token bucket: `full_at`) at `now`, at the
/// rule's current rate: a backlog stored at another rate (a reload) is converted so that it
/// counts the same number of units, rounded up to whole ones, and at most `burst` of them (a
/// bucket cannot miss more than it holds; this also keeps the numbers within what the Redis
/// scripts hold exactly).
fn backlog(tat: u64, stored_interval: u64, limit: &Limit, now_ns: u64) -> u128 {
    let backlog = u128::from(tat.saturating_sub(now_ns));
    let interval = interval_ns(limit);
    if stored_interval == interval || stored_interval == 0 {
        return backlog;
    }
    let units = backlog
        .div_ceil(u128::from(stored_interval))
        .min(u128::from(limit.burst));
    units * u128::from(interval)
}

/// The token bucket and the police leaky bucket: `debt` is the time until the bucket is full
/// (token) or empty (leaky) again. Returns the new `tat` / `full_at` when admitted.
fn gcra_police(debt: u128, limit: &Limit, now_ns: u64, cost: u64) -> (Decision, Option<u64>) {
    let interval = u128::from(interval_ns(limit));
    let burst = limit.burst;
    let capacity = u128::from(burst) * interval;
    let charged = debt.saturating_add(u128::from(cost) * interval);
    if charged <= capacity {
        // Whole tokens left: burst - ceil(charged / interval).
        let remaining = sat(capacity - charged) / interval_ns(limit);
        let decision = allowed(burst, remaining, charged, 0);
        return (
            decision,
            Some(sat(u128::from(now_ns).saturating_add(charged))),
        );
    }
    let retry_after = if cost > burst {
        u128::from(window_ns(limit))
    } else {
        charged - capacity
    };
    (rejected(burst, debt, retry_after), None)
}

/// The shape leaky bucket (see [`leaky_bucket`]): `delay` is the wait until the next free
/// slot. Returns the new `tat` when admitted.
fn gcra_shape(delay: u128, limit: &Limit, now_ns: u64, cost: u64) -> (Decision, Option<u64>) {
    let interval = u128::from(interval_ns(limit));
    let burst = limit.burst;
    let longest_wait = u128::from(duration_ns(limit.max_delay)).min(u128::from(burst) * interval);
    if delay <= longest_wait {
        let line = delay.saturating_add(u128::from(cost) * interval);
        let remaining = if line <= longest_wait {
            sat((longest_wait - line) / interval + 1).min(burst)
        } else {
            0
        };
        let decision = allowed(burst, remaining, line, delay);
        return (decision, Some(sat(u128::from(now_ns).saturating_add(line))));
    }
    (rejected(burst, delay, delay - longest_wait), None)
}

/// Concurrency: admitted if `in_flight + cost <= limit`; the store calls [`release`] with the
/// same cost when the exchange ends. No window: the state expires when nothing is in flight.
///
/// - `limit` = `limit`; `remaining` = free slots after the charge; `reset` = 0 (unknowable).
/// - rejected: `retry_after` = 1 s: a slot frees when some exchange ends, which cannot be
///   predicted, and one second is the smallest `Retry-After` a client can be told. A
///   `cost > limit` is never admitted.
///
/// Reload: the count in flight is kept; a lower `limit` applies to new requests.
pub fn concurrency(state: Option<&State>, limit: &Limit, cost: u64) -> (Decision, Update) {
    let in_flight = match state {
        Some(State::Concurrency { in_flight }) => *in_flight,
        _ => 0,
    };
    let quota = limit.limit;
    let charged = in_flight.saturating_add(cost);
    if charged <= quota {
        let decision = allowed(quota, quota - charged, 0, 0);
        let update = Update::Set(State::Concurrency { in_flight: charged });
        return (decision, update);
    }
    let retry_after = u128::from(duration_ns(Duration::from_secs(1)));
    (rejected(quota, 0, retry_after), Update::Nothing)
}

/// Gives back `cost` concurrency slots (never below 0) when an exchange ends, however it
/// ended. Returns true when the state is now equivalent to no state (nothing in flight), so
/// the store drops the key. Any other state is left alone: the rule changed algorithm since
/// the request was admitted, and there is nothing to give back.
pub fn release(state: &mut State, cost: u64) -> bool {
    match state {
        State::Concurrency { in_flight } => {
            *in_flight = in_flight.saturating_sub(cost);
            *in_flight == 0
        }
        _ => false,
    }
}

/// The instant (on the store's clock) from which `state` is equivalent to no state, so the
/// store may drop it: no decision at or after it depends on it. It needs no `Limit` because
/// each state stores its own horizon; `u64::MAX` is never (requests in flight).
pub fn expires_at(state: &State) -> u64 {
    match state {
        State::FixedWindow { window_end, .. } => *window_end,
        State::SlidingWindowLog(log) => {
            log.entries.back().copied().unwrap_or(0).max(log.debt_until)
        }
        State::SlidingWindowCounter { expires, .. } => *expires,
        State::TokenBucket { full_at, .. } => *full_at,
        State::LeakyBucket { tat, .. } => *tat,
        State::Concurrency { in_flight: 0 } => 0,
        State::Concurrency { .. } => u64::MAX,
    }
}

/// The quota a decision of `limit` shows ([`Decision::limit`]): its capacity (see
/// [`super::Capabilities::capacity`]): `burst` for the buckets (the bucket size), the limit
/// (at most [`MAX_SLIDING_LOG_LIMIT`] for the sliding log) otherwise.
pub fn quota(limit: &Limit) -> u64 {
    limit
        .algorithm
        .capabilities()
        .capacity(limit.limit, limit.burst)
}

/// The longest wait a decision of `limit` can announce on a state this rule wrote, for a
/// cost within its quota (as validation requires): `reset` and `retry_after` stay within it. A window (two for the sliding counter, whose previous window
/// still weighs); a bucket's time to refill from empty (plus `max_delay` when shaping: the line
/// may hold that much more); one second for concurrency. Only a state left by a rule that was
/// reloaded with longer numbers reaches further; the engine holds a shared store's answers to
/// it (see [`super::store::bounded`]).
pub fn horizon(limit: &Limit) -> Duration {
    let window = u128::from(window_ns(limit));
    let ns = match limit.algorithm {
        Algorithm::FixedWindow | Algorithm::SlidingWindowLog => window,
        Algorithm::SlidingWindowCounter => 2 * window,
        Algorithm::TokenBucket | Algorithm::LeakyBucket => {
            let refill = u128::from(limit.burst) * u128::from(interval_ns(limit));
            // A `cost > burst` is told to retry after a window.
            (refill + u128::from(duration_ns(limit.max_delay))).max(window)
        }
        Algorithm::Concurrency => u128::from(duration_ns(Duration::from_secs(1))),
    };
    // A blocked key is told to wait out what is left of its block.
    nanos(ns.max(u128::from(duration_ns(limit.block_for))))
}

fn allowed(limit: u64, remaining: u64, reset: u128, delay: u128) -> Decision {
    Decision {
        allowed: true,
        limit,
        remaining,
        reset: nanos(reset),
        retry_after: Duration::ZERO,
        delay: nanos(delay),
    }
}

fn rejected(limit: u64, reset: u128, retry_after: u128) -> Decision {
    Decision {
        allowed: false,
        limit,
        remaining: 0,
        reset: nanos(reset),
        // Never 0: a client told to retry at once would be rejected again.
        retry_after: nanos(retry_after.max(1)),
        delay: Duration::ZERO,
    }
}

/// A count as a signed count, saturating (validation keeps counts below 10^15).
fn signed(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn nanos(ns: u128) -> Duration {
    Duration::from_nanos(sat(ns))
}

pub(in crate::limiter) fn sat(value: u128) -> u64 {
    u64::try_from(value).unwrap_or(u64::MAX)
}

fn duration_ns(duration: Duration) -> u64 {
    sat(duration.as_nanos())
}

/// The window in nanoseconds; never 0 (a concurrency limit has no window), so that no
/// division by it can fail.
pub(in crate::limiter) fn window_ns(limit: &Limit) -> u64 {
    duration_ns(limit.window).max(1)
}

/// Time per unit for the buckets, rounded up so that the rate is never exceeded.
pub(in crate::limiter) fn interval_ns(limit: &Limit) -> u64 {
    // `Limit` keeps `limit` at least 1.
    window_ns(limit).div_ceil(limit.limit)
}

#[cfg(test)]
mod tests;
