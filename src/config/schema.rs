//! The external schema of gateway.toml and the keys file, exactly as operators write them.
//!
//! These types only mirror the file: every table denies unknown keys (a typo in a limit must not
//! turn the limit off) and values that later checks point at are `Spanned`, so an error can name
//! their line and column. `super::validate` turns them into the typed [`super::Config`].
//!
//! The same types generate the JSON Schema of `floodgate schema` ([`super::json_schema`]): each
//! field's `///` comment is its description there, so it says the default and the bounds the
//! validation checks. A `Spanned` field names its schema type with `#[schemars(with = "...")]`
//! (the same type without `Spanned`; `DurationText` for a duration); a name from a `NAMES`
//! table gets `extend("enum" = names(...))`, a default `extend("default" = ...)`.
//! `tests/schema.rs` checks that every key here is in the schema and the other way round.

use schemars::JsonSchema;
use serde::Deserialize;
use toml::Spanned;

use super::schema_parts::{names, refused, DurationText};
use super::{AuthMode, LogFormat};
use crate::limiter::calendar::Period;
use crate::limiter::policy::{FailureMode, Scope};
use crate::limiter::settings::Backend;
use crate::limiter::{Algorithm, LeakyMode};
use crate::upstream::settings::{Balance, CheckKind};
use crate::webhooks::EventKind;
use crate::wire::header_policy::Underscores;
use crate::wire::normalize::EscapedSlashes;

/// The whole gateway.toml.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    /// `[server]`: listeners, threads, timeouts and connection caps of the proxy and the admin
    /// port.
    #[serde(default)]
    pub server: RawServer,
    /// `[store]`: where the rate-limit counters live.
    #[serde(default)]
    pub store: RawStore,
    /// `[auth]`: API keys and where a request carries its key.
    #[serde(default)]
    pub auth: RawAuth,
    /// `[[upstreams]]`: the services requests are forwarded to.
    #[serde(default)]
    pub upstreams: Vec<RawUpstream>,
    /// `[[routes]]`: checked in order, the first that matches wins. A file needs at least one,
    /// unless it has `[rls]`.
    #[serde(default)]
    pub routes: Vec<RawRoute>,
    /// `[[rules]]`: the rate-limit rules, every one that matches a request applies.
    #[serde(default)]
    pub rules: Vec<RawRule>,
    /// `[[webhooks]]`: quota events sent to a customer's systems.
    #[serde(default)]
    #[schemars(with = "Vec<RawWebhook>")]
    pub webhooks: Vec<Spanned<RawWebhook>>,
    /// `[rls]`: Envoy's rate-limit service (gRPC) on the same engine.
    #[schemars(with = "Option<RawRls>")]
    pub rls: Option<Spanned<RawRls>>,
    /// `[tracing]`: OpenTelemetry spans over OTLP.
    #[schemars(with = "Option<RawTracing>")]
    pub tracing: Option<Spanned<RawTracing>>,
}

/// `[tracing]`: OpenTelemetry spans exported over OTLP. Without it, no tracing cost at all.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawTracing {
    /// The collector: `http(s)://host:port` for OTLP/gRPC, or a URL ending in `/v1/traces` for
    /// OTLP/HTTP (protobuf); no credentials in the URL. Restart to change.
    #[schemars(with = "Option<String>", extend("default" = "http://127.0.0.1:4317"))]
    pub otlp_endpoint: Option<Spanned<String>>,
    /// `"grpc"` or `"http/protobuf"` (default: by the endpoint's path). Restart to change.
    #[schemars(
        with = "Option<String>",
        extend("enum" = ["grpc", "http/protobuf"])
    )]
    pub protocol: Option<Spanned<String>>,
    /// The `service.name` resource attribute, 1 to 255 bytes. Restart to change.
    #[schemars(with = "Option<String>", length(min = 1, max = 255), extend("default" = "floodgate"))]
    pub service_name: Option<Spanned<String>>,
    /// Share of new traces sampled, 0 to 1, parent-based (a sampled parent always is, an
    /// unsampled one never). Reloaded at once.
    #[schemars(with = "Option<f64>", range(min = 0.0, max = 1.0), extend("default" = 0.01))]
    pub sample_ratio: Option<Spanned<f64>>,
    /// Continue `traceparent` from every client, not only from `trusted_proxies`. Reloaded at
    /// once.
    #[schemars(extend("default" = false))]
    pub trust_incoming: Option<bool>,
    /// Extra resource attributes (at most 64; keys and values 1 to 255 bytes). Restart to change.
    #[schemars(with = "Option<std::collections::BTreeMap<String, String>>")]
    pub resource_attributes: Option<Spanned<std::collections::BTreeMap<String, Spanned<String>>>>,
    /// One export's deadline; a batch past it is dropped and counted. Restart to change.
    #[schemars(with = "Option<DurationText>", extend("default" = "10s"))]
    pub export_timeout: Option<Spanned<String>>,
    /// Spans waiting for export at most (1 to 1,000,000); past it they are dropped and
    /// counted. Restart to change.
    #[schemars(with = "Option<i64>", range(min = 1, max = 1_000_000), extend("default" = 8192))]
    pub max_queue_size: Option<Spanned<i64>>,
    /// Spans per export at most (1 to `max_queue_size`). Restart to change.
    #[schemars(with = "Option<i64>", range(min = 1), extend("default" = 512))]
    pub max_export_batch_size: Option<Spanned<i64>>,
    /// How long, at most, finished spans wait before they are taken for export (sooner when
    /// they come fast enough to fill a quarter of the queue). Restart to change.
    #[schemars(with = "Option<DurationText>", extend("default" = "200ms"))]
    pub schedule_delay: Option<Spanned<String>>,
}

/// One `[[webhooks]]`: where quota events are POSTed.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawWebhook {
    /// The webhook's name in metrics and logs (default: the URL's host, and port if not the
    /// scheme's): never the URL's path or query, which may hold a token. Letters, digits, `-`,
    /// `_` and `.`; unique among webhooks.
    #[schemars(with = "Option<String>")]
    pub name: Option<Spanned<String>>,
    /// `http://` or `https://` with a host; credentials in the URL are refused, and so is a URL
    /// that reaches one of floodgate's own listeners.
    #[schemars(with = "String")]
    pub url: Spanned<String>,
    /// One delivery attempt's budget (connect, TLS, send, status line): 1ms to 60s.
    #[schemars(with = "Option<DurationText>", extend("default" = "5s"))]
    pub timeout: Option<Spanned<String>>,
    /// Which events to send: `"threshold"` (a counter crossed one of `thresholds`) and/or
    /// `"rejected"` (a rule rejected a request); at least one.
    #[schemars(with = "Vec<String>", extend("items" = { "enum": names(EventKind::NAMES) }))]
    pub events: Spanned<Vec<Spanned<String>>>,
    /// With `"threshold"` only, and then required: fractions of the limit above 0 and at most 1
    /// (`0.8` fires when the count reaches `ceil(0.8 × limit)`).
    #[schemars(
        with = "Option<Vec<f64>>",
        extend("items" = { "type": "number", "exclusiveMinimum": 0, "maximum": 1 })
    )]
    pub thresholds: Option<Spanned<Vec<Spanned<f64>>>>,
    /// Signs each POST: `X-Floodgate-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of
    /// "{t}.{body}">`; never sent or logged. Default: none (unsigned).
    #[schemars(with = "Option<String>")]
    pub secret: Option<Spanned<String>>,
}

