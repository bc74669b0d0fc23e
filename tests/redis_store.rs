//! The Redis store against real `redis-server` processes (standalone and a 3-master cluster)
//! started by the tests on free loopback ports: the Lua scripts give exactly the reference
//! algorithms' decisions, all-or-nothing charging, concurrency leases, one EVALSHA per request,
//! and every failure mode (NOSCRIPT, restart, slow Redis, circuit breaker).

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::eventually;
use common::redis::{store_settings, RedisCluster, RedisServer, Stall};
use floodgate::config::{Backend, Store};
use floodgate::limiter::algorithm::{self, State};
use floodgate::limiter::redis::breaker::BreakerState;
use floodgate::limiter::redis::{Options, RedisStore};
use floodgate::limiter::store::{SharedStore, StoreError};
use floodgate::limiter::{Algorithm, Check, Decision, Limit};

/// A timeout that only a broken store reaches: functional tests must not flake under load.
const GENEROUS: Duration = Duration::from_secs(5);

const PREFIX: &str = "fg-test:";

fn store_config(backend: Backend, urls: Vec<String>) -> Store {
    store_settings(backend, urls, Duration::from_millis(20), PREFIX)
}

fn standalone(server: &RedisServer) -> Arc<RedisStore> {
    RedisStore::new(&store_config(Backend::Redis, vec![server.url()])).expect("store")
}

fn standalone_with(server: &RedisServer, options: Options) -> Arc<RedisStore> {
    RedisStore::with_options(&store_config(Backend::Redis, vec![server.url()]), options)
        .expect("store")
}

fn check(rule: &str, key: u64, limit: Limit, cost: u64) -> Check {
    Check {
        rule: rule.into(),
        counter: key,
        limit,
        cost,
    }
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

// ---------------------------------------------------------------------------------------------
// The scripts against the reference, at injected instants.
// ---------------------------------------------------------------------------------------------

/// The in-process reference: `algorithm::decide` on every check, every update applied only if
/// all admit (what the memory store does, without its expiry sweeping, which changes no
/// decision).
#[derive(Default)]
struct Reference {
    states: HashMap<String, State>,
}

impl Reference {
    fn decide(&mut self, keys: &[String], checks: &[Check], now_ns: u64) -> Vec<Decision> {
        let mut decisions = Vec::new();
        let mut updates = Vec::new();
        for (key, c) in keys.iter().zip(checks) {
            let (d, u) = algorithm::decide(self.states.get(key), &c.limit, now_ns, c.cost);
            decisions.push(d);
            updates.push(u);
        }
        if decisions.iter().all(|d| d.allowed) {
            for (key, u) in keys.iter().zip(updates) {
                match self.states.get_mut(key) {
                    Some(state) => u.apply(state),
                    None => {
                        if let Some(state) = u.into_state() {
                            self.states.insert(key.clone(), state);
                        }
                    }
                }
            }
        }
        decisions
    }

    fn release(&mut self, key: &str, cost: u64) {
        if let Some(state) = self.states.get_mut(key) {
            algorithm::release(state, cost);
        }
    }

    /// The store's decisions on `checks` at `now_us` (charged under `lease`), then the
    /// reference's at the same instant: what the differential tests compare.
    async fn beside(
        &mut self,
        store: &RedisStore,
        checks: &[Check],
        lease: u64,
        now_us: u64,
    ) -> (Vec<Decision>, Vec<Decision>) {
        let keys: Vec<String> = checks.iter().map(|c| store.redis_key(c)).collect();
        let got = store
            .decide_at(checks, lease, GENEROUS, now_us)
            .await
            .expect("decide");
        (got, self.decide(&keys, checks, now_us * 1000))
    }

    /// Gives back the concurrency lease `lease` of `checks` in the store and here, as a
    /// finished request does.
    async fn release_beside(&mut self, store: &RedisStore, lease: u64, checks: &[Check]) {
        store.release(checks, lease).await;
        for c in checks {
            self.release(&store.redis_key(c), c.cost);
        }
    }
}

/// Counts one decision in `seen` (admitted, rejected).
fn tally(seen: &mut (u32, u32), allowed: bool) {
    if allowed {
        seen.0 += 1;
    } else {
        seen.1 += 1;
    }
}

/// The concurrency slots a request of `checks` holds when all were admitted (`got`), to be
/// given back later; none otherwise.
fn held_slots(checks: &[Check], got: &[Decision]) -> Option<Vec<Check>> {
    if !got.iter().all(|d| d.allowed) {
        return None;
    }
    let slots: Vec<Check> = checks
        .iter()
        .filter(|c| c.limit.algorithm() == Algorithm::Concurrency && c.cost > 0)
        .cloned()
        .collect();
    (!slots.is_empty()).then_some(slots)
}

/// Rules of every algorithm, with awkward numbers: intervals that do not divide the window
/// (1 s / 3 = 333 333 334 ns), windows of a few ms, a burst of 1, shaping with a max_delay
/// shorter than the queue, costs above the limit.
fn differential_rules() -> Vec<(&'static str, Limit)> {
    use Algorithm::*;
    vec![
        ("fw-5-1s", Limit::police(FixedWindow, 5, secs(1), 5)),
        ("fw-3-7ms", Limit::police(FixedWindow, 3, ms(7), 3)),
        (
            "fw-100-1h",
            Limit::police(FixedWindow, 100, secs(3600), 100),
        ),
        ("swl-5-1s", Limit::police(SlidingWindowLog, 5, secs(1), 5)),
        ("swl-1-10ms", Limit::police(SlidingWindowLog, 1, ms(10), 1)),
        (
            "swl-20-3s",
            Limit::police(SlidingWindowLog, 20, secs(3), 20),
        ),
        (
            "swc-5-1s",
            Limit::police(SlidingWindowCounter, 5, secs(1), 5),
        ),
        (
            "swc-7-3ms",
            Limit::police(SlidingWindowCounter, 7, ms(3), 7),
        ),
        (
            "swc-1000-1m",
            Limit::police(SlidingWindowCounter, 1000, secs(60), 1000),
        ),
        ("tb-3-1s-b5", Limit::police(TokenBucket, 3, secs(1), 5)),
        ("tb-10-1s-b1", Limit::police(TokenBucket, 10, secs(1), 1)),
        ("tb-7-1ms-b3", Limit::police(TokenBucket, 7, ms(1), 3)),
        ("lbp-10-1s-b20", Limit::police(LeakyBucket, 10, secs(1), 20)),
        ("lbp-3-1s-b2", Limit::police(LeakyBucket, 3, secs(1), 2)),
        ("lbs-10-1s-b20-2s", Limit::shape(10, secs(1), 20, secs(2))),
        ("lbs-3-1s-b5-700ms", Limit::shape(3, secs(1), 5, ms(700))),
        (
            "lbs-4-10ms-b3-0",
            Limit::shape(4, ms(10), 3, Duration::ZERO),
        ),
        ("cc-3", Limit::police(Concurrency, 3, Duration::ZERO, 3)),
        ("cc-1", Limit::police(Concurrency, 1, Duration::ZERO, 1)),
    ]
}

/// A time step at `scale` (microseconds): often none, mostly around the scale, now and then
/// a jump of many windows.
fn step_us(rng: &mut fastrand::Rng, scale: u64) -> u64 {
    match rng.u8(0..20) {
        0..=3 => 0,
        4 => rng.u64(0..scale * 40),
        _ => rng.u64(0..scale * 2),
    }
}

/// A cost: mostly 1, sometimes 0, a few units, or around the rule's whole quota (the
/// never-admitted `cost > limit` case included).
fn cost(rng: &mut fastrand::Rng, l: &Limit) -> u64 {
    let quota = match l.algorithm() {
        Algorithm::TokenBucket | Algorithm::LeakyBucket => l.burst(),
        _ => l.limit(),
    };
    match rng.u8(0..20) {
        0 => 0,
        1..=3 => rng.u64(2..=(quota / 3).max(2)),
        4 | 5 => rng.u64(quota.saturating_sub(1)..=quota + 2),
        _ => 1,
    }
}

/// Every algorithm, alone and combined in multi-rule requests, over random sequences of
/// instants and costs: the Redis scripts' decisions (allowed, remaining, reset, retry_after,
/// delay, limit) equal the Rust reference's exactly, and so do their all-or-nothing charges
/// (any divergence in state shows up in a later decision).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_decide_exactly_like_the_reference() {
    let server = RedisServer::start();
    let store = standalone(&server);
    let rules = differential_rules();
    let mut compared = 0usize;
    // Per rule: (admitted, rejected), to show that both sides of every rule were compared.
    let mut outcomes: HashMap<String, (u32, u32)> = HashMap::new();
    for seed in 0..160u64 {
        let mut rng = fastrand::Rng::with_seed(seed);
        let mut reference = Reference::default();
        // A few rules per sequence, hit often enough to reach their limits, at a time scale
        // from tens of microseconds to seconds.
        let focus: Vec<usize> = (0..4).map(|_| rng.usize(0..rules.len())).collect();
        let scale = [50, 1_000, 20_000, 200_000, 2_000_000][rng.usize(0..5)];
        // A realistic epoch instant (2025-2026), so that aligned windows and magnitudes are
        // those of production.
        let mut now_us: u64 = 1_750_000_000_000_000 + rng.u64(0..10_000_000_000);
        let mut held: Vec<(u64, Vec<Check>)> = Vec::new();
        for step in 0..120 {
            now_us += step_us(&mut rng, scale);
            // Give back a held concurrency lease now and then, as a finished request does.
            if !held.is_empty() && rng.u8(0..4) == 0 {
                let (lease, checks) = held.swap_remove(rng.usize(0..held.len()));
                reference.release_beside(&store, lease, &checks).await;
            }
            let n = match rng.u8(0..10) {
                0..=5 => 1,
                6..=8 => 2,
                _ => 3,
            };
            let mut picked = HashSet::new();
            let mut checks = Vec::new();
            while checks.len() < n {
                let (name, l) = &rules[focus[rng.usize(0..focus.len())]];
                let key = seed * 16 + rng.u64(0..2);
                if picked.insert((name, key)) {
                    checks.push(check(name, key, l.clone(), cost(&mut rng, l)));
                }
            }
            let lease = rng.u64(..);
            let (got, want) = reference.beside(&store, &checks, lease, now_us).await;
            assert_eq!(
                got,
                want,
                "seed {seed} step {step} at {now_us} us: {:?}",
                checks
                    .iter()
                    .map(|c| (c.rule.to_string(), c.counter, c.cost))
                    .collect::<Vec<_>>()
            );
            compared += checks.len();
            for (c, d) in checks.iter().zip(&got) {
                tally(
                    outcomes.entry(c.rule.to_string()).or_insert((0, 0)),
                    d.allowed,
                );
            }
            if let Some(slots) = held_slots(&checks, &got) {
                held.push((lease, slots));
            }
        }
    }
    eprintln!("compared {compared} decisions with the reference, all equal: {outcomes:?}");
    for (name, _) in &rules {
        let (admitted, rejected) = outcomes.get(*name).copied().unwrap_or_default();
        assert!(
            admitted > 10 && rejected > 10,
            "{name}: too few cases compared ({admitted} admitted, {rejected} rejected)"
        );
    }
}

