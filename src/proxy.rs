//! The Pingora `ProxyHttp` implementation: glues routing, identity, the limiter and the
//! responses together. It holds no policy itself.
//!
//! Phases, in the order Pingora calls them:
//! `request_filter` (route, identity, rules; may answer 401/404/429 itself) →
//! `upstream_peer` (round robin, next target on retry) → `upstream_request_filter` (forwarding
//! headers, key stripped) → `response_filter` (RateLimit headers, request id) → `logging`
//! (access log; concurrency slots released when the context drops).

use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::prelude::*;
use pingora::proxy::{FailToProxy, ProxyHttp, Session};
use pingora::ErrorType;

use crate::auth::{presented_key, Identity};
use crate::client::{client_ip, request_id};
use crate::config::{AuthMode, Config, Upstream};
use crate::gateway::Gateway;
use crate::limiter::engine::{Leases, Verdict};
use crate::metrics::metrics;
use crate::response::{send_problem, whole_seconds_at_least_one, Problem, RateLimitHeaders};
use crate::rules::RequestView;

/// The proxy service.
pub struct Proxy {
    /// Shared state.
    pub gateway: Arc<Gateway>,
}

/// Per-request state, carried across phases.
pub struct RequestCtx {
    start: Instant,
    /// The config the request started with: a reload mid-request does not change its route.
    config: Option<Arc<Config>>,
    route: Option<usize>,
    request_id: String,
    identity: Option<Arc<Identity>>,
    client_ip: IpAddr,
    tls: bool,
    headers: Option<RateLimitHeaders>,
    rejected_by: Option<String>,
    /// The target to forward with the normalized path, when it differs from the client's.
    forward_target: Option<http::Uri>,
    /// The Host to forward when the client sent an absolute-form target.
    forward_host: Option<String>,
    attempts: usize,
    upstream_start: Option<Instant>,
    /// Concurrency slots: dropping the context releases them, however the exchange ends.
    leases: Option<Leases>,
    /// Counts the request as in flight for graceful shutdown; last, so it drops last.
    _in_flight: crate::shutdown::InFlightGuard,
}

impl RequestCtx {
    fn upstream(&self) -> Option<&Arc<Upstream>> {
        let cfg = self.config.as_ref()?;
        Some(&cfg.routes.get(self.route?)?.upstream)
    }
}

#[async_trait]
impl ProxyHttp for Proxy {
    type CTX = RequestCtx;

    fn new_ctx(&self) -> RequestCtx {
        RequestCtx {
            start: Instant::now(),
            config: None,
            route: None,
            request_id: String::new(),
            identity: None,
            client_ip: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            tls: false,
            headers: None,
            rejected_by: None,
            forward_target: None,
            forward_host: None,
            attempts: 0,
            upstream_start: None,
            leases: None,
            _in_flight: crate::shutdown::requests().enter(),
        }
    }

    async fn early_request_filter(
        &self,
        session: &mut Session,
        _ctx: &mut RequestCtx,
    ) -> Result<()> {
        // The head is in: the rest of the exchange is off the head deadline.
        crate::connection::head_received(session);
        // Answer pipelined HTTP/1.1 requests in order instead of dropping the second one.
        session.as_downstream_mut().set_pipelining_enabled(true);
        Ok(())
    }

    async fn request_filter(&self, session: &mut Session, ctx: &mut RequestCtx) -> Result<bool> {
        let cfg = self.gateway.config.load_full();
        ctx.config = Some(cfg.clone());
        let req = session.req_header();
        ctx.request_id = request_id(&req.headers);
        let peer = session
            .client_addr()
            .and_then(|a| a.as_inet())
            .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |a| a.ip().to_canonical());
        ctx.tls = session.digest().is_some_and(|d| d.ssl_digest.is_some());
        let req = session.req_header();
        ctx.client_ip = client_ip(peer, &req.headers, &cfg.server.trusted_proxies);

