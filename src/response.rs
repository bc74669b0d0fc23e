//! What floodgate itself answers: problem+json bodies (RFC 9457) for 401/404/429/502/503/504,
//! and the RateLimit header fields of draft-ietf-httpapi-ratelimit-headers.

use std::time::Duration;

use bytes::Bytes;
use pingora::http::ResponseHeader;
use pingora::prelude::*;
use pingora::proxy::Session;
use serde::Serialize;

use crate::limiter::Decision;
use crate::rules::Rule;
use crate::text::push_u64;

/// The content type of every error floodgate answers.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// An RFC 9457 problem document, with floodgate's extension members.
#[derive(Debug, Serialize)]
pub struct Problem {
    /// A URI naming the kind of problem.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// Short summary of the kind.
    pub title: &'static str,
    /// The HTTP status.
    pub status: u16,
    /// What happened to this request.
    pub detail: String,
    /// The request's id (as in `X-Request-Id`), to quote to support.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
    /// Rate-limit rules that rejected the request.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub violated_rules: Vec<String>,
    /// Seconds to wait before retrying (also in `Retry-After`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after: Option<u64>,
}

impl Problem {
    /// A problem with the standard fields only.
    pub fn new(
        kind: &'static str,
        title: &'static str,
        status: u16,
        detail: impl Into<String>,
    ) -> Self {
        Problem {
            kind,
            title,
            status,
            detail: detail.into(),
            request_id: None,
            violated_rules: Vec::new(),
            retry_after: None,
        }
    }

    /// 404: no route matches.
    pub fn not_found(path: &str) -> Self {
        Problem::new(
            "urn:floodgate:problem:no-route",
            "Not Found",
            404,
            format!("no route matches {path}"),
        )
    }

    /// 401: missing or unknown API key.
    pub fn unauthorized(missing: bool) -> Self {
        let detail = if missing {
            "this route requires an API key (x-api-key header or Authorization: Bearer)"
        } else {
            "the API key is not valid"
        };
        Problem::new(
            "urn:floodgate:problem:unauthorized",
            "Unauthorized",
            401,
            detail,
        )
    }

    /// 400: a request the gateway will not route (a malformed host or path).
    pub fn bad_request(detail: impl Into<String>) -> Self {
        Problem::new(
            "urn:floodgate:problem:bad-request",
            "Bad Request",
            400,
            detail,
        )
    }

    /// 502/504: the upstream failed.
    pub fn upstream(status: u16, upstream: &str) -> Self {
        let (title, detail) = if status == 504 {
            (
                "Gateway Timeout",
                format!("upstream \"{upstream}\" did not answer in time"),
            )
        } else {
            (
                "Bad Gateway",
                format!("upstream \"{upstream}\" could not be reached or failed"),
            )
        };
        Problem::new("urn:floodgate:problem:upstream", title, status, detail)
    }

    /// The JSON body.
    pub fn to_body(&self) -> Bytes {
        // Serializing plain strings and numbers cannot fail; fall back to a minimal body anyway.
        serde_json::to_vec(self)
            .map(Bytes::from)
            .unwrap_or_else(|_| Bytes::from_static(b"{}"))
    }
}

/// Whole seconds for a client: rounded up, at least 1 (Retry-After must never say 0 when the
/// request would still be refused).
pub fn whole_seconds_at_least_one(d: Duration) -> u64 {
    ceil_secs(d).max(1)
}

/// Whole seconds, rounded up (`t` of RateLimit may be 0 when the quota is already full).
pub fn ceil_secs(d: Duration) -> u64 {
    // Saturating: `Duration::MAX` would overflow, and a header value is no place to panic.
    d.as_secs().saturating_add(u64::from(d.subsec_nanos() > 0))
}

/// The largest RFC 8941 sf-integer (15 digits); RateLimit numbers beyond it are sent as it,
/// since a longer one makes a client's structured-field parser refuse the whole field.
pub const SF_INTEGER_MAX: u64 = 999_999_999_999_999;

/// Appends `n` as an sf-integer, capped at [`SF_INTEGER_MAX`].
fn push_sf_integer(out: &mut String, n: u64) {
    push_u64(out, n.min(SF_INTEGER_MAX));
}

