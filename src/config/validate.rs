//! Turns the raw schema into a [`Config`], checking everything a request would trip over later.
//!
//! Every error carries the span of the value at fault, so `floodgate check` can say
//! `gateway.toml:42:9: route "orders" names upstream "order", which is not defined`.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, Method};
use ipnet::IpNet;
use toml::Spanned;

use super::duration::parse_duration;
use super::schema::*;
use super::*;
use crate::auth::{digest_of, ApiKey, HeaderText, Identity, KeyStore};
use crate::limiter::algorithm::{MAX_COUNT, MAX_WINDOW};
use crate::limiter::engine::MAX_WAITING_PER_RULE;
use crate::limiter::lease::{Lease, LeaseSize, DEFAULT_LEASE_TTL};
use crate::limiter::{Algorithm, LeakyMode, Limit};
use crate::rules::{FailureMode, KeyPart, Policy, Rule, RuleMatch, Scope};

/// The file being validated: every error points into it.
struct Src<'a> {
    path: &'a Path,
    text: &'a str,
}

impl Src<'_> {
    fn err(&self, span: Range<usize>, msg: impl Into<String>) -> ConfigError {
        ConfigError::at(self.path, self.text, Some(span), msg)
    }

    fn duration(&self, v: &Spanned<String>) -> Result<Duration, ConfigError> {
        parse_duration(v.get_ref()).map_err(|m| self.err(v.span(), m))
    }

    /// A duration longer than 0 (`what` names it in the error), `default` when absent.
    fn nonzero_duration_or(
        &self,
        v: &Option<Spanned<String>>,
        default: Duration,
        what: &str,
    ) -> Result<Duration, ConfigError> {
        let Some(d) = v else {
            return Ok(default);
        };
        let got = self.duration(d)?;
        if got.is_zero() {
            return Err(self.err(d.span(), format!("{what} must be longer than 0")));
        }
        Ok(got)
    }

    fn positive(&self, v: &Spanned<i64>, what: &str) -> Result<u64, ConfigError> {
        match u64::try_from(*v.get_ref()) {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(self.err(
                v.span(),
                format!("{what} must be a whole number of at least 1"),
            )),
        }
    }

    fn socket_addr(&self, v: &Spanned<String>, what: &str) -> Result<SocketAddr, ConfigError> {
        v.get_ref().parse().map_err(|_| {
            self.err(
                v.span(),
                format!(
                    "{what} \"{}\" is not an address like \"0.0.0.0:8080\" or \"[::1]:8080\"",
                    v.get_ref()
                ),
            )
        })
    }

    fn methods(&self, list: &[Spanned<String>]) -> Result<Vec<Method>, ConfigError> {
        list.iter()
            .map(|m| {
                let upper = m.get_ref().to_ascii_uppercase();
                Method::from_bytes(upper.as_bytes()).map_err(|_| {
                    self.err(
                        m.span(),
                        format!("\"{}\" is not an HTTP method", m.get_ref()),
                    )
                })
            })
            .collect()
    }

    fn path(&self, v: &Option<Spanned<String>>) -> Result<Option<String>, ConfigError> {
        match v {
            Some(p) if !p.get_ref().starts_with('/') => Err(self.err(
                p.span(),
                format!("path \"{}\" must start with \"/\"", p.get_ref()),
            )),
            // Compared with normalized request paths, so normalized the same way.
            Some(p) => crate::normalize::path(p.get_ref(), crate::normalize::EscapedSlashes::Keep)
                .map(|n| Some(n.into_owned()))
                .map_err(|e| self.err(p.span(), format!("path \"{}\": {e}", p.get_ref()))),
            None => Ok(None),
        }
    }

    /// A `match.host`, normalized as request hosts are (lower case, no port, no trailing dot).
    fn host(&self, v: &Option<Spanned<String>>) -> Result<Option<String>, ConfigError> {
        match v {
            Some(h) => crate::normalize::host(h.get_ref())
                .map(|n| Some(n.into_owned()))
                .map_err(|e| self.err(h.span(), format!("host \"{}\": {e}", h.get_ref()))),
            None => Ok(None),
        }
    }

    fn one_of<T: Copy>(
        &self,
        v: &Spanned<String>,
        what: &str,
        options: &[(&str, T)],
    ) -> Result<T, ConfigError> {
        options
            .iter()
            .find(|(name, _)| *name == v.get_ref())
            .map(|(_, t)| *t)
            .ok_or_else(|| {
                let names: Vec<String> = options.iter().map(|(n, _)| format!("\"{n}\"")).collect();
                self.err(
                    v.span(),
                    format!(
                        "{what} \"{}\" is not one of {}",
                        v.get_ref(),
                        names.join(", ")
                    ),
                )
            })
    }
}

/// Parses and validates `text`, the contents of `path`.
pub fn validate(path: &Path, text: &str) -> Result<Config, ConfigError> {
    let src = Src { path, text };
    let raw: RawConfig = toml::from_str(text)
        .map_err(|e| ConfigError::at(path, text, e.span(), e.message().trim_end().to_string()))?;
    let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();

    let mut warnings = Vec::new();
    let (server, token_text) = server(&src, &raw.server, &dir, &mut warnings)?;
    let store = store(&src, &raw.store)?;
    let (auth, keys_text) = auth(&src, &raw.auth, &dir, &mut warnings)?;
    let upstreams = upstreams(&src, &raw.upstreams, &dir, &mut warnings)?;
    let routes = routes(&src, &raw.routes, &upstreams)?;
    let rules = rules(&src, &raw.rules, &routes)?;
    if routes.is_empty() {
        // Checked last, so that a file with other mistakes names those first. A zero-byte or truncated file parses as TOML; in force it would answer 404 to
        // everything while looking healthy.
        let what = if text.trim().is_empty() {
            "the file is empty"
        } else {
            "the file defines no [[routes]]"
        };
        return Err(ConfigError::whole_file(
            path,
            format!("{what}: a gateway needs at least one [[routes]] entry, or every request gets 404 (a truncated file?)"),
        ));
    }
    Ok(Config {
        path: path.to_path_buf(),
        server,
        store,
        auth,
        upstreams,
        routes,
        rules,
        // The same files, in the same order, as the reloader fingerprints (`Config::files`): a
        // keys or token file only when one is named (an extra empty entry made every start
        // reload once).
        fingerprint: {
            let files = [Some(text), keys_text.as_deref(), token_text.as_deref()];
            let bytes: Vec<&[u8]> = files.iter().flatten().map(|t| t.as_bytes()).collect();
            fingerprint_of(&bytes)
        },
        warnings,
    })
}

