//! Who the client is at the network level: its IP (believing `X-Forwarded-For` only from
//! trusted proxies) and the request id that follows the request through logs and upstreams.

use std::net::IpAddr;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue};
use ipnet::IpNet;

use crate::wire::header_names as names;

/// The client IP. The peer address is the truth unless the peer is a trusted proxy; then
/// `X-Forwarded-For` is read from the right, one element at a time (its lines are one list),
/// skipping trusted hops, and the first address that is not trusted is the client (everything
/// left of it could have been written by the client).
///
/// As nginx's realip module reads it: empty elements (`a, , b`, a trailing comma) are
/// skipped, and an element that is not an address (`unknown`, non-ASCII bytes) ends the walk
/// with the last address read, so a bad element left of the client's address costs nothing.
/// (Reading the header as text first made one non-ASCII byte anywhere turn the proxy itself
/// into the client, sharing one per-IP counter among everyone behind it.)
///
/// IPv4-mapped IPv6 addresses (`::ffff:10.0.0.1`, what a dual-stack `[::]` listener reports
/// for IPv4 peers) are read as the IPv4 address they carry, the peer and every hop alike: one
/// client is one `ip` key and matches IPv4 `trusted_proxies` entries however it connected.
pub fn client_ip(peer: IpAddr, headers: &HeaderMap, trusted: &[IpNet]) -> IpAddr {
    let peer = peer.to_canonical();
    let is_trusted = |ip: &IpAddr| trusted.iter().any(|net| net.contains(ip));
    if !is_trusted(&peer) {
        return peer;
    }
    let mut client = peer;
    for value in headers.get_all(names::X_FORWARDED_FOR.name()).iter().rev() {
        for hop in value.as_bytes().rsplit(|&b| b == b',') {
            let hop = hop.trim_ascii();
            if hop.is_empty() {
                continue;
            }
            let Some(ip) = std::str::from_utf8(hop).ok().and_then(parse_hop) else {
                return client;
            };
            client = ip;
            if !is_trusted(&ip) {
                return ip;
            }
        }
    }
    client
}

/// One X-Forwarded-For element (trimmed): an IP, possibly with a port or IPv6 brackets.
fn parse_hop(hop: &str) -> Option<IpAddr> {
    parse_hop_as_written(hop).map(|ip| ip.to_canonical())
}

fn parse_hop_as_written(hop: &str) -> Option<IpAddr> {
    if let Ok(ip) = hop.parse() {
        return Some(ip);
    }
    if let Some(rest) = hop.strip_prefix('[') {
        return rest.split_once(']')?.0.parse().ok();
    }
    hop.rsplit_once(':')?.0.parse().ok()
}

/// Longest request id kept from a client.
pub const MAX_REQUEST_ID: usize = 128;

/// The id that follows a request through logs, answers and the upstream: the client's
/// `X-Request-Id` if it is sane (short, visible ASCII without separators that could break log
/// lines), else a fresh random one.
///
/// Kept as a header value: it is written into two or three headers per request, and a clone
/// shares the bytes instead of copying and re-validating them each time.
#[derive(Debug, Clone)]
pub struct RequestId {
    value: HeaderValue,
    from_client: bool,
}

impl Default for RequestId {
    fn default() -> Self {
        RequestId {
            value: HeaderValue::from_static(""),
            from_client: false,
        }
    }
}

impl RequestId {
    /// The request's id, from its headers or fresh.
    pub fn of(headers: &HeaderMap) -> RequestId {
        let mut sent = headers.get_all(names::X_REQUEST_ID.name()).iter();
        if let (Some(v), None) = (sent.next(), sent.next()) {
            let b = v.as_bytes();
            if !b.is_empty()
                && b.len() <= MAX_REQUEST_ID
                && b.iter()
                    .all(|c| c.is_ascii_alphanumeric() || b"-_.:".contains(c))
            {
                return RequestId {
                    value: v.clone(),
                    from_client: true,
                };
            }
        }
        RequestId {
            value: new_request_id(),
            from_client: false,
        }
    }

    /// The id as text (always plain ASCII: checked or generated so).
    pub fn as_str(&self) -> &str {
        self.value.to_str().unwrap_or_default()
    }

    /// The id as a header value.
    pub fn header_value(&self) -> &HeaderValue {
        &self.value
    }

