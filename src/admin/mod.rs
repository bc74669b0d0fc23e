//! The admin listener: health, readiness, metrics, rule introspection, top clients, reload and
//! the dashboard.
//!
//! It listens on `server.admin_listen` (loopback by default). Before any endpoint but
//! `/healthz`, [`guard`] refuses a `Host` it does not answer for (421: DNS rebinding) and a
//! state-changing request a browser sent for another site (403: cross-site forms). When an
//! admin token is set every endpoint but `/healthz`, `/` (the page, which holds no data) and
//! the bare `/readyz` status needs `Authorization: Bearer <token>`, compared in constant time.

mod guard;
mod usage;

use std::sync::Arc;

use async_trait::async_trait;
use http::{Response, StatusCode};
use pingora::apps::http_app::ServeHttp;
use pingora::protocols::http::ServerSession;
use subtle::ConstantTimeEq;

use crate::config::Config;
use crate::describe;
use crate::gateway::{Gateway, ReloadStatus};
use crate::metrics::metrics;
use crate::top::{top, By, TopList, Window};
use crate::wire::response::{Problem, PROBLEM_JSON};

/// The admin HTTP application.
pub struct Admin {
    /// Shared gateway state.
    pub gateway: Arc<Gateway>,
}

#[async_trait]
impl ServeHttp for Admin {
    async fn response(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        let cfg = self.gateway.config.load();
        if let Some(answer) = gate(session.req_header(), &cfg, &self.gateway) {
            return answer;
        }
        self.route(session, &cfg).await
    }
}

/// What the admin listener answers before any endpoint: liveness to anyone; then the Host
/// and cross-site guards, the dashboard page (which holds no data) and the token. `None`:
/// the request may go on to its endpoint.
fn gate(
    req: &pingora::http::RequestHeader,
    cfg: &Config,
    gateway: &Gateway,
) -> Option<Response<Vec<u8>>> {
    let path = req.uri.path();
    let method = &req.method;
    if path == "/healthz" {
        // Says only "ok", to anyone: liveness probes and `docker HEALTHCHECK` send whatever
        // Host they like.
        return Some(text(
            StatusCode::OK,
            "text/plain; charset=utf-8",
            b"ok\n".to_vec(),
        ));
    }
    // A Host that is not text is no host name: refused like a foreign one.
    let host = match req.headers.get(http::header::HOST) {
        Some(h) => Some(h.to_str().unwrap_or("")),
        None => req.uri.authority().map(|a| a.as_str()),
    };
    if !guard::host_allowed(host, &cfg.server.admin_hosts) {
        return Some(misdirected(host.unwrap_or("")));
    }
    if let Some(why) = guard::cross_site(method, &req.headers, host) {
        return Some(cross_site(&why));
    }
    if path == "/" && method == http::Method::GET {
        // The page holds no data: it asks for the token itself and sends it with every
        // call it makes, so a browser (which cannot add a Bearer header to a navigation)
        // can load it.
        return Some(dashboard());
    }
    let token = cfg.server.admin_token.as_ref()?;
    let authorization = req.headers.get(http::header::AUTHORIZATION);
    if authorization.is_none() && method == http::Method::GET && path == "/readyz" {
        // A readiness probe (the kubelet's, a load balancer's) cannot send a token: it gets
        // the status alone, the details need the token.
        let (status, word) = readiness(gateway);
        return Some(json(status, &serde_json::json!({ "status": word })));
    }
    let presented = authorization
        .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "))
        .unwrap_or_default();
    if bool::from(presented.ct_eq(token.as_bytes())) {
        return None;
    }
    let p = Problem::new(
        "urn:floodgate:problem:unauthorized",
        "Unauthorized",
        401,
        "the admin API needs Authorization: Bearer <admin_token>",
    );
    let mut resp = problem(p);
    resp.headers_mut().insert(
        http::header::WWW_AUTHENTICATE,
        http::HeaderValue::from_static("Bearer realm=\"floodgate-admin\""),
    );
    Some(resp)
}