/// `[server]`, and the text of `admin_token_file` when one is named (for the fingerprint).
fn server(
    src: &Src,
    raw: &RawServer,
    dir: &Path,
    warnings: &mut Vec<String>,
) -> Result<(Server, Option<String>), ConfigError> {
    let listen = match &raw.listen {
        Some(list) => {
            if list.get_ref().is_empty() {
                return Err(src.err(list.span(), "server.listen needs at least one address"));
            }
            list.get_ref()
                .iter()
                .map(|a| src.socket_addr(a, "listen address"))
                .collect::<Result<_, _>>()?
        }
        None => vec![SocketAddr::from(([0, 0, 0, 0], 8080))],
    };
    let admin_listen = match &raw.admin_listen {
        Some(a) => src.socket_addr(a, "admin_listen")?,
        None => SocketAddr::from(([127, 0, 0, 1], 9901)),
    };
    let threads = match &raw.threads {
        Some(t) => src.positive(t, "server.threads")? as usize,
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    let trusted_proxies = raw
        .trusted_proxies
        .iter()
        .map(|c| {
            let text = c.get_ref();
            text.parse::<IpNet>()
                .or_else(|_| text.parse::<std::net::IpAddr>().map(IpNet::from))
                .map_err(|_| {
                    src.err(
                        c.span(),
                        format!(
                            "trusted proxy \"{text}\" is not a CIDR like \"10.0.0.0/8\" or an IP"
                        ),
                    )
                })
        })
        .collect::<Result<_, _>>()?;
    let grace_period = match &raw.grace_period {
        Some(g) => src.duration(g)?,
        None => Duration::from_secs(30),
    };
    let (admin_token, admin_token_file, token_text) = admin_token(src, raw, dir)?;
    let admin_hosts = admin_hosts(src, raw)?;
    if admin_token.is_none() && !admin_listen.ip().is_loopback() {
        warnings.push(format!(
            "admin_listen {admin_listen} is reachable from other hosts and no admin token is set: \
             whoever reaches it can read /stats, /top, /rules and /metrics and POST /reload; \
             set [server] admin_token_file"
        ));
    }
    let log_format = match &raw.log_format {
        Some(f) => src.one_of(f, "log_format", LogFormat::NAMES)?,
        None => LogFormat::Text,
    };
    let tls = match &raw.tls {
        Some(t) => {
            let tls = t.get_ref();
            if tls.listen.is_empty() {
                return Err(src.err(t.span(), "server.tls.listen needs at least one address"));
            }
            let listen = tls
                .listen
                .iter()
                .map(|a| src.socket_addr(a, "TLS listen address"))
                .collect::<Result<_, _>>()?;
            let cert = existing_file(src, &tls.cert, dir, "TLS certificate")?;
            let key = existing_file(src, &tls.key, dir, "TLS private key")?;
            Some(Tls { listen, cert, key })
        }
        None => None,
    };
    let connections = connections(src, raw)?;
    let escaped_slashes = match &raw.escaped_slashes {
        Some(v) => src.one_of(
            v,
            "server.escaped_slashes",
            crate::normalize::EscapedSlashes::NAMES,
        )?,
        None => crate::normalize::EscapedSlashes::Reject,
    };
    let headers_with_underscores = match &raw.headers_with_underscores {
        Some(v) => src.one_of(
            v,
            "server.headers_with_underscores",
            crate::header_policy::Underscores::NAMES,
        )?,
        None => crate::header_policy::Underscores::Drop,
    };
    let server = Server {
        escaped_slashes,
        headers_with_underscores,
        connections,
        listen,
        admin_listen,
        threads,
        trusted_proxies,
        grace_period,
        admin_token,
        admin_token_file,
        admin_hosts,
        legacy_headers: raw.legacy_headers,
        log_format,
        access_log: raw.access_log.unwrap_or(true),
        top_clients: raw.top_clients.unwrap_or(true),
        tls,
    };
    Ok((server, token_text))
}

/// The admin token, the file it was read from, and that file's text (for the fingerprint).
type AdminToken = (Option<String>, Option<PathBuf>, Option<String>);

/// `admin_token` or `admin_token_file` (not both). The token never appears in an error.
fn admin_token(src: &Src, raw: &RawServer, dir: &Path) -> Result<AdminToken, ConfigError> {
    match (&raw.admin_token, &raw.admin_token_file) {
        (Some(_), Some(f)) => {
            Err(src.err(f.span(), "set admin_token or admin_token_file, not both"))
        }
        (Some(t), None) if t.get_ref().is_empty() => Err(src.err(
            t.span(),
            "admin_token must not be empty (remove it to disable admin auth)",
        )),
        (Some(t), None) => Ok((Some(t.get_ref().clone()), None, None)),
        (None, Some(f)) => {
            let path = dir.join(f.get_ref());
            let text = std::fs::read_to_string(&path).map_err(|e| {
                src.err(
                    f.span(),
                    format!("cannot read admin_token_file \"{}\": {e}", path.display()),
                )
            })?;
            // `echo token > file` and Kubernetes Secrets made from such files end in a newline.
            let token = text.trim();
            if token.is_empty() {
                return Err(src.err(
                    f.span(),
                    format!("admin_token_file \"{}\" is empty", path.display()),
                ));
            }
            if !token.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(src.err(
                    f.span(),
                    format!(
                        "admin_token_file \"{}\" holds spaces or characters that an \
                         Authorization header cannot carry",
                        path.display()
                    ),
                ));
            }
            Ok((Some(token.to_string()), Some(path), Some(text)))
        }
        (None, None) => Ok((None, None, None)),
    }
}

