//! The decision a request gets, as one function of (config, request parts, limiter) that needs
//! no Pingora session: route, identity, rules, and either "forward, with these changes" or
//! "answer with this problem". `crate::request::proxy` only does the I/O around it.
//!
//! In order: spellings that an upstream could read as another request are refused (a method
//! that is not upper case, a target that is not UTF-8, a repeated `Content-Length`,
//! underscored header names in `reject` mode: 400), the host and path are normalized
//! (`crate::wire::normalize`; malformed ones are 400), the first matching route is picked (none:
//! 404), a repeated header or query parameter its consistent hashing reads is 400, the API key
//! is checked as the route asks (401), every matching rule is charged in one limiter call (a
//! repeated value an applying rule reads: 400, unless the rule is a shadow rule, which then
//! does not count the request), and the verdict becomes a forward (with the
//! RateLimit fields and any shaping delay) or a 429/503 answer.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::{HeaderMap, Method, Uri};

use crate::config::{AuthMode, Config, Route};
use crate::limiter::engine::{Limiter, Slots, Verdict};
use crate::limiter::Check;
use crate::metrics::metrics;
use crate::rules::{single_valued, Policy, RequestView};
use crate::wire::auth::{presented_key, Identity};
use crate::wire::client::client_ip;
use crate::wire::response::{whole_seconds_at_least_one, Answer, Problem, RateLimitHeaders};

/// What admission reads of a request.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// The method.
    pub method: &'a Method,
    /// The target as parsed (for HTTP/1.1 absolute-form, Pingora keeps only its path here).
    pub uri: &'a Uri,
    /// The target's bytes as the client sent them.
    pub raw_target: &'a [u8],
    /// The request headers.
    pub headers: &'a HeaderMap,
    /// The peer address of the connection.
    pub peer: IpAddr,
    /// The request id (quoted in every answer's body).
    pub request_id: &'a str,
    /// The request is traced: admission records its decision for the trace
    /// ([`Admission::decision`]).
    pub traced: bool,
}

/// What to do with a request, and what the proxy needs to know to do it.
#[derive(Debug)]
pub struct Admission {
    /// The client (the peer, or from a trusted `X-Forwarded-For`).
    pub client_ip: IpAddr,
    /// The index of the matched route in `Config::routes`.
    pub route: Option<usize>,
    /// The caller, when a valid key was presented.
    pub identity: Option<Arc<Identity>>,
    /// The target to forward, when it differs from the client's (normalized path, origin form).
    pub target: Option<Uri>,
    /// The `Host` to forward when the client sent an absolute-form target without one.
    pub host: Option<String>,
    /// The target the route's rewrite makes (the rewritten path, the query kept): what the
    /// upstream receives in place of `target`.
    pub rewritten: Option<Uri>,
    /// Concurrency slots held for the exchange: dropping them releases them.
    pub slots: Option<Slots>,
    /// Forward or answer.
    pub next: Next,
    /// Set when the request is forwarded slowed (`mode = "slow"`): its rate and rules.
    pub slowed: Option<crate::request::throttle::Slowed>,
    /// The limiter's decision with its times, for the trace: only when the request is traced
    /// and rules applied.
    pub decision: Option<Box<crate::telemetry::Decision>>,
}

/// The verdict.
#[derive(Debug)]
pub enum Next {
    /// Forward upstream after `delay` (shaping), adding `ratelimit` to the response.
    Forward {
        /// How long to hold the request first.
        delay: Duration,
        /// The RateLimit fields of the rules that applied.
        ratelimit: Option<RateLimitHeaders>,
    },
    /// Answer the client without forwarding.
    Answer(Box<Answer>),
    /// A CORS preflight of a route with `cors`: answered `204` with these headers, never
    /// forwarded.
    Preflight(Box<Preflight>),
}

