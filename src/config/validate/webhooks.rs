//! `[[webhooks]]`: where quota events go. A URL must be one the sender can reach
//! (http or https with a host), events known, thresholds fractions of the limit.

use super::source::Src;
use crate::config::schema::RawWebhook;
use crate::config::ConfigError;
use crate::webhooks::{EventKind, Webhook};

/// Every `[[webhooks]]`, in file order.
pub(super) fn webhooks(
    src: &Src,
    raw: &[toml::Spanned<RawWebhook>],
) -> Result<std::sync::Arc<[Webhook]>, ConfigError> {
    raw.iter().map(|w| webhook(src, w.get_ref())).collect()
}

fn webhook(src: &Src, w: &RawWebhook) -> Result<Webhook, ConfigError> {
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
    Ok(Webhook {
        url: url.clone(),
        host: host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string(),
        port,
        path,
        tls,
        events,
        thresholds,
        secret,
    })
}
