//! Quota leases through the engine: permits spent in process, refusals remembered, permits put
//! back by rejected requests, one lease call shared by the requests that wait for it, and the
//! lease phase alone.

use std::sync::Arc;
use std::time::Duration;

use super::fake::Fake;
use super::*;
use crate::config::Config;
use crate::limiter::engine::leases;
use crate::limiter::engine::plan::{Ask, Plan};
use crate::limiter::store::Grant;

#[tokio::test]
async fn a_leased_permit_is_spent_in_process_without_a_store_call() {
    let cfg = config(
        r#"
[[rules]]
name = "lease-spend"
key = ["ip"]
algorithm = "fixed_window"
limit = 100
window = "1m"
lease = 5
"#,
    );
    let (fake, _released) = Fake::new();
    let limiter = limiter(&fake);
    let check = check(&cfg, "lease-spend");
    let first = limiter.decide(applying(&cfg), &cfg.store).await;
    assert!(admitted(&first), "{:?}", first.verdict);
    assert_eq!(fake.calls(), 1);
    assert_eq!(fake.charged("lease-spend"), 5, "the request and 4 permits");
    assert_eq!(limiter.leases.held(&check), 4);

    // The next four spend the permits in hand: no store call.
    for held in (0..4).rev() {
        let out = limiter.decide(applying(&cfg), &cfg.store).await;
        assert!(admitted(&out), "{:?}", out.verdict);
        assert!(out.applied[0].decision.allowed);
        assert_eq!(limiter.leases.held(&check), held);
    }
    assert_eq!(fake.calls(), 1, "spent in process");
    // The lease ran out: the sixth asks again.
    let sixth = limiter.decide(applying(&cfg), &cfg.store).await;
    assert!(admitted(&sixth));
    assert_eq!(fake.calls(), 2);
    assert_eq!(fake.charged("lease-spend"), 10);
    assert_eq!(rule(&cfg, "lease-spend").counters.allowed.get(), 6);
}

#[tokio::test]
async fn a_key_the_store_refused_is_refused_in_process_until_its_retry_after() {
    let cfg = config(
        r#"
[[rules]]
name = "lease-refused"
key = ["ip"]
algorithm = "fixed_window"
limit = 2
window = "1m"
lease = 5
"#,
    );
    let (fake, _released) = Fake::new();
    let (limiter, clock) = clocked(&fake);
    // The first leases what is left (2), the second spends the permit in hand.
    for _ in 0..2 {
        let out = limiter.decide(applying(&cfg), &cfg.store).await;
        assert!(admitted(&out), "{:?}", out.verdict);
    }
    assert_eq!(fake.calls(), 1);
    // The third asks, and the store refuses the key (retry after 1 s).
    let third = limiter.decide(applying(&cfg), &cfg.store).await;
    assert_eq!(rejected_by(&third), ["lease-refused"]);
    assert_eq!(fake.calls(), 2);
    // Until then, the refusal is repeated in process, without a call.
    let fourth = limiter.decide(applying(&cfg), &cfg.store).await;
    assert_eq!(rejected_by(&fourth), ["lease-refused"]);
    assert_eq!(fake.calls(), 2, "refused without a store call");
    assert_eq!(
        fourth.applied[0].decision.retry_after,
        Duration::from_secs(1),
        "the store's own answer"
    );
    clock.advance(Duration::from_secs(1));
    let fifth = limiter.decide(applying(&cfg), &cfg.store).await;
    assert_eq!(rejected_by(&fifth), ["lease-refused"]);
    assert_eq!(
        fake.calls(),
        3,
        "past its retry_after the store is asked again"
    );
    assert_eq!(rule(&cfg, "lease-refused").counters.rejected.get(), 3);
}

#[tokio::test]
async fn a_request_another_rule_rejects_puts_back_the_permits_it_spent() {
    let cfg = config(
        r#"
[[rules]]
name = "putback-leased"
key = ["ip"]
algorithm = "fixed_window"
limit = 100
window = "1m"
lease = 5

[[rules]]
name = "putback-tight"
key = ["ip"]
algorithm = "fixed_window"
limit = 1
window = "1m"
"#,
    );
    let (fake, _released) = Fake::new();
    let limiter = limiter(&fake);
    let leased = check(&cfg, "putback-leased");
    let first = limiter.decide(applying(&cfg), &cfg.store).await;
    assert!(admitted(&first), "{:?}", first.verdict);
    assert_eq!(limiter.leases.held(&leased), 4);

    // The leased rule spends a permit in hand; the exact rule's store step rejects.
    let second = limiter.decide(applying(&cfg), &cfg.store).await;
    assert_eq!(rejected_by(&second), ["putback-tight"]);
    let said: Vec<bool> = second.applied.iter().map(|a| a.decision.allowed).collect();
    assert_eq!(said, [true, false]);
    assert_eq!(
        limiter.leases.held(&leased),
        4,
        "the permit went back, uncharged"
    );
    assert_eq!(
        fake.charged("putback-leased"),
        5,
        "the store charged no more"
    );
}