/// The `204` answer to a CORS preflight.
#[derive(Debug)]
pub struct Preflight {
    /// The CORS headers (none when the origin is not allowed).
    pub headers: Vec<(http::HeaderName, http::HeaderValue)>,
    /// The RateLimit fields of the rules on `OPTIONS` that counted it.
    pub ratelimit: Option<RateLimitHeaders>,
}

impl Admission {
    fn answer(client_ip: IpAddr, route: Option<usize>, mut problem: Problem, id: &str) -> Self {
        problem.request_id = Some(id.to_string());
        Admission {
            next: Next::Answer(Box::new(problem.answer())),
            ..Admission::forward(client_ip, route)
        }
    }

    /// Forwarded as it came, at once, with nothing yet known of the caller or charged.
    fn forward(client_ip: IpAddr, route: Option<usize>) -> Self {
        Admission {
            client_ip,
            route,
            identity: None,
            target: None,
            host: None,
            rewritten: None,
            slots: None,
            next: Next::Forward {
                delay: Duration::ZERO,
                ratelimit: None,
            },
            slowed: None,
            decision: None,
        }
    }
}

/// Decides what happens to `req` under `cfg`, charging `limiter`.
pub async fn admit(cfg: &Config, limiter: &Limiter, req: &Request<'_>) -> Admission {
    let ip = client_ip(req.peer, req.headers, &cfg.server.trusted_proxies);
    let id = req.request_id;

    if req.method == http::Method::CONNECT {
        return refuse_connect(ip, id);
    }
    if let Err(detail) = refuse_spellings(cfg, req) {
        return Admission::answer(ip, None, Problem::bad_request(detail), id);
    }
    // One spelling per resource: routes, rules and the upstream all see the normalized host
    // and path, so a re-spelled request is charged as what it is.
    let absolute = absolute_form_authority(req.raw_target);
    let host = match request_host(req, absolute) {
        Ok(h) => h,
        Err(detail) => return Admission::answer(ip, None, Problem::bad_request(detail), id),
    };
    // A CORS preflight goes to the route of the request it asks about, when that route
    // answers CORS; any other OPTIONS is routed as itself.
    let preflight = preflight_route(cfg, host.as_deref(), req);
    let is_preflight = preflight.is_some();
    let routed = match preflight {
        Some(routed) => Ok(routed),
        None => route_path(cfg, host.as_deref(), req.method, req.uri.path()),
    };
    let (path, route_idx, mode) = match routed {
        Ok(Routed {
            path,
            route: Some(route),
            mode,
        }) => (path, route, mode),
        Ok(Routed { path, .. }) => {
            if !cfg.server.ips.admits(ip) {
                return refuse_ip(ip, None, "-", id);
            }
            return Admission::answer(ip, None, Problem::not_found(&path), id);
        }
        Err(e) => return Admission::answer(ip, None, Problem::bad_request(e.to_string()), id),
    };
    let route = &cfg.routes[route_idx];
    if !cfg.server.ips.admits(ip) || !route.edges.ips.admits(ip) {
        return refuse_ip(ip, Some(route_idx), &route.name, id);
    }
    if is_preflight {
        return answer_preflight(cfg, limiter, req, route_idx, &path, host.as_deref(), ip).await;
    }
    let settings = &route.upstream.settings;
    if settings.balance == crate::upstream::Balance::Consistent {
        if let Err(e) = single_valued(&settings.hash_key, req.headers, req.uri.query()) {
            let p = Problem::bad_request(e.to_string());
            return Admission::answer(ip, Some(route_idx), p, id);
        }
    }

    let identity = match identify(cfg, route, req.headers).await {
        Ok(identity) => identity,
        Err(p) => return Admission::answer(ip, Some(route_idx), *p, id),
    };

    // The upstream gets the normalized path. An HTTP/1.1 absolute-form target goes upstream in
    // origin form, its authority as the Host; HTTP/2 keeps its `:authority`.
    let target = (path != req.uri.path() || absolute.is_some())
        .then(|| forward_target(req.uri, &path, absolute.is_some()));
    // The route's rewrite, of the normalized path (after routing and before the rules, which
    // read the client's path): a result that would not be forwarded as it is is a 400.
    let rewritten = match rewrite_target(route, req.uri, &path, mode, absolute.is_some()) {
        Ok(r) => r,
        Err(detail) => {
            let p = Problem::bad_request(detail);
            return Admission::answer(ip, Some(route_idx), p, id);
        }
    };
    if let Some(target) = &rewritten {
        if mode == crate::wire::normalize::EscapedSlashes::Keep
            && !rewrite_keeps_its_reading(route, &path, target.path())
        {
            let e = crate::wire::normalize::PathError::AmbiguousEscape;
            let p = Problem::bad_request(e.to_string());
            return Admission::answer(ip, Some(route_idx), p, id);
        }
    }
    let forward_host = if req.headers.contains_key(http::header::HOST) {
        None
    } else {
        absolute.map(str::to_string)
    };
    let mut admission = Admission {
        identity,
        target,
        host: forward_host,
        rewritten,
        ..Admission::forward(ip, Some(route_idx))
    };
    if cfg.rules.is_empty() {
        return admission;
    }

    let view = RequestView {
        route: &route.name,
        case_sensitive: route.case_sensitive,
        method: req.method,
        path: &path,
        query: req.uri.query(),
        host: host.as_deref(),
        headers: req.headers,
        ip,
        identity: admission.identity.as_deref(),
    };
    let applying = match applying_rules(cfg, route_idx, &view, false) {
        Ok(applying) => applying,
        Err(p) => return Admission::answer(ip, Some(route_idx), *p, id),
    };
    if applying.is_empty() {
        return admission;
    }
    // `[upstreams.protect]` may yet refuse it: keep what the rules charge refundable.
    let refundable = route.upstream.settings.protect.is_some();
    let charged = charge(cfg, limiter, req, &view, applying, refundable).await;
    admission.slots = Some(charged.slots);
    admission.slowed = charged.slowed;
    admission.decision = charged.decision;
    admission.next = charged.next;
    admission
}

