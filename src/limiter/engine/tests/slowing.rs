//! `mode = "slow"`: what a slowing rule would reject is slowed, uncharged; with several
//! rules any rejection wins and the smallest `slow_rate` applies.

use std::sync::Arc;
use std::time::Duration;

use super::fake::Fake;
use super::*;

#[tokio::test]
async fn a_slowing_rule_slows_what_it_would_reject_and_charges_nothing() {
    let cfg = config(
        r#"
[[rules]]
name = "slow-wide"
key = ["ip"]
algorithm = "fixed_window"
limit = 3
window = "1m"
scope = "local"

[[rules]]
name = "slow-narrow"
key = ["ip"]
algorithm = "token_bucket"
limit = 1
window = "1s"
mode = "slow"
slow_rate = "64KiB"
scope = "local"
"#,
    );
    let (fake, _released) = Fake::new();
    let (limiter, clock) = clocked(&fake);
    let out = limiter.decide(applying(&cfg), &cfg.store).await;
    assert!(admitted(&out), "{:?}", out.verdict);
    let narrow = rule(&cfg, "slow-narrow");
    let before = narrow.counters.slowed.get();
    for _ in 0..5 {
        let out = limiter.decide(applying(&cfg), &cfg.store).await;
        assert_eq!(
            out.verdict,
            Verdict::Slow {
                rate: 64 * 1024,
                rules: vec![Arc::from("slow-narrow")],
            }
        );
        assert!(out.slots.is_empty(), "a slowed request holds nothing");
    }
    assert_eq!(narrow.counters.slowed.get() - before, 5);
    // Had the five slowed requests been charged, "slow-wide" (3 a minute) would refuse now.
    clock.advance(Duration::from_secs(1));
    for _ in 0..2 {
        let out = limiter.decide(applying(&cfg), &cfg.store).await;
        assert!(admitted(&out), "{:?}", out.verdict);
        clock.advance(Duration::from_secs(1));
    }
    assert_eq!(fake.calls(), 0);
}

#[tokio::test]
async fn any_rejection_wins_over_slowing_and_the_smallest_rate_applies() {
    let cfg = config(
        r#"
[[rules]]
name = "slow-fast"
key = ["ip"]
algorithm = "fixed_window"
limit = 1
window = "1m"
mode = "slow"
slow_rate = "64KiB"
scope = "local"

[[rules]]
name = "slow-slower"
key = ["ip"]
algorithm = "sliding_window_counter"
limit = 1
window = "1m"
mode = "slow"
slow_rate = "32KiB"
scope = "local"

[[rules]]
name = "slow-police"
key = ["ip"]
algorithm = "fixed_window"
limit = 2
window = "1m"
scope = "local"
"#,
    );
    let (fake, _released) = Fake::new();
    let limiter = limiter(&fake);
    let out = limiter.decide(applying(&cfg), &cfg.store).await;
    assert!(admitted(&out), "{:?}", out.verdict);
    // Both slowing rules would reject, the police rule admits: the smaller rate.
    let out = limiter.decide(applying(&cfg), &cfg.store).await;
    assert_eq!(
        out.verdict,
        Verdict::Slow {
            rate: 32 * 1024,
            rules: vec![Arc::from("slow-fast"), Arc::from("slow-slower")],
        }
    );
    // The slowed request was not charged: the police rule still has one; take it.
    let police = &cfg.rules[2];
    let only_police = vec![applying(&cfg).remove(2)];
    let out = limiter.decide(only_police, &cfg.store).await;
    assert!(admitted(&out), "{} had room left", police.name);
    // Now the police rule rejects too: rejected, as a rejection names every rule over its
    // limit (the slowing ones as well: the client is over those too).
    let out = limiter.decide(applying(&cfg), &cfg.store).await;
    assert_eq!(
        rejected_by(&out),
        ["slow-fast", "slow-slower", "slow-police"]
    );
}
