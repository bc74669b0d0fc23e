//! `[[rules]]`: the algorithm and its shape, the key, scope, cost, answer, leasing and match.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use http::HeaderName;

use super::source::Src;
use crate::config::schema::*;
use crate::config::*;
use crate::limiter::algorithm::{MAX_COUNT, MAX_WINDOW};
use crate::limiter::calendar::{Calendar, Period};
use crate::limiter::lease::{Lease, LeaseSize, DEFAULT_LEASE_TTL};
use crate::limiter::policy::MAX_WAITING_PER_RULE;
use crate::limiter::reservation::{CostFrom, Respond, StatusMatch, StatusSet};
use crate::limiter::{shaping_names, Algorithm, LeakyMode, Limit, Window};
use crate::rules::{FailureMode, KeyPart, Policy, Rule, RuleMatch, Scope};

/// The longest a shaping leaky bucket may hold a request (`max_delay`, and the default of
/// `window` is capped to it): every held request keeps its client's connection open.
pub const MAX_SHAPING_DELAY: Duration = Duration::from_secs(60);

/// `[[rules]]` in file order, each with its policy and the metric handles it will count on
/// (registered only when the config is put in force).
pub(super) fn rules(
    src: &Src,
    raw: &[RawRule],
    routes: &[Route],
) -> Result<Vec<Arc<Rule>>, ConfigError> {
    if let Some(over) = raw.get(crate::config::MAX_RULES) {
        return Err(src.err(
            over.name.span(),
            format!(
                "{} [[rules]]: at most {} (a limit per customer belongs in a plan and a rule keyed on it, not in a rule each)",
                raw.len(),
                crate::config::MAX_RULES
            ),
        ));
    }
    let route_names = crate::config::route_positions(routes);
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for r in raw {
        let name = r.name.get_ref();
        check_name(src, &r.name, "rule")?;
        if !seen.insert(name.clone()) {
            return Err(src.err(r.name.span(), format!("rule \"{name}\" is defined twice")));
        }
        let shape = shape(src, r, name)?;
        let key = key(src, r, name)?;
        if let Some(cap) = shape.algorithm().capabilities().limit_cap {
            if shape.limit() > cap.max {
                return Err(src.err(
                    r.limit.span(),
                    format!(
                        "rule \"{name}\": {}, so its limit is capped at {}; {}",
                        cap.why, cap.max, cap.instead
                    ),
                ));
            }
        }
        let charge = charge(src, r, name, &shape)?;
        let matcher = rule_match(src, r, name, &route_names)?;
        let respond = respond(src, r, name, &shape, &charge)?;
        let limit_from = limit_from(src, r, name, &shape)?;
        let limit = shape.blocking(respond.block_for.unwrap_or_default());
        let headers = r.headers.unwrap_or(true);
        out.push(Arc::new(Rule {
            matcher,
            key_parts: key,
            limit_from,
            policy: Arc::new(charge.policy(name, limit, respond, r.shadow, headers)),
        }));
    }
    Ok(out)
}

/// A rule's or an rls limit's (`what`) name: it is sent in headers, so non-empty and without
/// quotes, backslashes or control characters.
pub(super) fn check_name(
    src: &Src,
    name: &toml::Spanned<String>,
    what: &str,
) -> Result<(), ConfigError> {
    let text = name.get_ref();
    if text.is_empty()
        || text.contains('"')
        || text.contains('\\')
        || text.chars().any(char::is_control)
    {
        return Err(src.err(
            name.span(),
            format!("{what} name must be non-empty without quotes, backslashes or control characters (it is sent in headers)"),
        ));
    }
    Ok(())
}