/// A reload keeps a rule's name and key but changes its numbers or its algorithm: the state
/// left by the old rule is reinterpreted (new rate, same missing tokens) or, when it belongs to
/// another algorithm, treated as no state, exactly as the reference does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reloaded_rules_reinterpret_state_like_the_reference() {
    use Algorithm::*;
    let server = RedisServer::start();
    let store = standalone(&server);
    // Every variant of one rule, cycled through in random order.
    let variants = [
        Limit::police(TokenBucket, 3, secs(1), 5),
        Limit::police(TokenBucket, 7, secs(2), 4),
        Limit::police(TokenBucket, 1000, secs(60), 50),
        Limit::police(LeakyBucket, 10, secs(1), 20),
        Limit::shape(4, secs(1), 6, ms(900)),
        Limit::police(LeakyBucket, 13, secs(3), 5),
        Limit::police(FixedWindow, 5, secs(1), 5),
        Limit::police(FixedWindow, 2, secs(1), 2),
        Limit::police(SlidingWindowCounter, 5, secs(1), 5),
        Limit::police(SlidingWindowCounter, 9, secs(2), 9),
        Limit::police(SlidingWindowLog, 4, secs(1), 4),
        Limit::police(SlidingWindowLog, 2, secs(1), 2),
        Limit::police(Concurrency, 2, Duration::ZERO, 2),
    ];
    for seed in 0..24u64 {
        let mut rng = fastrand::Rng::with_seed(1000 + seed);
        let mut reference = Reference::default();
        let mut now_us: u64 = 1_760_000_000_000_000 + rng.u64(0..10_000_000_000);
        let mut current = rng.usize(0..variants.len());
        for step in 0..150 {
            now_us += step_us(&mut rng, 100_000);
            if rng.u8(0..6) == 0 {
                current = rng.usize(0..variants.len());
            }
            let l = variants[current].clone();
            let c = check("reloaded", seed, l.clone(), cost(&mut rng, &l));
            let (got, want) = reference.beside(&store, &[c], rng.u64(..), now_us).await;
            assert_eq!(got, want, "seed {seed} step {step} variant {current}");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Exact over the whole range `check` accepts.
// ---------------------------------------------------------------------------------------------

/// The example: a token bucket of 1000 per 365 days refills over more than 2^53 ns
/// (104 days); the scripts once capped its capacity there and admitted 285. Now its whole
/// burst, as the reference, and the same wait after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_year_long_bucket_admits_its_whole_burst() {
    let server = RedisServer::start();
    let store = standalone(&server);
    let year = secs(365 * 86_400);
    let now_us = 1_760_000_000_000_000;
    for (name, l) in [
        (
            "year-tb",
            Limit::police(Algorithm::TokenBucket, 1000, year, 1000),
        ),
        (
            "year-lb",
            Limit::police(Algorithm::LeakyBucket, 1000, year, 1000),
        ),
        (
            "year-swc",
            Limit::police(Algorithm::SlidingWindowCounter, 1_000_000, year, 1),
        ),
    ] {
        let quota = algorithm::quota(&l);
        let c = check(name, 1, l.clone(), 1);
        let mut reference = Reference::default();
        let mut admitted = 0;
        for i in 0..quota + 1 {
            let (got, want) = reference
                .beside(&store, std::slice::from_ref(&c), i, now_us)
                .await;
            assert_eq!(got, want, "{name}: request {i}");
            admitted += u64::from(got[0].allowed);
            if quota > 1000 && i == 10 {
                break;
            }
        }
        if quota <= 1000 {
            assert_eq!(admitted, quota, "{name}: the whole burst, then no more");
        }
    }
}

/// A bucket written by an older floodgate (`<written, us>`, `<debt, ns>`, `<interval, ns>`)
/// reads as the same instant and rate: upgrading refills no bucket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buckets_written_by_an_older_floodgate_keep_their_level() {
    let server = RedisServer::start();
    let store = standalone(&server);
    let now_us: u64 = 1_760_000_000_000_000;
    for (tag, l) in [
        (3u8, Limit::police(Algorithm::TokenBucket, 3, secs(1), 5)),
        (4u8, Limit::police(Algorithm::LeakyBucket, 3, secs(1), 5)),
    ] {
        let c = check("older", u64::from(tag), l.clone(), 1);
        let key = store.redis_key(&c);
        // Four tokens missing, written 100 ms ago: 3 intervals and a bit still to refill.
        let (written, debt, interval) = (now_us - 100_000, 4 * 333_333_334u64, 333_333_334u64);
        let mut old = vec![tag];
        for n in [written, debt, interval] {
            old.extend_from_slice(&(n as f64).to_le_bytes());
        }
        let mut conn = server.connection();
        let _: () = redis::cmd("SET")
            .arg(&key)
            .arg(old)
            .query(&mut conn)
            .expect("SET");
        let full_at = written * 1000 + debt;
        let state = match tag {
            3 => State::TokenBucket { full_at, interval },
            _ => State::LeakyBucket {
                tat: full_at,
                interval,
            },
        };
        let mut reference = Reference::default();
        reference.states.insert(key.clone(), state);
        for i in 0..3 {
            let (got, want) = reference
                .beside(&store, std::slice::from_ref(&c), i, now_us)
                .await;
            assert_eq!(got, want, "tag {tag}, request {i}");
        }
    }
}

