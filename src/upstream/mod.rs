//! Upstreams at run time: which target a request goes to, and whether a target may get traffic.
//!
//! Built on `pingora-load-balancing`: its `LoadBalancer` selects (round robin, random,
//! Ketama consistent hashing), its `HealthRegistry` keeps each target's active health and its
//! `TcpHealthCheck` / `HttpHealthCheck` probe them; our [`discovery`] feeds it the addresses
//! that DNS names resolve to, re-resolved in the background ([`service`]) and never on the
//! request path. What the crate has no notion of is ours: least-requests selection (it has no
//! in-flight counts), passive outlier ejection from live traffic, and the per-target record
//! shown by `GET /upstreams`.
//!
//! State that must survive a hot reload (each target's health, its passive-failure count, the
//! resolved addresses) lives in [`pools`], keyed by upstream name and target, not in the config
//! a reload replaces. This module reads no config and knows no gateway: it is handed validated
//! [`Settings`], and the gateway attaches one [`Pool`] per configured upstream when it puts a
//! config in force (and tells [`service`] which pools are in force).
//!
//! - [`settings`]: the validated `[[upstreams]]` settings (what `check` accepts).
//! - [`discovery`]: resolvers and the `ServiceDiscovery` over their results.
//! - [`health`]: active checks, wrapped to record their last result.
//! - [`tls`]: PEM loading and the `HttpPeer` a request connects with.
//! - [`service`]: the background task (resolve, update, check).
//! - [`metrics`]: per-upstream and per-target metrics.

pub mod discovery;
pub mod health;
pub mod metrics;
pub mod protect;
pub mod service;
pub mod settings;
pub mod tls;

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use futures::FutureExt;
use parking_lot::Mutex;
use pingora::lb::selection::{Consistent, Random, RoundRobin};
use pingora::lb::{Backend, Backends, HealthRegistry, LoadBalancer};

pub use settings::{Balance, Settings, Target, Targets};

/// Bound on the candidates one selection looks at (Ketama walks the ring linearly).
const MAX_ITERATIONS: usize = 256;

/// One target address with what the request path needs to know about it. Carried in the
/// `Backend`'s extensions so the selected backend leads straight to its state.
#[derive(Debug)]
pub struct TargetInfo {
    /// The target as configured (`host:port`).
    pub name: Arc<str>,
    /// The host part: the default SNI.
    pub host: Arc<str>,
    /// The address it resolved to.
    pub addr: SocketAddr,
    /// `addr` as text: the `target` label of metrics.
    pub label: Arc<str>,
    /// Live state, shared by every config generation that has this target.
    pub state: Arc<TargetState>,
}

/// A target's live state: in-flight requests, passive failures, the last active check.
#[derive(Debug, Default)]
pub struct TargetState {
    /// Requests sent to it and not finished, in per-thread shards: every proxied request
    /// moves it twice, only least_requests and `/upstreams` read it.
    pub in_flight: crate::metrics::shards::ShardedU64,
    /// 5xx answers, connect failures and timeouts in a row (passive outlier detection).
    failures: AtomicU32,
    /// Milliseconds since [`epoch`] until which it is ejected (0: not ejected).
    ejected_until_ms: AtomicU64,
    /// The last active check: when, whether it passed, why not.
    pub last_check: Mutex<Option<CheckResult>>,
    /// Its metric handles, looked up on first use.
    metrics: std::sync::OnceLock<metrics::TargetMetrics>,
}

/// One active health check's outcome.
#[derive(Debug, Clone)]
pub struct CheckResult {
    /// Whether the target passed.
    pub ok: bool,
    /// Why it failed (empty when it passed).
    pub error: String,
    /// When it ran.
    pub at: std::time::SystemTime,
}

/// The process clock passive ejection counts from.
fn epoch() -> Instant {
    static EPOCH: LazyLock<Instant> = LazyLock::new(Instant::now);
    *EPOCH
}

fn now_ms() -> u64 {
    epoch().elapsed().as_millis() as u64 + 1
}

impl TargetInfo {
    /// Exports this target's response and duration series of `upstream` at 0 before its
    /// first attempt, so a panel or an `increase()` alert sees the first one.
    pub fn export(&self, upstream: &str) {
        self.state
            .metrics
            .get_or_init(|| metrics::TargetMetrics::new(upstream, &self.label));
    }

