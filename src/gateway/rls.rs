//! The gRPC service Envoy calls (`envoy.service.ratelimit.v3.RateLimitService`) and the
//! listener it is served on, a Pingora background service that stops with the rest of the
//! process.
//!
//! Each call reads the config in force (so a reload swaps the limits as it swaps rules),
//! checks the request's bounds, plans its descriptors as checks, and asks the engine once for
//! all of them (`Limiter::decide`: one store call for every global descriptor, all or nothing).

use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use parking_lot::Mutex;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use tonic::{Request, Response, Status};

use super::Gateway;
use crate::metrics::metrics;
use crate::rls::metrics::rls_metrics;
use crate::rls::{answer, bounds, plan};

/// Streams one HTTP/2 connection may have open at once: Envoy multiplexes its calls over a
/// few connections, and this bounds what one client can make the service hold.
pub const MAX_STREAMS: u32 = 1024;

/// The `ShouldRateLimit` handler.
#[derive(Clone)]
pub struct Rls {
    /// The config in force and the limiter.
    pub gateway: Arc<Gateway>,
}

#[async_trait]
impl RateLimitService for Rls {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let req = request.into_inner();
        let answered = self.answer(&req).await;
        let result = match &answered {
            Ok(r) if r.overall_code == Code::OverLimit as i32 => "over_limit",
            Ok(_) => "ok",
            Err(s) if s.code() == tonic::Code::Unavailable => "unavailable",
            Err(_) => "invalid",
        };
        rls_metrics().requests.with_label_values(&[result]).inc();
        answered.map(Response::new)
    }
}

impl Rls {
    async fn answer(&self, req: &RateLimitRequest) -> Result<RateLimitResponse, Status> {
        bounds::check(req)?;
        let cfg = self.gateway.config.load_full();
        let Some(settings) = &cfg.rls else {
            // [rls] was removed by a reload: the listener waits for a restart, and with no
            // limits every descriptor is unmatched.
            return Ok(all_ok(req));
        };
        let planned = plan::plan(settings, req)?;
        if planned.groups.is_empty() {
            return Ok(all_ok(req));
        }
        let started = Instant::now();
        let outcome = Box::pin(self.gateway.limiter.decide(planned.applying(), &cfg.store)).await;
        metrics()
            .decision_seconds
            .observe(started.elapsed().as_secs_f64());
        crate::top::record_labelled(&cfg, &outcome, &|a| {
            let group = planned
                .groups
                .iter()
                .find(|g| Arc::ptr_eq(&g.policy, &a.rule) && g.check.counter == a.counter);
            let entries = group.map(|g| &req.descriptors[g.first].entries);
            crate::top::descriptor_label(
                entries
                    .into_iter()
                    .flatten()
                    .map(|e| (e.key.as_str(), e.value.as_str())),
            )
        });
        for name in &outcome.shadow_rejected {
            tracing::info!(limit = %name, "shadow rls limit would have rejected the request");
        }
        answer::response(&planned, &outcome, cfg.server.legacy_headers)
    }
}

/// OK for every descriptor, no limit named.
fn all_ok(req: &RateLimitRequest) -> RateLimitResponse {
    RateLimitResponse {
        overall_code: Code::Ok as i32,
        statuses: req
            .descriptors
            .iter()
            .map(|_| DescriptorStatus {
                code: Code::Ok as i32,
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

/// The listener: bound when the server is built (so a taken port fails the start with its
/// error, as the proxy's listeners do), served once Pingora starts its services.
pub struct RlsServer {
    gateway: Arc<Gateway>,
    listener: Mutex<Option<std::net::TcpListener>>,
}

impl RlsServer {
    /// Binds `[rls] listen` of `gateway`'s config.
    pub fn bind(gateway: Arc<Gateway>) -> Result<Option<RlsServer>, String> {
        let Some(addr) = gateway.config.load().rls.as_ref().map(|r| r.listen) else {
            return Ok(None);
        };
        let listener = std::net::TcpListener::bind(addr)
            .and_then(|l| l.set_nonblocking(true).map(|()| l))
            .map_err(|e| format!("cannot listen on rls.listen {addr}: {e}"))?;
        Ok(Some(RlsServer {
            gateway,
            listener: Mutex::new(Some(listener)),
        }))
    }
}

#[async_trait]
impl BackgroundService for RlsServer {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let Some(listener) = self.listener.lock().take() else {
            return;
        };
        let addr = listener.local_addr().ok();
        let listener = match tokio::net::TcpListener::from_std(listener) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(error = %e, "cannot serve the rate-limit service");
                return;
            }
        };
        let incoming =
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
        let service = RateLimitServiceServer::new(Rls {
            gateway: self.gateway.clone(),
        })
        .max_decoding_message_size(bounds::MAX_MESSAGE_BYTES);
        tracing::info!(listen = ?addr, "rate-limit service (envoy.service.ratelimit.v3) listening");
        let served = tonic::transport::Server::builder()
            .max_concurrent_streams(MAX_STREAMS)
            .add_service(service)
            .serve_with_incoming_shutdown(incoming, async move {
                let _ = shutdown.changed().await;
            })
            .await;
        if let Err(e) = served {
            tracing::error!(error = %e, "the rate-limit service stopped");
        }
    }
}
