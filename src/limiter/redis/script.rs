//! The scripts the store runs and the wire contract between Rust and Lua: which number names
//! which algorithm, how a check is packed into one argument, and how a reply is unpacked.
//! `lua/decide.lua` documents the same contract from its side; the tests below read the Lua
//! source so that the two sides cannot drift apart.

use std::sync::LazyLock;
use std::time::Duration;

use redis::{Cmd, Script};

use super::super::algorithm;
use super::super::store::Grant;
use super::super::{Algorithm, Check, Decision, LeakyMode};
use crate::text::push_hex16;

/// The shared helpers (`common.lua`, `wide.lua`, `gcra.lua`) followed by the named files of
/// `lua/`, each on lines of its own: one script, one SHA.
macro_rules! lua_with_helpers {
    ($($file:literal),+) => {
        concat!(
            include_str!("../../../lua/common.lua"),
            "\n",
            include_str!("../../../lua/wide.lua"),
            "\n",
            include_str!("../../../lua/gcra.lua"),
            $("\n", include_str!(concat!("../../../lua/", $file))),+
        )
    };
}

/// The helpers, every algorithm and the table of their codes (`algorithms.lua`), then the
/// named file: the scripts that decide.
macro_rules! lua_with_algorithms {
    ($file:literal) => {
        lua_with_helpers!(
            "fixed_window.lua",
            "sliding_window_log.lua",
            "sliding_window_counter.lua",
            "token_bucket.lua",
            "leaky_bucket.lua",
            "concurrency.lua",
            "algorithms.lua",
            $file
        )
    };
}

/// The multi-rule decision script: helpers, every algorithm, then `decide.lua`, as one script
/// (one SHA). See `lua/decide.lua` for its arguments and reply.
pub const DECIDE_LUA: &str = lua_with_algorithms!("decide.lua");

/// The usage API's script: the helpers and algorithms of [`DECIDE_LUA`], then
/// `lua/usage.lua` (see there).
pub const USAGE_LUA: &str = lua_with_algorithms!("usage.lua");

/// The concurrency release script (`lua/release.lua`).
pub const RELEASE_LUA: &str = include_str!("../../../lua/release.lua");

/// The quota lease return script: helpers, then `lua/lease_return.lua` (see there).
pub const LEASE_RETURN_LUA: &str = lua_with_helpers!("lease_return.lua");

/// The reservation true-up script: helpers, then `lua/true_up.lua` (see there).
pub const TRUE_UP_LUA: &str = lua_with_helpers!("true_up.lua");

/// The concurrency slot renewal script (`lua/renew.lua`).
pub const RENEW_LUA: &str = include_str!("../../../lua/renew.lua");

pub(super) static DECIDE: LazyLock<Lua> = LazyLock::new(|| Lua::new(DECIDE_LUA));
pub(super) static RELEASE: LazyLock<Lua> = LazyLock::new(|| Lua::new(RELEASE_LUA));
pub(super) static LEASE_RETURN: LazyLock<Lua> = LazyLock::new(|| Lua::new(LEASE_RETURN_LUA));
pub(super) static TRUE_UP: LazyLock<Lua> = LazyLock::new(|| Lua::new(TRUE_UP_LUA));
pub(super) static RENEW: LazyLock<Lua> = LazyLock::new(|| Lua::new(RENEW_LUA));
pub(super) static USAGE: LazyLock<Lua> = LazyLock::new(|| Lua::new(USAGE_LUA));

/// A script as the store runs it: its SHA, computed once, for `EVALSHA`, and its source for
/// `SCRIPT LOAD` when Redis does not know it.
pub(super) struct Lua {
    source: &'static str,
    sha: String,
}

impl Lua {
    fn new(source: &'static str) -> Lua {
        Lua {
            source,
            sha: Script::new(source).get_hash().to_string(),
        }
    }

    /// `EVALSHA <sha> <keys>`, to which the caller appends the keys, then the arguments.
    /// Written straight into one command buffer: redis-rs' `ScriptInvocation` first copies
    /// every key and argument into a vector of its own, a dozen allocations per request.
    pub(super) fn evalsha(&self, keys: usize) -> Cmd {
        self.evalsha_sized(keys, 0, 0)
    }

