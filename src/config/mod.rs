//! gateway.toml: the schema (`schema`), its validation into the immutable [`Config`] that the
//! hot path reads, and the errors that name file, line and column.
//!
//! Parsing happens once per load; everything the request path needs (socket addresses, header
//! names, durations, API key digests, compiled matchers) is converted here so that a request never
//! parses configuration text.
//!
//! A [`Config`] is data, built the same way by `floodgate check` and by a reload: it starts
//! nothing and holds no run-time state of the gateway (the upstream pools a config runs on are
//! attached by the gateway when it puts the config in force), and this module knows no gateway.
//! [`watch`] is what a reload needs of the files (when they are complete, when they change).

pub mod duration;
pub mod error;
pub mod json_schema;
pub mod reach;
pub mod schema;
pub mod schema_parts;
pub mod telemetry;
mod validate;
pub mod watch;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, Method};
use ipnet::IpNet;

pub use crate::limiter::settings::{Backend, Store};
pub use crate::wire::matching::RequestMatch;
pub use error::ConfigError;

use crate::rules::Rule;
use crate::wire::auth::Keys;
use crate::wire::match_index::{Anchor, MatchIndex, Probe};

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
    /// The routes filed by what their match fixes: a request tests only those it can match.
    pub route_index: MatchIndex,
    /// The rules filed by what their match fixes (the route first): a request tests only
    /// those that can apply to it.
    pub rule_index: MatchIndex,
    /// Each rule's position by its policy's address (what the limiter's outcome names a rule
    /// by), so that naming a request's rules never scans them all.
    pub rule_by_policy: std::collections::HashMap<usize, usize>,
    /// `[[webhooks]]`: where quota events go.
    pub webhooks: Arc<[crate::webhooks::Webhook]>,
    /// `[rls]`: Envoy's rate-limit service and its limits, when the file has the section.
    pub rls: Option<crate::rls::limits::Settings>,
    /// `[tracing]`: OpenTelemetry spans over OTLP, when the file has the section (none: no
    /// tracing work at all).
    pub tracing: Option<telemetry::Settings>,
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
    /// Bearer token for admin endpoints other than /healthz (and the bare /readyz status):
    /// `admin_token`, or the contents of `admin_token_file`.
    pub admin_token: Option<String>,
    /// The file the admin token was read from (re-read, and watched, like the keys file).
    pub admin_token_file: Option<PathBuf>,
    /// Host names the admin listener answers for, besides IP literals and `localhost`: any
    /// other `Host` is refused, so that a DNS-rebinding page cannot read the admin API.
    pub admin_hosts: Vec<String>,
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
    pub escaped_slashes: crate::wire::normalize::EscapedSlashes,
    /// What request headers with `_` in their names do.
    pub headers_with_underscores: crate::wire::header_policy::Underscores,
    /// `allow_ips` / `deny_ips`: who may reach any route and the rate-limit service.
    pub ips: crate::wire::ip_list::IpRules,
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
    /// A request's whole body must arrive within this of its head (a total deadline).
    pub body_timeout: Duration,
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
        crate::text::names::name_of(Self::NAMES, self)
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

/// `[auth]`.
#[derive(Debug)]
pub struct Auth {
    /// The header carrying the key (`Authorization: Bearer` is accepted too).
    pub header: HeaderName,
    /// Forward the client's key upstream (default: stripped).
    pub forward_key: bool,
    /// The keys file, resolved against the config file's folder.
    pub keys_file: Option<PathBuf>,
    /// Every key, inline and from the keys file (in the cell later configs adopt).
    pub keys: Keys,
    /// `[[auth.jwt]]`: the token issuers and the cache of verified tokens.
    pub tokens: crate::jwt::Tokens,
}

/// One `[[upstreams]]`: its name and validated settings. Plain data: the run-time pool that
/// selects its targets is the gateway's, attached when the config is put in force (`pool()`
/// is defined with the gateway, in `src/gateway/pools.rs`).
#[derive(Debug)]
pub struct Upstream {
    /// Its name, referenced by routes.
    pub name: Arc<str>,
    /// Targets (never empty), balancing, TLS, timeouts, retries, health checks. Each validated
    /// upstream has its own `Arc`: the gateway finds the pool serving it by this pointer.
    pub settings: Arc<crate::upstream::Settings>,
}

impl Upstream {
    /// An upstream from validated settings.
    pub fn new(name: Arc<str>, settings: crate::upstream::Settings) -> Upstream {
        Upstream {
            name,
            settings: Arc::new(settings),
        }
    }
}