/// `[server]`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawServer {
    /// Client listeners (`"host:port"`), HTTP/1.1 and h2c; at least one.
    #[schemars(with = "Option<Vec<String>>", extend("default" = ["0.0.0.0:8080"]))]
    pub listen: Option<Spanned<Vec<Spanned<String>>>>,
    /// The admin listener (`"host:port"`).
    #[schemars(with = "Option<String>", extend("default" = "127.0.0.1:9901"))]
    pub admin_listen: Option<Spanned<String>>,
    /// Worker threads, each with its own event loop; at least 1. Default: the number of CPUs.
    #[schemars(with = "Option<i64>", range(min = 1))]
    pub threads: Option<Spanned<i64>>,
    /// CIDRs (or IPs) whose `X-Forwarded-For` is believed.
    #[serde(default)]
    #[schemars(with = "Vec<String>")]
    pub trusted_proxies: Vec<Spanned<String>>,
    /// On SIGTERM, how long in-flight requests may take to finish.
    #[schemars(with = "Option<DurationText>", extend("default" = "30s"))]
    pub grace_period: Option<Spanned<String>>,
    /// If set, admin endpoints other than `/healthz`, `/` and the bare `/readyz` need
    /// `Authorization: Bearer <token>`. Not with `admin_token_file`. Default: none.
    #[schemars(with = "Option<String>")]
    pub admin_token: Option<Spanned<String>>,
    /// The admin token read from this file (relative to the config file), re-read and watched;
    /// printable ASCII without spaces. Not with `admin_token`. Default: none.
    #[schemars(with = "Option<String>")]
    pub admin_token_file: Option<Spanned<String>>,
    /// Host names the admin listener answers for besides IP literals, `localhost` and
    /// `*.localhost` (others get 421). Names only, at most 253 characters each.
    #[schemars(with = "Option<Vec<String>>", extend("default" = []))]
    pub admin_hosts: Option<Spanned<Vec<Spanned<String>>>>,
    /// Also send `X-RateLimit-Limit`, `-Remaining` and `-Reset`.
    #[serde(default)]
    pub legacy_headers: bool,
    /// One log line per request (never a secret), written off the request path.
    #[schemars(extend("default" = true))]
    pub access_log: Option<bool>,
    /// Track each rule's top clients for `GET /top` and the dashboard.
    #[schemars(extend("default" = true))]
    pub top_clients: Option<bool>,
    /// `"text"` or `"json"` (one JSON object per line).
    #[schemars(
        with = "Option<String>",
        extend("enum" = names(LogFormat::NAMES), "default" = "text")
    )]
    pub log_format: Option<Spanned<String>>,
    /// `[server.tls]`: TLS listeners (rustls, HTTP/2 by ALPN). Default: none.
    #[schemars(with = "Option<RawTls>")]
    pub tls: Option<Spanned<RawTls>>,
    /// The whole request head must arrive within this (a total deadline); 1ms to 1h.
    #[schemars(with = "Option<DurationText>", extend("default" = "10s"))]
    pub header_timeout: Option<Spanned<String>>,
    /// An idle kept-alive connection is closed after this; 1ms to 1h.
    #[schemars(with = "Option<DurationText>", extend("default" = "60s"))]
    pub keepalive_timeout: Option<Spanned<String>>,
    /// A request's whole body must arrive within this of its head; 1ms to 1h.
    #[schemars(with = "Option<DurationText>", extend("default" = "60s"))]
    pub body_timeout: Option<Spanned<String>>,
    /// Open client connections at most, over all listeners; at least 1.
    #[schemars(with = "Option<i64>", range(min = 1), extend("default" = 10000))]
    pub max_connections: Option<Spanned<i64>>,
    /// Open client connections at most from one client IP; at least 1.
    #[schemars(with = "Option<i64>", range(min = 1), extend("default" = 256))]
    pub max_connections_per_ip: Option<Spanned<i64>>,
    /// `%2F` / `%5C` in a path: `"reject"` (400), `"keep"` (left encoded) or `"unescape"`.
    #[schemars(
        with = "Option<String>",
        extend("enum" = names(EscapedSlashes::NAMES), "default" = "reject")
    )]
    pub escaped_slashes: Option<Spanned<String>>,
    /// Request headers whose names contain `_`: `"drop"` (not forwarded), `"reject"` (400) or
    /// `"allow"`.
    #[schemars(
        with = "Option<String>",
        extend("enum" = names(Underscores::NAMES), "default" = "drop")
    )]
    pub headers_with_underscores: Option<Spanned<String>>,
    /// Client networks let in (CIDRs or addresses, IPv4 and IPv6), on every route and the
    /// rate-limit service's port; anyone else gets `403`. Default: everyone.
    #[schemars(with = "Option<Vec<String>>")]
    pub allow_ips: Option<Spanned<Vec<Spanned<String>>>>,
    /// Client networks refused (`403`) on every route and the rate-limit service's port, also
    /// when `allow_ips` lists them.
    #[schemars(with = "Option<Vec<String>>")]
    pub deny_ips: Option<Spanned<Vec<Spanned<String>>>>,
}

/// `[server.tls]`: terminates TLS with rustls and negotiates HTTP/2 by ALPN.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawTls {
    /// HTTPS listeners, e.g. `["0.0.0.0:8443"]`; at least one.
    #[schemars(with = "Vec<String>")]
    pub listen: Vec<Spanned<String>>,
    /// PEM certificate chain (relative to the config file).
    #[schemars(with = "String")]
    pub cert: Spanned<String>,
    /// PEM private key (relative to the config file).
    #[schemars(with = "String")]
    pub key: Spanned<String>,
}

