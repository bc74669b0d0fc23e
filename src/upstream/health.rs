//! Active health checks: Pingora's `TcpHealthCheck` / `HttpHealthCheck` with our thresholds,
//! timeouts and TLS, wrapped by [`Recorded`] to keep each target's last result (for
//! `GET /upstreams`), to let a passing check end a passive ejection, and to name the upstream
//! in Pingora's one log line per health transition.
//!
//! With `[upstreams.protect]` a check takes a slot of the adaptive limit as a request does, so
//! checks never add to an upstream already at its limit; when no slot is free it does not
//! queue (the upstream is busy answering requests) and the target's last result stands.

use std::sync::Arc;

use async_trait::async_trait;
use pingora::http::RequestHeader;
use pingora::lb::health_check::{HealthCheck as Check, HttpHealthCheck, TcpHealthCheck};
use pingora::lb::Backend;
use pingora::protocols::ALPN;
use pingora::{Error, ErrorType};

use super::settings::{CheckKind, Settings};
use super::{info, CheckResult};

/// The check of upstream `name`, or `None` when it has no `health_check`.
pub fn build(name: &Arc<str>, settings: &Settings) -> Option<Box<dyn Check + Send + Sync>> {
    let hc = settings.health_check.as_ref()?;
    let first = settings.targets.first();
    let sni = settings
        .tls
        .as_ref()
        .map(|t| t.sni.clone().unwrap_or_else(|| first.host.to_string()));
    let inner: Box<dyn Check + Send + Sync> = match hc.kind {
        CheckKind::Tcp => {
            let mut c = match &sni {
                Some(sni) => TcpHealthCheck::new_tls(sni),
                None => TcpHealthCheck::new(),
            };
            c.consecutive_success = hc.healthy_threshold;
            c.consecutive_failure = hc.unhealthy_threshold;
            let o = &mut c.peer_template.options;
            o.connection_timeout = Some(hc.timeout);
            o.total_connection_timeout = Some(hc.timeout);
            if let Some(t) = &settings.tls {
                o.verify_cert = t.verify;
                o.verify_hostname = t.verify;
                o.ca = t.ca.clone();
            }
            c
        }
        CheckKind::Http => {
            let host = settings
                .host_header
                .clone()
                .unwrap_or_else(|| first.host.to_string());
            let mut c = HttpHealthCheck::new(&host, settings.tls.is_some());
            c.consecutive_success = hc.healthy_threshold;
            c.consecutive_failure = hc.unhealthy_threshold;
            if let Ok(mut req) = RequestHeader::build("GET", hc.path.as_bytes(), None) {
                let _ = req.append_header("Host", &host);
                let _ = req.append_header("User-Agent", "floodgate-health-check");
                c.req = req;
            }
            let expect = hc.expect_status.clone();
            c.validator = Some(Box::new(move |resp| {
                let status = resp.status.as_u16();
                if expect.contains(&status) {
                    Ok(())
                } else {
                    Error::e_explain(
                        ErrorType::CustomCode("unexpected status", status),
                        format!("health check answered {status}"),
                    )
                }
            }));
            if let Some(sni) = sni {
                c.peer_template.sni = sni;
            }
            let o = &mut c.peer_template.options;
            o.connection_timeout = Some(hc.timeout);
            o.total_connection_timeout = Some(hc.timeout);
            o.read_timeout = Some(hc.timeout);
            o.write_timeout = Some(hc.timeout);
            if let Some(t) = &settings.tls {
                o.verify_cert = t.verify;
                o.verify_hostname = t.verify;
                o.ca = t.ca.clone();
                o.alpn = ALPN::H1;
                c.peer_template.client_cert_key = t.client.clone();
            }
            Box::new(c)
        }
    };
    Some(Box::new(Recorded {
        upstream: name.clone(),
        inner,
    }))
}

/// The target's last check result, repeated (healthy when it was never checked): a check that
/// could not take a slot leaves the target's health as it stands.
fn last_result(target: &Backend) -> pingora::Result<()> {
    let last = info(target).and_then(|i| i.state.last_check.lock().clone());
    match last {
        Some(r) if !r.ok => Err(Error::explain(
            ErrorType::ConnectError,
            "not checked (the upstream is at its adaptive limit): the last check failed",
        )),
        _ => Ok(()),
    }
}

/// A check that records what it found on the target it checked.
struct Recorded {
    upstream: Arc<str>,
    inner: Box<dyn Check + Send + Sync>,
}

#[async_trait]
impl Check for Recorded {
    async fn check(&self, target: &Backend) -> pingora::Result<()> {
        let _slot = match super::protect::current(&self.upstream) {
            None => None,
            Some(guard) => match guard.try_enter(super::protect::HEALTH_CHECKS) {
                Some(permit) => Some(permit),
                None => return last_result(target),
            },
        };
        let result = self.inner.check(target).await;
        if let Some(i) = info(target) {
            if result.is_ok() {
                i.state.clear_ejection();
            }
            *i.state.last_check.lock() = Some(CheckResult {
                ok: result.is_ok(),
                error: result
                    .as_ref()
                    .err()
                    .map(|e| e.to_string())
                    .unwrap_or_default(),
                at: std::time::SystemTime::now(),
            });
        }
        result
    }

    async fn health_status_change(&self, target: &Backend, healthy: bool) {
        if let Some(i) = info(target) {
            super::metrics::upstream_metrics()
                .healthy
                .with_label_values(&[&*self.upstream, &*i.label])
                .set(i64::from(healthy && !i.state.ejected()));
        }
    }

    fn backend_summary(&self, target: &Backend) -> String {
        match info(target) {
            Some(i) => format!(
                "upstream \"{}\" target {} ({})",
                self.upstream, i.name, i.addr
            ),
            None => format!("upstream \"{}\" target {:?}", self.upstream, target.addr),
        }
    }

    fn health_threshold(&self, success: bool) -> usize {
        self.inner.health_threshold(success)
    }
}