    /// Counts one attempt on this target of `upstream`: its status (`None`: no response) and
    /// time to the response header.
    pub fn count(&self, upstream: &str, status: Option<u16>, took: Option<Duration>) {
        self.state
            .metrics
            .get_or_init(|| metrics::TargetMetrics::new(upstream, &self.label))
            .count(status, took);
    }
}

impl TargetState {
    /// Whether passive detection has it ejected now.
    pub fn ejected(&self) -> bool {
        // A target never ejected (or cleared) reads no clock: this runs for every request.
        let until = self.ejected_until_ms.load(Ordering::Relaxed);
        until != 0 && until > now_ms()
    }

    /// Seconds until the ejection ends (0 when not ejected).
    fn ejected_for(&self) -> Duration {
        let until = self.ejected_until_ms.load(Ordering::Relaxed);
        Duration::from_millis(until.saturating_sub(now_ms()))
    }

    /// An active check passed: an ejected target is given traffic again.
    pub(crate) fn clear_ejection(&self) {
        self.ejected_until_ms.store(0, Ordering::Relaxed);
        self.failures.store(0, Ordering::Relaxed);
    }
}

/// The state of one upstream kept across reloads.
struct Shared {
    /// What the health registry was built for: a reload that changes the check (or TLS) gets a
    /// new registry, one that does not keeps every target's health.
    fingerprint: String,
    registry: Arc<HealthRegistry>,
    /// Per address: survives reloads for targets that stay.
    states: Mutex<HashMap<SocketAddr, Arc<TargetState>>>,
}

impl Shared {
    fn state(&self, addr: SocketAddr) -> Arc<TargetState> {
        self.states.lock().entry(addr).or_default().clone()
    }
}

/// The selector of one upstream, by `balance`.
enum Balancer {
    RoundRobin(LoadBalancer<RoundRobin>),
    Random(LoadBalancer<Random>),
    Consistent(LoadBalancer<Consistent>),
}

impl Balancer {
    fn backends(&self) -> &Backends {
        match self {
            Balancer::RoundRobin(lb) => lb.backends(),
            Balancer::Random(lb) => lb.backends(),
            Balancer::Consistent(lb) => lb.backends(),
        }
    }

    async fn update(&self) -> pingora::Result<()> {
        match self {
            Balancer::RoundRobin(lb) => lb.update().await,
            Balancer::Random(lb) => lb.update().await,
            Balancer::Consistent(lb) => lb.update().await,
        }
    }
}

/// One upstream of one config generation: its settings and selector, over [`Shared`] state.
pub struct Pool {
    /// The upstream's name.
    pub name: Arc<str>,
    /// Its validated settings.
    pub settings: Arc<Settings>,
    shared: Arc<Shared>,
    balancer: Balancer,
    /// Rotates least-requests ties so equal targets share the load.
    ties: AtomicUsize,
    /// Separates this upstream's pooled connections from every other's (see [`tls::peer`]).
    pub group_key: u64,
    /// `floodgate_upstream_duration_seconds{upstream}`, resolved once (not per request).
    pub duration: crate::metrics::shards::Histogram,
    /// The adaptive concurrency limit and fair queue (`[upstreams.protect]`), kept across
    /// reloads.
    pub protect: Option<Arc<protect::Guard>>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool").field("name", &self.name).finish()
    }
}

/// Whether `target` may take this attempt: not already `tried` by the request and not
/// ejected (readiness by health check is the balancer's to say).
fn usable(target: &TargetInfo, tried: &[SocketAddr]) -> bool {
    !tried.contains(&target.addr) && !target.state.ejected()
}

fn info(b: &Backend) -> Option<&Arc<TargetInfo>> {
    b.ext.get::<Arc<TargetInfo>>()
}