/// Longest `admin_hosts` entry accepted (a DNS name's limit).
const MAX_HOST_NAME: usize = 253;

/// `admin_hosts`: host names without scheme, port or path, normalized as request hosts are
/// (lower case, no trailing dot).
fn admin_hosts(src: &Src, raw: &RawServer) -> Result<Vec<String>, ConfigError> {
    let Some(list) = &raw.admin_hosts else {
        return Ok(Vec::new());
    };
    list.get_ref()
        .iter()
        .map(|h| {
            let name = h.get_ref().trim_end_matches('.').to_ascii_lowercase();
            let is_name = !name.is_empty()
                && name.len() <= MAX_HOST_NAME
                && name.split('.').all(|label| {
                    !label.is_empty()
                        && !label.starts_with('-')
                        && !label.ends_with('-')
                        && label
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b == b'-')
                });
            if is_name {
                Ok(name)
            } else {
                Err(src.err(
                    h.span(),
                    format!(
                        "admin_hosts entry \"{}\" is not a host name (no scheme, port, path or \
                         wildcard), e.g. \"floodgate-admin.internal\"",
                        h.get_ref()
                    ),
                ))
            }
        })
        .collect()
}

/// Longest `header_timeout` / `keepalive_timeout` / `body_timeout` accepted: past it a slow client holds a
/// connection for longer than any real client needs.
const MAX_CONNECTION_TIMEOUT: Duration = Duration::from_secs(3600);

fn connections(src: &Src, raw: &RawServer) -> Result<Connections, ConfigError> {
    let timeout = |v: &Option<Spanned<String>>, name: &str, default: u64| match v {
        Some(t) => {
            let d = src.duration(t)?;
            if d.is_zero() || d > MAX_CONNECTION_TIMEOUT {
                return Err(src.err(
                    t.span(),
                    format!("server.{name} must be between 1ms and 1h"),
                ));
            }
            Ok(d)
        }
        None => Ok(Duration::from_secs(default)),
    };
    let header_timeout = timeout(&raw.header_timeout, "header_timeout", 10)?;
    let keepalive_timeout = timeout(&raw.keepalive_timeout, "keepalive_timeout", 60)?;
    let body_timeout = timeout(&raw.body_timeout, "body_timeout", 60)?;
    let max_connections = match &raw.max_connections {
        Some(n) => src.positive(n, "server.max_connections")? as usize,
        None => 10_000,
    };
    let max_per_ip = match &raw.max_connections_per_ip {
        Some(n) => src.positive(n, "server.max_connections_per_ip")? as usize,
        None => 256,
    };
    Ok(Connections {
        header_timeout,
        keepalive_timeout,
        body_timeout,
        max_connections,
        max_per_ip,
    })
}

fn existing_file(
    src: &Src,
    v: &Spanned<String>,
    dir: &Path,
    what: &str,
) -> Result<PathBuf, ConfigError> {
    let p = dir.join(v.get_ref());
    if p.is_file() {
        Ok(p)
    } else {
        Err(src.err(
            v.span(),
            format!("{what} \"{}\" does not exist", p.display()),
        ))
    }
}

fn store(src: &Src, raw: &RawStore) -> Result<Store, ConfigError> {
    let backend = match &raw.backend {
        Some(b) => src.one_of(b, "store.backend", Backend::NAMES)?,
        None => Backend::Memory,
    };
    let check_url = |u: &Spanned<String>| -> Result<String, ConfigError> {
        let text = u.get_ref();
        if text.starts_with("redis://") || text.starts_with("rediss://") {
            Ok(text.clone())
        } else {
            Err(src.err(u.span(), "a Redis URL starts with redis:// or rediss://"))
        }
    };
    // The store's own parser and client construction judge the URL(s), so that what passes
    // `check` is exactly what the store can use (its errors never repeat the URL).
    let usable = |urls: Vec<String>, spans: &[Range<usize>], whole: Range<usize>| {
        crate::limiter::redis::RedisClient::build(backend, &urls)
            .map(|client| (urls, Some(client)))
            .map_err(|e| {
                let span = e.index.and_then(|i| spans.get(i).cloned()).unwrap_or(whole);
                src.err(span, e.message)
            })
    };
    let (urls, redis) = match backend {
        Backend::Memory => (Vec::new(), None),
        Backend::Redis => match &raw.url {
            Some(u) => usable(vec![check_url(u)?], &[u.span()], u.span())?,
            None => {
                let span = raw.backend.as_ref().map_or(0..0, |b| b.span());
                return Err(src.err(span, "store.backend = \"redis\" needs store.url"));
            }
        },
        Backend::RedisCluster => match &raw.urls {
            Some(list) if !list.get_ref().is_empty() => {
                let urls = list
                    .get_ref()
                    .iter()
                    .map(check_url)
                    .collect::<Result<_, _>>()?;
                let spans: Vec<Range<usize>> = list.get_ref().iter().map(|u| u.span()).collect();
                usable(urls, &spans, list.span())?
            }
            _ => {
                let span = raw.backend.as_ref().map_or(0..0, |b| b.span());
                return Err(src.err(
                    span,
                    "store.backend = \"redis-cluster\" needs store.urls (seed nodes)",
                ));
            }
        },
    };
    let timeout = match &raw.timeout {
        Some(t) => {
            let d = src.duration(t)?;
            if d.is_zero() {
                return Err(src.err(t.span(), "store.timeout must be longer than 0ms"));
            }
            d
        }
        None => Duration::from_millis(20),
    };
    let instances = match &raw.instances {
        Some(i) => src.positive(i, "store.instances")?,
        None => 1,
    };
    let max_keys = match &raw.max_keys {
        Some(m) => src.positive(m, "store.max_keys")? as usize,
        None => 1_000_000,
    };
    Ok(Store {
        backend,
        urls,
        redis,
        timeout,
        key_prefix: raw
            .key_prefix
            .clone()
            .unwrap_or_else(|| "floodgate:".to_string()),
        instances,
        max_keys,
    })
}

