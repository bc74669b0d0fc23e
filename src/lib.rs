//! floodgate: an HTTP API gateway on Pingora whose reason to exist is rate limiting done right.
//!
//! The request path and module layout are described in the README; each module owns one
//! concern and the proxy glues them together.

pub mod access_log;
pub mod admin;
pub mod admission;
pub mod auth;
pub mod body;
pub mod client;
pub mod config;
pub mod connection;
pub mod describe;
pub mod forwarding;
pub mod gateway;
pub mod header_policy;
pub mod limiter;
pub mod log_safe;
pub mod logging;
pub mod matching;
pub mod metrics;
pub mod names;
pub mod normalize;
pub mod proxy;
pub mod query;
pub mod response;
pub mod response_cost;
pub mod rls;
pub mod rules;
pub mod server;
pub mod shutdown;
pub mod telemetry;
pub mod text;
pub mod throttle;
pub mod top;
pub mod upstream;
pub mod webhooks;
