//! The Pingora `ProxyHttp` implementation: the I/O around [`crate::request::admission::admit`], which
//! decides what each request gets. It holds no policy itself.
//!
//! Phases, in the order Pingora calls them:
//! `early_request_filter` (the head is in: off the head deadline, pipelining on) →
//! `request_filter` (admission; writes its 400/401/404/429/503 answer) →
//! `upstream_peer` (round robin, next target on retry) → `upstream_request_filter` (forwarding
//! headers, key stripped) → `response_filter` (RateLimit headers, request id) → `logging`
//! (access log; concurrency slots released when the context drops).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::prelude::*;
use pingora::proxy::{FailToProxy, ProxyHttp, Session};
use pingora::ErrorType;
use smallvec::SmallVec;

use crate::config::{Route, Upstream};
use crate::gateway::snapshot::Snapshot;
use crate::gateway::Gateway;
use crate::limiter::engine::Slots;
use crate::request::admission::{self, Next};
use crate::request::body::ReadAhead;
use crate::request::forwarding::{retry_after_proxy_error, Forwarded, ProxyError, ProxyRetry};
use crate::rules::KeyPart;
use crate::upstream::{Pool, TargetInfo};
use crate::wire::auth::Identity;
use crate::wire::client::RequestId;
use crate::wire::header_names as names;
use crate::wire::response::{Answer, Problem, RateLimitHeaders};

/// The proxy service.
pub struct Proxy {
    /// Shared state.
    pub gateway: Arc<Gateway>,
}

/// Per-request state, carried across phases.
pub struct RequestCtx {
    /// When admission began (kept only for the access log's latency).
    start: Option<Instant>,
    /// The config the request started with: a reload mid-request does not change its route.
    config: Option<Snapshot>,
    route: Option<usize>,
    request_id: RequestId,
    identity: Option<Arc<Identity>>,
    client_ip: IpAddr,
    /// The connection's peer (what `X-Forwarded-For` gets appended).
    peer: IpAddr,
    tls: bool,
    headers: Option<RateLimitHeaders>,
    /// The answer admission gave instead of forwarding (400, 401, 404, 429, 503), kept for
    /// the access log's `rejected_by`: the rules that refused the request, if any.
    refusal: Option<Box<Answer>>,
    /// The target to forward with the normalized path, when it differs from the client's.
    forward_target: Option<http::Uri>,
    /// The Host to forward when the client sent an absolute-form target.
    forward_host: Option<String>,
    /// The target the route's rewrite made: what the upstream receives instead.
    rewritten: Option<http::Uri>,
    /// The request's `Origin`, when its route answers CORS and allows it: every answer gets
    /// the CORS headers for it.
    cors_origin: Option<http::HeaderValue>,
    attempts: usize,
    upstream_start: Option<Instant>,
    /// The upstream target of the current attempt, counted in its in-flight requests until
    /// the next attempt replaces it or the context drops.
    target: Option<Attempt>,
    /// Targets this request has tried: a retry always goes to another (inline: most requests
    /// try one).
    tried: SmallVec<[SocketAddr; 2]>,
    /// When the upstream's total `timeout` runs out.
    deadline: Option<Instant>,
    /// Whether the upstream's response header arrived (no retry after that).
    responded: bool,
    /// Set when no target was available: the 503's Retry-After.
    no_healthy: Option<u64>,
    /// Concurrency slots: dropping the context releases them, however the exchange ends.
    /// Boxed, as are `cost` and `slow`: most requests have none, and the context sits inline in
    /// Pingora's per-request future, whose size every request allocates.
    slots: Option<Box<Slots>>,
    /// Reads `cost_from` rules' true costs from the upstream's response as it streams by.
    cost: Option<Box<crate::request::response_cost::CostReader>>,
    /// The request body's deadline and what was read ahead of the upstream.
    body: crate::request::body::Body,
    /// Set when a `mode = "slow"` rule slowed the request: the pace of its bodies.
    slow: Option<Box<crate::request::throttle::Throttle>>,
    /// The request's slot at a `[upstreams.protect]` upstream, held for the whole exchange
    /// (retries included); dropping it gives the slot to the next waiter.
    protect: Option<crate::upstream::protect::Permit>,
    /// Set when the client left while a `[upstreams.protect]` slot was held and the upstream's
    /// answer was read to its end after it (the access log's `error`).
    client_left: Option<&'static str>,
    /// The request's spans, when `[tracing]` is on (`None` otherwise: nothing is built).
    trace: Option<crate::telemetry::RequestTrace>,
    /// Counts the request as in flight for graceful shutdown; last, so it drops last.
    _in_flight: crate::shutdown::InFlightGuard,
}

