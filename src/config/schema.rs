//! The external schema of gateway.toml and the keys file, exactly as operators write them.
//!
//! These types only mirror the file: every table denies unknown keys (a typo in a limit must not
//! turn the limit off) and values that later checks point at are `Spanned`, so an error can name
//! their line and column. `super::validate` turns them into the typed [`super::Config`].

use serde::Deserialize;
use toml::Spanned;

/// The whole gateway.toml.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    #[serde(default)]
    pub server: RawServer,
    #[serde(default)]
    pub store: RawStore,
    #[serde(default)]
    pub auth: RawAuth,
    #[serde(default)]
    pub upstreams: Vec<RawUpstream>,
    #[serde(default)]
    pub routes: Vec<RawRoute>,
    #[serde(default)]
    pub rules: Vec<RawRule>,
    /// `[[webhooks]]`: quota events sent to a customer's systems.
    #[serde(default)]
    pub webhooks: Vec<Spanned<RawWebhook>>,
    /// `[rls]`: Envoy's rate-limit service.
    pub rls: Option<Spanned<RawRls>>,
}

/// One `[[webhooks]]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawWebhook {
    pub url: Spanned<String>,
    pub events: Spanned<Vec<Spanned<String>>>,
    pub thresholds: Option<Spanned<Vec<Spanned<f64>>>>,
    pub secret: Option<Spanned<String>>,
}

/// `[server]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawServer {
    pub listen: Option<Spanned<Vec<Spanned<String>>>>,
    pub admin_listen: Option<Spanned<String>>,
    pub threads: Option<Spanned<i64>>,
    #[serde(default)]
    pub trusted_proxies: Vec<Spanned<String>>,
    pub grace_period: Option<Spanned<String>>,
    pub admin_token: Option<Spanned<String>>,
    pub admin_token_file: Option<Spanned<String>>,
    pub admin_hosts: Option<Spanned<Vec<Spanned<String>>>>,
    #[serde(default)]
    pub legacy_headers: bool,
    pub access_log: Option<bool>,
    pub top_clients: Option<bool>,
    pub log_format: Option<Spanned<String>>,
    pub tls: Option<Spanned<RawTls>>,
    pub header_timeout: Option<Spanned<String>>,
    pub keepalive_timeout: Option<Spanned<String>>,
    pub body_timeout: Option<Spanned<String>>,
    pub max_connections: Option<Spanned<i64>>,
    pub max_connections_per_ip: Option<Spanned<i64>>,
    pub escaped_slashes: Option<Spanned<String>>,
    pub headers_with_underscores: Option<Spanned<String>>,
}

/// `[server.tls]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTls {
    pub listen: Vec<Spanned<String>>,
    pub cert: Spanned<String>,
    pub key: Spanned<String>,
}

/// `[store]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawStore {
    pub backend: Option<Spanned<String>>,
    pub url: Option<Spanned<String>>,
    pub urls: Option<Spanned<Vec<Spanned<String>>>>,
    pub timeout: Option<Spanned<String>>,
    pub key_prefix: Option<String>,
    pub instances: Option<Spanned<i64>>,
    pub max_keys: Option<Spanned<i64>>,
}

/// `[auth]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAuth {
    pub header: Option<Spanned<String>>,
    pub keys_file: Option<Spanned<String>>,
    #[serde(default)]
    pub forward_key: bool,
    #[serde(default)]
    pub keys: Vec<Spanned<RawKey>>,
}

/// The keys file: only `[[keys]]` tables.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawKeysFile {
    #[serde(default)]
    pub keys: Vec<Spanned<RawKey>>,
}

/// One `[[auth.keys]]` (or `[[keys]]` in the keys file).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawKey {
    pub id: Spanned<String>,
    pub sha256: Option<Spanned<String>>,
    pub secret: Option<Spanned<String>>,
    pub user: Option<Spanned<String>>,
    pub plan: Option<Spanned<String>>,
}

