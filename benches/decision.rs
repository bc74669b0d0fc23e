//! What one rate-limit decision costs on the in-process store, per algorithm, and what one
//! active key costs in memory.
//!
//! `cargo bench --bench decision` (about half a minute). Time is a `ManualClock` moved by 1 µs
//! per decision, so that every run sees the same traffic: 1 M decisions per second of clock
//! time against limits of 2 M per second, hence every request is admitted and charged (the
//! expensive path). The production clock's own cost is measured apart (`clock/monotonic`):
//! add it to a decision for the cost of `MemoryStore::new`.
//!
//! The `engine/*` cases measure the whole `Limiter::decide` around the stores (splitting the
//! rules, peeking, leases, the verdict, the counters): on the memory backend, and against an
//! in-bench shared store that answers at once (so only the engine's own work is measured).
//!
//! The memory measurement (printed first, only under `cargo bench`) inserts 1,000,000
//! token-bucket keys and divides the growth of the resident set by that.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion};
use floodgate::limiter::engine::{Limiter, Verdict};
use floodgate::limiter::lease::{Lease, LeaseSize};
use floodgate::limiter::memory::{Clock, ManualClock, MemoryStore, MonotonicClock};
use floodgate::limiter::settings::{Backend, Store};
use floodgate::limiter::store::{Grant, SharedStore, StoreError, StoreStatus};
use floodgate::limiter::{Algorithm, Check, Decision, Limit};
use floodgate::rules::{Policy, Scope};

/// Distinct keys of the "many keys" case: more than fit in the CPU caches.
const MANY_KEYS: u64 = 100_000;

fn check(rule: &str, key: u64, algorithm: Algorithm) -> Check {
    Check {
        rule: Arc::from(rule),
        counter: key,
        // 2 M a second: never reached at 1 M decisions per second of clock time.
        limit: Limit::police(algorithm, 200_000, Duration::from_millis(100), 200_000),
        cost: 1,
    }
}

fn new_store() -> (MemoryStore, Arc<ManualClock>) {
    store_of(1_000_000)
}

fn store_of(max_keys: usize) -> (MemoryStore, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(1_700_000_000_000_000_000));
    (MemoryStore::with_clock(max_keys, clock.clone()), clock)
}

/// One decision (for concurrency: a decision and its release, since slots must come back).
fn decide(store: &MemoryStore, check: &Check) {
    let decisions = store.decide(std::slice::from_ref(check));
    if check.limit.algorithm() == Algorithm::Concurrency {
        store.release(check);
    }
    black_box(decisions);
}

fn decisions(c: &mut Criterion) {
    let mut group = c.benchmark_group("decision");
    for algorithm in Algorithm::ALL {
        let (store, clock) = new_store();
        let hot = check("hot", 42, algorithm);
        group.bench_function(BenchmarkId::new("one_key", algorithm.as_str()), |b| {
            b.iter(|| {
                clock.advance(Duration::from_micros(1));
                decide(&store, &hot);
            })
        });

        let (store, clock) = new_store();
        let mut many = check("many", 0, algorithm);
        group.bench_function(BenchmarkId::new("100k_keys", algorithm.as_str()), |b| {
            b.iter(|| {
                clock.advance(Duration::from_micros(1));
                many.counter = (many.counter + 1) % MANY_KEYS;
                decide(&store, &many);
            })
        });
    }

    // A typical request: three rules on two identities, decided and charged together.
    let (store, clock) = new_store();
    let request = [
        check("per-ip", 1, Algorithm::TokenBucket),
        check("per-key", 2, Algorithm::SlidingWindowCounter),
        check("per-user", 3, Algorithm::FixedWindow),
    ];
    group.bench_function("three_rules", |b| {
        b.iter(|| {
            clock.advance(Duration::from_micros(1));
            black_box(store.decide(&request));
        })
    });
    group.finish();

    let clock = MonotonicClock::new();
    c.bench_function("clock/monotonic", |b| b.iter(|| black_box(clock.now_ns())));
}

/// A rule for the engine cases: limits no bench run reaches on the production clock.
fn policy(name: &str, algorithm: Algorithm, scope: Scope, lease: Option<Lease>) -> Arc<Policy> {
    let limit = Limit::police(algorithm, 1 << 40, Duration::from_secs(1), 1 << 40);
    Arc::new(Policy {
        lease,
        ..Policy::with_defaults(name, limit, scope)
    })
}

/// A request's applying rules, each with its check on counter `key`.
fn applying(rules: &[Arc<Policy>], key: u64) -> Vec<(Arc<Policy>, Check)> {
    rules
        .iter()
        .map(|rule| {
            let check = Check {
                rule: rule.name.clone(),
                counter: key,
                limit: rule.limit.clone(),
                cost: rule.cost,
            };
            (rule.clone(), check)
        })
        .collect()
}

/// A shared store that admits everything at once and leases every permit asked for: what is
/// left to measure is the engine.
struct Instant0;

#[async_trait::async_trait]
impl SharedStore for Instant0 {
    async fn decide(
        &self,
        checks: &[Check],
        _holder: u64,
        _timeout: Duration,
    ) -> Result<Vec<Decision>, StoreError> {
        Ok(checks
            .iter()
            .map(|c| Decision::unlimited(c.limit.limit()))
            .collect())
    }

    async fn decide_leased(
        &self,
        checks: &[Check],
        wants: &[u64],
        _instances: u64,
        _holder: u64,
        _timeout: Duration,
    ) -> Result<Vec<(Decision, Grant)>, StoreError> {
        Ok(checks
            .iter()
            .zip(wants)
            .map(|(c, &want)| {
                let grant = Grant {
                    granted: want.max(c.cost),
                    ..Grant::default()
                };
                (Decision::unlimited(c.limit.limit()), grant)
            })
            .collect())
    }

