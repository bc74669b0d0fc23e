//! The HTTP wire level, below the request pipeline (`crate::request`) and shared with what
//! else reads requests or writes answers (the config's validation, the rules, the connection
//! guard, the rate-limit service, the admin port):
//!
//! - [`normalize`]: the one spelling of a request's path, host and method;
//!   [`header_policy`]: header spellings refused at admission or tidied before forwarding;
//!   [`query`]: query parameters as frameworks read them.
//! - [`client`]: who a request comes from (client IP, request id); [`auth`]: API keys and the
//!   identity they carry.
//! - [`matching`]: the host/path/method match routes and rules share; [`ip_list`]: the
//!   networks a route or the server lets in or refuses.
//! - A route's edges, built with the config: [`rewrite`] (the path the upstream receives),
//!   [`header_edits`] (headers set, added and removed both ways), [`cors`] (browsers'
//!   cross-origin requests answered at the edge).
//! - [`outbound`]: the requests floodgate makes itself (TLS to public servers, a bounded GET).
//! - [`response`]: every answer floodgate makes itself (problem+json, the RateLimit fields);
//!   [`header_names`]: the names floodgate writes, parsed once.

pub mod auth;
pub mod client;
pub mod cors;
pub mod header_edits;
pub mod header_names;
pub mod header_policy;
pub mod ip_list;
pub mod match_index;
pub mod matching;
pub mod normalize;
pub mod outbound;
pub mod query;
pub mod response;
pub mod rewrite;
