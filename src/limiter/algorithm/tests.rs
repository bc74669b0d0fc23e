//! Exact behaviour of each algorithm under an injected clock, and the guarantees each one
//! documents, checked over random traffic.

use std::time::Duration;

use proptest::prelude::*;

use super::*;

const MS: u64 = 1_000_000;
const SEC: u64 = 1_000 * MS;

/// One key's state, charged the way a store charges it.
#[derive(Default)]
struct Key(Option<State>);

impl Key {
    fn peek(&self, limit: &Limit, now: u64, cost: u64) -> Decision {
        decide(self.0.as_ref(), limit, now, cost).0
    }

    fn hit(&mut self, limit: &Limit, now: u64, cost: u64) -> Decision {
        let (decision, update) = decide(self.0.as_ref(), limit, now, cost);
        if decision.allowed {
            match &mut self.0 {
                Some(state) => update.apply(state),
                None => self.0 = update.into_state(),
            }
        }
        decision
    }

    /// Admits `n` requests of cost 1 at `now`; returns how many were admitted.
    fn burst(&mut self, limit: &Limit, now: u64, n: u64) -> u64 {
        (0..n).filter(|_| self.hit(limit, now, 1).allowed).count() as u64
    }
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

// ---- fixed window ----

#[test]
fn fixed_window_counts_per_aligned_window() {
    let l = Limit::police(Algorithm::FixedWindow, 3, Duration::from_secs(1), 3);
    let mut key = Key::default();
    let d = key.hit(&l, 10 * SEC + 250 * MS, 1);
    assert_eq!((d.allowed, d.limit, d.remaining), (true, 3, 2));
    assert_eq!(d.reset, ms(750));
    assert_eq!(key.burst(&l, 10 * SEC + 500 * MS, 5), 2);
    let d = key.hit(&l, 10 * SEC + 600 * MS, 1);
    assert!(!d.allowed);
    assert_eq!((d.remaining, d.retry_after, d.reset), (0, ms(400), ms(400)));
    // The next window starts from zero.
    let d = key.hit(&l, 11 * SEC, 1);
    assert_eq!((d.allowed, d.remaining), (true, 2));
}

/// The documented weakness: `limit` at the end of one window and `limit` at the start of the
/// next pass within two nanoseconds, and not one more.
#[test]
fn fixed_window_admits_exactly_twice_the_limit_across_a_boundary() {
    let l = Limit::police(Algorithm::FixedWindow, 100, Duration::from_secs(60), 100);
    let mut key = Key::default();
    let boundary = 600 * SEC;
    assert_eq!(key.burst(&l, boundary - 1, 150), 100);
    assert_eq!(key.burst(&l, boundary, 150), 100);
}

#[test]
fn fixed_window_cost_above_limit_is_never_admitted() {
    let l = Limit::police(Algorithm::FixedWindow, 3, Duration::from_secs(1), 3);
    let d = Key::default().hit(&l, 0, 4);
    assert!(!d.allowed);
    assert_eq!(d.retry_after, Duration::from_secs(1));
}

#[test]
fn fixed_window_keeps_count_when_limit_changes_and_drops_it_when_window_does() {
    let mut key = Key::default();
    let l = Limit::police(Algorithm::FixedWindow, 10, Duration::from_secs(10), 10);
    assert_eq!(key.burst(&l, SEC, 8), 8);
    let lower = Limit::police(Algorithm::FixedWindow, 9, Duration::from_secs(10), 9);
    assert_eq!(key.peek(&lower, SEC, 1).remaining, 0);
    assert!(!key.peek(&lower, SEC, 2).allowed);
    let shorter = Limit::police(Algorithm::FixedWindow, 10, Duration::from_secs(3), 10);
    assert_eq!(key.peek(&shorter, SEC, 1).remaining, 9);
}

// ---- sliding window log ----

#[test]
fn sliding_log_is_exact() {
    let l = Limit::police(Algorithm::SlidingWindowLog, 3, Duration::from_secs(60), 3);
    let mut key = Key::default();
    assert!(key.hit(&l, 0, 1).allowed);
    assert!(key.hit(&l, 10 * SEC, 1).allowed);
    let d = key.hit(&l, 20 * SEC, 1);
    assert_eq!(
        (d.allowed, d.remaining, d.reset),
        (true, 0, Duration::from_secs(60))
    );
    let d = key.hit(&l, 30 * SEC, 1);
    assert!(!d.allowed);
    // The first entry stops counting 60 s after it was admitted.
    assert_eq!(d.retry_after, Duration::from_secs(30));
    assert!(!key.hit(&l, 60 * SEC - 1, 1).allowed);
    assert!(key.hit(&l, 60 * SEC, 1).allowed);
    // A cost of 2 waits for the two oldest (admitted at 10 s and 20 s) to leave.
    let d = key.hit(&l, 61 * SEC, 2);
    assert_eq!(d.retry_after, Duration::from_secs(19));
}

#[test]
fn sliding_log_drops_expired_entries_and_stays_bounded() {
    let l = Limit::police(Algorithm::SlidingWindowLog, 5, Duration::from_secs(1), 5);
    let mut key = Key::default();
    for i in 0..1_000 {
        key.hit(&l, i * 100 * MS, 1);
    }
    match &key.0 {
        Some(State::SlidingWindowLog(log)) => {
            assert!(log.entries.len() <= 5, "{}", log.entries.len())
        }
        other => panic!("{other:?}"),
    }
}

// ---- sliding window counter ----

#[test]
fn sliding_counter_weights_the_previous_window() {
    let l = Limit::police(
        Algorithm::SlidingWindowCounter,
        10,
        Duration::from_secs(10),
        10,
    );
    let mut key = Key::default();
    assert_eq!(key.burst(&l, 5 * SEC, 10), 10);
    // 2.5 s into the next window, 75% of the previous 10 still count: 2 fit (7.5 + 2 <= 10).
    let now = 12 * SEC + 500 * MS;
    let d = key.peek(&l, now, 1);
    assert_eq!(d.remaining, 1);
    assert_eq!(key.burst(&l, now, 5), 2);
    let d = key.hit(&l, now, 1);
    assert!(!d.allowed);
    // 7.5 + 2 + 1 = 10.5: half a request must decay, at 10 per 10 s: 0.5 s.
    assert_eq!(d.retry_after, ms(500));
    assert!(!key.peek(&l, now + 500 * MS - 1, 1).allowed);
    assert!(key.peek(&l, now + 500 * MS, 1).allowed);
    // Nothing counts 2 windows after the last request's window.
    assert_eq!(key.peek(&l, 30 * SEC, 1).remaining, 9);
}

#[test]
fn sliding_counter_retry_can_fall_in_the_next_window() {
    let l = Limit::police(
        Algorithm::SlidingWindowCounter,
        4,
        Duration::from_secs(10),
        4,
    );
    let mut key = Key::default();
    assert_eq!(key.burst(&l, SEC, 4), 4);
    let d = key.hit(&l, 2 * SEC, 1);
    // This window is full until it ends; in the next one 4 * (1 - x/10) + 1 <= 4 at x = 2.5 s.
    assert_eq!(d.retry_after, ms(8_000 + 2_500));
}

// ---- token bucket ----

#[test]
fn token_bucket_refills_continuously() {
    // 10 per second, 20 in the bucket.
    let l = Limit::police(Algorithm::TokenBucket, 10, Duration::from_secs(1), 20);
    let mut key = Key::default();
    let d = key.hit(&l, SEC, 1);
    assert_eq!((d.limit, d.remaining, d.reset), (20, 19, ms(100)));
    assert_eq!(key.burst(&l, SEC, 30), 19);
    let d = key.hit(&l, SEC, 1);
    assert!(!d.allowed);
    assert_eq!((d.retry_after, d.reset), (ms(100), ms(2_000)));
    // 250 ms later: 2.5 tokens back.
    let d = key.hit(&l, SEC + 250 * MS, 2);
    assert_eq!((d.allowed, d.remaining), (true, 0));
    let d = key.hit(&l, SEC + 250 * MS, 1);
    assert_eq!(d.retry_after, ms(50));
}

#[test]
fn token_bucket_cost_above_burst_is_never_admitted() {
    let l = Limit::police(Algorithm::TokenBucket, 10, Duration::from_secs(1), 5);
    let d = Key::default().hit(&l, 0, 6);
    assert!(!d.allowed);
    assert_eq!(d.retry_after, Duration::from_secs(1));
}

#[test]
fn token_bucket_rounds_the_rate_down_never_up() {
    // 3 per second is 333_333_333.3 ns per token, rounded up to 333_333_334 ns.
    let l = Limit::police(Algorithm::TokenBucket, 3, Duration::from_secs(1), 1_000);
    let mut key = Key::default();
    assert_eq!(key.burst(&l, 0, 2_000), 1_000);
    // 100 s bring back 299.9999998 tokens: 299 whole ones, never 300.
    assert_eq!(key.burst(&l, 100 * SEC, 1_000), 299);
    // The 300th is whole 300 intervals after the start.
    assert_eq!(key.burst(&l, 100 * SEC + 199, 1_000), 0);
    assert_eq!(key.burst(&l, 100 * SEC + 200, 1_000), 1);
}

// ---- leaky bucket ----

#[test]
fn leaky_police_is_a_bucket_of_burst_requests() {
    let l = Limit::police(Algorithm::LeakyBucket, 10, Duration::from_secs(1), 5);
    let mut key = Key::default();
    assert_eq!(key.burst(&l, SEC, 10), 5);
    let d = key.hit(&l, SEC, 1);
    assert_eq!(
        (d.allowed, d.retry_after, d.delay),
        (false, ms(100), Duration::ZERO)
    );
    assert_eq!(key.burst(&l, SEC + 100 * MS, 10), 1);
}

#[test]
fn leaky_shape_delays_instead_of_rejecting() {
    // The config example: 10 per second, 20 may wait, for up to 2 s.
    let l = Limit::shape(10, Duration::from_secs(1), 20, Duration::from_secs(2));
    let mut key = Key::default();
    let now = 5 * SEC;
    for i in 0..=20 {
        let d = key.hit(&l, now, 1);
        assert!(d.allowed, "request {i}");
        assert_eq!(d.delay, ms(100 * i), "request {i}");
    }
    let d = key.hit(&l, now, 1);
    assert!(!d.allowed);
    assert_eq!(d.remaining, 0);
    // The 21st waiting needs a 2.1 s wait: 100 ms too long.
    assert_eq!(d.retry_after, ms(100));
    let d = key.hit(&l, now + 100 * MS, 1);
    assert_eq!((d.allowed, d.delay), (true, Duration::from_secs(2)));
}

#[test]
fn leaky_shape_max_delay_bounds_the_wait() {
    let l = Limit::shape(10, Duration::from_secs(1), 20, ms(250));
    let mut key = Key::default();
    let delays: Vec<_> = (0..5)
        .map(|_| key.hit(&l, SEC, 1))
        .map(|d| d.allowed.then_some(d.delay))
        .collect();
    assert_eq!(
        delays,
        [Some(ms(0)), Some(ms(100)), Some(ms(200)), None, None]
    );
}

#[test]
fn leaky_mode_change_keeps_the_backlog() {
    let police = Limit::police(Algorithm::LeakyBucket, 10, Duration::from_secs(1), 5);
    let shaped = Limit::shape(10, Duration::from_secs(1), 5, Duration::from_secs(1));
    let mut key = Key::default();
    assert_eq!(key.burst(&police, 0, 3), 3);
    assert_eq!(key.hit(&shaped, 0, 1).delay, ms(300));
}

// ---- concurrency ----

#[test]
fn concurrency_counts_in_flight_and_release_restores() {
    let l = Limit::police(Algorithm::Concurrency, 2, Duration::ZERO, 2);
    let mut key = Key::default();
    assert_eq!(key.hit(&l, 0, 1).remaining, 1);
    assert_eq!(key.hit(&l, 0, 1).remaining, 0);
    let d = key.hit(&l, 0, 1);
    assert!(!d.allowed);
    assert_eq!(d.retry_after, Duration::from_secs(1));
    let mut state = key.0.take().expect("charged");
    assert!(!release(&mut state, 1));
    key.0 = Some(state);
    assert_eq!(key.hit(&l, 0, 1).remaining, 0);
    let mut state = key.0.take().expect("charged");
    assert!(!release(&mut state, 1));
    assert!(release(&mut state, 5), "never below zero, then empty");
    assert_eq!(expires_at(&state), 0);
}

// ---- every algorithm ----

#[test]
fn a_state_of_another_algorithm_counts_as_none() {
    let fixed = Limit::police(Algorithm::FixedWindow, 1, Duration::from_secs(1), 1);
    let log = Limit::police(Algorithm::SlidingWindowLog, 1, Duration::from_secs(1), 1);
    let mut key = Key::default();
    assert!(key.hit(&fixed, 0, 1).allowed);
    assert!(!key.hit(&fixed, 0, 1).allowed);
    assert!(key.hit(&log, 0, 1).allowed);
    assert!(matches!(key.0, Some(State::SlidingWindowLog(_))));
}

#[test]
fn absurd_numbers_do_not_panic() {
    let algorithms = Algorithm::ALL;
    // A `Limit` never holds a zero limit or burst (`Limit::new`); every other extreme, and a
    // window below what validation allows, is built directly here.
    let numbers = [
        (1, Duration::ZERO, 1),
        (u64::MAX, Duration::MAX, u64::MAX),
        (1, Duration::MAX, u64::MAX),
        (u64::MAX, Duration::from_nanos(1), 1),
        (3, Duration::from_secs(1), 2),
    ];
    for algorithm in algorithms {
        // One key through every combination: reloads between extremes included.
        let mut key = Key::default();
        for (l, window, burst) in numbers {
            for mode in [LeakyMode::Police, LeakyMode::Shape] {
                let l = Limit {
                    algorithm,
                    limit: l,
                    window,
                    burst,
                    mode,
                    max_delay: Duration::MAX,
                    calendar: None,
                    block_for: Duration::ZERO,
                    slow_rate: 0,
                };
                // Time going backwards too: a caller's clock bug must not panic either.
                for now in [0, 1, u64::MAX - 1, u64::MAX, 5] {
                    for cost in [0, 1, 2, u64::MAX] {
                        let d = key.hit(&l, now, cost);
                        assert!(d.allowed || d.retry_after > Duration::ZERO);
                        if let Some(state) = &mut key.0 {
                            expires_at(state);
                            release(state, cost);
                        }
                    }
                }
            }
        }
    }
}

// ---- properties over random traffic ----

fn any_algorithm() -> impl Strategy<Value = Limit> {
    let algorithm = prop_oneof![
        Just(Algorithm::FixedWindow),
        Just(Algorithm::SlidingWindowLog),
        Just(Algorithm::SlidingWindowCounter),
        Just(Algorithm::TokenBucket),
        Just(Algorithm::LeakyBucket),
        Just(Algorithm::Concurrency),
    ];
    let mode = prop_oneof![Just(LeakyMode::Police), Just(LeakyMode::Shape)];
    (
        algorithm,
        1..12u64,
        1..5_000u64,
        1..12u64,
        mode,
        0..3_000u64,
    )
        .prop_map(
            |(algorithm, l, window_ms, burst, mode, max_delay_ms)| Limit {
                algorithm,
                limit: l,
                window: ms(window_ms),
                burst,
                mode,
                max_delay: ms(max_delay_ms),
                calendar: None,
                block_for: Duration::ZERO,
                slow_rate: 0,
            },
        )
}

/// Arrivals: gaps in nanoseconds (often 0: bursts) and costs (mostly 1).
fn traffic() -> impl Strategy<Value = Vec<(u64, u64)>> {
    let gap = prop_oneof![Just(0u64), 0..10 * MS, 0..3 * SEC, Just(1)];
    let cost = prop_oneof![4 => Just(1u64), 1 => 0..4u64];
    prop::collection::vec((gap, cost), 1..150)
}

/// Replays `traffic` against `l`; returns (arrival, cost, decision) for every request.
fn replay(l: &Limit, traffic: &[(u64, u64)]) -> (Key, Vec<(u64, u64, Decision)>) {
    let mut key = Key::default();
    let mut now = 3 * SEC;
    let mut out = Vec::new();
    for &(gap, cost) in traffic {
        now += gap;
        out.push((now, cost, key.hit(l, now, cost)));
    }
    (key, out)
}

fn never_admissible(l: &Limit, cost: u64) -> bool {
    match l.algorithm {
        Algorithm::TokenBucket => cost > l.burst,
        Algorithm::LeakyBucket => l.mode == LeakyMode::Police && cost > l.burst,
        _ => cost > l.limit,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Every decision is well formed, and the numbers it gives are exact: `retry_after` is the
    /// first instant the same request is admitted, `remaining` is how many cost-1 requests
    /// still pass right now, and once the state expires it is the same as none.
    #[test]
    fn decisions_are_exact(l in any_algorithm(), traffic in traffic()) {
        let mut key = Key::default();
        let mut now = 3 * SEC;
        let mut within = true;
        for (gap, cost) in traffic {
            now += gap;
            let d = key.peek(&l, now, cost);
            prop_assert_eq!(d.limit, match l.algorithm {
                Algorithm::TokenBucket | Algorithm::LeakyBucket => l.burst,
                _ => l.limit,
            });
            prop_assert_eq!(d.limit, quota(&l));
            // What the engine holds a shared store's answers to never cuts a true one (on a
            // state that only costs validation lets a rule have wrote).
            within &= cost <= quota(&l);
            if within {
                prop_assert!(d.reset <= horizon(&l), "reset {:?} past {:?}", d.reset, horizon(&l));
                prop_assert!(d.retry_after <= horizon(&l), "retry {:?} past {:?}", d.retry_after, horizon(&l));
            }
            prop_assert!(d.delay <= l.max_delay, "delay {:?} past max_delay", d.delay);
            if !d.allowed {
                prop_assert_eq!(d.remaining, 0);
                prop_assert!(d.retry_after > Duration::ZERO);
                prop_assert_eq!(d.delay, Duration::ZERO);
                if l.algorithm != Algorithm::Concurrency && !never_admissible(&l, cost) {
                    let at = now + d.retry_after.as_nanos() as u64;
                    prop_assert!(key.peek(&l, at, cost).allowed, "not admitted at retry_after");
                    prop_assert!(!key.peek(&l, at - 1, cost).allowed, "admitted before retry_after");
                }
            } else {
                prop_assert!(d.remaining <= d.limit);
                prop_assert_eq!(d.retry_after, Duration::ZERO);
            }
            if key.hit(&l, now, cost).allowed {
                // A cost-0 request on an idle shaping bucket sees room for `burst` waiting
                // plus one departing now, of which `remaining` shows at most `burst`.
                if !(l.algorithm == Algorithm::LeakyBucket && l.mode == LeakyMode::Shape && cost == 0) {
                    let mut probe = Key(key.0.clone());
                    let admitted = probe.burst(&l, now, d.remaining + 1);
                    prop_assert_eq!(admitted, d.remaining, "remaining is not what passes");
                }
                if l.algorithm != Algorithm::Concurrency {
                    let at = now + d.reset.as_nanos() as u64;
                    prop_assert_eq!(key.peek(&l, at, 1), Key::default().peek(&l, at, 1), "not reset");
                }
                if let Some(state) = &key.0 {
                    let horizon = expires_at(state);
                    if horizon != u64::MAX {
                        let at = horizon.max(now);
                        prop_assert_eq!(key.peek(&l, at, 1), Key::default().peek(&l, at, 1));
                    }
                }
            }
        }
    }

    /// The sliding log never admits more than `limit` in any interval of length `window`.
    #[test]
    fn sliding_log_never_exceeds_limit_in_any_window(
        l in any_algorithm().prop_map(|l| Limit { algorithm: Algorithm::SlidingWindowLog, ..l }),
        traffic in traffic(),
    ) {
        let window = l.window.as_nanos() as u64;
        let (_, decisions) = replay(&l, &traffic);
        let admitted: Vec<_> =
            decisions.iter().filter(|(_, _, d)| d.allowed).map(|&(t, c, _)| (t, c)).collect();
        for &(end, _) in &admitted {
            let in_window: u64 = admitted
                .iter()
                .filter(|&&(t, _)| t <= end && t + window > end)
                .map(|&(_, c)| c)
                .sum();
            prop_assert!(in_window <= l.limit, "{} in the window ending at {}", in_window, end);
        }
    }

    /// The token bucket admits at most `burst + rate * t` over any span `t`, and the police
    /// leaky bucket, the same arithmetic, too.
    #[test]
    fn token_bucket_never_exceeds_burst_plus_rate(
        l in any_algorithm().prop_map(|l| Limit { algorithm: Algorithm::TokenBucket, ..l }),
        police in any::<bool>(),
        traffic in traffic(),
    ) {
        let l = if police {
            Limit { algorithm: Algorithm::LeakyBucket, mode: LeakyMode::Police, ..l }
        } else {
            l
        };
        let window = u128::from(l.window.as_nanos() as u64);
        let (_, decisions) = replay(&l, &traffic);
        let admitted: Vec<_> =
            decisions.iter().filter(|(_, _, d)| d.allowed).map(|&(t, c, _)| (t, c)).collect();
        for (i, &(start, _)) in admitted.iter().enumerate() {
            let mut sum = 0u128;
            for &(end, cost) in &admitted[i..] {
                sum += u128::from(cost);
                // sum <= burst + limit * (end - start) / window, in integers.
                let bound = u128::from(l.burst) * window + u128::from(l.limit) * u128::from(end - start);
                prop_assert!(sum * window <= bound, "{} admitted in {} ns", sum, end - start);
            }
        }
    }

    /// The sliding counter never admits more than `limit` within one aligned window.
    #[test]
    fn sliding_counter_never_exceeds_limit_in_an_aligned_window(
        l in any_algorithm().prop_map(|l| Limit { algorithm: Algorithm::SlidingWindowCounter, ..l }),
        traffic in traffic(),
    ) {
        let window = l.window.as_nanos() as u64;
        let (_, decisions) = replay(&l, &traffic);
        let mut per_window = std::collections::HashMap::<u64, u64>::new();
        for (t, c, d) in decisions {
            if d.allowed {
                *per_window.entry(t / window).or_default() += c;
            }
        }
        prop_assert!(per_window.values().all(|&n| n <= l.limit));
    }

    /// Shaping holds requests instead of rejecting them: departures are spaced by
    /// `cost * interval`, no wait exceeds `max_delay` or `burst` intervals, and a request is
    /// rejected only if its wait would exceed one of them.
    #[test]
    fn leaky_shape_spaces_departures(
        l in any_algorithm().prop_map(|l| Limit {
            algorithm: Algorithm::LeakyBucket,
            mode: LeakyMode::Shape,
            ..l
        }),
        traffic in traffic(),
    ) {
        let interval = (l.window.as_nanos() as u64).div_ceil(l.limit);
        let longest = (l.max_delay.as_nanos() as u64).min(l.burst * interval);
        let (_, decisions) = replay(&l, &traffic);
        let mut next_free = 0u64;
        for (t, c, d) in decisions {
            let slot = t.max(next_free);
            if d.allowed {
                let departure = t + d.delay.as_nanos() as u64;
                prop_assert_eq!(departure, slot);
                prop_assert!(d.delay.as_nanos() as u64 <= longest);
                next_free = departure + c * interval;
            } else {
                prop_assert!(slot - t > longest);
            }
        }
    }

    /// Concurrency never has more than `limit` in flight, and releasing restores the slots.
    #[test]
    fn concurrency_never_exceeds_limit(
        l in 1..10u64,
        ops in prop::collection::vec((any::<bool>(), 0..3u64), 1..200),
    ) {
        let l = Limit::police(Algorithm::Concurrency, l, Duration::ZERO, l);
        let mut key = Key::default();
        let mut held: Vec<u64> = Vec::new();
        for (acquire, cost) in ops {
            if acquire || held.is_empty() {
                let d = key.hit(&l, 0, cost);
                let in_flight: u64 = held.iter().sum();
                prop_assert_eq!(d.allowed, in_flight + cost <= l.limit);
                if d.allowed {
                    held.push(cost);
                    prop_assert_eq!(d.remaining, l.limit - in_flight - cost);
                }
            } else if let (Some(cost), Some(state)) = (held.pop(), key.0.as_mut()) {
                if release(state, cost) {
                    key.0 = None;
                }
            }
        }
        for cost in held.drain(..) {
            if let Some(state) = key.0.as_mut() {
                if release(state, cost) {
                    key.0 = None;
                }
            }
        }
        prop_assert_eq!(key.peek(&l, 0, 1).remaining, l.limit - 1);
    }
}

/// Every algorithm's capabilities, spelled out: a new algorithm fails to compile here (the
/// match has no `_` arm) until its row is written, and a changed capability must be changed
/// here on purpose. Columns: takes a window, takes burst, limit cap, can shape, leases when
/// policing, leases when shaping, Lua function (police, shape), holds slots, capacity of
/// limit 10 burst 3.
#[test]
fn every_algorithm_states_its_capabilities() {
    type Row = (
        bool,
        bool,
        Option<u64>,
        bool,
        bool,
        bool,
        (&'static str, &'static str),
        bool,
        u64,
    );
    for a in Algorithm::ALL {
        let expected: Row = match a {
            Algorithm::FixedWindow => (
                true,
                false,
                None,
                false,
                true,
                true,
                ("fixed_window", "fixed_window"),
                false,
                10,
            ),
            Algorithm::SlidingWindowLog => (
                true,
                false,
                Some(MAX_SLIDING_LOG_LIMIT),
                false,
                false,
                false,
                ("sliding_window_log", "sliding_window_log"),
                false,
                10,
            ),
            Algorithm::SlidingWindowCounter => (
                true,
                false,
                None,
                false,
                true,
                true,
                ("sliding_window_counter", "sliding_window_counter"),
                false,
                10,
            ),
            Algorithm::TokenBucket => (
                true,
                true,
                None,
                false,
                true,
                true,
                ("token_bucket", "token_bucket"),
                false,
                3,
            ),
            Algorithm::LeakyBucket => (
                true,
                true,
                None,
                true,
                true,
                false,
                ("leaky_bucket_police", "leaky_bucket_shape"),
                false,
                3,
            ),
            Algorithm::Concurrency => (
                false,
                false,
                None,
                false,
                false,
                false,
                ("concurrency", "concurrency"),
                true,
                10,
            ),
        };
        let c = a.capabilities();
        let actual: Row = (
            c.window == super::super::Window::Required,
            c.burst,
            c.limit_cap.map(|cap| cap.max),
            c.shaping.is_some(),
            c.lease_refused(LeakyMode::Police).is_none(),
            c.lease_refused(LeakyMode::Shape).is_none(),
            (
                c.lua_fn(LeakyMode::Police).name,
                c.lua_fn(LeakyMode::Shape).name,
            ),
            c.holds_slots,
            c.capacity(10, 3),
        );
        assert_eq!(actual, expected, "{}", a.as_str());
    }
}

/// A capped algorithm's cap applies to its capacity, which is what its decisions show.
#[test]
fn capacity_is_within_the_limit_cap_and_is_the_quota() {
    let log = Algorithm::SlidingWindowLog.capabilities();
    assert_eq!(log.capacity(u64::MAX, 1), MAX_SLIDING_LOG_LIMIT);
    for a in Algorithm::ALL {
        let l = Limit::police(a, 10, Duration::from_secs(1), 3);
        assert_eq!(
            quota(&l),
            a.capabilities().capacity(10, 3),
            "{}",
            a.as_str()
        );
    }
}

/// The algorithm names that validation's messages list come from the capabilities.
#[test]
fn names_where_lists_the_algorithms_with_a_capability() {
    assert_eq!(
        Algorithm::names_where(|c| c.burst),
        "token_bucket and leaky_bucket"
    );
    assert_eq!(crate::limiter::shaping_names(), "leaky_bucket");
    assert_eq!(
        Algorithm::names_where(|c| c.lease_refused.is_some()),
        "sliding_window_log and concurrency"
    );
    assert_eq!(
        Algorithm::names_where(|c| c.window == super::super::Window::Required),
        "fixed_window, sliding_window_log, sliding_window_counter, token_bucket and leaky_bucket"
    );
    assert_eq!(Algorithm::names_where(|_| false), "");
}