    /// [`Lua::evalsha`] with room for `args` more arguments (keys included) of `bytes` bytes
    /// in all, so that appending them reallocates neither of the command's two buffers.
    pub(super) fn evalsha_sized(&self, keys: usize, args: usize, bytes: usize) -> Cmd {
        let mut cmd = Cmd::with_capacity(3 + args, "EVALSHA".len() + self.sha.len() + 4 + bytes);
        cmd.arg("EVALSHA").arg(&self.sha).arg(keys);
        cmd
    }

    /// `SCRIPT LOAD <source>` (redis-rs' cluster routing sends it to every node).
    pub(super) fn load(&self) -> Cmd {
        let mut cmd = redis::cmd("SCRIPT");
        cmd.arg("LOAD").arg(self.source);
        cmd
    }
}

/// Lua numbers are doubles: integers are exact below 2^53.
pub(super) const MAX_EXACT: u64 = (1 << 53) - 1;

/// Numbers per check in the decide script's reply.
pub(super) const REPLY_FIELDS: usize = 12;

/// Bytes per check in the decide script's reply: the numbers are little-endian doubles.
pub(super) const REPLY_BYTES: usize = REPLY_FIELDS * 8;

/// Numbers per check in the decide script's arguments, after the algorithm's code.
const PACKED_NUMBERS: usize = 10;

/// Bytes of one packed check: the algorithm's code, then the numbers as little-endian doubles.
pub(super) const PACKED_BYTES: usize = 1 + PACKED_NUMBERS * 8;

/// Bytes of one packed check of a calendar rule: [`PACKED_BYTES`], then the four period
/// boundaries around the gateway's time (previous start, current start, next start, next
/// end, us) as little-endian doubles.
pub(super) const CALENDAR_PACKED_BYTES: usize = PACKED_BYTES + 4 * 8;

/// Bytes of one packed lease return (`lua/lease_return.lua`): code, then six doubles.
pub(super) const RETURN_BYTES: usize = 1 + 6 * 8;

/// Bytes of one packed true-up (`lua/true_up.lua`): code, then seven doubles.
pub(super) const TRUE_UP_BYTES: usize = 1 + 7 * 8;

/// The algorithm's number in `decide.lua`'s `algorithms` table (1-based, as Lua indexes).
pub(super) fn code(algorithm: Algorithm, mode: LeakyMode) -> u8 {
    algorithm.capabilities().lua_fn(mode).code
}

/// The numbers one check passes to the decide script (see `lua/decide.lua`).
pub(super) struct Params {
    /// The algorithm's number in `decide.lua`'s table.
    code: u8,
    cost: u64,
    limit: u64,
    window_us: u64,
    burst: u64,
    /// Wide (see `lua/wide.lua`): whole microseconds, then 0..999 nanoseconds.
    interval: [u64; 2],
    /// Wide, as `interval`.
    cap: [u64; 2],
    /// `Decision::limit`: the quota shown to clients (burst for the buckets).
    quota: u64,
    /// Permits wanted as a quota lease (at least `cost`); 0: an exact check.
    lease: u64,
    /// The fair-share divisor of a lease: 2 x instances.
    share: u64,
    /// A calendar rule's period boundaries around the gateway's time, us (see
    /// [`CALENDAR_PACKED_BYTES`]); the script picks the period by Redis' time.
    periods: Option<[u64; 4]>,
}

impl Params {
    /// The script's numbers for `check`.
    pub(super) fn of(check: &Check) -> Params {
        let l = &check.limit;
        // Exactly as the reference computes them.
        let window_ns = algorithm::window_ns(l);
        let interval_ns = algorithm::interval_ns(l);
        let bucket = u128::from(l.burst) * u128::from(interval_ns);
        let caps = l.algorithm.capabilities();
        // A bucket's size in time; when shaping, the longest a request may wait in it.
        let shaping = caps.shaping.is_some() && l.mode == LeakyMode::Shape;
        let cap = match (caps.burst, shaping) {
            (false, _) => 0,
            (true, false) => bucket,
            (true, true) => l.max_delay.as_nanos().min(bucket),
        };
        let quota = algorithm::quota(l);
        // The scripts honour the same cap on `limit` as the reference.
        let limit = caps.limit_cap.map_or(l.limit, |c| l.limit.min(c.max));
        Params {
            code: code(l.algorithm, l.mode),
            cost: check.cost.min(MAX_EXACT),
            limit: limit.min(MAX_EXACT),
            window_us: window_ns.div_ceil(1000).clamp(1, MAX_EXACT),
            burst: l.burst.min(MAX_EXACT),
            interval: wide(u128::from(interval_ns)),
            cap: wide(cap),
            quota,
            lease: 0,
            share: 2,
            periods: l.calendar().map(|c| {
                // Whole seconds in every zone's rules, so exact in microseconds.
                c.around(unix_now_ns()).map(|ns| (ns / 1000).min(MAX_EXACT))
            }),
        }
    }

