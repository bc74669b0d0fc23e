//! `[rls]` and `[[rls.limits]]`: the listener Envoy asks and the limits it answers with.
//!
//! A limit's counting options are a rule's: they are read by the `[[rules]]` code
//! ([`super::rules::shape`], [`super::rules::charge`], [`super::rules::respond`] for
//! `block_for`) so that a limit and a rule written alike count alike and fail alike, with the
//! same messages. What is the limit's own: its name (unique among rules and limits: both count
//! and report under it), its domain and descriptor, and the options that cannot apply to an
//! answer Envoy waits for (a concurrency limit never hears that a request ended; a shaping
//! bucket would hold the answer; `count` and `cost_from` would read a response Envoy never
//! shows). `[rls]` itself: `listen`, `threads` and `tls` (its files checked as
//! `[server.tls]`'s).

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use toml::Spanned;

use super::rules::{charge, check_name, respond, shape};
use super::source::Src;
use crate::config::schema::*;
use crate::config::ConfigError;
use crate::limiter::Algorithm;
use crate::rls::limits::{Entry, RlsLimit, Serving, Settings, Tls, MAX_ENTRIES};
use crate::rules::Rule;

/// Where the service listens when `[rls]` names no `listen`: loopback, as the admin listener,
/// so that nothing is exposed by default.
pub const DEFAULT_LISTEN: ([u8; 4], u16) = ([127, 0, 0, 1], 8081);

/// Most `[rls] threads`: past the cores of any machine floodgate runs on, more threads only
/// cost memory (each has its own stack).
pub const MAX_THREADS: u64 = 256;

/// Most `[rls] max_streams`: each open call costs memory (a task, its buffers, up to a
/// 64 KiB flow-control window of request bytes), and Envoy never needs more than a few dozen
/// at once on one connection.
pub const MAX_STREAMS: u64 = 1000;

/// Longest `[rls] header_timeout` / `request_timeout`: past it a stalled client holds a
/// descriptor and a call's memory longer than any real client needs.
const MAX_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3600);

/// Longest `[rls] idle_timeout`.
const MAX_IDLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// `[rls]`, or `None` when the file has none. `threads` is `[server] threads`, the default of
/// the service's own; `dir` is where relative TLS paths are found.
pub(super) fn rls(
    src: &Src,
    raw: &Option<Spanned<RawRls>>,
    rules: &[Arc<Rule>],
    threads: usize,
    dir: &Path,
) -> Result<Option<Settings>, ConfigError> {
    let Some(raw) = raw else {
        return Ok(None);
    };
    let raw = raw.get_ref();
    let listen = match &raw.listen {
        Some(a) => src.socket_addr(a, "rls.listen")?,
        None => SocketAddr::from(DEFAULT_LISTEN),
    };
    let mut names: HashSet<&str> = HashSet::new();
    let mut limits: Vec<Arc<RlsLimit>> = Vec::new();
    for l in &raw.limits {
        let name = l.name.get_ref();
        if rules.iter().any(|r| &*r.name == name.as_str()) {
            return Err(src.err(
                l.name.span(),
                format!("rls limit \"{name}\" has the name of a [[rules]] entry; both count and report under their name, so each needs its own"),
            ));
        }
        if !names.insert(name) {
            return Err(src.err(
                l.name.span(),
                format!("rls limit \"{name}\" is defined twice"),
            ));
        }
        let limit = one(src, l)?;
        if let Some(same) = limits
            .iter()
            .find(|o| o.domain == limit.domain && o.entries == limit.entries)
        {
            return Err(src.err(
                l.descriptor.span(),
                format!(
                    "rls limit \"{name}\" has the same domain and descriptor as \"{}\"; only one of them could ever apply",
                    same.policy.name
                ),
            ));
        }
        limits.push(Arc::new(limit));
    }
    let mut settings = Settings::new(listen, limits);
    settings.threads = match &raw.threads {
        Some(t) => match src.positive(t, "rls.threads")? {
            n if n > MAX_THREADS => {
                return Err(src.err(t.span(), format!("rls.threads is at most {MAX_THREADS}")))
            }
            n => n as usize,
        },
        None => threads,
    };
    settings.serving = serving(src, raw)?;
    settings.tls = match &raw.tls {
        Some(t) => {
            let t = t.get_ref();
            Some(Tls {
                cert: super::server::existing_file(src, &t.cert, dir, "TLS certificate")?,
                key: super::server::existing_file(src, &t.key, dir, "TLS private key")?,
            })
        }
        None => None,
    };
    Ok(Some(settings))
}