/// `[auth]` and the text of its keys file (`None` when there is none).
fn auth(
    src: &Src,
    raw: &RawAuth,
    dir: &Path,
    warnings: &mut Vec<String>,
) -> Result<(Auth, Option<String>), ConfigError> {
    let header = match &raw.header {
        Some(h) => HeaderName::from_bytes(h.get_ref().as_bytes()).map_err(|_| {
            src.err(
                h.span(),
                format!("\"{}\" is not a valid header name", h.get_ref()),
            )
        })?,
        None => HeaderName::from_static("x-api-key"),
    };
    let mut seen = HashSet::new();
    let mut keys = Vec::new();
    collect_keys(src, &raw.keys, &mut seen, &mut keys, warnings)?;
    let mut keys_text = None;
    let keys_file = match &raw.keys_file {
        Some(f) => {
            let path = dir.join(f.get_ref());
            let text = std::fs::read_to_string(&path).map_err(|e| {
                src.err(
                    f.span(),
                    format!("cannot read keys file \"{}\": {e}", path.display()),
                )
            })?;
            let file_src = Src {
                path: &path,
                text: &text,
            };
            let parsed: RawKeysFile = toml::from_str(&text).map_err(|e| {
                ConfigError::at(&path, &text, e.span(), e.message().trim_end().to_string())
            })?;
            collect_keys(&file_src, &parsed.keys, &mut seen, &mut keys, warnings)?;
            keys_text = Some(text);
            Some(path)
        }
        None => None,
    };
    let auth = Auth {
        header,
        forward_key: raw.forward_key,
        keys_file,
        keys: KeyStore::new(keys),
    };
    Ok((auth, keys_text))
}

fn collect_keys(
    src: &Src,
    raw: &[Spanned<RawKey>],
    seen: &mut HashSet<String>,
    out: &mut Vec<ApiKey>,
    warnings: &mut Vec<String>,
) -> Result<(), ConfigError> {
    for k in raw {
        let key = k.get_ref();
        let id = key.id.get_ref();
        if id.is_empty() {
            return Err(src.err(key.id.span(), "key id must not be empty"));
        }
        // They are sent upstream as X-Floodgate-Key-Id/-User/-Plan: a value that cannot be a
        // header value would fail every request made with this key.
        let id_text = header_safe(src, &key.id, "id")?;
        let user = match &key.user {
            Some(u) => header_safe(src, u, "user")?,
            None => id_text.clone(),
        };
        let plan = key
            .plan
            .as_ref()
            .map(|p| header_safe(src, p, "plan"))
            .transpose()?;
        if !seen.insert(id.clone()) {
            return Err(src.err(key.id.span(), format!("key id \"{id}\" is defined twice")));
        }
        let digest = match (&key.sha256, &key.secret) {
            (Some(h), None) => {
                let mut d = [0u8; 32];
                hex::decode_to_slice(h.get_ref().trim(), &mut d).map_err(|_| {
                    src.err(h.span(), format!("key \"{id}\": sha256 must be 64 hex digits (the SHA-256 of the secret)"))
                })?;
                d
            }
            (None, Some(s)) => {
                if s.get_ref().is_empty() {
                    return Err(
                        src.err(s.span(), format!("key \"{id}\": secret must not be empty"))
                    );
                }
                warnings.push(format!(
                    "key \"{id}\" uses a plaintext `secret`; store its sha256 instead outside development"
                ));
                digest_of(s.get_ref())
            }
            _ => {
                return Err(src.err(
                    k.span(),
                    format!("key \"{id}\" needs exactly one of sha256 or secret"),
                ));
            }
        };
        out.push(ApiKey {
            digest,
            identity: Arc::new(Identity {
                id: id_text,
                user,
                plan,
            }),
        });
    }
    Ok(())
}

/// Refuses an identity value (`id`, `user`, `plan`) that is not a valid HTTP header value
/// (CR, LF, NUL and other control bytes), judged by the same `http` crate that builds the
/// headers sent upstream.
fn header_safe(src: &Src, v: &Spanned<String>, field: &str) -> Result<HeaderText, ConfigError> {
    if let Some(text) = HeaderText::new(v.get_ref()) {
        return Ok(text);
    }
    Err(src.err(
        v.span(),
        format!(
            "key {field} {:?} cannot be sent in a header (it holds a line break or another control character)",
            v.get_ref()
        ),
    ))
}

fn upstreams(
    src: &Src,
    raw: &[RawUpstream],
    dir: &Path,
    warnings: &mut Vec<String>,
) -> Result<Vec<Arc<Upstream>>, ConfigError> {
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for u in raw {
        let name = u.name.get_ref();
        if !seen.insert(name.clone()) {
            return Err(src.err(
                u.name.span(),
                format!("upstream \"{name}\" is defined twice"),
            ));
        }
        let settings = upstream_settings(src, u, dir, warnings)?;
        out.push(Arc::new(Upstream::new(name.as_str().into(), settings)));
    }
    Ok(out)
}

