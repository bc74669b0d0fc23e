//! The engine against a fake shared store (an in-test [`SharedStore`]) on a manual clock:
//! every failure mode, partial admits, quota leases, shaping and slot release, in
//! milliseconds, without a server and without sleeping. The Redis store itself is tested
//! against real `redis-server`s in `tests/redis_store.rs`.

mod failure;
mod fake;
mod hostile;
mod leasing;
mod shaping;
mod slots;
mod slowing;

use std::path::Path;
use std::sync::Arc;

use super::*;
use crate::config::Config;
use crate::limiter::memory::ManualClock;

use super::plan::{Place, Plan};
use fake::Fake;

/// A config with `rules` (TOML) on a Redis backend shared by 2 instances. Rule names must be
/// unique across tests: their counters are process-wide metric series.
pub(super) fn config(rules: &str) -> Config {
    let text = format!(
        r#"
[store]
backend = "redis"
url = "redis://127.0.0.1:1"
instances = 2

[[upstreams]]
name = "u"
targets = ["127.0.0.1:9000"]

[[routes]]
name = "r"
upstream = "u"
{rules}"#
    );
    Config::from_str(Path::new("gateway.toml"), &text).expect("valid config")
}

pub(super) fn rule(config: &Config, name: &str) -> Arc<Policy> {
    config
        .rules
        .iter()
        .find(|r| &*r.name == name)
        .expect("rule")
        .policy
        .clone()
}

/// The check rule `name` makes for the one client of these tests.
fn check(config: &Config, name: &str) -> Check {
    applying(config)
        .into_iter()
        .find(|(r, _)| &*r.name == name)
        .expect("rule")
        .1
}

/// Every rule of `config`, applying to one request from one client.
pub(super) fn applying(config: &Config) -> Vec<(Arc<Policy>, Check)> {
    config
        .rules
        .iter()
        .map(|r| {
            let check = Check {
                rule: r.name.clone(),
                counter: 7,
                limit: r.limit.clone(),
                cost: r.cost,
            };
            (r.policy.clone(), check)
        })
        .collect()
}

/// A limiter over `fake` on a clock that moves only when told.
fn limiter(fake: &Arc<Fake>) -> Limiter {
    clocked(fake).0
}

/// [`limiter`], and its clock.
fn clocked(fake: &Arc<Fake>) -> (Limiter, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(1_700_000_000_000_000_000));
    let shared = Some(fake.clone() as Arc<dyn SharedStore>);
    (Limiter::with_clock(1000, shared, clock.clone()), clock)
}

fn admitted(outcome: &Outcome) -> bool {
    matches!(outcome.verdict, Verdict::Allow { .. })
}

/// The rules that rejected the request (panics unless the verdict is a rejection).
fn rejected_by(outcome: &Outcome) -> Vec<&str> {
    match &outcome.verdict {
        Verdict::Reject { rules, .. } => rules.iter().map(|r| &**r).collect(),
        other => panic!("expected a rejection, got {other:?}"),
    }
}

#[tokio::test]
async fn shadow_and_local_rules_never_reach_the_store() {
    let cfg = config(
        r#"
[[rules]]
name = "eng-shadow"
key = ["ip"]
algorithm = "fixed_window"
limit = 1
window = "1m"
shadow = true

[[rules]]
name = "eng-only-local"
key = ["ip"]
algorithm = "fixed_window"
limit = 5
window = "1m"
scope = "local"
"#,
    );
    let (fake, _released) = Fake::new();
    let limiter = limiter(&fake);
    for _ in 0..2 {
        let out = limiter.decide(applying(&cfg), &cfg.store).await;
        assert!(admitted(&out), "{:?}", out.verdict);
    }
    let out = limiter.decide(applying(&cfg), &cfg.store).await;
    assert_eq!(out.shadow_rejected, [Arc::<str>::from("eng-shadow")]);
    assert_eq!(fake.calls(), 0, "the store was never called");
    // So the proxy decides them without a future (`decide_in_process`), with the same result.
    assert!(!limiter.asks_store(&applying(&cfg)));
    for _ in 0..2 {
        let out = limiter.decide_in_process(&applying(&cfg), false);
        assert!(admitted(&out), "{:?}", out.verdict);
        assert_eq!(out.shadow_rejected, [Arc::<str>::from("eng-shadow")]);
    }
    let out = limiter.decide_in_process(&applying(&cfg), false);
    assert_eq!(rejected_by(&out), ["eng-only-local"], "the sixth of five");
    assert_eq!(fake.calls(), 0);
}

