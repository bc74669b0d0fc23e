//! One request, in the order it travels through the gateway once its connection is accepted
//! (`crate::connection`):
//!
//! 1. [`normalize`]: the one spelling of its path, host and method; [`header_policy`]: header
//!    spellings refused or tidied; [`query`]: query parameters as frameworks read them.
//! 2. [`client`]: who it comes from (client IP, request id); [`auth`]: its API key's identity.
//! 3. [`matching`]: the host/path/method match routes and rules share.
//! 4. [`admission`]: the decision (route, key, rules, the answer), as one function a unit test
//!    calls without a socket.
//! 5. [`body`]: its body's deadline and read-ahead; [`throttle`]: the pace of a slowed request.
//! 6. [`forwarding`]: what the upstream receives, retries, error statuses.
//! 7. [`response`]: every answer floodgate makes itself (problem+json, RateLimit fields);
//!    [`header_names`]: the names floodgate writes, parsed once;
//!    [`response_cost`]: what a response-aware rule reads from the upstream's answer.
//! 8. [`access_log`]: its line, written off the request path.
//!
//! [`proxy`] is the Pingora `ProxyHttp` glue that runs these steps: I/O only.

pub mod access_log;
pub mod admission;
pub mod auth;
pub mod body;
pub mod client;
pub mod forwarding;
pub mod header_names;
pub mod header_policy;
pub mod matching;
pub mod normalize;
pub mod proxy;
pub mod query;
pub mod response;
pub mod response_cost;
pub mod throttle;