impl Admin {
    /// The endpoint a request that passed [`gate`] names.
    async fn route(&self, session: &mut ServerSession, cfg: &Config) -> Response<Vec<u8>> {
        let req = session.req_header();
        let path = req.uri.path().to_string();
        let method = req.method.clone();
        let query = req.uri.query().unwrap_or("").to_string();
        match (method.as_str(), path.as_str()) {
            ("GET", "/readyz") => {
                let st = self.gateway.reload_status();
                let (status, word) = readiness(&self.gateway);
                let body = serde_json::json!({
                    "status": word,
                    "config": cfg.path.display().to_string(),
                    "store": store_in_force(&self.gateway, cfg),
                    "routes": cfg.routes.len(),
                    "rules": cfg.rules.len(),
                    "issuers": cfg.auth.tokens.status(),
                    "reload": reload_json(&st),
                });
                json(status, &body)
            }
            ("GET", "/metrics") => {
                usage::register_metrics();
                // The JWK Sets' ages and key counts, as of now.
                cfg.auth.tokens.status();
                crate::webhooks::webhook_metrics();
                // Each configured webhook's drop counters show from 0, before any drop.
                for w in cfg.webhooks.iter() {
                    for reason in ["queue_full", "undeliverable"] {
                        crate::webhooks::dropped_metrics().with_label_values(&[&w.name, reason]);
                    }
                }
                let m = metrics();
                let store = self.gateway.limiter.memory();
                m.memory_keys.set(store.len() as i64);
                m.memory_bans
                    .set(i64::try_from(self.gateway.limiter.bans_held()).unwrap_or(i64::MAX));
                text(StatusCode::OK, "text/plain; version=0.0.4", m.render())
            }
            ("GET", "/rules") if query.split('&').any(|p| p == "format=markdown") => text(
                StatusCode::OK,
                "text/markdown; charset=utf-8",
                describe::rules_markdown(cfg).into_bytes(),
            ),
            ("GET", "/rules") => {
                let rules: Vec<serde_json::Value> =
                    cfg.rules.iter().map(|r| describe::rule_json(r)).collect();
                json(StatusCode::OK, &serde_json::json!({ "rules": rules }))
            }
            ("GET", "/top") => top_clients(cfg, &query),
            ("GET", "/usage") => usage::read(&self.gateway, cfg, &query).await,
            ("GET", "/usage/thresholds") => usage::thresholds(&self.gateway, cfg).await,
            ("POST", "/usage/reset") | ("POST", "/usage/grant") => {
                let grant = path == "/usage/grant";
                let headers = session.req_header().headers.clone();
                match read_body(session, usage::MAX_BODY).await {
                    Ok(body) => usage::change(&self.gateway, cfg, &headers, &body, grant).await,
                    Err(why) => bad_request(why),
                }
            }
            ("GET", "/stats") => json(StatusCode::OK, &stats(&self.gateway, cfg)),
            ("GET", "/upstreams") => json(
                StatusCode::OK,
                &crate::upstream::status_json(cfg.upstreams.iter().map(|u| u.pool())),
            ),
            ("GET", "/diagram") => text(
                StatusCode::OK,
                "text/vnd.mermaid; charset=utf-8",
                describe::diagram(cfg).into_bytes(),
            ),
            ("POST", "/reload") => match self.gateway.reload("POST /reload").await {
                Ok(st) => json(
                    StatusCode::OK,
                    &serde_json::json!({"result": "success", "reload": reload_json(&st)}),
                ),
                Err(e) => {
                    let p = Problem::new(
                        "urn:floodgate:problem:invalid-config",
                        "Invalid Config",
                        422,
                        format!("{e}; the previous config stays in force"),
                    );
                    problem(p)
                }
            },
            _ => {
                let p = Problem::new(
                    "urn:floodgate:problem:no-route",
                    "Not Found",
                    404,
                    format!("no admin endpoint {method} {path}"),
                );
                problem(p)
            }
        }
    }
}

