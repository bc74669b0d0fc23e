//! `allow_ips` / `deny_ips`: sets of networks a client address is looked up in, at a cost that
//! does not grow with the list.
//!
//! The networks are turned into address ranges once, when the config is loaded: sorted, with
//! overlapping and adjacent ranges merged, one table per address family. A lookup is then a
//! binary search: 100,000 CIDRs are 17 comparisons, 10 are 4, and nothing is allocated.

use std::net::IpAddr;

use ipnet::IpNet;

/// The most networks one list may hold: far above any real list (a country's whole allocation
/// is a few thousand prefixes), low enough that a careless config cannot make a reload hold
/// gigabytes.
pub const MAX_NETWORKS: usize = 1_000_000;

/// A set of networks, IPv4 and IPv6, as merged ranges.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IpSet {
    v4: Vec<(u32, u32)>,
    v6: Vec<(u128, u128)>,
    /// How many networks the config listed (before merging), for `check` and `/stats`.
    listed: usize,
}

impl IpSet {
    /// The set of `nets`. An IPv4-mapped IPv6 network (`::ffff:10.0.0.0/104`) is the IPv4
    /// network it maps: client addresses are looked up in their canonical form, so a mapped
    /// network would otherwise never match.
    pub fn new(nets: impl IntoIterator<Item = IpNet>) -> IpSet {
        let mut v4 = Vec::new();
        let mut v6 = Vec::new();
        let mut listed = 0;
        for net in nets {
            listed += 1;
            match canonical_net(net) {
                IpNet::V4(n) => v4.push((u32::from(n.network()), u32::from(n.broadcast()))),
                IpNet::V6(n) => v6.push((u128::from(n.network()), u128::from(n.broadcast()))),
            }
        }
        IpSet {
            v4: merged(v4),
            v6: merged(v6),
            listed,
        }
    }

    /// Whether `ip` (read in its canonical form: `::ffff:1.2.3.4` is `1.2.3.4`) is in a
    /// network of the set.
    pub fn contains(&self, ip: IpAddr) -> bool {
        match ip.to_canonical() {
            IpAddr::V4(a) => within(&self.v4, u32::from(a)),
            IpAddr::V6(a) => within(&self.v6, u128::from(a)),
        }
    }

    /// How many networks the config listed.
    pub fn listed(&self) -> usize {
        self.listed
    }

    /// Whether the config listed none.
    pub fn is_empty(&self) -> bool {
        self.listed == 0
    }
}

/// A route's (or `[server]`'s) `allow_ips` and `deny_ips`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IpRules {
    /// When set, only these networks are let in.
    pub allow: Option<IpSet>,
    /// These networks are refused, also when `allow` lists them.
    pub deny: Option<IpSet>,
}

impl IpRules {
    /// Whether a client at `ip` is let in: not denied, and allowed when an allow list exists.
    pub fn admits(&self, ip: IpAddr) -> bool {
        if self.deny.as_ref().is_some_and(|d| d.contains(ip)) {
            return false;
        }
        self.allow.as_ref().is_none_or(|a| a.contains(ip))
    }

    /// Whether neither list is set (nothing to look up).
    pub fn is_empty(&self) -> bool {
        self.allow.is_none() && self.deny.is_none()
    }
}

/// Parses one list entry: a CIDR (`10.0.0.0/8`, `2001:db8::/32`) or a single address.
/// A CIDR with host bits set (`10.0.0.1/8`) is refused: it is more often a typo than meant.
pub fn parse_network(text: &str) -> Result<IpNet, String> {
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Ok(IpNet::from(ip));
    }
    let net = text
        .parse::<IpNet>()
        .map_err(|_| format!("\"{text}\" is not a CIDR like \"10.0.0.0/8\" or an IP address"))?;
    if net.trunc() != net {
        return Err(format!(
            "\"{text}\" has bits set past its prefix length: write \"{}\"",
            net.trunc()
        ));
    }
    Ok(net)
}

/// `net`, with an IPv4-mapped IPv6 network as the IPv4 network it maps.
fn canonical_net(net: IpNet) -> IpNet {
    if let IpNet::V6(n) = net {
        if n.prefix_len() >= 96 {
            if let Some(v4) = n.network().to_ipv4_mapped() {
                if let Ok(mapped) = ipnet::Ipv4Net::new(v4, n.prefix_len() - 96) {
                    return IpNet::V4(mapped);
                }
            }
        }
    }
    net
}

/// `ranges` sorted by start, with overlapping or adjacent ranges joined.
fn merged<T: Copy + Ord + num_like::Successor>(mut ranges: Vec<(T, T)>) -> Vec<(T, T)> {
    ranges.sort_unstable();
    let mut out: Vec<(T, T)> = Vec::with_capacity(ranges.len());
    for (start, end) in ranges {
        match out.last_mut() {
            Some(last) if last.1.succ().is_none_or(|next| start <= next) => {
                last.1 = last.1.max(end);
            }
            _ => out.push((start, end)),
        }
    }
    out.shrink_to_fit();
    out
}

