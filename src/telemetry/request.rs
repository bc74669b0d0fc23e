//! One request's spans: the server span, the admission decision with its store call, and the
//! upstream exchange. Built only when `[tracing]` is on and the request is sampled
//! ([`RequestTrace::start`]): an unsampled request keeps two ids for propagation and nothing
//! else (no span, no SDK object, no allocation).

use std::borrow::Cow;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use http::{HeaderMap, Method};
use ipnet::IpNet;
use pingora::http::RequestHeader;

use super::export::Queue;
use super::span::{self, Event, Kind, Name, SpanRecord, Value};
use super::{propagation, Settings};
use crate::limiter::engine::{Outcome, Verdict};

/// One rule's verdict on the request, as the admission span shows it.
#[derive(Debug, Clone)]
pub struct RuleVerdict {
    /// The rule's name.
    pub name: Arc<str>,
    /// It let the request through.
    pub allowed: bool,
    /// Quota left (`r` of `RateLimit`).
    pub remaining: u64,
    /// The quota (`q` of `RateLimit-Policy`).
    pub limit: u64,
}

/// What admission decided, with its times: recorded by admission only when the request is
/// traced, turned into spans by [`RequestTrace::admission`].
#[derive(Debug, Clone)]
pub struct Decision {
    /// When the limiter was asked.
    pub start: SystemTime,
    /// When it answered.
    pub end: SystemTime,
    /// Every enforcing rule that applied, in file order.
    pub rules: Vec<RuleVerdict>,
    /// `allow`, `reject`, `slow` or `unavailable`.
    pub result: &'static str,
    /// The rules that refused (or slowed) the request, comma-separated; empty when allowed.
    pub decided_by: String,
    /// Shadow rules that would have refused it, comma-separated.
    pub shadow_rejected: String,
    /// The shared store's call: start, duration, failed.
    pub store: Option<(SystemTime, Duration, bool)>,
    /// How long shaping holds the request before it goes upstream.
    pub delay: Duration,
}

impl Decision {
    /// The trace's view of `outcome`, asked at `start` (wall clock).
    pub fn of(start: SystemTime, outcome: &Outcome) -> Decision {
        let rules = outcome
            .applied
            .iter()
            .map(|a| RuleVerdict {
                name: a.rule.name.clone(),
                allowed: a.decision.allowed,
                remaining: a.decision.remaining,
                limit: a.decision.limit,
            })
            .collect();
        let (result, decided_by, delay) = match &outcome.verdict {
            Verdict::Allow { delay } => ("allow", String::new(), *delay),
            Verdict::Reject { rules, .. } => ("reject", rules.join(","), Duration::ZERO),
            Verdict::Slow { rules, .. } => ("slow", rules.join(","), Duration::ZERO),
            Verdict::Unavailable { rules, .. } => ("unavailable", rules.join(","), Duration::ZERO),
        };
        let store = outcome
            .store_call
            .map(|c| (wall_clock_of(c.start), c.took, c.failed));
        Decision {
            start,
            end: SystemTime::now(),
            rules,
            result,
            decided_by,
            shadow_rejected: outcome.shadow_rejected.join(","),
            store,
            delay,
        }
    }
}

/// The wall-clock time of `at` (a monotonic instant in the past).
fn wall_clock_of(at: Instant) -> SystemTime {
    SystemTime::now()
        .checked_sub(at.elapsed())
        .unwrap_or_else(SystemTime::now)
}

/// The upstream exchange, as its client span shows it.
#[derive(Debug, Clone, Copy)]
pub struct Upstream<'a> {
    /// The upstream's name.
    pub name: &'a Arc<str>,
    /// The target of this attempt.
    pub addr: SocketAddr,
    /// 0 for the first attempt, then the retry's number.
    pub attempt: usize,
}

/// A traced request, carried in the proxy's per-request context: its spans when it is sampled,
/// only the ids its upstream's `traceparent` needs when it is not.
pub struct RequestTrace(Trace);

enum Trace {
    /// Not sampled: nothing is recorded.
    Unsampled(Unsampled),
    /// Sampled: its spans (boxed: most requests are not).
    Sampled(Box<Sampled>),
}

/// What an unsampled request passes on: the trace it belongs to (the trusted caller's, or a
/// new one), the id standing for floodgate's part in it (the upstream's parent), and whether
/// the caller's `tracestate` goes on with it.
#[derive(Clone, Copy)]
struct Unsampled {
    trace_id: [u8; 16],
    span_id: [u8; 8],
    continued: bool,
}

