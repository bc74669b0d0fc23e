//! Who the client is at the network level: its IP (believing `X-Forwarded-For` only from
//! trusted proxies) and the request id that follows the request through logs and upstreams.

use std::net::IpAddr;

use http::HeaderMap;
use ipnet::IpNet;

/// The client IP. The peer address is the truth unless the peer is a trusted proxy; then
/// `X-Forwarded-For` is read from the right, skipping trusted hops, and the first address that
/// is not trusted is the client (everything left of it could have been written by the client).
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
    for value in headers.get_all("x-forwarded-for").iter().rev() {
        let Ok(text) = value.to_str() else {
            return client;
        };
        for hop in text.rsplit(',') {
            let Some(ip) = parse_hop(hop) else {
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

/// One X-Forwarded-For element: an IP, possibly with a port or IPv6 brackets.
fn parse_hop(hop: &str) -> Option<IpAddr> {
    parse_hop_as_written(hop).map(|ip| ip.to_canonical())
}

fn parse_hop_as_written(hop: &str) -> Option<IpAddr> {
    let hop = hop.trim();
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

/// The client's `X-Request-Id` if it is sane (short, visible ASCII without separators that
/// could break log lines), else a fresh random one.
pub fn request_id(headers: &HeaderMap) -> String {
    if let Some(v) = headers.get("x-request-id") {
        let b = v.as_bytes();
        if !b.is_empty()
            && b.len() <= MAX_REQUEST_ID
            && b.iter()
                .all(|c| c.is_ascii_alphanumeric() || b"-_.:".contains(c))
        {
            // Checked to be ASCII above.
            return String::from_utf8_lossy(b).into_owned();
        }
    }
    new_request_id()
}

/// A random 128-bit id in hex.
pub fn new_request_id() -> String {
    let mut id = String::with_capacity(32);
    crate::text::push_hex16(&mut id, fastrand::u64(..));
    crate::text::push_hex16(&mut id, fastrand::u64(..));
    id
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
        assert_eq!(request_id(&h), "abc-123");
        h.insert("x-request-id", "bad id with spaces".parse().unwrap());
        let generated = request_id(&h);
        assert_eq!(generated.len(), 32);
    }
}