    /// Whether the request arrived with exactly this id as its one `X-Request-Id` (so a copy
    /// of the request's headers already carries it).
    pub fn from_client(&self) -> bool {
        self.from_client
    }
}

/// A random 128-bit id in hex.
///
/// Its bytes live in one shared allocation from the start: the value is cloned into the
/// upstream request and into the response, and a clone of a `Bytes` made from a `String`
/// allocates again to become shared.
fn new_request_id() -> HeaderValue {
    let mut id = [0u8; 32];
    crate::text::hex16_into(&mut id[..16], fastrand::u64(..));
    crate::text::hex16_into(&mut id[16..], fastrand::u64(..));
    HeaderValue::from_maybe_shared(Bytes::from_owner(id)).expect("hex digits are a header value")
}

/// The `X-Forwarded-For` to send upstream: the chain the client sent, byte for byte (an
/// element floodgate could not read is still the upstream's to judge), with the peer
/// appended. Built in one buffer: this runs for every proxied request. Several lines are one
/// chain: `crate::wire::header_policy::for_upstream` joins them before this reads the first.
pub fn forwarded_for(sent: Option<&HeaderValue>, peer: IpAddr) -> HeaderValue {
    let previous = sent
        .map(HeaderValue::as_bytes)
        .filter(|v| !v.trim_ascii().is_empty());
    // The address is written in this thread's scratch, and the value made in one allocation of
    // its exact size: a `String` handed over with room to spare would cost a second one for
    // its shared owner.
    crate::text::with_scratch(|ip| {
        // As text, an IPv4-mapped IPv6 address as IPv4.
        crate::text::push_ip(ip, peer.to_canonical());
        let value = match previous {
            Some(p) => {
                let mut chain = Vec::with_capacity(p.len() + 2 + ip.len());
                chain.extend_from_slice(p);
                chain.extend_from_slice(b", ");
                chain.extend_from_slice(ip.as_bytes());
                HeaderValue::from_maybe_shared(Bytes::from(chain))
            }
            None => HeaderValue::from_bytes(ip.as_bytes()),
        };
        // A header value, a separator and an address: always a header value.
        value.unwrap_or_else(|_| HeaderValue::from_static("unknown"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn xff(v: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", v.parse().unwrap());
        h
    }

    #[test]
    fn untrusted_peer_is_the_client() {
        let trusted: Vec<IpNet> = vec!["10.0.0.0/8".parse().unwrap()];
        let peer: IpAddr = "203.0.113.9".parse().unwrap();
        assert_eq!(client_ip(peer, &xff("1.2.3.4"), &trusted), peer);
    }

    #[test]
    fn trusted_peer_yields_rightmost_untrusted() {
        let trusted: Vec<IpNet> = vec!["10.0.0.0/8".parse().unwrap()];
        let peer: IpAddr = "10.0.0.1".parse().unwrap();
        let got = client_ip(peer, &xff("6.6.6.6, 1.2.3.4, 10.0.0.7"), &trusted);
        assert_eq!(got, "1.2.3.4".parse::<IpAddr>().unwrap());
        assert_eq!(client_ip(peer, &HeaderMap::new(), &trusted), peer);
        assert_eq!(
            client_ip(peer, &xff("[2001:db8::1]:443"), &trusted),
            "2001:db8::1".parse::<IpAddr>().unwrap()
        );
        // Garbage stops the walk at the last good hop.
        assert_eq!(
            client_ip(peer, &xff("junk, 10.0.0.9"), &trusted),
            "10.0.0.9".parse::<IpAddr>().unwrap()
        );
    }

    #[test]
    fn one_bad_element_does_not_make_the_proxy_the_client() {
        let trusted: Vec<IpNet> = vec!["10.0.0.0/8".parse().unwrap()];
        let peer: IpAddr = "10.0.0.1".parse().unwrap();
        let client: IpAddr = "203.0.113.5".parse().unwrap();
        let raw = |bytes: &[u8]| {
            let mut h = HeaderMap::new();
            h.insert("x-forwarded-for", HeaderValue::from_bytes(bytes).unwrap());
            h
        };
        for chain in [
            &b"\xc3\xa9, 203.0.113.5"[..],
            b"\xff\xfe, 203.0.113.5, 10.0.0.7",
            b"unknown, 203.0.113.5",
            b"203.0.113.5,",
            b"203.0.113.5, ,10.0.0.7 , ",
            b" , 203.0.113.5",
            b"203.0.113.5,,,",
        ] {
            assert_eq!(
                client_ip(peer, &raw(chain), &trusted),
                client,
                "{}",
                chain.escape_ascii()
            );
        }
        // Lines are one list, read from the last.
        let mut lines = raw(b"198.51.100.1, \xc3\xa9");
        lines.append("x-forwarded-for", "203.0.113.5, 10.0.0.8".parse().unwrap());
        assert_eq!(client_ip(peer, &lines, &trusted), client);
        // A bad element where the client's address should be stops at the last trusted hop.
        assert_eq!(
            client_ip(peer, &raw(b"203.0.113.5, \xc3\xa9, 10.0.0.7"), &trusted),
            "10.0.0.7".parse::<IpAddr>().unwrap()
        );
        // Nothing but empties: the peer.
        assert_eq!(client_ip(peer, &raw(b" , ,"), &trusted), peer);
    }

    #[test]
    fn mapped_ipv4_is_ipv4() {
        let trusted: Vec<IpNet> = vec!["10.0.0.0/8".parse().unwrap()];
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().unwrap();
        // The mapped peer is a trusted IPv4 proxy; a mapped hop is an IPv4 client.
        assert_eq!(
            client_ip(mapped, &xff("::ffff:203.0.113.7"), &trusted),
            "203.0.113.7".parse::<IpAddr>().unwrap()
        );
        let untrusted: IpAddr = "::ffff:198.51.100.1".parse().unwrap();
        assert_eq!(
            client_ip(untrusted, &HeaderMap::new(), &trusted),
            "198.51.100.1".parse::<IpAddr>().unwrap()
        );
    }

    #[test]
    fn request_id_kept_when_sane() {
        let mut h = HeaderMap::new();
        h.insert("x-request-id", "abc-123".parse().unwrap());
        let kept = RequestId::of(&h);
        assert_eq!(kept.as_str(), "abc-123");
        assert!(kept.from_client());
        h.insert("x-request-id", "bad id with spaces".parse().unwrap());
        let generated = RequestId::of(&h);
        assert_eq!(generated.as_str().len(), 32);
        assert!(generated.as_str().bytes().all(|c| c.is_ascii_hexdigit()));
        assert!(!generated.from_client());
        // Two ids: neither is the request's (a fresh one replaces both upstream).
        h.insert("x-request-id", "one".parse().unwrap());
        h.append("x-request-id", "two".parse().unwrap());
        let fresh = RequestId::of(&h);
        assert!(!fresh.from_client() && fresh.as_str().len() == 32);
        assert_ne!(RequestId::of(&HeaderMap::new()).as_str(), fresh.as_str());
    }

    #[test]
    fn forwarded_for_appends_the_peer() {
        let v4: IpAddr = "203.0.113.9".parse().unwrap();
        let v6: IpAddr = "2001:db8::1".parse().unwrap();
        let mapped: IpAddr = "::ffff:10.0.0.255".parse().unwrap();
        let sent: HeaderValue = "1.2.3.4".parse().unwrap();
        assert_eq!(forwarded_for(None, v4), "203.0.113.9");
        assert_eq!(forwarded_for(Some(&sent), v4), "1.2.3.4, 203.0.113.9");
        assert_eq!(forwarded_for(Some(&sent), v6), "1.2.3.4, 2001:db8::1");
        assert_eq!(forwarded_for(None, mapped), "10.0.0.255");
        let blank: HeaderValue = "  ".parse().unwrap();
        assert_eq!(forwarded_for(Some(&blank), v4), "203.0.113.9");
        // The chain goes on as sent, bytes a client could not have meant as text included.
        let odd = HeaderValue::from_bytes(b"\xc3\xa9, , 1.2.3.4").unwrap();
        assert_eq!(
            forwarded_for(Some(&odd), v4).as_bytes(),
            b"\xc3\xa9, , 1.2.3.4, 203.0.113.9"
        );
        for ip in ["0.0.0.0", "9.10.99.100", "255.255.255.255", "127.0.0.1"] {
            let ip: IpAddr = ip.parse().unwrap();
            assert_eq!(forwarded_for(None, ip), ip.to_string().as_str());
        }
    }
}