/// A lease of a bucket refilling over a year (its numbers pass 2^53 ns) given back unspent
/// undoes exactly its charge: the bucket is as if only the spent permit had been taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_year_long_bucket_takes_back_unspent_lease_permits_exactly() {
    let server = RedisServer::start();
    let store = standalone(&server);
    let year = secs(365 * 86_400);
    for (name, l) in [
        (
            "year-lease-tb",
            Limit::police(Algorithm::TokenBucket, 1000, year, 1000),
        ),
        (
            "year-lease-lb",
            Limit::police(Algorithm::LeakyBucket, 1000, year, 1000),
        ),
    ] {
        let c = check(name, 1, l, 1);
        let answer = store
            .decide_leased(std::slice::from_ref(&c), &[100], 1, 1, GENEROUS)
            .await
            .expect("decide");
        let (d, grant) = &answer[0];
        assert!(d.allowed);
        assert_eq!(grant.granted, 100, "{name}: cost + min(99, 999 / 2)");
        let back = store
            .give_back(&[floodgate::limiter::store::Return {
                check: c.clone(),
                permits: 99,
                window_end_us: grant.window_end_us,
                charged_at_us: grant.charged_at_us,
            }])
            .await;
        assert_eq!(back, 99, "{name}");
        // One interval is almost nine hours: nothing refilled meanwhile.
        let d = store
            .decide(std::slice::from_ref(&c), 2, GENEROUS)
            .await
            .expect("decide");
        assert_eq!((d[0].allowed, d[0].remaining), (true, 998), "{name}");
    }
}

/// A value of `bits` binary digits or fewer, at most `max`, each size as likely as the next:
/// small and huge numbers alike, and `max` itself now and then.
fn magnitude(rng: &mut fastrand::Rng, min: u64, max: u64) -> u64 {
    if rng.u8(0..12) == 0 {
        return if rng.bool() { min } else { max };
    }
    let bits = rng.u32(0..=64 - max.leading_zeros());
    let hi = if bits >= 64 {
        u64::MAX
    } else {
        (1u64 << bits) - 1
    };
    rng.u64(min..=hi.clamp(min, max))
}

/// A rule as `check` accepts it, from anywhere in the accepted range: limit and burst up to
/// 10^15, windows from 1 ms to 3650 d, a bucket's refill (burst × window / limit) up to
/// 3650 d, shaping delays up to 60 s.
fn accepted_rule(rng: &mut fastrand::Rng) -> Limit {
    use algorithm::{MAX_COUNT, MAX_SLIDING_LOG_LIMIT, MAX_WINDOW};
    let algorithm = Algorithm::ALL[rng.usize(0..Algorithm::ALL.len())];
    let max_limit = match algorithm {
        Algorithm::SlidingWindowLog => MAX_SLIDING_LOG_LIMIT,
        _ => MAX_COUNT,
    };
    let limit = magnitude(rng, 1, max_limit);
    let max_ms = MAX_WINDOW.as_millis() as u64;
    let window = ms(magnitude(rng, 1, max_ms));
    if algorithm == Algorithm::Concurrency {
        return Limit::police(algorithm, limit, Duration::ZERO, limit);
    }
    if !matches!(algorithm, Algorithm::TokenBucket | Algorithm::LeakyBucket) {
        return Limit::police(algorithm, limit, window, limit);
    }
    // burst × window <= MAX_WINDOW × limit, as validation compares it.
    let most =
        (MAX_WINDOW.as_nanos() * u128::from(limit) / window.as_nanos()).min(MAX_COUNT as u128);
    let burst = magnitude(rng, 1, most as u64);
    if algorithm == Algorithm::LeakyBucket && rng.bool() {
        let max_delay = ms(magnitude(rng, 0, 60_000));
        Limit::shape(limit, window, burst, max_delay)
    } else {
        Limit::police(algorithm, limit, window, burst)
    }
}

/// A time step (us) at the scale of `l`: none, a few intervals, a fraction of the window,
/// several windows.
fn scaled_step(rng: &mut fastrand::Rng, l: &Limit) -> u64 {
    let window_us = (l.window().as_micros() as u64).max(1);
    let interval_us = (window_us / l.limit().max(1)).max(1);
    match rng.u8(0..10) {
        0..=2 => 0,
        3 | 4 => rng.u64(0..=interval_us.saturating_mul(3)),
        5 | 6 => rng.u64(0..=window_us),
        7 => rng.u64(0..=window_us.saturating_mul(3)),
        _ => rng.u64(0..1000),
    }
}

/// A cost for `l`: mostly 1, sometimes 0, a share of the quota, all of it, or just past it.
fn ranged_cost(rng: &mut fastrand::Rng, l: &Limit) -> u64 {
    let quota = algorithm::quota(l);
    // A sliding log or concurrency key holds one entry per unit: keep those costs small.
    let quota = match l.algorithm() {
        Algorithm::SlidingWindowLog | Algorithm::Concurrency => quota.min(2_000),
        _ => quota,
    };
    match rng.u8(0..12) {
        0 => 0,
        1..=3 => magnitude(rng, 1, quota),
        4 => quota,
        5 => quota + 1,
        6 => rng.u64(quota / 2..=quota),
        _ => 1,
    }
}