/// A sampled request's spans: the server span until the end, the upstream exchange's from its
/// first attempt; the admission's are queued as soon as they are complete.
struct Sampled {
    queue: &'static Queue,
    server: SpanRecord,
    /// The upstream exchange's client span, from the first attempt to the end.
    upstream: Option<SpanRecord>,
    /// The server span's first name: a proxied request's method, to which its route is
    /// joined once known (`{method} {route}`).
    method: Cow<'static, str>,
}

impl RequestTrace {
    /// Starts the server span of a request from `peer` with `headers`: it continues the
    /// request's `traceparent` when `trust_incoming` is set or `peer` is one of
    /// `trusted_proxies`, else it begins a new trace (an untrusted client neither picks the
    /// trace id nor forces sampling).
    pub fn start(
        settings: &Settings,
        trusted_proxies: &[IpNet],
        peer: IpAddr,
        method: &Method,
        path: &str,
        headers: &HeaderMap,
        tls: bool,
    ) -> Option<RequestTrace> {
        let name = || method_name(method);
        let mut trace = Self::begin(settings, trusted_proxies, peer, headers, name)?;
        if let Trace::Sampled(s) = &mut trace.0 {
            let span = &mut s.server;
            span.attrs.reserve(9);
            span.push("http.request.method", s.method.clone());
            // Shared: the client span's `url.path` is the same text unless a rewrite changed it.
            span.push("url.path", Arc::<str>::from(bounded(path)));
            span.push("url.scheme", if tls { "https" } else { "http" });
            span.push("network.peer.address", peer);
            if let Some(host) = headers
                .get(http::header::HOST)
                .and_then(|h| h.to_str().ok())
            {
                let host = host.rsplit_once(':').map_or(host, |(h, _)| h);
                span.push("server.address", bounded(host).to_owned());
            }
        }
        Some(trace)
    }

    /// Starts the server span of an RLS `ShouldRateLimit` call from `peer` whose gRPC metadata
    /// is `metadata` (the same trust rule as [`RequestTrace::start`]).
    pub fn start_rls(
        settings: &Settings,
        trusted_proxies: &[IpNet],
        peer: IpAddr,
        metadata: &HeaderMap,
        domain: &str,
    ) -> Option<RequestTrace> {
        let name = || Cow::Borrowed(RLS_SPAN_NAME);
        let mut trace = Self::begin(settings, trusted_proxies, peer, metadata, name)?;
        if let Trace::Sampled(s) = &mut trace.0 {
            let span = &mut s.server;
            span.push("rpc.system", "grpc");
            span.push("rpc.service", RLS_SERVICE);
            span.push("rpc.method", "ShouldRateLimit");
            span.push("network.peer.address", peer);
            span.push("floodgate.rls.domain", bounded(domain).to_owned());
        }
        Some(trace)
    }

    /// The sampling decision first (parent-based: a trusted caller's sampled flag, else the
    /// ratio in force), and only for a sampled request the server span, named by `name`.
    fn begin(
        settings: &Settings,
        trusted_proxies: &[IpNet],
        peer: IpAddr,
        headers: &HeaderMap,
        name: impl FnOnce() -> Cow<'static, str>,
    ) -> Option<RequestTrace> {
        let telemetry = super::tracer(settings)?;
        let trusted = settings.trust_incoming || trusted_proxies.iter().any(|n| n.contains(&peer));
        // The caller's context is read only when it may be continued.
        let remote = match trusted {
            true => propagation::extract(headers),
            false => None,
        };
        let unsampled = |trace_id: [u8; 16]| {
            RequestTrace(Trace::Unsampled(Unsampled {
                trace_id,
                span_id: span::new_span_id(),
                continued: remote.is_some(),
            }))
        };
        let trace_id = match &remote {
            Some(r) if !r.sampled => return Some(unsampled(r.trace_id)),
            Some(r) => r.trace_id,
            None => {
                let trace_id = fastrand::u128(1..).to_be_bytes();
                if !telemetry.ratio.samples(trace_id) {
                    return Some(unsampled(trace_id));
                }
                trace_id
            }
        };
        let parent = remote.as_ref().map_or([0; 8], |r| r.span_id);
        // The name only now: an unsampled request needs none.
        let name = name();
        let mut server =
            SpanRecord::start(trace_id, parent, Name::Text(name.clone()), Kind::Server);
        if let Some(r) = remote {
            server.remote_parent = true;
            server.trace_state = r.state.map(Arc::from);
        }
        Some(RequestTrace(Trace::Sampled(Box::new(Sampled {
            queue: &telemetry.queue,
            server,
            upstream: None,
            method: name,
        }))))
    }