/// What the rules' part of a decision adds to an [`Admission`].
struct Charged {
    slots: Slots,
    slowed: Option<crate::request::throttle::Slowed>,
    decision: Option<Box<crate::telemetry::Decision>>,
    next: Next,
}

/// A CONNECT is not proxied (a tunnel to anywhere). Pingora would refuse it with a bare 405 of
/// its own; it lets CONNECT through to here (`allow_connect_method_proxying`) so that HTTP/1.1
/// and HTTP/2 get floodgate's answer. The connection closes: what follows a CONNECT is meant
/// for a tunnel, not a next request.
fn refuse_connect(ip: IpAddr, id: &str) -> Admission {
    let mut admission = Admission::answer(
        ip,
        None,
        crate::wire::response::method_not_allowed("CONNECT"),
        id,
    );
    if let Next::Answer(answer) = &mut admission.next {
        answer.close = true;
    }
    admission
}

/// The rules' part of the decision, for a routed and identified request that some rules apply
/// to: the limiter decides them, and what it decided is recorded (metrics, `/top`, webhooks,
/// shadow rejections, the trace's decision) and becomes the answer or the forwarding.
async fn charge(
    cfg: &Config,
    limiter: &Limiter,
    req: &Request<'_>,
    view: &RequestView<'_>,
    applying: Vec<(Arc<Policy>, Check)>,
    refundable: bool,
) -> Charged {
    let id = req.request_id;
    let started = Instant::now();
    let wall = req.traced.then(std::time::SystemTime::now);
    // Not boxed here: a decision made in process has no future to speak of, and one that
    // waits on the shared store boxes its own (`Limiter::decide_refundable`).
    let outcome = limiter
        .decide_refundable(applying, &cfg.store, refundable)
        .await;
    let decided = Instant::now();
    metrics()
        .decision_seconds
        .observe(decided.saturating_duration_since(started).as_secs_f64());
    // Who is being limited, for `GET /top` and the dashboard (bounded memory, no allocation
    // for a client already tracked).
    crate::top::record(cfg, view, &outcome, decided);
    // Quota webhooks: candidate events queued without waiting.
    crate::webhooks::observe(
        &cfg.webhooks,
        limiter.store(),
        cfg.store.timeout,
        view,
        &outcome,
    );
    for name in &outcome.shadow_rejected {
        tracing::info!(rule = %name, request_id = %id, "shadow rule would have rejected the request");
    }
    let ratelimit = RateLimitHeaders::build(
        outcome.applied.iter().map(|a| (&a.rule, &a.decision)),
        cfg.server.legacy_headers,
    );
    let decision = wall.map(|wall| Box::new(crate::telemetry::Decision::of(wall, &outcome)));
    let slowed = match &outcome.verdict {
        Verdict::Slow { rate, rules } => Some(crate::request::throttle::Slowed {
            rate: *rate,
            rules: rules.join(","),
        }),
        _ => None,
    };
    Charged {
        slots: outcome.slots,
        slowed,
        decision,
        next: next_for(outcome.verdict, ratelimit, id),
    }
}

