//! floodgate: an HTTP API gateway on Pingora whose reason to exist is rate limiting done right.
//!
//! The tree reads in the order a request travels: [`connection`] (caps and deadlines below
//! HTTP) → [`request`] (normalize, identity, route, admission, forwarding, response, access log;
//! [`request::proxy`] is the Pingora glue) → [`rules`] and [`limiter`] (the decision's counters
//! and stores) → [`upstream`] (targets, health, pools). Beside the path: [`config`] (the file as
//! validated plain data), [`gateway`] (what lives: the config in force, pools, reload),
//! [`admin`], [`rls`] (Envoy's rate-limit service), [`telemetry`] (traces), [`webhooks`], [`metrics`], [`top`],
//! [`text`]. `main`, [`server`], [`shutdown`], [`logging`] and
//! [`threads`] are the binary's wiring.

pub mod admin;
pub mod config;
pub mod connection;
pub mod describe;
pub mod gateway;
pub mod limiter;
pub mod logging;
pub mod metrics;
pub mod request;
pub mod rls;
pub mod rules;
pub mod server;
pub mod shutdown;
pub mod telemetry;
pub mod text;
pub mod threads;
pub mod top;
pub mod upstream;
pub mod webhooks;