/// `algorithm`, `limit`, `window`, `burst`, `mode`, `max_delay`, `calendar` and `slow_rate`,
/// each checked against the algorithm it applies to, as the limiter's [`Limit`] (not blocking
/// yet: `block_for` is read with the response keys, [`respond`]). The checks here name the
/// offending key; the [`Limit`]'s own guard is a backstop, placed at the rule's name.
pub(super) fn shape(src: &Src, r: &RawRule, name: &str) -> Result<Limit, ConfigError> {
    let algorithm = src.one_of(&r.algorithm, "algorithm", Algorithm::NAMES)?;
    let limit = src.positive(&r.limit, "limit")?;
    if limit > MAX_COUNT {
        return Err(src.err(
            r.limit.span(),
            format!("rule \"{name}\": limit is at most {MAX_COUNT} (10^15): the shared store counts exactly up to there"),
        ));
    }
    let calendar = calendar(src, r, name, algorithm)?;
    let window = window(src, r, name, algorithm, calendar.as_ref())?;
    let burst = burst(src, r, name, algorithm, limit)?;
    let mode = mode(src, r, name, algorithm)?;
    let max_delay = max_delay(src, r, name, mode, window)?;
    refill_bound(src, r, name, algorithm, (limit, window, burst))?;
    let slow_rate = slow_rate(src, r, name, mode)?;
    let built = Limit::new(algorithm, limit, window, burst, mode, max_delay).and_then(|l| {
        let l = match calendar {
            Some(c) => l.with_calendar(c)?,
            None => l,
        };
        match slow_rate {
            Some(rate) => l.slowed_to(rate),
            None => Ok(l),
        }
    });
    built.map_err(|e| src.err(r.name.span(), format!("rule \"{name}\": {e}")))
}

/// `window`: required, refused or replaced by `calendar` as the algorithm's capabilities say,
/// from 1ms to ten years (the longest the shared store times exactly).
fn window(
    src: &Src,
    r: &RawRule,
    name: &str,
    algorithm: Algorithm,
    calendar: Option<&Calendar>,
) -> Result<Duration, ConfigError> {
    match (&r.window, algorithm.capabilities().window) {
        (Some(w), _) if calendar.is_some() => Err(src.err(
            w.span(),
            format!("rule \"{name}\": calendar replaces window; give one of them"),
        )),
        (None, _) if calendar.is_some() => {
            Ok(calendar.map_or(Duration::ZERO, |c| c.period().longest()))
        }
        (Some(w), Window::None { why }) => Err(src.err(
            w.span(),
            format!("rule \"{name}\": {why} and takes no window"),
        )),
        (None, Window::None { .. }) => Ok(Duration::ZERO),
        (Some(w), Window::Required) => {
            let d = src.duration(w)?;
            if d < Duration::from_millis(1) {
                return Err(src.err(
                    w.span(),
                    format!("rule \"{name}\": window must be at least 1ms"),
                ));
            }
            if d > MAX_WINDOW {
                return Err(src.err(
                    w.span(),
                    format!("rule \"{name}\": window is at most 3650d (ten years): the shared store times exactly up to there"),
                ));
            }
            Ok(d)
        }
        (None, Window::Required) => Err(src.err(
            r.algorithm.span(),
            format!(
                "rule \"{name}\": {} needs a window, e.g. window = \"1m\"",
                algorithm.as_str()
            ),
        )),
    }
}

/// `burst`: for the buckets only, at most 10^15; the limit when not given.
fn burst(
    src: &Src,
    r: &RawRule,
    name: &str,
    algorithm: Algorithm,
    limit: u64,
) -> Result<u64, ConfigError> {
    match &r.burst {
        Some(b) if algorithm.capabilities().burst => {
            let burst = src.positive(b, "burst")?;
            if burst > MAX_COUNT {
                return Err(src.err(
                    b.span(),
                    format!("rule \"{name}\": burst is at most {MAX_COUNT} (10^15): the shared store counts exactly up to there"),
                ));
            }
            Ok(burst)
        }
        Some(b) => Err(src.err(
            b.span(),
            format!(
                "rule \"{name}\": burst applies to {} only",
                Algorithm::names_where(|c| c.burst)
            ),
        )),
        None => Ok(limit),
    }
}