/// `[store]`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawStore {
    /// `"memory"` (in process), `"redis"` or `"redis-cluster"`.
    #[schemars(
        with = "Option<String>",
        extend("enum" = names(Backend::NAMES), "default" = "memory")
    )]
    pub backend: Option<Spanned<String>>,
    /// `backend = "redis"`: `redis://[user:pass@]host:port/db` or `rediss://`.
    #[schemars(with = "Option<String>")]
    pub url: Option<Spanned<String>>,
    /// `backend = "redis-cluster"`: the seed nodes' URLs.
    #[schemars(with = "Option<Vec<String>>")]
    pub urls: Option<Spanned<Vec<Spanned<String>>>>,
    /// Budget for one decision; longer than 0.
    #[schemars(with = "Option<DurationText>", extend("default" = "20ms"))]
    pub timeout: Option<Spanned<String>>,
    /// Prefix of every Redis key.
    #[schemars(extend("default" = "floodgate:"))]
    pub key_prefix: Option<String>,
    /// Gateway instances sharing the limits (`on_store_error = "local"` enforces
    /// `limit / instances`); at least 1.
    #[schemars(with = "Option<i64>", range(min = 1), extend("default" = 1))]
    pub instances: Option<Spanned<i64>>,
    /// Bound of the in-process store's keys; past it keys are evicted; at least 1.
    #[schemars(with = "Option<i64>", range(min = 1), extend("default" = 1000000))]
    pub max_keys: Option<Spanned<i64>>,
    /// Bound of the in-process `block_for` ban tables, apart from `max_keys`; at least 1.
    #[schemars(with = "Option<i64>", range(min = 1), extend("default" = 100000))]
    pub max_bans: Option<Spanned<i64>>,
    /// How long a start waits for Redis (connected, scripts loaded) before the listeners
    /// serve; longer than 0, at most 5m.
    #[schemars(with = "Option<DurationText>", extend("default" = "3s"))]
    pub connect_timeout: Option<Spanned<String>>,
}

/// `[auth]`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawAuth {
    /// Header carrying the key; `Authorization: Bearer <key>` is accepted too.
    #[schemars(with = "Option<String>", extend("default" = "x-api-key"))]
    pub header: Option<Spanned<String>>,
    /// A TOML file of `[[keys]]` tables (the fields of `[[auth.keys]]`), relative to the config
    /// file, re-read and watched. Default: none.
    #[schemars(with = "Option<String>")]
    pub keys_file: Option<Spanned<String>>,
    /// Forward the client's key upstream (stripped by default).
    #[serde(default)]
    pub forward_key: bool,
    /// `[[auth.keys]]`: the API keys.
    #[serde(default)]
    #[schemars(with = "Vec<RawKey>")]
    pub keys: Vec<Spanned<RawKey>>,
    /// `[[auth.jwt]]`: the token issuers.
    #[serde(default)]
    #[schemars(with = "Vec<RawJwt>")]
    pub jwt: Vec<Spanned<RawJwt>>,
    /// Verified tokens kept until their `exp`, at most (0: every request verifies).
    #[schemars(with = "Option<i64>", range(min = 0, max = 10000000), extend("default" = 100000))]
    pub token_cache_size: Option<Spanned<i64>>,
}

/// One `[[auth.jwt]]`: an issuer of JSON Web Tokens. Its keys come from exactly one of
/// `jwks_url`, `discovery_url`, `jwks`, `secret` or `secret_file`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawJwt {
    /// Its label in metrics, logs and `/readyz`; unique. Default: the issuer.
    #[schemars(with = "Option<String>")]
    pub name: Option<Spanned<String>>,
    /// The `iss` its tokens carry, compared whole.
    #[schemars(with = "String")]
    pub issuer: Spanned<String>,
    /// `aud` must name one of these. Default: none (not checked; a warning is logged).
    #[schemars(with = "Option<Vec<String>>")]
    pub audiences: Option<Spanned<Vec<String>>>,
    /// Where the JWK Set is fetched (http or https).
    #[schemars(with = "Option<String>")]
    pub jwks_url: Option<Spanned<String>>,
    /// An OpenID Provider's metadata URL (`.../.well-known/openid-configuration`): its
    /// `jwks_uri` is fetched, and its `issuer` must equal `issuer`.
    #[schemars(with = "Option<String>")]
    pub discovery_url: Option<Spanned<String>>,
    /// A JWK Set given inline, as JSON text.
    #[schemars(with = "Option<String>")]
    pub jwks: Option<Spanned<String>>,
    /// The shared secret of an HMAC issuer (HS256/384/512 only).
    #[schemars(with = "Option<String>")]
    pub secret: Option<Spanned<String>>,
    /// A file holding the shared secret, relative to the config file.
    #[schemars(with = "Option<String>")]
    pub secret_file: Option<Spanned<String>>,
    /// Accepted algorithms: RS256, RS384, RS512, PS256, PS384, PS512, ES256, ES384, EdDSA
    /// (public keys) or HS256, HS384, HS512 (with a secret), never mixed.
    #[schemars(with = "Option<Vec<String>>", extend("default" = ["RS256", "ES256"]))]
    pub algorithms: Option<Spanned<Vec<Spanned<String>>>>,
    /// Clock skew allowed on `exp` and `nbf`; at most 5m.
    #[schemars(with = "Option<DurationText>", extend("default" = "30s"))]
    pub leeway: Option<Spanned<String>>,
    /// The header carrying the token: `authorization` (as `Bearer <token>`), or another
    /// header holding the token alone. Not with `cookie`.
    #[schemars(with = "Option<String>", extend("default" = "authorization"))]
    pub header: Option<Spanned<String>>,
    /// A cookie carrying the token instead of a header.
    #[schemars(with = "Option<String>")]
    pub cookie: Option<Spanned<String>>,
    /// The claim naming the user (a name or a path, `realm_access.user`).
    #[schemars(with = "Option<String>", extend("default" = "sub"))]
    pub user_claim: Option<Spanned<String>>,
    /// The claim naming the plan. Default: none.
    #[schemars(with = "Option<String>")]
    pub plan_claim: Option<Spanned<String>>,
    /// The claim naming the key id (`api_key` in limit keys, `X-Floodgate-Key-Id`). Default:
    /// the user.
    #[schemars(with = "Option<String>")]
    pub key_id_claim: Option<Spanned<String>>,
    /// Forward the token upstream (default), or strip it.
    pub forward_token: Option<bool>,
    /// Refetch the JWK Set at least this often (sooner when its `Cache-Control: max-age` says).
    #[schemars(with = "Option<DurationText>", extend("default" = "10m"))]
    pub refresh_interval: Option<Spanned<String>>,
    /// Never fetch the JWK Set more often than this (a token with an unknown `kid` asks for
    /// a fetch); at most `refresh_interval`.
    #[schemars(with = "Option<DurationText>", extend("default" = "30s"))]
    pub min_refetch: Option<Spanned<String>>,
    /// One fetch's whole budget (discovery and JWK Set); at most 1m.
    #[schemars(with = "Option<DurationText>", extend("default" = "5s"))]
    pub fetch_timeout: Option<Spanned<String>>,
}

/// The keys file: only `[[keys]]` tables.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawKeysFile {
    /// `[[keys]]`: the API keys, with the fields of `[[auth.keys]]`.
    #[serde(default)]
    #[schemars(with = "Vec<RawKey>")]
    pub keys: Vec<Spanned<RawKey>>,
}

