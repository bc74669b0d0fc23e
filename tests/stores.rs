//! The same engine scenarios against every store, the way Limitador's
//! `test_with_all_storage_impls` runs its suite: each algorithm, a rejected request charging
//! nothing, concurrency slots coming back, instances sharing a limit exactly (with and without
//! quota leases) and the failure modes.
//!
//! The stores: `memory` (the embedded default as the gateway runs it: global rules decided in
//! the limiter's own in-process store), `shared-memory` (one memory store behind the store
//! trait, shared by limiters standing for instances: the path every shared store takes),
//! `redis` (a real redis-server) and `redis-cluster` (a real 3-master Redis Cluster). The
//! in-process ones run in milliseconds; the Redis ones start their servers per test and stop
//! them when it ends, also when it fails. The memory stores cannot fail, so the failure modes
//! run against the Redis ones (a server stopped mid-test, seed nodes nobody listens on).

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::redis::{RedisCluster, RedisServer};
use floodgate::config::Config;
use floodgate::limiter::engine::{Limiter, Outcome, Verdict};
use floodgate::limiter::memory::MemoryStore;
use floodgate::limiter::policy::Policy;
use floodgate::limiter::Check;

/// Which store the limiters of a scenario decide global rules in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Memory,
    SharedMemory,
    Redis,
    RedisCluster,
}

/// One store for one scenario, with whatever servers it runs on (stopped when dropped).
struct Backend {
    kind: Kind,
    redis: Option<RedisServer>,
    cluster: Option<RedisCluster>,
    shared_memory: Arc<MemoryStore>,
}

impl Backend {
    fn start(kind: Kind) -> Backend {
        Backend {
            kind,
            redis: (kind == Kind::Redis).then(RedisServer::start),
            cluster: (kind == Kind::RedisCluster).then(RedisCluster::start),
            shared_memory: Arc::new(MemoryStore::new(10_000)),
        }
    }

    /// `[store]` of this backend for `instances` instances.
    fn store_section(&self, instances: u64) -> String {
        let common = format!("timeout = \"2s\"\ninstances = {instances}");
        match self.kind {
            Kind::Memory | Kind::SharedMemory => format!("[store]\n{common}\n"),
            Kind::Redis => {
                let url = self.redis.as_ref().expect("redis").url();
                format!("[store]\nbackend = \"redis\"\nurl = \"{url}\"\n{common}\n")
            }
            Kind::RedisCluster => {
                let urls = self.cluster.as_ref().expect("cluster").urls();
                format!("[store]\nbackend = \"redis-cluster\"\nurls = {urls:?}\n{common}\n")
            }
        }
    }

    /// The config `rules` (TOML) make on this backend.
    fn config(&self, rules: &str, instances: u64) -> Config {
        config(&self.store_section(instances), rules)
    }

    /// A limiter (one instance) deciding in this backend, ready to decide.
    async fn limiter(&self, config: &Config) -> Limiter {
        let limiter = match self.kind {
            Kind::SharedMemory => {
                Limiter::with_shared(10_000, Some(self.shared_memory.clone() as _))
            }
            _ => Limiter::new(&config.store),
        };
        assert_eq!(limiter.in_process(), self.kind == Kind::Memory);
        ready(&limiter, self.kind).await;
        limiter
    }
}

/// A config with `store` and `rules` in front of one upstream.
fn config(store: &str, rules: &str) -> Config {
    let text = format!(
        "{store}\n[[upstreams]]\nname = \"u\"\ntargets = [\"127.0.0.1:9000\"]\n\n\
         [[routes]]\nname = \"r\"\nupstream = \"u\"\n{rules}"
    );
    Config::from_str(Path::new("gateway.toml"), &text).expect("valid config")
}