/// Whether `x` is in one of `ranges` (sorted, disjoint).
fn within<T: Copy + Ord>(ranges: &[(T, T)], x: T) -> bool {
    // The first range starting after `x`; the one before it is the only candidate.
    let after = ranges.partition_point(|(start, _)| *start <= x);
    after > 0 && x <= ranges[after - 1].1
}

mod num_like {
    /// The next integer, if any: two ranges that touch are merged.
    pub trait Successor: Sized {
        fn succ(self) -> Option<Self>;
    }
    impl Successor for u32 {
        fn succ(self) -> Option<u32> {
            self.checked_add(1)
        }
    }
    impl Successor for u128 {
        fn succ(self) -> Option<u128> {
            self.checked_add(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(list: &[&str]) -> IpSet {
        IpSet::new(list.iter().map(|t| parse_network(t).unwrap()))
    }

    fn ip(t: &str) -> IpAddr {
        t.parse().unwrap()
    }

    #[test]
    fn networks_and_single_addresses_match_their_members_only() {
        let s = set(&["10.0.0.0/8", "192.0.2.7", "2001:db8::/32"]);
        assert!(s.contains(ip("10.255.0.1")));
        assert!(s.contains(ip("192.0.2.7")));
        assert!(!s.contains(ip("192.0.2.8")));
        assert!(!s.contains(ip("11.0.0.0")));
        assert!(s.contains(ip("2001:db8:ffff::1")));
        assert!(!s.contains(ip("2001:db9::1")));
        assert!(
            s.contains(ip("::ffff:10.1.2.3")),
            "a mapped client is its IPv4 address"
        );
        assert_eq!(s.listed(), 3);
    }

    #[test]
    fn mapped_networks_are_ipv4_networks() {
        let s = set(&["::ffff:198.51.100.0/120"]);
        assert!(s.contains(ip("198.51.100.9")));
        assert!(!s.contains(ip("198.51.101.9")));
    }

    #[test]
    fn overlapping_and_adjacent_ranges_merge_and_still_match() {
        let s = set(&["10.0.0.0/24", "10.0.1.0/24", "10.0.0.128/25", "0.0.0.0/0"]);
        assert_eq!(s.v4, vec![(0, u32::MAX)]);
        assert!(s.contains(ip("255.255.255.255")));
        let s = set(&["10.0.0.0/24", "10.0.1.0/24", "10.0.3.0/24"]);
        assert_eq!(s.v4.len(), 2);
        assert!(s.contains(ip("10.0.1.255")));
        assert!(!s.contains(ip("10.0.2.0")));
        assert!(s.contains(ip("10.0.3.0")));
        let all6 = set(&["::/0"]);
        assert!(all6.contains(ip("ffff::1")));
        assert!(!all6.contains(ip("1.2.3.4")), "IPv4 is another table");
    }

    #[test]
    fn the_lookup_agrees_with_a_linear_scan_on_random_lists() {
        // A small xorshift: deterministic, no dependency.
        let mut state = 0x9E37_79B9_7F4A_7C15_u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for _ in 0..200 {
            let nets: Vec<IpNet> = (0..(next() % 40))
                .map(|_| {
                    let a = std::net::Ipv4Addr::from((next() as u32) & 0xFFFF_0000 | 0x0A00_0000);
                    ipnet::Ipv4Net::new(a, 8 + (next() % 25) as u8)
                        .unwrap()
                        .trunc()
                        .into()
                })
                .collect();
            let s = IpSet::new(nets.clone());
            for _ in 0..200 {
                let probe = IpAddr::from(std::net::Ipv4Addr::from(
                    (next() as u32) & 0x0FFF_FFFF | 0x0A00_0000,
                ));
                let linear = nets.iter().any(|n| n.contains(&probe));
                assert_eq!(s.contains(probe), linear, "{probe} in {nets:?}");
            }
        }
    }

    #[test]
    fn deny_wins_over_allow() {
        let rules = IpRules {
            allow: Some(set(&["10.0.0.0/8"])),
            deny: Some(set(&["10.9.0.0/16"])),
        };
        assert!(rules.admits(ip("10.1.0.1")));
        assert!(!rules.admits(ip("10.9.0.1")));
        assert!(!rules.admits(ip("192.0.2.1")), "not in the allow list");
        let deny_only = IpRules {
            allow: None,
            deny: Some(set(&["192.0.2.0/24"])),
        };
        assert!(deny_only.admits(ip("198.51.100.1")));
        assert!(!deny_only.admits(ip("192.0.2.200")));
    }

    #[test]
    fn entries_parse_or_say_why_not() {
        assert!(parse_network("10.0.0.0/8").is_ok());
        assert!(parse_network("2001:db8::1").is_ok());
        let e = parse_network("10.0.0.1/8").unwrap_err();
        assert!(e.contains("10.0.0.0/8"), "{e}");
        let e = parse_network("10.0.0.0/33").unwrap_err();
        assert!(e.contains("not a CIDR"), "{e}");
        assert!(parse_network("example.com").is_err());
    }
}
