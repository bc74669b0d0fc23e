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
use opentelemetry::trace::{
    Span as _, SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceId, Tracer as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::{SdkTracer, Span};
use pingora::http::RequestHeader;

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
    pub name: &'a str,
    /// The target of this attempt.
    pub addr: SocketAddr,
    /// 0 for the first attempt, then the retry's number.
    pub attempt: usize,
}

/// A traced request, carried in the proxy's per-request context: its spans when it is sampled,
/// only the ids its upstream's `traceparent` needs when it is not.
pub struct RequestTrace(Trace);

enum Trace {
    /// Not sampled: nothing is recorded, and the SDK is never asked for a span.
    Unsampled(Unsampled),
    /// Sampled: its spans (boxed: most requests are not).
    Sampled(Box<Sampled>),
}

/// What an unsampled request passes on: the trace it belongs to (the trusted caller's, or a
/// new one), the id standing for floodgate's part in it (the upstream's parent), and whether
/// the caller's `tracestate` goes on with it.
/// (Bytes, not `TraceId`'s `u128`: the context it sits in keeps its 8-byte alignment.)
#[derive(Clone, Copy)]
struct Unsampled {
    trace_id: [u8; 16],
    span_id: [u8; 8],
    continued: bool,
}

/// A sampled request's spans.
struct Sampled {
    tracer: &'static SdkTracer,
    /// Holds the server span: children are started in it.
    cx: Context,
    /// The upstream exchange's client span, from the first attempt to the end.
    upstream: Option<Span>,
    /// The request's method (the server span's name is `{method} {route}`).
    method: Method,
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
        let attributes = || {
            let mut attributes = vec![
                KeyValue::new("http.request.method", method_name(method)),
                KeyValue::new("url.path", bounded(path)),
                KeyValue::new("url.scheme", if tls { "https" } else { "http" }),
                KeyValue::new("network.peer.address", peer.to_string()),
            ];
            if let Some(host) = headers
                .get(http::header::HOST)
                .and_then(|h| h.to_str().ok())
            {
                let host = host.rsplit_once(':').map_or(host, |(h, _)| h);
                attributes.push(KeyValue::new("server.address", bounded(host)));
            }
            attributes
        };
        let name = method_name(method);
        let mut trace = Self::begin(settings, trusted_proxies, peer, headers, name, attributes)?;
        if let Trace::Sampled(s) = &mut trace.0 {
            s.method = method.clone();
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
        let attributes = || {
            vec![
                KeyValue::new("rpc.system", "grpc"),
                KeyValue::new("rpc.service", RLS_SERVICE),
                KeyValue::new("rpc.method", "ShouldRateLimit"),
                KeyValue::new("network.peer.address", peer.to_string()),
                KeyValue::new("floodgate.rls.domain", bounded(domain)),
            ]
        };
        let name = Cow::Borrowed(RLS_SPAN_NAME);
        Self::begin(settings, trusted_proxies, peer, metadata, name, attributes)
    }

    /// The sampling decision first (parent-based: a trusted caller's sampled flag, else the
    /// ratio in force), and only for a sampled request the SDK's server span.
    fn begin(
        settings: &Settings,
        trusted_proxies: &[IpNet],
        peer: IpAddr,
        headers: &HeaderMap,
        name: Cow<'static, str>,
        attributes: impl FnOnce() -> Vec<KeyValue>,
    ) -> Option<RequestTrace> {
        let telemetry = super::tracer(settings)?;
        let trusted = settings.trust_incoming || trusted_proxies.iter().any(|n| n.contains(&peer));
        // The caller's context is read only when it may be continued and was sent.
        let parent = match trusted && headers.contains_key(propagation::TRACEPARENT) {
            true => Some(propagation::extract(headers)),
            false => None,
        };
        let remote = parent
            .as_ref()
            .map(|cx| cx.span().span_context().clone())
            .filter(SpanContext::is_valid);
        let unsampled = |trace_id: TraceId| {
            RequestTrace(Trace::Unsampled(Unsampled {
                trace_id: trace_id.to_bytes(),
                span_id: fastrand::u64(1..).to_be_bytes(),
                continued: remote.is_some(),
            }))
        };
        match &remote {
            Some(sc) if !sc.is_sampled() => return Some(unsampled(sc.trace_id())),
            Some(_) => {}
            None => {
                let trace_id = TraceId::from_bytes(fastrand::u128(1..).to_be_bytes());
                if !telemetry.ratio.samples(trace_id) {
                    return Some(unsampled(trace_id));
                }
            }
        }
        let tracer = &telemetry.tracer;
        let parent = parent.unwrap_or_default();
        // The SDK's sampler follows the decision made here (`ParentBased(AlwaysOn)`).
        let span = tracer
            .span_builder(name)
            .with_kind(SpanKind::Server)
            .with_attributes(attributes())
            .start_with_context(tracer, &parent);
        Some(RequestTrace(Trace::Sampled(Box::new(Sampled {
            tracer,
            cx: parent.with_span(span),
            upstream: None,
            method: Method::GET,
        }))))
    }

