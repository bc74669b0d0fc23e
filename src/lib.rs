//! floodgate: an HTTP API gateway on Pingora whose reason to exist is rate limiting done right.
//!
//! The tree reads in the order a request travels: [`connection`] (caps and deadlines below
//! HTTP) → [`request`] (admission, body, forwarding, access log; [`request::proxy`] is the
//! Pingora glue) on [`wire`] (the HTTP wire level: normalize, query, header policy, matching,
//! client identity, API keys, the answers floodgate makes) → [`rules`] and [`limiter`] (the
//! decision's counters and stores) → [`upstream`] (targets, health, pools). Beside the path:
//! [`config`] (the file as validated plain data), [`gateway`] (what lives: the config in
//! force, pools, reload),
//! [`admin`], [`rls`] (Envoy's rate-limit service) and [`rls_server`] (its listener), [`telemetry`] (traces), [`webhooks`], [`metrics`], [`top`],
//! [`text`]. `main`, [`server`], [`shutdown`], [`logging`] and
//! [`threads`] are the binary's wiring.

pub mod admin;
pub mod config;
pub mod connection;
pub mod describe;
pub mod gateway;
pub mod jwt;
pub mod limiter;
pub mod logging;
pub mod metrics;
pub mod request;
pub mod rls;
pub mod rls_server;
pub mod rules;
pub mod server;
pub mod shutdown;
pub mod telemetry;
pub mod text;
pub mod threads;
pub mod top;
pub mod upstream;
pub mod webhooks;
pub mod wire;