/// The dashboard page (`src/dashboard/index.html`): one file, no external request.
fn dashboard() -> Response<Vec<u8>> {
    let mut resp = text(
        StatusCode::OK,
        "text/html; charset=utf-8",
        include_str!("dashboard/index.html").as_bytes().to_vec(),
    );
    // Nothing but the page itself and the admin API: no script or style from elsewhere.
    resp.headers_mut().insert(
        http::header::CONTENT_SECURITY_POLICY,
        http::HeaderValue::from_static(
            "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
             connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'",
        ),
    );
    resp.headers_mut().insert(
        http::header::CACHE_CONTROL,
        http::HeaderValue::from_static("no-store"),
    );
    resp
}

/// 421 problem+json: the request names a host this listener does not answer for.
fn misdirected(host: &str) -> Response<Vec<u8>> {
    let p = Problem::new(
        "urn:floodgate:problem:misdirected-host",
        "Misdirected Request",
        421,
        format!(
            "the admin listener does not answer for Host \"{}\": use an IP address or \
             localhost, or list the name in [server] admin_hosts",
            guard::shown(host)
        ),
    );
    problem(p)
}

/// 403 problem+json: a state-changing request that a browser sent for another site.
fn cross_site(why: &str) -> Response<Vec<u8>> {
    let p = Problem::new(
        "urn:floodgate:problem:cross-site",
        "Forbidden",
        403,
        format!(
            "a cross-site request ({why}) cannot change the gateway; send it without a form \
             body from a script or the command line (curl -X POST)"
        ),
    );
    problem(p)
}

/// The request body, at most `max` bytes, or why it cannot be read.
async fn read_body(session: &mut ServerSession, max: usize) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    loop {
        match session.read_request_body().await {
            Ok(Some(chunk)) => {
                if body.len() + chunk.len() > max {
                    return Err(format!("the body is larger than {max} bytes"));
                }
                body.extend_from_slice(&chunk);
            }
            Ok(None) => return Ok(body),
            Err(_) => return Err("the body could not be read".into()),
        }
    }
}

/// A 400 problem+json naming what is wrong with the query.
fn bad_request(detail: String) -> Response<Vec<u8>> {
    let p = Problem::bad_request(detail);
    problem(p)
}