/// `mode`: `"slow"` where the algorithm allows slowing, `"shape"` / `"police"` for the shaping
/// algorithms; police when not given.
fn mode(
    src: &Src,
    r: &RawRule,
    name: &str,
    algorithm: Algorithm,
) -> Result<LeakyMode, ConfigError> {
    let caps = algorithm.capabilities();
    match &r.mode {
        Some(m) if m.get_ref() == LeakyMode::Slow.as_str() => match caps.slow_refused {
            Some(why) => Err(src.err(
                m.span(),
                format!("rule \"{name}\": mode = \"slow\" is not allowed here: {why}"),
            )),
            None => Ok(LeakyMode::Slow),
        },
        Some(m) if caps.shaping.is_some() => src.one_of(m, "mode", LeakyMode::NAMES),
        Some(m) => Err(src.err(
            m.span(),
            format!("rule \"{name}\": mode applies to {} only", shaping_names()),
        )),
        None => Ok(LeakyMode::Police),
    }
}

/// `max_delay`: with `mode = "shape"` only, at most 60 s (a held request holds its
/// connection); the window (capped there) when not given.
fn max_delay(
    src: &Src,
    r: &RawRule,
    name: &str,
    mode: LeakyMode,
    window: Duration,
) -> Result<Duration, ConfigError> {
    match &r.max_delay {
        Some(d) if mode == LeakyMode::Shape => {
            let delay = src.duration(d)?;
            if delay > MAX_SHAPING_DELAY {
                return Err(src.err(
                    d.span(),
                    format!("rule \"{name}\": max_delay is at most 60s (a held request holds its connection); reject sooner, or police instead of shaping"),
                ));
            }
            Ok(delay)
        }
        Some(d) => Err(src.err(
            d.span(),
            format!(
                "rule \"{name}\": max_delay applies to {} with mode = \"shape\" only",
                shaping_names()
            ),
        )),
        None if mode == LeakyMode::Shape => Ok(window.min(MAX_SHAPING_DELAY)),
        None => Ok(Duration::ZERO),
    }
}

/// A bucket's burst × window / limit (how long an empty bucket takes to refill, so how long
/// its state spans) at most ten years, compared without rounding.
fn refill_bound(
    src: &Src,
    r: &RawRule,
    name: &str,
    algorithm: Algorithm,
    (limit, window, burst): (u64, Duration, u64),
) -> Result<(), ConfigError> {
    let refill_ns = u128::from(burst) * window.as_nanos();
    if algorithm.capabilities().burst && refill_ns > MAX_WINDOW.as_nanos() * u128::from(limit) {
        // Only a burst above the limit refills slower than the window.
        let span = r.burst.as_ref().map_or(r.limit.span(), |b| b.span());
        let days = refill_ns.div_ceil(u128::from(limit) * 86_400_000_000_000);
        return Err(src.err(
            span,
            format!("rule \"{name}\": an empty bucket would take {days} days to refill (burst × window / limit); at most 3650d (ten years), the longest the shared store times exactly"),
        ));
    }
    Ok(())
}

/// `calendar` and `timezone`: a period of an IANA zone, for the algorithms whose
/// capabilities allow it; a `timezone` alone is refused, as it would be silently ignored.
fn calendar(
    src: &Src,
    r: &RawRule,
    name: &str,
    algorithm: Algorithm,
) -> Result<Option<Calendar>, ConfigError> {
    let Some(c) = &r.calendar else {
        return match &r.timezone {
            Some(tz) => Err(src.err(
                tz.span(),
                format!("rule \"{name}\": timezone applies to calendar rules only (calendar = \"day\", \"week\" or \"month\")"),
            )),
            None => Ok(None),
        };
    };
    if !algorithm.capabilities().calendar {
        return Err(src.err(
            c.span(),
            format!(
                "rule \"{name}\": calendar applies to {} only",
                Algorithm::names_where(|caps| caps.calendar)
            ),
        ));
    }
    let period = src.one_of(c, "calendar", Period::NAMES)?;
    let zone = r
        .timezone
        .as_ref()
        .map_or("UTC", |tz| tz.get_ref().as_str());
    Calendar::new(period, zone).map(Some).map_err(|e| {
        let span = r.timezone.as_ref().map_or(c.span(), |tz| tz.span());
        src.err(span, format!("rule \"{name}\": {e}"))
    })
}

