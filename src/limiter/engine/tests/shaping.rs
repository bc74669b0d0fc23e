//! Shaping: how many requests a shaping rule holds (`max_waiting`), through the engine and
//! through the waiting places alone.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::fake::Fake;
use super::*;
use crate::limiter::engine::shaping::Waiting;

#[tokio::test]
async fn a_shaping_rule_holds_at_most_max_waiting_requests() {
    let cfg = config(
        r#"
[[rules]]
name = "shape-cap"
key = ["ip"]
algorithm = "leaky_bucket"
mode = "shape"
limit = 1
window = "1s"
burst = 10
max_delay = "10s"
max_waiting = 2
scope = "local"
"#,
    );
    let (fake, _released) = Fake::new();
    let (limiter, clock) = clocked(&fake);
    // One departs at once, the next two wait their turn (1 s apart): both places taken.
    for delay in [0, 1, 2] {
        let out = limiter.decide(applying(&cfg), &cfg.store).await;
        let delay = Duration::from_secs(delay);
        assert_eq!(out.verdict, Verdict::Allow { delay });
    }
    // The fourth would wait 3 s, but no place is free: rejected as the rule's rejection.
    let full = limiter.decide(applying(&cfg), &cfg.store).await;
    match &full.verdict {
        Verdict::Reject {
            status,
            retry_after,
            rules,
        } => {
            assert_eq!(*status, 429);
            assert_eq!(
                *retry_after,
                Duration::from_secs(3),
                "its wait, at least 1 s"
            );
            assert_eq!(rules, &[Arc::<str>::from("shape-cap")]);
        }
        other => panic!("expected a rejection, got {other:?}"),
    }
    let said = &full.applied[0].decision;
    assert!(!said.allowed && said.delay.is_zero());
    let counters = &rule(&cfg, "shape-cap").counters;
    assert_eq!((counters.allowed.get(), counters.rejected.get()), (3, 1));

    // A second later the first waiting request has left: its place is free again. The
    // refused request's unit stayed charged, so the line is 3 s long.
    clock.advance(Duration::from_secs(1));
    let out = limiter.decide(applying(&cfg), &cfg.store).await;
    let delay = Duration::from_secs(3);
    assert_eq!(out.verdict, Verdict::Allow { delay });
    assert_eq!(fake.calls(), 0, "a local rule");
}

#[tokio::test]
async fn a_request_is_held_as_long_as_its_longest_shaping_rule_and_counted_in_each() {
    let cfg = config(
        r#"
[[rules]]
name = "shape-slow"
key = ["ip"]
algorithm = "leaky_bucket"
mode = "shape"
limit = 1
window = "2s"
burst = 10
max_delay = "20s"
max_waiting = 5
scope = "local"

[[rules]]
name = "shape-fast"
key = ["ip"]
algorithm = "leaky_bucket"
mode = "shape"
limit = 1
window = "1s"
burst = 10
max_delay = "10s"
max_waiting = 1
scope = "local"
"#,
    );
    let (fake, _released) = Fake::new();
    let limiter = limiter(&fake);
    let first = limiter.decide(applying(&cfg), &cfg.store).await;
    assert_eq!(
        first.verdict,
        Verdict::Allow {
            delay: Duration::ZERO
        }
    );
    let second = limiter.decide(applying(&cfg), &cfg.store).await;
    let delay = Duration::from_secs(2);
    assert_eq!(
        second.verdict,
        Verdict::Allow { delay },
        "the slower rule's wait"
    );
    // The fast rule's one place is taken (until the request's 2 s wait ends): the slow
    // rule, with room, counts no waiting place for a request refused.
    let third = limiter.decide(applying(&cfg), &cfg.store).await;
    assert_eq!(rejected_by(&third), ["shape-fast"]);
    let said: Vec<bool> = third.applied.iter().map(|a| a.decision.allowed).collect();
    assert_eq!(said, [true, false], "only the full rule refused");
}

#[test]
fn a_place_is_taken_in_every_rule_or_in_none() {
    let waiting = Waiting::default();
    let (a, b): (Arc<str>, Arc<str>) = ("a".into(), "b".into());
    let now = Instant::now();
    let second = Duration::from_secs(1);
    assert_eq!(waiting.reserve(&[(&a, 2), (&b, 1)], now, second), Ok(()));
    // `b` is full: `a` does not count this request either.
    assert_eq!(waiting.reserve(&[(&a, 2), (&b, 1)], now, second), Err(1));
    assert_eq!(waiting.reserve(&[(&a, 2)], now, second), Ok(()));
    assert_eq!(waiting.reserve(&[(&a, 2)], now, second), Err(0));
    // Waits that have ended free their places.
    let later = now + second;
    assert_eq!(waiting.reserve(&[(&a, 2), (&b, 1)], later, second), Ok(()));
}
