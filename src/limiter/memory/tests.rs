//! The store's promises: all-or-nothing per request, keys bounded and expired, counters kept
//! across reloads, slots released.

use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::limiter::store::UsageChange;
use crate::limiter::{Algorithm, Limit};

const SEC: u64 = 1_000_000_000;

fn store(max_keys: usize) -> (MemoryStore, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(1_000 * SEC));
    (MemoryStore::with_clock(max_keys, clock.clone()), clock)
}

fn check(rule: &str, key: u64, algorithm: Algorithm, limit: u64) -> Check {
    crate::limiter::fixtures::check(rule, key, algorithm, limit, Duration::from_secs(60), limit)
}

fn allowed(store: &MemoryStore, checks: &[Check]) -> Vec<bool> {
    store.decide(checks).iter().map(|d| d.allowed).collect()
}

#[test]
fn a_rejected_request_charges_no_rule() {
    let (store, _) = store(1_000);
    let roomy = check("per-ip", 1, Algorithm::TokenBucket, 10);
    let tight = check("login", 1, Algorithm::FixedWindow, 2);
    let both = [roomy.clone(), tight.clone()];
    assert_eq!(allowed(&store, &both), [true, true]);
    assert_eq!(allowed(&store, &both), [true, true]);
    for _ in 0..5 {
        let decisions = store.decide(&both);
        assert!(decisions[0].allowed && !decisions[1].allowed);
        assert_eq!(decisions[1].remaining, 0);
    }
    // Only the two admitted requests were charged to the roomy rule.
    assert_eq!(store.decide(&[roomy])[0].remaining, 7);
}

#[test]
fn every_algorithm_is_all_or_nothing() {
    let algorithms = Algorithm::ALL;
    for algorithm in algorithms {
        let (store, _) = store(1_000);
        let exhausted = check("exhausted", 7, Algorithm::FixedWindow, 1);
        assert_eq!(allowed(&store, std::slice::from_ref(&exhausted)), [true]);
        let other = check("other", 7, algorithm, 3);
        for _ in 0..10 {
            assert_eq!(
                allowed(&store, &[other.clone(), exhausted.clone()]),
                [true, false]
            );
        }
        let d = &store.decide(&[other])[0];
        assert_eq!((d.allowed, d.remaining), (true, 2), "{algorithm:?}");
    }
}

#[test]
fn a_key_checked_twice_sees_its_own_charge() {
    let (store, _) = store(1_000);
    let c = check("r", 1, Algorithm::FixedWindow, 3);
    let decisions = store.decide(&[c.clone(), c.clone()]);
    assert_eq!(decisions[0].remaining, 2);
    assert_eq!(decisions[1].remaining, 1);
    assert_eq!(allowed(&store, &[c.clone(), c.clone()]), [true, false]);
    // That request was rejected: its first half was not charged either.
    assert_eq!(store.decide(&[c])[0].remaining, 0);
}

#[test]
fn state_is_per_rule_and_key() {
    let (store, _) = store(1_000);
    assert_eq!(
        allowed(&store, &[check("a", 1, Algorithm::FixedWindow, 1)]),
        [true]
    );
    assert_eq!(
        allowed(&store, &[check("a", 1, Algorithm::FixedWindow, 1)]),
        [false]
    );
    assert_eq!(
        allowed(&store, &[check("a", 2, Algorithm::FixedWindow, 1)]),
        [true]
    );
    assert_eq!(
        allowed(&store, &[check("b", 1, Algorithm::FixedWindow, 1)]),
        [true]
    );
}

#[test]
fn a_reload_keeps_counters_unless_the_algorithm_changed() {
    let (store, _) = store(1_000);
    let before = check("orders", 1, Algorithm::TokenBucket, 10);
    for _ in 0..6 {
        store.decide(std::slice::from_ref(&before));
    }
    let raised = check("orders", 1, Algorithm::TokenBucket, 20);
    assert_eq!(store.decide(&[raised])[0].remaining, 13);
    let changed = check("orders", 1, Algorithm::FixedWindow, 10);
    assert_eq!(store.decide(&[changed])[0].remaining, 9);
}

