//! What a key part reads from a request: one reader for the three places that key on parts —
//! counters ([`super::Rule::counter_id`]), consistent hashing ([`hash_key`], the upstreams'
//! `hash_key`) and the heavy-hitter labels of `/top` and the dashboard — so that a request is
//! one client to all three.
//!
//! One decision for all of them:
//! - `path` is the normalized path without its trailing slash: `/orders/1/` and `/orders/1` are
//!   one resource (one counter, one upstream target, one label);
//! - `query:NAME` is the first `NAME` parameter, name and value percent-decoded, `+` a space
//!   ([`crate::wire::query`]);
//! - a value is capped at [`MAX_KEY_VALUE`] bytes: the rest is ignored everywhere;
//! - `claim:NAME` is a verified token's claim as text (a string as is, a number or boolean as
//!   written in JSON; an array or object has none);
//! - a part the request lacks (no API key, no plan, no such header, parameter or claim) is absent:
//!   a rule keyed on it does not apply (counted as skipped), consistent hashing takes it as
//!   empty (parts stay separated), a label shows it empty.

use std::net::IpAddr;

use super::{query_param, KeyPart, RequestView, MAX_KEY_VALUE};

/// A key part's value in one request.
#[derive(Debug)]
pub enum Value<'r> {
    /// The client IP (IPv4 as 4 octets, IPv6 as 16).
    Ip {
        /// The address, for labels.
        addr: IpAddr,
        /// Its octets.
        octets: [u8; 16],
        /// How many of `octets` are used.
        len: usize,
    },
    /// Bytes of the request or of its identity.
    Bytes(&'r [u8]),
    /// A decoded query value.
    Decoded(crate::wire::query::QueryValue<'r>),
    /// A claim's value as text (a number or boolean as written in JSON).
    Text(std::borrow::Cow<'r, str>),
}

impl Value<'_> {
    /// The value's bytes, capped at [`MAX_KEY_VALUE`].
    pub fn as_bytes(&self) -> &[u8] {
        let all = match self {
            Value::Ip { octets, len, .. } => &octets[..*len],
            Value::Bytes(b) => b,
            Value::Decoded(v) => v.as_bytes(),
            Value::Text(t) => t.as_bytes(),
        };
        &all[..all.len().min(MAX_KEY_VALUE)]
    }
}

/// The value `part` reads from `req`, or `None` when the request lacks it.
pub fn read<'r>(part: &KeyPart, req: &RequestView<'r>) -> Option<Value<'r>> {
    Some(match part {
        KeyPart::Ip => {
            let mut octets = [0u8; 16];
            let len = match req.ip {
                IpAddr::V4(v4) => {
                    octets[..4].copy_from_slice(&v4.octets());
                    4
                }
                IpAddr::V6(v6) => {
                    octets = v6.octets();
                    16
                }
            };
            Value::Ip {
                addr: req.ip,
                octets,
                len,
            }
        }
        KeyPart::ApiKey => Value::Bytes(req.identity?.id.as_bytes()),
        KeyPart::User => Value::Bytes(req.identity?.user.as_bytes()),
        KeyPart::Plan => Value::Bytes(req.identity?.plan.as_deref()?.as_bytes()),
        KeyPart::Route => Value::Bytes(req.route.as_bytes()),
        KeyPart::Method => Value::Bytes(req.method.as_str().as_bytes()),
        KeyPart::Path => {
            Value::Bytes(crate::wire::normalize::trim_trailing_slash(req.path).as_bytes())
        }
        KeyPart::Header(name) => Value::Bytes(req.headers.get(name)?.as_bytes()),
        KeyPart::Query(name) => Value::Decoded(query_param(req.query?, name)?),
        KeyPart::Claim(name) => {
            let claims = &req.identity?.claims.as_deref()?.claims;
            Value::Text(crate::jwt::claims::text(crate::jwt::claims::lookup(
                claims, name,
            )?)?)
        }
    })
}

/// The consistent-hashing key of a request: its `parts` (the client IP when there are none),
/// each value followed by a separator so that ("ab", "c") and ("a", "bc") differ; an absent
/// part hashes as empty.
pub fn hash_key(parts: &[KeyPart], req: &RequestView<'_>) -> Vec<u8> {
    let ip = [KeyPart::Ip];
    let parts = if parts.is_empty() { &ip[..] } else { parts };
    let mut key = Vec::with_capacity(64);
    for p in parts {
        if let Some(v) = read(p, req) {
            key.extend_from_slice(v.as_bytes());
        }
        key.push(0);
    }
    key
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderMap, HeaderName, HeaderValue, Method};

    fn view<'a>(path: &'a str, query: Option<&'a str>, headers: &'a HeaderMap) -> RequestView<'a> {
        RequestView {
            route: "orders",
            case_sensitive: true,
            method: &Method::GET,
            path,
            query,
            host: None,
            headers,
            ip: "10.1.2.3".parse().unwrap(),
            identity: None,
        }
    }

    #[test]
    fn a_trailing_slash_is_one_resource_to_counters_and_hashing() {
        let h = HeaderMap::new();
        let parts = [KeyPart::Path];
        assert_eq!(
            hash_key(&parts, &view("/orders/1/", None, &h)),
            hash_key(&parts, &view("/orders/1", None, &h))
        );
        assert_eq!(
            read(&KeyPart::Path, &view("/a/", None, &h))
                .unwrap()
                .as_bytes(),
            b"/a"
        );
    }

    #[test]
    fn values_are_capped_for_every_reader() {
        let mut h = HeaderMap::new();
        let long = "x".repeat(MAX_KEY_VALUE + 500);
        let longer = "x".repeat(MAX_KEY_VALUE + 900);
        let name = HeaderName::from_static("x-tenant");
        h.insert(name.clone(), HeaderValue::from_str(&long).unwrap());
        let mut h2 = HeaderMap::new();
        h2.insert(name.clone(), HeaderValue::from_str(&longer).unwrap());
        let part = KeyPart::Header(name);
        let v = read(&part, &view("/", None, &h)).unwrap();
        assert_eq!(v.as_bytes().len(), MAX_KEY_VALUE);
        let parts = [part];
        assert_eq!(
            hash_key(&parts, &view("/", None, &h)),
            hash_key(&parts, &view("/", None, &h2)),
            "bytes past the cap are ignored by hashing as by counters"
        );
    }

    #[test]
    fn absent_parts_are_none_and_hash_as_empty() {
        let h = HeaderMap::new();
        let v = view("/", Some("a=1"), &h);
        assert!(read(&KeyPart::ApiKey, &v).is_none());
        assert!(read(&KeyPart::Query("user".into()), &v).is_none());
        assert!(read(&KeyPart::Header(HeaderName::from_static("x-a")), &v).is_none());
        assert_eq!(hash_key(&[KeyPart::ApiKey, KeyPart::Plan], &v), vec![0, 0]);
    }

    #[test]
    fn query_values_are_decoded_and_ip_is_its_octets() {
        let h = HeaderMap::new();
        let v = view("/", Some("%75ser=%61lice"), &h);
        let q = read(&KeyPart::Query("user".into()), &v).unwrap();
        assert_eq!(q.as_bytes(), b"alice");
        assert_eq!(read(&KeyPart::Ip, &v).unwrap().as_bytes(), [10, 1, 2, 3]);
        assert_eq!(
            hash_key(&[], &v),
            vec![10, 1, 2, 3, 0],
            "no parts: the client IP"
        );
    }
}