    /// The RLS call is answered: `grpc_status` is the gRPC status code (0: OK), `overall` the
    /// answer's overall code (`OK`, `OVER_LIMIT`) when there was one.
    pub fn finish_rls(self, grpc_status: i32, overall: Option<&'static str>) {
        let Trace::Sampled(s) = self.0 else {
            return;
        };
        let Sampled {
            queue, mut server, ..
        } = *s;
        server.set("rpc.grpc.status_code", i64::from(grpc_status));
        if let Some(code) = overall {
            server.set("floodgate.rls.overall_code", code);
        }
        // UNAVAILABLE (a closed limit and a failing store) and INTERNAL are the service's
        // failures; INVALID_ARGUMENT is the caller's.
        if matches!(grpc_status, 13 | 14) {
            server.error = Some(Cow::Borrowed("rate-limit service failure"));
        }
        server.end = span::now();
        queue.send(server);
    }

    /// Whether the request is sampled: only then are its spans' details built (admission
    /// records its decision only for a recording trace).
    pub fn is_recording(&self) -> bool {
        matches!(self.0, Trace::Sampled(_))
    }

    /// The trace id, for the access log.
    pub fn trace_id(&self) -> [u8; 16] {
        match &self.0 {
            Trace::Sampled(s) => s.server.trace_id,
            Trace::Unsampled(u) => u.trace_id,
        }
    }

    /// What admission learned of the request: its route, client and caller.
    pub fn identified(
        &mut self,
        route: Option<&Arc<str>>,
        client_ip: IpAddr,
        key_id: Option<&str>,
    ) {
        let Trace::Sampled(s) = &mut self.0 else {
            return;
        };
        // Once per request (the proxy identifies a request once): pushed, no search.
        let span = &mut s.server;
        if let Some(route) = route {
            // The route's name: floodgate routes match prefixes, not templates.
            span.push("http.route", route.clone());
            span.name = Name::MethodRoute(s.method.clone(), route.clone());
        }
        span.push("client.address", client_ip);
        if let Some(id) = key_id {
            span.push("floodgate.key_id", id.to_owned());
        }
    }

    /// Records the admission decision as a child span (with a `floodgate.rule` event per rule
    /// and a `floodgate.store` child for the store call); a refusal also goes on the server
    /// span.
    pub fn admission(&mut self, d: &Decision) {
        let Trace::Sampled(s) = &mut self.0 else {
            return;
        };
        let start = span::nanos(d.start);
        let end = span::nanos(d.end);
        let name = Name::Text(Cow::Borrowed("floodgate.admission"));
        let mut admission = s.server.child(name, Kind::Internal, Some(start));
        admission.end = end;
        admission.push("floodgate.decision.result", d.result);
        admission.push("floodgate.rules", rule_names(&d.rules));
        admission.push(
            "floodgate.store.calls",
            i64::from(u8::from(d.store.is_some())),
        );
        if !d.decided_by.is_empty() {
            let key = if d.result == "slow" {
                "floodgate.slowed_by"
            } else {
                "floodgate.rejected_by"
            };
            admission.set(key, d.decided_by.clone());
            s.server.set(key, d.decided_by.clone());
            s.server.set("floodgate.decision.result", d.result);
        }
        if !d.shadow_rejected.is_empty() {
            admission.set("floodgate.shadow_rejected", d.shadow_rejected.clone());
        }
        if !d.delay.is_zero() {
            admission.set("floodgate.shaping.delay_ms", d.delay.as_secs_f64() * 1000.0);
        }
        admission.events = d
            .rules
            .iter()
            .map(|r| Event {
                name: "floodgate.rule",
                time: end,
                attrs: vec![
                    ("floodgate.rule.name", Value::Shared(r.name.clone())),
                    (
                        "floodgate.rule.result",
                        Value::from(if r.allowed { "allowed" } else { "rejected" }),
                    ),
                    ("floodgate.rule.remaining", Value::Int(clamp(r.remaining))),
                    ("floodgate.rule.limit", Value::Int(clamp(r.limit))),
                ],
            })
            .collect();
        if let Some((at, took, failed)) = d.store {
            let name = Name::Text(Cow::Borrowed("floodgate.store"));
            let mut store = admission.child(name, Kind::Client, Some(span::nanos(at)));
            store.end = span::nanos(at + took);
            store.push("db.system.name", "redis");
            store.push("db.operation.name", "EVALSHA");
            if failed {
                store.error = Some(Cow::Borrowed("store call failed; on_store_error decided"));
            }
            s.queue.send(store);
        }
        s.queue.send(admission);
    }

