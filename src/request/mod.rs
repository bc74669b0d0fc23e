//! One request, in the order it travels through the gateway once its connection is accepted
//! (`crate::connection`), on the wire-level pieces of [`crate::wire`]:
//!
//! 1. `wire::normalize`, `wire::header_policy`, `wire::query`: the one spelling of its path,
//!    host and method, header spellings refused or tidied, query parameters as frameworks
//!    read them.
//! 2. `wire::client`: who it comes from (client IP, request id); `wire::auth`: its API key's
//!    identity; `wire::matching`: the host/path/method match routes and rules share.
//! 3. [`admission`]: the decision (route, key, rules, the answer), as one function a unit test
//!    calls without a socket.
//! 4. [`body`]: its body's deadline and read-ahead; [`throttle`]: the pace of a slowed request.
//! 5. [`forwarding`]: what the upstream receives, retries, error statuses.
//! 6. `wire::response`: every answer floodgate makes itself (problem+json, RateLimit fields);
//!    [`response_cost`]: what a response-aware rule reads from the upstream's answer.
//! 7. [`access_log`]: its line, written off the request path.
//!
//! [`proxy`] is the Pingora `ProxyHttp` glue that runs these steps: I/O only.

pub mod access_log;
pub mod admission;
pub mod body;
pub mod forwarding;
pub mod proxy;
pub mod response_cost;
pub mod throttle;
