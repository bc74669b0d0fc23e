//! The engine against a fake shared store (an in-test [`SharedStore`]): every failure mode,
//! partial admits and lease release, in milliseconds and without a server. The Redis store
//! itself is tested against real `redis-server`s in `tests/redis_store.rs`.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::mpsc;

use super::*;
use crate::config::Config;
use crate::limiter::store::StoreStatus;

/// What the fake reports of each `release`: the rules named, and the lease.
type Released = mpsc::UnboundedReceiver<(Vec<Arc<str>>, u64)>;

/// A shared store that decides each check as an atomic step of its own, as a Redis Cluster
/// does when every key sits in another hash slot: a step that admits is charged even when
/// another rejects, and (as the trait asks) the concurrency slots of a request it did not
/// fully admit are given back before it answers.
struct Fake {
    /// Fail every call with this error instead of deciding.
    failing: Mutex<Option<StoreError>>,
    /// Units charged per rule by rate rules (they never come back).
    charged: Mutex<HashMap<Arc<str>, u64>>,
    /// Concurrency slots held per rule, per lease.
    held: Mutex<HashMap<Arc<str>, HashMap<u64, u64>>>,
    /// The lease of every call to `decide`, in order.
    leases: Mutex<Vec<u64>>,
    /// Every call to `release` (the rules named, the lease).
    released: mpsc::UnboundedSender<(Vec<Arc<str>>, u64)>,
    /// Answer every call with exactly this instead of deciding: a hostile or buggy store.
    answer: Mutex<Option<Vec<(Decision, Grant)>>>,
}

impl Fake {
    fn new() -> (Arc<Fake>, Released) {
        let (tx, rx) = mpsc::unbounded_channel();
        let fake = Fake {
            failing: Mutex::new(None),
            charged: Mutex::default(),
            held: Mutex::default(),
            leases: Mutex::default(),
            released: tx,
            answer: Mutex::new(None),
        };
        (Arc::new(fake), rx)
    }

    fn fail(&self, error: Option<StoreError>) {
        *self.failing.lock() = error;
    }

    fn charged(&self, rule: &str) -> u64 {
        self.charged.lock().get(rule).copied().unwrap_or(0)
    }

    fn held(&self, rule: &str) -> u64 {
        self.held.lock().get(rule).map_or(0, |l| l.values().sum())
    }

    fn free(&self, checks: &[Check], lease: u64) {
        let mut held = self.held.lock();
        for c in checks {
            if let Some(leases) = held.get_mut(&c.rule) {
                leases.remove(&lease);
            }
        }
    }
}

#[async_trait::async_trait]
impl SharedStore for Fake {
    async fn decide(
        &self,
        checks: &[Check],
        lease: u64,
        _timeout: Duration,
    ) -> Result<Vec<Decision>, StoreError> {
        self.leases.lock().push(lease);
        if let Some(e) = self.failing.lock().clone() {
            return Err(e);
        }
        let mut out = Vec::new();
        for c in checks {
            let limit = c.limit.limit;
            let used = if c.limit.algorithm == Algorithm::Concurrency {
                self.held(&c.rule)
            } else {
                self.charged(&c.rule)
            };
            let allowed = used + c.cost <= limit;
            if allowed {
                if c.limit.algorithm == Algorithm::Concurrency {
                    *self
                        .held
                        .lock()
                        .entry(c.rule.clone())
                        .or_default()
                        .entry(lease)
                        .or_default() += c.cost;
                } else {
                    *self.charged.lock().entry(c.rule.clone()).or_default() += c.cost;
                }
            }
            out.push(Decision {
                allowed,
                limit,
                remaining: if allowed { limit - used - c.cost } else { 0 },
                reset: Duration::from_secs(1),
                retry_after: if allowed {
                    Duration::ZERO
                } else {
                    Duration::from_secs(1)
                },
                delay: Duration::ZERO,
            });
        }
        if !out.iter().all(|d| d.allowed) {
            // The trait's contract: a request not admitted keeps no slot.
            self.free(checks, lease);
        }
        Ok(out)
    }

    async fn decide_leased(
        &self,
        checks: &[Check],
        _wants: &[u64],
        _instances: u64,
        lease: u64,
        timeout: Duration,
    ) -> Result<Vec<(Decision, Grant)>, StoreError> {
        if let Some(answer) = self.answer.lock().clone() {
            self.leases.lock().push(lease);
            return Ok(answer);
        }
        // As the trait's default: nothing leased beyond the cost.
        let ds = self.decide(checks, lease, timeout).await?;
        let all = ds.iter().all(|d| d.allowed);
        Ok(ds
            .into_iter()
            .zip(checks)
            .map(|(d, c)| {
                let granted = if all { c.cost } else { 0 };
                (
                    d,
                    Grant {
                        granted,
                        ..Grant::default()
                    },
                )
            })
            .collect())
    }

    async fn release(&self, checks: &[Check], lease: u64) {
        self.free(checks, lease);
        let _ = self
            .released
            .send((checks.iter().map(|c| c.rule.clone()).collect(), lease));
    }

    fn status(&self) -> StoreStatus {
        StoreStatus {
            up: self.failing.lock().is_none(),
            connected: true,
            endpoint: "fake".into(),
            evicting: false,
        }
    }
}