/// `GET /top?rule=NAME&window=1m|1h&by=rejected|admitted&limit=N`.
fn top_clients(cfg: &Config, query: &str) -> Response<Vec<u8>> {
    let (mut rule, mut window, mut by, mut limit) = (None, Window::Minute, By::Rejected, 10);
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let v = percent_decode(v);
        match k {
            "rule" => rule = Some(v),
            "window" => match Window::NAMES.iter().find(|(n, _)| *n == v) {
                Some((_, w)) => window = *w,
                None => return bad_request(format!("window must be 1m or 1h, not \"{v}\"")),
            },
            "by" => match By::NAMES.iter().find(|(n, _)| *n == v) {
                Some((_, b)) => by = *b,
                None => {
                    return bad_request(format!("by must be rejected or admitted, not \"{v}\""))
                }
            },
            "limit" => match v.parse::<usize>() {
                Ok(n) if (1..=crate::top::COUNTERS).contains(&n) => limit = n,
                _ => {
                    return bad_request(format!(
                        "limit must be a whole number from 1 to {}, not \"{v}\"",
                        crate::top::COUNTERS
                    ))
                }
            },
            other => {
                return bad_request(format!(
                    "unknown parameter \"{other}\" (expected rule, window, by, limit)"
                ))
            }
        }
    }
    let Some(rule) = rule else {
        return bad_request("rule is required: /top?rule=NAME".into());
    };
    let not_found = |detail: String| {
        let p = Problem::new(
            "urn:floodgate:problem:no-such-rule",
            "Not Found",
            404,
            detail,
        );
        problem(p)
    };
    let rls_limits = cfg.rls.iter().flat_map(|s| &s.limits);
    if !cfg.rules.iter().any(|r| *r.name == *rule)
        && !rls_limits.map(|l| &l.policy.name).any(|n| **n == *rule)
    {
        return not_found(format!("no rule named \"{rule}\" in the config in force"));
    }
    if !cfg.server.top_clients {
        return not_found("top clients are off ([server] top_clients = false)".into());
    }
    let t = top();
    let now = t.now();
    let (list, blocked) = match t.rule(&rule) {
        Some(state) => {
            let state = state.lock();
            (state.top(now, window, by, limit), state.blocked(t.now_ms()))
        }
        None => (
            TopList {
                total: 0,
                bound: 0,
                clients: Vec::new(),
            },
            Vec::new(),
        ),
    };
    let key_json = |client: &crate::top::Client| -> serde_json::Map<String, serde_json::Value> {
        client
            .parts
            .iter()
            .map(|(k, v)| (k.clone(), v.clone().into()))
            .collect()
    };
    let blocked: Vec<serde_json::Value> = blocked
        .iter()
        .take(limit)
        .map(|(client, until_ms)| {
            let left_ms = until_ms.saturating_sub(t.now_ms());
            serde_json::json!({
                "key": key_json(client),
                "until_unix_ms": until_ms,
                "seconds_left": left_ms.div_ceil(1000),
            })
        })
        .collect();
    let clients: Vec<serde_json::Value> = list
        .clients
        .iter()
        .map(|c| {
            serde_json::json!({
                "key": key_json(&c.client),
                "count": c.count,
                "error": c.error,
                "admitted": c.admitted,
                "rejected": c.rejected,
            })
        })
        .collect();
    json(
        StatusCode::OK,
        &serde_json::json!({
            "rule": rule,
            "window": window.as_str(),
            "by": by.as_str(),
            "total": list.total,
            "counters": crate::top::COUNTERS,
            "bound": list.bound,
            "clients": clients,
            "blocked": blocked,
        }),
    )
}

/// `GET /stats`: what the dashboard shows, in one call.
fn stats(gateway: &Gateway, cfg: &Config) -> serde_json::Value {
    let t = top();
    let now = t.now();
    let m = metrics();
    let st = gateway.reload_status();
    // Envoy's rate-limit service's limits are listed as rules are (crate::rls::describe).
    let rls_limits = cfg.rls.iter().flat_map(|s| &s.limits);
    let rules: Vec<serde_json::Value> = cfg
        .rules
        .iter()
        .map(|r| (describe::rule_json(r), &r.policy))
        .chain(rls_limits.map(|l| (crate::rls::describe::limit_json(l), &l.policy)))
        .map(|(mut v, r)| {
            let c = &r.counters;
            v["counters"] = serde_json::json!({
                "allowed": c.allowed.get(),
                "rejected": c.rejected.get(),
                "shadow_rejected": c.shadow_rejected.get(),
                "slowed": c.slowed.get(),
                "skipped": c.skipped.get(),
                "fail_open": c.fail_open.get(),
                "fail_closed": c.fail_closed.get(),
                "fail_local": c.fail_local.get(),
            });
            if cfg.server.top_clients {
                let (admitted, rejected) = t
                    .rule(&r.name)
                    .map(|s| s.lock().series(now))
                    .unwrap_or_else(|| {
                        let zeros = vec![0; crate::top::SERIES_SECONDS];
                        (zeros.clone(), zeros)
                    });
                v["series"] = serde_json::json!({
                    "end_unix": now,
                    "step_seconds": 1,
                    "admitted": admitted,
                    "rejected": rejected,
                });
            }
            v
        })
        .collect();
    let limiter = &gateway.limiter;
    let breaker = (!limiter.in_process()).then(|| match m.circuit_state.get() {
        1 => "open",
        2 => "half-open",
        _ => "closed",
    });
    let h = prometheus::core::Metric::metric(&m.decision_seconds);
    let buckets: Vec<serde_json::Value> = h
        .get_histogram()
        .get_bucket()
        .iter()
        .map(|b| serde_json::json!([b.upper_bound(), b.cumulative_count()]))
        .collect();
    // The same as `GET /upstreams`: targets and their health.
    let upstreams =
        crate::upstream::status_json(cfg.upstreams.iter().map(|u| u.pool()))["upstreams"].take();
    serde_json::json!({
        "now_unix": now,
        "top_clients": cfg.server.top_clients,
        "issuers": cfg.auth.tokens.status(),
        "config": {
            "path": cfg.path.display().to_string(),
            "reload": reload_json(&st),
        },
        "store": {
            "backend": gateway.backend_in_force().as_str(),
            "configured_backend": cfg.store.backend.as_str(),
            "up": limiter.store().is_up(),
            "breaker": breaker,
            "decisions": h.get_histogram().get_sample_count(),
            "decision_seconds_buckets": buckets,
            "decided_requests": t.decided.get(),
            "store_requests": t.store_requests.get(),
        },
        "upstreams": upstreams,
        "rules": rules,
    })
}

