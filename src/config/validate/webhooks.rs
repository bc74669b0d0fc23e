//! `[[webhooks]]`: where quota events go. A URL must be one the sender can reach
//! (http or https with a host) and not one of floodgate's own listeners, events known,
//! thresholds fractions of the limit, names unique.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use super::source::Src;
use crate::config::schema::RawWebhook;
use crate::config::ConfigError;
use crate::webhooks::{EventKind, Webhook};

/// `[[webhooks]]` entries at most: each has a queue and a worker of its own.
pub const MAX_WEBHOOKS: usize = 32;

/// The longest `timeout` of one delivery attempt.
const MAX_TIMEOUT: Duration = Duration::from_secs(60);

/// Every `[[webhooks]]`, in file order. `own` is every listener of this process, with the key
/// that configures it.
pub(super) fn webhooks(
    src: &Src,
    raw: &[toml::Spanned<RawWebhook>],
    own: &[(SocketAddr, &'static str)],
) -> Result<std::sync::Arc<[Webhook]>, ConfigError> {
    if let Some(past) = raw.get(MAX_WEBHOOKS) {
        return Err(src.err(
            past.span(),
            format!("at most {MAX_WEBHOOKS} [[webhooks]]: each has a queue and a worker of its own; send one receiver's events on from there"),
        ));
    }
    let mut all: Vec<Webhook> = Vec::with_capacity(raw.len());
    for w in raw {
        let hook = webhook(src, w.get_ref(), own)?;
        if all.iter().any(|o| o.name == hook.name) {
            let span = w
                .get_ref()
                .name
                .as_ref()
                .map_or(w.get_ref().url.span(), |n| n.span());
            return Err(src.err(
                span,
                format!("a second webhook named \"{}\": give each its own name = \"...\" (the name labels its metrics)", hook.name),
            ));
        }
        all.push(hook);
    }
    Ok(all.into())
}

/// Which of floodgate's own listeners `host:port` reaches, if one. Host names other than
/// `localhost` are not resolved (a check must not depend on DNS), so a name for this machine
/// passes.
fn own_listener(
    host: &str,
    port: u16,
    own: &[(SocketAddr, &'static str)],
) -> Option<(SocketAddr, &'static str)> {
    let name = host.trim_end_matches('.');
    let ip: Option<IpAddr> = if name.eq_ignore_ascii_case("localhost")
        || name.to_ascii_lowercase().ends_with(".localhost")
    {
        // Loopback (RFC 6761), of either family.
        None
    } else {
        Some(name.parse().ok()?)
    };
    // The machine itself: loopback, or the unspecified address (connecting to 0.0.0.0 or
    // [::] reaches a local listener).
    let this_machine =
        |ip: IpAddr| ip.is_loopback() || ip.is_unspecified() || ip.to_canonical().is_loopback();
    own.iter().copied().find(|(addr, _)| {
        if addr.port() != port {
            return false;
        }
        let listens = addr.ip();
        match ip {
            None => listens.is_unspecified() || listens.is_loopback(),
            Some(ip) if ip.to_canonical() == listens.to_canonical() => true,
            // A wildcard listener answers every address of the machine, a loopback one the
            // machine's own connections.
            Some(ip) => this_machine(ip) && (listens.is_unspecified() || listens.is_loopback()),
        }
    })
}

fn webhook(
    src: &Src,
    w: &RawWebhook,
    own: &[(SocketAddr, &'static str)],
) -> Result<Webhook, ConfigError> {
    let url = w.url.get_ref();
    let uri: http::Uri = url
        .parse()
        .map_err(|_| src.err(w.url.span(), format!("webhook url \"{url}\" is not a URL")))?;
    let tls = match uri.scheme_str() {
        Some("http") => false,
        Some("https") => true,
        _ => {
            return Err(src.err(
                w.url.span(),
                "webhook url must start with http:// or https://",
            ))
        }
    };
    let Some(host) = uri.host().filter(|h| !h.is_empty()) else {
        return Err(src.err(w.url.span(), "webhook url needs a host"));
    };
    if uri.authority().is_some_and(|a| a.as_str().contains('@')) {
        return Err(src.err(
            w.url.span(),
            "webhook url must not hold credentials; sign the events with secret instead",
        ));
    }
    let (events, thresholds) = events_and_thresholds(src, w)?;
    let secret = match &w.secret {
        Some(s) if s.get_ref().is_empty() => {
            return Err(src.err(
                s.span(),
                "secret must not be empty; leave it out to send unsigned events",
            ))
        }
        Some(s) => Some(s.get_ref().clone()),
        None => None,
    };
    let port = uri.port_u16().unwrap_or(if tls { 443 } else { 80 });
    let path = uri.path_and_query().map_or("/", |p| p.as_str()).to_string();
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    if let Some((addr, key)) = own_listener(&host, port, own) {
        return Err(src.err(
            w.url.span(),
            format!("webhook url reaches floodgate itself ({key} = \"{addr}\"): every event would be a request to this gateway; send the events to the receiver's own address"),
        ));
    }
    let name = match &w.name {
        Some(n) => {
            let ok = !n.get_ref().is_empty()
                && n.get_ref().len() <= 64
                && n.get_ref()
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'));
            if !ok {
                return Err(src.err(
                    n.span(),
                    "a webhook name is 1 to 64 of a-z, A-Z, 0-9, '-', '_', '.', ':'",
                ));
            }
            n.get_ref().clone()
        }
        None if uri.port_u16().is_some() => format!("{}:{port}", uri.host().unwrap_or_default()),
        None => uri.host().unwrap_or_default().to_string(),
    };
    let timeout = match &w.timeout {
        Some(t) => {
            let d = src.duration(t)?;
            if d.is_zero() || d > MAX_TIMEOUT {
                return Err(src.err(t.span(), "a webhook timeout is between 1ms and 60s"));
            }
            d
        }
        None => crate::webhooks::DEFAULT_TIMEOUT,
    };
    Ok(Webhook {
        name,
        url: url.clone(),
        timeout,
        host,
        port,
        path,
        tls,
        events,
        thresholds,
        secret,
    })
}

/// A webhook's events (each once) and, for the `threshold` event, its thresholds in order.
fn events_and_thresholds(
    src: &Src,
    w: &RawWebhook,
) -> Result<(Vec<EventKind>, Vec<f64>), ConfigError> {
    let mut events = Vec::new();
    for e in w.events.get_ref() {
        let kind = src.one_of(e, "event", EventKind::NAMES)?;
        if !events.contains(&kind) {
            events.push(kind);
        }
    }
    if events.is_empty() {
        return Err(src.err(
            w.events.span(),
            "events needs at least one of \"threshold\", \"rejected\"",
        ));
    }
    let mut thresholds = Vec::new();
    match &w.thresholds {
        Some(list) if events.contains(&EventKind::Threshold) => {
            for t in list.get_ref() {
                let v = *t.get_ref();
                if !(v > 0.0 && v <= 1.0) {
                    return Err(src.err(
                        t.span(),
                        "a threshold is a fraction of the limit, above 0 and at most 1 (0.8 is 80 %)",
                    ));
                }
                thresholds.push(v);
            }
            if thresholds.is_empty() {
                return Err(src.err(
                    list.span(),
                    "thresholds needs at least one, e.g. [0.8, 1.0]",
                ));
            }
        }
        Some(list) => {
            return Err(src.err(
                list.span(),
                "thresholds apply to the \"threshold\" event only",
            ))
        }
        None if events.contains(&EventKind::Threshold) => {
            return Err(src.err(
                w.events.span(),
                "the \"threshold\" event needs thresholds, e.g. thresholds = [0.8, 1.0]",
            ))
        }
        None => {}
    }
    thresholds.sort_by(f64::total_cmp);
    thresholds.dedup();
    Ok((events, thresholds))
}