#[test]
fn release_gives_slots_back_and_drops_the_key() {
    let (store, _) = store(1_000);
    let slot = check("exports", 9, Algorithm::Concurrency, 2);
    assert_eq!(allowed(&store, &[slot.clone(), slot.clone()]), [true, true]);
    assert_eq!(allowed(&store, std::slice::from_ref(&slot)), [false]);
    store.release(&slot);
    assert_eq!(allowed(&store, std::slice::from_ref(&slot)), [true]);
    store.release(&slot);
    store.release(&slot);
    assert!(store.is_empty(), "nothing in flight: no state kept");
    store.release(&slot);
    assert_eq!(store.decide(&[slot])[0].remaining, 1);
}

#[test]
fn idle_keys_expire() {
    let (store, clock) = store(1_000);
    for key in 0..100 {
        store.decide(&[check("r", key, Algorithm::TokenBucket, 10)]);
        store.decide(&[check("log", key, Algorithm::SlidingWindowLog, 10)]);
    }
    assert_eq!(store.len(), 200);
    store.sweep();
    assert_eq!(store.len(), 200, "still counting");
    // A token bucket of 10 a minute refills one token in 6 s; the log forgets after 60 s.
    clock.advance(Duration::from_secs(6));
    store.sweep();
    assert_eq!(store.len(), 100);
    clock.advance(Duration::from_secs(54));
    store.sweep();
    assert!(store.is_empty());
    assert_eq!(store.evictions(), 0);
}

#[test]
fn decisions_sweep_as_they_go() {
    let (store, clock) = store(100_000);
    for key in 0..10_000 {
        store.decide(&[check("r", key, Algorithm::FixedWindow, 10)]);
    }
    assert_eq!(store.len(), 10_000);
    clock.advance(Duration::from_secs(120));
    // Each shard is swept after as many operations as it holds keys.
    for _ in 0..2 {
        for key in 0..10_000 {
            store.decide(&[check("other", key, Algorithm::Concurrency, 10)]);
            store.release(&check("other", key, Algorithm::Concurrency, 10));
        }
    }
    assert_eq!(store.len(), 0);
}

#[test]
fn max_keys_bounds_the_store_and_counts_evictions() {
    let (store, clock) = store(100);
    for key in 0..100 {
        assert_eq!(
            allowed(&store, &[check("r", key, Algorithm::TokenBucket, 10)]),
            [true]
        );
    }
    assert_eq!((store.len(), store.evictions()), (100, 0));
    for key in 100..150 {
        assert_eq!(
            allowed(&store, &[check("r", key, Algorithm::TokenBucket, 10)]),
            [true]
        );
    }
    assert_eq!((store.len(), store.evictions()), (100, 50));
    // Expired keys make room without counting as evictions.
    clock.advance(Duration::from_secs(60));
    store.decide(&[check("r", 200, Algorithm::TokenBucket, 10)]);
    assert_eq!((store.len(), store.evictions()), (100, 50));
    for key in 201..300 {
        store.decide(&[check("r", key, Algorithm::TokenBucket, 10)]);
    }
    assert!(store.len() <= 100);
}

#[test]
fn eviction_prefers_keys_closest_to_expiry_and_spares_slots_in_flight() {
    let (store, _) = store(8);
    let busy = check("exports", 0, Algorithm::Concurrency, 5);
    assert_eq!(allowed(&store, std::slice::from_ref(&busy)), [true]);
    for key in 1..200 {
        store.decide(&[check("r", key, Algorithm::TokenBucket, 10)]);
    }
    assert_eq!(store.len(), 8);
    assert_eq!(
        store.decide(&[busy])[0].remaining,
        3,
        "the slot in flight was kept"
    );
}

#[test]
fn a_request_never_evicts_its_own_keys() {
    let (store, _) = store(1);
    let checks = [
        check("a", 1, Algorithm::FixedWindow, 5),
        check("b", 1, Algorithm::FixedWindow, 5),
    ];
    assert_eq!(allowed(&store, &checks), [true, true]);
    let decisions = store.decide(&checks);
    assert_eq!((decisions[0].remaining, decisions[1].remaining), (3, 3));
    // Over by one while a request needed it; the next new key brings it back.
    assert_eq!(store.len(), 2);
    store.decide(&[check("c", 1, Algorithm::FixedWindow, 5)]);
    assert_eq!(store.len(), 1);
}