/// One `[[auth.keys]]` (or `[[keys]]` in the keys file): one of `sha256` or `secret`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawKey {
    /// The key's public name (logs, metrics, limit keys, `X-Floodgate-Key-Id`); unique.
    #[schemars(with = "String")]
    pub id: Spanned<String>,
    /// Hex SHA-256 of the secret: 64 hex digits.
    #[schemars(with = "Option<String>", regex(pattern = r"^\s*[0-9a-fA-F]{64}\s*$"))]
    pub sha256: Option<Spanned<String>>,
    /// The plaintext secret instead of `sha256`, for development (a warning is logged).
    #[schemars(with = "Option<String>")]
    pub secret: Option<Spanned<String>>,
    /// The customer; several keys may share one. Default: the id.
    #[schemars(with = "Option<String>")]
    pub user: Option<Spanned<String>>,
    /// The customer's plan; rules can match and key on it. Default: none.
    #[schemars(with = "Option<String>")]
    pub plan: Option<Spanned<String>>,
}

/// One `[[upstreams]]`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawUpstream {
    /// Referenced by routes; unique.
    #[schemars(with = "String")]
    pub name: Spanned<String>,
    /// At least one: `"host:port"` or `{ addr = "host:port", weight = 3 }`. Names are resolved
    /// in the background, never by `check`.
    #[schemars(with = "Vec<RawTarget>")]
    pub targets: Spanned<Vec<Spanned<RawTarget>>>,
    /// `"round_robin"`, `"random"` (both by weight), `"least_requests"` or `"consistent"`
    /// (Ketama hashing of `hash_key`).
    #[schemars(
        with = "Option<String>",
        extend("enum" = names(Balance::NAMES), "default" = "round_robin")
    )]
    pub balance: Option<Spanned<String>>,
    /// `balance = "consistent"` only: the parts hashed, as in a rule's `key`.
    #[schemars(with = "Option<Vec<String>>", extend("default" = ["ip"]))]
    pub hash_key: Option<Spanned<Vec<Spanned<String>>>>,
    /// TLS to the upstream (rustls).
    #[schemars(extend("default" = false))]
    pub tls: Option<bool>,
    /// `tls` only: the server name sent and verified. Default: the target's host.
    #[schemars(with = "Option<String>")]
    pub sni: Option<Spanned<String>>,
    /// `tls` only: verify the certificate chain and name (`false` is warned about at load).
    #[schemars(with = "Option<bool>", extend("default" = true))]
    pub verify: Option<Spanned<bool>>,
    /// `tls` only: PEM trust anchors (relative to the config file). Default: the system's roots.
    #[schemars(with = "Option<String>")]
    pub ca_file: Option<Spanned<String>>,
    /// `tls` only: PEM certificate chain presented to the upstream (mTLS), with `client_key`.
    #[schemars(with = "Option<String>")]
    pub client_cert: Option<Spanned<String>>,
    /// `tls` only: PEM private key of `client_cert`.
    #[schemars(with = "Option<String>")]
    pub client_key: Option<Spanned<String>>,
    /// HTTP/2 to the upstream (ALPN `h2`); needs `tls = true`.
    #[schemars(with = "Option<bool>", extend("default" = false))]
    pub http2: Option<Spanned<bool>>,
    /// The Host header sent upstream. Default: the client's Host.
    #[schemars(with = "Option<String>")]
    pub host_header: Option<Spanned<String>>,
    /// Per connection attempt (TCP and TLS handshake).
    #[schemars(with = "Option<DurationText>", extend("default" = "1s"))]
    pub connect_timeout: Option<Spanned<String>>,
    /// Longest wait for the upstream's next bytes; past it 504.
    #[schemars(with = "Option<DurationText>", extend("default" = "30s"))]
    pub read_timeout: Option<Spanned<String>>,
    /// Longest wait to write to the upstream.
    #[schemars(with = "Option<DurationText>", extend("default" = "30s"))]
    pub write_timeout: Option<Spanned<String>>,
    /// How long an idle pooled connection is kept.
    #[schemars(with = "Option<DurationText>", extend("default" = "60s"))]
    pub idle_timeout: Option<Spanned<String>>,
    /// The whole exchange with the upstream, first byte out to last byte in; past it 504.
    #[schemars(with = "Option<DurationText>", extend("default" = "60s"))]
    pub timeout: Option<Spanned<String>>,
    /// An upgraded connection (WebSocket) is closed when either side has sent nothing this long.
    #[schemars(with = "Option<DurationText>", extend("default" = "5m"))]
    pub tunnel_timeout: Option<Spanned<String>>,
    /// Further attempts, 0 to 10, for idempotent methods only, before any response byte.
    #[schemars(with = "Option<i64>", range(min = 0, max = 10), extend("default" = 1))]
    pub retries: Option<Spanned<i64>>,
    /// How often names are re-resolved.
    #[schemars(with = "Option<DurationText>", extend("default" = "30s"))]
    pub resolve_interval: Option<Spanned<String>>,
    /// `[upstreams.health_check]`: active checks. Default: none (every target healthy).
    #[schemars(with = "Option<RawHealthCheck>")]
    pub health_check: Option<Spanned<RawHealthCheck>>,
    /// `[upstreams.passive]`: ejection on live-traffic failures. Default: off.
    #[schemars(with = "Option<RawPassive>")]
    pub passive: Option<Spanned<RawPassive>>,
    /// `[upstreams.protect]`: an adaptive concurrency limit shared fairly between tenants.
    /// Default: off.
    #[schemars(with = "Option<RawProtect>")]
    pub protect: Option<Spanned<RawProtect>>,
}

/// `[upstreams.protect]`: an adaptive concurrency limit with a weighted fair queue of tenants.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawProtect {
    /// Who a tenant is: key parts as in a rule's `key`. Default: the customer (the key's
    /// `user`, or the client IP's /24 or /64 without a key).
    #[schemars(with = "Option<Vec<String>>")]
    pub fair_by: Option<Spanned<Vec<Spanned<String>>>>,
    /// Shares under contention per key part and value, 1 to 1000, e.g.
    /// `{ plan = { pro = 4, free = 1 } }`. Default: every tenant 1.
    #[schemars(
        with = "Option<std::collections::BTreeMap<String, std::collections::BTreeMap<String, i64>>>"
    )]
    pub weights: Option<Spanned<std::collections::BTreeMap<String, Spanned<RawWeights>>>>,
    /// The adaptive limit never goes below this (it starts here); 1 to 100000.
    #[schemars(with = "Option<i64>", range(min = 1, max = 100000), extend("default" = 4))]
    pub min_limit: Option<Spanned<i64>>,
    /// Nor above this; 1 to 100000, at least `min_limit`.
    #[schemars(with = "Option<i64>", range(min = 1, max = 100000), extend("default" = 1000))]
    pub max_limit: Option<Spanned<i64>>,
    /// Longest wait for a turn, at most 60s; then 503 upstream-overloaded.
    #[schemars(with = "Option<DurationText>", extend("default" = "500ms"))]
    pub queue_timeout: Option<Spanned<String>>,
    /// Requests waiting, over all tenants; 1 to 100000.
    #[schemars(with = "Option<i64>", range(min = 1, max = 100000), extend("default" = 1000))]
    pub max_queue: Option<Spanned<i64>>,
}