/// `slow_rate`: required with `mode = "slow"` (which `shape` accepted only for an algorithm
/// that can slow), refused without it.
fn slow_rate(
    src: &Src,
    r: &RawRule,
    name: &str,
    mode: LeakyMode,
) -> Result<Option<u64>, ConfigError> {
    match (&r.slow_rate, mode) {
        (Some(rate), LeakyMode::Slow) => crate::text::rate::parse_rate(rate.get_ref())
            .map(Some)
            .map_err(|e| src.err(rate.span(), format!("rule \"{name}\": {e}"))),
        (Some(rate), _) => Err(src.err(
            rate.span(),
            format!("rule \"{name}\": slow_rate applies only with mode = \"slow\""),
        )),
        (None, LeakyMode::Slow) => {
            let span = r.mode.as_ref().map_or(r.name.span(), |m| m.span());
            Err(src.err(
                span,
                format!("rule \"{name}\": mode = \"slow\" needs a slow_rate, e.g. slow_rate = \"64KiB\" (bytes per second of a slowed request)"),
            ))
        }
        (None, _) => Ok(None),
    }
}

/// `key`: the request parts a counter is per, at least one.
fn key(src: &Src, r: &RawRule, name: &str) -> Result<Vec<KeyPart>, ConfigError> {
    let key = r
        .key
        .get_ref()
        .iter()
        .map(|k| KeyPart::parse(k.get_ref()).map_err(|m| src.err(k.span(), m)))
        .collect::<Result<Vec<_>, _>>()?;
    if key.is_empty() {
        return Err(src.err(
            r.key.span(),
            format!("rule \"{name}\": key needs at least one part, e.g. [\"ip\"]"),
        ));
    }
    Ok(key)
}

/// How a rule charges and answers: where it counts, what a store error does, what a request
/// costs, the status it refuses with, its quota lease and how many requests it may hold.
pub(super) struct Charge {
    pub(super) scope: Scope,
    pub(super) on_store_error: FailureMode,
    pub(super) cost: u64,
    pub(super) status: u16,
    pub(super) lease: Option<Lease>,
    pub(super) max_waiting: usize,
}

impl Charge {
    /// The policy of the rule or rls limit `name`: it counts by `limit` as charged here and
    /// learns `respond` from the response.
    pub(super) fn policy(
        self,
        name: &str,
        limit: Limit,
        respond: Respond,
        shadow: bool,
        headers: bool,
    ) -> Policy {
        Policy {
            name: name.into(),
            limit,
            scope: self.scope,
            on_store_error: self.on_store_error,
            cost: self.cost,
            shadow,
            headers,
            status: self.status,
            counters: crate::metrics::RuleCounters::for_rule(name),
            lease: self.lease,
            max_waiting: self.max_waiting,
            respond,
        }
    }
}