/// One upstream's settings. Syntax and meaning only: names are not resolved here (that is the
/// run time's job, in the background), so `check` never touches the network.
fn upstream_settings(
    src: &Src,
    u: &RawUpstream,
    dir: &Path,
    warnings: &mut Vec<String>,
) -> Result<crate::upstream::Settings, ConfigError> {
    use crate::upstream::settings::*;
    let name = u.name.get_ref();
    let mut targets = Vec::new();
    for t in u.targets.get_ref() {
        targets.push(upstream_target(src, t)?);
    }
    let targets = Targets::new(targets).ok_or_else(|| {
        src.err(
            u.targets.span(),
            format!("upstream \"{name}\" needs at least one target"),
        )
    })?;
    let balance = match &u.balance {
        Some(b) => src.one_of(b, "upstream balance", Balance::NAMES)?,
        None => Balance::RoundRobin,
    };
    let mut hash_key = Vec::new();
    if let Some(list) = &u.hash_key {
        if balance != Balance::Consistent {
            return Err(src.err(
                list.span(),
                "hash_key applies only to balance = \"consistent\"",
            ));
        }
        for p in list.get_ref() {
            hash_key.push(KeyPart::parse(p.get_ref()).map_err(|_| {
                src.err(
                    p.span(),
                    format!(
                        "hash_key part \"{}\" is not one of ip, api_key, user, plan, route, method, path, \"header:NAME\", \"query:NAME\"",
                        p.get_ref()
                    ),
                )
            })?);
        }
    }
    let tls_on = u.tls.unwrap_or(false);
    let tls_only = [
        ("sni", u.sni.as_ref().map(Spanned::span)),
        ("verify", u.verify.as_ref().map(Spanned::span)),
        ("ca_file", u.ca_file.as_ref().map(Spanned::span)),
        ("client_cert", u.client_cert.as_ref().map(Spanned::span)),
        ("client_key", u.client_key.as_ref().map(Spanned::span)),
    ];
    let tls = if tls_on {
        let verify = u.verify.as_ref().is_none_or(|v| *v.get_ref());
        if !verify {
            warnings.push(format!(
                "upstream \"{name}\" has verify = false: its TLS certificates are not checked, so anyone on the path can impersonate it"
            ));
        }
        let sni = match &u.sni {
            Some(s) if s.get_ref().is_empty() || s.get_ref().contains(['/', ' ', ':']) => {
                return Err(src.err(
                    s.span(),
                    format!("sni \"{}\" is not a host name", s.get_ref()),
                ));
            }
            Some(s) => Some(s.get_ref().clone()),
            None => None,
        };
        let file = |v: &Spanned<String>| dir.join(v.get_ref());
        let (ca, ca_file) = match &u.ca_file {
            Some(f) => {
                let path = file(f);
                let ca = crate::upstream::tls::load_ca(&path)
                    .map_err(|e| src.err(f.span(), format!("ca_file \"{}\": {e}", f.get_ref())))?;
                (Some(ca), Some(path))
            }
            None => (None, None),
        };
        let (client, client_cert) = match (&u.client_cert, &u.client_key) {
            (Some(c), Some(k)) => {
                let cert = file(c);
                let loaded = crate::upstream::tls::load_client(&cert, &file(k)).map_err(|e| {
                    src.err(
                        c.span(),
                        format!(
                            "client_cert \"{}\" / client_key \"{}\": {e}",
                            c.get_ref(),
                            k.get_ref()
                        ),
                    )
                })?;
                (Some(loaded), Some(cert))
            }
            (Some(c), None) => {
                return Err(src.err(c.span(), "client_cert needs client_key"));
            }
            (None, Some(k)) => {
                return Err(src.err(k.span(), "client_key needs client_cert"));
            }
            (None, None) => (None, None),
        };
        Some(UpstreamTls {
            sni,
            verify,
            ca,
            client,
            ca_file,
            client_cert,
        })
    } else {
        if let Some((key, Some(span))) = tls_only.iter().find(|(_, s)| s.is_some()) {
            return Err(src.err(
                span.clone(),
                format!("{key} applies only to an upstream with tls = true"),
            ));
        }
        None
    };
    let http2 = u.http2.as_ref().is_some_and(|h| *h.get_ref());
    if let Some(h) = u.http2.as_ref().filter(|h| *h.get_ref() && !tls_on) {
        return Err(src.err(
            h.span(),
            "http2 needs tls = true (HTTP/2 to an upstream is negotiated by ALPN over TLS)",
        ));
    }
    let host_header = match &u.host_header {
        Some(h) => {
            let ok = !h.get_ref().is_empty()
                && http::uri::Authority::try_from(h.get_ref().as_str()).is_ok();
            if !ok {
                return Err(src.err(
                    h.span(),
                    format!("host_header \"{}\" is not a host[:port]", h.get_ref()),
                ));
            }
            Some(h.get_ref().clone())
        }
        None => None,
    };
    let retries = match &u.retries {
        Some(r) => match usize::try_from(*r.get_ref()) {
            Ok(n) if n <= 10 => n,
            _ => {
                return Err(src.err(r.span(), "retries must be a whole number from 0 to 10"));
            }
        },
        None => 1,
    };
    let health_check = match &u.health_check {
        Some(h) => Some(health_check(src, h.get_ref())?),
        None => None,
    };
    let passive = match &u.passive {
        Some(p) => {
            let p = p.get_ref();
            Some(Passive {
                consecutive_failures: match &p.consecutive_failures {
                    Some(n) => u32::try_from(src.positive(n, "consecutive_failures")?)
                        .map_err(|_| src.err(n.span(), "consecutive_failures is too large"))?,
                    None => 5,
                },
                eject: src.nonzero_duration_or(&p.eject, Duration::from_secs(30), "eject")?,
            })
        }
        None => None,
    };
    Ok(Settings {
        targets,
        balance,
        hash_key,
        tls,
        http2,
        host_header,
        connect_timeout: src.nonzero_duration_or(
            &u.connect_timeout,
            Duration::from_secs(1),
            "connect_timeout",
        )?,
        read_timeout: src.nonzero_duration_or(
            &u.read_timeout,
            Duration::from_secs(30),
            "read_timeout",
        )?,
        write_timeout: src.nonzero_duration_or(
            &u.write_timeout,
            Duration::from_secs(30),
            "write_timeout",
        )?,
        idle_timeout: src.nonzero_duration_or(
            &u.idle_timeout,
            Duration::from_secs(60),
            "idle_timeout",
        )?,
        timeout: src.nonzero_duration_or(&u.timeout, Duration::from_secs(60), "timeout")?,
        tunnel_timeout: src.nonzero_duration_or(
            &u.tunnel_timeout,
            Duration::from_secs(300),
            "tunnel_timeout",
        )?,
        retries,
        resolve_interval: src.nonzero_duration_or(
            &u.resolve_interval,
            Duration::from_secs(30),
            "resolve_interval",
        )?,
        health_check,
        passive,
    })
}