/// One key part's weights in `[upstreams.protect] weights`: value -> weight.
pub type RawWeights = std::collections::BTreeMap<String, Spanned<i64>>;

/// One of an upstream's `targets`: `"host:port"` or `{ addr = "host:port", weight = 3 }`.
/// Untagged, so its fields cannot carry spans; errors point at the whole entry.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum RawTarget {
    /// `"host:port"` (a DNS name, an IPv4 address or `[IPv6]`), weight 1.
    Addr(String),
    /// `{ addr = "host:port", weight = 3 }`.
    Weighted(RawWeightedTarget),
}

/// `{ addr = "host:port", weight = 3 }`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawWeightedTarget {
    /// `"host:port"` (a DNS name, an IPv4 address or `[IPv6]`).
    pub addr: String,
    /// The target's relative share, 1 to 1000.
    #[schemars(range(min = 1, max = 1000), extend("default" = 1))]
    pub weight: Option<i64>,
}

/// `[upstreams.health_check]`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawHealthCheck {
    /// `"http"` (`GET path`, healthy if its status is in `expect_status`) or `"tcp"` (a connect).
    #[serde(rename = "type")]
    #[schemars(
        with = "Option<String>",
        extend("enum" = names(CheckKind::NAMES), "default" = "http")
    )]
    pub kind: Option<Spanned<String>>,
    /// `http` only: the path checked, starting with `/`.
    #[schemars(with = "Option<String>", extend("default" = "/healthz"))]
    pub path: Option<Spanned<String>>,
    /// Time between checks.
    #[schemars(with = "Option<DurationText>", extend("default" = "5s"))]
    pub interval: Option<Spanned<String>>,
    /// One check's deadline.
    #[schemars(with = "Option<DurationText>", extend("default" = "1s"))]
    pub timeout: Option<Spanned<String>>,
    /// Good checks in a row that bring a target back; at least 1.
    #[schemars(with = "Option<i64>", range(min = 1), extend("default" = 2))]
    pub healthy_threshold: Option<Spanned<i64>>,
    /// Failed checks in a row that take it out; at least 1.
    #[schemars(with = "Option<i64>", range(min = 1), extend("default" = 3))]
    pub unhealthy_threshold: Option<Spanned<i64>>,
    /// Statuses (100 to 599) an `http` check accepts.
    #[schemars(
        with = "Option<Vec<i64>>",
        extend("default" = [200], "items" = { "type": "integer", "minimum": 100, "maximum": 599 })
    )]
    pub expect_status: Option<Vec<Spanned<i64>>>,
}

/// `[upstreams.passive]`: outlier detection from live traffic.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawPassive {
    /// 5xx answers, connect failures, resets and timeouts in a row that eject a target; at
    /// least 1.
    #[schemars(with = "Option<i64>", range(min = 1), extend("default" = 5))]
    pub consecutive_failures: Option<Spanned<i64>>,
    /// How long an ejected target gets no traffic.
    #[schemars(with = "Option<DurationText>", extend("default" = "30s"))]
    pub eject: Option<Spanned<String>>,
}

/// One `[[routes]]`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawRoute {
    /// Unique; rules match on it.
    #[schemars(with = "String")]
    pub name: Spanned<String>,
    /// What the request must fit; every key given must. Default: `{}` (everything).
    #[serde(rename = "match", default)]
    pub matcher: RawRouteMatch,
    /// An `[[upstreams]]` name.
    #[schemars(with = "String")]
    pub upstream: Spanned<String>,
    /// `"required"` (401 without a valid API key or token), `"key"` (an API key only),
    /// `"token"` (a `[[auth.jwt]]` token only), `"optional"` (anonymous passes, a wrong key or
    /// token gets 401) or `"none"` (neither is read).
    #[schemars(
        with = "Option<String>",
        extend("enum" = names(AuthMode::NAMES), "default" = "required")
    )]
    pub auth: Option<Spanned<String>>,
    /// This route's own `escaped_slashes` (default: `[server] escaped_slashes`): a path the
    /// server's mode refuses is served when, read under the route's mode, it matches this route
    /// first; `"reject"` refuses escapes the server keeps.
    #[schemars(
        with = "Option<String>",
        extend("enum" = names(EscapedSlashes::NAMES))
    )]
    pub escaped_slashes: Option<Spanned<String>>,
    /// `false`: the route's paths, and the `path` / `path_prefix` of the rules that apply to its
    /// requests, match ignoring ASCII case (for backends that serve `/Orders` as `/orders`);
    /// the path is forwarded as the client sent it.
    #[schemars(extend("default" = true))]
    pub case_sensitive: Option<bool>,
    /// `true`: the matched `path_prefix` (or `path`) is removed before forwarding
    /// (`/svc/a?x=1` goes upstream as `/a?x=1`, `/svc` as `/`).
    #[schemars(with = "Option<bool>", extend("default" = false))]
    pub strip_prefix: Option<Spanned<bool>>,
    /// Replaces the matched `path_prefix` (or `path`) before forwarding: `"/orders"` sends
    /// `/api/orders/7` as `/orders/7`. Starts with `/`.
    #[schemars(with = "Option<String>")]
    pub prefix_rewrite: Option<Spanned<String>>,
    /// Replaces every match of `pattern` (the `regex` crate's syntax) in the path (without its
    /// query) by `substitution` (`$1`, `${name}`); a path it does not match is kept.
    #[schemars(with = "Option<RawRegexRewrite>")]
    pub regex_rewrite: Option<Spanned<RawRegexRewrite>>,
    /// The upstream's `Host` on this route (wins over the upstream's `host_header`).
    #[schemars(with = "Option<String>")]
    pub host_rewrite: Option<Spanned<String>>,
    /// Headers of the request forwarded upstream, edited: `set`, `add`, `remove`.
    #[schemars(with = "Option<RawHeaderEdits>")]
    pub request_headers: Option<Spanned<RawHeaderEdits>>,
    /// Headers of every answer on this route, the upstream's and floodgate's own, edited.
    #[schemars(with = "Option<RawHeaderEdits>")]
    pub response_headers: Option<Spanned<RawHeaderEdits>>,
    /// Cross-origin requests from browsers: preflights answered here, CORS headers on every
    /// answer to an allowed origin.
    #[schemars(with = "Option<RawCors>")]
    pub cors: Option<Spanned<RawCors>>,
    /// Client networks let in on this route (CIDRs or addresses); anyone else gets `403`.
    #[schemars(with = "Option<Vec<String>>")]
    pub allow_ips: Option<Spanned<Vec<Spanned<String>>>>,
    /// Client networks refused (`403`) on this route, also when `allow_ips` lists them.
    #[schemars(with = "Option<Vec<String>>")]
    pub deny_ips: Option<Spanned<Vec<Spanned<String>>>>,
}