    /// The upstream request of one attempt is about to go: starts (first attempt) or updates
    /// (retry) the client span, and sets its context as the request's `traceparent`.
    pub fn upstream_request(&mut self, up: Upstream<'_>, req: &mut RequestHeader) {
        let s = match &mut self.0 {
            Trace::Sampled(s) => s,
            Trace::Unsampled(u) => {
                propagation::inject(u.trace_id, u.span_id, false, u.continued, None, req);
                return;
            }
        };
        let span = match &mut s.upstream {
            Some(span) => {
                span.set("http.request.resend_count", up.attempt as i64);
                span.set("server.address", up.addr.ip());
                span.set("server.port", i64::from(up.addr.port()));
                span
            }
            None => {
                let method = method_name(&req.method);
                let mut span = s
                    .server
                    .child(Name::Text(method.clone()), Kind::Client, None);
                span.attrs.reserve(6);
                span.push("http.request.method", method);
                span.push("floodgate.upstream", up.name.clone());
                // What the upstream receives (a route's rewrite changes it; the server span's
                // `url.path` is the client's): the server span's text when it is the same.
                let path = bounded(req.uri.path());
                let same = s.server.attrs.iter().find_map(|(k, v)| match v {
                    Value::Shared(p) if *k == "url.path" && &**p == path => Some(p.clone()),
                    _ => None,
                });
                span.push("url.path", same.unwrap_or_else(|| Arc::from(path)));
                span.push("server.address", up.addr.ip());
                span.push("server.port", i64::from(up.addr.port()));
                s.upstream.insert(span)
            }
        };
        let state = span.trace_state.as_deref();
        propagation::inject(span.trace_id, span.span_id, true, false, state, req);
    }

    /// The upstream answered with `status`.
    pub fn upstream_status(&mut self, status: u16) {
        let Trace::Sampled(s) = &mut self.0 else {
            return;
        };
        if let Some(span) = s.upstream.as_mut() {
            span.set("http.response.status_code", i64::from(status));
            if status >= 500 {
                span.error = Some(Cow::Borrowed(""));
            }
        }
    }

    /// The exchange is over: `status` was sent (0: none), `error` is Pingora's error type if
    /// the exchange failed. Ends every span still open and queues them.
    pub fn finish(self, status: u16, error: Option<&str>) {
        let Trace::Sampled(s) = self.0 else {
            return;
        };
        let Sampled {
            queue,
            mut server,
            upstream,
            ..
        } = *s;
        let end = span::now();
        if let Some(mut span) = upstream {
            if let Some(e) = error {
                span.push("error.type", e.to_owned());
                span.error = Some(Cow::Owned(e.to_owned()));
            }
            span.end = end;
            queue.send(span);
        }
        // Only set here: pushed, no search.
        if status > 0 {
            server.push("http.response.status_code", i64::from(status));
        }
        if status >= 500 || (status == 0 && error.is_some()) {
            let why = error.unwrap_or("server error");
            server.push("error.type", why.to_owned());
            server.error = Some(Cow::Owned(why.to_owned()));
        }
        // A 429 is the gateway working, not failing: its status stays unset (HTTP server
        // conventions: a 4xx is not a server span's error); `floodgate.rejected_by` names
        // the rule.
        server.end = end;
        queue.send(server);
    }
}

/// The method's name without an allocation for the standard methods.
fn method_name(method: &Method) -> Cow<'static, str> {
    const STANDARD: [Method; 9] = [
        Method::GET,
        Method::POST,
        Method::PUT,
        Method::DELETE,
        Method::HEAD,
        Method::OPTIONS,
        Method::PATCH,
        Method::CONNECT,
        Method::TRACE,
    ];
    const NAMES: [&str; 9] = [
        "GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH", "CONNECT", "TRACE",
    ];
    match STANDARD.iter().position(|m| m == method) {
        Some(i) => Cow::Borrowed(NAMES[i]),
        None => Cow::Owned(method.as_str().to_owned()),
    }
}

/// The RLS service's full name (`rpc.service`).
const RLS_SERVICE: &str = "envoy.service.ratelimit.v3.RateLimitService";

/// The RLS server span's name (`{rpc.service}/{rpc.method}`).
const RLS_SPAN_NAME: &str = "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// `s`, cut to at most [`MAX_VALUE`] bytes (at a character boundary): a client's path or host
/// must not make a span, and a queued batch, as large as it likes.
fn bounded(s: &str) -> &str {
    if s.len() <= MAX_VALUE {
        return s;
    }
    let mut end = MAX_VALUE;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Longest attribute value taken from a request.
const MAX_VALUE: usize = 1024;

fn rule_names(rules: &[RuleVerdict]) -> String {
    let mut names = String::new();
    for (i, r) in rules.iter().enumerate() {
        if i > 0 {
            names.push(',');
        }
        names.push_str(&r.name);
    }
    names
}

/// OpenTelemetry integers are signed.
fn clamp(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}