    async fn release(&self, _checks: &[Check], _holder: u64) {}

    fn status(&self) -> StoreStatus {
        StoreStatus {
            up: true,
            connected: true,
            endpoint: "bench".into(),
            drops_counters: false,
        }
    }
}

fn store_settings(backend: Backend) -> Store {
    Store {
        backend,
        urls: Vec::new(),
        timeout: Duration::from_millis(50),
        key_prefix: String::new(),
        instances: 1,
        max_keys: 1_000_000,
        max_bans: floodgate::limiter::settings::DEFAULT_MAX_BANS,
        connect_timeout: floodgate::limiter::settings::DEFAULT_CONNECT_TIMEOUT,
    }
}

/// `Limiter::decide` for one request, polled to its end (no case here ever waits).
fn decide_once(limiter: &Limiter, applying: Vec<(Arc<Policy>, Check)>, store: &Store) {
    let outcome = futures::executor::block_on(limiter.decide(applying, store));
    assert!(matches!(outcome.verdict, Verdict::Allow { .. }));
    black_box(outcome);
}

fn engine(c: &mut Criterion) {
    let mut group = c.benchmark_group("engine");
    let memory = store_settings(Backend::Memory);
    let limiter = Limiter::with_shared(1_000_000, None);
    let three = [
        policy("e-ip", Algorithm::TokenBucket, Scope::Global, None),
        policy(
            "e-key",
            Algorithm::SlidingWindowCounter,
            Scope::Global,
            None,
        ),
        policy("e-user", Algorithm::FixedWindow, Scope::Global, None),
    ];
    group.bench_function("memory_three_rules", |b| {
        b.iter(|| decide_once(&limiter, applying(&three, 1), &memory))
    });

    let redis = store_settings(Backend::Redis);
    let shared = Limiter::with_shared(1_000_000, Some(Arc::new(Instant0)));
    let mixed = [
        policy("e-local", Algorithm::TokenBucket, Scope::Local, None),
        policy("e-global", Algorithm::FixedWindow, Scope::Global, None),
    ];
    group.bench_function("shared_local_and_global", |b| {
        b.iter(|| decide_once(&shared, applying(&mixed, 1), &redis))
    });

    let lease = Lease {
        size: LeaseSize::Permits(1 << 30),
        ttl: Duration::from_secs(3600),
    };
    let leased = [policy(
        "e-leased",
        Algorithm::TokenBucket,
        Scope::Global,
        Some(lease),
    )];
    group.bench_function("leased_spent_in_process", |b| {
        b.iter(|| decide_once(&shared, applying(&leased, 1), &redis))
    });
    group.finish();
}

/// Resident memory of this process in bytes, from /proc (Linux only).
fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|line| line.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

fn memory_per_key() {
    const KEYS: u64 = 1_000_000;
    // Room to spare: the bound is per shard, and a full shard would evict.
    let (store, _clock) = store_of(2 * KEYS as usize);
    let mut check = check("per-ip", 0, Algorithm::TokenBucket);
    let Some(before) = resident_bytes() else {
        println!("memory: /proc/self/status unreadable, not measured");
        return;
    };
    let started = Instant::now();
    for key in 0..KEYS {
        check.counter = key;
        black_box(store.decide(std::slice::from_ref(&check)));
    }
    let elapsed = started.elapsed();
    let after = resident_bytes().unwrap_or(before);
    let keys = store.len() as u64;
    println!(
        "memory: {keys} token-bucket keys: resident set +{:.1} MiB = {} bytes/key \
         (inserted in {:.0} ms, {} ns/insert, {} evictions)",
        after.saturating_sub(before) as f64 / (1 << 20) as f64,
        after.saturating_sub(before) / keys.max(1),
        elapsed.as_secs_f64() * 1e3,
        elapsed.as_nanos() / u128::from(KEYS),
        store.evictions(),
    );
    // The most a decision pays for sweeping: one pass over one segment (1/16 of a shard).
    let started = Instant::now();
    store.sweep();
    let sweep = started.elapsed();
    println!(
        "sweep: {:.1} ms for {keys} live keys, {:.1} µs per segment pass (64 shards x 16)",
        sweep.as_secs_f64() * 1e3,
        sweep.as_secs_f64() * 1e6 / 1024.0,
    );
}

/// The metrics work the proxy does for every request: the request counter by route and
/// status, the decision-latency histogram, and the upstream-latency histogram. Divided by the
/// proxy's CPU time per request (docs/benchmarks.md), this is the cost of metrics on throughput.
fn metrics_per_request(c: &mut Criterion) {
    let m = floodgate::metrics::metrics();
    c.bench_function("metrics/per_request", |b| {
        b.iter(|| {
            m.requests
                .with_label_values(&[black_box("orders"), black_box("200")])
                .inc();
            m.decision_seconds.observe(black_box(0.000_002));
            m.upstream_seconds
                .with_label_values(&[black_box("orders")])
                .observe(black_box(0.000_4));
        })
    });
}

fn main() {
    // Under `cargo test --benches` (each bench run once as a test) skip the slow measurement.
    if std::env::args().any(|arg| arg == "--bench") {
        memory_per_key();
    }
    let mut criterion = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .configure_from_args();
    decisions(&mut criterion);
    engine(&mut criterion);
    metrics_per_request(&mut criterion);
    criterion.final_summary();
}
