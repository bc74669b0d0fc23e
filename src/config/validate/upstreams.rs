//! `[[upstreams]]`: targets, balancing, TLS (certificates are loaded, names are not resolved),
//! timeouts, retries, active and passive health checks.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use toml::Spanned;

use super::source::Src;
use crate::config::schema::*;
use crate::config::*;
use crate::rules::KeyPart;
use crate::upstream::settings::*;

/// `[[upstreams]]` in file order, names unique.
pub(super) fn upstreams(
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
    let hash_key = hash_key(src, u, balance)?;
    let tls = upstream_tls(src, u, dir, warnings)?;
    let tls_on = tls.is_some();
    let http2 = u.http2.as_ref().is_some_and(|h| *h.get_ref());
    if let Some(h) = u.http2.as_ref().filter(|h| *h.get_ref() && !tls_on) {
        return Err(src.err(
            h.span(),
            "http2 needs tls = true (HTTP/2 to an upstream is negotiated by ALPN over TLS)",
        ));
    }
    let host_header = host_header(src, u)?;
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
    let passive = passive(src, u)?;
    let protect = match &u.protect {
        Some(p) => Some(protect(src, u.name.get_ref(), p.get_ref(), warnings)?),
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
        protect,
    })
}

/// A key part as a rule's `key` names it (for `fair_by` and `weights`).
fn key_part(
    src: &Src,
    text: &str,
    span: std::ops::Range<usize>,
    what: &str,
) -> Result<KeyPart, ConfigError> {
    KeyPart::parse(text).map_err(|_| {
        src.err(
            span,
            format!(
                "{what} \"{text}\" is not one of ip, api_key, user, plan, route, method, path, \"header:NAME\", \"query:NAME\""
            ),
        )
    })
}

/// The largest `max_limit`, `max_queue` and weight accepted: bounds a careless value
/// cannot turn into unbounded memory or an overflowing virtual clock.
const MAX_LIMIT: i64 = 100_000;
const MAX_WEIGHT: i64 = 1000;
const MAX_QUEUE_TIMEOUT: Duration = Duration::from_secs(60);

/// `[upstreams.protect]`: the adaptive concurrency limit and its fair queue.
fn protect(
    src: &Src,
    upstream: &str,
    p: &RawProtect,
    warnings: &mut Vec<String>,
) -> Result<Protect, ConfigError> {
    let mut fair_by = Vec::new();
    // Without fair_by the tenant is the customer (`Protect::fair_by` empty): see
    // `protect::tenant`.
    if let Some(list) = &p.fair_by {
        if list.get_ref().is_empty() {
            return Err(src.err(list.span(), "fair_by needs at least one key part"));
        }
        for part in list.get_ref() {
            fair_by.push(key_part(src, part.get_ref(), part.span(), "fair_by part")?);
        }
    }
    let mut weights = Vec::new();
    if let Some(w) = &p.weights {
        for (part, table) in w.get_ref() {
            let kp = key_part(src, part, table.span(), "weights key part")?;
            let mut values = Vec::new();
            for (value, weight) in table.get_ref() {
                match *weight.get_ref() {
                    n @ 1..=MAX_WEIGHT => values.push((value.clone(), n as u32)),
                    _ => {
                        return Err(src.err(
                            weight.span(),
                            format!("weight of {part} \"{value}\" must be a whole number from 1 to {MAX_WEIGHT}"),
                        ))
                    }
                }
            }
            weights.push((kp, values));
        }
    }
    let bounded = |v: &Option<Spanned<i64>>, default: i64, what: &str| match v {
        Some(n) if (1..=MAX_LIMIT).contains(n.get_ref()) => Ok(*n.get_ref() as u32),
        Some(n) => Err(src.err(
            n.span(),
            format!("{what} must be a whole number from 1 to {MAX_LIMIT}"),
        )),
        None => Ok(default as u32),
    };
    let min_limit = bounded(&p.min_limit, 4, "min_limit")?;
    let max_limit = bounded(&p.max_limit, 1000, "max_limit")?;
    if min_limit > max_limit {
        let span = p
            .min_limit
            .as_ref()
            .or(p.max_limit.as_ref())
            .map(Spanned::span)
            .unwrap_or_default();
        return Err(src.err(
            span,
            format!("min_limit ({min_limit}) is above max_limit ({max_limit})"),
        ));
    }
    let max_queue = bounded(&p.max_queue, 1000, "max_queue")? as usize;
    let queue_timeout = src.nonzero_duration_or(
        &p.queue_timeout,
        Duration::from_millis(500),
        "queue_timeout",
    )?;
    if queue_timeout > MAX_QUEUE_TIMEOUT {
        let span = p
            .queue_timeout
            .as_ref()
            .map(Spanned::span)
            .unwrap_or_default();
        return Err(src.err(
            span,
            "queue_timeout must be at most 60s (a longer wait holds the client's connection for nothing)",
        ));
    }
    // A part the client writes itself is the client's to choose: a tenant per value minted,
    // or the weight it names.
    let client_set = |part: &KeyPart| matches!(part, KeyPart::Header(_) | KeyPart::Query(_));
    for part in fair_by.iter().filter(|p| client_set(p)) {
        warnings.push(format!(
            "upstream \"{upstream}\": protect's fair_by reads \"{}\", which the client sets: a client can mint a tenant per value and take a share for each",
            part.to_config_string()
        ));
    }
    for (part, _) in weights.iter().filter(|(p, _)| client_set(p)) {
        warnings.push(format!(
            "upstream \"{upstream}\": protect's weights read \"{}\", which the client sets: a client can name its own weight",
            part.to_config_string()
        ));
    }
    Ok(Protect {
        fair_by,
        weights,
        min_limit,
        max_limit,
        queue_timeout,
        max_queue,
    })
}

