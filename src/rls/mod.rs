//! floodgate as Envoy's rate-limit service: `envoy.service.ratelimit.v3.RateLimitService`
//! over gRPC, answered by the same engine as `[[rules]]`. This module is the service's logic
//! and knows no config or gateway (the config holds its `limits`); the gRPC handler and its
//! listener, on the config in force, are `crate::rls_server`.
//!
//! - `limits`: the validated `[rls]` section and which limit a descriptor falls under.
//! - `bounds`: what a request may hold before anything is matched or charged.
//! - `plan`: descriptors as the engine's checks (counter, cost, override).
//! - `answer`: the engine's outcome as Envoy's response, with floodgate's RateLimit fields.
//! - `describe`: the limits as `check` prints them and `/stats` lists them.
//! - `metrics`: the service's own series (per-limit decisions use the rules' series).

pub mod answer;
pub mod bounds;
pub mod describe;
pub mod limits;
pub mod metrics;
pub mod plan;