/// One `[[upstreams]]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawUpstream {
    pub name: Spanned<String>,
    pub targets: Spanned<Vec<Spanned<RawTarget>>>,
    pub balance: Option<Spanned<String>>,
    pub hash_key: Option<Spanned<Vec<Spanned<String>>>>,
    pub tls: Option<bool>,
    pub sni: Option<Spanned<String>>,
    pub verify: Option<Spanned<bool>>,
    pub ca_file: Option<Spanned<String>>,
    pub client_cert: Option<Spanned<String>>,
    pub client_key: Option<Spanned<String>>,
    pub http2: Option<Spanned<bool>>,
    pub host_header: Option<Spanned<String>>,
    pub connect_timeout: Option<Spanned<String>>,
    pub read_timeout: Option<Spanned<String>>,
    pub write_timeout: Option<Spanned<String>>,
    pub idle_timeout: Option<Spanned<String>>,
    pub timeout: Option<Spanned<String>>,
    pub tunnel_timeout: Option<Spanned<String>>,
    pub retries: Option<Spanned<i64>>,
    pub resolve_interval: Option<Spanned<String>>,
    pub health_check: Option<Spanned<RawHealthCheck>>,
    pub passive: Option<Spanned<RawPassive>>,
    pub protect: Option<Spanned<RawProtect>>,
}

/// `[upstreams.protect]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawProtect {
    pub fair_by: Option<Spanned<Vec<Spanned<String>>>>,
    pub weights: Option<Spanned<std::collections::BTreeMap<String, Spanned<RawWeights>>>>,
    pub min_limit: Option<Spanned<i64>>,
    pub max_limit: Option<Spanned<i64>>,
    pub queue_timeout: Option<Spanned<String>>,
    pub max_queue: Option<Spanned<i64>>,
}

/// One key part's weights in `[upstreams.protect] weights`: value -> weight.
pub type RawWeights = std::collections::BTreeMap<String, Spanned<i64>>;

/// One of an upstream's `targets`: `"host:port"` or `{ addr = "host:port", weight = 3 }`.
/// Untagged, so its fields cannot carry spans; errors point at the whole entry.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum RawTarget {
    Addr(String),
    Weighted(RawWeightedTarget),
}

/// `{ addr = "host:port", weight = 3 }`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawWeightedTarget {
    pub addr: String,
    pub weight: Option<i64>,
}

/// `[upstreams.health_check]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHealthCheck {
    #[serde(rename = "type")]
    pub kind: Option<Spanned<String>>,
    pub path: Option<Spanned<String>>,
    pub interval: Option<Spanned<String>>,
    pub timeout: Option<Spanned<String>>,
    pub healthy_threshold: Option<Spanned<i64>>,
    pub unhealthy_threshold: Option<Spanned<i64>>,
    pub expect_status: Option<Vec<Spanned<i64>>>,
}

/// `[upstreams.passive]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPassive {
    pub consecutive_failures: Option<Spanned<i64>>,
    pub eject: Option<Spanned<String>>,
}

/// One `[[routes]]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRoute {
    pub name: Spanned<String>,
    #[serde(rename = "match", default)]
    pub matcher: RawRouteMatch,
    pub upstream: Spanned<String>,
    pub auth: Option<Spanned<String>>,
}

/// A route's `match`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRouteMatch {
    pub path_prefix: Option<Spanned<String>>,
    pub path: Option<Spanned<String>>,
    pub host: Option<Spanned<String>>,
    pub methods: Option<Vec<Spanned<String>>>,
}

/// One `[[rules]]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRule {
    pub name: Spanned<String>,
    #[serde(rename = "match", default)]
    pub matcher: RawRuleMatch,
    pub key: Spanned<Vec<Spanned<String>>>,
    pub algorithm: Spanned<String>,
    pub limit: Spanned<i64>,
    pub window: Option<Spanned<String>>,
    pub burst: Option<Spanned<i64>>,
    pub scope: Option<Spanned<String>>,
    pub on_store_error: Option<Spanned<String>>,
    pub mode: Option<Spanned<String>>,
    pub max_delay: Option<Spanned<String>>,
    pub max_waiting: Option<Spanned<i64>>,
    pub cost: Option<Spanned<i64>>,
    #[serde(default)]
    pub shadow: bool,
    pub headers: Option<bool>,
    pub status: Option<Spanned<i64>>,
    pub lease: Option<Spanned<RawLease>>,
    pub lease_ttl: Option<Spanned<String>>,
    /// Calendar quotas: `calendar = "day" | "week" | "month"` instead of `window`.
    pub calendar: Option<Spanned<String>>,
    /// The IANA zone of `calendar` (default `"UTC"`).
    pub timezone: Option<Spanned<String>>,
    /// `mode = "slow"`: bytes per second of a slowed request's bodies (`"64KiB"`).
    pub slow_rate: Option<Spanned<String>>,
    pub count: Option<Spanned<RawCount>>,
    pub cost_from: Option<Spanned<String>>,
    pub block_for: Option<Spanned<String>>,
}

