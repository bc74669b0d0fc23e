//! The header names floodgate writes into requests and responses, each parsed once at compile
//! time with its wire spelling.
//!
//! Pingora's `insert_header` parses the name of every insert, copies a custom name into a new
//! buffer and clones that into its case-preserving map: for the handful of headers every
//! proxied request gets (`X-Forwarded-For`, `X-Forwarded-Proto`, `X-Request-Id`, the RateLimit
//! fields) that was the largest cost floodgate added to a request (docs/benchmarks.md, "Where
//! the time goes"). A [`Known`] name is inserted through the pre-parsed path of the patched
//! pingora-http (`vendor/pingora-http`): two map inserts, nothing parsed or copied.

use http::{HeaderName, HeaderValue};
use pingora::http::{CaseHeaderName, RequestHeader, ResponseHeader};
use pingora::Result;

/// A header name with the spelling it is written in on the wire.
#[derive(Debug)]
pub struct Known {
    name: HeaderName,
    case: CaseHeaderName,
}

impl Known {
    /// `lower` must be `wire` in lowercase (checked by a unit test for every name here).
    const fn new(lower: &'static str, wire: &'static str) -> Self {
        Known {
            name: HeaderName::from_static(lower),
            case: CaseHeaderName::from_static(wire),
        }
    }

    /// The name, for lookups.
    pub fn name(&self) -> &HeaderName {
        &self.name
    }

    /// Sets the header of a request to `value`, replacing any value it had.
    pub fn set_request(&self, req: &mut RequestHeader, value: HeaderValue) -> Result<()> {
        req.insert_header_parsed(&self.name, &self.case, value)
    }

    /// Sets the header of a response to `value`, replacing any value it had.
    pub fn set_response(&self, resp: &mut ResponseHeader, value: HeaderValue) -> Result<()> {
        resp.insert_header_parsed(&self.name, &self.case, value)
    }
}

/// `x-forwarded-for` (the spelling floodgate has always sent).
pub static X_FORWARDED_FOR: Known = Known::new("x-forwarded-for", "x-forwarded-for");
/// `x-forwarded-proto`.
pub static X_FORWARDED_PROTO: Known = Known::new("x-forwarded-proto", "x-forwarded-proto");
/// `x-request-id`, both ways.
pub static X_REQUEST_ID: Known = Known::new("x-request-id", "x-request-id");
/// The identity headers (key id, user, plan), in that order: floodgate's alone (a client's
/// are removed), all starting `x-floodgate-`.
pub static IDENTITY: [Known; 3] = [
    Known::new("x-floodgate-key-id", "x-floodgate-key-id"),
    Known::new("x-floodgate-user", "x-floodgate-user"),
    Known::new("x-floodgate-plan", "x-floodgate-plan"),
];
/// `RateLimit-Policy`.
pub static RATELIMIT_POLICY: Known = Known::new("ratelimit-policy", "RateLimit-Policy");
/// `RateLimit`.
pub static RATELIMIT: Known = Known::new("ratelimit", "RateLimit");
/// `X-RateLimit-Limit` (the legacy fields, `legacy_headers`).
pub static X_RATELIMIT_LIMIT: Known = Known::new("x-ratelimit-limit", "X-RateLimit-Limit");
/// `X-RateLimit-Remaining`.
pub static X_RATELIMIT_REMAINING: Known =
    Known::new("x-ratelimit-remaining", "X-RateLimit-Remaining");
/// `X-RateLimit-Reset`.
pub static X_RATELIMIT_RESET: Known = Known::new("x-ratelimit-reset", "X-RateLimit-Reset");
/// `Content-Type` of floodgate's own answers.
pub static CONTENT_TYPE: Known = Known::new("content-type", "Content-Type");
/// `Content-Length` of floodgate's own answers.
pub static CONTENT_LENGTH: Known = Known::new("content-length", "Content-Length");
/// `Cache-Control` of floodgate's own answers.
pub static CACHE_CONTROL: Known = Known::new("cache-control", "Cache-Control");
/// `Retry-After`.
pub static RETRY_AFTER: Known = Known::new("retry-after", "Retry-After");
/// `WWW-Authenticate` (401).
pub static WWW_AUTHENTICATE: Known = Known::new("www-authenticate", "WWW-Authenticate");
/// `Access-Control-Allow-Origin` (a route's `cors`).
pub static ACCESS_CONTROL_ALLOW_ORIGIN: Known =
    Known::new("access-control-allow-origin", "Access-Control-Allow-Origin");
/// `Access-Control-Expose-Headers`.
pub static ACCESS_CONTROL_EXPOSE_HEADERS: Known = Known::new(
    "access-control-expose-headers",
    "Access-Control-Expose-Headers",
);
/// `Access-Control-Allow-Credentials`.
pub static ACCESS_CONTROL_ALLOW_CREDENTIALS: Known = Known::new(
    "access-control-allow-credentials",
    "Access-Control-Allow-Credentials",
);
/// `Vary`.
pub static VARY: Known = Known::new("vary", "Vary");
/// `traceparent` to the upstream (`[tracing]`).
pub static TRACEPARENT: Known = Known::new("traceparent", "traceparent");
/// `tracestate` to the upstream (`[tracing]`).
pub static TRACESTATE: Known = Known::new("tracestate", "tracestate");

#[cfg(test)]
mod tests {
    use super::*;

    fn all() -> Vec<&'static Known> {
        let mut v = vec![
            &X_FORWARDED_FOR,
            &X_FORWARDED_PROTO,
            &X_REQUEST_ID,
            &RATELIMIT_POLICY,
            &RATELIMIT,
            &X_RATELIMIT_LIMIT,
            &X_RATELIMIT_REMAINING,
            &X_RATELIMIT_RESET,
            &CONTENT_TYPE,
            &CONTENT_LENGTH,
            &CACHE_CONTROL,
            &RETRY_AFTER,
            &WWW_AUTHENTICATE,
            &ACCESS_CONTROL_ALLOW_ORIGIN,
            &ACCESS_CONTROL_EXPOSE_HEADERS,
            &ACCESS_CONTROL_ALLOW_CREDENTIALS,
            &VARY,
            &TRACEPARENT,
            &TRACESTATE,
        ];
        v.extend(IDENTITY.iter());
        v
    }

    #[test]
    fn each_name_is_its_wire_spelling_in_lowercase() {
        for k in all() {
            let wire = std::str::from_utf8(k.case.as_slice()).unwrap();
            assert_eq!(k.name.as_str(), wire.to_ascii_lowercase(), "{wire}");
            // The parsed name is the one Pingora's own parse would give (a standard name is
            // its standard variant, so lookups by `http::header::*` find it).
            assert_eq!(k.name, HeaderName::from_bytes(wire.as_bytes()).unwrap());
        }
    }

    #[test]
    fn a_set_replaces_and_is_written_in_its_spelling() {
        let mut resp = ResponseHeader::build(200, Some(1)).unwrap();
        resp.insert_header("ratelimit", "old").unwrap();
        RATELIMIT
            .set_response(&mut resp, HeaderValue::from_static("\"r\";r=1;t=2"))
            .unwrap();
        assert_eq!(resp.headers.get_all("ratelimit").iter().count(), 1);
        let mut wire = Vec::new();
        resp.header_to_h1_wire(&mut wire);
        assert_eq!(wire, b"RateLimit: \"r\";r=1;t=2\r\n");
    }
}