/// Waits (bounded) until the limiter's store has connected.
async fn ready(limiter: &Limiter, kind: Kind) {
    for _ in 0..200 {
        if limiter.store().is_up() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{kind:?}: the store never came up");
}

/// The rules named in `names` (all when empty) applying to client `client`'s request.
fn applying(config: &Config, names: &[&str], client: u64) -> Vec<(Arc<Policy>, Check)> {
    config
        .rules
        .iter()
        .filter(|r| names.is_empty() || names.contains(&&*r.name))
        .map(|r| {
            let check = Check {
                rule: r.name.clone(),
                counter: client,
                limit: r.limit.clone(),
                cost: r.cost,
            };
            (r.policy.clone(), check)
        })
        .collect()
}

/// One request of `client` through the rules `names`.
async fn request(limiter: &Limiter, config: &Config, names: &[&str], client: u64) -> Outcome {
    limiter
        .decide(applying(config, names, client), &config.store)
        .await
}

fn admitted(outcome: &Outcome) -> bool {
    matches!(outcome.verdict, Verdict::Allow { .. })
}

/// How many of `n` requests of `client` through `names` are admitted (their outcomes are
/// dropped at once: concurrency slots come back).
async fn count_admitted(
    limiter: &Limiter,
    config: &Config,
    names: &[&str],
    client: u64,
    n: usize,
) -> usize {
    let mut admitted_count = 0;
    for _ in 0..n {
        if admitted(&request(limiter, config, names, client).await) {
            admitted_count += 1;
        }
    }
    admitted_count
}

/// A global rule for these scenarios: windows of an hour, so that nothing refills while one
/// runs.
fn rule(name: &str, algorithm: &str, limit: u64, extra: &str) -> String {
    scoped(name, algorithm, limit, "global", extra)
}

/// [`rule`] in `scope`.
fn scoped(name: &str, algorithm: &str, limit: u64, scope: &str, extra: &str) -> String {
    let window = if algorithm == "concurrency" {
        ""
    } else {
        "window = \"1h\"\n"
    };
    format!(
        "\n[[rules]]\nname = \"{name}\"\nkey = [\"ip\"]\nalgorithm = \"{algorithm}\"\n\
         limit = {limit}\n{window}scope = \"{scope}\"\n{extra}\n"
    )
}

/// One test per store for each scenario (as Limitador's `test_with_all_storage_impls` names
/// one per store): a failing store names itself, and hides none of the others.
macro_rules! per_store {
    ($scenario:ident: $($store:ident => $kind:expr),+ $(,)?) => {
        mod $scenario {
            use super::*;
            $(
                #[tokio::test]
                async fn $store() {
                    super::$scenario($kind).await
                }
            )+
        }
    };
}

per_store!(
    every_algorithm_admits_its_limit_and_then_refuses:
    memory => Kind::Memory,
    shared_memory => Kind::SharedMemory,
    redis => Kind::Redis,
    redis_cluster => Kind::RedisCluster,
);
per_store!(
    a_rejected_request_charges_no_rule:
    memory => Kind::Memory,
    shared_memory => Kind::SharedMemory,
    redis => Kind::Redis,
    redis_cluster => Kind::RedisCluster,
);
per_store!(
    concurrency_slots_come_back_when_the_request_ends:
    memory => Kind::Memory,
    shared_memory => Kind::SharedMemory,
    redis => Kind::Redis,
    redis_cluster => Kind::RedisCluster,
);
per_store!(
    instances_sharing_a_store_admit_the_limit_exactly:
    shared_memory => Kind::SharedMemory,
    redis => Kind::Redis,
    redis_cluster => Kind::RedisCluster,
);

/// Each rate algorithm admits its limit, then refuses, telling the client when to come back;
/// `remaining` counts down on the way.
async fn every_algorithm_admits_its_limit_and_then_refuses(kind: Kind) {
    let backend = Backend::start(kind);
    let rules = [
        rule("fixed", "fixed_window", 3, ""),
        rule("log", "sliding_window_log", 3, ""),
        rule("counter", "sliding_window_counter", 3, ""),
        rule("tokens", "token_bucket", 3, "burst = 3"),
        rule("leaky", "leaky_bucket", 3, "burst = 3"),
    ]
    .concat();
    let config = backend.config(&rules, 1);
    let limiter = backend.limiter(&config).await;
    for name in ["fixed", "log", "counter", "tokens", "leaky"] {
        for left in (0..3).rev() {
            let outcome = request(&limiter, &config, &[name], 1).await;
            assert!(admitted(&outcome), "{kind:?} {name}: admitted");
            assert_eq!(
                outcome.applied[0].decision.remaining, left,
                "{kind:?} {name}: remaining"
            );
        }
        let outcome = request(&limiter, &config, &[name], 1).await;
        match &outcome.verdict {
            Verdict::Reject {
                retry_after, rules, ..
            } => {
                assert_eq!(rules.len(), 1, "{kind:?} {name}");
                assert!(
                    *retry_after > Duration::ZERO,
                    "{kind:?} {name}: retry after"
                );
            }
            other => panic!("{kind:?} {name}: the fourth is refused, got {other:?}"),
        }
        // Another client has a counter of its own.
        assert!(
            admitted(&request(&limiter, &config, &[name], 2).await),
            "{kind:?} {name}: another client"
        );
    }
}

/// A request that one rule rejects charges no other rule, whether they are decided in the
/// same store or one in process and one in the store.
async fn a_rejected_request_charges_no_rule(kind: Kind) {
    let backend = Backend::start(kind);
    let rules = [
        rule("wide", "token_bucket", 5, "burst = 5"),
        rule("narrow", "fixed_window", 2, ""),
        scoped("near", "sliding_window_log", 5, "local", ""),
    ]
    .concat();
    let config = backend.config(&rules, 1);
    let limiter = backend.limiter(&config).await;
    let all = ["wide", "narrow", "near"];
    assert_eq!(count_admitted(&limiter, &config, &all, 1, 6).await, 2);
    // The four refused requests charged neither the wide rule nor the local one: each has
    // 5 - 2 left.
    for name in ["wide", "near"] {
        assert_eq!(
            count_admitted(&limiter, &config, &[name], 1, 5).await,
            3,
            "{kind:?} {name}: what is left after the refusals"
        );
    }
}

/// Concurrency slots are held while the request runs and come back when it ends.
async fn concurrency_slots_come_back_when_the_request_ends(kind: Kind) {
    let backend = Backend::start(kind);
    let config = backend.config(&rule("inflight", "concurrency", 2, ""), 1);
    let limiter = backend.limiter(&config).await;
    let first = request(&limiter, &config, &[], 1).await;
    let second = request(&limiter, &config, &[], 1).await;
    assert!(admitted(&first) && admitted(&second), "{kind:?}");
    assert!(!first.slots.is_empty(), "{kind:?}: a slot is held");
    assert!(
        !admitted(&request(&limiter, &config, &[], 1).await),
        "{kind:?}: a third in flight is refused"
    );
    drop(first);
    // A shared store releases in the background: the slot comes back within a round trip.
    let mut back = false;
    for _ in 0..100 {
        let outcome = request(&limiter, &config, &[], 1).await;
        if admitted(&outcome) {
            back = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(back, "{kind:?}: the released slot is taken again");
    drop(second);
}

/// Two instances on one store never admit more than the limit together, exactly as one
/// would: with exact checks and with quota leases.
async fn instances_sharing_a_store_admit_the_limit_exactly(kind: Kind) {
    let backend = Backend::start(kind);
    for (name, extra) in [
        ("exact", ""),
        ("leased", "lease = 4\nlease_ttl = \"1h\""),
        ("auto-leased", "lease = \"auto\"\nlease_ttl = \"1h\""),
    ] {
        let config = backend.config(&rule(name, "fixed_window", 10, extra), 2);
        let a = backend.limiter(&config).await;
        let b = backend.limiter(&config).await;
        let mut admitted_count = 0;
        for i in 0..30 {
            let limiter = if i % 3 == 0 { &a } else { &b };
            if admitted(&request(limiter, &config, &[], 1).await) {
                admitted_count += 1;
            }
        }
        assert_eq!(admitted_count, 10, "{kind:?} {name}");
    }
}

/// The rules of the failure-mode scenarios: one of each `on_store_error`.
fn failure_rules() -> String {
    [
        rule("open", "fixed_window", 4, "on_store_error = \"open\""),
        rule("closed", "fixed_window", 4, "on_store_error = \"closed\""),
        rule("fallback", "fixed_window", 4, "on_store_error = \"local\""),
    ]
    .concat()
}

/// With the store down: `open` admits, `closed` answers 503, `local` decides in process with
/// `limit / instances`.
async fn assert_failure_modes(kind: Kind, limiter: &Limiter, config: &Config) {
    assert!(!limiter.store().is_up(), "{kind:?}: the store is down");
    assert_eq!(
        count_admitted(limiter, config, &["open"], 1, 8).await,
        8,
        "{kind:?}: open admits all"
    );
    let outcome = request(limiter, config, &["closed"], 1).await;
    assert!(
        matches!(outcome.verdict, Verdict::Unavailable { .. }),
        "{kind:?}: closed refuses with 503, got {:?}",
        outcome.verdict
    );
    assert_eq!(
        count_admitted(limiter, config, &["fallback"], 1, 8).await,
        2,
        "{kind:?}: local decides 4 / 2 instances in process"
    );
}

/// A Redis that goes away mid-run: every failure mode, on a real server stopped under the
/// limiter (the memory stores cannot fail).
#[tokio::test]
async fn a_redis_that_stops_applies_each_failure_mode() {
    let mut backend = Backend::start(Kind::Redis);
    let config = backend.config(&failure_rules(), 2);
    let limiter = backend.limiter(&config).await;
    assert!(admitted(&request(&limiter, &config, &["closed"], 1).await));
    backend.redis.as_mut().expect("redis").stop();
    // The first failed call marks the store down.
    let _ = request(&limiter, &config, &["open"], 9).await;
    assert_failure_modes(Kind::Redis, &limiter, &config).await;
}

/// A Redis Cluster whose seed nodes nobody listens on: every failure mode.
#[tokio::test]
async fn an_unreachable_cluster_applies_each_failure_mode() {
    let dead: Vec<String> = (0..3)
        .map(|_| format!("redis://{}", common::free_addr()))
        .collect();
    let store = format!("[store]\nbackend = \"redis-cluster\"\nurls = {dead:?}\ntimeout = \"200ms\"\ninstances = 2\n");
    let config = config(&store, &failure_rules());
    let limiter = Limiter::new(&config.store);
    let _ = request(&limiter, &config, &["open"], 9).await;
    assert_failure_modes(Kind::RedisCluster, &limiter, &config).await;
}