/// Every algorithm with numbers drawn from the whole range `check` accepts (10^15 a window,
/// 1 ms to ten-year windows, buckets refilling over up to ten years, at instants up to the
/// year 2100), alone, combined, and reloaded with other numbers on the same key: the scripts
/// decide exactly as the Rust reference, to the nanosecond. Many of these numbers pass 2^53
/// (as nanoseconds, or as products of a count and a window), which a double cannot hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_are_exact_over_the_whole_accepted_range() {
    let server = RedisServer::start();
    // Concurrency slots that outlive every jump in time: the reference's never expire.
    let options = Options {
        lease_ttl: secs(50 * 365 * 86_400),
        ..Options::default()
    };
    let store = standalone_with(&server, options);
    // The year 2118: every instant of the test stays before it.
    let last_us: u64 = 4_700_000_000_000_000;
    let two53 = Duration::from_nanos(1 << 53);
    let mut compared = 0usize;
    let mut past_2_53 = 0usize;
    let mut outcomes: HashMap<&'static str, (u32, u32)> = HashMap::new();
    for seed in 0..400u64 {
        let mut rng = fastrand::Rng::with_seed(0x5eed_0000 + seed);
        let mut reference = Reference::default();
        let mut rules: Vec<Limit> = (0..3).map(|_| accepted_rule(&mut rng)).collect();
        let mut now_us: u64 = rng.u64(1_700_000_000_000_000..4_100_000_000_000_000);
        let mut held: Vec<(u64, Vec<Check>)> = Vec::new();
        for step in 0..30 {
            let r = rng.usize(0..rules.len());
            now_us += scaled_step(&mut rng, &rules[r]).min(last_us - now_us);
            if rng.u8(0..10) == 0 {
                // A reload: same rule name and key, new numbers (maybe another algorithm).
                // Not a sliding log's shorter window: the reference keeps its log in
                // admission order, which only that reload puts out of expiry order (a
                // question of semantics, not of precision).
                let next = accepted_rule(&mut rng);
                let shorter_log = |a: &Limit, b: &Limit| {
                    a.algorithm() == Algorithm::SlidingWindowLog
                        && b.algorithm() == Algorithm::SlidingWindowLog
                        && b.window() < a.window()
                };
                if !shorter_log(&rules[r], &next) {
                    // The reference counts slots, not whose they are: give them back first,
                    // or a release after the key changed hands would free another's.
                    for (lease, checks) in held.drain(..) {
                        reference.release_beside(&store, lease, &checks).await;
                    }
                    rules[r] = next;
                }
            }
            if !held.is_empty() && rng.u8(0..3) == 0 {
                let (lease, checks) = held.swap_remove(rng.usize(0..held.len()));
                reference.release_beside(&store, lease, &checks).await;
            }
            let mut checks = vec![];
            for (i, l) in rules.iter().enumerate() {
                if i == r || rng.u8(0..4) == 0 {
                    let name = ["range-a", "range-b", "range-c"][i];
                    checks.push(check(name, seed, l.clone(), ranged_cost(&mut rng, l)));
                }
            }
            let lease = rng.u64(..);
            let (got, want) = reference.beside(&store, &checks, lease, now_us).await;
            assert_eq!(
                got,
                want,
                "seed {seed} step {step} at {now_us} us: {:?}",
                checks
                    .iter()
                    .map(|c| (c.rule.to_string(), c.limit.clone(), c.cost))
                    .collect::<Vec<_>>()
            );
            compared += got.len();
            for (c, d) in checks.iter().zip(&got) {
                past_2_53 += usize::from(d.reset > two53 || d.retry_after > two53);
                tally(
                    outcomes.entry(c.limit.algorithm().as_str()).or_default(),
                    d.allowed,
                );
            }
            if let Some(slots) = held_slots(&checks, &got) {
                held.push((lease, slots));
            }
        }
        // Keys of this seed are never used again: keep Redis small.
        let _: () = server.query(&["FLUSHDB"]);
    }
    eprintln!("compared {compared} decisions, {past_2_53} waits past 2^53 ns: {outcomes:?}");
    assert!(
        past_2_53 > 100,
        "too few waits past 2^53 ns compared: {past_2_53}"
    );
    for algorithm in Algorithm::ALL {
        let (admitted, rejected) = outcomes
            .get(algorithm.as_str())
            .copied()
            .unwrap_or_default();
        assert!(
            admitted > 50 && rejected > 50,
            "{}: too few cases ({admitted} admitted, {rejected} rejected)",
            algorithm.as_str()
        );
    }
}

/// `check` refuses what the scripts could not hold exactly, at the offending key's line and
/// column, and accepts everything up to the bounds.
#[test]
fn rules_past_what_the_store_holds_exactly_fail_check() {
    let config = |rule: &str| {
        format!(
            "[store]\nbackend = \"redis\"\nurl = \"redis://127.0.0.1:1\"\n\n[[upstreams]]\nname = \"u\"\ntargets = [\"127.0.0.1:9000\"]\n\n[[routes]]\nname = \"r\"\nupstream = \"u\"\n\n[[rules]]\nname = \"x\"\nkey = [\"ip\"]\n{rule}"
        )
    };
    let path = std::path::Path::new("gateway.toml");
    let parse = |rule: &str| floodgate::config::Config::from_str(path, &config(rule));
    for (rule, at, says) in [
        (
            "algorithm = \"fixed_window\"\nlimit = 10\nwindow = \"3651d\"\n",
            "gateway.toml:18:10",
            "3650d",
        ),
        (
            "algorithm = \"sliding_window_counter\"\nlimit = 1000000000000001\nwindow = \"1s\"\n",
            "gateway.toml:17:9",
            "at most 1000000000000000",
        ),
        (
            "algorithm = \"token_bucket\"\nlimit = 10\nwindow = \"1s\"\nburst = 1000000000000001\n",
            "gateway.toml:19:9",
            "at most 1000000000000000",
        ),
        (
            "algorithm = \"token_bucket\"\nlimit = 1\nwindow = \"1d\"\nburst = 3651\n",
            "gateway.toml:19:9",
            "3651 days to refill",
        ),
    ] {
        let err = parse(rule)
            .err()
            .unwrap_or_else(|| panic!("accepted: {rule}"));
        let text = err.to_string();
        assert!(
            text.starts_with(at) && text.contains(says),
            "{rule}: {text}"
        );
    }
    for rule in [
        "algorithm = \"fixed_window\"\nlimit = 1000000000000000\nwindow = \"3650d\"\n",
        "algorithm = \"token_bucket\"\nlimit = 1\nwindow = \"1d\"\nburst = 3650\n",
        "algorithm = \"leaky_bucket\"\nlimit = 1000000000000000\nwindow = \"3650d\"\nburst = 1000000000000000\nmode = \"shape\"\n",
    ] {
        parse(rule).unwrap_or_else(|e| panic!("refused {rule}: {e}"));
    }
}

// ---------------------------------------------------------------------------------------------
// Behaviour on Redis' own clock.
// ---------------------------------------------------------------------------------------------

fn redis_time_us(server: &RedisServer) -> u64 {
    let t: Vec<u64> = server.query(&["TIME"]);
    t[0] * 1_000_000 + t[1]
}