/// One target: `host:port` (a name, an IPv4 address, or `[IPv6]`), with its weight.
fn upstream_target(
    src: &Src,
    t: &Spanned<RawTarget>,
) -> Result<crate::upstream::Target, ConfigError> {
    let (addr, weight) = match t.get_ref() {
        RawTarget::Addr(a) => (a.as_str(), 1),
        RawTarget::Weighted(w) => (w.addr.as_str(), w.weight.unwrap_or(1)),
    };
    let bad = |why: &str| src.err(t.span(), format!("upstream target \"{addr}\" {why}"));
    let weight = match usize::try_from(weight) {
        Ok(n) if (1..=1000).contains(&n) => n,
        _ => {
            return Err(bad(
                "has a weight that is not a whole number from 1 to 1000",
            ))
        }
    };
    if let Ok(sa) = addr.parse::<SocketAddr>() {
        return Ok(crate::upstream::Target {
            name: addr.into(),
            host: sa.ip().to_string().into(),
            port: sa.port(),
            weight,
            ip: Some(sa.ip()),
        });
    }
    let (host, port) = addr
        .rsplit_once(':')
        .ok_or_else(|| bad("is not host:port"))?;
    let port: u16 = port
        .parse()
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| bad("has no valid port"))?;
    let name_ok = !host.is_empty()
        && host.len() <= 253
        && host.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        });
    if !name_ok {
        return Err(bad(
            "is not host:port (the host is not a DNS name or an IP address)",
        ));
    }
    Ok(crate::upstream::Target {
        name: addr.into(),
        host: host.to_ascii_lowercase().into(),
        port,
        weight,
        ip: None,
    })
}

/// `[upstreams.health_check]`.
fn health_check(
    src: &Src,
    h: &RawHealthCheck,
) -> Result<crate::upstream::settings::HealthCheck, ConfigError> {
    use crate::upstream::settings::{CheckKind, HealthCheck};
    let kind = match &h.kind {
        Some(k) => src.one_of(k, "health_check type", CheckKind::NAMES)?,
        None => CheckKind::Http,
    };
    let path = match &h.path {
        Some(p)
            if !p.get_ref().starts_with('/')
                || http::uri::PathAndQuery::try_from(p.get_ref().as_str()).is_err() =>
        {
            return Err(src.err(
                p.span(),
                format!(
                    "health_check path \"{}\" must be a path starting with \"/\"",
                    p.get_ref()
                ),
            ));
        }
        Some(p) if kind == CheckKind::Tcp => {
            return Err(src.err(
                p.span(),
                "health_check path applies only to type = \"http\"",
            ));
        }
        Some(p) => p.get_ref().clone(),
        None => "/healthz".to_string(),
    };
    let threshold = |v: &Option<Spanned<i64>>, default: usize, what: &str| match v {
        Some(n) => Ok(src.positive(n, what)? as usize),
        None => Ok(default),
    };
    let mut expect_status = Vec::new();
    for s in h.expect_status.iter().flatten() {
        match u16::try_from(*s.get_ref()) {
            Ok(code) if (100..=599).contains(&code) => expect_status.push(code),
            _ => return Err(src.err(s.span(), "expect_status holds HTTP statuses (100-599)")),
        }
    }
    if expect_status.is_empty() {
        expect_status.push(200);
    }
    Ok(HealthCheck {
        kind,
        path,
        interval: src.nonzero_duration_or(
            &h.interval,
            Duration::from_secs(5),
            "health_check interval",
        )?,
        timeout: src.nonzero_duration_or(
            &h.timeout,
            Duration::from_secs(1),
            "health_check timeout",
        )?,
        healthy_threshold: threshold(&h.healthy_threshold, 2, "healthy_threshold")?,
        unhealthy_threshold: threshold(&h.unhealthy_threshold, 3, "unhealthy_threshold")?,
        expect_status,
    })
}

fn routes(
    src: &Src,
    raw: &[RawRoute],
    upstreams: &[Arc<Upstream>],
) -> Result<Vec<Route>, ConfigError> {
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for r in raw {
        let name = r.name.get_ref();
        if !seen.insert(name.clone()) {
            return Err(src.err(r.name.span(), format!("route \"{name}\" is defined twice")));
        }
        let upstream = upstreams
            .iter()
            .find(|u| &*u.name == r.upstream.get_ref())
            .cloned()
            .ok_or_else(|| {
                src.err(
                    r.upstream.span(),
                    format!(
                        "route \"{name}\" names upstream \"{}\", which is not defined",
                        r.upstream.get_ref()
                    ),
                )
            })?;
        let auth = match &r.auth {
            Some(a) => src.one_of(a, "route auth", AuthMode::NAMES)?,
            None => AuthMode::Required,
        };
        let m = &r.matcher;
        out.push(Route {
            name: name.as_str().into(),
            matcher: RequestMatch {
                path: src.path(&m.path)?,
                path_prefix: src.path(&m.path_prefix)?,
                host: src.host(&m.host)?,
                methods: m.methods.as_deref().map(|l| src.methods(l)).transpose()?,
            },
            upstream,
            auth,
            requests: Default::default(),
        });
    }
    Ok(out)
}

