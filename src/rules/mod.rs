//! Rate-limit rules: which rules apply to a request, and the counter each one charges.
//!
//! Rules are checked in file order and every rule whose `match` fits applies. A rule keyed on
//! something the request does not have (no API key, no such header) does not apply; that is
//! counted so an operator can see a rule that never bites.
//!
//! A rule reads one value per header and query parameter, and the upstream may read another:
//! a request that repeats a header or parameter an applying rule matches or counts on is
//! refused ([`Ambiguous`]) rather than charged to one of its values.

use std::net::IpAddr;
use std::sync::Arc;

use http::{HeaderMap, HeaderName, Method};
use sha2::{Digest, Sha256};

pub use crate::limiter::policy::{FailureMode, Policy, Scope};
use crate::limiter::Check;
use crate::wire::auth::Identity;
use crate::wire::matching::RequestMatch;

pub mod key;

/// Longest key value (bytes) taken from the network; the rest is ignored. Values are hashed, so
/// this bounds hashing work, not storage.
pub const MAX_KEY_VALUE: usize = 1024;

/// One `[[rules]]`, validated: when it applies and what it counts on (this module), and how it
/// counts and answers (its [`Policy`], the limiter's).
#[derive(Debug)]
pub struct Rule {
    /// When the rule applies.
    pub matcher: RuleMatch,
    /// The key parts whose values name the counter a request charges, in order.
    pub key_parts: Vec<KeyPart>,
    /// `limit_from`: each request's limit from a token's claim, bounded.
    pub limit_from: Option<LimitFrom>,
    /// Name, limit, scope, failure mode and the rest the limiter reads.
    pub policy: Arc<Policy>,
}

/// A rule reads as its policy (`rule.name`, `rule.limit`, ...).
impl std::ops::Deref for Rule {
    type Target = Policy;

    fn deref(&self) -> &Policy {
        &self.policy
    }
}

/// A rule's `match`. Every field that is set must fit.
#[derive(Debug, Default)]
pub struct RuleMatch {
    /// Route name.
    pub route: Option<String>,
    /// Host, path, path prefix and methods, matched as routes match them.
    pub request: RequestMatch,
    /// The caller's plan.
    pub plan: Option<String>,
    /// A header, present (and equal to the value, if given).
    pub header: Option<(HeaderName, Option<String>)>,
    /// A verified token's claim, present (and equal to, or containing, a value).
    pub claim: Option<ClaimMatch>,
}

/// `limit_from = "claim:NAME"` with `limit_max`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitFrom {
    /// The claim holding the limit.
    pub claim: String,
    /// The most it may grant.
    pub max: u64,
}

impl LimitFrom {
    /// The limit a caller's claim grants, at most `max`; `None` when there is no such claim or
    /// it is not a whole number of at least 1 (the rule's own limit then applies).
    pub fn limit(&self, identity: Option<&Identity>) -> Option<u64> {
        let claims = &identity?.claims.as_deref()?.claims;
        let v = crate::jwt::claims::lookup(claims, &self.claim)?;
        let n = match v {
            serde_json::Value::Number(n) => n.as_u64()?,
            serde_json::Value::String(s) => s.trim().parse::<u64>().ok()?,
            _ => return None,
        };
        (n >= 1).then_some(n.min(self.max))
    }
}

/// `match.claim = { name = "scope", contains = "orders:write" }`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimMatch {
    /// The claim: a name or a path.
    pub name: String,
    /// What its value must be.
    pub test: ClaimTest,
}

/// What a claim's value must be for a rule to match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimTest {
    /// Present, whatever its value.
    Present,
    /// Equal to this (a string, or a number or boolean as written).
    Equals(String),
    /// An array holding this, or a space-separated string (`scope`) with this word.
    Contains(String),
}

impl ClaimMatch {
    /// Whether a caller's claims fit (no token: no claims, never).
    pub fn matches(&self, identity: Option<&Identity>) -> bool {
        let Some(claims) = identity.and_then(|i| i.claims.as_deref()) else {
            return false;
        };
        let Some(v) = crate::jwt::claims::lookup(&claims.claims, &self.name) else {
            return false;
        };
        match &self.test {
            ClaimTest::Present => true,
            ClaimTest::Equals(want) => crate::jwt::claims::equals(v, want),
            ClaimTest::Contains(item) => crate::jwt::claims::contains(v, item),
        }
    }
}