#[test]
fn shard_capacities_sum_to_max_keys() {
    for max_keys in [1, 7, 1_000, 1_023, 4_096, 100_000, 1_000_003] {
        let store = MemoryStore::new(max_keys);
        let total: usize = store.shards.iter().map(|s| s.0.lock().capacity).sum();
        assert_eq!(total, max_keys);
        assert!(store.shards.len().is_power_of_two() && store.shards.len() <= MAX_SHARDS);
    }
    assert_eq!(MemoryStore::new(0).max_keys(), 1);
}

#[test]
fn threads_share_one_limit() {
    let (store, _) = store(1_000);
    let store = Arc::new(store);
    let admitted: usize = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let store = store.clone();
                scope.spawn(move || {
                    let checks = [
                        check("a", 1, Algorithm::SlidingWindowLog, 500),
                        check("b", 2, Algorithm::TokenBucket, 1_000),
                    ];
                    (0..200)
                        .filter(|_| store.decide(&checks).iter().all(|d| d.allowed))
                        .count()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or(0)).sum()
    });
    assert_eq!(admitted, 500);
    let b = &store.decide(&[check("b", 2, Algorithm::TokenBucket, 1_000)])[0];
    assert_eq!(b.remaining, 499);
}

#[test]
fn the_production_clock_is_unix_time_and_monotonic() {
    let clock = MonotonicClock::new();
    let a = clock.now_ns();
    let b = clock.now_ns();
    assert!(b >= a);
    let unix = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    assert!(a.abs_diff(unix) < 5 * SEC);
}

#[test]
fn sweeping_gives_memory_back_after_a_burst_of_keys() {
    let (store, clock) = store(1_000_000);
    let table_slots = |store: &MemoryStore| -> usize {
        let shards = store.shards.iter();
        shards
            .map(|shard| {
                let shard = shard.0.lock();
                let tables = shard.rules.iter().flat_map(|rule| rule.segments.iter());
                tables.map(|t| t.capacity()).sum::<usize>()
            })
            .sum()
    };
    for key in 0..200_000 {
        store.decide(&[check("burst", key, Algorithm::TokenBucket, 10)]);
    }
    assert!(table_slots(&store) >= 200_000);
    clock.advance(Duration::from_secs(60));
    store.sweep();
    assert!(store.is_empty());
    assert!(table_slots(&store) < 20_000, "{}", table_slots(&store));
}

/// Keys rule `rule` holds in the store.
fn keys_of(store: &MemoryStore, rule: &str) -> usize {
    let id = store.slot(&check(rule, 0, Algorithm::FixedWindow, 1)).rule;
    store
        .shards
        .iter()
        .map(|shard| {
            let shard = shard.0.lock();
            shard.index.get(&id).map_or(0, |&i| shard.rules[i].len)
        })
        .sum()
}

fn login(key: u64) -> Check {
    check("login", key, Algorithm::SlidingWindowLog, 2)
}

#[test]
fn a_limited_key_outlives_a_flood_of_new_keys_on_its_own_rule() {
    let (store, clock) = store(100);
    // Keys 0..5 exhausted (the next attempt is rejected), keys 5..20 used once.
    for key in 0..5 {
        assert_eq!(allowed(&store, &[login(key), login(key)]), [true, true]);
        assert_eq!(allowed(&store, &[login(key)]), [false]);
    }
    for key in 5..20 {
        assert_eq!(allowed(&store, &[login(key)]), [true]);
    }
    // Later keys expire later: a policy looking only at expiry would drop the limited ones
    // first.
    clock.advance(Duration::from_secs(10));
    for key in 1_000..6_000 {
        assert_eq!(allowed(&store, &[login(key)]), [true]);
        clock.advance(Duration::from_micros(1));
    }
    assert_eq!(store.len(), 100);
    for key in 0..5 {
        assert_eq!(
            allowed(&store, &[login(key)]),
            [false],
            "limited key {key} was not reset"
        );
    }
    // The keys that were not limiting went first: they are fresh again.
    for key in 5..20 {
        assert_eq!(store.peek(&[login(key)])[0].remaining, 1, "key {key}");
    }
    assert_eq!(store.evictions_of("login"), store.evictions());
}