/// Appends `name` as an RFC 8941 sf-string. Config rule names exclude `"`, `\` and control
/// characters but may hold non-ASCII, which an sf-string cannot: those bytes are written
/// percent-encoded (`café` is `"caf%C3%A9"`); `"` and `\` are backslash-escaped should one
/// ever get here.
fn push_sf_string(out: &mut String, name: &str) {
    out.push('"');
    if name
        .bytes()
        .all(|b| (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\')
    {
        out.push_str(name);
    } else {
        for b in name.bytes() {
            match b {
                b'"' | b'\\' => {
                    out.push('\\');
                    out.push(char::from(b));
                }
                0x20..=0x7e => out.push(char::from(b)),
                _ => {
                    const HEX: &[u8; 16] = b"0123456789ABCDEF";
                    out.push('%');
                    out.push(char::from(HEX[usize::from(b >> 4)]));
                    out.push(char::from(HEX[usize::from(b & 0xf)]));
                }
            }
        }
    }
    out.push('"');
}

/// The RateLimit header fields for the rules that applied (and have `headers` on).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RateLimitHeaders {
    /// `RateLimit-Policy` (empty when no rule shows headers).
    pub policy: String,
    /// `RateLimit`.
    pub state: String,
    /// `X-RateLimit-Limit/Remaining/Reset` of the most restrictive rule, when enabled.
    pub legacy: Option<(u64, u64, u64)>,
}

impl RateLimitHeaders {
    /// Builds the fields. `q` is the rule's limit, `w` its window in seconds (omitted for
    /// concurrency, which has none), `r` what is left, `t` seconds until it is all back.
    pub fn build<'a>(
        applied: impl Iterator<Item = (&'a Rule, &'a Decision)>,
        legacy: bool,
    ) -> Self {
        let mut h = RateLimitHeaders::default();
        let mut tightest: Option<(u64, u64, u64)> = None;
        for (rule, d) in applied {
            if !rule.headers {
                continue;
            }
            let sep = if h.policy.is_empty() { "" } else { ", " };
            // "name";q=limit;w=window, "name";r=remaining;t=seconds (no core::fmt: this runs
            // for every request).
            h.policy.push_str(sep);
            push_sf_string(&mut h.policy, &rule.name);
            h.policy.push_str(";q=");
            push_sf_integer(&mut h.policy, rule.limit.limit);
            if !rule.limit.window.is_zero() {
                h.policy.push_str(";w=");
                push_sf_integer(&mut h.policy, ceil_secs(rule.limit.window).max(1));
            }
            let t = ceil_secs(if d.allowed {
                d.reset
            } else {
                d.retry_after.max(d.reset)
            });
            h.state.push_str(sep);
            push_sf_string(&mut h.state, &rule.name);
            h.state.push_str(";r=");
            push_sf_integer(&mut h.state, d.remaining);
            h.state.push_str(";t=");
            push_sf_integer(&mut h.state, t);
            if legacy {
                let candidate = (rule.limit.limit, d.remaining, t);
                let tighter = match tightest {
                    None => true,
                    Some((_, r, _)) => d.remaining < r,
                };
                if tighter {
                    tightest = Some(candidate);
                }
            }
        }
        h.legacy = tightest;
        h
    }

    /// Adds the fields to a response.
    pub fn apply(&self, resp: &mut ResponseHeader) -> Result<()> {
        if !self.policy.is_empty() {
            resp.insert_header("RateLimit-Policy", &self.policy)?;
            resp.insert_header("RateLimit", &self.state)?;
        }
        if let Some((limit, remaining, reset)) = self.legacy {
            resp.insert_header("X-RateLimit-Limit", limit.to_string())?;
            resp.insert_header("X-RateLimit-Remaining", remaining.to_string())?;
            resp.insert_header("X-RateLimit-Reset", reset.to_string())?;
        }
        Ok(())
    }
}

/// Writes a complete problem+json response. `respond_error` cannot carry headers, so the
/// header is built here with its Content-Length, then header and body are written.
pub async fn send_problem(
    session: &mut Session,
    problem: &Problem,
    extra: impl FnOnce(&mut ResponseHeader) -> Result<()>,
) -> Result<()> {
    let body = problem.to_body();
    let mut resp = ResponseHeader::build(problem.status, Some(6))?;
    resp.insert_header(http::header::CONTENT_TYPE, PROBLEM_JSON)?;
    resp.insert_header(http::header::CONTENT_LENGTH, body.len().to_string())?;
    resp.insert_header(http::header::CACHE_CONTROL, "no-store")?;
    extra(&mut resp)?;
    session.write_response_header(Box::new(resp), false).await?;
    session.write_response_body(Some(body), true).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_round_up() {
        assert_eq!(whole_seconds_at_least_one(Duration::ZERO), 1);
        assert_eq!(whole_seconds_at_least_one(Duration::from_millis(1001)), 2);
        assert_eq!(ceil_secs(Duration::from_secs(3)), 3);
        assert_eq!(ceil_secs(Duration::ZERO), 0);
    }

    #[test]
    fn problem_is_rfc9457_json() {
        let mut p = Problem::new("urn:x", "Too Many Requests", 429, "slow down");
        p.violated_rules.push("login".into());
        p.retry_after = Some(3);
        let v: serde_json::Value = serde_json::from_slice(&p.to_body()).unwrap();
        assert_eq!(v["type"], "urn:x");
        assert_eq!(v["status"], 429);
        assert_eq!(v["violated_rules"][0], "login");
        assert!(v.get("request_id").is_none());
    }
}