/// One key part: a value of the request that, with the others, names its counter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyPart {
    /// The client IP.
    Ip,
    /// The API key's id (never the secret).
    ApiKey,
    /// The key's user.
    User,
    /// The key's plan.
    Plan,
    /// The route name.
    Route,
    /// The method.
    Method,
    /// The path (without query).
    Path,
    /// A request header's value.
    Header(HeaderName),
    /// A query parameter's value.
    Query(String),
    /// A verified token's claim (a name or a path, [`crate::jwt::claims::lookup`]).
    Claim(String),
}

impl KeyPart {
    /// Parses a key part as written in gateway.toml.
    pub fn parse(text: &str) -> Result<KeyPart, String> {
        Ok(match text {
            "ip" => KeyPart::Ip,
            "api_key" => KeyPart::ApiKey,
            "user" => KeyPart::User,
            "plan" => KeyPart::Plan,
            "route" => KeyPart::Route,
            "method" => KeyPart::Method,
            "path" => KeyPart::Path,
            other => {
                if let Some(name) = other.strip_prefix("header:") {
                    let name = HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
                        format!("\"{other}\": \"{name}\" is not a valid header name")
                    })?;
                    KeyPart::Header(name)
                } else if let Some(name) = other.strip_prefix("query:") {
                    if name.is_empty() {
                        return Err(format!("\"{other}\" names no query parameter"));
                    }
                    KeyPart::Query(name.to_string())
                } else if let Some(name) = other.strip_prefix("claim:") {
                    if name.is_empty() {
                        return Err(format!("\"{other}\" names no claim"));
                    }
                    KeyPart::Claim(name.to_string())
                } else {
                    return Err(format!(
                        "unknown key part \"{other}\" (expected ip, api_key, user, plan, route, method, path, \"header:NAME\", \"query:NAME\" or \"claim:NAME\")"
                    ));
                }
            }
        })
    }

    /// The form written in gateway.toml.
    pub fn to_config_string(&self) -> String {
        match self {
            KeyPart::Ip => "ip".into(),
            KeyPart::ApiKey => "api_key".into(),
            KeyPart::User => "user".into(),
            KeyPart::Plan => "plan".into(),
            KeyPart::Route => "route".into(),
            KeyPart::Method => "method".into(),
            KeyPart::Path => "path".into(),
            KeyPart::Header(h) => format!("header:{h}"),
            KeyPart::Query(q) => format!("query:{q}"),
            KeyPart::Claim(c) => format!("claim:{c}"),
        }
    }
}

/// What rules see of a request.
#[derive(Debug, Clone, Copy)]
pub struct RequestView<'a> {
    /// The matched route's name.
    pub route: &'a str,
    /// Whether the matched route compares paths case-sensitively (`case_sensitive`): rules
    /// then match its requests' paths the same way.
    pub case_sensitive: bool,
    /// Method.
    pub method: &'a Method,
    /// Path without query.
    pub path: &'a str,
    /// Query string, if any.
    pub query: Option<&'a str>,
    /// Host (from the Host header or the URI authority).
    pub host: Option<&'a str>,
    /// Request headers.
    pub headers: &'a HeaderMap,
    /// Client IP (after trusted X-Forwarded-For).
    pub ip: IpAddr,
    /// The caller, when a valid key was presented.
    pub identity: Option<&'a Identity>,
}

/// Why a request cannot be charged to one counter: it repeats a header or query parameter that
/// a rule (or consistent hashing) reads, so floodgate would count one value while the upstream
/// may read the other (frameworks differ: first, last, or all joined). Answered 400.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Ambiguous {
    /// A header sent more than once.
    #[error("the header \"{0}\" is sent more than once, and requests are counted by it")]
    Header(HeaderName),
    /// A query parameter sent more than once (names compared decoded).
    #[error("the query parameter \"{0}\" is sent more than once, and requests are counted by it")]
    Query(String),
}