impl Pool {
    fn new(name: Arc<str>, settings: Arc<Settings>, shared: Arc<Shared>) -> Pool {
        let discovery = discovery::Discovery::new(settings.clone(), shared.clone());
        let backends =
            Backends::new_with_health_registry(Box::new(discovery), shared.registry.clone());
        let balancer = match settings.balance {
            Balance::RoundRobin | Balance::LeastRequests => {
                Balancer::RoundRobin(LoadBalancer::from_backends(backends))
            }
            Balance::Random => Balancer::Random(LoadBalancer::from_backends(backends)),
            Balance::Consistent => Balancer::Consistent(LoadBalancer::from_backends(backends)),
        };
        let group_key = {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            (&*name, settings.health_fingerprint()).hash(&mut h);
            h.finish()
        };
        let duration = crate::metrics::metrics()
            .upstream_seconds
            .with_label_values(&[&*name]);
        let protect = match &settings.protect {
            Some(p) => Some(protect::attach(&name, p)),
            None => {
                protect::forget(&name);
                None
            }
        };
        let pool = Pool {
            protect,
            duration,
            group_key,
            name,
            settings,
            shared,
            balancer,
            ties: AtomicUsize::new(0),
        };
        // Discovery reads the resolver's cache and never waits, so the first membership is in
        // place before any request selects.
        let _ = pool.balancer.update().now_or_never();
        pool
    }

    /// Re-reads the resolved addresses into the selector (called by [`service`]).
    pub async fn refresh(&self) {
        if let Err(e) = self.balancer.update().await {
            tracing::warn!(upstream = %self.name, error = %e, "upstream discovery failed");
        }
    }

    /// Runs one active health-check pass over every target (called by [`service`]).
    pub async fn check(&self) {
        self.shared.registry.run_health_check(true).await;
    }

    /// Every target address now known, with whether it may get traffic.
    pub fn targets(&self) -> Vec<(Arc<TargetInfo>, bool)> {
        let backends = self.balancer.backends();
        backends
            .get_backend()
            .iter()
            .filter_map(|b| {
                let i = info(b)?;
                Some((i.clone(), self.ready(backends, b) && !i.state.ejected()))
            })
            .collect()
    }

    /// Whether a target other than those `tried` may get traffic now (worth a retry).
    pub fn has_other(&self, tried: &[SocketAddr]) -> bool {
        let backends = self.balancer.backends();
        backends
            .get_backend()
            .iter()
            .any(|b| self.ready(backends, b) && info(b).is_some_and(|i| usable(i, tried)))
    }

    /// Picks the target for an attempt: healthy, not ejected, not `tried` by this request.
    /// `key` feeds consistent hashing. `None`: nothing is available.
    pub fn select(&self, key: &[u8], tried: &[SocketAddr]) -> Option<Arc<TargetInfo>> {
        let accept = |b: &Backend, ready: bool| ready && info(b).is_some_and(|i| usable(i, tried));
        let chosen = match (&self.balancer, self.settings.balance) {
            (Balancer::RoundRobin(lb), Balance::LeastRequests) => {
                return self.least_requests(lb, tried);
            }
            // The RoundRobin balancer is built for round_robin and least_requests only.
            (Balancer::RoundRobin(lb), _) => return self.round_robin(lb, tried),
            (Balancer::Random(lb), _) => lb.select_with(key, MAX_ITERATIONS, accept),
            (Balancer::Consistent(lb), _) => lb.select_with(key, MAX_ITERATIONS, accept),
        };
        chosen.as_ref().and_then(info).cloned()
    }

    /// Whether `b` passes its active health check (Pingora's readiness). Without a check every
    /// target does (Pingora starts each healthy and floodgate never disables one), and the
    /// lookup is skipped: a SipHash of the backend and one of its key per target looked at, on
    /// every proxied request. Pingora's own `select_with` (random,
    /// consistent) still asks.
    fn ready(&self, backends: &Backends, b: &Backend) -> bool {
        self.settings.health_check.is_none() || backends.ready(b)
    }

    /// Weighted round robin over the available targets, without allocating: the crate's
    /// `select_with` builds a set of the backends it has tried and clones the chosen one on
    /// every request. A target of
    /// weight w is chosen w times per turn; one that is not available passes its turn on.
    fn round_robin(
        &self,
        lb: &LoadBalancer<RoundRobin>,
        tried: &[SocketAddr],
    ) -> Option<Arc<TargetInfo>> {
        let backends = lb.backends();
        let all = backends.get_backend();
        let total: usize = all.iter().map(|b| b.weight.max(1)).sum();
        if total == 0 {
            return None;
        }
        // A retry does not take a turn: were it to, a target that fails would get the first
        // attempt of every other request (turns advance two per failed request), and with
        // two targets one dead, 19 of 20 requests tried the dead one first. A lone target
        // takes no turn either: the count is an add on a line every thread writes.
        let turn = if all.len() == 1 {
            0
        } else if tried.is_empty() {
            self.ties.fetch_add(1, Ordering::Relaxed)
        } else {
            self.ties.load(Ordering::Relaxed)
        };
        let mut turn = turn % total;
        let mut first = 0;
        for (i, b) in all.iter().enumerate() {
            let w = b.weight.max(1);
            if turn < w {
                first = i;
                break;
            }
            turn -= w;
        }
        let chosen = self
            .available(backends, &all, first, tried)
            .next()
            .map(|(_, i)| i.clone());
        chosen
    }