/// What a route asks of the caller: an API key, a token (`[[auth.jwt]]`), either, or neither.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthMode {
    /// 401 without a valid key or token.
    Required,
    /// 401 without a valid API key; tokens are not read.
    Key,
    /// 401 without a valid token; API keys are not read.
    Token,
    /// Anonymous requests pass; a key or token that is present must be valid.
    Optional,
    /// Keys and tokens are neither read nor checked.
    None,
}

impl AuthMode {
    /// Every mode with its gateway.toml name.
    pub const NAMES: &'static [(&'static str, AuthMode)] = &[
        ("required", AuthMode::Required),
        ("key", AuthMode::Key),
        ("token", AuthMode::Token),
        ("optional", AuthMode::Optional),
        ("none", AuthMode::None),
    ];

    /// Whether API keys are read.
    pub fn reads_keys(self) -> bool {
        !matches!(self, AuthMode::Token | AuthMode::None)
    }

    /// Whether tokens are read.
    pub fn reads_tokens(self) -> bool {
        !matches!(self, AuthMode::Key | AuthMode::None)
    }

    /// The name used in gateway.toml.
    pub fn as_str(self) -> &'static str {
        crate::text::names::name_of(Self::NAMES, self)
    }
}

/// One `[[routes]]` with its compiled matcher.
#[derive(Debug)]
pub struct Route {
    /// Its name (rules match on it; metrics and logs show it).
    pub name: Arc<str>,
    /// Host, path, path prefix and methods.
    pub matcher: RequestMatch,
    /// Where the route's traffic goes.
    pub upstream: Arc<Upstream>,
    /// Key requirement.
    pub auth: AuthMode,
    /// Its own `escaped_slashes`, when it overrides `[server] escaped_slashes`: a path the
    /// server's mode refuses is accepted if, spelled under this mode, it is this route's, and a
    /// path the server's mode accepts is refused if this route's refuses it.
    pub escaped_slashes: Option<crate::wire::normalize::EscapedSlashes>,
    /// `case_sensitive = false`: paths match (the route's and its rules' `path` and
    /// `path_prefix`) ignoring ASCII case, for backends that read `/ORDERS` as `/orders`.
    pub case_sensitive: bool,
    /// Its `floodgate_requests_total` series, resolved on first use (validation registers
    /// nothing).
    pub requests: crate::metrics::RouteRequests,
    /// What it changes on the way through: rewrites, header edits, CORS, IP lists.
    pub edges: Edges,
}

/// A route's changes to what passes through it, and who it lets in; all empty by default
/// (nothing is looked at on a request).
#[derive(Debug, Clone, Default)]
pub struct Edges {
    /// `strip_prefix`, `prefix_rewrite` or `regex_rewrite`.
    pub rewrite: Option<crate::wire::rewrite::Rewrite>,
    /// `host_rewrite`: the upstream's `Host`.
    pub host_rewrite: Option<Box<str>>,
    /// `request_headers`.
    pub request_headers: Option<Box<crate::wire::header_edits::HeaderEdits>>,
    /// `response_headers`.
    pub response_headers: Option<Box<crate::wire::header_edits::HeaderEdits>>,
    /// `cors`.
    pub cors: Option<Box<crate::wire::cors::Cors>>,
    /// `allow_ips` / `deny_ips`.
    pub ips: crate::wire::ip_list::IpRules,
}

impl Route {
    /// Whether a request (its normalized host and path) fits this route.
    pub fn matches(&self, host: Option<&str>, method: &Method, path: &str) -> bool {
        self.matcher
            .matches_case(host, method, path, self.case_sensitive)
    }
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

/// The most `[[routes]]` a file may have: each costs a request nothing beyond its index entry
/// (`crate::wire::match_index`), but a metric series and a line of `check` each.
pub const MAX_ROUTES: usize = 10_000;

/// The most `[[rules]]` a file may have: each has its metric series and counters.
pub const MAX_RULES: usize = 10_000;

/// The most a gateway.toml may hold: a thousand times a large real one (10,000 routes and
/// rules take about 3 MiB).
pub const MAX_CONFIG_BYTES: u64 = 16 << 20;

/// The most a keys file may hold: about 1.8 million keys written as the docs write them.
pub const MAX_KEYS_FILE_BYTES: u64 = 256 << 20;

/// The most a file holding one secret (`admin_token_file`, `secret_file`) may hold.
pub const MAX_SECRET_FILE_BYTES: u64 = 64 << 10;

/// Reads a file of at most `cap` bytes. A larger one is an error that says so, found without
/// reading past the cap (also when the file grows while read, or never ends: `/dev/zero`).
pub fn read_capped(path: &Path, cap: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let file = std::fs::File::open(path)?;
    let too_large = |size: String| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "the file holds {size}; at most {} are read",
                show_bytes(cap)
            ),
        )
    };
    let mut buf = Vec::new();
    if let Ok(m) = file.metadata() {
        if m.len() > cap {
            return Err(too_large(show_bytes(m.len())));
        }
        buf.reserve_exact(m.len() as usize);
    }
    file.take(cap + 1).read_to_end(&mut buf)?;
    if buf.len() as u64 > cap {
        return Err(too_large("more".to_string()));
    }
    Ok(buf)
}