    /// These numbers with a calendar rule's periods computed around `gateway_ns` instead of
    /// the gateway's clock: for the test hook that injects the time.
    pub(super) fn around(mut self, check: &Check, gateway_ns: u64) -> Params {
        if let Some(c) = check.limit.calendar() {
            self.periods = Some(c.around(gateway_ns).map(|ns| (ns / 1000).min(MAX_EXACT)));
        }
        self
    }

    /// The script's numbers for `check` asking to lease `wanted` permits (at least its cost)
    /// among `instances` gateways; `wanted` 0 asks for an exact decision.
    pub(super) fn leasing(check: &Check, wanted: u64, instances: u64) -> Params {
        let mut p = Params::of(check);
        if wanted > 0 {
            p.lease = wanted.max(p.cost).min(MAX_EXACT);
            p.share = instances.clamp(1, MAX_EXACT / 2) * 2;
        }
        p
    }

    /// The window the script returns with a lease, and what a lease return must send: the
    /// algorithm's code and the numbers `lease_return.lua` needs (the last: when the permits
    /// were charged, so that a return never lands on a counter reset since).
    pub(super) fn return_packed(
        &self,
        permits: u64,
        window_end_us: u64,
        charged_at_us: u64,
    ) -> [u8; RETURN_BYTES] {
        pack(
            self.code,
            [
                permits.min(MAX_EXACT),
                self.interval[0],
                self.interval[1],
                self.window_us,
                window_end_us.min(MAX_EXACT),
                charged_at_us.min(MAX_EXACT),
            ],
        )
    }

    /// A reservation's true-up as `true_up.lua` reads it: the algorithm's code, the refund,
    /// the extra charge, the interval, the window the reservation was charged in, and when
    /// (a true-up never lands on a counter reset since).
    pub(super) fn true_up_packed(
        &self,
        adjust: crate::limiter::true_up::Adjust,
        window_end_us: u64,
        charged_at_us: u64,
    ) -> [u8; TRUE_UP_BYTES] {
        pack(
            self.code,
            [
                adjust.refund.min(MAX_EXACT),
                adjust.extra.min(MAX_EXACT),
                self.interval[0],
                self.interval[1],
                self.window_us,
                window_end_us.min(MAX_EXACT),
                charged_at_us.min(MAX_EXACT),
            ],
        )
    }

    /// The check as `decide.lua` reads it: the algorithm's number, then cost, limit, window,
    /// burst, interval and cap (both wide), lease and share as little-endian doubles (exact:
    /// all are integers below 2^53).
    pub(super) fn packed(&self) -> Packed {
        let numbers: [u64; PACKED_NUMBERS] = [
            self.cost,
            self.limit,
            self.window_us,
            self.burst,
            self.interval[0],
            self.interval[1],
            self.cap[0],
            self.cap[1],
            self.lease,
            self.share,
        ];
        let packed: [u8; PACKED_BYTES] = pack(self.code, numbers);
        let mut out = Packed {
            bytes: [0; CALENDAR_PACKED_BYTES],
            len: PACKED_BYTES,
        };
        out.bytes[..PACKED_BYTES].copy_from_slice(&packed);
        for n in self.periods.iter().flatten() {
            out.bytes[out.len..out.len + 8].copy_from_slice(&(*n as f64).to_le_bytes());
            out.len += 8;
        }
        out
    }

    /// The decision from the script's numbers for this check (the first eight; the lease's
    /// are read by [`grant`]).
    pub(super) fn decision(&self, reply: &[u64; REPLY_FIELDS]) -> Decision {
        let allowed = reply[0] == 1;
        let duration = |at: usize| nanos(reply[at], reply[at + 1]);
        Decision {
            allowed,
            limit: self.quota,
            remaining: if allowed { reply[1] } else { 0 },
            reset: duration(2),
            // Never 0 when rejected: a client told to retry at once would be rejected again.
            retry_after: if allowed {
                Duration::ZERO
            } else {
                duration(4).max(Duration::from_nanos(1))
            },
            delay: if allowed { duration(6) } else { Duration::ZERO },
        }
    }
}

