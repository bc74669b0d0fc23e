//! Store failures: each rule's `on_store_error` (open, closed, local), through the engine and
//! through the failure phase alone.

use std::sync::Arc;

use super::fake::Fake;
use super::*;
use crate::limiter::engine::fallback;
use crate::limiter::engine::plan::{Ask, Plan};
use crate::limiter::store::StoreError;

#[tokio::test]
async fn open_admits_every_request_while_the_store_fails_and_counts_it() {
    let cfg = config(
        r#"
[[rules]]
name = "eng-open"
key = ["ip"]
algorithm = "fixed_window"
limit = 1
window = "1m"
on_store_error = "open"
"#,
    );
    let (fake, _released) = Fake::new();
    fake.fail(Some(StoreError::Timeout));
    let limiter = limiter(&fake);
    for _ in 0..3 {
        let out = limiter.decide(applying(&cfg), &cfg.store).await;
        assert!(admitted(&out), "{:?}", out.verdict);
        // The quota is shown full: nothing was counted.
        assert_eq!(out.applied[0].decision, Decision::unlimited(1));
    }
    let open = rule(&cfg, "eng-open");
    assert_eq!(open.counters.fail_open.get(), 3);
    assert_eq!(open.counters.allowed.get(), 3);
}

#[tokio::test]
async fn closed_answers_unavailable_and_charges_no_other_rule() {
    let cfg = config(
        r#"
[[rules]]
name = "eng-closed"
key = ["ip"]
algorithm = "fixed_window"
limit = 100
window = "1m"
on_store_error = "closed"

[[rules]]
name = "eng-closed-local"
key = ["ip"]
algorithm = "fixed_window"
limit = 1
window = "1m"
scope = "local"
"#,
    );
    let (fake, _released) = Fake::new();
    fake.fail(Some(StoreError::CircuitOpen));
    let limiter = limiter(&fake);
    let out = limiter.decide(applying(&cfg), &cfg.store).await;
    match &out.verdict {
        Verdict::Unavailable { retry_after, rules } => {
            assert_eq!(*retry_after, STORE_RETRY_AFTER);
            assert_eq!(rules, &[Arc::<str>::from("eng-closed")]);
        }
        other => panic!("expected 503, got {other:?}"),
    }
    assert!(out.slots.is_empty());
    assert_eq!(rule(&cfg, "eng-closed").counters.fail_closed.get(), 1);

    // The local rule (limit 1) was only peeked: once the store is back, it still admits.
    fake.fail(None);
    let out = limiter.decide(applying(&cfg), &cfg.store).await;
    assert!(admitted(&out), "{:?}", out.verdict);
    assert_eq!(fake.charged("eng-closed"), 1);
}

#[tokio::test]
async fn local_decides_in_process_with_the_limit_shared_among_instances() {
    let cfg = config(
        r#"
[[rules]]
name = "eng-local"
key = ["ip"]
algorithm = "fixed_window"
limit = 4
window = "1m"
on_store_error = "local"

[[rules]]
name = "eng-local-conc"
key = ["ip"]
algorithm = "concurrency"
limit = 3
on_store_error = "local"
"#,
    );
    let (fake, _released) = Fake::new();
    fake.fail(Some(StoreError::Failed("down".into())));
    let limiter = limiter(&fake);
    // limit 4 over 2 instances: 2 here. Each outcome is dropped at once, so the one fallback
    // concurrency slot here (3 / 2) is free for the next request.
    for _ in 0..2 {
        let out = limiter.decide(applying(&cfg), &cfg.store).await;
        assert!(admitted(&out), "{:?}", out.verdict);
        assert!(!out.slots.is_empty(), "a fallback concurrency slot is held");
    }
    let out = limiter.decide(applying(&cfg), &cfg.store).await;
    match &out.verdict {
        Verdict::Reject { status, rules, .. } => {
            assert_eq!(*status, 429);
            assert_eq!(rules, &[Arc::<str>::from("eng-local")]);
        }
        other => panic!("expected 429, got {other:?}"),
    }
    assert_eq!(rule(&cfg, "eng-local").counters.fail_local.get(), 3);
    assert_eq!(
        fake.charged("eng-local"),
        0,
        "the failing store charged nothing"
    );
}

#[tokio::test]
async fn local_fallback_slots_come_back_when_the_request_ends() {
    let cfg = config(
        r#"
[[rules]]
name = "eng-fallback-conc"
key = ["ip"]
algorithm = "concurrency"
limit = 2
on_store_error = "local"
"#,
    );
    let (fake, _released) = Fake::new();
    fake.fail(Some(StoreError::Timeout));
    let limiter = limiter(&fake);
    // 2 over 2 instances: one slot here.
    let first = limiter.decide(applying(&cfg), &cfg.store).await;
    assert!(admitted(&first));
    let second = limiter.decide(applying(&cfg), &cfg.store).await;
    assert!(!admitted(&second), "the one slot is held");
    drop(first);
    let third = limiter.decide(applying(&cfg), &cfg.store).await;
    assert!(admitted(&third), "the slot came back: {:?}", third.verdict);
}