/// A rule's `count = { status = [401, "4xx"] }`: the responses it charges.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCount {
    pub status: Spanned<Vec<Spanned<RawStatus>>>,
}

/// One entry of `count.status`: a code or a class (`"4xx"`).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum RawStatus {
    Code(i64),
    Class(String),
}

/// A rule's `lease`: `"auto"` or a number of permits.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum RawLease {
    Permits(i64),
    Name(String),
}

/// A rule's `match`: every key given must fit.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRuleMatch {
    pub route: Option<Spanned<String>>,
    pub path: Option<Spanned<String>>,
    pub path_prefix: Option<Spanned<String>>,
    pub methods: Option<Vec<Spanned<String>>>,
    pub host: Option<Spanned<String>>,
    pub plan: Option<String>,
    pub header: Option<Spanned<RawHeaderMatch>>,
}

/// `match.header = { name = "x-tier", value = "free" }`; without `value`, presence is enough.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHeaderMatch {
    pub name: Spanned<String>,
    pub value: Option<String>,
}

/// `[rls]`: the gRPC listener Envoy asks (`envoy.service.ratelimit.v3`) and its limits.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRls {
    pub listen: Option<Spanned<String>>,
    /// Runtime threads answering the service (default: `[server] threads`).
    pub threads: Option<Spanned<i64>>,
    /// `tls = { cert, key }`: the listener speaks TLS (HTTP/2 by ALPN).
    pub tls: Option<Spanned<RawRlsTls>>,
    #[serde(default)]
    pub limits: Vec<RawRlsLimit>,
}

/// One `[[rls.limits]]`: the descriptor it answers for, and the `[[rules]]` options that
/// apply to a descriptor (how it counts, where, and what a store error does).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRlsLimit {
    pub name: Spanned<String>,
    pub domain: Spanned<String>,
    pub descriptor: Spanned<Vec<Spanned<RawDescriptorEntry>>>,
    pub algorithm: Spanned<String>,
    pub limit: Spanned<i64>,
    pub window: Option<Spanned<String>>,
    pub burst: Option<Spanned<i64>>,
    pub scope: Option<Spanned<String>>,
    pub on_store_error: Option<Spanned<String>>,
    pub mode: Option<Spanned<String>>,
    pub cost: Option<Spanned<i64>>,
    #[serde(default)]
    pub shadow: bool,
    pub lease: Option<Spanned<RawLease>>,
    pub lease_ttl: Option<Spanned<String>>,
    /// Once the limit rejects a descriptor value, that value is refused this long.
    pub block_for: Option<Spanned<String>>,
    /// Calendar quotas, as for `[[rules]]`: `calendar` instead of `window`, and its zone.
    pub calendar: Option<Spanned<String>>,
    pub timezone: Option<Spanned<String>>,
    /// Read only to refuse them with the reason: an RLS never sees the response.
    pub count: Option<Spanned<toml::Value>>,
    pub cost_from: Option<Spanned<toml::Value>>,
}

/// `[rls] tls`: the certificate chain and private key (PEM), as in `[server.tls]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRlsTls {
    pub cert: Spanned<String>,
    pub key: Spanned<String>,
}

/// One entry of a limit's `descriptor`: `{ key = "user" }` (each value its own counter) or
/// `{ key = "route", value = "orders" }` (only that value matches).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDescriptorEntry {
    pub key: Spanned<String>,
    pub value: Option<Spanned<String>>,
}