/// N concurrent requests on one key admit exactly what the limit allows, for every algorithm;
/// the rejected ones are told a truthful Retry-After; every key has the documented layout and
/// a TTL no longer than its state matters.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_concurrent_burst_admits_exactly_the_limit() {
    use Algorithm::*;
    let server = RedisServer::start();
    let store = standalone(&server);
    let hour = secs(3600);
    let cases = [
        ("burst-fw", Limit::police(FixedWindow, 10, hour, 10)),
        ("burst-swl", Limit::police(SlidingWindowLog, 10, hour, 10)),
        (
            "burst-swc",
            Limit::police(SlidingWindowCounter, 10, hour, 10),
        ),
        ("burst-tb", Limit::police(TokenBucket, 10, hour, 10)),
        ("burst-lbp", Limit::police(LeakyBucket, 10, hour, 10)),
        (
            "burst-cc",
            Limit::police(Concurrency, 10, Duration::ZERO, 10),
        ),
    ];
    for (rule, l) in cases {
        let window_before = redis_time_us(&server) / 3_600_000_000;
        let c = check(rule, 0x5eed, l.clone(), 1);
        let calls = (0..25u64).map(|lease| {
            let store = store.clone();
            let c = c.clone();
            async move { store.decide(&[c], lease, GENEROUS).await }
        });
        let decisions: Vec<Decision> = futures::future::join_all(calls)
            .await
            .into_iter()
            .map(|r| r.expect("decide").remove(0))
            .collect();
        if redis_time_us(&server) / 3_600_000_000 != window_before
            && matches!(l.algorithm(), FixedWindow | SlidingWindowCounter)
        {
            eprintln!("{rule}: crossed an hour boundary mid-burst; not judged");
            continue;
        }
        let admitted = decisions.iter().filter(|d| d.allowed).count();
        assert_eq!(admitted, 10, "{rule}: {decisions:?}");
        let key = format!("{PREFIX}{rule}:{{{:016x}}}", 0x5eed);
        assert_eq!(store.redis_key(&c), key);
        let pttl: i64 = server.query(&["PTTL", &key]);
        // The counter's state matters until the end of the next window.
        let bound = match l.algorithm() {
            Concurrency => floodgate::limiter::redis::LEASE_TTL,
            SlidingWindowCounter => hour * 2,
            _ => hour,
        };
        assert!(
            pttl > 0 && pttl as u128 <= bound.as_millis() + 1,
            "{rule}: PTTL {pttl}"
        );
        for d in decisions.iter().filter(|d| !d.allowed) {
            assert_eq!(d.remaining, 0);
            let ok = match l.algorithm() {
                // 6 minutes per token: the next one comes within 6 minutes.
                TokenBucket | LeakyBucket => {
                    d.retry_after > secs(359) && d.retry_after <= secs(360)
                }
                SlidingWindowLog => d.retry_after > hour - secs(60) && d.retry_after <= hour,
                FixedWindow | SlidingWindowCounter => d.retry_after <= hour * 2,
                Concurrency => d.retry_after == secs(1),
            };
            assert!(ok, "{rule}: retry_after {:?}", d.retry_after);
        }
    }
}

/// Two rules on one request, one exhausted: the request is rejected and the other rule's quota
/// is not consumed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_request_charges_no_rule() {
    let server = RedisServer::start();
    let store = standalone(&server);
    let hour = secs(3600);
    let tight = check(
        "tight",
        7,
        Limit::police(Algorithm::TokenBucket, 2, hour, 2),
        1,
    );
    let roomy = check(
        "roomy",
        7,
        Limit::police(Algorithm::SlidingWindowLog, 100, hour, 100),
        1,
    );
    let slots = check(
        "slots",
        7,
        Limit::police(Algorithm::Concurrency, 50, hour, 50),
        1,
    );
    let both = [tight.clone(), roomy.clone(), slots.clone()];
    for lease in 0..2 {
        let ds = store.decide(&both, lease, GENEROUS).await.expect("decide");
        assert!(ds.iter().all(|d| d.allowed), "{ds:?}");
    }
    for lease in 2..12 {
        let ds = store.decide(&both, lease, GENEROUS).await.expect("decide");
        assert!(!ds[0].allowed, "tight is exhausted");
        assert!(ds[1].allowed && ds[2].allowed, "the others would admit");
        assert_eq!(ds[1].remaining, 97, "roomy: 2 taken, this one not kept");
    }
    let logged: i64 = server.query(&["ZCARD", &store.redis_key(&roomy)]);
    assert_eq!(logged, 2, "roomy charged only by the admitted requests");
    let held: i64 = server.query(&["ZCARD", &store.redis_key(&slots)]);
    assert_eq!(held, 2, "no slot taken by rejected requests");
    let alone = store.decide(&[roomy], 99, GENEROUS).await.expect("decide");
    assert_eq!(alone[0].remaining, 97);
}

/// Concurrency slots are leases: up to the limit, freed at once by release, and purged after
/// their TTL when their holder never releases them (a gateway that died).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_slots_are_leases() {
    let server = RedisServer::start();
    let lease_ttl = ms(400);
    let store = standalone_with(
        &server,
        Options {
            lease_ttl,
            ..Options::default()
        },
    );
    let c = check(
        "exports",
        1,
        Limit::police(Algorithm::Concurrency, 3, Duration::ZERO, 3),
        1,
    );
    let key = store.redis_key(&c);
    let one = std::slice::from_ref(&c);
    for lease in 1..=3 {
        let d = store.decide(one, lease, GENEROUS).await.expect("decide");
        assert!(d[0].allowed);
        assert_eq!(d[0].remaining, 3 - lease);
    }
    let full = store.decide(one, 4, GENEROUS).await.expect("decide");
    assert!(!full[0].allowed);
    assert_eq!(full[0].retry_after, secs(1));
    store.release(one, 2).await;
    let held: i64 = server.query(&["ZCARD", &key]);
    assert_eq!(held, 2, "release frees this lease's slot at once");
    // Releasing twice, or a lease that holds nothing, frees nothing else.
    store.release(one, 2).await;
    store.release(one, 77).await;
    let held: i64 = server.query(&["ZCARD", &key]);
    assert_eq!(held, 2);
    assert!(store.decide(one, 5, GENEROUS).await.expect("decide")[0].allowed);
    let pttl: i64 = server.query(&["PTTL", &key]);
    assert!(
        pttl > 0 && pttl <= 401,
        "the key lives as long as its newest lease: {pttl}"
    );

    // Nobody releases: the leases expire and the next acquire purges them.
    let start = Instant::now();
    assert!(!store.decide(one, 6, GENEROUS).await.expect("decide")[0].allowed);
    eventually(secs(5), "expired leases purged", || {
        let store = store.clone();
        let c = c.clone();
        async move {
            let d = store.decide(&[c], 7, GENEROUS).await.expect("decide");
            d[0].allowed.then_some(())
        }
    })
    .await;
    assert!(
        start.elapsed() >= lease_ttl - ms(100),
        "freed only by expiry: {:?}",
        start.elapsed()
    );
}

/// `SCRIPT FLUSH` (what a Redis restart or failover does to the script cache) is invisible:
/// the store reloads the script and retries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_flush_is_transparent() {
    let server = RedisServer::start();
    let store = standalone(&server);
    let c = check(
        "flush",
        1,
        Limit::police(Algorithm::FixedWindow, 1000, secs(60), 1000),
        1,
    );
    for round in 0..5 {
        let _: () = server.query(&["SCRIPT", "FLUSH"]);
        for lease in 0..3 {
            store
                .decide(std::slice::from_ref(&c), lease, GENEROUS)
                .await
                .unwrap_or_else(|e| panic!("round {round}: {e}"));
        }
        let _: () = server.query(&["SCRIPT", "FLUSH"]);
        store.release(std::slice::from_ref(&c), 1).await;
    }
    assert_eq!(store.breaker_state(), BreakerState::Closed);
}