    /// The sampled request's spans, `None` for an unsampled one.
    fn sampled(&self) -> Option<&Sampled> {
        match &self.0 {
            Trace::Sampled(s) => Some(s),
            Trace::Unsampled(_) => None,
        }
    }

    /// The RLS call is answered: `grpc_status` is the gRPC status code (0: OK), `overall` the
    /// answer's overall code (`OK`, `OVER_LIMIT`) when there was one.
    pub fn finish_rls(self, grpc_status: i32, overall: Option<&'static str>) {
        let Trace::Sampled(s) = self.0 else {
            return;
        };
        let server = s.cx.span();
        if !server.is_recording() {
            server.end();
            return;
        }
        server.set_attribute(KeyValue::new(
            "rpc.grpc.status_code",
            i64::from(grpc_status),
        ));
        if let Some(code) = overall {
            server.set_attribute(KeyValue::new("floodgate.rls.overall_code", code));
        }
        // UNAVAILABLE (a closed limit and a failing store) and INTERNAL are the service's
        // failures; INVALID_ARGUMENT is the caller's.
        if matches!(grpc_status, 13 | 14) {
            server.set_status(Status::error("rate-limit service failure"));
        }
        server.end();
    }

    /// Whether the request is sampled: only then are its spans' details built (admission
    /// records its decision only for a recording trace).
    pub fn is_recording(&self) -> bool {
        self.sampled().is_some_and(|s| s.cx.span().is_recording())
    }

    /// The trace id, for the access log.
    pub fn trace_id(&self) -> [u8; 16] {
        match &self.0 {
            Trace::Sampled(s) => s.cx.span().span_context().trace_id().to_bytes(),
            Trace::Unsampled(u) => u.trace_id,
        }
    }

    /// What admission learned of the request: its route, client and caller.
    pub fn identified(&self, route: Option<&str>, client_ip: IpAddr, key_id: Option<&str>) {
        let Some(s) = self.sampled() else {
            return;
        };
        let span = s.cx.span();
        if !span.is_recording() {
            return;
        }
        if let Some(route) = route {
            // The route's name: floodgate routes match prefixes, not templates.
            span.set_attribute(KeyValue::new("http.route", route.to_owned()));
            span.update_name(Cow::Owned(format!("{} {route}", s.method)));
        }
        span.set_attribute(KeyValue::new("client.address", client_ip.to_string()));
        if let Some(id) = key_id {
            span.set_attribute(KeyValue::new("floodgate.key_id", id.to_owned()));
        }
    }

    /// Records the admission decision as a child span (with a `floodgate.rule` event per rule
    /// and a `floodgate.store` child for the store call); a refusal also goes on the server
    /// span.
    pub fn admission(&self, d: &Decision) {
        let Some(s) = self.sampled().filter(|s| s.cx.span().is_recording()) else {
            return;
        };
        let mut attributes = vec![
            KeyValue::new("floodgate.decision.result", d.result),
            KeyValue::new("floodgate.rules", rule_names(&d.rules)),
            KeyValue::new(
                "floodgate.store.calls",
                i64::from(u8::from(d.store.is_some())),
            ),
        ];
        if !d.decided_by.is_empty() {
            let key = if d.result == "slow" {
                "floodgate.slowed_by"
            } else {
                "floodgate.rejected_by"
            };
            attributes.push(KeyValue::new(key, d.decided_by.clone()));
            let server = s.cx.span();
            server.set_attribute(KeyValue::new(key, d.decided_by.clone()));
            server.set_attribute(KeyValue::new("floodgate.decision.result", d.result));
        }
        if !d.shadow_rejected.is_empty() {
            attributes.push(KeyValue::new(
                "floodgate.shadow_rejected",
                d.shadow_rejected.clone(),
            ));
        }
        if !d.delay.is_zero() {
            attributes.push(KeyValue::new(
                "floodgate.shaping.delay_ms",
                d.delay.as_secs_f64() * 1000.0,
            ));
        }
        let mut span = s
            .tracer
            .span_builder("floodgate.admission")
            .with_kind(SpanKind::Internal)
            .with_start_time(d.start)
            .with_attributes(attributes)
            .start_with_context(s.tracer, &s.cx);
        for r in &d.rules {
            span.add_event_with_timestamp(
                "floodgate.rule",
                d.end,
                vec![
                    KeyValue::new("floodgate.rule.name", r.name.to_string()),
                    KeyValue::new(
                        "floodgate.rule.result",
                        if r.allowed { "allowed" } else { "rejected" },
                    ),
                    KeyValue::new("floodgate.rule.remaining", clamp(r.remaining)),
                    KeyValue::new("floodgate.rule.limit", clamp(r.limit)),
                ],
            );
        }
        let admission = s.cx.with_span(span);
        if let Some((start, took, failed)) = d.store {
            let mut store = s
                .tracer
                .span_builder("floodgate.store")
                .with_kind(SpanKind::Client)
                .with_start_time(start)
                .with_attributes(vec![
                    KeyValue::new("db.system.name", "redis"),
                    KeyValue::new("db.operation.name", "EVALSHA"),
                ])
                .start_with_context(s.tracer, &admission);
            if failed {
                store.set_status(Status::error("store call failed; on_store_error decided"));
            }
            store.end_with_timestamp(start + took);
        }
        admission.span().end_with_timestamp(d.end);
    }

