//! How `/top` names a client: the readable key parts of a rule (or an RLS descriptor's
//! entries), with credentials shown as a digest and request data cut to
//! [`super::MAX_SHOWN_VALUE`] bytes and escaped.

use crate::config::Config;
use crate::rules::{KeyPart, RequestView, Rule, MAX_KEY_VALUE};

use super::{Client, MAX_SHOWN_VALUE};

/// The readable key parts of `rule` for this request. Credentials never appear: the API key
/// part is the key id; a `header:` part naming the auth header, `authorization`,
/// `proxy-authorization` or `cookie`, and a `query:` part whose name says key, token, secret,
/// password, auth or sig, show `sha256:` and 12 hex digits of the value instead.
pub fn client_label(cfg: &Config, rule: &Rule, view: &RequestView<'_>) -> Client {
    let mut parts = Vec::with_capacity(rule.key_parts.len());
    for part in &rule.key_parts {
        // The value the counter was charged with (crate::rules::key), shown.
        let value = crate::rules::key::read(part, view);
        let raw = value.as_ref().map_or(&b""[..], |v| v.as_bytes());
        let shown_value = match (part, &value) {
            (KeyPart::Ip, Some(crate::rules::key::Value::Ip { addr, .. })) => addr.to_string(),
            (KeyPart::Header(name), _) if secret_header(cfg, name) => digest(raw),
            (KeyPart::Query(name), _) if secret_query(name) => digest(raw),
            _ => shown(raw),
        };
        parts.push((part.to_config_string(), shown_value));
    }
    Client { parts }
}

/// Headers that carry credentials: shown as a digest, never as their value.
fn secret_header(cfg: &Config, name: &http::HeaderName) -> bool {
    *name == cfg.auth.header
        || *name == http::header::AUTHORIZATION
        || *name == http::header::PROXY_AUTHORIZATION
        || *name == http::header::COOKIE
}

/// Query parameters whose names say they carry credentials.
fn secret_query(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    ["key", "token", "secret", "pass", "auth", "sig"]
        .iter()
        .any(|w| lower.contains(w))
}

/// Request bytes as text for the admin page: at most [`MAX_SHOWN_VALUE`] bytes, invalid UTF-8
/// replaced, control characters escaped.
fn shown(raw: &[u8]) -> String {
    let cut = &raw[..raw.len().min(MAX_SHOWN_VALUE)];
    let mut s: String = String::from_utf8_lossy(cut).escape_debug().collect();
    if raw.len() > MAX_SHOWN_VALUE {
        s.push('…');
    }
    s
}

/// A short digest standing in for a credential: distinct clients stay distinct, the value is
/// not shown.
fn digest(raw: &[u8]) -> String {
    use sha2::Digest as _;
    let d = sha2::Sha256::digest(&raw[..raw.len().min(MAX_KEY_VALUE)]);
    format!("sha256:{}", &hex::encode(d)[..12])
}

/// The client of an RLS descriptor: its entries as `(key, value)`, a value whose key says it
/// carries credentials (as `query:` parts are judged) shown as a digest.
pub fn descriptor_label<'a>(entries: impl Iterator<Item = (&'a str, &'a str)>) -> Client {
    Client {
        parts: entries
            .map(|(k, v)| {
                let shown_value = if secret_query(k) {
                    digest(v.as_bytes())
                } else {
                    shown(v.as_bytes())
                };
                (k.to_string(), shown_value)
            })
            .collect(),
    }
}
