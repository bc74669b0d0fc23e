//! floodgate: an HTTP API gateway on Pingora whose reason to exist is rate limiting done right.
//!
//! The request path and module layout are described in the README; each module owns one
//! concern and the proxy glues them together.

pub mod auth;
pub mod config;
pub mod limiter;
pub mod rules;
pub mod client;
pub mod proxy;
pub mod response;
pub mod admin;
pub mod server;
pub mod describe;
