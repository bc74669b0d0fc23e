//! The rate-limit service's serving layer, above the gateway it reads and beside the limits'
//! logic (`crate::rls`): the gRPC service Envoy calls
//! (`envoy.service.ratelimit.v3.RateLimitService`) and the listener it is served on (`listener`: a Pingora service with a runtime of its own, stopped
//! with the rest of the process and handed over on `--upgrade`; `conn`: its connections'
//! caps and deadlines; `call`: each call's, before tonic decodes it).
//!
//! Each call reads the config in force (so a reload swaps the limits as it swaps rules),
//! checks the request's bounds, plans its descriptors as checks, and asks the engine once for
//! all of them (`Limiter::decide`: one store call for every global descriptor, all or nothing).

use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tonic::{Request, Response, Status};

use crate::gateway::Gateway;
use crate::metrics::metrics;
use crate::rls::metrics::rls_metrics;
use crate::rls::{answer, bounds, plan};

mod activity;
mod call;
mod conn;
mod listener;
mod pings;
pub use call::{MAX_OPEN_CALLS, MAX_PENDING_BYTES};
pub use listener::RlsServer;

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
        // A graceful stop (SIGTERM, an upgrade's end) waits for the calls in flight as it
        // does for proxied requests.
        let _in_flight = crate::shutdown::requests().enter_static();
        let mut trace = self.trace(&request);
        let req = request.into_inner();
        let answered = self.answer(&req, trace.as_mut()).await;
        let counted = &rls_metrics().answered;
        let result = match &answered {
            Ok(r) if r.overall_code == Code::OverLimit as i32 => &counted.over_limit,
            Ok(_) => &counted.ok,
            Err(s) if s.code() == tonic::Code::Unavailable => &counted.unavailable,
            Err(_) => &counted.invalid,
        };
        result.inc();
        if let Some(trace) = trace {
            let (status, overall) = match &answered {
                Ok(r) if r.overall_code == Code::OverLimit as i32 => (0, Some("OVER_LIMIT")),
                Ok(_) => (0, Some("OK")),
                Err(s) => (s.code() as i32, None),
            };
            trace.finish_rls(status, overall);
        }
        answered.map(Response::new)
    }
}

impl Rls {
    /// The call's server span when `[tracing]` is on, continuing the trace context Envoy sent
    /// in the call's metadata (from a trusted peer). Only `traceparent` and `tracestate` are
    /// copied out of the metadata.
    fn trace(&self, request: &Request<RateLimitRequest>) -> Option<crate::telemetry::RequestTrace> {
        let cfg = self.gateway.config.load();
        let settings = cfg.tracing.as_ref()?;
        let mut headers = http::HeaderMap::new();
        for name in [
            crate::telemetry::propagation::TRACEPARENT.name(),
            crate::telemetry::propagation::TRACESTATE.name(),
        ] {
            for v in request.metadata().get_all(name.as_str()).iter() {
                if let Ok(v) = http::HeaderValue::from_bytes(v.as_bytes()) {
                    headers.append(name.clone(), v);
                }
            }
        }
        let peer = request
            .remote_addr()
            .map_or(std::net::IpAddr::from([0, 0, 0, 0]), |a| a.ip());
        crate::telemetry::RequestTrace::start_rls(
            settings,
            &cfg.server.trusted_proxies,
            peer,
            &headers,
            &request.get_ref().domain,
        )
    }

    async fn answer(
        &self,
        req: &RateLimitRequest,
        trace: Option<&mut crate::telemetry::RequestTrace>,
    ) -> Result<RateLimitResponse, Status> {
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
        let trace = trace.filter(|t| t.is_recording());
        let wall = trace.as_ref().map(|_| std::time::SystemTime::now());
        let outcome = self
            .gateway
            .limiter
            .decide(planned.applying(), &cfg.store)
            .await;
        if let (Some(trace), Some(wall)) = (trace, wall) {
            trace.admission(&crate::telemetry::Decision::of(wall, &outcome));
        }
        let decided = Instant::now();
        metrics()
            .decision_seconds
            .observe(decided.saturating_duration_since(started).as_secs_f64());
        crate::top::record_labelled(&cfg, &outcome, decided, &|a| {
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
