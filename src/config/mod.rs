//! gateway.toml: the schema (`schema`), its validation into the immutable [`Config`] that the
//! hot path reads, and the errors that name file, line and column.
//!
//! Parsing happens once per load; everything the request path needs (socket addresses, header
//! names, durations, key digests, compiled matchers) is converted here so that a request never
//! parses configuration text.

pub mod duration;
pub mod error;
pub mod schema;
mod validate;
pub mod watch;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, Method};
use ipnet::IpNet;

pub use error::ConfigError;

use crate::auth::KeyStore;
use crate::rules::Rule;

/// A validated configuration. Immutable: a reload builds a new one and swaps it in whole.
#[derive(Debug)]
pub struct Config {
    /// The gateway.toml it was read from.
    pub path: PathBuf,
    /// `[server]`.
    pub server: Server,
    /// `[store]`.
    pub store: Store,
    /// `[auth]` with its keys (inline and from `keys_file`).
    pub auth: Auth,
    /// `[[upstreams]]` in file order.
    pub upstreams: Vec<Arc<Upstream>>,
    /// `[[routes]]` in file order: the first match wins.
    pub routes: Vec<Route>,
    /// `[[rules]]` in file order: every match applies.
    pub rules: Vec<Arc<Rule>>,
    /// `max_waiting` of each shaping rule, by rule name: how many requests it may hold at once
    /// (the limiter enforces it; see `limiter::engine::MAX_WAITING_PER_RULE`).
    pub max_waiting: std::collections::HashMap<Arc<str>, usize>,
    /// Digest of the bytes this config was read from (gateway.toml, then the keys file): the
    /// reloader compares files against it to tell a real change from a no-op event.
    pub fingerprint: [u8; 32],
    /// Things that are valid but unwise (plaintext secrets): logged at start, printed by check.
    pub warnings: Vec<String>,
}

/// `[server]`: listeners and process settings.
#[derive(Debug, Clone, PartialEq)]
pub struct Server {
    /// Plain listeners (HTTP/1.1 and h2c).
    pub listen: Vec<SocketAddr>,
    /// The admin listener (metrics, health, rules).
    pub admin_listen: SocketAddr,
    /// Worker threads.
    pub threads: usize,
    /// Peers whose `X-Forwarded-For` is believed.
    pub trusted_proxies: Vec<IpNet>,
    /// How long SIGTERM waits for in-flight requests.
    pub grace_period: Duration,
    /// Bearer token for admin endpoints other than /healthz.
    pub admin_token: Option<String>,
    /// Add `X-RateLimit-Limit/Remaining/Reset` for the most restrictive rule.
    pub legacy_headers: bool,
    /// Log output format.
    pub log_format: LogFormat,
    /// Write one access-log line per request.
    pub access_log: bool,
    /// Track the top clients per rule (admitted and rejected) for `GET /top` and the dashboard.
    pub top_clients: bool,
    /// TLS listeners.
    pub tls: Option<Tls>,
    /// Connection limits and deadlines (slow and idle clients).
    pub connections: Connections,
    /// What `%2F` / `%5C` in a request path do.
    pub escaped_slashes: crate::normalize::EscapedSlashes,
}

/// `[server]` settings that bound what one client can hold: deadlines for slow and idle
/// connections, and caps on open connections. Read at each accept, so a reload applies them to
/// new connections.
#[derive(Debug, Clone, PartialEq)]
pub struct Connections {
    /// The whole request head must arrive within this (a total deadline, not per read).
    pub header_timeout: Duration,
    /// An idle kept-alive connection (HTTP/1.1 and h2) is closed after this.
    pub keepalive_timeout: Duration,
    /// Open client connections at most, over all listeners.
    pub max_connections: usize,
    /// Open client connections at most from one IP.
    pub max_per_ip: usize,
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines (default).
    Text,
    /// One JSON object per line, for log shippers.
    Json,
}

impl LogFormat {
    /// Every format with its gateway.toml name.
    pub const NAMES: &'static [(&'static str, LogFormat)] =
        &[("text", LogFormat::Text), ("json", LogFormat::Json)];

    /// The name used in gateway.toml.
    pub fn as_str(self) -> &'static str {
        crate::names::name_of(Self::NAMES, self)
    }
}

/// `[server.tls]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Tls {
    /// HTTPS listeners (HTTP/2 by ALPN).
    pub listen: Vec<SocketAddr>,
    /// PEM certificate chain.
    pub cert: PathBuf,
    /// PEM private key.
    pub key: PathBuf,
}

/// Where global counters live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// In process (default): one instance.
    Memory,
    /// One Redis server.
    Redis,
    /// A Redis Cluster.
    RedisCluster,
}

impl Backend {
    /// Every backend with its gateway.toml name.
    pub const NAMES: &'static [(&'static str, Backend)] = &[
        ("memory", Backend::Memory),
        ("redis", Backend::Redis),
        ("redis-cluster", Backend::RedisCluster),
    ];

    /// The name used in gateway.toml.
    pub fn as_str(self) -> &'static str {
        crate::names::name_of(Self::NAMES, self)
    }
}

/// `[store]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Store {
    /// The backend.
    pub backend: Backend,
    /// Redis URL(s): one for `redis`, the seed nodes for `redis-cluster`, none for memory.
    pub urls: Vec<String>,
    /// Budget for one decision.
    pub timeout: Duration,
    /// Prefix of every Redis key.
    pub key_prefix: String,
    /// Gateway instances sharing the limits (divides limits for the `local` fallback).
    pub instances: u64,
    /// Bound of the in-process store (keys), for memory and the local fallback.
    pub max_keys: usize,
}