/// The listener's caps and deadlines, each bounded (a zero would refuse or cut every client,
/// a huge one would let one hold the port).
fn serving(src: &Src, raw: &RawRls) -> Result<Serving, ConfigError> {
    let d = Serving::default();
    let timeout = |v: &Option<Spanned<String>>, name: &str, default, max: std::time::Duration| {
        let Some(t) = v else {
            return Ok(default);
        };
        let got = src.duration(t)?;
        if got.is_zero() || got > max {
            let max = if max.as_secs() == 3600 { "1h" } else { "24h" };
            return Err(src.err(
                t.span(),
                format!("rls.{name} must be between 1ms and {max}"),
            ));
        }
        Ok(got)
    };
    let count = |v: &Option<Spanned<i64>>, name: &str, default: usize| match v {
        Some(n) => src
            .positive(n, &format!("rls.{name}"))
            .map(|n| usize::try_from(n).unwrap_or(usize::MAX)),
        None => Ok(default),
    };
    let max_streams = match &raw.max_streams {
        Some(n) => match src.positive(n, "rls.max_streams")? {
            m if m > MAX_STREAMS => {
                return Err(src.err(
                    n.span(),
                    format!("rls.max_streams is at most {MAX_STREAMS}"),
                ))
            }
            m => m as u32,
        },
        None => d.max_streams,
    };
    Ok(Serving {
        max_connections: count(&raw.max_connections, "max_connections", d.max_connections)?,
        max_per_ip: count(
            &raw.max_connections_per_ip,
            "max_connections_per_ip",
            d.max_per_ip,
        )?,
        header_timeout: timeout(
            &raw.header_timeout,
            "header_timeout",
            d.header_timeout,
            MAX_TIMEOUT,
        )?,
        request_timeout: timeout(
            &raw.request_timeout,
            "request_timeout",
            d.request_timeout,
            MAX_TIMEOUT,
        )?,
        idle_timeout: timeout(
            &raw.idle_timeout,
            "idle_timeout",
            d.idle_timeout,
            MAX_IDLE_TIMEOUT,
        )?,
        max_streams,
    })
}

/// One limit: its own keys here, its counting options by the rules' code.
fn one(src: &Src, l: &RawRlsLimit) -> Result<RlsLimit, ConfigError> {
    let name = l.name.get_ref();
    check_name(src, &l.name, "rls limit")?;
    let domain = l.domain.get_ref();
    if domain.is_empty() || domain.chars().any(char::is_control) {
        return Err(src.err(
            l.domain.span(),
            format!("rls limit \"{name}\": domain must be non-empty without control characters"),
        ));
    }
    let entries = descriptor(src, l, name)?;
    // Only policing answers Envoy: a shaping bucket would hold the answer past Envoy's
    // timeout, and a slowed request's bodies are Envoy's to serve, not floodgate's.
    if let Some(m) = l.mode.as_ref().filter(|m| m.get_ref() != "police") {
        if ["shape", "slow"].contains(&m.get_ref().as_str()) {
            return Err(src.err(
                m.span(),
                format!("rls limit \"{name}\": mode = \"{}\" cannot apply to Envoy's question (shaping would hold the answer past Envoy's timeout; slowing serves bodies floodgate never sees); a rate-limit service only polices", m.get_ref()),
            ));
        }
    }
    let rule = as_rule(l);
    let shape = shape(src, &rule, name).map_err(|e| as_limit(e, name))?;
    if shape.algorithm() == Algorithm::Concurrency {
        return Err(src.err(
            l.algorithm.span(),
            format!("rls limit \"{name}\": concurrency counts requests in flight, and a rate-limit service never hears when Envoy's request ends; use a rule of the gateway for it"),
        ));
    }
    let charge = charge(src, &rule, name, &shape).map_err(|e| as_limit(e, name))?;
    refuse_response_keys(src, l, name)?;
    // block_for, by the rules' code and bounds (refused with a lease or a shaping bucket).
    let respond = respond(src, &rule, name, &shape, &charge).map_err(|e| as_limit(e, name))?;
    // slow_rate is None: mode = "slow" was refused above.
    let limit = shape.blocking(respond.block_for.unwrap_or_default());
    Ok(RlsLimit {
        domain: domain.clone(),
        entries,
        policy: Arc::new(charge.policy(name, limit, respond, l.shadow, true)),
    })
}