/// A route's `regex_rewrite`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawRegexRewrite {
    /// The `regex` crate's syntax; at most 4096 bytes, compiled within 1 MiB.
    #[schemars(with = "String")]
    pub pattern: Spanned<String>,
    /// What each match becomes: `$1`, `${1}`, `${name}` for groups, `$$` for `$`.
    #[schemars(with = "String")]
    pub substitution: Spanned<String>,
}

/// A route's `request_headers` or `response_headers`. Values may name `${key_id}`,
/// `${user}`, `${plan}`, `${client_ip}`, `${request_id}` and `${route}`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawHeaderEdits {
    /// Headers given this value, replacing any they had.
    #[schemars(with = "Option<std::collections::BTreeMap<String, String>>")]
    pub set: Option<std::collections::BTreeMap<String, Spanned<String>>>,
    /// Headers given this value beside any they had.
    #[schemars(with = "Option<std::collections::BTreeMap<String, String>>")]
    pub add: Option<std::collections::BTreeMap<String, Spanned<String>>>,
    /// Headers removed.
    #[schemars(with = "Option<Vec<String>>")]
    pub remove: Option<Vec<Spanned<String>>>,
}

/// A route's `cors`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawCors {
    /// Exact origins (`"https://app.example.com"`), `"*"`, or one-label wildcards
    /// (`"https://*.example.com"`); at least one.
    #[schemars(with = "Vec<String>")]
    pub allow_origins: Vec<Spanned<String>>,
    /// Methods a preflight allows. Default: GET, HEAD, POST, PUT, PATCH, DELETE.
    #[schemars(with = "Option<Vec<String>>")]
    pub allow_methods: Option<Vec<Spanned<String>>>,
    /// Request headers a preflight allows. Default: those the preflight asks for.
    #[schemars(with = "Option<Vec<String>>")]
    pub allow_headers: Option<Vec<Spanned<String>>>,
    /// Response headers a page may read, besides RateLimit, RateLimit-Policy, Retry-After and
    /// X-Request-Id, which are always exposed.
    #[schemars(with = "Option<Vec<String>>")]
    pub expose_headers: Option<Vec<Spanned<String>>>,
    /// How long a browser may keep a preflight's answer (`Access-Control-Max-Age`), e.g.
    /// `"10m"`. Default: not sent (the browser's own, 5 s).
    #[schemars(with = "Option<DurationText>")]
    pub max_age: Option<Spanned<String>>,
    /// Allow cookies and HTTP authentication (`Access-Control-Allow-Credentials: true`); not
    /// with `"*"`.
    #[serde(default)]
    pub allow_credentials: bool,
}

/// A route's `match`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawRouteMatch {
    /// On `/` boundaries: `/orders` matches `/orders/1`, not `/ordersx`.
    #[schemars(with = "Option<String>")]
    pub path_prefix: Option<Spanned<String>>,
    /// The exact path.
    #[schemars(with = "Option<String>")]
    pub path: Option<Spanned<String>>,
    /// The Host (port and case ignored).
    #[schemars(with = "Option<String>")]
    pub host: Option<Spanned<String>>,
    /// HTTP methods, e.g. `["GET", "POST"]`.
    #[schemars(with = "Option<Vec<String>>")]
    pub methods: Option<Vec<Spanned<String>>>,
}

/// One `[[rules]]`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawRule {
    /// Unique (also among `[[rls.limits]]`); shown in headers, metrics and logs. Non-empty,
    /// without `"`, `\` or control characters.
    #[schemars(with = "String")]
    pub name: Spanned<String>,
    /// What the request must fit; every key given must. Default: `{}` (every request).
    #[serde(rename = "match", default)]
    pub matcher: RawRuleMatch,
    /// Parts combined into one counter key: `ip`, `api_key`, `user`, `plan`, `route`, `method`,
    /// `path`, `"header:NAME"`, `"query:NAME"`; at least one.
    #[schemars(with = "Vec<String>", length(min = 1))]
    pub key: Spanned<Vec<Spanned<String>>>,
    /// How the rule counts.
    #[schemars(with = "String", extend("enum" = names(Algorithm::NAMES)))]
    pub algorithm: Spanned<String>,
    /// Requests per `window` (`concurrency`: in flight); 1 to 10^15 (`sliding_window_log`: to
    /// 1,000,000).
    #[schemars(with = "i64", range(min = 1, max = 1_000_000_000_000_000_i64))]
    pub limit: Spanned<i64>,
    /// The window (every algorithm but `concurrency`, which takes none); 1ms to 3650d.
    #[schemars(with = "Option<DurationText>")]
    pub window: Option<Spanned<String>>,
    /// `token_bucket`: bucket size; `leaky_bucket`: how many may be in the bucket or wait; 1 to
    /// 10^15. Default: `limit`.
    #[schemars(with = "Option<i64>", range(min = 1, max = 1_000_000_000_000_000_i64))]
    pub burst: Option<Spanned<i64>>,
    /// `"global"` (counted in the store) or `"local"` (per instance, never the store).
    #[schemars(
        with = "Option<String>",
        extend("enum" = names(Scope::NAMES), "default" = "global")
    )]
    pub scope: Option<Spanned<String>>,
    /// When the store fails: `"open"` admits, `"closed"` answers 503, `"local"` enforces
    /// `limit / instances` in process.
    #[schemars(
        with = "Option<String>",
        extend("enum" = names(FailureMode::NAMES), "default" = "open")
    )]
    pub on_store_error: Option<Spanned<String>>,
    /// Past the limit: `"police"` rejects; `"shape"` (`leaky_bucket` only) holds the request
    /// until its turn; `"slow"` (not `concurrency`) forwards it with its bodies at `slow_rate`.
    #[schemars(
        with = "Option<String>",
        extend("enum" = names(LeakyMode::NAMES), "default" = "police")
    )]
    pub mode: Option<Spanned<String>>,
    /// `leaky_bucket` with `mode = "shape"`: the longest a request is held; at most 60s.
    /// Default: `window`, at most 60s.
    #[schemars(with = "Option<DurationText>")]
    pub max_delay: Option<Spanned<String>>,
    /// `leaky_bucket` with `mode = "shape"`: requests held waiting at once (per instance); at
    /// least 1.
    #[schemars(with = "Option<i64>", range(min = 1), extend("default" = 1000))]
    pub max_waiting: Option<Spanned<i64>>,
    /// Units a request costs; at least 1, and it must fit in `limit` (`burst` for buckets).
    #[schemars(with = "Option<i64>", range(min = 1), extend("default" = 1))]
    pub cost: Option<Spanned<i64>>,
    /// Evaluate and count but never reject: dark-launch a limit.
    #[serde(default)]
    pub shadow: bool,
    /// Show this rule in the RateLimit headers.
    #[schemars(extend("default" = true))]
    pub headers: Option<bool>,
    /// Status of this rule's rejections, 400 to 599.
    #[schemars(with = "Option<i64>", range(min = 400, max = 599), extend("default" = 429))]
    pub status: Option<Spanned<i64>>,
    /// Global `fixed_window`, `sliding_window_counter`, `token_bucket` and `leaky_bucket`
    /// (police) only: `"auto"` or a number of permits (at least `cost`) leased from the store at
    /// a time. Default: none (every request asks the store).
    #[schemars(with = "Option<RawLease>")]
    pub lease: Option<Spanned<RawLease>>,
    /// With `lease`: how long an instance may hold unspent permits; at least 10ms.
    #[schemars(with = "Option<DurationText>", extend("default" = "1s"))]
    pub lease_ttl: Option<Spanned<String>>,
    /// `fixed_window` only, instead of `window`: `"day"`, `"week"` (from Monday) or `"month"`,
    /// each from midnight in `timezone`.
    #[schemars(with = "Option<String>", extend("enum" = names(Period::NAMES)))]
    pub calendar: Option<Spanned<String>>,
    /// With `calendar` only: the IANA zone whose midnights start the periods.
    #[schemars(with = "Option<String>", extend("default" = "UTC"))]
    pub timezone: Option<Spanned<String>>,
    /// With `mode = "slow"` (required there): bytes per second of a slowed request's bodies, a
    /// whole number of `B`, `KiB` or `MiB` from 1KiB to 1024MiB (`"64KiB"`).
    #[schemars(
        with = "Option<String>",
        regex(pattern = r"^\s*[0-9]+\s*(B|KiB|MiB)\s*$")
    )]
    pub slow_rate: Option<Spanned<String>>,
    /// `{ status = [401, "4xx"] }`: only responses with these statuses are charged, the others
    /// refunded. Not with `concurrency`, `mode = "shape"` or `"slow"`, or `cost_from`.
    /// Default: none (every admitted request is charged).
    #[schemars(with = "Option<RawCount>")]
    pub count: Option<Spanned<RawCount>>,
    /// `"header:NAME"` or `"json:dotted.path"`: the request's true cost, read from the
    /// response (`cost` is reserved at admission). Not with `concurrency`, `mode = "shape"` or
    /// `count`. Default: none.
    #[schemars(with = "Option<String>")]
    pub cost_from: Option<Spanned<String>>,
    /// Once this rule rejects a key, that key is refused this long (1ms to 3650d). Not with
    /// `concurrency`, `mode = "shape"` or `"slow"`, or `lease`. Default: none.
    #[schemars(with = "Option<DurationText>")]
    pub block_for: Option<Spanned<String>>,
    /// The limit of each request from a verified token's claim, `"claim:NAME"` (a whole
    /// number, or a string of one); absent or not a number: `limit`. Needs `limit_max`; not
    /// with `lease`.
    #[schemars(with = "Option<String>")]
    pub limit_from: Option<Spanned<String>>,
    /// The most `limit_from` may grant, 1 to 1000000000.
    #[schemars(with = "Option<i64>", range(min = 1, max = 1000000000))]
    pub limit_max: Option<Spanned<i64>>,
}