/// Redis killed: calls fail (promptly, never hang); restarted on the same port: the store
/// recovers by itself within a few seconds, scripts reloaded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_fail_while_redis_is_down_and_recover_when_it_returns() {
    let mut server = RedisServer::start();
    let store = standalone(&server);
    let c = check(
        "restart",
        1,
        Limit::police(Algorithm::TokenBucket, 100, secs(1), 100),
        1,
    );
    let one = std::slice::from_ref(&c);
    let timeout = ms(100);
    store.decide(one, 1, GENEROUS).await.expect("up");
    assert!(store.is_up());

    server.stop();
    for lease in 0..8 {
        let start = Instant::now();
        let r = store.decide(one, lease, timeout).await;
        assert!(r.is_err(), "Redis is down: {r:?}");
        assert!(
            start.elapsed() < timeout + ms(100),
            "failing is bounded by the timeout"
        );
    }
    assert!(!store.is_up());

    server.restart();
    let back = Instant::now();
    eventually(secs(10), "store recovers after restart", || {
        let store = store.clone();
        let c = c.clone();
        async move { store.decide(&[c], 9, timeout).await.ok() }
    })
    .await;
    let recovery = back.elapsed();
    eprintln!("recovered {recovery:?} after Redis answered again");
    assert!(recovery < secs(5), "recovery took {recovery:?}");
    assert!(store.is_up());
    assert_eq!(store.breaker_state(), BreakerState::Closed);
}

/// The store can be built while Redis is down: no blocking, no error; it connects when Redis
/// appears.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_starts_without_redis_and_connects_when_it_appears() {
    let mut server = RedisServer::start();
    server.stop();
    let start = Instant::now();
    let store = standalone(&server);
    assert!(start.elapsed() < ms(100), "new() does not wait for Redis");
    assert!(!store.is_connected());
    let c = check(
        "late",
        1,
        Limit::police(Algorithm::FixedWindow, 5, secs(60), 5),
        1,
    );
    let r = store.decide(std::slice::from_ref(&c), 1, ms(50)).await;
    assert!(matches!(r, Err(StoreError::Timeout)), "{r:?}");
    server.restart();
    eventually(secs(10), "connects once Redis is up", || {
        let store = store.clone();
        let c = c.clone();
        async move { store.decide(&[c], 2, ms(200)).await.ok() }
    })
    .await;
    assert!(store.is_connected());
}

/// A URL with a user, a password and a database number: the store authenticates (ACL user),
/// keeps its keys in that database, and a wrong password fails decisions with an error that
/// never shows the password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn url_credentials_and_database_are_used() {
    let server = RedisServer::start_with(|_, _| {
        ["--user", "gate", "on", ">s3cret-pw", "~*", "&*", "+@all"]
            .map(String::from)
            .to_vec()
    });
    let url = |password: &str| format!("redis://gate:{password}@127.0.0.1:{}/3", server.port());
    let store =
        RedisStore::new(&store_config(Backend::Redis, vec![url("s3cret-pw")])).expect("store");
    let c = check(
        "authed",
        5,
        Limit::police(Algorithm::FixedWindow, 2, secs(60), 2),
        1,
    );
    for (lease, admitted) in [(1, true), (2, true), (3, false)] {
        let ds = store
            .decide(std::slice::from_ref(&c), lease, GENEROUS)
            .await
            .expect("decide with credentials");
        assert_eq!(ds[0].allowed, admitted, "request {lease}: {ds:?}");
    }
    let in_db3: i64 = {
        let mut conn = redis::Client::open(format!("redis://127.0.0.1:{}/3", server.port()))
            .expect("client")
            .get_connection()
            .expect("connect to db 3");
        redis::cmd("EXISTS")
            .arg(store.redis_key(&c))
            .query(&mut conn)
            .expect("EXISTS")
    };
    assert_eq!(in_db3, 1, "the counter lives in database 3");
    let in_db0: i64 = server.query(&["EXISTS", &store.redis_key(&c)]);
    assert_eq!(in_db0, 0, "and not in database 0");

    let wrong =
        RedisStore::new(&store_config(Backend::Redis, vec![url("not-the-pw")])).expect("store");
    let r = wrong.decide(std::slice::from_ref(&c), 9, ms(300)).await;
    let error = format!("{:?}", r.expect_err("a wrong password cannot decide"));
    assert!(!error.contains("not-the-pw"), "{error}");
}

/// A Redis that stops answering (`DEBUG SLEEP`): decisions give up at their timeout, with
/// `StoreError::Timeout`, without waiting for Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_redis_times_out_quickly() {
    let server = RedisServer::start();
    let store = standalone(&server);
    let c = check(
        "slow",
        1,
        Limit::police(Algorithm::SlidingWindowLog, 1000, secs(60), 1000),
        1,
    );
    let one = std::slice::from_ref(&c);
    store.decide(one, 1, GENEROUS).await.expect("up");
    let timeout = ms(50);
    let stall = Stall::start(&server, "1.5");
    // The sleep starts when Redis reads it; until then a call may still succeed.
    let elapsed = eventually(secs(5), "a decision times out", || {
        let store = store.clone();
        let c = c.clone();
        async move {
            let start = Instant::now();
            match store.decide(&[c], 2, timeout).await {
                Err(StoreError::Timeout) => Some(start.elapsed()),
                Ok(_) => None,
                Err(e) => panic!("expected a timeout, got {e}"),
            }
        }
    })
    .await;
    assert!(elapsed < timeout + ms(50), "gave up after {elapsed:?}");
    drop(stall);
    eventually(secs(10), "answers again after the sleep", || {
        let store = store.clone();
        let c = c.clone();
        async move { store.decide(&[c], 3, ms(500)).await.ok() }
    })
    .await;
}

/// After repeated failures the breaker opens: calls fail at once without touching Redis; once
/// Redis is back the half-open probe closes it, without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_breaker_opens_after_repeated_failures_and_closes_after_recovery() {
    let mut server = RedisServer::start();
    let store = standalone(&server);
    let c = check(
        "breaker",
        1,
        Limit::police(Algorithm::FixedWindow, 1000, secs(60), 1000),
        1,
    );
    let one = std::slice::from_ref(&c);
    store.decide(one, 1, GENEROUS).await.expect("up");
    server.stop();
    for lease in 0..5 {
        let r = store.decide(one, lease, ms(100)).await;
        assert!(
            matches!(r, Err(StoreError::Failed(_) | StoreError::Timeout)),
            "{r:?}"
        );
    }
    assert_eq!(store.breaker_state(), BreakerState::Open);
    let start = Instant::now();
    let r = store.decide(one, 9, ms(100)).await;
    assert!(matches!(r, Err(StoreError::CircuitOpen)), "{r:?}");
    assert!(
        start.elapsed() < ms(10),
        "fails fast: {:?}",
        start.elapsed()
    );

    server.restart();
    eventually(secs(10), "breaker closes after Redis returns", || {
        let store = store.clone();
        let c = c.clone();
        async move { store.decide(&[c], 10, ms(200)).await.ok() }
    })
    .await;
    assert_eq!(store.breaker_state(), BreakerState::Closed);
}

/// A Redis that keeps stalling also opens the breaker (timeouts count as failures).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_timeouts_open_the_breaker() {
    let server = RedisServer::start();
    let store = standalone(&server);
    let c = check(
        "stall",
        1,
        Limit::police(Algorithm::TokenBucket, 1000, secs(1), 1000),
        1,
    );
    let one = std::slice::from_ref(&c);
    store.decide(one, 1, GENEROUS).await.expect("up");
    let _stall = Stall::start(&server, "2");
    let mut lease = 10;
    eventually(secs(5), "breaker opens", || {
        lease += 1;
        let store = store.clone();
        let c = c.clone();
        async move {
            let r = store.decide(&[c], lease, ms(30)).await;
            matches!(r, Err(StoreError::CircuitOpen)).then_some(())
        }
    })
    .await;
    assert_eq!(store.breaker_state(), BreakerState::Open);
}