        // One spelling per resource: routes, rules and the upstream all see the normalized host
        // and path, so a re-spelled request is charged as what it is.
        let host = match request_host(req) {
            Ok(h) => h,
            Err(detail) => {
                let problem = with_id(Problem::bad_request(detail), ctx);
                session.set_keepalive(None);
                self.answer(session, ctx, &problem, None).await?;
                return Ok(true);
            }
        };
        let path = match crate::normalize::path(req.uri.path(), cfg.server.escaped_slashes) {
            Ok(p) => p.into_owned(),
            Err(e) => {
                let problem = with_id(Problem::bad_request(e.to_string()), ctx);
                session.set_keepalive(None);
                self.answer(session, ctx, &problem, None).await?;
                return Ok(true);
            }
        };
        // The upstream gets the normalized path. An HTTP/1.1 absolute-form target goes upstream
        // in origin form, its authority as the Host; HTTP/2 keeps its `:authority`.
        let absolute = absolute_form_authority(req);
        if path != req.uri.path() || absolute.is_some() {
            ctx.forward_target = Some(forward_target(&req.uri, &path, absolute.is_some()));
        }
        if req.headers.get(http::header::HOST).is_none() {
            ctx.forward_host = absolute.map(str::to_string);
        }
        let Some(route_idx) = cfg
            .routes
            .iter()
            .position(|r| r.matches(host.as_deref(), &req.method, &path))
        else {
            let problem = with_id(Problem::not_found(&path), ctx);
            self.answer(session, ctx, &problem, None).await?;
            return Ok(true);
        };
        ctx.route = Some(route_idx);
        let route = &cfg.routes[route_idx];

        if route.auth != AuthMode::None {
            let presented = presented_key(&req.headers, &cfg.auth.header);
            match presented.map(|k| cfg.auth.keys.lookup(k)) {
                Some(Some(identity)) => ctx.identity = Some(identity),
                Some(None) => {
                    let problem = with_id(Problem::unauthorized(false), ctx);
                    self.answer(session, ctx, &problem, Some(CHALLENGE_INVALID))
                        .await?;
                    return Ok(true);
                }
                None if route.auth == AuthMode::Required => {
                    let problem = with_id(Problem::unauthorized(true), ctx);
                    self.answer(session, ctx, &problem, Some(CHALLENGE_MISSING))
                        .await?;
                    return Ok(true);
                }
                None => {}
            }
        }