/// Refuses a request that repeats a header or query parameter named in `parts` (a rule's
/// `key`, or an upstream's `hash_key`).
pub fn single_valued(
    parts: &[KeyPart],
    headers: &HeaderMap,
    query: Option<&str>,
) -> Result<(), Ambiguous> {
    for part in parts {
        match part {
            KeyPart::Header(name) if headers.get_all(name).iter().nth(1).is_some() => {
                return Err(Ambiguous::Header(name.clone()));
            }
            KeyPart::Query(name)
                if query.is_some_and(|q| crate::wire::query::is_repeated(q, name)) =>
            {
                return Err(Ambiguous::Query(name.clone()));
            }
            _ => {}
        }
    }
    Ok(())
}

impl Rule {
    /// Whether the rule's `match` fits the request.
    pub fn matches(&self, req: &RequestView<'_>) -> bool {
        matches!(self.matching(req), Ok(true))
    }

    /// Whether the rule applies: its `match` fits and the values it reads are single. `Err`
    /// when the rest of the `match` fits but the header it matches on, or a header or query
    /// parameter of its `key`, is repeated.
    pub fn matching(&self, req: &RequestView<'_>) -> Result<bool, Ambiguous> {
        if !self.matches_request(req) {
            return Ok(false);
        }
        if let Some((name, value)) = &self.matcher.header {
            let mut sent = req.headers.get_all(name).iter();
            let first = sent.next();
            if sent.next().is_some() {
                return Err(Ambiguous::Header(name.clone()));
            }
            match (first, value) {
                (None, _) => return Ok(false),
                (Some(v), Some(want)) if v.as_bytes() != want.as_bytes() => return Ok(false),
                _ => {}
            }
        }
        single_valued(&self.key_parts, req.headers, req.query)?;
        Ok(true)
    }

    /// Every field of the `match` but `header`.
    fn matches_request(&self, req: &RequestView<'_>) -> bool {
        let m = &self.matcher;
        if let Some(route) = &m.route {
            if route != req.route {
                return false;
            }
        }
        if !m
            .request
            .matches_case(req.host, req.method, req.path, req.case_sensitive)
        {
            return false;
        }
        if let Some(plan) = &m.plan {
            if req.identity.and_then(|i| i.plan.as_deref()) != Some(plan.as_str()) {
                return false;
            }
        }
        if let Some(claim) = &m.claim {
            if !claim.matches(req.identity) {
                return false;
            }
        }
        true
    }

    /// The id of the counter this request charges (a digest of its key parts' values), or
    /// `None` when a key part is absent (the rule then does not apply). The digest covers every
    /// part with its kind and length, so values cannot be shifted from one part into another to
    /// reach someone else's counter. Values are read by [`key::read`] (trailing slash, decoding,
    /// cap and absence decided there once, for counters, hashing and labels alike). The
    /// rule's window is mixed in: a changed window is a fresh counter.
    pub fn counter_id(&self, req: &RequestView<'_>) -> Option<u64> {
        let mut h = Sha256::new();
        for part in &self.key_parts {
            let value = key::read(part, req)?;
            let value = value.as_bytes();
            h.update([part_tag(part)]);
            h.update((value.len() as u32).to_le_bytes());
            h.update(value);
        }
        // The window is part of the counter: a reload that changes it starts the rule's counts
        // over, for every algorithm and store alike (a count of 1 h windows means nothing in
        // 2 h ones); a changed limit, burst or cost keeps them.
        h.update([0xff]);
        h.update(self.limit.window().as_nanos().to_le_bytes());
        // A calendar rule's zone too: a day in Tokyo is not a day in New York. Only for
        // calendar rules, so every other rule keeps its counters' ids.
        if let Some(c) = self.limit.calendar() {
            h.update([0xfe]);
            h.update(c.period().as_str().as_bytes());
            h.update([0]);
            h.update(c.zone_name().as_bytes());
        }
        let digest = h.finalize();
        let mut first = [0u8; 8];
        first.copy_from_slice(&digest[..8]);
        Some(u64::from_le_bytes(first))
    }

    /// The policy this request is counted by: the rule's, or with `limit_from` a copy holding
    /// the caller's own limit (so that its check, its answer and its RateLimit fields all say
    /// that limit).
    pub fn policy_for(&self, req: &RequestView<'_>) -> Arc<Policy> {
        match self.limit_from.as_ref().and_then(|f| f.limit(req.identity)) {
            Some(n) if n != self.limit.limit() => {
                Arc::new(self.policy.with_limit(self.limit.with_limit(n)))
            }
            _ => self.policy.clone(),
        }
    }