impl RequestCtx {
    /// The matched route, in the config the request started with.
    fn route(&self) -> Option<&Route> {
        self.config.as_ref()?.routes.get(self.route?)
    }

    fn upstream(&self) -> Option<&Arc<Upstream>> {
        route_upstream(&self.config, self.route)
    }
}

/// The upstream of route `route` in `config`: [`RequestCtx::upstream`] from the two fields
/// alone, for a caller that sets other fields of the context while it holds the upstream.
fn route_upstream(config: &Option<Snapshot>, route: Option<usize>) -> Option<&Arc<Upstream>> {
    Some(&config.as_ref()?.routes.get(route?)?.upstream)
}

/// The pool serving route `route`'s upstream, borrowed from the thread's config handle: a clone
/// of the pool's `Arc` per request would write its count from every thread.
fn route_pool(config: &Option<Snapshot>, route: Option<usize>) -> Option<&Arc<Pool>> {
    config.as_ref()?.route_pool(route?)
}

#[async_trait]
impl ProxyHttp for Proxy {
    type CTX = RequestCtx;

    /// No downstream modules. Pingora's default is a response-compression module, disabled,
    /// which still costs every request a module context (two allocations) and two boxed
    /// filter calls that return at once; floodgate compresses no response.
    fn init_downstream_modules(&self, _modules: &mut pingora::modules::http::HttpModules) {}

    fn new_ctx(&self) -> RequestCtx {
        RequestCtx {
            start: None,
            config: None,
            route: None,
            request_id: RequestId::default(),
            identity: None,
            client_ip: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            peer: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            tls: false,
            headers: None,
            refusal: None,
            forward_target: None,
            forward_host: None,
            rewritten: None,
            cors_origin: None,
            attempts: 0,
            upstream_start: None,
            target: None,
            tried: SmallVec::new(),
            deadline: None,
            responded: false,
            no_healthy: None,
            slots: None,
            cost: None,
            body: crate::request::body::Body::default(),
            slow: None,
            protect: None,
            client_left: None,
            trace: None,
            _in_flight: crate::shutdown::requests().enter_static(),
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
        let cfg = self.gateway.snapshot();
        if cfg.server.access_log {
            ctx.start = Some(Instant::now());
        }
        ctx.config = Some(cfg.clone());
        ctx.request_id = RequestId::of(&session.req_header().headers);
        let peer = session
            .client_addr()
            .and_then(|a| a.as_inet())
            .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |a| a.ip());
        ctx.peer = peer;
        ctx.tls = session.digest().is_some_and(|d| d.ssl_digest.is_some());
        let req = session.req_header();
        if let Some(settings) = &cfg.tracing {
            ctx.trace = crate::telemetry::RequestTrace::start(
                settings,
                &cfg.server.trusted_proxies,
                peer,
                &req.method,
                req.uri.path(),
                &req.headers,
                ctx.tls,
            );
        }
        let request = admission::Request {
            method: &req.method,
            uri: &req.uri,
            raw_target: req.raw_path(),
            headers: &req.headers,
            peer,
            request_id: ctx.request_id.as_str(),
            traced: ctx.trace.as_ref().is_some_and(|t| t.is_recording()),
        };
        let admitted = admission::admit(&cfg, &self.gateway.limiter, &request).await;
        if let Some(trace) = &mut ctx.trace {
            let route = admitted.route.and_then(|i| cfg.routes.get(i));
            let key_id = admitted.identity.as_deref().map(|i| i.id.as_str());
            trace.identified(route.map(|r| &r.name), admitted.client_ip, key_id);
            if let Some(d) = &admitted.decision {
                trace.admission(d);
            }
        }
        ctx.client_ip = admitted.client_ip;
        ctx.route = admitted.route;
        ctx.identity = admitted.identity;
        ctx.forward_target = admitted.target;
        ctx.forward_host = admitted.host;
        ctx.rewritten = admitted.rewritten;
        ctx.cors_origin = admitted
            .route
            .and_then(|i| cfg.routes.get(i)?.edges.cors.as_ref())
            .and_then(|c| c.allowed_origin(&session.req_header().headers));
        ctx.slots = admitted.slots.map(Box::new);
        ctx.slow = admitted
            .slowed
            .map(|pace| Box::new(crate::request::throttle::Throttle::new(pace)));
        match admitted.next {
            Next::Forward { delay, ratelimit } => {
                ctx.headers = ratelimit;
                if !delay.is_zero() {
                    tokio::time::sleep(delay).await;
                }
                // The body is read (up to a bound) before any upstream is asked: a slow body
                // holds no upstream connection.
                let timeout = cfg.server.connections.body_timeout;
                if let Some(slow) = &mut ctx.slow {
                    slow.body_deadline = Some(Instant::now() + timeout);
                }
                // A shed request's body was read (its connection can take the next request, as
                // after any other early answer: a shed costs the client a retry, not a new
                // handshake); a body that did not arrive in time leaves the stream unusable.
                let (problem, close) = match ctx.body.read_ahead(session, timeout).await? {
                    ReadAhead::Forward => match take_turn(ctx, session).await? {
                        None => return Ok(false),
                        Some(shed) => (shed, false),
                    },
                    ReadAhead::TimedOut => {
                        count_body_timeout();
                        (Problem::body_timeout(), true)
                    }
                    ReadAhead::TooManyWaiting => (
                        Problem::too_many_uploads(
                            crate::request::body::MAX_WAITING_PER_H2_CONNECTION,
                        ),
                        true,
                    ),
                };
                let mut answer = problem.answer();
                answer.close = close;
                Box::pin(self.send(session, ctx, &mut answer)).await?;
                Ok(true)
            }
            Next::Answer(mut answer) => {
                // Boxed: Pingora's write futures are large, and inline they would make every
                // request's `request_filter` future (allocated and moved per request) larger.
                Box::pin(self.send(session, ctx, &mut answer)).await?;
                // Only admission's answers name rules that refused the request: kept for the
                // access log, which joins their names if it writes a line.
                ctx.refusal = Some(answer);
                Ok(true)
            }
            Next::Preflight(preflight) => {
                Box::pin(self.send_preflight(session, ctx, *preflight)).await?;
                Ok(true)
            }
        }
    }