    /// The upstream request of one attempt is about to go: starts (first attempt) or updates
    /// (retry) the client span, and sets its context as the request's `traceparent`.
    pub fn upstream_request(&mut self, up: Upstream<'_>, req: &mut RequestHeader) {
        let s = match &mut self.0 {
            Trace::Sampled(s) => s,
            Trace::Unsampled(u) => {
                let (trace_id, span_id) = (
                    TraceId::from_bytes(u.trace_id),
                    SpanId::from_bytes(u.span_id),
                );
                propagation::inject_unsampled(trace_id, span_id, u.continued, req);
                return;
            }
        };
        let span = match &mut s.upstream {
            Some(span) => {
                if span.is_recording() {
                    span.set_attribute(KeyValue::new(
                        "http.request.resend_count",
                        up.attempt as i64,
                    ));
                }
                span
            }
            None => {
                // Unsampled, it is still started: its id is the upstream's parent.
                let mut span = s
                    .tracer
                    .span_builder(method_name(&req.method))
                    .with_kind(SpanKind::Client)
                    .start_with_context(s.tracer, &s.cx);
                if span.is_recording() {
                    span.set_attributes([
                        KeyValue::new("http.request.method", method_name(&req.method)),
                        KeyValue::new("floodgate.upstream", up.name.to_owned()),
                        // What the upstream receives (a route's rewrite changes it; the
                        // server span's `url.path` is the client's).
                        KeyValue::new("url.path", bounded(req.uri.path())),
                    ]);
                }
                s.upstream.insert(span)
            }
        };
        if span.is_recording() {
            span.set_attribute(KeyValue::new("server.address", up.addr.ip().to_string()));
            span.set_attribute(KeyValue::new("server.port", i64::from(up.addr.port())));
        }
        propagation::inject(span.span_context(), req);
    }

    /// The upstream answered with `status`.
    pub fn upstream_status(&mut self, status: u16) {
        let Trace::Sampled(s) = &mut self.0 else {
            return;
        };
        if let Some(span) = s.upstream.as_mut().filter(|s| s.is_recording()) {
            span.set_attribute(KeyValue::new(
                "http.response.status_code",
                i64::from(status),
            ));
            if status >= 500 {
                span.set_status(Status::error(""));
            }
        }
    }

    /// The exchange is over: `status` was sent (0: none), `error` is Pingora's error type if
    /// the exchange failed. Ends every span still open.
    pub fn finish(self, status: u16, error: Option<&str>) {
        let Trace::Sampled(mut s) = self.0 else {
            return;
        };
        if !s.cx.span().is_recording() {
            if let Some(mut span) = s.upstream.take() {
                span.end();
            }
            s.cx.span().end();
            return;
        }
        if let Some(mut span) = s.upstream.take() {
            if let Some(e) = error {
                span.set_attribute(KeyValue::new("error.type", e.to_owned()));
                span.set_status(Status::error(e.to_owned()));
            }
            span.end();
        }
        let server = s.cx.span();
        if status > 0 {
            server.set_attribute(KeyValue::new(
                "http.response.status_code",
                i64::from(status),
            ));
        }
        if status >= 500 || (status == 0 && error.is_some()) {
            let why = error.unwrap_or("server error");
            server.set_attribute(KeyValue::new("error.type", why.to_owned()));
            server.set_status(Status::error(why.to_owned()));
        }
        // A 429 is the gateway working, not failing: its status stays unset (HTTP server
        // conventions: a 4xx is not a server span's error); `floodgate.rejected_by` names
        // the rule.
        server.end();
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
fn bounded(s: &str) -> String {
    if s.len() <= MAX_VALUE {
        return s.to_owned();
    }
    let mut end = MAX_VALUE;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
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