/// The longest a shaping leaky bucket may hold a request (`max_delay`, and the default of
/// `window` is capped to it): every held request keeps its client's connection open.
pub const MAX_SHAPING_DELAY: Duration = Duration::from_secs(60);

fn rules(src: &Src, raw: &[RawRule], routes: &[Route]) -> Result<Vec<Arc<Rule>>, ConfigError> {
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for r in raw {
        let name = r.name.get_ref();
        if name.is_empty()
            || name.contains('"')
            || name.contains('\\')
            || name.chars().any(char::is_control)
        {
            return Err(src.err(r.name.span(), "rule name must be non-empty without quotes, backslashes or control characters (it is sent in headers)"));
        }
        if !seen.insert(name.clone()) {
            return Err(src.err(r.name.span(), format!("rule \"{name}\" is defined twice")));
        }
        let algorithm = src.one_of(&r.algorithm, "algorithm", Algorithm::NAMES)?;
        let limit = src.positive(&r.limit, "limit")?;
        if limit > MAX_COUNT {
            return Err(src.err(
                r.limit.span(),
                format!("rule \"{name}\": limit is at most {MAX_COUNT} (10^15): the shared store counts exactly up to there"),
            ));
        }
        let window = match (&r.window, algorithm) {
            (Some(w), Algorithm::Concurrency) => {
                return Err(src.err(
                    w.span(),
                    format!(
                    "rule \"{name}\": concurrency limits requests in flight and takes no window"
                ),
                ))
            }
            (None, Algorithm::Concurrency) => Duration::ZERO,
            (Some(w), _) => {
                let d = src.duration(w)?;
                if d < Duration::from_millis(1) {
                    return Err(src.err(
                        w.span(),
                        format!("rule \"{name}\": window must be at least 1ms"),
                    ));
                }
                if d > MAX_WINDOW {
                    return Err(src.err(
                        w.span(),
                        format!("rule \"{name}\": window is at most 3650d (ten years): the shared store times exactly up to there"),
                    ));
                }
                d
            }
            (None, _) => {
                return Err(src.err(
                    r.algorithm.span(),
                    format!(
                        "rule \"{name}\": {} needs a window, e.g. window = \"1m\"",
                        algorithm.as_str()
                    ),
                ))
            }
        };
        let burst = match &r.burst {
            Some(b) if matches!(algorithm, Algorithm::TokenBucket | Algorithm::LeakyBucket) => {
                let burst = src.positive(b, "burst")?;
                if burst > MAX_COUNT {
                    return Err(src.err(
                        b.span(),
                        format!("rule \"{name}\": burst is at most {MAX_COUNT} (10^15): the shared store counts exactly up to there"),
                    ));
                }
                burst
            }
            Some(b) => {
                return Err(src.err(
                    b.span(),
                    format!("rule \"{name}\": burst applies to token_bucket and leaky_bucket only"),
                ))
            }
            None => limit,
        };
        let mode = match &r.mode {
            Some(m) if algorithm == Algorithm::LeakyBucket => {
                src.one_of(m, "mode", LeakyMode::NAMES)?
            }
            Some(m) => {
                return Err(src.err(
                    m.span(),
                    format!("rule \"{name}\": mode applies to leaky_bucket only"),
                ))
            }
            None => LeakyMode::Police,
        };
        let max_delay = match &r.max_delay {
            Some(d) if mode == LeakyMode::Shape => {
                let delay = src.duration(d)?;
                if delay > MAX_SHAPING_DELAY {
                    return Err(src.err(
                        d.span(),
                        format!("rule \"{name}\": max_delay is at most 60s (a held request holds its connection); reject sooner, or police instead of shaping"),
                    ));
                }
                delay
            }
            Some(d) => {
                return Err(src.err(
                    d.span(),
                    format!(
                    "rule \"{name}\": max_delay applies to leaky_bucket with mode = \"shape\" only"
                ),
                ))
            }
            None if mode == LeakyMode::Shape => window.min(MAX_SHAPING_DELAY),
            None => Duration::ZERO,
        };
        // burst × window / limit: how long an empty bucket takes to refill (a bucket's
        // state spans that much), compared without rounding.
        let refill_ns = u128::from(burst) * window.as_nanos();
        if matches!(algorithm, Algorithm::TokenBucket | Algorithm::LeakyBucket)
            && refill_ns > MAX_WINDOW.as_nanos() * u128::from(limit)
        {
            // Only a burst above the limit refills slower than the window.
            let span = r.burst.as_ref().map_or(r.limit.span(), |b| b.span());
            let days = refill_ns.div_ceil(u128::from(limit) * 86_400_000_000_000);
            return Err(src.err(
                span,
                format!("rule \"{name}\": an empty bucket would take {days} days to refill (burst × window / limit); at most 3650d (ten years), the longest the shared store times exactly"),
            ));
        }
        let key = r
            .key
            .get_ref()
            .iter()
            .map(|k| KeyPart::parse(k.get_ref()).map_err(|m| src.err(k.span(), m)))
            .collect::<Result<Vec<_>, _>>()?;
        if key.is_empty() {
            return Err(src.err(
                r.key.span(),
                format!("rule \"{name}\": key needs at least one part, e.g. [\"ip\"]"),
            ));
        }
        if algorithm == Algorithm::SlidingWindowLog
            && limit > crate::limiter::algorithm::MAX_SLIDING_LOG_LIMIT
        {
            return Err(src.err(
                r.limit.span(),
                format!(
                    "rule \"{name}\": sliding_window_log keeps one timestamp per request, so its limit is capped at {}; use sliding_window_counter for larger limits",
                    crate::limiter::algorithm::MAX_SLIDING_LOG_LIMIT
                ),
            ));
        }
        let scope = match &r.scope {
            Some(s) => src.one_of(s, "scope", Scope::NAMES)?,
            None => Scope::Global,
        };
        let on_store_error = match &r.on_store_error {
            Some(s) => src.one_of(s, "on_store_error", FailureMode::NAMES)?,
            None => FailureMode::Open,
        };
        let cost = match &r.cost {
            Some(c) => src.positive(c, "cost")?,
            None => 1,
        };
        let capacity = if matches!(algorithm, Algorithm::TokenBucket | Algorithm::LeakyBucket) {
            burst
        } else {
            limit
        };
        if cost > capacity {
            let span = r.cost.as_ref().map_or(r.limit.span(), |c| c.span());
            return Err(src.err(
                span,
                format!("rule \"{name}\": cost {cost} is more than the rule can ever admit at once ({capacity}), so every request would be rejected"),
            ));
        }
        let status = match &r.status {
            Some(s) if (400..=599).contains(s.get_ref()) => *s.get_ref() as u16,
            Some(s) => {
                return Err(src.err(
                    s.span(),
                    format!("rule \"{name}\": status must be between 400 and 599"),
                ))
            }
            None => 429,
        };
        let lease = rule_lease(src, r, name, algorithm, mode, scope, cost)?;
        let shaping = algorithm == Algorithm::LeakyBucket && mode == LeakyMode::Shape;
        let max_waiting = match &r.max_waiting {
            Some(m) if shaping => src.positive(m, "max_waiting")? as usize,
            Some(m) => {
                let why = "max_waiting applies to leaky_bucket with mode = \"shape\" only";
                return Err(src.err(m.span(), format!("rule \"{name}\": {why}")));
            }
            None => MAX_WAITING_PER_RULE,
        };
        let m = &r.matcher;
        if let Some(route) = &m.route {
            if !routes.iter().any(|rt| &*rt.name == route.get_ref()) {
                return Err(src.err(
                    route.span(),
                    format!(
                        "rule \"{name}\" matches route \"{}\", which is not defined",
                        route.get_ref()
                    ),
                ));
            }
        }
        let header = match &m.header {
            Some(h) => {
                let hm = h.get_ref();
                let hn = HeaderName::from_bytes(hm.name.get_ref().as_bytes()).map_err(|_| {
                    src.err(
                        hm.name.span(),
                        format!("\"{}\" is not a valid header name", hm.name.get_ref()),
                    )
                })?;
                Some((hn, hm.value.clone()))
            }
            None => None,
        };
        out.push(Arc::new(Rule {
            matcher: RuleMatch {
                route: m.route.as_ref().map(|r| r.get_ref().clone()),
                request: RequestMatch {
                    path: src.path(&m.path)?,
                    path_prefix: src.path(&m.path_prefix)?,
                    methods: m.methods.as_deref().map(|l| src.methods(l)).transpose()?,
                    host: src.host(&m.host)?,
                },
                plan: m.plan.clone(),
                header,
            },
            key_parts: key,
            policy: Arc::new(Policy {
                name: name.as_str().into(),
                // The checks above name the offending key; this is the type's own guard.
                limit: Limit::new(algorithm, limit, window, burst, mode, max_delay)
                    .map_err(|e| src.err(r.name.span(), format!("rule \"{name}\": {e}")))?,
                scope,
                on_store_error,
                cost,
                shadow: r.shadow,
                headers: r.headers.unwrap_or(true),
                status,
                counters: crate::metrics::RuleCounters::for_rule(name),
                lease,
                max_waiting,
            }),
        }));
    }
    Ok(out)
}