/// One EVALSHA per request, whatever the number of rules (three here, of three algorithms),
/// sequential or concurrent.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_evalsha_per_request_with_three_rules() {
    let server = RedisServer::start();
    let store = standalone(&server);
    let hour = secs(3600);
    let checks = vec![
        check(
            "rt-tb",
            1,
            Limit::police(Algorithm::TokenBucket, 1_000_000, hour, 1_000_000),
            1,
        ),
        check(
            "rt-swl",
            1,
            Limit::police(Algorithm::SlidingWindowLog, 100_000, hour, 100_000),
            1,
        ),
        check(
            "rt-cc",
            1,
            Limit::police(Algorithm::Concurrency, 100_000, hour, 100_000),
            1,
        ),
    ];
    // Warm up: the first call loads the script (NOSCRIPT, SCRIPT LOAD, EVALSHA).
    store.decide(&checks, 0, GENEROUS).await.expect("decide");
    let _: () = server.query(&["CONFIG", "RESETSTAT"]);
    for lease in 1..=50 {
        store
            .decide(&checks, lease, GENEROUS)
            .await
            .expect("decide");
    }
    let calls = (51..=150u64).map(|lease| {
        let store = store.clone();
        let checks = checks.clone();
        async move { store.decide(&checks, lease, GENEROUS).await }
    });
    for r in futures::future::join_all(calls).await {
        r.expect("decide");
    }
    let evalsha = server.command_calls("evalsha");
    eprintln!("150 requests x 3 rules: {evalsha} EVALSHA calls");
    assert_eq!(evalsha, 150, "one EVALSHA per request");
    assert_eq!(server.command_calls("eval"), 0);
    assert_eq!(server.command_calls("script|load"), 0);
    let clients: String = server.query(&["CLIENT", "LIST"]);
    // The store's one multiplexed connection, plus this query's.
    assert!(clients.lines().count() <= 2, "{clients}");
}

/// `maxmemory-policy` is read on connect: an evicting policy is reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evicting_maxmemory_policy_is_detected() {
    for (policy, evicting) in [
        ("allkeys-lru", true),
        ("volatile-lfu", true),
        ("noeviction", false),
    ] {
        let server =
            RedisServer::start_with(|_, _| vec!["--maxmemory-policy".into(), policy.into()]);
        let store = standalone(&server);
        let read = eventually(secs(10), "maxmemory-policy read", || {
            let store = store.clone();
            async move { store.maxmemory_policy() }
        })
        .await;
        assert_eq!(read, policy);
        assert_eq!(store.evicting_policy(), evicting, "{policy}");
    }
}

/// The decide future can move between threads (Pingora's request futures must be `Send`).
#[test]
fn decide_is_send() {
    fn send<T: Send>(_: &T) {}
    let store = RedisStore::new(&store_config(
        Backend::Redis,
        vec!["redis://127.0.0.1:1".into()],
    ))
    .expect("store");
    let checks: Vec<Check> = Vec::new();
    let f = store.decide(&checks, 0, ms(1));
    send(&f);
    let r = store.release(&checks, 0);
    send(&r);
}

// ---------------------------------------------------------------------------------------------
// Redis Cluster.
// ---------------------------------------------------------------------------------------------

fn evalsha_total(cluster: &RedisCluster) -> u64 {
    cluster
        .nodes
        .iter()
        .map(|n| n.command_calls("evalsha"))
        .sum()
}

/// A real 3-master cluster through the cluster client: keys spread over every master, limits
/// hold exactly, two stores (two gateways) share them, checks of one key digest are decided
/// in one call, others in one call per slot, NOSCRIPT is transparent, and a request rejected
/// in one slot gives back the concurrency slot it took in another.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn limits_hold_across_a_three_master_cluster() {
    let cluster = RedisCluster::start();
    let config = store_config(Backend::RedisCluster, cluster.urls());
    let gateway_a = RedisStore::new(&config).expect("store");
    let gateway_b = RedisStore::new(&config).expect("store");
    let hour = secs(3600);
    let log = Limit::police(Algorithm::SlidingWindowLog, 5, hour, 5);

    // 24 identities: each admits exactly 5 of 12 concurrent requests, half through each
    // gateway.
    let mut owners = HashSet::new();
    for id in 0..24u64 {
        let c = check("cl-log", id, log.clone(), 1);
        owners.insert(cluster.owner_of(&gateway_a.redis_key(&c)));
        let calls = (0..12u64).map(|lease| {
            let store = if lease % 2 == 0 {
                gateway_a.clone()
            } else {
                gateway_b.clone()
            };
            let c = c.clone();
            async move { store.decide(&[c], lease, GENEROUS).await }
        });
        let admitted = futures::future::join_all(calls)
            .await
            .into_iter()
            .filter(|r| r.as_ref().expect("decide")[0].allowed)
            .count();
        assert_eq!(admitted, 5, "identity {id}");
    }
    assert_eq!(owners.len(), 3, "keys landed on every master");

    // Rules keyed on the same parts share the hash tag: one call, atomic.
    for n in &cluster.nodes {
        let _: () = n.query(&["CONFIG", "RESETSTAT"]);
    }
    let same = [
        check(
            "cl-a",
            100,
            Limit::police(Algorithm::TokenBucket, 2, hour, 2),
            1,
        ),
        check(
            "cl-b",
            100,
            Limit::police(Algorithm::SlidingWindowLog, 50, hour, 50),
            1,
        ),
        check(
            "cl-c",
            100,
            Limit::police(Algorithm::Concurrency, 50, hour, 50),
            1,
        ),
    ];
    for lease in 0..6 {
        let ds = gateway_a
            .decide(&same, lease, GENEROUS)
            .await
            .expect("decide");
        assert_eq!(ds[0].allowed, lease < 2);
    }
    assert_eq!(evalsha_total(&cluster), 6, "one call per request");
    let logged: i64 = cluster.nodes[cluster.owner_of(&gateway_a.redis_key(&same[1]))]
        .query(&["ZCARD", &gateway_a.redis_key(&same[1])]);
    assert_eq!(logged, 2, "rejected requests charged nothing");

    // Keys on two different masters: one call per slot, issued together.
    let (x, y) = (0..64u64)
        .flat_map(|i| (0..64u64).map(move |j| (i, j)))
        .map(|(i, j)| {
            (
                check(
                    "cl-x",
                    1000 + i,
                    Limit::police(Algorithm::Concurrency, 3, hour, 3),
                    1,
                ),
                check(
                    "cl-y",
                    2000 + j,
                    Limit::police(Algorithm::SlidingWindowLog, 1, hour, 1),
                    1,
                ),
            )
        })
        .find(|(x, y)| {
            cluster.owner_of(&gateway_a.redis_key(x)) != cluster.owner_of(&gateway_a.redis_key(y))
        })
        .expect("two keys on different masters");
    for n in &cluster.nodes {
        let _: () = n.query(&["CONFIG", "RESETSTAT"]);
    }
    let pair = [x.clone(), y.clone()];
    let ds = gateway_a.decide(&pair, 1, GENEROUS).await.expect("decide");
    assert!(ds.iter().all(|d| d.allowed));
    assert_eq!(evalsha_total(&cluster), 2, "one call per slot");
    // y is now exhausted: the next request is rejected there, and the slot it took on x's
    // master is given back.
    let ds = gateway_a.decide(&pair, 2, GENEROUS).await.expect("decide");
    assert!(ds[0].allowed && !ds[1].allowed);
    let x_key = gateway_a.redis_key(&x);
    let x_node = &cluster.nodes[cluster.owner_of(&x_key)];
    eventually(secs(5), "the partial charge's slot released", || {
        let held: i64 = x_node.query(&["ZCARD", &x_key]);
        async move { (held == 1).then_some(()) }
    })
    .await;

    // maxmemory-policy was read from every master.
    let policy = eventually(secs(10), "maxmemory-policy read", || {
        let store = gateway_a.clone();
        async move { store.maxmemory_policy() }
    })
    .await;
    assert_eq!(policy, "noeviction");
    assert!(!gateway_a.evicting_policy());

    // NOSCRIPT on every master: transparent.
    for n in &cluster.nodes {
        let _: () = n.query(&["SCRIPT", "FLUSH"]);
    }
    for id in 0..12u64 {
        let c = check("cl-flush", id, log.clone(), 1);
        gateway_b
            .decide(&[c], id, GENEROUS)
            .await
            .expect("decide after SCRIPT FLUSH");
    }
}

