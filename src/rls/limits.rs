//! The validated `[rls]` section: the listener and the limits, and which limit a request
//! descriptor falls under.
//!
//! A descriptor matches a limit when the request's domain is the limit's domain, its entries
//! have exactly the limit's keys in the same order, and every value the limit names is equal.
//! When several limits match (`{ key = "user" }` and `{ key = "user", value = "ci" }`), the
//! one naming more values wins, then the first in the file: a named exception must not be
//! shadowed by the general limit written above it (envoyproxy/ratelimit prefers the exact value
//! too).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::limiter::policy::Policy;

/// Most entries a limit's descriptor may have (Envoy's actions make one entry each); a request
/// descriptor with more is refused before matching (`super::bounds`).
pub const MAX_ENTRIES: usize = 16;

/// `[rls]`, validated.
#[derive(Debug)]
pub struct Settings {
    /// The gRPC listener (HTTP/2, cleartext unless `tls`).
    pub listen: SocketAddr,
    /// `[rls] threads`: the runtime threads the service answers on (default: `[server]
    /// threads`).
    pub threads: usize,
    /// `[rls] tls`: the certificate and key the listener serves TLS with.
    pub tls: Option<Tls>,
    /// The listener's caps and deadlines.
    pub serving: Serving,
    /// `[[rls.limits]]` in file order.
    pub limits: Vec<Arc<RlsLimit>>,
    /// Indexes into `limits`, most specific first (more fixed values, then file order).
    order: Vec<usize>,
}

/// What one client of the listener may hold: `[rls] max_connections`,
/// `max_connections_per_ip`, `header_timeout`, `request_timeout`, `idle_timeout`,
/// `max_streams` (the defaults are [`Serving::default`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Serving {
    /// Open connections at most (also bounded by the open-file budget:
    /// `crate::connection::set_open_file_limit`).
    pub max_connections: usize,
    /// Open connections at most from one IP.
    pub max_per_ip: usize,
    /// From accept: the TLS handshake and the 24-byte HTTP/2 preface.
    pub header_timeout: Duration,
    /// From a call's headers: its whole request message.
    pub request_timeout: Duration,
    /// A connection with no call open and no PING from the client this long is closed with
    /// GOAWAY.
    pub idle_timeout: Duration,
    /// Calls one connection may have open at once (HTTP/2 `MAX_CONCURRENT_STREAMS`).
    pub max_streams: u32,
}

impl Default for Serving {
    /// Envoy opens a few connections per worker thread and keeps them busy: 1,000 connections
    /// and 100 per IP leave room for many Envoys (and a NAT in front of a few dozen) while one
    /// client cannot take the port. 100 streams is the HTTP/2 RFC's advice and what Envoy and
    /// grpc-go clients work within; the 10 s deadlines are the proxy's `header_timeout`; an
    /// idle connection lasts 5 minutes (Envoy reconnects on its next call).
    fn default() -> Self {
        Serving {
            max_connections: 1000,
            max_per_ip: 100,
            header_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(300),
            max_streams: 100,
        }
    }
}

/// `[rls] tls = { cert, key }`: PEM files, as for `[server.tls]` (they exist: validation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tls {
    /// The PEM certificate chain.
    pub cert: PathBuf,
    /// The PEM private key.
    pub key: PathBuf,
}

/// One `[[rls.limits]]`.
#[derive(Debug)]
pub struct RlsLimit {
    /// The domain Envoy's filter names (`domain` of its `ratelimit` filter).
    pub domain: String,
    /// The descriptor entries, in order.
    pub entries: Vec<Entry>,
    /// How it counts and answers: the same policy a `[[rules]]` entry has.
    pub policy: Arc<Policy>,
}

/// One entry of a limit's descriptor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The entry's key (`descriptor_key` / `header_name` ... in Envoy's actions).
    pub key: String,
    /// The value it must have; `None`: each value is a counter of its own.
    pub value: Option<String>,
}

impl RlsLimit {
    /// How many entries name a value (the more, the more specific).
    fn fixed(&self) -> usize {
        self.entries.iter().filter(|e| e.value.is_some()).count()
    }

    /// Whether a request descriptor's entries (`(key, value)`, in order) fit this limit.
    pub fn fits<'a>(&self, mut entries: impl ExactSizeIterator<Item = (&'a str, &'a str)>) -> bool {
        if entries.len() != self.entries.len() {
            return false;
        }
        self.entries.iter().all(|want| match entries.next() {
            Some((key, value)) => {
                key == want.key && want.value.as_deref().is_none_or(|v| v == value)
            }
            None => false,
        })
    }
}