/// `scope`, `on_store_error`, `cost` (never more than the rule can admit at once), `status`,
/// `lease` / `lease_ttl` and `max_waiting`.
pub(super) fn charge(
    src: &Src,
    r: &RawRule,
    name: &str,
    shape: &Limit,
) -> Result<Charge, ConfigError> {
    let scope = match &r.scope {
        Some(s) => src.one_of(s, "scope", Scope::NAMES)?,
        None => Scope::Global,
    };
    let on_store_error = match &r.on_store_error {
        Some(s) => src.one_of(s, "on_store_error", FailureMode::NAMES)?,
        None => FailureMode::Open,
    };
    let cost = match &r.cost {
        Some(c) => src.positive(c, "cost")?,
        None => 1,
    };
    let capacity = shape
        .algorithm()
        .capabilities()
        .capacity(shape.limit(), shape.burst());
    if cost > capacity {
        let span = r.cost.as_ref().map_or(r.limit.span(), |c| c.span());
        return Err(src.err(
            span,
            format!("rule \"{name}\": cost {cost} is more than the rule can ever admit at once ({capacity}), so every request would be rejected"),
        ));
    }
    let status = match &r.status {
        Some(s) if (400..=599).contains(s.get_ref()) => *s.get_ref() as u16,
        Some(s) => {
            return Err(src.err(
                s.span(),
                format!("rule \"{name}\": status must be between 400 and 599"),
            ))
        }
        None => 429,
    };
    let lease = rule_lease(src, r, name, shape.algorithm(), shape.mode(), scope, cost)?;
    // `shape` accepted mode = "shape" only for an algorithm that can shape.
    let max_waiting = match &r.max_waiting {
        Some(m) if shape.mode() == LeakyMode::Shape => src.positive(m, "max_waiting")? as usize,
        Some(m) => {
            let names = shaping_names();
            let why = format!("max_waiting applies to {names} with mode = \"shape\" only");
            return Err(src.err(m.span(), format!("rule \"{name}\": {why}")));
        }
        None => MAX_WAITING_PER_RULE,
    };
    Ok(Charge {
        scope,
        on_store_error,
        cost,
        status,
        lease,
        max_waiting,
    })
}

/// `match`: the route it names (which must exist), the request's host, path and methods,
/// the plan, a header.
fn rule_match(
    src: &Src,
    r: &RawRule,
    name: &str,
    routes: &std::collections::HashMap<&str, usize>,
) -> Result<RuleMatch, ConfigError> {
    let m = &r.matcher;
    if let Some(route) = &m.route {
        if !routes.contains_key(route.get_ref().as_str()) {
            return Err(src.err(
                route.span(),
                format!(
                    "rule \"{name}\" matches route \"{}\", which is not defined",
                    route.get_ref()
                ),
            ));
        }
    }
    let header = match &m.header {
        Some(h) => {
            let hm = h.get_ref();
            let hn = HeaderName::from_bytes(hm.name.get_ref().as_bytes()).map_err(|_| {
                src.err(
                    hm.name.span(),
                    format!("\"{}\" is not a valid header name", hm.name.get_ref()),
                )
            })?;
            Some((hn, hm.value.clone()))
        }
        None => None,
    };
    Ok(RuleMatch {
        route: m.route.as_ref().map(|r| r.get_ref().clone()),
        request: RequestMatch {
            path: src.path(&m.path)?,
            path_prefix: src.path(&m.path_prefix)?,
            methods: m.methods.as_deref().map(|l| src.methods(l)).transpose()?,
            host: src.host(&m.host)?,
        },
        plan: m.plan.clone(),
        header,
        claim: m.claim.as_ref().map(|c| claim_match(src, c)).transpose()?,
    })
}