/// A rule's `count = { status = [401, "4xx"] }`: the responses it charges.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawCount {
    /// Codes 100 to 599 or classes `"1xx"` to `"5xx"`; at least one.
    #[schemars(with = "Vec<RawStatus>", length(min = 1))]
    pub status: Spanned<Vec<Spanned<RawStatus>>>,
}

/// One entry of `count.status`: a code or a class (`"4xx"`).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum RawStatus {
    /// A status code, 100 to 599.
    Code(#[schemars(range(min = 100, max = 599))] i64),
    /// A class: `"1xx"` to `"5xx"`.
    Class(#[schemars(regex(pattern = r"^[1-5]xx$"))] String),
}

/// A rule's `lease`: `"auto"` or a number of permits.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum RawLease {
    /// Permits leased at a time; at least 1 and at least the rule's `cost`.
    Permits(#[schemars(range(min = 1))] i64),
    /// `"auto"`: sized from the rule's limit and traffic.
    Name(#[schemars(regex(pattern = r"^auto$"))] String),
}

/// A rule's `match`: every key given must fit.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawRuleMatch {
    /// A `[[routes]]` name.
    #[schemars(with = "Option<String>")]
    pub route: Option<Spanned<String>>,
    /// The exact path.
    #[schemars(with = "Option<String>")]
    pub path: Option<Spanned<String>>,
    /// On `/` boundaries: `/orders` matches `/orders/1`, not `/ordersx`.
    #[schemars(with = "Option<String>")]
    pub path_prefix: Option<Spanned<String>>,
    /// HTTP methods, e.g. `["POST"]`.
    #[schemars(with = "Option<Vec<String>>")]
    pub methods: Option<Vec<Spanned<String>>>,
    /// The Host (port and case ignored).
    #[schemars(with = "Option<String>")]
    pub host: Option<Spanned<String>>,
    /// The key's plan.
    pub plan: Option<String>,
    /// `{ name = "x-tier", value = "free" }`; without `value`, presence is enough.
    #[schemars(with = "Option<RawHeaderMatch>")]
    pub header: Option<Spanned<RawHeaderMatch>>,
    /// A verified token's claim: `{ name = "scope", contains = "orders:write" }`, `{ name =
    /// "tenant", equals = "acme" }`; with neither, presence is enough. Requests without a token
    /// never match.
    #[schemars(with = "Option<RawClaimMatch>")]
    pub claim: Option<Spanned<RawClaimMatch>>,
}

/// `match.claim`: a claim by name or path (`realm_access.roles`), and at most one test.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawClaimMatch {
    /// The claim's name, or a path into nested claims (`realm_access.roles`).
    #[schemars(with = "String")]
    pub name: Spanned<String>,
    /// The value it must have (a string; a number or boolean as written in JSON).
    pub equals: Option<String>,
    /// A value an array claim must hold, or a word of a space-separated one (`scope`).
    pub contains: Option<String>,
}

/// `match.header = { name = "x-tier", value = "free" }`; without `value`, presence is enough.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawHeaderMatch {
    /// The header's name.
    #[schemars(with = "String")]
    pub name: Spanned<String>,
    /// The value it must have, compared whole. Default: none (presence is enough).
    pub value: Option<String>,
}