#[test]
fn the_plan_sets_shadow_rules_aside_and_places_global_rules_on_the_shared_store() {
    let cfg = config(
        r#"
[[rules]]
name = "plan-global"
key = ["ip"]
algorithm = "fixed_window"
limit = 1
window = "1m"

[[rules]]
name = "plan-shadow"
key = ["ip"]
algorithm = "fixed_window"
limit = 1
window = "1m"
shadow = true

[[rules]]
name = "plan-local"
key = ["ip"]
algorithm = "fixed_window"
limit = 1
window = "1m"
scope = "local"
"#,
    );
    let requests = applying(&cfg);
    let plan = Plan::new(&requests, true);
    let places: Vec<(&str, Place)> = plan
        .steps
        .iter()
        .map(|s| (&*s.rule.name, s.place))
        .collect();
    assert_eq!(
        places,
        [("plan-global", Place::Shared), ("plan-local", Place::Local)]
    );
    let shadow: Vec<&str> = plan.shadow().map(|(r, _)| &*r.name).collect();
    assert_eq!(shadow, ["plan-shadow"]);
    assert_eq!(plan.local_checks::<Vec<_>>().len(), 1);

    let (fake, _released) = Fake::new();
    assert!(limiter(&fake).asks_store(&requests), "a global rule asks");
    let in_process = Limiter::with_shared(100, None);
    assert!(
        !in_process.asks_store(&requests),
        "the memory backend never asks"
    );

    let alone = Plan::new(&requests, false);
    assert!(
        alone.steps.iter().all(|s| s.place == Place::Local),
        "without a shared store every rule is local"
    );
    assert_eq!(alone.local_checks::<Vec<_>>().len(), 2);
}

/// What a refused request shows of a rule that would have admitted it is what the rule
/// really has left: the cost back when nothing was kept, the cost gone when the store kept it
/// (the fake decides each check apart, as a Redis Cluster does for keys in other hash slots).
#[tokio::test]
async fn a_refused_request_shows_what_each_rule_really_has_left() {
    let cfg = config(
        r#"
[[rules]]
name = "left-kept"
key = ["ip"]
algorithm = "fixed_window"
limit = 5
window = "1m"

[[rules]]
name = "left-full"
key = ["ip"]
algorithm = "fixed_window"
limit = 1
window = "1m"

[[rules]]
name = "left-local"
key = ["ip"]
algorithm = "fixed_window"
limit = 3
window = "1m"
scope = "local"
"#,
    );
    let (fake, _released) = Fake::new();
    let limiter = limiter(&fake);
    let remaining = |out: &Outcome, name: &str| {
        out.applied
            .iter()
            .find(|a| &*a.rule.name == name)
            .map(|a| a.decision.remaining)
    };
    // The full rule's one unit goes first.
    let full: Vec<_> = applying(&cfg)
        .into_iter()
        .filter(|(r, _)| &*r.name == "left-full")
        .collect();
    assert!(admitted(&limiter.decide(full, &cfg.store).await));
    for round in 1..=2u64 {
        let out = limiter.decide(applying(&cfg), &cfg.store).await;
        assert_eq!(rejected_by(&out), ["left-full"]);
        // The store kept the charge of the rule that admitted: 5 - round left, as the
        // store's count says.
        assert_eq!(fake.charged("left-kept"), round);
        assert_eq!(
            remaining(&out, "left-kept"),
            Some(5 - round),
            "round {round}"
        );
        // The local rule was only peeked: all 3 are still there.
        assert_eq!(remaining(&out, "left-local"), Some(3), "round {round}");
    }
}