/// One check per master of `cluster`, in node order: rule `rule`, `limit` per hour.
fn one_key_per_master(
    cluster: &RedisCluster,
    store: &RedisStore,
    rule: &str,
    limit: u64,
) -> Vec<Check> {
    let l = Limit::police(Algorithm::FixedWindow, limit, secs(3600), limit);
    let mut found: Vec<Option<Check>> = vec![None; cluster.nodes.len()];
    for id in 0..1000u64 {
        let c = check(rule, id, l.clone(), 1);
        let owner = cluster.owner_of(&store.redis_key(&c));
        found[owner].get_or_insert(c);
        if found.iter().all(Option::is_some) {
            break;
        }
    }
    found
        .into_iter()
        .map(|c| c.expect("a key on every master"))
        .collect()
}

/// Losing one master of three fails only the keys it holds: its breaker opens and its keys
/// fail fast (their rules apply on_store_error), while the keys on the other two masters are
/// still decided exactly by the store, even under bursts of calls to the dead one. The gauges
/// say which master is in trouble, and its breaker closes once it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_master_fails_only_the_keys_it_holds() {
    let mut cluster = RedisCluster::start_partial_coverage();
    let store =
        RedisStore::new(&store_config(Backend::RedisCluster, cluster.urls())).expect("store");
    let keys = one_key_per_master(&cluster, &store, "dead-master", 30);
    for c in &keys {
        let d = store
            .decide(std::slice::from_ref(c), 1, GENEROUS)
            .await
            .expect("decide");
        assert!(d[0].allowed);
    }
    let dead = cluster.nodes[2].addr().to_string();
    cluster.nodes[2].stop();

    // Bursts of calls to the dead master between calls to the live ones, 40 rounds: the live
    // keys (1 of 30 used) admit exactly 29 more, then reject, every answer from the store.
    // Units charged to each live key: 1 so far.
    let mut charged = [1u64; 2];
    let mut dead_failures = 0;
    for round in 0..40 {
        for _ in 0..8 {
            if store.decide(&keys[2..], 1, ms(20)).await.is_err() {
                dead_failures += 1;
            }
        }
        for (i, c) in keys[..2].iter().enumerate() {
            let d = store
                .decide(std::slice::from_ref(c), 1, GENEROUS)
                .await
                .unwrap_or_else(|e| panic!("round {round}: a live master's key failed: {e}"));
            assert_eq!(d[0].allowed, charged[i] < 30, "round {round}");
            if d[0].allowed {
                charged[i] += 1;
                assert_eq!(d[0].remaining, 30 - charged[i], "round {round}");
            }
        }
    }
    assert_eq!(charged, [30, 30], "exact limits on the live masters");
    assert_eq!(dead_failures, 320, "every call to the dead master failed");
    let states: HashMap<String, BreakerState> = store.node_breakers().into_iter().collect();
    assert_eq!(states.len(), 3, "{states:?}");
    for (node, state) in &states {
        let want = if *node == dead {
            BreakerState::Open
        } else {
            BreakerState::Closed
        };
        assert_eq!(*state, want, "{node}: {states:?}");
    }
    assert_eq!(
        store.breaker_state(),
        BreakerState::Open,
        "the worst of the masters"
    );
    assert!(!store.is_up(), "a master is failing: not up");
    let rendered = String::from_utf8(floodgate::metrics::metrics().render()).expect("utf-8");
    assert!(
        rendered.contains(&format!(
            "floodgate_store_node_circuit_breaker_state{{node=\"{dead}\"}} 1"
        )),
        "{rendered}"
    );

    // Back (with its slots, empty): its breaker closes after a cool-down, without a restart.
    cluster.nodes[2].restart();
    eventually(secs(15), "the dead master's keys decided again", || {
        let (store, c) = (store.clone(), keys[2].clone());
        async move { store.decide(&[c], 1, ms(200)).await.ok() }
    })
    .await;
    eventually(secs(5), "every breaker closed", || {
        let store = store.clone();
        async move { store.is_up().then_some(()) }
    })
    .await;
}

/// A master replaced by something that answers garbage costs a few connections a second,
/// however many requests want its keys (its breaker holds them off), while the other masters
/// keep deciding.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_answering_garbage_costs_few_connections() {
    let mut cluster = RedisCluster::start_partial_coverage();
    let store =
        RedisStore::new(&store_config(Backend::RedisCluster, cluster.urls())).expect("store");
    let keys = one_key_per_master(&cluster, &store, "junk-master", 1_000_000);
    for c in &keys {
        store
            .decide(std::slice::from_ref(c), 1, GENEROUS)
            .await
            .expect("decide");
    }
    let port = cluster.nodes[2].port();
    cluster.nodes[2].stop();
    let junk = common::redis::JunkServer::start_on(port);
    let started = Instant::now();
    let mut settled = None;
    let mut live_answers = 0;
    while started.elapsed() < secs(4) {
        if settled.is_none() && started.elapsed() >= secs(1) {
            settled = Some(junk.accepted());
        }
        for (i, c) in keys.iter().enumerate() {
            // Live masters get a generous budget (the machine may be busy); the junk one a
            // short one, so that the loop keeps asking it.
            let budget = if i < 2 { GENEROUS } else { ms(20) };
            let answer = store.decide(std::slice::from_ref(c), 1, budget).await;
            if i < 2 {
                answer.expect("a live master's key");
                live_answers += 1;
            }
        }
        tokio::time::sleep(ms(5)).await;
    }
    let late = junk.accepted() - settled.expect("1 s passed");
    eprintln!(
        "{late} connections to the junk node in 3 s ({} in all), {live_answers} live answers",
        junk.accepted()
    );
    assert!(live_answers > 100, "{live_answers}");
    // About 4 a second: one probe a cool-down (redis-rs retries it once) and redis-rs's own
    // reconnection, whatever the request rate; each request used to open connections.
    assert!(
        late <= 20,
        "{late} connections in 3 s to a node answering garbage"
    );
}