/// `hash_key`: the request parts consistent hashing reads (only with `balance = "consistent"`).
fn hash_key(src: &Src, u: &RawUpstream, balance: Balance) -> Result<Vec<KeyPart>, ConfigError> {
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
    Ok(hash_key)
}

/// `tls = true` and what goes with it (SNI, verification, CA and client certificates, which are
/// loaded now so that `check` judges them); the TLS-only keys are refused without it.
fn upstream_tls(
    src: &Src,
    u: &RawUpstream,
    dir: &Path,
    warnings: &mut Vec<String>,
) -> Result<Option<UpstreamTls>, ConfigError> {
    if !u.tls.unwrap_or(false) {
        let tls_only = [
            ("sni", u.sni.as_ref().map(Spanned::span)),
            ("verify", u.verify.as_ref().map(Spanned::span)),
            ("ca_file", u.ca_file.as_ref().map(Spanned::span)),
            ("client_cert", u.client_cert.as_ref().map(Spanned::span)),
            ("client_key", u.client_key.as_ref().map(Spanned::span)),
        ];
        if let Some((key, Some(span))) = tls_only.iter().find(|(_, s)| s.is_some()) {
            return Err(src.err(
                span.clone(),
                format!("{key} applies only to an upstream with tls = true"),
            ));
        }
        return Ok(None);
    }
    let name = u.name.get_ref();
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
    Ok(Some(UpstreamTls {
        sni,
        verify,
        ca,
        client,
        ca_file,
        client_cert,
    }))
}

/// `host_header`: the `Host` sent upstream instead of the client's.
fn host_header(src: &Src, u: &RawUpstream) -> Result<Option<String>, ConfigError> {
    let Some(h) = &u.host_header else {
        return Ok(None);
    };
    let ok =
        !h.get_ref().is_empty() && http::uri::Authority::try_from(h.get_ref().as_str()).is_ok();
    if !ok {
        return Err(src.err(
            h.span(),
            format!("host_header \"{}\" is not a host[:port]", h.get_ref()),
        ));
    }
    Ok(Some(h.get_ref().clone()))
}

/// `passive`: ejecting a target after consecutive failures of live traffic.
fn passive(src: &Src, u: &RawUpstream) -> Result<Option<Passive>, ConfigError> {
    let Some(p) = &u.passive else {
        return Ok(None);
    };
    let p = p.get_ref();
    Ok(Some(Passive {
        consecutive_failures: match &p.consecutive_failures {
            Some(n) => u32::try_from(src.positive(n, "consecutive_failures")?)
                .map_err(|_| src.err(n.span(), "consecutive_failures is too large"))?,
            None => 5,
        },
        eject: src.nonzero_duration_or(&p.eject, Duration::from_secs(30), "eject")?,
    }))
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

#[cfg(test)]
mod tests {
    /// Every invalid `[[upstreams]]` fixture fails with the error, line and column it names.
    #[test]
    fn every_invalid_fixture_fails_as_it_says() {
        super::super::fixtures::check_section("upstreams");
    }
}