        if cfg.rules.is_empty() {
            return Ok(false);
        }
        let req = session.req_header();
        let view = RequestView {
            route: &route.name,
            method: &req.method,
            path: &path,
            query: req.uri.query(),
            host: host.as_deref(),
            headers: &req.headers,
            ip: ctx.client_ip,
            identity: ctx.identity.as_deref(),
        };
        let mut applying = Vec::new();
        let mut checks = Vec::new();
        for rule in &cfg.rules {
            if rule.matches(&view) {
                if let Some(check) = rule.check_for(&view) {
                    applying.push(rule.clone());
                    checks.push(check);
                }
            }
        }
        if checks.is_empty() {
            return Ok(false);
        }
        let started = Instant::now();
        let outcome = self
            .gateway
            .limiter
            .decide(&applying, checks, &cfg.store)
            .await;
        metrics()
            .decision_seconds
            .observe(started.elapsed().as_secs_f64());
        for name in &outcome.shadow_rejected {
            tracing::info!(rule = %name, request_id = %ctx.request_id, "shadow rule would have rejected the request");
        }
        let headers = RateLimitHeaders::build(
            outcome.applied.iter().map(|a| (&*a.rule, &a.decision)),
            cfg.server.legacy_headers,
        );
        ctx.leases = Some(outcome.leases);
        match outcome.verdict {
            Verdict::Allow { delay } => {
                ctx.headers = Some(headers);
                if !delay.is_zero() {
                    tokio::time::sleep(delay).await;
                }
                Ok(false)
            }
            Verdict::Reject {
                status,
                retry_after,
                rules,
            } => {
                let names = rules.join(", ");
                let title = if status == 429 {
                    "Too Many Requests"
                } else {
                    "Request Rejected"
                };
                let problem = Problem::new(
                    "urn:floodgate:problem:rate-limited",
                    title,
                    status,
                    format!("rate limit exceeded for rule(s) {names}"),
                );
                self.refuse(session, ctx, problem, &rules, retry_after, Some(&headers))
                    .await?;
                Ok(true)
            }
            Verdict::Unavailable { retry_after, rules } => {
                let problem = Problem::new(
                    "urn:floodgate:problem:limiter-unavailable",
                    "Service Unavailable",
                    503,
                    format!(
                        "the rate-limit store is unavailable and rule(s) {} refuse requests until it is back",
                        rules.join(", ")
                    ),
                );
                self.refuse(session, ctx, problem, &rules, retry_after, None)
                    .await?;
                Ok(true)
            }
        }
    }

    async fn upstream_peer(
        &self,
        _session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> Result<Box<HttpPeer>> {
        let upstream = ctx
            .upstream()
            .ok_or_else(|| Error::explain(ErrorType::InternalError, "no route selected"))?;
        // Each attempt of a request moves to the next target, so a refused target is skipped.
        let base = if ctx.attempts == 0 {
            upstream.next.fetch_add(1, Ordering::Relaxed)
        } else {
            upstream
                .next
                .load(Ordering::Relaxed)
                .wrapping_add(ctx.attempts)
        };
        let addr = upstream.targets[base % upstream.targets.len()];
        let mut peer = HttpPeer::new(addr, false, String::new());
        peer.options.connection_timeout = Some(upstream.connect_timeout);
        peer.options.read_timeout = Some(upstream.read_timeout);
        Ok(Box::new(peer))
    }

    fn fail_to_connect(
        &self,
        _session: &mut Session,
        _peer: &HttpPeer,
        ctx: &mut RequestCtx,
        mut e: Box<Error>,
    ) -> Box<Error> {
        ctx.attempts += 1;
        let targets = ctx.upstream().map_or(1, |u| u.targets.len());
        if ctx.attempts < targets {
            e.set_retry(true);
        }
        e
    }

    async fn upstream_request_filter(
        &self,
        session: &mut Session,
        upstream_request: &mut RequestHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        let Some(cfg) = ctx.config.clone() else {
            return Ok(());
        };
        // The peer is appended to the chain it sent (which we trust only as far as configured).
        let peer = session
            .client_addr()
            .and_then(|a| a.as_inet())
            .map(|a| a.ip().to_canonical().to_string());
        if let Some(peer) = peer {
            let chain = match upstream_request
                .headers
                .get("x-forwarded-for")
                .and_then(|v| v.to_str().ok())
            {
                Some(prev) if !prev.trim().is_empty() => format!("{prev}, {peer}"),
                _ => peer,
            };
            upstream_request.insert_header("x-forwarded-for", chain)?;
        }
        if let Some(target) = ctx.forward_target.take() {
            upstream_request.set_uri(target);
        }
        if let Some(host) = &ctx.forward_host {
            upstream_request.insert_header(http::header::HOST, host.as_str())?;
        }
        ctx.upstream_start = Some(Instant::now());
        upstream_request
            .insert_header("x-forwarded-proto", if ctx.tls { "https" } else { "http" })?;
        upstream_request.insert_header("x-request-id", &ctx.request_id)?;
        // Identity headers are ours alone: a client must not be able to claim one.
        for h in ["x-floodgate-key-id", "x-floodgate-user", "x-floodgate-plan"] {
            upstream_request.remove_header(h);
        }
        if let Some(id) = &ctx.identity {
            upstream_request.insert_header("x-floodgate-key-id", &id.id)?;
            upstream_request.insert_header("x-floodgate-user", &id.user)?;
            if let Some(plan) = &id.plan {
                upstream_request.insert_header("x-floodgate-plan", plan)?;
            }
        }
        // Every header that can carry a key goes, whichever one authenticated: a client that
        // sends an empty x-api-key beside a Bearer token must not get the token forwarded.
        let reads_keys = ctx
            .config
            .as_ref()
            .zip(ctx.route)
            .and_then(|(c, i)| c.routes.get(i))
            .is_some_and(|r| r.auth != AuthMode::None);
        if !cfg.auth.forward_key && reads_keys {
            upstream_request.remove_header(&cfg.auth.header);
            if crate::auth::is_bearer(&upstream_request.headers) {
                upstream_request.remove_header(&http::header::AUTHORIZATION);
            }
        }
        Ok(())
    }

    async fn upstream_response_filter(
        &self,
        _session: &mut Session,
        _upstream_response: &mut ResponseHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        if let (Some(start), Some(upstream)) = (ctx.upstream_start, ctx.upstream()) {
            metrics()
                .upstream_seconds
                .with_label_values(&[&*upstream.name])
                .observe(start.elapsed().as_secs_f64());
        }
        Ok(())
    }

    async fn response_filter(
        &self,
        _session: &mut Session,
        resp: &mut ResponseHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        resp.insert_header("x-request-id", &ctx.request_id)?;
        if let Some(h) = &ctx.headers {
            h.apply(resp)?;
        }
        Ok(())
    }

    async fn fail_to_proxy(
        &self,
        session: &mut Session,
        e: &Error,
        ctx: &mut RequestCtx,
    ) -> FailToProxy {
        let code = match e.etype() {
            ErrorType::HTTPStatus(code) => *code,
            ErrorType::ConnectTimedout | ErrorType::ReadTimedout | ErrorType::WriteTimedout => 504,
            _ => match e.esource() {
                pingora::ErrorSource::Upstream => 502,
                pingora::ErrorSource::Downstream => match e.etype() {
                    ErrorType::WriteError | ErrorType::ReadError | ErrorType::ConnectionClosed => 0,
                    _ => 400,
                },
                _ => 500,
            },
        };
        if code > 0 {
            let name = ctx
                .upstream()
                .map(|u| u.name.to_string())
                .unwrap_or_default();
            let problem = match code {
                502 | 504 => Problem::upstream(code, &name),
                400 => Problem::new(
                    "urn:floodgate:problem:bad-request",
                    "Bad Request",
                    400,
                    "the request could not be read",
                ),
                _ => Problem::new(
                    "urn:floodgate:problem:internal",
                    "Internal Server Error",
                    500,
                    "the gateway failed",
                ),
            };
            let problem = with_id(problem, ctx);
            // Pingora will not reuse this connection: say so, or a keep-alive client may send
            // its next request into a socket that is being closed.
            session.set_keepalive(None);
            if let Err(err) = self.answer(session, ctx, &problem, None).await {
                tracing::debug!(error = %err, "could not send the error response");
            }
        }
        FailToProxy {
            error_code: code,
            can_reuse_downstream: false,
        }
    }

    async fn logging(&self, session: &mut Session, e: Option<&Error>, ctx: &mut RequestCtx) {
        // The response is complete: a kept-alive connection now waits for its next request.
        crate::connection::exchange_done(session);
        // Give concurrency slots back now rather than when Pingora drops the context.
        ctx.leases = None;
        let status = session.response_written().map_or(0, |r| r.status.as_u16());
        let req = session.req_header();
        let route: &str = ctx
            .config
            .as_ref()
            .zip(ctx.route)
            .and_then(|(c, i)| c.routes.get(i))
            .map_or("-", |r| &r.name);
        let mut status_buf = itoa_status(status);
        metrics()
            .requests
            .with_label_values(&[route, status_str(&mut status_buf)])
            .inc();
        if !ctx.config.as_ref().is_some_and(|c| c.server.access_log) {
            return;
        }
        tracing::info!(
            target: "access",
            method = %req.method,
            path = %req.uri.path(),
            status,
            route,
            upstream = ctx.upstream().map(|u| &*u.name).unwrap_or("-"),
            key_id = ctx.identity.as_ref().map(|i| i.id.as_str()).unwrap_or("-"),
            client_ip = %ctx.client_ip,
            rejected_by = ctx.rejected_by.as_deref().unwrap_or("-"),
            request_id = %ctx.request_id,
            latency_ms = ctx.start.elapsed().as_secs_f64() * 1000.0,
            error = e.map(|e| e.etype().as_str()).unwrap_or("-"),
        );
    }
}