/// `%XX` and `+` of a query value decoded (invalid escapes are kept as written).
fn percent_decode(v: &str) -> String {
    let b = v.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => {
                let hex = |c: u8| (c as char).to_digit(16);
                match (hex(b[i + 1]), hex(b[i + 2])) {
                    (Some(h), Some(l)) => {
                        out.push((h * 16 + l) as u8);
                        i += 3;
                        continue;
                    }
                    _ => out.push(b'%'),
                }
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn reload_json(st: &ReloadStatus) -> serde_json::Value {
    serde_json::json!({
        "generation": st.generation,
        "last_success_unix": st.last_success_unix,
        "last_error": st.last_error,
        "restart_required": st.restart_required,
    })
}

/// A response with a body and its Content-Length.
pub fn text(status: StatusCode, content_type: &str, body: Vec<u8>) -> Response<Vec<u8>> {
    let mut resp = Response::new(body);
    *resp.status_mut() = status;
    if let Ok(v) = http::HeaderValue::from_str(content_type) {
        resp.headers_mut().insert(http::header::CONTENT_TYPE, v);
    }
    let len = resp.body().len();
    resp.headers_mut()
        .insert(http::header::CONTENT_LENGTH, http::HeaderValue::from(len));
    resp
}

/// A problem+json response with its status and a fresh request id (in the body and in
/// `x-request-id`), as every answer floodgate makes carries one.
fn problem(mut p: Problem) -> Response<Vec<u8>> {
    let id = crate::wire::client::RequestId::of(&http::HeaderMap::new());
    p.request_id = Some(id.as_str().to_owned());
    let status = StatusCode::from_u16(p.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut resp = text(status, PROBLEM_JSON, p.to_body().to_vec());
    resp.headers_mut()
        .insert("x-request-id", id.header_value().clone());
    resp
}

/// What `/readyz` answers: 200 `ready`, or 503 `starting` until the store is ready (see
/// [`Gateway::is_ready`]).
fn readiness(gateway: &Gateway) -> (StatusCode, &'static str) {
    if gateway.is_ready() {
        (StatusCode::OK, "ready")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "starting")
    }
}

/// The store as `/readyz` shows it: the backend in force (where the counts are kept) and
/// whether it is up; when the file names another backend, that one too, waiting for a restart.
fn store_in_force(gateway: &Gateway, cfg: &Config) -> serde_json::Value {
    let mut v = serde_json::json!({
        "backend": gateway.backend_in_force().as_str(),
        "up": gateway.limiter.store().is_up(),
    });
    if cfg.store.backend != gateway.backend_in_force() {
        v["configured_backend"] = cfg.store.backend.as_str().into();
        v["waits_for_restart"] = true.into();
    }
    v
}

/// A JSON response.
pub fn json(status: StatusCode, value: &serde_json::Value) -> Response<Vec<u8>> {
    let body = serde_json::to_vec_pretty(value).unwrap_or_default();
    text(status, "application/json", body)
}