/// [`read_capped`], as UTF-8 text.
pub fn read_text_capped(path: &Path, cap: u64) -> std::io::Result<String> {
    String::from_utf8(read_capped(path, cap)?).map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "stream did not contain valid UTF-8",
        )
    })
}

/// A size in bytes as people read it: `16 MiB`, `1.0 GiB`, `64 KiB`, `700 B`.
fn show_bytes(n: u64) -> String {
    match n {
        n if n >= 1 << 30 => format!("{:.1} GiB", n as f64 / (1u64 << 30) as f64),
        n if n >= 1 << 20 && n % (1 << 20) == 0 => format!("{} MiB", n >> 20),
        n if n >= 1 << 20 => format!("{:.1} MiB", n as f64 / (1u64 << 20) as f64),
        n if n >= 1 << 10 && n % (1 << 10) == 0 => format!("{} KiB", n >> 10),
        n => format!("{n} B"),
    }
}

impl Config {
    /// Reads and validates `path` (and its keys file). Nothing is half-applied: an error means
    /// no `Config`.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = read_text_capped(path, MAX_CONFIG_BYTES)
            .map_err(|e| ConfigError::whole_file(path, format!("cannot read: {e}")))?;
        Config::from_str(path, &text)
    }

    /// Validates `text` as if read from `path` (relative paths resolve against its folder).
    pub fn from_str(path: &Path, text: &str) -> Result<Config, ConfigError> {
        validate::validate(path, text)
    }

    /// The index in `routes` of the first route matching a request (its normalized host and
    /// path): the first match wins.
    pub fn route_for(&self, host: Option<&str>, method: &Method, path: &str) -> Option<usize> {
        let probe = Probe {
            route: None,
            host,
            path,
            plan: None,
            method,
        };
        self.route_index
            .candidates(&probe)
            .find(|&i| self.routes[i].matches(host, method, path))
    }

    /// The rule whose policy this is (`None` for a policy of the rate-limit service, or a
    /// per-request copy made by `limit_from`).
    pub fn rule_of(&self, policy: &Arc<crate::rules::Policy>) -> Option<&Arc<Rule>> {
        let i = *self.rule_by_policy.get(&(Arc::as_ptr(policy) as usize))?;
        self.rules.get(i)
    }
}

/// Each rule's position by its policy's address ([`Config::rule_of`]).
pub fn rule_by_policy(rules: &[Arc<Rule>]) -> std::collections::HashMap<usize, usize> {
    rules
        .iter()
        .enumerate()
        .map(|(i, r)| (Arc::as_ptr(&r.policy) as usize, i))
        .collect()
}

/// The index of routes: each filed under its exact path, else its prefix, else its host, else
/// its methods (`crate::wire::match_index`).
pub fn route_index(routes: &[Route]) -> MatchIndex {
    MatchIndex::build(routes.iter().map(|r| Anchor::of(&r.matcher)))
}

/// The index of rules: each filed under its route, else what its request match fixes, a plan
/// before methods alone.
pub fn rule_index(rules: &[Arc<Rule>], routes: &[Route]) -> MatchIndex {
    MatchIndex::build(rule_anchors(rules, routes).into_iter())
}

/// Each route's position in the file by its name: rules name their route.
pub fn route_positions(routes: &[Route]) -> std::collections::HashMap<&str, usize> {
    routes
        .iter()
        .enumerate()
        .map(|(i, r)| (&*r.name, i))
        .collect()
}

/// Each rule's anchor, in file order ([`rule_anchor`]).
pub fn rule_anchors<'a>(rules: &'a [Arc<Rule>], routes: &[Route]) -> Vec<Anchor<'a>> {
    let position = route_positions(routes);
    rules
        .iter()
        .map(|rule| rule_anchor(rule, &position))
        .collect()
}

/// The anchor a rule is filed under (its route by position in the file).
pub fn rule_anchor<'a>(
    rule: &'a Rule,
    position: &std::collections::HashMap<&str, usize>,
) -> Anchor<'a> {
    let m = &rule.matcher;
    if let Some(&i) = m.route.as_deref().and_then(|r| position.get(r)) {
        return Anchor::Route(i);
    }
    let anchor = Anchor::of(&m.request);
    match &m.plan {
        Some(plan) if anchor.weaker_than_plan() => Anchor::Plan(plan),
        _ => anchor,
    }
}