impl Proxy {
    /// Answers a request the rules refused (429, a rule's status, or 503): `Retry-After` in
    /// whole seconds, the rules named in the body and the access log, and the RateLimit
    /// headers when the rules produced some.
    async fn refuse(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
        mut problem: Problem,
        rules: &[Arc<str>],
        retry_after: std::time::Duration,
        headers: Option<&RateLimitHeaders>,
    ) -> Result<()> {
        let secs = whole_seconds_at_least_one(retry_after);
        ctx.rejected_by = Some(rules.join(","));
        problem.violated_rules = rules.iter().map(|r| r.to_string()).collect();
        problem.retry_after = Some(secs);
        let problem = with_id(problem, ctx);
        send_problem(session, &problem, |resp| {
            resp.insert_header(http::header::RETRY_AFTER, secs.to_string())?;
            resp.insert_header("x-request-id", &ctx.request_id)?;
            match headers {
                Some(h) => h.apply(resp),
                None => Ok(()),
            }
        })
        .await
    }

    /// Sends a problem+json answer with the request id (and a WWW-Authenticate for 401s).
    async fn answer(
        &self,
        session: &mut Session,
        ctx: &RequestCtx,
        problem: &Problem,
        challenge: Option<&'static str>,
    ) -> Result<()> {
        send_problem(session, problem, |resp| {
            resp.insert_header("x-request-id", &ctx.request_id)?;
            if let Some(c) = challenge {
                resp.insert_header(http::header::WWW_AUTHENTICATE, c)?;
            }
            Ok(())
        })
        .await
    }
}