    /// The store check for this request, or `None` when the rule cannot be keyed. Counts the
    /// skip.
    pub fn check_for(&self, req: &RequestView<'_>) -> Option<Check> {
        self.check_by(&self.policy, req)
    }

    /// [`Rule::check_for`] counted by `policy` (see [`Rule::policy_for`]).
    pub fn check_by(&self, policy: &Policy, req: &RequestView<'_>) -> Option<Check> {
        match self.counter_id(req) {
            Some(key) => Some(Check {
                rule: self.name.clone(),
                counter: key,
                limit: policy.limit.clone(),
                cost: self.cost,
            }),
            None => {
                self.counters.skipped.inc();
                None
            }
        }
    }
}

fn part_tag(part: &KeyPart) -> u8 {
    match part {
        KeyPart::Ip => 1,
        KeyPart::ApiKey => 2,
        KeyPart::User => 3,
        KeyPart::Plan => 4,
        KeyPart::Route => 5,
        KeyPart::Method => 6,
        KeyPart::Path => 7,
        KeyPart::Header(_) => 8,
        KeyPart::Query(_) => 9,
        KeyPart::Claim(_) => 10,
    }
}

/// The value of the first `name` parameter of a query string, as the `query:NAME` key part
/// reads it: name and value percent-decoded, `+` a space ([`crate::wire::query`]).
pub fn query_param<'q>(query: &'q str, name: &str) -> Option<crate::wire::query::QueryValue<'q>> {
    crate::wire::query::first(query, name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::{Algorithm, Limit};
    use std::time::Duration;

    fn rule(key: Vec<KeyPart>, matcher: RuleMatch) -> Rule {
        Rule {
            matcher,
            key_parts: key,
            limit_from: None,
            policy: Arc::new(Policy {
                counters: crate::metrics::RuleCounters::for_rule("unit-test-rule"),
                ..Policy::with_defaults(
                    "r",
                    Limit::police(Algorithm::FixedWindow, 1, Duration::from_secs(1), 1),
                    Scope::Local,
                )
            }),
        }
    }

    fn view<'a>(
        headers: &'a HeaderMap,
        query: Option<&'a str>,
        identity: Option<&'a Identity>,
    ) -> RequestView<'a> {
        RequestView {
            route: "orders",
            case_sensitive: true,
            method: &Method::GET,
            path: "/orders/1",
            query,
            host: Some("api.example.com"),
            headers,
            ip: "10.1.2.3".parse().unwrap(),
            identity,
        }
    }

    #[test]
    fn absent_key_part_skips_and_counts() {
        let h = HeaderMap::new();
        let r = rule(vec![KeyPart::ApiKey], RuleMatch::default());
        let before = r.counters.skipped.get();
        assert!(r.check_for(&view(&h, None, None)).is_none());
        assert!(r.counters.skipped.get() > before);
    }

    #[test]
    fn composite_keys_differ_by_each_part() {
        let h = HeaderMap::new();
        let r = rule(
            vec![KeyPart::Ip, KeyPart::Query("page".into())],
            RuleMatch::default(),
        );
        let a = r.counter_id(&view(&h, Some("page=1"), None)).unwrap();
        let b = r.counter_id(&view(&h, Some("page=2"), None)).unwrap();
        let a2 = r.counter_id(&view(&h, Some("x=9&page=1"), None)).unwrap();
        assert_ne!(a, b);
        assert_eq!(a, a2);
    }

    #[test]
    fn values_cannot_shift_between_parts() {
        let mut h1 = HeaderMap::new();
        h1.insert("a", "xy".parse().unwrap());
        h1.insert("b", "z".parse().unwrap());
        let mut h2 = HeaderMap::new();
        h2.insert("a", "x".parse().unwrap());
        h2.insert("b", "yz".parse().unwrap());
        let parts = vec![
            KeyPart::Header(HeaderName::from_static("a")),
            KeyPart::Header(HeaderName::from_static("b")),
        ];
        let r = rule(parts, RuleMatch::default());
        assert_ne!(
            r.counter_id(&view(&h1, None, None)),
            r.counter_id(&view(&h2, None, None))
        );
    }

    #[test]
    fn match_fields_all_apply() {
        let mut h = HeaderMap::new();
        h.insert("x-tier", "free".parse().unwrap());
        let m = RuleMatch {
            route: Some("orders".into()),
            request: RequestMatch {
                path_prefix: Some("/orders".into()),
                methods: Some(vec![Method::GET]),
                ..Default::default()
            },
            header: Some((HeaderName::from_static("x-tier"), Some("free".into()))),
            ..Default::default()
        };
        let r = rule(vec![KeyPart::Ip], m);
        assert!(r.matches(&view(&h, None, None)));
        let mut other = HeaderMap::new();
        other.insert("x-tier", "pro".parse().unwrap());
        assert!(!r.matches(&view(&other, None, None)));
        let plan_rule = rule(
            vec![KeyPart::Ip],
            RuleMatch {
                plan: Some("pro".into()),
                ..Default::default()
            },
        );
        assert!(!plan_rule.matches(&view(&h, None, None)));
    }

    #[test]
    fn query_param_takes_first_decoded_name() {
        let v = |q, n| query_param(q, n).map(|v| v.as_bytes().to_vec());
        assert_eq!(v("a=1&ab=2&a=3", "a"), Some(b"1".to_vec()));
        assert_eq!(v("ab=2", "a"), None);
        assert_eq!(v("flag&x=1", "flag"), Some(Vec::new()));
        assert_eq!(v("%61=%31", "a"), Some(b"1".to_vec()));
    }

    #[test]
    fn query_keys_count_the_decoded_value() {
        let h = HeaderMap::new();
        let r = rule(vec![KeyPart::Query("user".into())], RuleMatch::default());
        let id = |q| r.counter_id(&view(&h, Some(q), None)).unwrap();
        assert_eq!(id("user=alice"), id("user=%61lice"));
        assert_eq!(id("user=alice"), id("%75ser=alice"));
        assert_eq!(id("user=alice"), id("x=1;user=alice"));
        assert_eq!(id("user=a+b"), id("user=a%20b"));
        assert_ne!(id("user=alice"), id("user=bob"));
    }

    #[test]
    fn repeated_values_a_rule_reads_are_ambiguous() {
        let user = HeaderName::from_static("x-user");
        let keyed = rule(vec![KeyPart::Header(user.clone())], RuleMatch::default());
        let mut twice = HeaderMap::new();
        twice.append(&user, "alice".parse().unwrap());
        twice.append(&user, "bob".parse().unwrap());
        assert_eq!(
            keyed.matching(&view(&twice, None, None)),
            Err(Ambiguous::Header(user.clone()))
        );
        let mut once = HeaderMap::new();
        once.insert(&user, "alice".parse().unwrap());
        assert_eq!(keyed.matching(&view(&once, None, None)), Ok(true));

        let by_query = rule(vec![KeyPart::Query("user".into())], RuleMatch::default());
        for q in ["user=a&user=b", "user=a&%75ser=a", "user=a;user=b"] {
            assert_eq!(
                by_query.matching(&view(&once, Some(q), None)),
                Err(Ambiguous::Query("user".into())),
                "{q}"
            );
        }
        assert_eq!(
            by_query.matching(&view(&once, Some("user=a"), None)),
            Ok(true)
        );

        // A rule whose match reads a repeated header cannot tell whether it applies.
        let tier = HeaderName::from_static("x-tier");
        let matcher = RuleMatch {
            header: Some((tier.clone(), Some("free".into()))),
            ..Default::default()
        };
        let free = rule(vec![KeyPart::Ip], matcher);
        let mut tiers = HeaderMap::new();
        tiers.append(&tier, "pro".parse().unwrap());
        tiers.append(&tier, "free".parse().unwrap());
        assert_eq!(
            free.matching(&view(&tiers, None, None)),
            Err(Ambiguous::Header(tier.clone()))
        );
        // A rule that does not otherwise fit is not asked about its values.
        let elsewhere = rule(
            vec![KeyPart::Header(user.clone())],
            RuleMatch {
                route: Some("other".into()),
                ..Default::default()
            },
        );
        assert_eq!(elsewhere.matching(&view(&twice, None, None)), Ok(false));
    }
}