/// A config with `rules` (TOML) on a Redis backend shared by 2 instances. Rule names must be
/// unique across tests: their counters are process-wide metric series.
fn config(rules: &str) -> Config {
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

fn rule(config: &Config, name: &str) -> Arc<Policy> {
    config
        .rules
        .iter()
        .find(|r| &*r.name == name)
        .expect("rule")
        .policy
        .clone()
}

/// Every rule of `config`, applying to one request from one client.
fn applying(config: &Config) -> Vec<(Arc<Policy>, Check)> {
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

fn limiter(fake: &Arc<Fake>) -> Limiter {
    Limiter::with_shared(1000, Some(fake.clone() as Arc<dyn SharedStore>))
}

fn admitted(outcome: &Outcome) -> bool {
    matches!(outcome.verdict, Verdict::Allow { .. })
}

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
    assert!(out.leases.is_empty());
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
    fake.fail(Some(StoreError::Redis("down".into())));
    let limiter = limiter(&fake);
    // limit 4 over 2 instances: 2 here. Each outcome is dropped at once, so the one fallback
    // concurrency slot here (3 / 2) is free for the next request.
    for _ in 0..2 {
        let out = limiter.decide(applying(&cfg), &cfg.store).await;
        assert!(admitted(&out), "{:?}", out.verdict);
        assert!(
            !out.leases.is_empty(),
            "a fallback concurrency slot is held"
        );
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
async fn a_partial_admit_rejects_keeps_no_lease_and_leaves_rate_units_charged() {
    let cfg = config(
        r#"
[[rules]]
name = "eng-part-rate"
key = ["ip"]
algorithm = "fixed_window"
limit = 100
window = "1m"

[[rules]]
name = "eng-part-conc"
key = ["ip"]
algorithm = "concurrency"
limit = 10

[[rules]]
name = "eng-part-tight"
key = ["ip"]
algorithm = "fixed_window"
limit = 1
window = "1m"
status = 403

[[rules]]
name = "eng-part-local"
key = ["ip"]
algorithm = "fixed_window"
limit = 2
window = "1m"
scope = "local"
"#,
    );
    let (fake, mut released) = Fake::new();
    let limiter = limiter(&fake);
    let first = limiter.decide(applying(&cfg), &cfg.store).await;
    assert!(admitted(&first), "{:?}", first.verdict);
    assert_eq!(fake.held("eng-part-conc"), 1);

    // The tight rule's step rejects while the other steps admitted.
    let second = limiter.decide(applying(&cfg), &cfg.store).await;
    match &second.verdict {
        Verdict::Reject { status, rules, .. } => {
            assert_eq!(*status, 403, "the rejecting rule's status");
            assert_eq!(rules, &[Arc::<str>::from("eng-part-tight")]);
        }
        other => panic!("expected a rejection, got {other:?}"),
    }
    assert!(second.leases.is_empty(), "a rejected request holds no slot");
    // The headers show what each rule said, the admitting ones included.
    let said: Vec<bool> = second.applied.iter().map(|a| a.decision.allowed).collect();
    assert_eq!(said, [true, true, false, true]);
    assert_eq!(
        fake.charged("eng-part-rate"),
        2,
        "the admitting rate step stays charged"
    );
    assert_eq!(
        fake.held("eng-part-conc"),
        1,
        "only the first request's slot is held"
    );
    assert_eq!(rule(&cfg, "eng-part-tight").counters.rejected.get(), 1);

    // No rule was charged in process for the rejected request: the local rule (limit 2)
    // admits once more.
    fake.fail(Some(StoreError::Timeout));
    let third = limiter.decide(applying(&cfg), &cfg.store).await;
    assert!(
        admitted(&third),
        "local rule still has room: {:?}",
        third.verdict
    );

    // Only the first request's lease is ever released, when its outcome goes.
    drop((second, third));
    drop(first);
    let (rules, lease) = released.recv().await.expect("released");
    assert_eq!(lease, fake.leases.lock()[0]);
    assert_eq!(rules, [Arc::<str>::from("eng-part-conc")]);
    assert_eq!(fake.held("eng-part-conc"), 0);
}

#[tokio::test]
async fn an_admitted_request_releases_its_shared_slots_under_its_lease() {
    let cfg = config(
        r#"
[[rules]]
name = "eng-lease-conc"
key = ["ip"]
algorithm = "concurrency"
limit = 1

[[rules]]
name = "eng-lease-rate"
key = ["ip"]
algorithm = "fixed_window"
limit = 100
window = "1m"
"#,
    );
    let (fake, mut released) = Fake::new();
    let limiter = limiter(&fake);
    let first = limiter.decide(applying(&cfg), &cfg.store).await;
    assert!(admitted(&first));
    let busy = limiter.decide(applying(&cfg), &cfg.store).await;
    assert!(!admitted(&busy), "the one shared slot is held");
    drop(busy);

    drop(first);
    let (rules, lease) = released.recv().await.expect("released");
    assert_eq!(
        lease,
        fake.leases.lock()[0],
        "released under the lease it was taken with"
    );
    assert_eq!(
        rules,
        [Arc::<str>::from("eng-lease-conc")],
        "only concurrency checks hold anything"
    );
    let again = limiter.decide(applying(&cfg), &cfg.store).await;
    assert!(
        admitted(&again),
        "the slot is free again: {:?}",
        again.verdict
    );
    let leases = fake.leases.lock().clone();
    assert_eq!(leases.len(), 3);
    assert!(
        leases[0] != leases[2],
        "each request decides under a lease of its own"
    );
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
    assert!(fake.leases.lock().is_empty(), "the store was never called");
}

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
    };
    *fake.answer.lock() = Some(vec![(answered(true, 99, Duration::ZERO), inflated)]);
    let calls = fake.leases.lock().len();
    for _ in 0..6 {
        let out = limiter.decide(applying(&cfg), &cfg.store).await;
        assert!(admitted(&out), "{:?}", out.verdict);
    }
    assert_eq!(
        fake.leases.lock().len() - calls,
        2,
        "one lease of 5 permits served 5 requests; the sixth asked the store again"
    );
}