/// What the script charged for one check beyond its decision (see [`Grant`]); `charged`:
/// every check of its call admitted, so the call charged.
pub(super) fn grant(reply: &[u64; REPLY_FIELDS], charged: bool) -> Grant {
    Grant {
        granted: if charged && reply[0] == 1 {
            reply[8]
        } else {
            0
        },
        window_left: Duration::from_micros(reply[9]),
        window_end_us: reply[10],
        charged_at_us: reply[11],
    }
}

/// `ns` nanoseconds as a wide number (see `lua/wide.lua`): whole microseconds (saturating
/// below 2^53, which no valid rule reaches), then 0..999 nanoseconds.
fn wide(ns: u128) -> [u64; 2] {
    [sat(ns / 1000).min(MAX_EXACT), (ns % 1000) as u64]
}

/// The duration of a wide number the script answered: `us` microseconds and `ns` nanoseconds
/// (saturating: the script never answers past what a `Duration` of `u64` nanoseconds holds).
fn nanos(us: u64, ns: u64) -> Duration {
    Duration::from_nanos(sat(u128::from(us) * 1000 + u128::from(ns)))
}

/// One check's numbers from the decide script's reply: little-endian doubles holding
/// non-negative integers below 2^53 (anything else reads as 0).
pub(super) fn unpack_reply(packed: &[u8]) -> [u64; REPLY_FIELDS] {
    let mut numbers = [0; REPLY_FIELDS];
    for (n, bytes) in numbers.iter_mut().zip(packed.chunks_exact(8)) {
        let mut b = [0; 8];
        b.copy_from_slice(bytes);
        let f = f64::from_le_bytes(b);
        if f.is_finite() && f > 0.0 {
            // Saturating, and exact for the integers the script sends.
            *n = f as u64;
        }
    }
    numbers
}

/// A lease id as the scripts name it: 16 hex digits.
pub(super) fn hex16(lease: u64) -> String {
    let mut s = String::with_capacity(16);
    push_hex16(&mut s, lease);
    s
}

/// Whether `check` takes a concurrency slot that `release.lua` must give back.
pub(super) fn holds_slot(check: &Check) -> bool {
    check.limit.algorithm.capabilities().holds_slots && check.cost > 0
}

/// One packed check (see [`Params::packed`]): on the stack, as it is built for every check
/// of every request.
pub(super) struct Packed {
    bytes: [u8; CALENDAR_PACKED_BYTES],
    len: usize,
}

impl std::ops::Deref for Packed {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

/// The gateway's Unix time in ns: only where a calendar rule's periods are computed around,
/// for the script to choose among by Redis' time.
pub(super) fn unix_now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| sat(d.as_nanos()))
}

/// `v` as a `u64`, saturating.
pub(super) use crate::limiter::algorithm::sat;