/// The caller's identity on `route`: `None` when the route reads neither keys nor tokens, or
/// an optional one is absent; the 401 when a key or token is wrong, or a required one missing.
/// A token is looked for first (a Bearer value shaped like a JWT, or the issuers' own header or
/// cookie), then an API key; a token that fails is a 401 even where a key would also do.
async fn identify(
    cfg: &Config,
    route: &Route,
    headers: &http::HeaderMap,
) -> Result<Option<Arc<Identity>>, Box<Problem>> {
    let mode = route.auth;
    if mode == AuthMode::None {
        return Ok(None);
    }
    let tokens = &cfg.auth.tokens;
    if mode.reads_tokens() && !tokens.is_empty() {
        if let Some((token, carrier)) = tokens.presented(headers) {
            return match tokens.verify(token, carrier).await {
                Ok(identity) => Ok(Some(identity)),
                Err(reason) => Err(Box::new(Problem::invalid_token(reason.detail()))),
            };
        }
    }
    let key = if mode.reads_keys() {
        presented_key(headers, &cfg.auth.header)
    } else {
        None
    };
    match key.map(|k| cfg.auth.keys.lookup(k)) {
        Some(Some(found)) => Ok(Some(found)),
        Some(None) => Err(Box::new(Problem::unauthorized(false))),
        None if mode == AuthMode::Optional => Ok(None),
        None if mode == AuthMode::Token => Err(Box::new(Problem::token_required())),
        None => Err(Box::new(Problem::unauthorized(true))),
    }
}

/// Every rule that applies to the request, in file order, with its check; the 400 when a
/// request repeats a value an enforcing rule reads (a shadow rule only skips it).
fn applying_rules(
    cfg: &Config,
    route_idx: usize,
    view: &RequestView<'_>,
    preflight: bool,
) -> Result<Vec<(Arc<Policy>, Check)>, Box<Problem>> {
    let mut applying = Vec::new();
    // Only the rules whose anchor the request has (`crate::wire::match_index`), in file order.
    let probe = crate::wire::match_index::Probe {
        route: Some(route_idx),
        host: view.host,
        path: view.path,
        plan: view.identity.and_then(|i| i.plan.as_deref()),
        method: view.method,
    };
    for rule in cfg.rule_index.candidates(&probe).map(|i| &cfg.rules[i]) {
        // A preflight is counted only by rules that name OPTIONS: it carries no credentials
        // and asks nothing of the upstream, and a rule on a route's traffic must not be spent
        // by the browser's questions about it.
        if preflight && !names_options(rule) {
            continue;
        }
        match rule.matching(view) {
            Ok(true) => {
                let policy = rule.policy_for(view);
                if let Some(check) = rule.check_by(&policy, view) {
                    applying.push((policy, check));
                }
            }
            // A shadow rule never refuses: it just cannot count this request.
            Ok(false) | Err(_) if rule.shadow => {}
            Ok(false) => {}
            Err(e) => return Err(Box::new(Problem::bad_request(e.to_string()))),
        }
    }
    Ok(applying)
}