/// `limit_from` and `limit_max`: a claim and the most it may grant, together; not with a
/// lease (a lease hands out permits of one limit for every caller).
fn limit_from(
    src: &Src,
    r: &RawRule,
    name: &str,
    shape: &crate::limiter::Limit,
) -> Result<Option<crate::rules::LimitFrom>, ConfigError> {
    let (from, max) = match (&r.limit_from, &r.limit_max) {
        (None, None) => return Ok(None),
        (Some(f), None) => {
            return Err(src.err(
                f.span(),
                format!("rule \"{name}\": limit_from needs limit_max, the most a claim may grant"),
            ))
        }
        (None, Some(m)) => {
            return Err(src.err(
                m.span(),
                format!("rule \"{name}\": limit_max applies only with limit_from"),
            ))
        }
        (Some(f), Some(m)) => (f, m),
    };
    let Some(claim) = from
        .get_ref()
        .strip_prefix("claim:")
        .filter(|c| !c.is_empty())
    else {
        return Err(src.err(
            from.span(),
            format!("rule \"{name}\": limit_from must be \"claim:NAME\""),
        ));
    };
    if r.lease.is_some() {
        return Err(src.err(
            from.span(),
            format!("rule \"{name}\": limit_from cannot be used with lease"),
        ));
    }
    let max = src.positive(max, "limit_max")?;
    if max > 1_000_000_000 {
        return Err(src.err(
            r.limit_max.as_ref().map_or(from.span(), |m| m.span()),
            "limit_max must be at most 1000000000",
        ));
    }
    if let Some(cap) = shape.algorithm().capabilities().limit_cap {
        if max > cap.max {
            return Err(src.err(
                r.limit_max.as_ref().map_or(from.span(), |m| m.span()),
                format!(
                    "rule \"{name}\": {}, so limit_max is capped at {}",
                    cap.why, cap.max
                ),
            ));
        }
    }
    Ok(Some(crate::rules::LimitFrom {
        claim: claim.to_string(),
        max,
    }))
}

/// `match.claim`: a name and at most one of `equals` and `contains`.
fn claim_match(
    src: &Src,
    c: &toml::Spanned<RawClaimMatch>,
) -> Result<crate::rules::ClaimMatch, ConfigError> {
    use crate::rules::{ClaimMatch, ClaimTest};
    let raw = c.get_ref();
    if raw.name.get_ref().is_empty() {
        return Err(src.err(raw.name.span(), "match.claim needs a claim name"));
    }
    let test = match (&raw.equals, &raw.contains) {
        (Some(_), Some(_)) => {
            return Err(src.err(c.span(), "match.claim takes equals or contains, not both"))
        }
        (Some(v), None) => ClaimTest::Equals(v.clone()),
        (None, Some(v)) => ClaimTest::Contains(v.clone()),
        (None, None) => ClaimTest::Present,
    };
    Ok(ClaimMatch {
        name: raw.name.get_ref().clone(),
        test,
    })
}

/// A rule's `lease` and `lease_ttl`: only for global rules of the algorithms whose state a
/// lease can count (see `crate::limiter::Capabilities::lease_refused`), with the reason
/// otherwise.
fn rule_lease(
    src: &Src,
    r: &RawRule,
    name: &str,
    algorithm: Algorithm,
    mode: LeakyMode,
    scope: Scope,
    cost: u64,
) -> Result<Option<Lease>, ConfigError> {
    let Some(raw) = &r.lease else {
        if let Some(ttl) = &r.lease_ttl {
            return Err(src.err(
                ttl.span(),
                format!("rule \"{name}\": lease_ttl applies only with lease"),
            ));
        }
        return Ok(None);
    };
    let span = raw.span();
    let size = match raw.get_ref() {
        RawLease::Name(n) if n == "auto" => LeaseSize::Auto,
        RawLease::Permits(n) if *n >= 1 => {
            let n = *n as u64;
            if n < cost {
                return Err(src.err(
                    span,
                    format!("rule \"{name}\": lease {n} is less than the rule's cost {cost}; a lease must hold at least one request"),
                ));
            }
            LeaseSize::Permits(n)
        }
        _ => {
            return Err(src.err(
                span,
                format!("rule \"{name}\": lease must be \"auto\" or a whole number of permits of at least 1"),
            ))
        }
    };
    if let Some(why) = algorithm.capabilities().lease_refused(mode) {
        return Err(src.err(
            span,
            format!("rule \"{name}\": lease is not allowed here: {why}"),
        ));
    }
    if scope == Scope::Local {
        return Err(src.err(
            span,
            format!("rule \"{name}\": lease applies to global rules only (a local rule never calls the store)"),
        ));
    }
    let ttl = match &r.lease_ttl {
        Some(t) => {
            let ttl = src.duration(t)?;
            if ttl < Duration::from_millis(10) {
                return Err(src.err(
                    t.span(),
                    format!("rule \"{name}\": lease_ttl must be at least 10ms"),
                ));
            }
            ttl
        }
        None => DEFAULT_LEASE_TTL,
    };
    Ok(Some(Lease { size, ttl }))
}

