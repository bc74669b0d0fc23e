//! The validated settings of one `[[upstreams]]` table: what `config::validate` produces and
//! the run time reads. Building a pool from them cannot fail, and nothing here has touched the
//! network (names are resolved at run time by [`super::discovery`]).

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::rules::KeyPart;
use pingora::tls::CertificateDer;
use pingora::utils::tls::{CertKey, WrappedX509};

/// How a target is chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Balance {
    /// In turn, by weight (default).
    RoundRobin,
    /// At random, by weight.
    Random,
    /// The target with the fewest requests in flight (per unit of weight).
    LeastRequests,
    /// Ketama consistent hashing of the client IP or of `hash_key`.
    Consistent,
}

impl Balance {
    /// Every mode with its gateway.toml name.
    pub const NAMES: &'static [(&'static str, Balance)] = &[
        ("round_robin", Balance::RoundRobin),
        ("random", Balance::Random),
        ("least_requests", Balance::LeastRequests),
        ("consistent", Balance::Consistent),
    ];

    /// The name used in gateway.toml.
    pub fn as_str(self) -> &'static str {
        crate::text::names::name_of(Self::NAMES, self)
    }
}

/// One configured target: a host (name or IP literal) and a port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// As written: `host:port`.
    pub name: Arc<str>,
    /// The host (without brackets for IPv6).
    pub host: Arc<str>,
    /// The port.
    pub port: u16,
    /// Relative share of traffic.
    pub weight: usize,
    /// The host when it is an IP literal: never resolved.
    pub ip: Option<IpAddr>,
}

/// A non-empty list of targets: validation refuses an empty one, so no code indexes an empty
/// list.
#[derive(Debug, Clone)]
pub struct Targets(Vec<Target>);

impl Targets {
    /// `None` if `list` is empty.
    pub fn new(list: Vec<Target>) -> Option<Targets> {
        (!list.is_empty()).then_some(Targets(list))
    }

    /// The first target (there always is one).
    pub fn first(&self) -> &Target {
        &self.0[0]
    }

    /// All targets in file order.
    pub fn iter(&self) -> std::slice::Iter<'_, Target> {
        self.0.iter()
    }

    /// How many.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Never true; here for the `len` convention.
    pub fn is_empty(&self) -> bool {
        false
    }
}

/// TLS to the upstream.
#[derive(Clone)]
pub struct UpstreamTls {
    /// SNI and the name the certificate must carry; `None`: each target's host.
    pub sni: Option<String>,
    /// Verify the certificate chain and name (default true).
    pub verify: bool,
    /// Extra trust anchors (`ca_file`); `None`: the system's.
    pub ca: Option<Arc<[WrappedX509]>>,
    /// The client certificate and key for mTLS.
    pub client: Option<Arc<CertKey>>,
    /// The `ca_file` path (for display).
    pub ca_file: Option<std::path::PathBuf>,
    /// The `client_cert` path (for display).
    pub client_cert: Option<std::path::PathBuf>,
}

impl std::fmt::Debug for UpstreamTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamTls")
            .field("sni", &self.sni)
            .field("verify", &self.verify)
            .field("ca_file", &self.ca_file)
            .field("client_cert", &self.client_cert)
            .finish()
    }
}

impl UpstreamTls {
    /// The CA certificates as DER (for tests and display).
    pub fn ca_der(&self) -> Vec<CertificateDer<'_>> {
        self.ca
            .iter()
            .flat_map(|c| c.iter())
            .map(CertificateDer::from)
            .collect()
    }
}

/// Active health check kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckKind {
    /// A TCP connect (and TLS handshake for TLS upstreams).
    Tcp,
    /// An HTTP GET of `path` whose status must be in `expect_status`.
    Http,
}

impl CheckKind {
    /// Every kind with its gateway.toml name.
    pub const NAMES: &'static [(&'static str, CheckKind)] =
        &[("http", CheckKind::Http), ("tcp", CheckKind::Tcp)];

    /// The name used in gateway.toml.
    pub fn as_str(self) -> &'static str {
        crate::text::names::name_of(Self::NAMES, self)
    }
}