    /// The available target with the fewest requests in flight per unit of weight; ties
    /// rotate. Written here because `pingora-load-balancing` selects without knowing what is
    /// in flight.
    fn least_requests(
        &self,
        lb: &LoadBalancer<RoundRobin>,
        tried: &[SocketAddr],
    ) -> Option<Arc<TargetInfo>> {
        let backends = lb.backends();
        let all = backends.get_backend();
        let start = self.ties.fetch_add(1, Ordering::Relaxed) % all.len().max(1);
        let mut best: Option<(usize, &Arc<TargetInfo>)> = None;
        for (b, i) in self.available(backends, &all, start, tried) {
            let load = i.state.in_flight.get() as usize * 1000 / b.weight.max(1);
            if best.is_none_or(|(l, _)| load < l) {
                best = Some((load, i));
            }
        }
        best.map(|(_, i)| i.clone())
    }

    /// The targets a request may go to (ready, not ejected, not tried yet), in turn from
    /// `all[start]` around: where round robin and least requests choose.
    fn available<'a>(
        &'a self,
        backends: &'a Backends,
        all: &'a std::collections::BTreeSet<Backend>,
        start: usize,
        tried: &'a [SocketAddr],
    ) -> impl Iterator<Item = (&'a Backend, &'a Arc<TargetInfo>)> + 'a {
        all.iter()
            .cycle()
            .skip(start)
            .take(all.len())
            .filter(move |b| self.ready(backends, b))
            .filter_map(|b| Some((b, info(b)?)))
            .filter(move |(_, i)| usable(i, tried))
    }

    /// Seconds a client should wait when no target is available: until the first ejection
    /// ends, or one health-check interval.
    pub fn retry_after(&self) -> u64 {
        let ejected = self
            .shared
            .states
            .lock()
            .values()
            .map(|s| s.ejected_for())
            .filter(|d| !d.is_zero())
            .min();
        let wait = ejected
            .or(self.settings.health_check.as_ref().map(|h| h.interval))
            .unwrap_or(Duration::from_secs(1));
        wait.as_secs_f64().ceil().max(1.0) as u64
    }

    /// Passive outlier detection: a 5xx, a connect failure or a timeout from `target`.
    pub fn failed(&self, target: &TargetInfo) {
        let Some(p) = &self.settings.passive else {
            return;
        };
        let n = target.state.failures.fetch_add(1, Ordering::Relaxed) + 1;
        if n >= p.consecutive_failures && !target.state.ejected() {
            target.state.failures.store(0, Ordering::Relaxed);
            target
                .state
                .ejected_until_ms
                .store(now_ms() + p.eject.as_millis() as u64, Ordering::Relaxed);
            tracing::warn!(
                upstream = %self.name,
                target = %target.name,
                addr = %target.addr,
                failures = n,
                eject = ?p.eject,
                "upstream target ejected after consecutive failures"
            );
        }
    }

    /// Passive outlier detection: a good answer from `target` resets its failure count.
    pub fn succeeded(&self, target: &TargetInfo) {
        // Read first: a store on every request would write the line every thread reads.
        if self.settings.passive.is_some() && target.state.failures.load(Ordering::Relaxed) != 0 {
            target.state.failures.store(0, Ordering::Relaxed);
        }
    }
}

/// Every upstream's [`Shared`] state by name: what a reload keeps.
pub struct Pools {
    shared: Mutex<HashMap<Arc<str>, Arc<Shared>>>,
}

/// The process-wide [`Pools`].
pub fn pools() -> &'static Pools {
    static POOLS: LazyLock<Pools> = LazyLock::new(|| Pools {
        shared: Mutex::new(HashMap::new()),
    });
    &POOLS
}