/// `code` as one byte, then `numbers` as little-endian doubles (exact below 2^53): the layout
/// of a packed check and of a lease return, as the scripts unpack them (`struct.unpack`).
/// `BYTES` must be 1 + 8 x the count of numbers.
fn pack<const BYTES: usize, const NUMBERS: usize>(
    code: u8,
    numbers: [u64; NUMBERS],
) -> [u8; BYTES] {
    let mut out = [0; BYTES];
    out[0] = code;
    for (slot, n) in out[1..].chunks_exact_mut(8).zip(numbers) {
        slot.copy_from_slice(&(n as f64).to_le_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::{Limit, LuaFn};

    fn check(algorithm: Algorithm, limit: u64, window: Duration, burst: u64) -> Check {
        Check {
            rule: "r".into(),
            counter: 0xabc,
            limit: Limit {
                algorithm,
                limit,
                window,
                burst,
                mode: LeakyMode::Shape,
                max_delay: Duration::from_millis(250),
                calendar: None,
                block_for: Duration::ZERO,
                slow_rate: 0,
            },
            cost: 1,
        }
    }

    #[test]
    fn params_match_the_reference_rounding() {
        let p = Params::of(&check(Algorithm::TokenBucket, 3, Duration::from_secs(1), 5));
        assert_eq!(p.interval, [333_333, 334]);
        assert_eq!(p.cap, [1_666_666, 670], "5 x 333 333 334 ns");
        assert_eq!(p.window_us, 1_000_000);
        assert_eq!(p.quota, 5);
        let p = Params::of(&check(
            Algorithm::LeakyBucket,
            10,
            Duration::from_secs(1),
            20,
        ));
        assert_eq!(p.code, 6, "leaky shape");
        assert_eq!(
            p.cap,
            [250_000, 0],
            "longest wait = min(max_delay, burst * interval)"
        );
        // A year's bucket passes 2^53 ns: wide, exactly.
        let year = Duration::from_secs(365 * 86_400);
        let p = Params::of(&check(Algorithm::TokenBucket, 1000, year, 1000));
        assert_eq!(p.interval, [31_536_000_000, 0]);
        assert_eq!(p.cap, [31_536_000_000_000, 0]);
        let p = Params::of(&check(Algorithm::TokenBucket, 7, year, 3));
        assert_eq!(p.interval, [4_505_142_857_142, 858], "ceil(365 d / 7)");
        let p = Params::of(&check(
            Algorithm::SlidingWindowLog,
            u64::MAX,
            Duration::from_secs(1),
            1,
        ));
        assert_eq!(p.limit, algorithm::MAX_SLIDING_LOG_LIMIT);
        assert_eq!(p.quota, algorithm::MAX_SLIDING_LOG_LIMIT);
        let p = Params::of(&check(Algorithm::FixedWindow, u64::MAX, Duration::MAX, 1));
        assert_eq!(p.limit, MAX_EXACT);
        assert_eq!(p.window_us, MAX_EXACT);
    }

    #[test]
    fn rejected_decisions_never_say_retry_now() {
        let p = Params::of(&check(Algorithm::FixedWindow, 1, Duration::from_secs(1), 1));
        let d = p.decision(&[0, 5, 10, 3, 0, 0, 7, 1, 1, 0, 0, 0]);
        assert!(!d.allowed);
        assert_eq!(d.remaining, 0);
        assert_eq!(d.reset, Duration::from_nanos(10_003), "10 us and 3 ns");
        assert_eq!(d.retry_after, Duration::from_nanos(1));
        assert_eq!(d.delay, Duration::ZERO);
        let d = p.decision(&[1, 5, u64::MAX, 999, 0, 0, 7, 1, 1, 0, 0, 0]);
        assert_eq!(d.delay, Duration::from_nanos(7_001));
        assert_eq!(d.reset, Duration::from_nanos(u64::MAX), "saturating");
    }

    #[test]
    fn replies_unpack_exactly_and_garbage_reads_as_zero() {
        let packed: Vec<u8> = [1.0, 9_007_199_254_740_991.0, -3.0, f64::NAN, 1e300]
            .iter()
            .flat_map(|f: &f64| f.to_le_bytes())
            .collect();
        assert_eq!(
            unpack_reply(&packed),
            [
                1,
                9_007_199_254_740_991,
                0,
                0,
                u64::MAX,
                0,
                0,
                0,
                0,
                0,
                0,
                0
            ]
        );
        // A short reply never panics: the missing numbers read as 0.
        assert_eq!(
            unpack_reply(&packed[..12]),
            [1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
        );
    }

    /// The text between `open` and the next `close` after it in `source`.
    fn between<'a>(source: &'a str, open: &str, close: &str) -> &'a str {
        let start = source
            .find(open)
            .unwrap_or_else(|| panic!("the Lua source no longer holds {open:?}"))
            + open.len();
        let len = source[start..]
            .find(close)
            .unwrap_or_else(|| panic!("the Lua source: {open:?} is not closed by {close:?}"));
        &source[start..start + len]
    }

    /// Every algorithm code Rust sends names, in `algorithms.lua`'s table, the Lua function that
    /// mirrors that algorithm, and that function exists in the composed script; the table
    /// holds no code Rust does not send.
    #[test]
    fn algorithm_codes_match_the_lua_table() {
        let codes = include_str!("../../../lua/algorithms.lua");
        let table: Vec<&str> = between(codes, "local algorithms = {", "}")
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .collect();
        let mut sent = Vec::new();
        for algorithm in Algorithm::ALL {
            for mode in [LeakyMode::Police, LeakyMode::Shape] {
                let LuaFn { code, name } = algorithm.capabilities().lua_fn(mode);
                let at = usize::from(code)
                    .checked_sub(1)
                    .expect("Lua tables are 1-based");
                assert_eq!(
                    table.get(at).copied(),
                    Some(name),
                    "code {code} is {name} in Rust but {:?} in algorithms.lua",
                    table.get(at)
                );
                assert!(
                    DECIDE_LUA.contains(&format!("function {name}(")),
                    "no Lua function {name} in the composed script"
                );
                sent.push(code);
            }
        }
        sent.sort_unstable();
        sent.dedup();
        assert_eq!(
            sent.len(),
            table.len(),
            "algorithms.lua's table has codes Rust never sends"
        );
    }

    /// The algorithm codes a settling script branches on (`code == N`), sorted, each once.
    fn codes_handled(lua: &str) -> Vec<u8> {
        let mut handled: Vec<u8> = lua
            .split("code == ")
            .skip(1)
            .map(|rest| {
                let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
                digits.parse().expect("a code after `code == `")
            })
            .collect();
        handled.sort_unstable();
        handled.dedup();
        handled
    }

    /// `lease_return.lua` undoes the charge of exactly the algorithms (and modes) whose
    /// capabilities say they can lease: a leasable algorithm it does not know would keep its
    /// unspent permits charged, and one it knows that cannot lease is a stale branch.
    #[test]
    fn lease_return_handles_exactly_the_leasable_codes() {
        let handled = codes_handled(include_str!("../../../lua/lease_return.lua"));
        let mut leasable = Vec::new();
        for algorithm in Algorithm::ALL {
            for mode in [LeakyMode::Police, LeakyMode::Shape] {
                let caps = algorithm.capabilities();
                let applies = mode == LeakyMode::Police || caps.shaping.is_some();
                if applies && caps.lease_refused(mode).is_none() {
                    leasable.push(caps.lua_fn(mode).code);
                }
            }
        }
        leasable.sort_unstable();
        leasable.dedup();
        assert_eq!(
            handled, leasable,
            "codes lease_return.lua undoes vs leasable codes"
        );
    }

    /// `true_up.lua` trues up exactly the algorithms (and modes) whose capabilities say a
    /// rule can learn from the response, and unpacks what Rust packs.
    #[test]
    fn true_up_handles_exactly_the_settling_codes() {
        let lua = include_str!("../../../lua/true_up.lua");
        let handled = codes_handled(lua);
        let mut settling: Vec<u8> = Algorithm::ALL
            .into_iter()
            .filter(|a| a.capabilities().settle_refused.is_none())
            .map(|a| a.capabilities().lua_fn(LeakyMode::Police).code)
            .collect();
        settling.sort_unstable();
        assert_eq!(
            handled, settling,
            "codes true_up.lua handles vs settling codes"
        );
        assert!(lua.contains(&format!("#packed == {TRUE_UP_BYTES}")));
        assert!(lua.contains(&format!(
            "struct.unpack('<B{}'",
            "d".repeat((TRUE_UP_BYTES - 1) / 8)
        )));
    }

    /// Epochs: every script that gives back or trues up names when the charge was made and
    /// drops it when the key was reset since, with the memory store's rule (a charge in the
    /// reset's instant counts as older); the usage script marks the reset and answers the
    /// reply `redis/usage.rs` decodes.
    #[test]
    fn settling_scripts_honour_the_epoch_of_a_reset() {
        let common = include_str!("../../../lua/common.lua");
        let epoch = between(common, "local function same_epoch", "\nend\n");
        assert!(epoch.contains("key .. ':e'"), "{epoch}");
        assert!(
            epoch.contains("charged_at > (tonumber(started) or 0)"),
            "{epoch}"
        );
        let memory = include_str!("../memory/epochs.rs");
        assert!(memory.contains("charged_at > m.started"));
        for (name, lua) in [
            ("true_up.lua", include_str!("../../../lua/true_up.lua")),
            (
                "lease_return.lua",
                include_str!("../../../lua/lease_return.lua"),
            ),
        ] {
            assert!(
                lua.contains("if not same_epoch(key, charged_at) then"),
                "{name} checks the epoch"
            );
        }
        let usage = include_str!("../../../lua/usage.lua");
        let reset = between(usage, "if op == 'reset' then", "elseif op == 'grant'");
        assert!(
            reset.contains("redis.call('SET', key .. ':e', fmt(now)"),
            "{reset}"
        );
        assert_eq!(super::super::usage::REPLY_BYTES, 1 + 6 * 8);
        assert!(usage.contains("return struct.pack('<B', 0) .. numbers"));
        assert!(usage.contains("struct.pack('<Bdddddd', 3,"));
        assert!(usage.contains("#seen == 9 + 48"));
        // The decide reply's last number is the instant of the charge.
        assert!(DECIDE_LUA.contains("  out[#out + 1] = now\nend"));
    }

    /// The packed check is the size and layout `decide.lua` unpacks, and the reply holds as
    /// many numbers per check as the script appends.
    #[test]
    fn packed_sizes_match_the_lua_source() {
        let decide = include_str!("../../../lua/decide.lua");
        // decide.lua and usage.lua read a check with the one unpack_check of common.lua.
        let unpack = between(
            include_str!("../../../lua/common.lua"),
            "local function unpack_check",
            "\nend\n",
        );
        assert!(decide.contains("unpack_check(ARGV[4 + i], "));
        assert!(include_str!("../../../lua/usage.lua").contains("unpack_check(ARGV[3], "));
        let format = between(unpack, "struct.unpack('", "'");
        let (endian, fields) = format.split_at(1);
        assert_eq!(endian, "<", "little-endian, as Params::packed writes");
        let (code, numbers) = fields.split_at(1);
        assert_eq!(code, "B", "one byte of algorithm code first");
        assert!(
            numbers.chars().all(|c| c == 'd'),
            "{format}: numbers are doubles"
        );
        assert_eq!(numbers.len(), PACKED_NUMBERS);
        assert!(
            unpack.contains(&format!("#packed ~= {PACKED_BYTES}")),
            "unpack_check checks another packed size than {PACKED_BYTES}"
        );
        let p = Params::of(&check(Algorithm::FixedWindow, 1, Duration::from_secs(1), 1));
        assert_eq!(p.packed().len(), PACKED_BYTES);
        // A calendar rule's check carries its periods after the numbers.
        assert!(unpack.contains(&format!("#packed ~= {CALENDAR_PACKED_BYTES}")));
        assert!(unpack.contains(&format!(
            "struct.unpack('<{}', packed, {})",
            "d".repeat((CALENDAR_PACKED_BYTES - PACKED_BYTES) / 8),
            PACKED_BYTES + 1
        )));
        let mut c = check(Algorithm::FixedWindow, 1, Duration::from_secs(1), 1);
        c.limit = c
            .limit
            .with_calendar(
                crate::limiter::calendar::Calendar::new(
                    crate::limiter::calendar::Period::Day,
                    "Asia/Tokyo",
                )
                .unwrap(),
            )
            .unwrap();
        let packed = Params::of(&c).packed();
        assert_eq!(packed.len(), CALENDAR_PACKED_BYTES);
        let bound = |i: usize| {
            let at = PACKED_BYTES + 8 * i;
            f64::from_le_bytes(packed[at..at + 8].try_into().unwrap())
        };
        // Midnights in Tokyo (15:00 UTC), a day apart.
        assert_eq!(bound(0) as u64 % 86_400_000_000, 15 * 3_600_000_000);
        assert_eq!(bound(2) - bound(1), 86_400_000_000.0);

        let per_check = between(decide, "local allowed, remaining", "\nend\n");
        assert_eq!(
            per_check.matches("out[#out + 1] = ").count() - 1,
            REPLY_FIELDS,
            "numbers appended per check (allowed is appended in two branches)"
        );
        assert!(decide.contains("struct.pack('<' .. string.rep('d', #out)"));
        let ret = include_str!("../../../lua/lease_return.lua");
        assert!(ret.contains(&format!("#packed == {RETURN_BYTES}")));
        assert!(ret.contains(&format!(
            "struct.unpack('<B{}'",
            "d".repeat((RETURN_BYTES - 1) / 8)
        )));
        assert_eq!(REPLY_BYTES, REPLY_FIELDS * 8);
    }
}