#[test]
fn limited_keys_go_only_when_none_is_left_that_is_not() {
    let (store, _) = store(10);
    for key in 0..10 {
        assert_eq!(allowed(&store, &[login(key), login(key)]), [true, true]);
    }
    // Every key is limiting: the memory bound still holds, by the one closest to expiry.
    assert_eq!(allowed(&store, &[login(10)]), [true]);
    assert_eq!((store.len(), store.evictions()), (10, 1));
}

#[test]
fn one_rules_flood_never_evicts_a_rule_within_its_share() {
    let (store, clock) = store(100);
    let quiet = |key| check("quiet", key, Algorithm::TokenBucket, 10);
    for key in 0..40 {
        assert_eq!(allowed(&store, &[quiet(key)]), [true]);
    }
    // The flood's keys expire later than the quiet rule's (a bucket of 10 refills a token in
    // 6 s; the flood's refills in 60 s), and none of them is limiting.
    clock.advance(Duration::from_secs(1));
    for key in 0..5_000 {
        let flood = check("flood", key, Algorithm::TokenBucket, 10);
        let flood = Check {
            limit: Limit::police(Algorithm::TokenBucket, 10, Duration::from_secs(600), 10),
            ..flood
        };
        assert_eq!(allowed(&store, &[flood]), [true]);
    }
    assert_eq!(
        keys_of(&store, "quiet"),
        40,
        "40 is within a share of 100 / 2"
    );
    assert_eq!(keys_of(&store, "flood"), 60);
    for key in 0..40 {
        assert_eq!(store.peek(&[quiet(key)])[0].remaining, 8, "quiet key {key}");
    }
    assert_eq!(store.evictions_of("quiet"), 0);
}

#[test]
fn a_rule_over_its_share_gives_keys_back_down_to_it() {
    let (store, _) = store(100);
    for key in 0..100 {
        store.decide(&[check("big", key, Algorithm::FixedWindow, 10)]);
    }
    for key in 0..1_000 {
        store.decide(&[check("newcomer", key, Algorithm::FixedWindow, 10)]);
    }
    assert_eq!(keys_of(&store, "big"), 50);
    assert_eq!(keys_of(&store, "newcomer"), 50);
}

#[test]
fn evictions_are_counted_per_rule() {
    let (store, _) = store(100);
    let (a, b) = ("evictions-counted-a", "evictions-counted-b");
    for key in 0..80 {
        store.decide(&[check(a, key, Algorithm::FixedWindow, 10)]);
    }
    for key in 0..500 {
        store.decide(&[check(b, key, Algorithm::FixedWindow, 10)]);
    }
    // `b` took the 20 free places, then 30 of `a`'s keys (down to `a`'s share of 50), then
    // evicted its own for the remaining 450.
    assert_eq!(store.evictions_of(a), 30);
    assert_eq!(store.evictions_of(b), 500 - 20 - 30);
    assert_eq!(
        store.evictions(),
        store.evictions_of(a) + store.evictions_of(b)
    );
    assert_eq!(store.evictions_of("never-seen"), 0);
    let metric = |rule: &str| {
        crate::metrics::metrics()
            .memory_evictions
            .with_label_values(&[rule])
            .get()
    };
    assert_eq!(metric(a), 30);
    assert_eq!(metric(b), store.evictions_of(b));
}

#[test]
fn a_rules_tables_go_when_it_holds_no_key() {
    let (store, clock) = store(1_000);
    for key in 0..100 {
        store.decide(&[check("gone", key, Algorithm::FixedWindow, 10)]);
    }
    clock.advance(Duration::from_secs(120));
    store.sweep();
    assert!(store.is_empty());
    assert!(store
        .shards
        .iter()
        .all(|shard| shard.0.lock().rules.is_empty()));
    // Back again: counted from scratch.
    assert_eq!(
        store.decide(&[check("gone", 1, Algorithm::FixedWindow, 10)])[0].remaining,
        9
    );
}