impl Pools {
    /// Builds the pool of upstream `name` for one config generation, over the state a previous
    /// generation left for the same name (health, passive state), unless its health check or
    /// TLS changed. Does no I/O.
    pub fn attach(&self, name: &Arc<str>, settings: &Arc<Settings>) -> Arc<Pool> {
        let fingerprint = settings.health_fingerprint();
        let shared = {
            let mut map = self.shared.lock();
            match map.get(name) {
                Some(s) if s.fingerprint == fingerprint => s.clone(),
                _ => {
                    let registry = HealthRegistry::new();
                    if let Some(hc) = health::build(name, settings) {
                        registry.set_health_check(hc);
                    }
                    let s = Arc::new(Shared {
                        fingerprint,
                        registry: Arc::new(registry),
                        states: Mutex::new(HashMap::new()),
                    });
                    map.insert(name.clone(), s.clone());
                    s
                }
            }
        };
        Arc::new(Pool::new(name.clone(), settings.clone(), shared))
    }

    /// Forgets the state of upstreams no longer configured.
    pub fn retain(&self, names: &BTreeSet<&str>) {
        self.shared.lock().retain(|k, _| names.contains(&**k));
        protect::retain(names);
    }
}

/// One line describing an upstream's balancing, TLS and health checks (for `check` and
/// `/diagram`).
pub fn summary(settings: &Settings) -> String {
    use crate::text::humantime;
    let mut out = format!(
        "{} target(s), {}",
        settings.targets.len(),
        settings.balance.as_str()
    );
    match &settings.tls {
        Some(t) => {
            out.push_str(", TLS");
            if let Some(sni) = &t.sni {
                out.push_str(&format!(" sni {sni}"));
            }
            if !t.verify {
                out.push_str(" UNVERIFIED");
            } else if t.ca.is_some() {
                out.push_str(" (ca_file)");
            }
            if t.client.is_some() {
                out.push_str(" mTLS");
            }
            if settings.http2 {
                out.push_str(" h2");
            }
        }
        None => out.push_str(", plaintext"),
    }
    match &settings.health_check {
        Some(h) => {
            out.push_str(&format!(", {} check", h.kind.as_str()));
            if h.kind == settings::CheckKind::Http {
                out.push_str(&format!(" {}", h.path));
            }
            out.push_str(&format!(
                " every {} (up after {}, down after {})",
                humantime(h.interval),
                h.healthy_threshold,
                h.unhealthy_threshold
            ));
        }
        None => out.push_str(", no health check"),
    }
    if let Some(p) = &settings.passive {
        out.push_str(&format!(
            ", ejected {} after {} failures",
            humantime(p.eject),
            p.consecutive_failures
        ));
    }
    if let Some(p) = &settings.protect {
        out.push_str(&format!(
            ", adaptive limit {}..{} (queue {}, {})",
            p.min_limit,
            p.max_limit,
            p.max_queue,
            humantime(p.queue_timeout)
        ));
    }
    out
}

/// `GET /upstreams`: every target of every upstream (the pools of the config in force, in file
/// order) with its addresses, health, last check and requests in flight.
pub fn status_json(pools: impl IntoIterator<Item = Arc<Pool>>) -> serde_json::Value {
    let list: Vec<serde_json::Value> = pools
        .into_iter()
        .map(|pool| {
            let live = pool.targets();
            let targets: Vec<serde_json::Value> = pool
                .settings
                .targets
                .iter()
                .map(|t| {
                    let resolution = discovery::resolution(t);
                    let addrs: Vec<serde_json::Value> = live
                        .iter()
                        .filter(|(i, _)| i.name == t.name)
                        .map(|(i, up)| {
                            let check = i.state.last_check.lock().clone();
                            serde_json::json!({
                                "addr": i.addr.to_string(),
                                "healthy": up,
                                "ejected": i.state.ejected(),
                                "in_flight": i.state.in_flight.get(),
                                "last_check": check.map(|c| serde_json::json!({
                                    "ok": c.ok,
                                    "error": (!c.ok).then_some(c.error),
                                    "at_unix": c.at.duration_since(std::time::UNIX_EPOCH)
                                        .map_or(0, |d| d.as_secs()),
                                })),
                            })
                        })
                        .collect();
                    let healthy = live.iter().any(|(i, up)| i.name == t.name && *up);
                    serde_json::json!({
                        "target": &*t.name,
                        "weight": t.weight,
                        "healthy": healthy,
                        "resolve_error": resolution.and_then(|r| r.error),
                        "addrs": addrs,
                    })
                })
                .collect();
            serde_json::json!({
                "name": &*pool.name,
                "balance": pool.settings.balance.as_str(),
                "tls": pool.settings.tls.is_some(),
                "health_check": pool.settings.health_check.as_ref().map(|h| h.kind.as_str()),
                "protect": pool.protect.as_ref().map(|g| g.status_json()),
                "targets": targets,
            })
        })
        .collect();
    serde_json::json!({ "upstreams": list })
}