/// What the request gets after the limiter's verdict: forwarded (after a shaping delay) with
/// its RateLimit headers, or refused (429 or the rule's status with them; 503 when the store
/// failed a closed rule).
fn next_for(verdict: Verdict, ratelimit: RateLimitHeaders, id: &str) -> Next {
    match verdict {
        Verdict::Allow { delay } => Next::Forward {
            delay,
            ratelimit: Some(ratelimit),
        },
        // Served, not refused: the RateLimit fields say r=0 and there is no Retry-After.
        Verdict::Slow { .. } => Next::Forward {
            delay: Duration::ZERO,
            ratelimit: Some(ratelimit),
        },
        Verdict::Reject {
            status,
            retry_after,
            rules,
        } => {
            let secs = whole_seconds_at_least_one(retry_after);
            let mut problem = Problem::rate_limited(status, rules, secs);
            problem.request_id = Some(id.to_string());
            let mut answer = problem.answer();
            answer.ratelimit = Some(ratelimit);
            Next::Answer(Box::new(answer))
        }
        Verdict::Unavailable { retry_after, rules } => {
            let secs = whole_seconds_at_least_one(retry_after);
            let mut problem = Problem::limiter_unavailable(rules, secs);
            problem.request_id = Some(id.to_string());
            Next::Answer(Box::new(problem.answer()))
        }
    }
}

/// Refuses what an upstream could read as another request than the one routed and counted:
/// a method that is not an upper-case token (`post` is upper-cased by some servers), a target
/// that is not UTF-8 (routes see it with replacement characters, the upstream gets the bytes)
/// and the header spellings of `crate::wire::header_policy`.
fn refuse_spellings(cfg: &Config, req: &Request<'_>) -> Result<(), String> {
    if !crate::wire::normalize::method_is_canonical(req.method) {
        return Err("the method is not an upper-case token (methods are case-sensitive)".into());
    }
    if std::str::from_utf8(req.raw_target).is_err() {
        return Err("the request target is not valid UTF-8".into());
    }
    crate::wire::header_policy::check(req.headers, cfg.server.headers_with_underscores)
        .map_err(|e| e.to_string())
}

/// The request's host, normalized (`crate::wire::normalize::host`): the target's authority when it
/// has one (absolute-form, RFC 9112 §3.2.2, or HTTP/2's `:authority`), else the Host header.
/// `Ok(None)`: no host at all (HTTP/1.0). `Err`: a host no route could name (400).
/// `absolute` is the target's authority when it is in absolute form ([`absolute_form_authority`]).
fn request_host<'r>(
    req: &Request<'r>,
    absolute: Option<&'r str>,
) -> Result<Option<std::borrow::Cow<'r, str>>, String> {
    let raw = match req.uri.authority() {
        Some(a) => a.as_str(),
        // Pingora has checked that a Host header, if any, equals this authority.
        None => match absolute {
            Some(a) => a,
            None => {
                let mut hosts = req.headers.get_all(http::header::HOST).iter();
                let Some(first) = hosts.next() else {
                    return Ok(None);
                };
                if hosts.next().is_some() {
                    return Err("the request has more than one Host header".into());
                }
                first
                    .to_str()
                    .map_err(|_| "the Host header is not a host name".to_string())?
            }
        },
    };
    // Borrowed when the host is already in normal form (the usual case): no allocation.
    crate::wire::normalize::host(raw)
        .map(Some)
        .map_err(|e| e.to_string())
}

/// The authority of an HTTP/1.1 absolute-form target (`GET http://host/x HTTP/1.1`): Pingora
/// keeps only the path in the URI and the whole target in the raw bytes.
fn absolute_form_authority(raw_target: &[u8]) -> Option<&str> {
    // Origin form, nearly every request: no scheme to look for (nor UTF-8 to check).
    if raw_target.first() == Some(&b'/') {
        return None;
    }
    let raw = std::str::from_utf8(raw_target).ok()?;
    let (scheme, rest) = raw.split_once("://")?;
    if !scheme.eq_ignore_ascii_case("http") && !scheme.eq_ignore_ascii_case("https") {
        return None;
    }
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    Some(&rest[..end])
}

