//! Names to addresses, off the request path.
//!
//! A [`Resolver`] turns a target's host into addresses; the background service
//! ([`super::service`]) calls it every `resolve_interval` and stores the answer in a process-wide
//! cache ([`cache`]). [`Discovery`], the `ServiceDiscovery` the load balancer asks, only reads
//! that cache, so it never waits on DNS. A name that has never resolved contributes no address
//! (its target is down); a name that stops resolving keeps its last addresses, because a DNS
//! outage is no reason to stop sending traffic to servers that are up.

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, LazyLock};

use async_trait::async_trait;
use parking_lot::Mutex;
use pingora::lb::discovery::ServiceDiscovery;
use pingora::lb::{Backend, Extensions};

use super::settings::{Settings, Target};
use super::{Shared, TargetInfo};

/// Turns a host name into addresses. Pluggable so that tests and embedders can answer from
/// something other than the system resolver.
#[async_trait]
pub trait Resolver: Send + Sync {
    /// Every address of `host` (A and AAAA), with `port`.
    async fn resolve(&self, host: &str, port: u16) -> std::io::Result<Vec<SocketAddr>>;
}

/// The system resolver (`getaddrinfo`, on a blocking thread): /etc/hosts, then DNS.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemResolver;

#[async_trait]
impl Resolver for SystemResolver {
    async fn resolve(&self, host: &str, port: u16) -> std::io::Result<Vec<SocketAddr>> {
        Ok(tokio::net::lookup_host((host, port)).await?.collect())
    }
}

/// The environment variable naming a hosts file (hosts(5) format: an address, then names)
/// that [`HostsFileResolver`] reads before asking the system resolver.
pub const HOSTS_FILE_ENV: &str = "FLOODGATE_HOSTS_FILE";

/// Names from a hosts file of floodgate's own first (re-read at every resolve, so an edit
/// takes effect within `resolve_interval`), then the system resolver. For names a deployment
/// cannot put in /etc/hosts or DNS (a sidecar's, a test's); without the file it is the
/// system resolver alone.
#[derive(Debug, Clone, Default)]
pub struct HostsFileResolver {
    file: Option<std::path::PathBuf>,
}

impl HostsFileResolver {
    /// Reads the file named by `FLOODGATE_HOSTS_FILE`, if set.
    pub fn from_env() -> HostsFileResolver {
        HostsFileResolver {
            file: std::env::var_os(HOSTS_FILE_ENV).map(Into::into),
        }
    }

    /// The file's addresses for `host`, read now (for the blocking first resolution at start);
    /// `None` when the file is not set, not readable or does not name `host`.
    pub fn from_file(&self, host: &str, port: u16) -> Option<Vec<SocketAddr>> {
        let text = std::fs::read_to_string(self.file.as_ref()?).ok()?;
        let found = HostsFileResolver::lookup(&text, host);
        (!found.is_empty()).then(|| {
            found
                .into_iter()
                .map(|ip| SocketAddr::new(ip, port))
                .collect()
        })
    }

    /// Every address the file gives `host` (case-insensitive), in file order.
    fn lookup(text: &str, host: &str) -> Vec<std::net::IpAddr> {
        text.lines()
            .filter_map(|line| {
                let line = line.split('#').next().unwrap_or("");
                let mut fields = line.split_whitespace();
                let ip = fields.next()?.parse().ok()?;
                fields
                    .any(|name| name.eq_ignore_ascii_case(host))
                    .then_some(ip)
            })
            .collect()
    }
}

#[async_trait]
impl Resolver for HostsFileResolver {
    async fn resolve(&self, host: &str, port: u16) -> std::io::Result<Vec<SocketAddr>> {
        if let Some(file) = &self.file {
            // A missing or unreadable file is no answer: the system resolver decides.
            if let Ok(text) = tokio::fs::read_to_string(file).await {
                let found = HostsFileResolver::lookup(&text, host);
                if !found.is_empty() {
                    return Ok(found
                        .into_iter()
                        .map(|ip| SocketAddr::new(ip, port))
                        .collect());
                }
            }
        }
        SystemResolver.resolve(host, port).await
    }
}

/// What is known of one name.
#[derive(Debug, Clone, Default)]
pub struct Resolution {
    /// The addresses last resolved (empty: never resolved).
    pub addrs: Vec<SocketAddr>,
    /// The last attempt's error, if it failed.
    pub error: Option<String>,
    /// Whether it has been tried at all.
    pub tried: bool,
}

/// What is known of every name, by (host, port).
pub type Cache = Mutex<HashMap<(Arc<str>, u16), Resolution>>;

/// The resolved names of every upstream, by (host, port).
pub fn cache() -> &'static Cache {
    static CACHE: LazyLock<Cache> = LazyLock::new(|| Mutex::new(HashMap::new()));
    &CACHE
}

/// Resolves `target` with `resolver` and records the answer; returns whether the addresses
/// changed. Logs a name that fails or comes back, once per change.
pub async fn resolve(resolver: &dyn Resolver, upstream: &str, target: &Target) -> bool {
    if target.ip.is_some() {
        return false;
    }
    let answer = resolver.resolve(&target.host, target.port).await;
    record(upstream, target, answer)
}

