//! The background service that keeps upstreams current, off the request path: it re-resolves
//! DNS names every `resolve_interval`, feeds the addresses to each load balancer, runs the
//! active health checks every `interval`, and publishes the healthy gauge. It follows hot
//! reloads by asking which pools are in force ([`InForce`], the gateway's) on every tick.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::net::ToSocketAddrs;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

use super::discovery::{self, HostsFileResolver, Resolver};
use super::metrics::upstream_metrics;
use super::{pools, Pool, Settings};

/// How often the service looks at what is due (resolutions and checks run on their own
/// intervals; this only bounds how late one starts, and how soon a reload is followed).
const TICK: Duration = Duration::from_millis(100);

/// Longest a resolution may take before it counts as failed.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(5);

/// Which pools are in force: one per configured upstream, in file order. The gateway answers,
/// so this service follows every reload without knowing the config.
pub trait InForce: Send + Sync {
    /// The pools of the config in force now.
    fn pools(&self) -> Vec<Arc<Pool>>;
}

/// The upstream background service.
pub struct UpstreamService {
    /// Whose pools to keep current.
    pub in_force: Arc<dyn InForce>,
    /// How names are resolved.
    pub resolver: Arc<dyn Resolver>,
}

impl UpstreamService {
    /// The service with the system resolver (after `FLOODGATE_HOSTS_FILE`, when set).
    pub fn new(in_force: Arc<dyn InForce>) -> UpstreamService {
        UpstreamService {
            in_force,
            resolver: Arc::new(HostsFileResolver::from_env()),
        }
    }
}

/// What is due for one upstream, and whether its last work is still running.
struct Due {
    /// The pool this was planned for: a reload brings a new one, due at once.
    pool: Arc<Pool>,
    resolve: Instant,
    check: Instant,
    resolving: Arc<AtomicBool>,
    checking: Arc<AtomicBool>,
}

#[async_trait]
impl BackgroundService for UpstreamService {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut due: HashMap<Arc<str>, Due> = HashMap::new();
        let mut published: HashSet<(Arc<str>, Arc<str>)> = HashSet::new();
        loop {
            let in_force = self.in_force.pools();
            let now = Instant::now();
            let names: BTreeSet<&str> = in_force.iter().map(|p| &*p.name).collect();
            pools().retain(&names);
            due.retain(|k, _| names.contains(&**k));
            let mut seen = HashSet::new();
            for pool in &in_force {
                let d = due.entry(pool.name.clone()).or_insert_with(|| Due {
                    pool: pool.clone(),
                    resolve: now,
                    check: now,
                    resolving: Arc::default(),
                    checking: Arc::default(),
                });
                if !Arc::ptr_eq(&d.pool, pool) {
                    // A reload: its targets may hold names not resolved yet.
                    d.pool = pool.clone();
                    d.resolve = now;
                    d.check = now;
                }
                let named = pool.settings.targets.iter().any(|t| t.ip.is_none());
                if named && now >= d.resolve && !d.resolving.swap(true, Ordering::AcqRel) {
                    d.resolve = now + pool.settings.resolve_interval;
                    let (resolver, busy, pool) =
                        (self.resolver.clone(), d.resolving.clone(), pool.clone());
                    tokio::spawn(async move {
                        for t in pool.settings.targets.iter() {
                            let r = tokio::time::timeout(
                                RESOLVE_TIMEOUT,
                                discovery::resolve(&*resolver, &pool.name, t),
                            )
                            .await;
                            if r.is_err() {
                                discovery::record(
                                    &pool.name,
                                    t,
                                    Err(std::io::Error::other("resolution timed out")),
                                );
                            }
                        }
                        pool.refresh().await;
                        busy.store(false, Ordering::Release);
                    });
                }
                if let Some(hc) = &pool.settings.health_check {
                    if now >= d.check && !d.checking.swap(true, Ordering::AcqRel) {
                        d.check = now + hc.interval;
                        let (busy, pool) = (d.checking.clone(), pool.clone());
                        tokio::spawn(async move {
                            pool.check().await;
                            busy.store(false, Ordering::Release);
                        });
                    }
                }
                let gauge = &upstream_metrics().healthy;
                for (t, up) in pool.targets() {
                    t.export(&pool.name);
                    gauge
                        .with_label_values(&[&*pool.name, &*t.label])
                        .set(i64::from(up));
                    seen.insert((pool.name.clone(), t.label.clone()));
                }
            }
            for gone in published.difference(&seen) {
                let _ = upstream_metrics()
                    .healthy
                    .remove_label_values(&[&*gone.0, &*gone.1]);
            }
            published = seen;
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tokio::time::sleep(TICK) => {}
            }
        }
    }
}

/// Resolves every named target of `upstreams` (name and settings of each) once, before the
/// server starts serving and before any pool is attached, so that the first requests find
/// addresses. Bounded: a name still unresolved after `limit` is a warning and a target down
/// until the background service resolves it. Never called by `check`, which does not touch
/// the network.
pub fn prime<'a>(
    upstreams: impl IntoIterator<Item = (&'a Arc<str>, &'a Settings)>,
    limit: Duration,
) {
    let upstreams: Vec<(&Arc<str>, &Settings)> = upstreams.into_iter().collect();
    let (tx, rx) = std::sync::mpsc::channel();
    let mut pending = 0;
    for (name, settings) in &upstreams {
        for t in settings.targets.iter().filter(|t| t.ip.is_none()) {
            let (tx, name, t) = (tx.clone(), Arc::clone(name), t.clone());
            pending += 1;
            std::thread::spawn(move || {
                let answer = match HostsFileResolver::from_env().from_file(&t.host, t.port) {
                    Some(addrs) => Ok(addrs),
                    None => (&*t.host, t.port)
                        .to_socket_addrs()
                        .map(|a| a.collect::<Vec<_>>()),
                };
                let _ = tx.send((name, t, answer));
            });
        }
    }
    let deadline = Instant::now() + limit;
    while pending > 0 {
        let left = deadline.saturating_duration_since(Instant::now());
        let Ok((name, t, answer)) = rx.recv_timeout(left) else {
            break;
        };
        discovery::record(&name, &t, answer);
        pending -= 1;
    }
    for (name, settings) in &upstreams {
        for t in settings.targets.iter() {
            if t.ip.is_none() && discovery::addresses(t).is_empty() {
                tracing::warn!(
                    upstream = %name,
                    target = %t.name,
                    "upstream target has no address yet; it is down until it resolves"
                );
            }
        }
    }
}