/// `uri` with `path` (normalized, so always a valid path) in place of its own, the query
/// kept; in origin form when `origin_form`.
fn forward_target(uri: &Uri, path: &str, origin_form: bool) -> Uri {
    // The parts came from a valid URI and the path from the normalizer; should they ever not
    // fit together, the client's own target goes upstream.
    with_path(uri, path.to_owned(), origin_form).unwrap_or_else(|| uri.clone())
}

/// `uri` with `path` in place of its own, the query kept, in origin form when `origin_form`;
/// `None` when they do not make a valid target.
fn with_path(uri: &Uri, mut path: String, origin_form: bool) -> Option<Uri> {
    if let Some(q) = uri.query() {
        path.push('?');
        path.push_str(q);
    }
    // The text's buffer becomes the target's (checked, not copied).
    let path_and_query =
        http::uri::PathAndQuery::from_maybe_shared(bytes::Bytes::from(path)).ok()?;
    if origin_form {
        // Nothing of the client's target but its query is kept: no copy of its parts.
        return Some(Uri::from(path_and_query));
    }
    let mut parts = uri.clone().into_parts();
    parts.path_and_query = Some(path_and_query);
    Uri::from_parts(parts).ok()
}

#[cfg(test)]
mod tests;

/// A request's normalized path, the route it is for (none: 404) and the `escaped_slashes`
/// mode it was read with.
#[derive(Debug)]
struct Routed<'p> {
    path: std::borrow::Cow<'p, str>,
    route: Option<usize>,
    mode: crate::wire::normalize::EscapedSlashes,
}

/// The normalized path of `raw` and the route it is for (none: 404), under `[server]
/// escaped_slashes` and each route's own. A path with `%2F`/`%5C`/`%3B` that the server's mode
/// refuses is accepted when, normalized under a route's own mode, its first matching route is
/// that one; a path the server's mode accepts is refused when its route's own mode refuses
/// it. A path without those escapes reads the same under every mode and pays one pass.
///
/// A path read with its escapes kept is refused when a backend that decodes them would read
/// it as another route's, or another set of rules' ([`ambiguous_escape`]).
fn route_path<'p>(
    cfg: &Config,
    host: Option<&str>,
    method: &http::Method,
    raw: &'p str,
) -> Result<Routed<'p>, crate::wire::normalize::PathError> {
    use crate::wire::normalize::{path, EscapedSlashes, PathError};
    let server = cfg.server.escaped_slashes;
    let routed = match path(raw, server) {
        Ok(p) => {
            let route = cfg.route_for(host, method, &p);
            let own = route.and_then(|i| cfg.routes[i].escaped_slashes);
            match own {
                Some(own) if own != server && raw.contains('%') => {
                    // The route reads the escapes otherwise (stricter, or decoding them): its
                    // mode decides, and the path it makes must still be its own.
                    let mine = path(raw, own)?;
                    if mine != p && cfg.route_for(host, method, &mine) != route {
                        return Err(PathError::EscapedSlash);
                    }
                    Routed {
                        path: mine,
                        route,
                        mode: own,
                    }
                }
                _ => Routed {
                    path: p,
                    route,
                    mode: server,
                },
            }
        }
        Err(PathError::EscapedSlash) => {
            let found = cfg.routes.iter().enumerate().find_map(|(i, r)| {
                let own = r.escaped_slashes.filter(|m| *m != EscapedSlashes::Reject)?;
                let p = path(raw, own).ok()?;
                (cfg.route_for(host, method, &p) == Some(i)).then_some(Routed {
                    path: p,
                    route: Some(i),
                    mode: own,
                })
            });
            found.ok_or(PathError::EscapedSlash)?
        }
        Err(e) => return Err(e),
    };
    if routed.mode == EscapedSlashes::Keep && ambiguous_escape(cfg, host, method, &routed) {
        return Err(PathError::AmbiguousEscape);
    }
    Ok(routed)
}