/// Records the answer of a resolution of `target`; returns whether its addresses changed.
pub fn record(upstream: &str, target: &Target, answer: std::io::Result<Vec<SocketAddr>>) -> bool {
    let key = (target.host.clone(), target.port);
    let mut cache = cache().lock();
    let entry = cache.entry(key).or_default();
    let first = !entry.tried;
    entry.tried = true;
    match answer {
        Ok(mut addrs) if !addrs.is_empty() => {
            addrs.sort();
            addrs.dedup();
            if entry.error.is_some() || first {
                tracing::info!(upstream, target = %target.name, addrs = ?addrs, "upstream target resolved");
            }
            entry.error = None;
            let changed = entry.addrs != addrs;
            entry.addrs = addrs;
            changed
        }
        other => {
            let error = match other {
                Err(e) => e.to_string(),
                Ok(_) => "no address".to_string(),
            };
            if entry.error.is_none() {
                tracing::warn!(
                    upstream,
                    target = %target.name,
                    error = %error,
                    kept = entry.addrs.len(),
                    "upstream target does not resolve; it is down until it does"
                );
            }
            entry.error = Some(error);
            false
        }
    }
}

/// The addresses of `target` now: its IP, or what its name last resolved to.
pub fn addresses(target: &Target) -> Vec<SocketAddr> {
    match target.ip {
        Some(ip) => vec![SocketAddr::new(ip, target.port)],
        None => cache()
            .lock()
            .get(&(target.host.clone(), target.port))
            .map(|r| r.addrs.clone())
            .unwrap_or_default(),
    }
}

/// The resolution record of a named target (`None` for IP literals).
pub fn resolution(target: &Target) -> Option<Resolution> {
    target.ip.is_none().then(|| {
        cache()
            .lock()
            .get(&(target.host.clone(), target.port))
            .cloned()
            .unwrap_or_default()
    })
}

/// The `ServiceDiscovery` of one upstream: its targets' current addresses, each backend
/// carrying its [`TargetInfo`].
pub struct Discovery {
    settings: Arc<Settings>,
    shared: Arc<Shared>,
}

impl Discovery {
    pub(super) fn new(settings: Arc<Settings>, shared: Arc<Shared>) -> Discovery {
        Discovery { settings, shared }
    }
}

#[async_trait]
impl ServiceDiscovery for Discovery {
    async fn discover(&self) -> pingora::Result<(BTreeSet<Backend>, HashMap<u64, bool>)> {
        let mut set = BTreeSet::new();
        for t in self.settings.targets.iter() {
            for addr in addresses(t) {
                let info = Arc::new(TargetInfo {
                    name: t.name.clone(),
                    host: t.host.clone(),
                    addr,
                    label: addr.to_string().into(),
                    state: self.shared.state(addr),
                });
                let mut ext = Extensions::new();
                ext.insert(info);
                set.insert(Backend {
                    addr: pingora::protocols::l4::socket::SocketAddr::Inet(addr),
                    weight: t.weight,
                    ext,
                });
            }
        }
        Ok((set, HashMap::new()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_file_lines_give_every_address_of_a_name() {
        let text = "# comment\n127.0.0.1 a.test b.test\n::1\tA.TEST # trailing\nbad line\n10.0.0.1 c.test\n";
        let ips = |h| HostsFileResolver::lookup(text, h);
        assert_eq!(
            ips("a.test"),
            [
                "127.0.0.1".parse::<std::net::IpAddr>().unwrap(),
                "::1".parse().unwrap()
            ]
        );
        assert_eq!(ips("b.test").len(), 1);
        assert!(ips("comment").is_empty() && ips("line").is_empty() && ips("d.test").is_empty());
    }

    /// A resolver answering from a table the test changes (a stand-in for a hosts file).
    struct Table(Mutex<HashMap<String, Vec<SocketAddr>>>);

    #[async_trait]
    impl Resolver for Table {
        async fn resolve(&self, host: &str, port: u16) -> std::io::Result<Vec<SocketAddr>> {
            match self.0.lock().get(host) {
                Some(a) => Ok(a.iter().map(|a| SocketAddr::new(a.ip(), port)).collect()),
                None => Err(std::io::Error::other("no such host")),
            }
        }
    }

    fn target(host: &str, port: u16) -> Target {
        Target {
            name: format!("{host}:{port}").into(),
            host: host.into(),
            port,
            weight: 1,
            ip: host.parse().ok(),
        }
    }

    #[tokio::test]
    async fn a_name_is_down_until_it_resolves_and_keeps_its_addresses_after() {
        let table = Table(Mutex::new(HashMap::new()));
        let t = target("later.test-discovery.invalid", 7001);
        assert!(!resolve(&table, "u", &t).await);
        assert!(
            addresses(&t).is_empty(),
            "not resolved: no address, target down"
        );
        assert!(resolution(&t).unwrap().error.is_some());

        let addr: SocketAddr = "127.0.0.9:1".parse().unwrap();
        table.0.lock().insert(t.host.to_string(), vec![addr]);
        assert!(resolve(&table, "u", &t).await, "addresses changed");
        assert_eq!(addresses(&t), vec!["127.0.0.9:7001".parse().unwrap()]);

        table.0.lock().clear();
        assert!(!resolve(&table, "u", &t).await);
        assert_eq!(
            addresses(&t).len(),
            1,
            "a DNS failure keeps the last addresses"
        );
    }

    #[tokio::test]
    async fn ip_literals_are_never_resolved() {
        let table = Table(Mutex::new(HashMap::new()));
        let t = target("127.0.0.1", 80);
        assert!(!resolve(&table, "u", &t).await);
        assert_eq!(addresses(&t), vec!["127.0.0.1:80".parse().unwrap()]);
        assert!(resolution(&t).is_none());
    }
}