/// A rule's `lease` and `lease_ttl`: only for global rules of the algorithms whose state a
/// lease can count (see `crate::limiter::lease::leasable`), with the reason otherwise.
fn rule_lease(
    src: &Src,
    r: &RawRule,
    name: &str,
    algorithm: Algorithm,
    mode: LeakyMode,
    scope: Scope,
    cost: u64,
) -> Result<Option<Lease>, ConfigError> {
    let Some(raw) = &r.lease else {
        if let Some(ttl) = &r.lease_ttl {
            return Err(src.err(
                ttl.span(),
                format!("rule \"{name}\": lease_ttl applies only with lease"),
            ));
        }
        return Ok(None);
    };
    let span = raw.span();
    let size = match raw.get_ref() {
        RawLease::Name(n) if n == "auto" => LeaseSize::Auto,
        RawLease::Permits(n) if *n >= 1 => {
            let n = *n as u64;
            if n < cost {
                return Err(src.err(
                    span,
                    format!("rule \"{name}\": lease {n} is less than the rule's cost {cost}; a lease must hold at least one request"),
                ));
            }
            LeaseSize::Permits(n)
        }
        _ => {
            return Err(src.err(
                span,
                format!("rule \"{name}\": lease must be \"auto\" or a whole number of permits of at least 1"),
            ))
        }
    };
    let why_not = match (algorithm, mode) {
        (Algorithm::SlidingWindowLog, _) => Some("sliding_window_log keeps one timestamp per request, so permits cannot be handed out in advance; use sliding_window_counter"),
        (Algorithm::Concurrency, _) => Some("concurrency counts requests in flight, not a rate; its slots are already held per request"),
        (Algorithm::LeakyBucket, LeakyMode::Shape) => Some("a shaping leaky bucket spaces requests one by one in a shared queue, which leased permits would jump; use mode = \"police\""),
        _ => None,
    };
    if let Some(why) = why_not {
        return Err(src.err(
            span,
            format!("rule \"{name}\": lease is not allowed here: {why}"),
        ));
    }
    if scope == Scope::Local {
        return Err(src.err(
            span,
            format!("rule \"{name}\": lease applies to global rules only (a local rule never calls the store)"),
        ));
    }
    let ttl = match &r.lease_ttl {
        Some(t) => {
            let ttl = src.duration(t)?;
            if ttl < Duration::from_millis(10) {
                return Err(src.err(
                    t.span(),
                    format!("rule \"{name}\": lease_ttl must be at least 10ms"),
                ));
            }
            ttl
        }
        None => DEFAULT_LEASE_TTL,
    };
    Ok(Some(Lease { size, ttl }))
}