/// A reset starts a new epoch: a refund of a charge made before it is dropped (before epochs
/// it landed on the new counter, which then admitted more than the limit), one made after it
/// lands; on every algorithm that settles.
#[test]
fn refunds_of_charges_before_a_reset_never_land_on_the_new_counter() {
    use crate::limiter::true_up::Adjust;
    let refund = Adjust {
        refund: 1,
        extra: 0,
    };
    for algorithm in [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindowCounter,
        Algorithm::SlidingWindowLog,
        Algorithm::TokenBucket,
    ] {
        let (store, clock) = store(1_000);
        let c = check("r", 1, algorithm, 3);
        let one = std::slice::from_ref(&c);
        let mut old = Vec::new();
        for _ in 0..3 {
            assert_eq!(allowed(&store, one), [true]);
            old.push(store.now_ns());
            clock.advance(Duration::from_millis(1));
        }
        let changed = store.usage(&c, UsageChange::Reset, None);
        assert_eq!(changed.before.remaining, 0, "{algorithm:?}");
        clock.advance(Duration::from_millis(1));
        for _ in 0..3 {
            assert_eq!(allowed(&store, one), [true], "{algorithm:?}");
        }
        let fresh = store.now_ns();
        for at in old {
            assert!(
                !store.true_up(&c, at, refund),
                "{algorithm:?}: an old refund"
            );
        }
        assert_eq!(
            allowed(&store, one),
            [false],
            "{algorithm:?}: still 3 counted"
        );
        clock.advance(Duration::from_millis(1));
        assert!(
            store.true_up(&c, fresh, refund),
            "{algorithm:?}: a new refund"
        );
        assert_eq!(allowed(&store, one), [true], "{algorithm:?}");
    }
}

/// The marks of resets are bounded by `max_keys` and forgotten by a sweep once they end.
#[test]
fn reset_marks_are_bounded_and_swept() {
    let (store, clock) = store(4);
    for key in 0..10 {
        let c = check("r", key, Algorithm::FixedWindow, 3);
        store.usage(&c, UsageChange::Reset, None);
    }
    assert!(store.epochs.len() <= 4, "{}", store.epochs.len());
    clock.advance(Duration::from_secs(60) + epochs::KEEP * 2);
    store.sweep();
    assert_eq!(store.epochs.len(), 0);
}

/// A change made with an idempotency key is applied once: a retry answers the first numbers
/// and changes nothing; the key for another change is a conflict; the table is bounded.
#[test]
fn an_idempotent_grant_is_applied_once() {
    use crate::limiter::store::Replay;
    let (store, _) = store(1_000);
    let c = check("r", 1, Algorithm::FixedWindow, 10);
    assert_eq!(allowed(&store, std::slice::from_ref(&c)), [true]);
    let first = store.usage(&c, UsageChange::Grant(5), Some("k1"));
    assert_eq!((first.replay, first.after.used), (Replay::Fresh, -4));
    let again = store.usage(&c, UsageChange::Grant(5), Some("k1"));
    assert_eq!(again.replay, Replay::Repeated);
    assert_eq!(again.after, first.after);
    let other = store.usage(&c, UsageChange::Grant(6), Some("k1"));
    assert_eq!(other.replay, Replay::Conflict);
    let now = store.usage(&c, UsageChange::Read, None);
    assert_eq!(now.before.used, -4, "applied once");
    // Another counter's key of the same name is its own.
    let d = check("r", 2, Algorithm::FixedWindow, 10);
    assert_eq!(
        store.usage(&d, UsageChange::Grant(5), Some("k1")).replay,
        Replay::Fresh
    );
    for n in 0..usage::MAX_REMEMBERED + 10 {
        store.usage(&c, UsageChange::Grant(1), Some(&format!("many-{n}")));
    }
    assert!(store.idempotent.len() <= usage::MAX_REMEMBERED);
}