/// A status code's three digits without allocating (this runs for every request).
fn itoa_status(status: u16) -> [u8; 3] {
    let s = status.min(999);
    [
        b'0' + (s / 100) as u8,
        b'0' + (s / 10 % 10) as u8,
        b'0' + (s % 10) as u8,
    ]
}

fn status_str(buf: &mut [u8; 3]) -> &str {
    std::str::from_utf8(buf).unwrap_or("000")
}

fn with_id(mut p: Problem, ctx: &RequestCtx) -> Problem {
    p.request_id = Some(ctx.request_id.clone());
    p
}

const CHALLENGE_MISSING: &str = "Bearer realm=\"floodgate\"";
const CHALLENGE_INVALID: &str = "Bearer realm=\"floodgate\", error=\"invalid_token\"";

/// `uri` with `path` (normalized, so always a valid path) in place of its own, the query
/// kept; in origin form when `origin_form`.
fn forward_target(uri: &http::Uri, path: &str, origin_form: bool) -> http::Uri {
    let path_and_query = match uri.query() {
        Some(q) => format!("{path}?{q}"),
        None => path.to_string(),
    };
    let mut parts = uri.clone().into_parts();
    if origin_form {
        parts.scheme = None;
        parts.authority = None;
    }
    parts.path_and_query = path_and_query.parse().ok();
    // The parts came from a valid URI and the path from the normalizer; should they ever not
    // fit together, the client's own target goes upstream.
    http::Uri::from_parts(parts).unwrap_or_else(|_| uri.clone())
}

/// The request's host, normalized (`crate::normalize::host`): the target's authority when it
/// has one (absolute-form, RFC 9112 §3.2.2, or HTTP/2's `:authority`), else the Host header.
/// `Ok(None)`: no host at all (HTTP/1.0). `Err`: a host no route could name (400).
fn request_host(req: &RequestHeader) -> std::result::Result<Option<String>, String> {
    let raw = match req.uri.authority() {
        Some(a) => a.as_str(),
        // Pingora has checked that a Host header, if any, equals this authority.
        None => match absolute_form_authority(req) {
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
    crate::normalize::host(raw)
        .map(|h| Some(h.into_owned()))
        .map_err(|e| e.to_string())
}

/// The authority of an HTTP/1.1 absolute-form target (`GET http://host/x HTTP/1.1`): Pingora
/// keeps only the path in the URI and the whole target in the raw bytes.
fn absolute_form_authority(req: &RequestHeader) -> Option<&str> {
    let raw = std::str::from_utf8(req.raw_path()).ok()?;
    let (scheme, rest) = raw.split_once("://")?;
    if !scheme.eq_ignore_ascii_case("http") && !scheme.eq_ignore_ascii_case("https") {
        return None;
    }
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    Some(&rest[..end])
}
