//! A hostile or buggy store: its numbers are never trusted beyond the rule's own bounds.

use std::time::Duration;

use super::fake::Fake;
use super::*;
use crate::limiter::store::Grant;

/// A decision as a store would answer it: admitted or not, with these numbers.
fn answered(allowed: bool, remaining: u64, wait: Duration) -> Decision {
    Decision {
        allowed,
        limit: u64::MAX,
        remaining,
        reset: wait,
        retry_after: if allowed { Duration::ZERO } else { wait },
        delay: if allowed { wait } else { Duration::ZERO },
    }
}

#[tokio::test]
async fn a_store_delay_never_holds_a_request_beyond_the_rules_max_delay() {
    let cfg = config(
        r#"
[[rules]]
name = "eng-hostile-shape"
key = ["ip"]
algorithm = "leaky_bucket"
mode = "shape"
limit = 10
window = "1s"
max_delay = "250ms"
"#,
    );
    let (fake, _released) = Fake::new();
    let limiter = limiter(&fake);
    let hour = Duration::from_secs(3600);
    *fake.answer.lock() = Some(vec![(answered(true, u64::MAX, hour), Grant::default())]);
    let out = limiter.decide(applying(&cfg), &cfg.store).await;
    assert_eq!(
        out.verdict,
        Verdict::Allow {
            delay: Duration::from_millis(250)
        },
        "held at most max_delay"
    );
    let d = &out.applied[0].decision;
    assert_eq!(
        (d.limit, d.remaining),
        (10, 10),
        "the rule's quota, never more"
    );
    assert!(d.reset <= Duration::from_secs(2), "{:?}", d.reset);

    // A rule that does not shape is never held, whatever the store says.
    let cfg = config(
        r#"
[[rules]]
name = "eng-hostile-police"
key = ["ip"]
algorithm = "token_bucket"
limit = 10
window = "1s"
"#,
    );
    let out = limiter.decide(applying(&cfg), &cfg.store).await;
    assert_eq!(
        out.verdict,
        Verdict::Allow {
            delay: Duration::ZERO
        }
    );
}

#[tokio::test]
async fn a_store_cannot_stretch_retry_after_inflate_leases_or_answer_short() {
    let cfg = config(
        r#"
[[rules]]
name = "eng-hostile-window"
key = ["ip"]
algorithm = "fixed_window"
limit = 10
window = "1m"
on_store_error = "closed"
"#,
    );
    let (fake, _released) = Fake::new();
    let limiter = limiter(&fake);
    let decade = Duration::from_secs(10 * 365 * 86_400);
    *fake.answer.lock() = Some(vec![(answered(false, 7, decade), Grant::default())]);
    let out = limiter.decide(applying(&cfg), &cfg.store).await;
    match &out.verdict {
        Verdict::Reject { retry_after, .. } => {
            assert_eq!(*retry_after, Duration::from_secs(60), "at most the window")
        }
        other => panic!("expected a rejection, got {other:?}"),
    }
    assert_eq!(out.applied[0].decision.remaining, 0);

    // An answer that does not hold one decision per check is a failure, not an admit.
    *fake.answer.lock() = Some(Vec::new());
    let out = limiter.decide(applying(&cfg), &cfg.store).await;
    assert!(
        matches!(out.verdict, Verdict::Unavailable { .. }),
        "{:?}",
        out.verdict
    );

    // A lease of a million permits where 5 were asked for: at most 5 are spent in process.
    let cfg = config(
        r#"
[[rules]]
name = "eng-hostile-lease"
key = ["ip"]
algorithm = "fixed_window"
limit = 100
window = "1m"
lease = 5
"#,
    );
    let inflated = Grant {
        granted: 1_000_000,
        window_left: decade,
        window_end_us: 0,
        charged_at_us: 0,
    };
    *fake.answer.lock() = Some(vec![(answered(true, 99, Duration::ZERO), inflated)]);
    let calls = fake.holders.lock().len();
    for _ in 0..6 {
        let out = limiter.decide(applying(&cfg), &cfg.store).await;
        assert!(admitted(&out), "{:?}", out.verdict);
    }
    assert_eq!(
        fake.holders.lock().len() - calls,
        2,
        "one lease of 5 permits served 5 requests; the sixth asked the store again"
    );
}