#[cfg(test)]
mod tests {
    use super::settings::*;
    use super::*;

    fn settings(balance: Balance, ports: &[u16]) -> Arc<Settings> {
        let targets = ports
            .iter()
            .map(|p| Target {
                name: format!("127.0.0.1:{p}").into(),
                host: "127.0.0.1".into(),
                port: *p,
                weight: 1,
                ip: Some("127.0.0.1".parse().unwrap()),
            })
            .collect();
        Arc::new(Settings {
            targets: Targets::new(targets).unwrap(),
            balance,
            hash_key: Vec::new(),
            tls: None,
            http2: false,
            host_header: None,
            connect_timeout: Duration::from_secs(1),
            read_timeout: Duration::from_secs(1),
            write_timeout: Duration::from_secs(1),
            idle_timeout: Duration::from_secs(1),
            timeout: Duration::from_secs(1),
            tunnel_timeout: Duration::from_secs(1),
            retries: 1,
            resolve_interval: Duration::from_secs(1),
            health_check: None,
            passive: Some(Passive {
                consecutive_failures: 2,
                eject: Duration::from_secs(60),
            }),
            protect: None,
        })
    }

    #[test]
    fn consistent_hashing_sends_a_key_to_one_target() {
        let pool = pools().attach(
            &Arc::from("unit-consistent"),
            &settings(Balance::Consistent, &[7101, 7102, 7103]),
        );
        for key in [&b"1.2.3.4"[..], b"acme", b"globex"] {
            let first = pool.select(key, &[]).unwrap().addr;
            for _ in 0..20 {
                assert_eq!(pool.select(key, &[]).unwrap().addr, first);
            }
            // A retry goes elsewhere.
            assert_ne!(pool.select(key, &[first]).unwrap().addr, first);
        }
    }

    #[test]
    fn least_requests_prefers_the_idle_target_and_rotates_ties() {
        let pool = pools().attach(
            &Arc::from("unit-least"),
            &settings(Balance::LeastRequests, &[7201, 7202]),
        );
        let a = pool.select(b"", &[]).unwrap();
        let b = pool.select(b"", &[]).unwrap();
        assert_ne!(a.addr, b.addr, "ties rotate");
        a.state.in_flight.inc_by(3);
        for _ in 0..5 {
            assert_eq!(pool.select(b"", &[]).unwrap().addr, b.addr);
        }
        a.state.in_flight.dec_by(3);
    }

    #[test]
    fn passive_failures_eject_and_a_reload_keeps_the_ejection() {
        let name: Arc<str> = Arc::from("unit-passive");
        let s = settings(Balance::RoundRobin, &[7301, 7302]);
        let pool = pools().attach(&name, &s);
        let sick = pool.select(b"", &[]).unwrap();
        pool.failed(&sick);
        assert!(!sick.state.ejected(), "one failure is not enough");
        pool.failed(&sick);
        assert!(sick.state.ejected());
        for _ in 0..4 {
            assert_ne!(pool.select(b"", &[]).unwrap().addr, sick.addr);
        }
        assert!(pool.retry_after() >= 59);
        // A new config generation of the same upstream keeps the target's state.
        let reloaded = pools().attach(&name, &s);
        for _ in 0..4 {
            assert_ne!(reloaded.select(b"", &[]).unwrap().addr, sick.addr);
        }
        // Both ejected or tried: nothing.
        let other = reloaded.select(b"", &[]).unwrap();
        assert!(reloaded.select(b"", &[other.addr]).is_none());
        sick.state.clear_ejection();
        assert!(reloaded.has_other(&[other.addr]));
    }
}