/// `count` and `cost_from` learn from the upstream's response, which Envoy never shows its
/// rate-limit service: refused with the reason (serde would only say "unknown field").
fn refuse_response_keys(src: &Src, l: &RawRlsLimit, name: &str) -> Result<(), ConfigError> {
    if let Some(c) = &l.count {
        return Err(src.err(
            c.span(),
            format!("rls limit \"{name}\": count is not an rls option: Envoy asks before the upstream answers and never sends the response's status, so there is nothing to count by; use a [[rules]] entry of the gateway"),
        ));
    }
    if let Some(c) = &l.cost_from {
        return Err(src.err(
            c.span(),
            format!("rls limit \"{name}\": cost_from is not an rls option: Envoy never sends the upstream's response, so there is no cost to read; send the cost as hits_addend, or use a [[rules]] entry of the gateway"),
        ));
    }
    Ok(())
}

/// `descriptor`: one to [`MAX_ENTRIES`] entries, each a non-empty key and, optionally, the
/// value it must have (at most [`crate::rules::MAX_KEY_VALUE`] bytes, as request values are
/// compared).
fn descriptor(src: &Src, l: &RawRlsLimit, name: &str) -> Result<Vec<Entry>, ConfigError> {
    let list = l.descriptor.get_ref();
    if list.is_empty() {
        return Err(src.err(
            l.descriptor.span(),
            format!("rls limit \"{name}\": descriptor needs at least one entry, e.g. [{{ key = \"user\" }}]"),
        ));
    }
    if list.len() > MAX_ENTRIES {
        return Err(src.err(
            l.descriptor.span(),
            format!("rls limit \"{name}\": descriptor has at most {MAX_ENTRIES} entries"),
        ));
    }
    let mut out = Vec::with_capacity(list.len());
    for e in list {
        let e = e.get_ref();
        if e.key.get_ref().is_empty() {
            return Err(src.err(
                e.key.span(),
                format!("rls limit \"{name}\": a descriptor key must not be empty"),
            ));
        }
        if let Some(v) = &e.value {
            if v.get_ref().is_empty() {
                return Err(src.err(
                    v.span(),
                    format!("rls limit \"{name}\": a descriptor value must not be empty; leave value out to count each value on its own"),
                ));
            }
            if v.get_ref().len() > crate::rules::MAX_KEY_VALUE {
                return Err(src.err(
                    v.span(),
                    format!(
                        "rls limit \"{name}\": a descriptor value is at most {} bytes",
                        crate::rules::MAX_KEY_VALUE
                    ),
                ));
            }
        }
        out.push(Entry {
            key: e.key.get_ref().clone(),
            value: e.value.as_ref().map(|v| v.get_ref().clone()),
        });
    }
    Ok(out)
}

/// An error of the rules' code about this limit, naming it as what it is.
fn as_limit(mut e: ConfigError, name: &str) -> ConfigError {
    let rule = format!("rule \"{name}\"");
    if e.message.starts_with(&rule) {
        e.message = format!("rls limit \"{name}\"{}", &e.message[rule.len()..]);
    }
    e
}

/// The limit as the `[[rules]]` entry whose counting options it shares (its key and match
/// are the descriptor's business, never read from this).
fn as_rule(l: &RawRlsLimit) -> RawRule {
    RawRule {
        name: l.name.clone(),
        matcher: RawRuleMatch::default(),
        key: Spanned::new(l.descriptor.span(), Vec::new()),
        algorithm: l.algorithm.clone(),
        limit: l.limit.clone(),
        window: l.window.clone(),
        burst: l.burst.clone(),
        scope: l.scope.clone(),
        on_store_error: l.on_store_error.clone(),
        mode: l.mode.clone(),
        max_delay: None,
        max_waiting: None,
        cost: l.cost.clone(),
        shadow: l.shadow,
        headers: None,
        status: None,
        lease: l.lease.clone(),
        lease_ttl: l.lease_ttl.clone(),
        slow_rate: None,
        count: None,
        cost_from: None,
        block_for: l.block_for.clone(),
        limit_from: None,
        limit_max: None,
        calendar: l.calendar.clone(),
        timezone: l.timezone.clone(),
    }
}

#[cfg(test)]
mod tests {
    /// Every invalid `[rls]` fixture fails with the error, line and column it names.
    #[test]
    fn every_invalid_fixture_fails_as_it_says() {
        super::super::fixtures::check_section("rls");
    }
}