/// Whether a path read with `%2F`, `%5C` or `%3B` kept means something else to a backend that
/// decodes them: decoded (`%2F` and `%5C` as `/`, `%3B` as the start of a path parameter a
/// servlet container strips, dot-segments then removed), it is another route's, or a rule's
/// `path` / `path_prefix` matches one reading and not the other. `/orders%2F1` in front of a
/// catch-all route would otherwise reach the upstream unauthenticated and uncounted, and be
/// served as `/orders/1`.
fn ambiguous_escape(
    cfg: &Config,
    host: Option<&str>,
    method: &http::Method,
    routed: &Routed<'_>,
) -> bool {
    let kept = &*routed.path;
    if !has_kept_escape(kept) {
        return false;
    }
    let Some(decoded) = decoded_reading(kept) else {
        return true;
    };
    if cfg.route_for(host, method, &decoded) != routed.route {
        return true;
    }
    let Some(route_idx) = routed.route else {
        return false;
    };
    let route = &cfg.routes[route_idx];
    // Only rules filed under this route or one of the two readings' paths can read them
    // differently (`crate::wire::match_index`: a rule fixing a path is filed under it), so a
    // client's escapes cost what the index's lookups do, not a test of every rule.
    let probe = |path| crate::wire::match_index::Probe {
        route: Some(route_idx),
        host,
        path,
        plan: None,
        method,
    };
    let mut candidates: Vec<usize> = cfg.rule_index.candidates(&probe(kept)).collect();
    candidates.extend(cfg.rule_index.candidates(&probe(&decoded)));
    candidates.into_iter().map(|i| &cfg.rules[i]).any(|rule| {
        rule.matcher
            .route
            .as_deref()
            .is_none_or(|r| *r == *route.name)
            && rule
                .matcher
                .request
                .path_matches(kept, route.case_sensitive)
                != rule
                    .matcher
                    .request
                    .path_matches(&decoded, route.case_sensitive)
    })
}

/// Whether a rewrite of a path with kept escapes means, decoded, what the rewrite of the
/// decoded path means: a kept `..%2F` would otherwise climb out of the rewrite's target once
/// a backend decodes it (`/api/..%2Fapi` under `prefix_rewrite = "/internal/public"` reads
/// as `/api` here and reaches the backend as `/internal/public/..%2Fapi`, which it serves as
/// `/internal/api`). True for a path without kept escapes.
fn rewrite_keeps_its_reading(route: &Route, path: &str, rewritten: &str) -> bool {
    if !has_kept_escape(path) {
        return true;
    }
    let Some(rewrite) = &route.edges.rewrite else {
        return true;
    };
    let keep = crate::wire::normalize::EscapedSlashes::Keep;
    let (Some(decoded), Some(sent)) = (decoded_reading(path), decoded_reading(rewritten)) else {
        return false;
    };
    match rewrite.apply(&decoded, keep) {
        Ok(Some(meant)) => meant == sent,
        Ok(None) => decoded == sent,
        Err(_) => false,
    }
}

/// Whether a normalized path has a kept `%2F`, `%5C` or `%3B`.
fn has_kept_escape(path: &str) -> bool {
    path.contains("%2F") || path.contains("%5C") || path.contains("%3B")
}

/// `path` as a backend that decodes `%2F`, `%5C` and `%3B` reads it (see
/// [`ambiguous_escape`]), normalized; `None` when that reading is not a path at all.
fn decoded_reading(path: &str) -> Option<String> {
    let slashes = path.replace("%2F", "/").replace("%5C", "/");
    let segments: Vec<&str> = slashes
        .split('/')
        .map(|seg| seg.split_once("%3B").map_or(seg, |(kept, _)| kept))
        .collect();
    let joined = segments.join("/");
    crate::wire::normalize::path(&joined, crate::wire::normalize::EscapedSlashes::Keep)
        .ok()
        .map(std::borrow::Cow::into_owned)
}

