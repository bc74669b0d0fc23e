//! The admin listener: health, readiness and (as they land) metrics and rule introspection.
//!
//! It listens on `server.admin_listen` (loopback by default). When `admin_token` is set every
//! endpoint but `/healthz` needs `Authorization: Bearer <token>`, compared in constant time.

use std::sync::Arc;

use async_trait::async_trait;
use http::{Response, StatusCode};
use pingora::apps::http_app::ServeHttp;
use pingora::protocols::http::ServerSession;
use subtle::ConstantTimeEq;

use crate::describe;
use crate::gateway::{Gateway, ReloadStatus};
use crate::metrics::metrics;
use crate::response::{Problem, PROBLEM_JSON};

/// The admin HTTP application.
pub struct Admin {
    /// Shared gateway state.
    pub gateway: Arc<Gateway>,
}

#[async_trait]
impl ServeHttp for Admin {
    async fn response(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        let req = session.req_header();
        let path = req.uri.path().to_string();
        let method = req.method.clone();
        if path == "/healthz" {
            return text(
                StatusCode::OK,
                "text/plain; charset=utf-8",
                b"ok\n".to_vec(),
            );
        }
        let cfg = self.gateway.config.load();
        if let Some(token) = &cfg.server.admin_token {
            let presented = req
                .headers
                .get(http::header::AUTHORIZATION)
                .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "))
                .unwrap_or_default();
            if !bool::from(presented.ct_eq(token.as_bytes())) {
                let p = Problem::new(
                    "urn:floodgate:problem:unauthorized",
                    "Unauthorized",
                    401,
                    "the admin API needs Authorization: Bearer <admin_token>",
                );
                let mut resp = text(StatusCode::UNAUTHORIZED, PROBLEM_JSON, p.to_body().to_vec());
                resp.headers_mut().insert(
                    http::header::WWW_AUTHENTICATE,
                    http::HeaderValue::from_static("Bearer realm=\"floodgate-admin\""),
                );
                return resp;
            }
        }
        let query = req.uri.query().unwrap_or("").to_string();
        match (method.as_str(), path.as_str()) {
            ("GET", "/readyz") => {
                let st = self.gateway.reload_status();
                let body = serde_json::json!({
                    "status": "ready",
                    "config": cfg.path.display().to_string(),
                    "store": {
                        "backend": cfg.store.backend.as_str(),
                        "up": self.gateway.limiter.shared().is_none_or(|s| s.is_up()),
                    },
                    "routes": cfg.routes.len(),
                    "rules": cfg.rules.len(),
                    "reload": reload_json(&st),
                });
                json(StatusCode::OK, &body)
            }
            ("GET", "/metrics") => {
                let m = metrics();
                let store = self.gateway.limiter.memory();
                m.memory_keys.set(store.len() as i64);
                text(StatusCode::OK, "text/plain; version=0.0.4", m.render())
            }
            ("GET", "/rules") if query.split('&').any(|p| p == "format=markdown") => text(
                StatusCode::OK,
                "text/markdown; charset=utf-8",
                describe::rules_markdown(&cfg).into_bytes(),
            ),
            ("GET", "/rules") => {
                let rules: Vec<serde_json::Value> =
                    cfg.rules.iter().map(|r| describe::rule_json(r)).collect();
                json(StatusCode::OK, &serde_json::json!({ "rules": rules }))
            }
            ("GET", "/diagram") => text(
                StatusCode::OK,
                "text/vnd.mermaid; charset=utf-8",
                describe::diagram(&cfg).into_bytes(),
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
                    text(
                        StatusCode::UNPROCESSABLE_ENTITY,
                        PROBLEM_JSON,
                        p.to_body().to_vec(),
                    )
                }
            },
            _ => {
                let p = Problem::new(
                    "urn:floodgate:problem:no-route",
                    "Not Found",
                    404,
                    format!("no admin endpoint {method} {path}"),
                );
                text(StatusCode::NOT_FOUND, PROBLEM_JSON, p.to_body().to_vec())
            }
        }
    }
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

/// A JSON response.
pub fn json(status: StatusCode, value: &serde_json::Value) -> Response<Vec<u8>> {
    let body = serde_json::to_vec_pretty(value).unwrap_or_default();
    text(status, "application/json", body)
}