/// What a rule learns from the response: `count` (the statuses it charges) and `block_for`,
/// for the algorithms whose charge can be trued up (see
/// `crate::limiter::Capabilities::settle_refused`), never shaping or leased (a leased permit
/// is spent in process, where neither a refund nor a block reaches the store).
pub(super) fn respond(
    src: &Src,
    r: &RawRule,
    name: &str,
    shape: &Limit,
    charge: &Charge,
) -> Result<Respond, ConfigError> {
    let mut out = Respond::default();
    let spans = [
        r.count.as_ref().map(|c| ("count", c.span())),
        r.cost_from.as_ref().map(|c| ("cost_from", c.span())),
        r.block_for.as_ref().map(|b| ("block_for", b.span())),
    ];
    for (key, span) in spans.into_iter().flatten() {
        let refused = if let Some(why) = shape.algorithm().capabilities().settle_refused {
            Some(why.to_string())
        } else if shape.mode() == LeakyMode::Shape {
            Some("a shaping leaky bucket holds requests in a queue whose departure slots a response cannot give back; use mode = \"police\"".into())
        } else if shape.mode() == LeakyMode::Slow {
            Some("mode = \"slow\" admits, slowed, what it would reject, and response-aware limits are not combined with it; use mode = \"police\"".into())
        } else if charge.lease.is_some() && key == "block_for" {
            Some("lease spends permits in process, where a block kept in the shared store is not seen (a permit leased before the block would still be spent); remove lease".into())
        } else {
            None
        };
        if let Some(why) = refused {
            return Err(src.err(
                span,
                format!("rule \"{name}\": {key} is not allowed here: {why}"),
            ));
        }
    }
    if let Some(count) = &r.count {
        let list = &count.get_ref().status;
        if list.get_ref().is_empty() {
            return Err(src.err(
                list.span(),
                format!(
                    "rule \"{name}\": count.status needs at least one status, e.g. [401, \"5xx\"]"
                ),
            ));
        }
        let mut entries = Vec::new();
        for entry in list.get_ref() {
            let parsed = match entry.get_ref() {
                RawStatus::Code(c) if (100..=599).contains(c) => Some(StatusMatch::Code(*c as u16)),
                RawStatus::Code(_) => None,
                RawStatus::Class(c) => StatusMatch::parse_class(c),
            };
            let Some(parsed) = parsed else {
                return Err(src.err(
                    entry.span(),
                    format!("rule \"{name}\": count.status entries are status codes (100 to 599) or classes (\"1xx\" to \"5xx\")"),
                ));
            };
            entries.push(parsed);
        }
        out.count = Some(StatusSet::new(entries));
    }
    if let Some(c) = &r.cost_from {
        if r.count.is_some() {
            return Err(src.err(
                c.span(),
                format!("rule \"{name}\": cost_from and count cannot be combined: count charges a response 1 or 0, cost_from its true cost"),
            ));
        }
        let from = CostFrom::parse(c.get_ref())
            .map_err(|e| src.err(c.span(), format!("rule \"{name}\": {e}")))?;
        out.cost_from = Some(from);
    }
    if let Some(b) = &r.block_for {
        let d = src.duration(b)?;
        if d < Duration::from_millis(1) || d > MAX_WINDOW {
            return Err(src.err(
                b.span(),
                format!("rule \"{name}\": block_for must be between 1ms and 3650d"),
            ));
        }
        out.block_for = Some(d);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    /// Every invalid `[[rules]]` fixture fails with the error, line and column it names.
    #[test]
    fn every_invalid_fixture_fails_as_it_says() {
        super::super::fixtures::check_section("rules");
    }
}