/// `[upstreams.health_check]`.
#[derive(Debug, Clone, PartialEq)]
pub struct HealthCheck {
    /// `http` (default) or `tcp`.
    pub kind: CheckKind,
    /// Path of the HTTP check.
    pub path: String,
    /// Time between checks.
    pub interval: Duration,
    /// One check's deadline.
    pub timeout: Duration,
    /// Good checks in a row that bring a target back.
    pub healthy_threshold: usize,
    /// Failed checks in a row that take a target out.
    pub unhealthy_threshold: usize,
    /// Statuses an HTTP check accepts.
    pub expect_status: Vec<u16>,
}

/// `[upstreams.passive]`: outlier detection from live traffic.
#[derive(Debug, Clone, PartialEq)]
pub struct Passive {
    /// 5xx answers, connect failures and timeouts in a row that eject a target.
    pub consecutive_failures: u32,
    /// How long an ejected target gets no traffic (unless an active check passes first).
    pub eject: Duration,
}

/// `[upstreams.protect]`: an adaptive concurrency limit with a weighted fair queue of tenants
/// in front of it (see [`super::protect`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Protect {
    /// Who a tenant is: key parts read as a rule's `key` reads them; empty (the default) is
    /// the customer: the key's `user`, or for a request without a key its client IP's /24
    /// (IPv4) or /64 (IPv6) network (`protect::tenant`).
    pub fair_by: Vec<KeyPart>,
    /// Shares under contention: for a key part, the weight of each of its values (default 1;
    /// a request matching several takes the largest).
    pub weights: Vec<(KeyPart, Vec<(String, u32)>)>,
    /// The limit never goes below this.
    pub min_limit: u32,
    /// Nor above this.
    pub max_limit: u32,
    /// The longest wait for a turn; then 503.
    pub queue_timeout: Duration,
    /// Requests waiting, over all tenants; more are shed.
    pub max_queue: usize,
}

/// A validated `[[upstreams]]` table, less its name.
#[derive(Debug)]
pub struct Settings {
    /// Where traffic goes.
    pub targets: Targets,
    /// How a target is chosen.
    pub balance: Balance,
    /// Consistent hashing key: rule key parts, read as rules read them (empty: the client IP).
    pub hash_key: Vec<KeyPart>,
    /// TLS to the upstream, if on.
    pub tls: Option<UpstreamTls>,
    /// HTTP/2 to the upstream (ALPN h2; needs TLS).
    pub http2: bool,
    /// Host header sent upstream; `None`: the client's.
    pub host_header: Option<String>,
    /// Per connection attempt.
    pub connect_timeout: Duration,
    /// Longest wait for the upstream's next bytes.
    pub read_timeout: Duration,
    /// Longest wait to write to the upstream.
    pub write_timeout: Duration,
    /// How long a pooled idle connection is kept.
    pub idle_timeout: Duration,
    /// The whole exchange with the upstream, first byte out to last byte in (not for tunnels).
    pub timeout: Duration,
    /// An upgraded connection (after `101`) is closed when a side has sent nothing for this;
    /// it is also the wait for an upgrade request's response head.
    pub tunnel_timeout: Duration,
    /// Further attempts (idempotent methods only), each to another target.
    pub retries: usize,
    /// How often DNS names are re-resolved.
    pub resolve_interval: Duration,
    /// Active health check, if any.
    pub health_check: Option<HealthCheck>,
    /// Passive outlier detection, if any.
    pub passive: Option<Passive>,
    /// The adaptive concurrency limit and fair queue, if any.
    pub protect: Option<Protect>,
}

impl Settings {
    /// What the active health state depends on: a reload that changes it starts every target
    /// afresh, one that does not keeps each target's health.
    pub fn health_fingerprint(&self) -> String {
        format!(
            "{:?}|{:?}|{}|{:?}",
            self.health_check,
            self.tls
                .as_ref()
                .map(|t| (&t.sni, t.verify, &t.ca_file, &t.client_cert)),
            self.http2,
            self.host_header
        )
    }
}
