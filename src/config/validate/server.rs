//! `[server]`: listeners, the admin token and hosts, TLS, connection bounds, request spelling
//! policies.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ipnet::IpNet;
use toml::Spanned;

use super::source::Src;
use crate::config::schema::*;
use crate::config::*;

/// `[server]`, and the text of `admin_token_file` when one is named (for the fingerprint).
pub(super) fn server(
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
    let tls = tls(src, raw, dir)?;
    let connections = connections(src, raw)?;
    let escaped_slashes = match &raw.escaped_slashes {
        Some(v) => src.one_of(
            v,
            "server.escaped_slashes",
            crate::wire::normalize::EscapedSlashes::NAMES,
        )?,
        None => crate::wire::normalize::EscapedSlashes::Reject,
    };
    let headers_with_underscores = match &raw.headers_with_underscores {
        Some(v) => src.one_of(
            v,
            "server.headers_with_underscores",
            crate::wire::header_policy::Underscores::NAMES,
        )?,
        None => crate::wire::header_policy::Underscores::Drop,
    };
    let ips = super::route_edges::ip_rules(src, &raw.allow_ips, &raw.deny_ips)?;
    let server = Server {
        ips,
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

/// `[server.tls]`: HTTPS listeners and the certificate and key files (which must exist).
fn tls(src: &Src, raw: &RawServer, dir: &Path) -> Result<Option<Tls>, ConfigError> {
    match &raw.tls {
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
            Ok(Some(Tls { listen, cert, key }))
        }
        None => Ok(None),
    }
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
            let text = crate::config::read_text_capped(&path, crate::config::MAX_SECRET_FILE_BYTES)
                .map_err(|e| {
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

/// The deadlines and caps of client connections.
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

/// A file named by the config (relative to its folder) that must exist.
pub(super) fn existing_file(
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

#[cfg(test)]
mod tests {
    /// Every invalid `[server]` fixture fails with the error, line and column it names.
    #[test]
    fn every_invalid_fixture_fails_as_it_says() {
        super::super::fixtures::check_section("server");
    }
}