    async fn upstream_peer(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> Result<Box<HttpPeer>> {
        // Borrowed through the context's fields (not `ctx.upstream()`, which would borrow the
        // whole context), so that the context's other fields can still be set below without
        // a clone of the upstream's `Arc`: its reference count is written by every thread.
        let upstream = route_upstream(&ctx.config, ctx.route)
            .ok_or_else(|| Error::explain(ErrorType::InternalError, "no route selected"))?;
        let settings = &upstream.settings;
        let now = Instant::now();
        let deadline = *ctx.deadline.get_or_insert(now + settings.timeout);
        let budget = deadline.saturating_duration_since(now);
        if budget.is_zero() {
            return Err(Error::explain(
                ErrorType::ReadTimedout,
                "the upstream's total timeout ran out",
            ));
        }
        let pool = route_pool(&ctx.config, ctx.route)
            .ok_or_else(|| Error::explain(ErrorType::InternalError, "no route selected"))?;
        let key = if settings.balance == crate::upstream::Balance::Consistent {
            hash_key(ctx, session.req_header(), &settings.hash_key)
        } else {
            Vec::new()
        };
        let Some(target) = pool.select(&key, &ctx.tried) else {
            if ctx.tried.is_empty() {
                ctx.no_healthy = Some(pool.retry_after());
                return Err(Error::explain(
                    ErrorType::HTTPStatus(503),
                    "no healthy upstream target",
                ));
            }
            return Err(Error::explain(
                ErrorType::ConnectRefused,
                "no other upstream target to retry on",
            )
            .into_up());
        };
        ctx.tried.push(target.addr);
        ctx.responded = false;
        let mut peer = crate::upstream::tls::peer(settings, &target, budget, pool.group_key);
        if session.is_upgrade_req() {
            // A tunnel-to-be: its reads are timed by tunnel_timeout, not read_timeout and the
            // exchange's total timeout (a WebSocket lives as long as it is used).
            peer.options.read_timeout = Some(settings.tunnel_timeout);
        }
        if let Some(slow) = &ctx.slow {
            // Read the upstream no faster, and in no bigger pieces, than the client is served.
            crate::request::throttle::narrow(&mut peer, slow.slowed.rate);
        }
        ctx.target = Some(Attempt::enter(target));
        Ok(Box::new(peer))
    }

    fn fail_to_connect(
        &self,
        session: &mut Session,
        _peer: &HttpPeer,
        ctx: &mut RequestCtx,
        mut e: Box<Error>,
    ) -> Box<Error> {
        // A TLS handshake error comes without a source: it is the upstream's (502, not 500).
        e.as_up();
        ctx.attempts += 1;
        let Some(upstream) = ctx.upstream().cloned() else {
            return e;
        };
        if let Some(t) = &ctx.target {
            t.count(&upstream.name, None, None);
            upstream.pool().failed(t);
            if matches!(
                e.etype(),
                ErrorType::TLSHandshakeFailure
                    | ErrorType::TLSHandshakeTimedout
                    | ErrorType::InvalidCert
                    | ErrorType::HandshakeError
            ) {
                // The reason is rustls' (unknown issuer, expired, name mismatch); it carries
                // nothing of the client's request.
                tracing::warn!(
                    upstream = %upstream.name,
                    target = %t.name,
                    addr = %t.addr,
                    reason = %e,
                    "TLS to upstream target failed"
                );
            }
        }
        if crate::request::forwarding::retry_after_connect_failure(
            session.req_header().method.is_idempotent(),
            ctx.attempts,
            upstream.settings.retries,
            upstream.pool().has_other(&ctx.tried),
        ) {
            e.set_retry(true);
        }
        e
    }

    fn error_while_proxy(
        &self,
        peer: &HttpPeer,
        session: &mut Session,
        e: Box<Error>,
        ctx: &mut RequestCtx,
        client_reused: bool,
    ) -> Box<Error> {
        let mut e = e.more_context(format!("Peer: {peer}"));
        let upstream = ctx.upstream().cloned();
        let decision = retry_after_proxy_error(ProxyError {
            replayable: session.req_header().method.is_idempotent()
                && !session.as_ref().retry_buffer_truncated(),
            reused: client_reused,
            responded: ctx.responded,
            etype: e.etype(),
            attempts: ctx.attempts,
            retries: upstream.as_ref().map_or(0, |u| u.settings.retries),
            other_target: upstream
                .as_ref()
                .is_some_and(|u| u.pool().has_other(&ctx.tried)),
        });
        match decision {
            ProxyRetry::SameTarget => {
                e.retry.decide_reuse(true);
                ctx.tried.pop();
                return e;
            }
            ProxyRetry::Another => {
                ctx.attempts += 1;
                e.set_retry(true);
            }
            ProxyRetry::No => e.set_retry(false),
        }
        // A client that went away is not the target's failure: counting it (and ejecting the
        // target on it) would let clients that abort their requests take healthy targets out.
        let clients_fault = matches!(e.esource(), pingora::ErrorSource::Downstream);
        if let (Some(u), Some(t), false) = (&upstream, &ctx.target, clients_fault) {
            if !ctx.responded {
                t.count(&u.name, None, None);
            }
            u.pool().failed(t);
        }
        e
    }

    async fn upstream_request_filter(
        &self,
        _session: &mut Session,
        upstream_request: &mut RequestHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        let Some(cfg) = ctx.config.clone() else {
            return Ok(());
        };
        // First: it joins repeated X-Forwarded-For lines that `forwarding::apply` appends to.
        crate::wire::header_policy::for_upstream(
            upstream_request,
            cfg.server.headers_with_underscores,
        );
        if ctx.body.continued() {
            upstream_request.remove_header(&http::header::EXPECT);
        }
        ctx.upstream_start = Some(Instant::now());
        let reads_keys = ctx.route().is_some_and(|r| r.auth.reads_keys());
        // A token whose issuer does not forward it: removed from where it came.
        let strip_token = ctx
            .identity
            .as_deref()
            .and_then(|i| i.claims.as_deref())
            .filter(|t| !t.forward)
            .and_then(|t| cfg.auth.tokens.issuers.iter().find(|i| i.name == t.issuer))
            .map(|i| &i.carrier);
        let edges = ctx.route().map(|r| &r.edges);
        let forwarded = Forwarded {
            peer: ctx.peer,
            tls: ctx.tls,
            request_id: &ctx.request_id,
            identity: ctx.identity.as_deref(),
            target: ctx.rewritten.as_ref().or(ctx.forward_target.as_ref()),
            host: ctx.forward_host.as_deref(),
            host_header: edges.and_then(|e| e.host_rewrite.as_deref()).or_else(|| {
                ctx.upstream()
                    .and_then(|u| u.settings.host_header.as_deref())
            }),
            strip_key: (!cfg.auth.forward_key && reads_keys).then_some(&cfg.auth.header),
            strip_token,
            // A route's header edits, and a trace's `traceparent` and `tracestate` (below).
            more_headers: edges
                .and_then(|e| e.request_headers.as_deref())
                .map_or(0, |h| h.added())
                + if ctx.trace.is_some() { 2 } else { 0 },
        };
        crate::request::forwarding::apply(upstream_request, &forwarded)?;
        if let Some(edits) = edges.and_then(|e| e.request_headers.as_deref()) {
            edits.apply_request(upstream_request, &vars(ctx))?;
        }
        let upstream = ctx.trace.as_ref().and_then(|_| ctx.upstream().cloned());
        if let (Some(trace), Some(t), Some(u)) = (&mut ctx.trace, &ctx.target, upstream) {
            let up = crate::telemetry::Upstream {
                name: &u.name,
                addr: t.addr,
                attempt: ctx.tried.len().saturating_sub(1),
            };
            trace.upstream_request(up, upstream_request);
        }
        Ok(())
    }

    async fn upstream_response_filter(
        &self,
        session: &mut Session,
        upstream_response: &mut ResponseHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        ctx.responded = true;
        if let Some(trace) = &mut ctx.trace {
            trace.upstream_status(upstream_response.status.as_u16());
        }
        crate::request::response_cost::settle_on_status(
            ctx.slots.as_deref_mut(),
            upstream_response.status,
        )
        .await;
        ctx.cost = crate::request::response_cost::CostReader::start(
            ctx.slots.as_deref_mut(),
            upstream_response,
        )
        .map(Box::new);
        if upstream_response.status == http::StatusCode::SWITCHING_PROTOCOLS {
            // The client's side of the tunnel gets the same idle timeout as the upstream's.
            if let Some(u) = ctx.upstream() {
                let idle = u.settings.tunnel_timeout;
                session.set_read_timeout(Some(idle));
            }
        }
        let took = ctx.upstream_start.map(|start| start.elapsed());
        if let (Some(permit), Some(took)) = (ctx.protect.as_mut(), took) {
            // A 5xx is a failure, not a latency: an upstream answering 503 at once above its
            // capacity must not look fast to the limit.
            if upstream_response.status.is_server_error() {
                permit.fail(Some(took));
            } else {
                permit.sample(took);
            }
        }
        if let (Some(took), Some(upstream), Some(pool)) =
            (took, ctx.upstream(), route_pool(&ctx.config, ctx.route))
        {
            pool.duration.observe(took.as_secs_f64());
            if let Some(t) = &ctx.target {
                let status = upstream_response.status.as_u16();
                t.count(&upstream.name, Some(status), Some(took));
                if status >= 500 {
                    pool.failed(t);
                } else {
                    pool.succeeded(t);
                }
            }
        }
        Ok(())
    }

    async fn request_body_filter(
        &self,
        session: &mut Session,
        body: &mut Option<bytes::Bytes>,
        end_of_stream: bool,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        ctx.body.take_held(body);
        if session.was_upgraded() {
            // Tunnel bytes, not a body: only tunnel_timeout applies.
            return Ok(());
        }
        if let Some(slow) = &mut ctx.slow {
            // The client's next piece is not read while this one waits: backpressure. A wait
            // ends at the body's deadline at the latest, which the check below then finds.
            let len = body.as_ref().map_or(0, bytes::Bytes::len);
            let now = Instant::now();
            match slow
                .request
                .wait(len, now, slow.body_deadline, end_of_stream)
            {
                crate::request::throttle::Wait::For(d)
                | crate::request::throttle::Wait::UntilDeadline(d) => {
                    if !d.is_zero() {
                        tokio::time::sleep(d).await;
                    }
                }
                crate::request::throttle::Wait::Cut => {
                    return Err(Error::explain(
                        ErrorType::ReadTimedout,
                        "the slowed request body cannot arrive within body_timeout",
                    )
                    .into_down());
                }
            }
        }
        if !end_of_stream {
            if ctx.body.late() {
                return Err(Error::explain(
                    ErrorType::ReadTimedout,
                    "the request body did not arrive within body_timeout",
                )
                .into_down());
            }
            // The next read waits no longer than the body's deadline allows.
            ctx.body.set_read_timeout(session);
        }
        Ok(())
    }

    fn upstream_response_body_filter(
        &self,
        session: &mut Session,
        body: &mut Option<bytes::Bytes>,
        end_of_stream: bool,
        ctx: &mut RequestCtx,
    ) -> Result<Option<std::time::Duration>> {
        if let Some(reader) = ctx.cost.as_mut() {
            if let Some(piece) = body.as_deref() {
                reader.feed(piece);
            }
            if end_of_stream {
                reader.finish();
            }
        }
        // The total `timeout` covers the whole body; each read is also capped by read_timeout.
        // The last piece has arrived in time whatever the clock says now. A tunnel (after a
        // 101) has no end to wait for: only tunnel_timeout applies to it.
        if !end_of_stream
            && ctx.deadline.is_some_and(|d| Instant::now() > d)
            && !session.was_upgraded()
        {
            return Err(Error::explain(
                ErrorType::ReadTimedout,
                "the upstream's total timeout ran out",
            ));
        }
        Ok(None)
    }

    fn response_body_filter(
        &self,
        session: &mut Session,
        body: &mut Option<bytes::Bytes>,
        end_of_stream: bool,
        ctx: &mut RequestCtx,
    ) -> Result<Option<std::time::Duration>> {
        match &mut ctx.slow {
            Some(slow) if !session.was_upgraded() => {
                let len = body.as_ref().map_or(0, bytes::Bytes::len);
                crate::request::throttle::response_delay(
                    &mut slow.response,
                    len,
                    ctx.deadline,
                    end_of_stream,
                )
            }
            _ => Ok(None),
        }
    }

    async fn response_filter(
        &self,
        _session: &mut Session,
        resp: &mut ResponseHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        // The final response takes the fields' values; an informational one (100, 101)
        // before it gets a copy.
        let headers = if resp.status.is_informational() {
            ctx.headers.clone()
        } else {
            ctx.headers.take()
        };
        let ratelimit = headers.as_ref().map_or(0, RateLimitHeaders::count);
        resp.reserve_headers(1 + ratelimit + decoration_room(ctx))?;
        names::X_REQUEST_ID.set_response(resp, ctx.request_id.header_value().clone())?;
        if let Some(h) = headers {
            h.apply(resp)?;
        }
        if resp.status.is_informational() {
            return Ok(());
        }
        decorate(ctx, resp)
    }

    /// While the request holds a `[upstreams.protect]` slot, a client that leaves mid-exchange
    /// does not cut the exchange short: the upstream (which, like most backends, keeps working
    /// on a request whose connection closed) is still busy with it, so its answer is read to
    /// the end and discarded, bounded by the upstream's `read_timeout`, and only then is the
    /// slot given back. Without protect Pingora's default stands: the upstream connection is
    /// closed at once.
    fn finish_upstream_after_client_left(
        &self,
        _session: &Session,
        e: &Error,
        ctx: &mut RequestCtx,
    ) -> bool {
        if ctx.protect.is_none() {
            return false;
        }
        ctx.client_left = Some(e.etype().as_str());
        true
    }

    async fn fail_to_proxy(
        &self,
        session: &mut Session,
        e: &Error,
        ctx: &mut RequestCtx,
    ) -> FailToProxy {
        let code = crate::request::forwarding::error_status(
            e.etype(),
            e.esource(),
            session.was_upgraded(),
        );
        if matches!(code, 502 | 504) {
            // The upstream failed the exchange (connect error, reset, timeout): a failure for
            // `[upstreams.protect]`'s limit, unless its response header was already counted.
            if let Some(permit) = ctx.protect.as_mut() {
                permit.fail(ctx.upstream_start.map(|start| start.elapsed()));
            }
        }
        if code > 0 {
            let name = ctx.upstream().map(|u| &*u.name).unwrap_or_default();
            let mut problem = match (code, ctx.no_healthy) {
                (503, Some(retry_after)) => Problem::no_healthy_upstream(name, retry_after),
                (502 | 504, _) => Problem::upstream(code, name),
                (400, _) => Problem::bad_request("the request could not be read"),
                (408, _) => {
                    count_body_timeout();
                    Problem::body_timeout()
                }
                _ => Problem::internal(),
            };
            problem.request_id = Some(ctx.request_id.as_str().to_owned());
            let mut answer = problem.answer();
            // Pingora will not reuse this connection: say so, or a keep-alive client may send
            // its next request into a socket that is being closed.
            answer.close = true;
            if let Err(err) = self.send(session, ctx, &mut answer).await {
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
        // The exchange is over (also when the client left mid-stream): cost_from rules are
        // charged what was read.
        crate::request::response_cost::settle_costs(
            ctx.slots.as_deref_mut(),
            ctx.cost.take().map(|c| *c),
        )
        .await;
        // Give concurrency slots back now rather than when Pingora drops the context.
        ctx.slots = None;
        ctx.protect = None;
        let status = session.response_written().map_or(0, |r| r.status.as_u16());
        let error = e.map(|e| e.etype().as_str()).or(ctx.client_left);
        let trace_id = match ctx.trace.take() {
            Some(trace) => {
                let id = trace.trace_id();
                trace.finish(status, error);
                id
            }
            None => [0; 16],
        };
        let req = session.req_header();
        let route = ctx.route();
        match route {
            Some(r) => r.requests.inc(&r.name, status),
            None => NO_ROUTE.inc("-", status),
        }
        if !ctx.config.as_ref().is_some_and(|c| c.server.access_log) {
            return;
        }
        crate::request::access_log::record(|| crate::request::access_log::AccessLine {
            method: req.method.clone(),
            path: req.uri.path().to_owned(),
            upstream_path: ctx.rewritten.as_ref().map(|u| u.path().to_owned()),
            status,
            route: route.map_or_else(|| NO_ROUTE_NAME.clone(), |r| r.name.clone()),
            upstream: ctx.upstream().map(|u| u.name.clone()),
            identity: ctx.identity.clone(),
            client_ip: ctx.client_ip,
            rejected_by: match &ctx.slow {
                Some(t) => Some(t.slowed.rules.clone()),
                None => ctx.refusal.as_ref().and_then(|a| a.rejected_by()),
            },
            slowed: ctx.slow.is_some(),
            request_id: ctx.request_id.clone(),
            trace_id,
            latency_ms: ctx
                .start
                .map_or(0.0, |s| s.elapsed().as_secs_f64() * 1000.0),
            error: error.unwrap_or("-"),
        });
    }
}

impl Proxy {
    /// Writes an answer floodgate makes itself (a problem+json document with its headers, and
    /// the route's response edits and CORS headers).
    async fn send(
        &self,
        session: &mut Session,
        ctx: &RequestCtx,
        answer: &mut Answer,
    ) -> Result<()> {
        if answer.close {
            session.set_keepalive(None);
        }
        let body = answer.problem.to_body();
        let mut header = answer.header(ctx.request_id.header_value(), body.len())?;
        header.reserve_headers(decoration_room(ctx))?;
        decorate(ctx, &mut header)?;
        session
            .write_response_header(Box::new(header), false)
            .await?;
        session.write_response_body(Some(body), true).await?;
        Ok(())
    }

    /// Answers a CORS preflight: `204`, its CORS headers, the RateLimit fields of the rules on
    /// `OPTIONS` that counted it, the route's response edits.
    async fn send_preflight(
        &self,
        session: &mut Session,
        ctx: &RequestCtx,
        preflight: crate::request::admission::Preflight,
    ) -> Result<()> {
        let ratelimit = preflight
            .ratelimit
            .as_ref()
            .map_or(0, RateLimitHeaders::count);
        let mut resp =
            ResponseHeader::build_no_case(204, Some(2 + preflight.headers.len() + ratelimit))?;
        names::X_REQUEST_ID.set_response(&mut resp, ctx.request_id.header_value().clone())?;
        for (name, value) in preflight.headers {
            resp.insert_header(name, value)?;
        }
        if let Some(h) = preflight.ratelimit {
            h.apply(&mut resp)?;
        }
        if let Some(edits) = ctx
            .route()
            .and_then(|r| r.edges.response_headers.as_deref())
        {
            resp.reserve_headers(edits.added())?;
            edits.apply_response(&mut resp, &vars(ctx))?;
        }
        session.write_response_header(Box::new(resp), true).await?;
        Ok(())
    }
}

/// How many headers [`decorate`] may add to an answer (the room reserved with the others).
fn decoration_room(ctx: &RequestCtx) -> usize {
    let Some(edges) = ctx.route().map(|r| &r.edges) else {
        return 0;
    };
    let edits = edges.response_headers.as_deref().map_or(0, |h| h.added());
    let cors = if edges.cors.is_some() {
        crate::wire::cors::Cors::ADDED
    } else {
        0
    };
    edits + cors
}

/// The route's response edits and, for an allowed origin, the CORS headers, on an answer
/// (the upstream's or floodgate's own; room made by [`decoration_room`]). Nothing is looked
/// at for a route without them.
fn decorate(ctx: &RequestCtx, resp: &mut ResponseHeader) -> Result<()> {
    let Some(edges) = ctx.route().map(|r| &r.edges) else {
        return Ok(());
    };
    if let Some(edits) = edges.response_headers.as_deref() {
        edits.apply_response(resp, &vars(ctx))?;
    }
    if let Some(cors) = edges.cors.as_deref() {
        match &ctx.cors_origin {
            Some(origin) => cors.decorate(resp, origin)?,
            None => crate::wire::cors::not_allowed(resp)?,
        }
    }
    Ok(())
}

/// What header edits' variables are filled in from.
fn vars(ctx: &RequestCtx) -> crate::wire::header_edits::Vars<'_> {
    crate::wire::header_edits::Vars {
        identity: ctx.identity.as_deref(),
        client_ip: ctx.client_ip,
        request_id: ctx.request_id.as_str(),
        route: ctx.route().map_or("", |r| &r.name),
    }
}

/// Counts a connection closed because its request body did not arrive in time.
fn count_body_timeout() {
    crate::metrics::metrics()
        .connection_timeouts
        .with_label_values(&["body"])
        .inc();
}

/// The access log's route for a request no route matched.
static NO_ROUTE_NAME: std::sync::LazyLock<Arc<str>> = std::sync::LazyLock::new(|| Arc::from("-"));

/// `floodgate_requests_total{route="-"}`: requests no route matched.
static NO_ROUTE: crate::metrics::RouteRequests = crate::metrics::RouteRequests::new();

/// One attempt's target, counted in the target's in-flight requests (least_requests,
/// /upstreams) until dropped (the next attempt replaces it; the context's end drops it). It
/// holds the target's `Arc` the attempt was chosen with: a second handle for the count would
/// move the `Arc`'s shared reference count twice more per request.
struct Attempt(Arc<TargetInfo>);

impl Attempt {
    fn enter(target: Arc<TargetInfo>) -> Attempt {
        target.state.in_flight.inc_by(1);
        Attempt(target)
    }
}

impl std::ops::Deref for Attempt {
    type Target = Arc<TargetInfo>;

    fn deref(&self) -> &Arc<TargetInfo> {
        &self.0
    }
}

impl Drop for Attempt {
    fn drop(&mut self) {
        self.0.state.in_flight.dec_by(1);
    }
}

/// The consistent-hashing key of a request, read by the same key-part reader as counters
/// ([`crate::rules::key`]): the normalized path (a re-spelled path hashes the same), decoded
/// query values, capped values.
fn hash_key(ctx: &RequestCtx, req: &RequestHeader, parts: &[KeyPart]) -> Vec<u8> {
    crate::rules::key::hash_key(parts, &view(ctx, req))
}

/// `[upstreams.protect]`: a turn at the upstream, or the 503 that refuses one. The rules have
/// charged the request already, as refundable reservations (see admission): a shed request
/// was never admitted, so every rule's charge is given back, and its concurrency slots are
/// freed at once. A request whose client goes away while it waits leaves the queue at once,
/// charged nothing, and ends with an error (nothing to answer, the connection is gone).
async fn take_turn(ctx: &mut RequestCtx, session: &mut Session) -> Result<Option<Problem>> {
    use crate::request::forwarding::{self, Entry, Turn};
    let Some(upstream) = ctx.upstream() else {
        return Ok(None);
    };
    // Without `[upstreams.protect]` (the usual case) this returns here, without a clone of
    // the upstream's `Arc`: its count is written by every thread's requests.
    let Some(settings) = upstream.settings.protect.as_ref() else {
        return Ok(None);
    };
    let upstream = upstream.clone();
    // The tenant counts on the fast path too: a tenant's slots count against its share.
    let tenant = crate::upstream::protect::tenant(settings, &view(ctx, session.req_header()));
    let turn = match forwarding::enter(&upstream, tenant) {
        Entry::Unguarded => Turn::Unguarded,
        Entry::Go(permit) => Turn::Go(permit),
        Entry::Queue(guard) => {
            forwarding::queue(&upstream, settings, &guard, tenant, client_gone(session)).await
        }
    };
    match turn {
        Turn::Unguarded => Ok(None),
        Turn::Go(permit) => {
            ctx.protect = Some(permit);
            Ok(None)
        }
        Turn::Shed(mut problem) => {
            refund_unadmitted(ctx).await;
            problem.request_id = Some(ctx.request_id.as_str().to_owned());
            Ok(Some(*problem))
        }
        Turn::Left => {
            refund_unadmitted(ctx).await;
            Error::e_explain(
                ErrorType::ConnectionClosed,
                "the client went away while its request waited for an upstream slot",
            )
        }
    }
}

/// What the rules charged a request that was never admitted, given back; its concurrency
/// slots freed.
async fn refund_unadmitted(ctx: &mut RequestCtx) {
    if let Some(slots) = ctx.slots.as_mut() {
        slots.reservations().refund_all().await;
    }
    ctx.slots = None;
}

/// Completes when the client of `session` is gone (its connection closed or reset, its HTTP/2
/// stream reset), so that a request waiting for an upstream slot stops waiting. Only a request
/// whose body has been read whole can be watched without taking body bytes from the stream:
/// for any other this never completes, and the wait ends as before (a turn or a shed). A
/// pipelined next request's bytes are kept for it, as Pingora keeps them while proxying.
async fn client_gone(session: &mut Session) {
    let downstream = session.as_downstream_mut();
    if downstream.is_body_done() && downstream.read_body_or_idle(true).await.is_err() {
        return;
    }
    std::future::pending::<()>().await
}

/// What key parts read of a request on its way upstream (the normalized target).
fn view<'a>(ctx: &'a RequestCtx, req: &'a RequestHeader) -> crate::rules::RequestView<'a> {
    let uri = ctx.forward_target.as_ref().unwrap_or(&req.uri);
    crate::rules::RequestView {
        route: ctx.route().map_or("", |r| &r.name),
        case_sensitive: ctx.route().is_none_or(|r| r.case_sensitive),
        method: &req.method,
        path: uri.path(),
        query: uri.query(),
        host: None,
        headers: &req.headers,
        ip: ctx.client_ip,
        identity: ctx.identity.as_deref(),
    }
}