impl Settings {
    /// The settings for `limits` (validated: names unique, no two with the same descriptor),
    /// served on one thread without TLS until its `threads` and `tls` say otherwise.
    pub fn new(listen: SocketAddr, limits: Vec<Arc<RlsLimit>>) -> Settings {
        let mut order: Vec<usize> = (0..limits.len()).collect();
        // Stable: equally specific limits keep their file order.
        order.sort_by_key(|&i| std::cmp::Reverse(limits[i].fixed()));
        Settings {
            listen,
            threads: 1,
            tls: None,
            serving: Serving::default(),
            limits,
            order,
        }
    }

    /// The limit a descriptor of `domain` falls under, if any.
    pub fn limit_for<'a, I>(&self, domain: &str, entries: impl Fn() -> I) -> Option<&Arc<RlsLimit>>
    where
        I: ExactSizeIterator<Item = (&'a str, &'a str)>,
    {
        self.order
            .iter()
            .map(|&i| &self.limits[i])
            .find(|l| l.domain == domain && l.fits(entries()))
    }

    /// Whether any limit is of `domain` (descriptors of other domains are counted as one).
    pub fn knows_domain(&self, domain: &str) -> bool {
        self.limits.iter().any(|l| l.domain == domain)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::policy::Scope;
    use crate::limiter::{Algorithm, Limit};
    use std::time::Duration;

    fn limit(name: &str, domain: &str, entries: &[(&str, Option<&str>)]) -> Arc<RlsLimit> {
        Arc::new(RlsLimit {
            domain: domain.into(),
            entries: entries
                .iter()
                .map(|(k, v)| Entry {
                    key: (*k).into(),
                    value: v.map(str::to_string),
                })
                .collect(),
            policy: Arc::new(Policy {
                counters: crate::metrics::RuleCounters::for_rule("unit-test-rls"),
                ..Policy::with_defaults(
                    name,
                    Limit::police(Algorithm::FixedWindow, 1, Duration::from_secs(1), 1),
                    Scope::Local,
                )
            }),
        })
    }

    fn find<'s>(s: &'s Settings, domain: &str, entries: &[(&str, &str)]) -> Option<&'s str> {
        s.limit_for(domain, || entries.iter().map(|(k, v)| (*k, *v)))
            .map(|l| &*l.policy.name)
    }

    #[test]
    fn keys_must_be_the_same_in_the_same_order_and_named_values_equal() {
        let s = Settings::new(
            "127.0.0.1:1".parse().unwrap(),
            vec![limit(
                "per-user",
                "edge",
                &[("route", Some("orders")), ("user", None)],
            )],
        );
        let hit = Some("per-user");
        assert_eq!(find(&s, "edge", &[("route", "orders"), ("user", "a")]), hit);
        assert_eq!(find(&s, "edge", &[("route", "orders"), ("user", "")]), hit);
        assert_eq!(
            find(&s, "other", &[("route", "orders"), ("user", "a")]),
            None
        );
        assert_eq!(find(&s, "edge", &[("route", "users"), ("user", "a")]), None);
        assert_eq!(
            find(&s, "edge", &[("user", "a"), ("route", "orders")]),
            None
        );
        assert_eq!(find(&s, "edge", &[("route", "orders")]), None);
        let three = [("route", "orders"), ("user", "a"), ("x", "y")];
        assert_eq!(find(&s, "edge", &three), None);
        assert_eq!(
            find(&s, "edge", &[("Route", "orders"), ("user", "a")]),
            None
        );
    }

    #[test]
    fn the_limit_naming_more_values_wins_then_the_first() {
        let s = Settings::new(
            "127.0.0.1:1".parse().unwrap(),
            vec![
                limit("any-user", "edge", &[("user", None)]),
                limit("ci-user", "edge", &[("user", Some("ci"))]),
                limit("any-user-again", "edge", &[("user", None)]),
            ],
        );
        assert_eq!(find(&s, "edge", &[("user", "ci")]), Some("ci-user"));
        assert_eq!(find(&s, "edge", &[("user", "bob")]), Some("any-user"));
        assert!(s.knows_domain("edge") && !s.knows_domain("edge2"));
    }
}