/// The route a CORS preflight is for and its path, when the request is one (`OPTIONS` with
/// `Origin` and `Access-Control-Request-Method`) and the route of the method it asks about
/// answers CORS.
fn preflight_route<'r>(cfg: &Config, host: Option<&str>, req: &Request<'r>) -> Option<Routed<'r>> {
    let asked = crate::wire::cors::preflight_method(req.method, req.headers)?;
    let routed = route_path(cfg, host, &asked, req.uri.path()).ok()?;
    cfg.routes[routed.route?].edges.cors.as_ref()?;
    Some(routed)
}

/// `403`: the client's address is not let in (`allow_ips` / `deny_ips`), counted by route.
fn refuse_ip(ip: IpAddr, route: Option<usize>, name: &str, id: &str) -> Admission {
    metrics().ip_refused.with_label_values(&[name]).inc();
    Admission::answer(ip, route, Problem::ip_refused(), id)
}

/// Whether a rule's `match.methods` names `OPTIONS` (such rules count preflights).
fn names_options(rule: &crate::rules::Rule) -> bool {
    rule.matcher
        .request
        .methods
        .as_ref()
        .is_some_and(|m| m.contains(&http::Method::OPTIONS))
}

/// The answer to a CORS preflight on route `route_idx`: never authenticated nor forwarded,
/// counted only by rules that name `OPTIONS` (which can refuse it: a flood of preflights is
/// limited like any other), else `204` with the route's CORS headers for an allowed origin
/// and none for another.
async fn answer_preflight(
    cfg: &Config,
    limiter: &Limiter,
    req: &Request<'_>,
    route_idx: usize,
    path: &str,
    host: Option<&str>,
    ip: IpAddr,
) -> Admission {
    let route = &cfg.routes[route_idx];
    let id = req.request_id;
    let mut admission = Admission::forward(ip, Some(route_idx));
    let mut ratelimit = None;
    if !cfg.rules.is_empty() {
        let view = RequestView {
            route: &route.name,
            case_sensitive: route.case_sensitive,
            method: req.method,
            path,
            query: req.uri.query(),
            host,
            headers: req.headers,
            ip,
            identity: None,
        };
        let applying = match applying_rules(cfg, route_idx, &view, true) {
            Ok(applying) => applying,
            Err(p) => return Admission::answer(ip, Some(route_idx), *p, id),
        };
        if !applying.is_empty() {
            let charged = charge(cfg, limiter, req, &view, applying, false).await;
            admission.slots = Some(charged.slots);
            admission.decision = charged.decision;
            match charged.next {
                Next::Forward { ratelimit: r, .. } => ratelimit = r,
                refused => {
                    admission.next = refused;
                    return admission;
                }
            }
        }
    }
    let headers = route
        .edges
        .cors
        .as_ref()
        .and_then(|c| Some(c.preflight_headers(c.allowed_origin(req.headers)?, req.headers)))
        .unwrap_or_default();
    admission.next = Next::Preflight(Box::new(Preflight { headers, ratelimit }));
    admission
}

/// The target the route's rewrite makes of the normalized `path` (the client's query kept),
/// `None` without a rewrite or when it leaves the path as it is; the 400's detail when the
/// result is not a path to forward.
fn rewrite_target(
    route: &Route,
    uri: &Uri,
    path: &str,
    mode: crate::wire::normalize::EscapedSlashes,
    origin_form: bool,
) -> Result<Option<Uri>, String> {
    let Some(rewrite) = &route.edges.rewrite else {
        return Ok(None);
    };
    let Some(new_path) = rewrite.apply(path, mode).map_err(|e| e.to_string())? else {
        return Ok(None);
    };
    with_path(uri, new_path, origin_form)
        .map(Some)
        .ok_or_else(|| "the route's rewrite of this path is not a valid request target".into())
}