#[tokio::test]
async fn a_request_shaping_rejects_keeps_its_leased_permit_in_the_lease() {
    let cfg = config(
        r#"
[[rules]]
name = "fill-leased"
key = ["ip"]
algorithm = "fixed_window"
limit = 100
window = "1m"
lease = 2

[[rules]]
name = "fill-shape"
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
    let leased = check(&cfg, "fill-leased");
    // 1: leases 2 (1 left in hand), not held. 2: spends it, waits 1 s (the one waiting place).
    for delay in [0, 1] {
        let out = limiter.decide(applying(&cfg), &cfg.store).await;
        let delay = Duration::from_secs(delay);
        assert_eq!(out.verdict, Verdict::Allow { delay });
    }
    assert_eq!((fake.calls(), limiter.leases.held(&leased)), (1, 0));

    // 3: leases 2 more in the store call, then finds no waiting place. The permit its call
    // charged for it stays with this instance: it goes to the lease in hand.
    let third = limiter.decide(applying(&cfg), &cfg.store).await;
    assert_eq!(rejected_by(&third), ["fill-shape"]);
    assert_eq!(fake.calls(), 2);
    assert_eq!(fake.charged("fill-leased"), 4);
    assert_eq!(
        limiter.leases.held(&leased),
        2,
        "its own permit and the extra"
    );

    // And the next request spends it without a call (shaping still refuses it).
    let fourth = limiter.decide(applying(&cfg), &cfg.store).await;
    assert_eq!(rejected_by(&fourth), ["fill-shape"]);
    assert_eq!((fake.calls(), limiter.leases.held(&leased)), (2, 2));
}

#[tokio::test]
async fn requests_waiting_for_a_keys_lease_share_its_store_call() {
    let cfg = config(
        r#"
[[rules]]
name = "lease-shared-call"
key = ["ip"]
algorithm = "fixed_window"
limit = 100
window = "1m"
lease = 4
"#,
    );
    let (fake, _released) = Fake::gated();
    let limiter = limiter(&fake);
    // The first request's call hangs at the gate; the second finds that lease call in flight
    // and waits for it; then the gate opens. (`join!` polls them in this order.)
    let (first, second, ()) = tokio::join!(
        limiter.decide(applying(&cfg), &cfg.store),
        limiter.decide(applying(&cfg), &cfg.store),
        async { fake.open() },
    );
    assert!(admitted(&first), "{:?}", first.verdict);
    assert!(admitted(&second), "{:?}", second.verdict);
    assert_eq!(fake.calls(), 1, "one call for both");
    assert_eq!(limiter.leases.held(&check(&cfg, "lease-shared-call")), 2);
}

/// The lease phase alone over a fresh plan of `applying` under `cfg`: whether the request
/// goes on, and the plan.
async fn lease_phase<'a>(
    limiter: &Limiter,
    cfg: &Config,
    applying: &'a [(Arc<Policy>, Check)],
) -> (bool, Plan<'a>) {
    let mut plan = Plan::new(applying, true);
    let clock = &*limiter.clock;
    let goes_on = leases::take(&limiter.leases, clock, &mut plan.steps, &cfg.store).await;
    (goes_on, plan)
}

/// How each step joins the store call: `Some(want)` (0: exact), or `None`.
fn asks(plan: &Plan<'_>) -> Vec<Option<u64>> {
    plan.steps
        .iter()
        .map(|s| match &s.ask {
            Some(Ask::Lease { want, .. }) => Some(*want),
            Some(Ask::Exact) => Some(0),
            None => None,
        })
        .collect()
}

/// Answers the lease the first step asked for, as the store call would.
fn answer(limiter: &Limiter, plan: &mut Plan<'_>, decision: &Decision, granted: u64) {
    let step = &mut plan.steps[0];
    let Some(Ask::Lease { guard, .. }) = step.ask.take() else {
        panic!("a lease was asked for")
    };
    let grant = Grant {
        granted,
        ..Grant::default()
    };
    let now = limiter.clock.instant();
    let admitted = decision.allowed;
    limiter
        .leases
        .fill(*guard, step.check, decision, grant, admitted, now);
}

#[tokio::test]
async fn the_lease_phase_alone_spends_asks_or_refuses() {
    let cfg = config(
        r#"
[[rules]]
name = "phase-leased"
key = ["ip"]
algorithm = "token_bucket"
limit = 100
window = "1m"
lease = 3

[[rules]]
name = "phase-exact"
key = ["ip"]
algorithm = "sliding_window_log"
limit = 100
window = "1m"

[[rules]]
name = "phase-local"
key = ["ip"]
algorithm = "fixed_window"
limit = 100
window = "1m"
scope = "local"
"#,
    );
    let (fake, _released) = Fake::new();
    let limiter = limiter(&fake);
    let leased = check(&cfg, "phase-leased");
    let requests = applying(&cfg);

    let (goes_on, mut plan) = lease_phase(&limiter, &cfg, &requests).await;
    assert!(goes_on);
    assert_eq!(asks(&plan), [Some(3), Some(0), None], "lease, exact, local");
    answer(&limiter, &mut plan, &Decision::unlimited(100), 3);
    assert_eq!(limiter.leases.held(&leased), 2);

    // Permits in hand: the leased step is decided here and stays out of the call.
    for _ in 0..2 {
        let (goes_on, plan) = lease_phase(&limiter, &cfg, &requests).await;
        assert!(goes_on);
        assert_eq!(asks(&plan), [None, Some(0), None]);
        assert!(plan.steps[0].admits() && plan.steps[0].from_lease);
    }

    // Spent: a lease is asked for, and the store refuses the key.
    let (_, mut plan) = lease_phase(&limiter, &cfg, &requests).await;
    assert_eq!(asks(&plan)[0], Some(3));
    let mut refused = Decision::unlimited(100);
    refused.allowed = false;
    refused.retry_after = Duration::from_secs(1);
    answer(&limiter, &mut plan, &refused, 0);

    // Now the phase refuses the request itself: nothing is to be asked.
    let (goes_on, plan) = lease_phase(&limiter, &cfg, &requests).await;
    assert!(!goes_on);
    assert!(!plan.steps[0].admits() && !plan.steps[0].from_lease);
    assert_eq!(fake.calls(), 0, "the phase never calls the store");
}