/// `[auth]`.
#[derive(Debug)]
pub struct Auth {
    /// The header carrying the key (`Authorization: Bearer` is accepted too).
    pub header: HeaderName,
    /// Forward the client's key upstream (default: stripped).
    pub forward_key: bool,
    /// The keys file, resolved against the config file's folder.
    pub keys_file: Option<PathBuf>,
    /// Every key, inline and from the keys file.
    pub keys: KeyStore,
}

/// One `[[upstreams]]`.
#[derive(Debug)]
pub struct Upstream {
    /// Its name, referenced by routes.
    pub name: Arc<str>,
    /// Targets, resolved at load time, tried round robin.
    pub targets: Vec<SocketAddr>,
    /// Connect timeout per attempt.
    pub connect_timeout: Duration,
    /// Timeout between reads of the upstream's answer.
    pub read_timeout: Duration,
    /// Round-robin cursor.
    pub next: AtomicUsize,
}

/// What a route asks of the caller's API key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthMode {
    /// 401 without a valid key.
    Required,
    /// Anonymous requests pass; a key that is present must be valid.
    Optional,
    /// Keys are neither read nor checked.
    None,
}

impl AuthMode {
    /// Every mode with its gateway.toml name.
    pub const NAMES: &'static [(&'static str, AuthMode)] = &[
        ("required", AuthMode::Required),
        ("optional", AuthMode::Optional),
        ("none", AuthMode::None),
    ];

    /// The name used in gateway.toml.
    pub fn as_str(self) -> &'static str {
        crate::names::name_of(Self::NAMES, self)
    }
}

/// One `[[routes]]` with its compiled matcher.
#[derive(Debug)]
pub struct Route {
    /// Its name (rules match on it; metrics and logs show it).
    pub name: Arc<str>,
    /// Exact path.
    pub path: Option<String>,
    /// Path prefix, on segment boundaries (`/orders` matches `/orders` and `/orders/1`).
    pub path_prefix: Option<String>,
    /// Host, compared without port and case.
    pub host: Option<String>,
    /// Methods, any when `None`.
    pub methods: Option<Vec<Method>>,
    /// Where the route's traffic goes.
    pub upstream: Arc<Upstream>,
    /// Key requirement.
    pub auth: AuthMode,
}

impl Route {
    /// Whether a request fits this route.
    pub fn matches(&self, host: Option<&str>, method: &Method, path: &str) -> bool {
        if let Some(p) = &self.path {
            if p != path {
                return false;
            }
        }
        if let Some(prefix) = &self.path_prefix {
            if !path_has_prefix(path, prefix) {
                return false;
            }
        }
        if let Some(m) = &self.methods {
            if !m.contains(method) {
                return false;
            }
        }
        if let Some(h) = &self.host {
            match host {
                Some(req) if host_eq(req, h) => {}
                _ => return false,
            }
        }
        true
    }
}

/// Prefix match on path segments, so that `/orders` does not match `/ordersfoo`.
pub fn path_has_prefix(path: &str, prefix: &str) -> bool {
    if prefix == "/" || prefix.is_empty() {
        return true;
    }
    let prefix = prefix.strip_suffix('/').unwrap_or(prefix);
    match path.strip_prefix(prefix) {
        Some(rest) => rest.is_empty() || rest.starts_with('/'),
        None => false,
    }
}

/// Host comparison: both sides are normalized (`crate::normalize::host`) before they meet, the
/// config's at load and the request's once per request, so equal hosts are equal strings.
pub fn host_eq(request_host: &str, wanted: &str) -> bool {
    request_host == wanted
}

/// Digest of some files' bytes in order (length-prefixed; a missing file counts as empty).
pub fn fingerprint_of(contents: &[&[u8]]) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for bytes in contents {
        h.update((bytes.len() as u64).to_le_bytes());
        h.update(bytes);
    }
    h.finalize().into()
}

impl Config {
    /// Reads and validates `path` (and its keys file). Nothing is half-applied: an error means
    /// no `Config`.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError::whole_file(path, format!("cannot read: {e}")))?;
        Config::from_str(path, &text)
    }

    /// Validates `text` as if read from `path` (relative paths resolve against its folder).
    pub fn from_str(path: &Path, text: &str) -> Result<Config, ConfigError> {
        validate::validate(path, text)
    }

    /// Finds the first route matching the request.
    pub fn route_for(&self, host: Option<&str>, method: &Method, path: &str) -> Option<&Route> {
        self.routes.iter().find(|r| r.matches(host, method, path))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_respects_segments() {
        assert!(path_has_prefix("/orders", "/orders"));
        assert!(path_has_prefix("/orders/1", "/orders"));
        assert!(path_has_prefix("/orders/1", "/orders/"));
        assert!(!path_has_prefix("/ordersx", "/orders"));
        assert!(path_has_prefix("/anything", "/"));
    }

    #[test]
    fn host_ignores_port_and_case_once_normalized() {
        let n = |h: &str| crate::normalize::host(h).unwrap().into_owned();
        assert!(host_eq(&n("API.example.com:8080"), &n("api.example.com")));
        assert!(host_eq(&n("api.example.com."), &n("api.example.com")));
        assert!(!host_eq(&n("other.example.com"), &n("api.example.com")));
        assert!(host_eq(&n("[::1]:8080"), &n("::1")));
    }
}