#[tokio::test]
async fn a_failed_lease_call_falls_back_and_leaves_the_key_free_to_lease_again() {
    let cfg = config(
        r#"
[[rules]]
name = "eng-fail-leased"
key = ["ip"]
algorithm = "fixed_window"
limit = 4
window = "1m"
lease = 3
on_store_error = "local"
"#,
    );
    let (fake, _released) = Fake::new();
    fake.fail(Some(StoreError::Timeout));
    let limiter = limiter(&fake);
    // 4 over 2 instances: 2 here. Each request finds no lease call in flight (the failed one
    // let go of its key) and asks the store itself, rather than waiting on a call that ended.
    for calls in 1..=2 {
        let out = limiter.decide(applying(&cfg), &cfg.store).await;
        assert!(admitted(&out), "{:?}", out.verdict);
        assert_eq!(fake.calls(), calls);
    }
    let out = limiter.decide(applying(&cfg), &cfg.store).await;
    assert_eq!(rejected_by(&out), ["eng-fail-leased"]);
    assert_eq!(fake.calls(), 3);
    assert_eq!(limiter.leases.held(&check(&cfg, "eng-fail-leased")), 0);
    let leased = rule(&cfg, "eng-fail-leased");
    assert_eq!(leased.counters.fail_local.get(), 3);
    assert_eq!(leased.counters.rejected.get(), 1);
}

#[test]
fn the_failure_phase_alone_decides_each_asking_step_by_its_mode() {
    let cfg = config(
        r#"
[[rules]]
name = "fb-open"
key = ["ip"]
algorithm = "fixed_window"
limit = 10
window = "1m"
on_store_error = "open"

[[rules]]
name = "fb-local"
key = ["ip"]
algorithm = "fixed_window"
limit = 4
window = "1m"
on_store_error = "local"

[[rules]]
name = "fb-closed"
key = ["ip"]
algorithm = "fixed_window"
limit = 10
window = "1m"
on_store_error = "closed"

[[rules]]
name = "fb-not-asked"
key = ["ip"]
algorithm = "fixed_window"
limit = 10
window = "1m"
"#,
    );
    let (fake, _released) = Fake::new();
    let limiter = limiter(&fake);
    let requests = applying(&cfg);
    let fails = |names: &[&str]| {
        let mut plan = Plan::new(&requests, true);
        for step in plan.steps.iter_mut() {
            if names.contains(&&*step.rule.name) {
                step.ask = Some(Ask::Exact);
            }
        }
        let mut slots = Slots::default();
        let clock = &*limiter.clock;
        let error = StoreError::Timeout;
        let steps = &mut plan.steps;
        let admitted = fallback::apply(&limiter.fallback, clock, &error, steps, 2, &mut slots);
        (admitted, plan)
    };

    // A closed rule refuses, and then nothing is decided in process.
    let (admitted, plan) = fails(&["fb-open", "fb-local", "fb-closed"]);
    assert!(!admitted);
    let modes: Vec<_> = plan.steps.iter().map(|s| s.fell_back).collect();
    use crate::limiter::policy::FailureMode::{Closed, Local, Open};
    assert_eq!(modes, [Some(Open), Some(Local), Some(Closed), None]);
    let decisions: Vec<_> = plan.steps.iter().map(|s| s.decision.clone()).collect();
    assert_eq!(decisions[0], Some(Decision::unlimited(10)));
    assert_eq!(decisions[1], Some(Decision::unlimited(4)), "not decided");
    let closed = decisions[2].clone().expect("decided");
    assert!(!closed.allowed);
    assert_eq!(closed.retry_after, STORE_RETRY_AFTER);
    assert_eq!(decisions[3], None, "a step not in the call is left alone");
    assert!(
        plan.steps.iter().all(|s| s.ask.is_none()),
        "out of the call"
    );
    assert!(limiter.fallback.is_empty(), "nothing charged in process");

    // Without a closed rule, `local` decides with the limit shared out: 4 / 2 instances.
    for remaining in [1, 0] {
        let (admitted, plan) = fails(&["fb-open", "fb-local"]);
        assert!(admitted);
        let local = plan.steps[1].decision.clone().expect("decided");
        assert_eq!((local.limit, local.remaining), (2, remaining));
    }
    let (admitted, plan) = fails(&["fb-local"]);
    assert!(!admitted, "the local share is spent");
    assert!(!plan.steps[1].admits());
}