/// `[rls]`: the gRPC listener Envoy asks (`envoy.service.ratelimit.v3`) and its limits.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawRls {
    /// The gRPC listener (HTTP/2 cleartext, or TLS with `tls`); a change waits for a restart.
    #[schemars(with = "Option<String>", extend("default" = "127.0.0.1:8081"))]
    pub listen: Option<Spanned<String>>,
    /// Threads answering the service, 1 to 256 (each a current-thread runtime). Default:
    /// `[server] threads`.
    #[schemars(with = "Option<i64>", range(min = 1, max = 256))]
    pub threads: Option<Spanned<i64>>,
    /// `tls = { cert, key }`: the listener speaks TLS (HTTP/2 by ALPN). Default: none.
    #[schemars(with = "Option<RawRlsTls>")]
    pub tls: Option<Spanned<RawRlsTls>>,
    /// Open connections to the listener at most (its own cap, beside `[server]`'s); at least 1.
    #[schemars(with = "Option<i64>", range(min = 1), extend("default" = 1000))]
    pub max_connections: Option<Spanned<i64>>,
    /// Open connections to the listener at most from one client IP; at least 1.
    #[schemars(with = "Option<i64>", range(min = 1), extend("default" = 100))]
    pub max_connections_per_ip: Option<Spanned<i64>>,
    /// The TLS handshake and the HTTP/2 preface must arrive within this of accept; 1ms to 1h.
    #[schemars(with = "Option<DurationText>", extend("default" = "10s"))]
    pub header_timeout: Option<Spanned<String>>,
    /// A call's request message must arrive within this of its headers; 1ms to 1h.
    #[schemars(with = "Option<DurationText>", extend("default" = "10s"))]
    pub request_timeout: Option<Spanned<String>>,
    /// A connection with no call open and no PING from the client for this long is closed
    /// (GOAWAY); 1ms to 24h.
    #[schemars(with = "Option<DurationText>", extend("default" = "5m"))]
    pub idle_timeout: Option<Spanned<String>>,
    /// Calls (HTTP/2 streams) one connection may have open at once; 1 to 1000.
    #[schemars(with = "Option<i64>", range(min = 1, max = 1000), extend("default" = 100))]
    pub max_streams: Option<Spanned<i64>>,
    /// `[[rls.limits]]`: the descriptors answered.
    #[serde(default)]
    pub limits: Vec<RawRlsLimit>,
}

/// One `[[rls.limits]]`: the descriptor it answers for, and the `[[rules]]` options that
/// apply to a descriptor (how it counts, where, and what a store error does).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawRlsLimit {
    /// Unique among rls limits and `[[rules]]`; the same characters as a rule name.
    #[schemars(with = "String")]
    pub name: Spanned<String>,
    /// The `domain` of Envoy's `ratelimit` filter this limit answers; non-empty.
    #[schemars(with = "String", length(min = 1))]
    pub domain: Spanned<String>,
    /// 1 to 16 entries `{ key = "user" }` (each value its own counter) or
    /// `{ key = "route", value = "orders" }` (only that value).
    #[schemars(with = "Vec<RawDescriptorEntry>", length(min = 1, max = 16))]
    pub descriptor: Spanned<Vec<Spanned<RawDescriptorEntry>>>,
    /// How the limit counts, as for `[[rules]]` (not `concurrency`).
    #[schemars(with = "String", extend("enum" = names(Algorithm::NAMES)))]
    pub algorithm: Spanned<String>,
    /// As for `[[rules]]`: 1 to 10^15 (`sliding_window_log`: to 1,000,000).
    #[schemars(with = "i64", range(min = 1, max = 1_000_000_000_000_000_i64))]
    pub limit: Spanned<i64>,
    /// As for `[[rules]]`: 1ms to 3650d.
    #[schemars(with = "Option<DurationText>")]
    pub window: Option<Spanned<String>>,
    /// As for `[[rules]]`: 1 to 10^15. Default: `limit`.
    #[schemars(with = "Option<i64>", range(min = 1, max = 1_000_000_000_000_000_i64))]
    pub burst: Option<Spanned<i64>>,
    /// As for `[[rules]]`: `"global"` or `"local"`.
    #[schemars(
        with = "Option<String>",
        extend("enum" = names(Scope::NAMES), "default" = "global")
    )]
    pub scope: Option<Spanned<String>>,
    /// As for `[[rules]]`: `"open"`, `"closed"` or `"local"`.
    #[schemars(
        with = "Option<String>",
        extend("enum" = names(FailureMode::NAMES), "default" = "open")
    )]
    pub on_store_error: Option<Spanned<String>>,
    /// Only `"police"` (a shaping bucket would hold Envoy's question past its timeout).
    #[schemars(with = "Option<String>", extend("enum" = ["police"], "default" = "police"))]
    pub mode: Option<Spanned<String>>,
    /// What a descriptor costs when Envoy sends no `hits_addend`; at least 1.
    #[schemars(with = "Option<i64>", range(min = 1), extend("default" = 1))]
    pub cost: Option<Spanned<i64>>,
    /// Evaluate and count but never reject.
    #[serde(default)]
    pub shadow: bool,
    /// As for `[[rules]]`: `"auto"` or a number of permits. Default: none.
    #[schemars(with = "Option<RawLease>")]
    pub lease: Option<Spanned<RawLease>>,
    /// With `lease`: at least 10ms.
    #[schemars(with = "Option<DurationText>", extend("default" = "1s"))]
    pub lease_ttl: Option<Spanned<String>>,
    /// Once the limit rejects a descriptor value, that value is refused this long (1ms to
    /// 3650d). Not with `lease`. Default: none.
    #[schemars(with = "Option<DurationText>")]
    pub block_for: Option<Spanned<String>>,
    /// Calendar quotas, as for `[[rules]]`: `calendar` instead of `window` (`fixed_window`
    /// only).
    #[schemars(with = "Option<String>", extend("enum" = names(Period::NAMES)))]
    pub calendar: Option<Spanned<String>>,
    /// With `calendar` only: the IANA zone whose midnights start the periods.
    #[schemars(with = "Option<String>", extend("default" = "UTC"))]
    pub timezone: Option<Spanned<String>>,
    /// Refused with the reason: an RLS never sees the response, so there is no status to count.
    #[serde(default)]
    #[schemars(schema_with = "refused")]
    pub count: Option<Spanned<toml::Value>>,
    /// Refused with the reason: an RLS never sees the response (send a cost as `hits_addend`).
    #[serde(default)]
    #[schemars(schema_with = "refused")]
    pub cost_from: Option<Spanned<toml::Value>>,
}

/// `[rls] tls`: the certificate chain and private key (PEM), as in `[server.tls]`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawRlsTls {
    /// PEM certificate chain (relative to the config file).
    #[schemars(with = "String")]
    pub cert: Spanned<String>,
    /// PEM private key (relative to the config file).
    #[schemars(with = "String")]
    pub key: Spanned<String>,
}

/// One entry of a limit's `descriptor`: `{ key = "user" }` (each value its own counter) or
/// `{ key = "route", value = "orders" }` (only that value matches).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawDescriptorEntry {
    /// The descriptor entry's key; non-empty.
    #[schemars(with = "String", length(min = 1))]
    pub key: Spanned<String>,
    /// The only value that matches, compared whole, at most 1024 bytes. Default: none (each
    /// value its own counter).
    #[schemars(with = "Option<String>", length(max = 1024))]
    pub value: Option<Spanned<String>>,
}
