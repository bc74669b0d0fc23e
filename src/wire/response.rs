//! Every answer floodgate makes itself, built in one place: problem+json bodies (RFC 9457)
//! for 400/401/404/408/429/500/502/503/504, and the RateLimit header fields of
//! draft-ietf-httpapi-ratelimit-headers.
//!
//! Bodies are written by hand rather than through `serde_json` (a 429 under attack is the
//! gateway's hottest answer): static text is appended as it is, and only the values that come
//! from the request (a path, a detail) go through [`push_json_str`]. Rule names and request ids
//! need no escaping: validation and [`crate::wire::client::RequestId`] keep them to plain ASCII.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::HeaderValue;
use pingora::http::ResponseHeader;
use pingora::prelude::*;

use crate::limiter::policy::{Policy, Recent};
use crate::limiter::Decision;
use crate::text::push_u64;
use crate::wire::header_names as names;

/// The content type of every error floodgate answers.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// `WWW-Authenticate` when no key was presented.
pub const CHALLENGE_MISSING: &str = "Bearer realm=\"floodgate\"";
/// `WWW-Authenticate` when the key presented is not valid.
pub const CHALLENGE_INVALID: &str = "Bearer realm=\"floodgate\", error=\"invalid_token\"";

/// An RFC 9457 problem document, with floodgate's extension members.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// A URI naming the kind of problem.
    pub kind: &'static str,
    /// Short summary of the kind.
    pub title: &'static str,
    /// The HTTP status.
    pub status: u16,
    /// What happened to this request.
    pub detail: String,
    /// The request's id (as in `X-Request-Id`), to quote to support.
    pub request_id: Option<String>,
    /// Rate-limit rules that rejected the request.
    pub violated_rules: Vec<std::sync::Arc<str>>,
    /// Seconds to wait before retrying (also in `Retry-After`).
    pub retry_after: Option<u64>,
    /// `WWW-Authenticate` to send with it (a 401), not part of the body.
    pub challenge: Option<&'static str>,
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
            challenge: None,
        }
    }

    /// 404: no route matches.
    pub fn not_found(path: &str) -> Self {
        let mut detail = String::with_capacity(path.len() + 20);
        detail.push_str("no route matches ");
        detail.push_str(path);
        Problem::new("urn:floodgate:problem:no-route", "Not Found", 404, detail)
    }

    /// 401: missing or unknown API key.
    pub fn unauthorized(missing: bool) -> Self {
        let detail = if missing {
            "this route requires an API key (x-api-key header or Authorization: Bearer)"
        } else {
            "the API key is not valid"
        };
        let mut p = Problem::new(
            "urn:floodgate:problem:unauthorized",
            "Unauthorized",
            401,
            detail,
        );
        p.challenge = Some(if missing {
            CHALLENGE_MISSING
        } else {
            CHALLENGE_INVALID
        });
        p
    }

    /// 401: a bearer token that is not valid; `detail` says why, never what the token holds.
    pub fn invalid_token(detail: &str) -> Self {
        let mut p = Problem::new(
            "urn:floodgate:problem:invalid-token",
            "Unauthorized",
            401,
            detail,
        );
        p.challenge = Some(CHALLENGE_INVALID);
        p
    }

    /// 401: a route that takes tokens only, and the request has none.
    pub fn token_required() -> Self {
        let mut p = Problem::new(
            "urn:floodgate:problem:unauthorized",
            "Unauthorized",
            401,
            "this route requires a bearer token (Authorization: Bearer <JWT>)",
        );
        p.challenge = Some(CHALLENGE_MISSING);
        p
    }

    /// 403: the client's address is not let in (`allow_ips` / `deny_ips`).
    pub fn ip_refused() -> Self {
        Problem::new(
            "urn:floodgate:problem:ip-refused",
            "Forbidden",
            403,
            "requests from this client address are not accepted here",
        )
    }

    /// 400: a request the gateway will not route (a malformed host or path), or could not read.
    pub fn bad_request(detail: impl Into<String>) -> Self {
        Problem::new(
            "urn:floodgate:problem:bad-request",
            "Bad Request",
            400,
            detail,
        )
    }

    /// 408: the request head did not arrive within `header_timeout`.
    pub fn request_timeout() -> Self {
        Problem::new(
            "urn:floodgate:problem:request-timeout",
            "Request Timeout",
            408,
            "the request head did not arrive within the server's header_timeout",
        )
    }

    /// 408: the request body did not arrive within `body_timeout`.
    pub fn body_timeout() -> Self {
        Problem::new(
            "urn:floodgate:problem:request-timeout",
            "Request Timeout",
            408,
            "the request body did not arrive within the server's body_timeout",
        )
    }

    /// 429: an HTTP/2 connection already has as many requests waiting for their bodies as one
    /// connection may (see `crate::request::body`).
    pub fn too_many_uploads(limit: usize) -> Self {
        let mut p = Problem::new(
            "urn:floodgate:problem:too-many-uploads",
            "Too Many Requests",
            429,
            format!("at most {limit} requests of one connection may wait for their bodies at once"),
        );
        p.retry_after = Some(1);
        p
    }

    /// 429 (or a rule's own status): rate-limit rules rejected the request. Takes the
    /// verdict's list of rules rather than copying it (an allocation, and a shared reference
    /// count moved per rule, on every refusal).
    pub fn rate_limited(status: u16, rules: Vec<std::sync::Arc<str>>, retry_after: u64) -> Self {
        let title = if status == 429 {
            "Too Many Requests"
        } else {
            "Request Rejected"
        };
        let mut detail = String::with_capacity(48);
        detail.push_str("rate limit exceeded for rule(s) ");
        push_joined(&mut detail, &rules);
        let mut p = Problem::new("urn:floodgate:problem:rate-limited", title, status, detail);
        p.violated_rules = rules;
        p.retry_after = Some(retry_after);
        p
    }

    /// 503: the store failed and `on_store_error = "closed"` rules refuse.
    pub fn limiter_unavailable(rules: Vec<std::sync::Arc<str>>, retry_after: u64) -> Self {
        let mut detail = String::with_capacity(96);
        detail.push_str("the rate-limit store is unavailable and rule(s) ");
        push_joined(&mut detail, &rules);
        detail.push_str(" refuse requests until it is back");
        let mut p = Problem::new(
            "urn:floodgate:problem:limiter-unavailable",
            "Service Unavailable",
            503,
            detail,
        );
        p.violated_rules = rules;
        p.retry_after = Some(retry_after);
        p
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

    /// 503: every target of the upstream is down (failed its health checks or was ejected),
    /// so nothing was sent; `retry_after` is when one may be back.
    pub fn no_healthy_upstream(upstream: &str, retry_after: u64) -> Self {
        let mut p = Problem::new(
            "urn:floodgate:problem:no-healthy-upstream",
            "Service Unavailable",
            503,
            format!("upstream \"{upstream}\" has no healthy target"),
        );
        p.retry_after = Some(retry_after.max(1));
        p
    }

    /// 503: the upstream is at its adaptive concurrency limit and the request got no turn
    /// (`reason`: it waited `queue_timeout`, or the queue was full); nothing was sent.
    pub fn upstream_overloaded(upstream: &str, reason: &str, retry_after: u64) -> Self {
        let why = if reason == "queue_full" {
            "its queue is full"
        } else {
            "no turn came in time"
        };
        let mut p = Problem::new(
            "urn:floodgate:problem:upstream-overloaded",
            "Service Unavailable",
            503,
            format!("upstream \"{upstream}\" is at its concurrency limit and {why}"),
        );
        p.retry_after = Some(retry_after.max(1));
        p
    }

    /// 500: the gateway itself failed.
    pub fn internal() -> Self {
        Problem::new(
            "urn:floodgate:problem:internal",
            "Internal Server Error",
            500,
            "the gateway failed",
        )
    }

    /// The JSON body.
    pub fn to_body(&self) -> Bytes {
        // Written in this thread's scratch and copied once into a body of its exact size: a
        // 429's body is the hottest answer.
        crate::text::with_scratch(|out| {
            out.push_str("{\"type\":\"");
            out.push_str(self.kind);
            out.push_str("\",\"title\":\"");
            out.push_str(self.title);
            out.push_str("\",\"status\":");
            push_u64(out, u64::from(self.status));
            out.push_str(",\"detail\":");
            push_json_str(out, &self.detail);
            if let Some(id) = &self.request_id {
                out.push_str(",\"request_id\":");
                push_json_str(out, id);
            }
            if !self.violated_rules.is_empty() {
                out.push_str(",\"violated_rules\":[");
                for (i, r) in self.violated_rules.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    push_json_str(out, r);
                }
                out.push(']');
            }
            if let Some(secs) = self.retry_after {
                out.push_str(",\"retry_after\":");
                push_u64(out, secs);
            }
            out.push('}');
            Bytes::copy_from_slice(out.as_bytes())
        })
    }

    /// The whole answer: this problem with the headers its status calls for.
    pub fn answer(self) -> Answer {
        Answer {
            ratelimit: None,
            close: self.status == 400,
            problem: self,
        }
    }
}

/// A complete answer floodgate makes itself, ready for the proxy to write.
#[derive(Debug, Clone)]
pub struct Answer {
    /// The body's problem document (its status, `Retry-After` and `WWW-Authenticate` are the
    /// answer's).
    pub problem: Problem,
    /// RateLimit header fields of the rules that applied.
    pub ratelimit: Option<RateLimitHeaders>,
    /// Close the connection after this answer (the request could not be trusted to frame
    /// the next one).
    pub close: bool,
}

impl Answer {
    /// The status.
    pub fn status(&self) -> u16 {
        self.problem.status
    }

    /// `Retry-After` seconds.
    pub fn retry_after(&self) -> Option<u64> {
        self.problem.retry_after
    }

    /// `WWW-Authenticate` (401).
    pub fn challenge(&self) -> Option<&'static str> {
        self.problem.challenge
    }

    /// The rules that refused the request, comma-separated, for the access log (joined only
    /// when a line is written: most refusals are not logged).
    pub fn rejected_by(&self) -> Option<String> {
        let rules = &self.problem.violated_rules;
        (!rules.is_empty()).then(|| rules.join(","))
    }

    /// The response header, Content-Length set for `body_len` bytes of body. The RateLimit
    /// fields' values go into it (an answer is written once).
    pub fn header(&mut self, request_id: &HeaderValue, body_len: usize) -> Result<ResponseHeader> {
        let ratelimit = self.ratelimit.as_ref().map_or(0, RateLimitHeaders::count);
        // Without Pingora's case map: each field goes into one map, not two, and is written
        // in lowercase (Pingora titles the standard Content-Type, Content-Length and
        // Cache-Control), as HTTP/2 and Envoy spell fields. Names are case-insensitive; on the
        // 429 path, the answer an attack is served, this is 7% of its instructions.
        let mut resp = ResponseHeader::build_no_case(self.status(), Some(6 + ratelimit))?;
        names::CONTENT_TYPE.set_response(&mut resp, HeaderValue::from_static(PROBLEM_JSON))?;
        names::CONTENT_LENGTH.set_response(&mut resp, number_value(body_len as u64))?;
        names::CACHE_CONTROL.set_response(&mut resp, HeaderValue::from_static("no-store"))?;
        names::X_REQUEST_ID.set_response(&mut resp, request_id.clone())?;
        if let Some(secs) = self.retry_after() {
            names::RETRY_AFTER.set_response(&mut resp, number_value(secs))?;
        }
        if let Some(c) = self.challenge() {
            names::WWW_AUTHENTICATE.set_response(&mut resp, HeaderValue::from_static(c))?;
        }
        if let Some(h) = self.ratelimit.take() {
            h.apply(&mut resp)?;
        }
        Ok(resp)
    }
}

/// A whole HTTP/1.1 answer as raw bytes, for answers written below the HTTP layer (see
/// `crate::connection`): a request head that never completes (408), or one Pingora refused to
/// parse (its bare `400`/`405` replaced). It carries a fresh request id (body and
/// `x-request-id`) and closes the connection.
pub fn raw_answer(mut problem: Problem) -> Vec<u8> {
    let id = crate::wire::client::RequestId::of(&http::HeaderMap::new());
    problem.request_id = Some(id.as_str().to_owned());
    let body = problem.to_body();
    let mut out = String::with_capacity(240 + body.len());
    out.push_str("HTTP/1.1 ");
    push_u64(&mut out, u64::from(problem.status));
    out.push(' ');
    out.push_str(
        http::StatusCode::from_u16(problem.status)
            .ok()
            .and_then(|s| s.canonical_reason())
            .unwrap_or("Error"),
    );
    out.push_str("\r\ncontent-type: ");
    out.push_str(PROBLEM_JSON);
    out.push_str("\r\ncontent-length: ");
    push_u64(&mut out, body.len() as u64);
    out.push_str("\r\nx-request-id: ");
    out.push_str(id.as_str());
    out.push_str("\r\ncache-control: no-store\r\nconnection: close\r\n\r\n");
    let mut bytes = out.into_bytes();
    bytes.extend_from_slice(&body);
    bytes
}

/// The raw 408 answer to a request head that did not arrive within `header_timeout`.
pub fn request_timeout_bytes() -> Vec<u8> {
    raw_answer(Problem::request_timeout())
}

/// 405: a method floodgate does not proxy (`CONNECT`).
pub fn method_not_allowed(method: &str) -> Problem {
    Problem::new(
        "urn:floodgate:problem:method-not-allowed",
        "Method Not Allowed",
        405,
        format!("{method} is not proxied"),
    )
}

fn push_joined(out: &mut String, names: &[std::sync::Arc<str>]) {
    for (i, n) in names.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        out.push_str(n);
    }
}

/// Whether `s` holds a byte JSON escapes: a quote, a backslash or a control character. Eight
/// bytes at a time (SWAR): a 429's document passes ~150 bytes of detail, request id and rule
/// names through here, and a byte-by-byte scan costs several instructions a byte.
fn needs_json_escape(s: &[u8]) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    // Nonzero (in some byte's high bit) exactly when some byte of `v` is zero / below `n`
    // (`n` at most 0x80): the classic "has zero byte" and "has less" tests. A borrow can set
    // bits above a true hit, never without one.
    let zero = |v: u64| v.wrapping_sub(ONES) & !v & HIGHS;
    let below = |v: u64, n: u64| v.wrapping_sub(ONES * n) & !v & HIGHS;
    let mut chunks = s.chunks_exact(8);
    for chunk in &mut chunks {
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(chunk);
        let v = u64::from_le_bytes(bytes);
        let hit = zero(v ^ (ONES * u64::from(b'"')))
            | zero(v ^ (ONES * u64::from(b'\\')))
            | below(v, 0x20);
        if hit != 0 {
            return true;
        }
    }
    chunks
        .remainder()
        .iter()
        .any(|&b| b == b'"' || b == b'\\' || b < 0x20)
}

/// Appends `s` as a JSON string (quotes, backslashes and control characters escaped).
pub fn push_json_str(out: &mut String, s: &str) {
    out.push('"');
    if !needs_json_escape(s.as_bytes()) {
        out.push_str(s);
    } else {
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                c if (c as u32) < 0x20 => {
                    const HEX: &[u8; 16] = b"0123456789abcdef";
                    out.push_str("\\u00");
                    out.push(char::from(HEX[(c as usize) >> 4]));
                    out.push(char::from(HEX[(c as usize) & 0xf]));
                }
                c => out.push(c),
            }
        }
    }
    out.push('"');
}

/// Whole seconds for a client: rounded up, at least 1 (Retry-After must never say 0 when the
/// request would still be refused).
pub fn whole_seconds_at_least_one(d: Duration) -> u64 {
    ceil_secs(d).max(1)
}

/// The wall-clock time in ns since the epoch, for the length of a calendar rule's current
/// period in `RateLimit-Policy`.
fn unix_now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
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
    /// `RateLimit-Policy` and `RateLimit` (`None` when no rule shows headers).
    fields: Option<(HeaderValue, HeaderValue)>,
    /// `X-RateLimit-Limit/Remaining/Reset` of the most restrictive rule, when enabled.
    pub legacy: Option<(u64, u64, u64)>,
}

thread_local! {
    /// Where [`RateLimitHeaders::build`] writes the two fields' text before copying each into
    /// its value: one allocation per field instead of a growing `String` and then its copy.
    static SCRATCH: std::cell::RefCell<(String, String)> =
        const { std::cell::RefCell::new((String::new(), String::new())) };
    /// What this thread made for the last rules it answered for alone ([`OneRule`]).
    static ONE_RULE: std::cell::RefCell<Recent<OneRule>> =
        const { std::cell::RefCell::new(Recent::new()) };
}

/// The scratch text kept between requests, at most (a longer one is given back).
const SCRATCH_KEPT: usize = 4096;

/// Frees scratch text that grew past [`SCRATCH_KEPT`], so that one request's long fields
/// are not held by the thread for good.
fn give_back_if_long(text: &mut String) {
    if text.capacity() > SCRATCH_KEPT {
        *text = String::new();
    }
}

/// What the fields of a request that one rule shows (the usual case) take from the rule alone:
/// its whole `RateLimit-Policy` value and the start of its `RateLimit` member. Made once per
/// thread and policy, so that such a request writes, checks and allocates only its `RateLimit`
/// value: the name's escaping, the limit's and window's digits and the policy value's check
/// and allocation were the same for every request.
#[derive(Debug)]
struct OneRule {
    /// `RateLimit-Policy` (`None` should the text not be a header value: not reachable, see
    /// [`RateLimitHeaders::build`]).
    policy: Option<HeaderValue>,
    /// `"name";r=`.
    state_prefix: String,
}

impl OneRule {
    fn of(rule: &Policy) -> OneRule {
        let mut policy = String::new();
        push_policy_member(&mut policy, rule);
        let mut state_prefix = String::new();
        push_state_prefix(&mut state_prefix, rule);
        OneRule {
            policy: HeaderValue::from_str(&policy).ok(),
            state_prefix,
        }
    }
}

impl RateLimitHeaders {
    /// Builds the fields. `q` is the rule's limit, `w` its window in seconds (omitted for
    /// concurrency, which has none), `r` what is left, `t`: for a rule that rejected the
    /// request, seconds until it would pass (its `Retry-After`); otherwise seconds until its
    /// quota is all back. On a refused request the decisions already say what each rule
    /// really has left (see [`crate::limiter::engine::Applied::decision`]).
    pub fn build<'a, I>(applied: I, legacy: bool) -> Self
    where
        I: Iterator<Item = (&'a Arc<Policy>, &'a Decision)> + Clone,
    {
        let mut shown = applied.clone().filter(|(rule, _)| rule.headers);
        // One rule shown, and not a calendar one (its `w` follows the calendar).
        if let (Some((rule, d)), None) = (shown.next(), shown.next()) {
            if rule.limit.calendar().is_none() {
                if let Some(fields) = Self::one(rule, d, legacy) {
                    return fields;
                }
            }
        }
        SCRATCH.with(|scratch| {
            let mut scratch = scratch.borrow_mut();
            let (policy, state) = &mut *scratch;
            policy.clear();
            state.clear();
            let legacy = write_fields(applied.map(|(p, d)| (&**p, d)), legacy, policy, state);
            // The text is rule names that validation kept to header-safe characters, percent-
            // and backslash-escaped, and digits: a value it cannot make is not reachable, and
            // would leave the fields out rather than fail the response.
            let fields = if policy.is_empty() {
                None
            } else {
                HeaderValue::from_str(policy)
                    .ok()
                    .zip(HeaderValue::from_str(state).ok())
            };
            give_back_if_long(policy);
            give_back_if_long(state);
            RateLimitHeaders { fields, legacy }
        })
    }

    /// The fields of a request that `rule` alone shows, from what this thread keeps for it
    /// ([`OneRule`]); `None` when the thread keeps nothing (it is going away) and the caller
    /// writes them whole.
    fn one(rule: &Arc<Policy>, d: &Decision, legacy: bool) -> Option<Self> {
        Recent::with_kept(
            &ONE_RULE,
            rule,
            || OneRule::of(rule),
            |kept| {
                let policy = kept.policy.clone()?;
                let (remaining, t) = state_numbers(d);
                let state = SCRATCH
                    .try_with(|scratch| {
                        let text = &mut scratch.try_borrow_mut().ok()?.1;
                        text.clear();
                        text.push_str(&kept.state_prefix);
                        push_state_numbers(text, remaining, t);
                        let value = HeaderValue::from_str(text).ok();
                        give_back_if_long(text);
                        value
                    })
                    .ok()
                    .flatten()?;
                Some(RateLimitHeaders {
                    fields: Some((policy, state)),
                    legacy: legacy.then(|| (rule.limit.limit(), remaining, t)),
                })
            },
        )
        .ok()
        .flatten()
    }

    /// The fields as text, for an answer that is not an HTTP response (the rate-limit
    /// service's `response_headers_to_add`): `RateLimit-Policy` and `RateLimit` (both empty
    /// when no rule shows headers), and the legacy fields when `legacy`.
    pub fn text<'a>(
        applied: impl Iterator<Item = (&'a Policy, &'a Decision)>,
        legacy: bool,
    ) -> (String, String, Option<(u64, u64, u64)>) {
        let (mut policy, mut state) = (String::new(), String::new());
        let legacy = write_fields(applied, legacy, &mut policy, &mut state);
        (policy, state, legacy)
    }

    /// `RateLimit-Policy` ("" when no rule shows headers).
    pub fn policy(&self) -> &str {
        self.fields
            .as_ref()
            .and_then(|(p, _)| p.to_str().ok())
            .unwrap_or("")
    }

    /// `RateLimit` ("" when no rule shows headers).
    pub fn state(&self) -> &str {
        self.fields
            .as_ref()
            .and_then(|(_, s)| s.to_str().ok())
            .unwrap_or("")
    }

    /// How many header fields [`Self::apply`] adds.
    pub fn count(&self) -> usize {
        let ietf = if self.fields.is_some() { 2 } else { 0 };
        ietf + if self.legacy.is_some() { 3 } else { 0 }
    }

    /// Adds the fields to a response, giving it their values (a response that will be
    /// followed by another, a `1xx`, gets a copy through [`Clone`]).
    pub fn apply(self, resp: &mut ResponseHeader) -> Result<()> {
        if let Some((policy, state)) = self.fields {
            names::RATELIMIT_POLICY.set_response(resp, policy)?;
            names::RATELIMIT.set_response(resp, state)?;
        }
        if let Some((limit, remaining, reset)) = self.legacy {
            names::X_RATELIMIT_LIMIT.set_response(resp, number_value(limit))?;
            names::X_RATELIMIT_REMAINING.set_response(resp, number_value(remaining))?;
            names::X_RATELIMIT_RESET.set_response(resp, number_value(reset))?;
        }
        Ok(())
    }
}

/// Writes the fields' text into `policy` and `state`: `"name";q=limit;w=window, ...` and
/// `"name";r=remaining;t=seconds, ...` (no `core::fmt`: this runs for every request). Returns
/// the legacy fields of the most restrictive rule when `legacy`.
fn write_fields<'a>(
    applied: impl Iterator<Item = (&'a Policy, &'a Decision)>,
    legacy: bool,
    policy: &mut String,
    state: &mut String,
) -> Option<(u64, u64, u64)> {
    let mut tightest: Option<(u64, u64, u64)> = None;
    for (rule, d) in applied {
        if !rule.headers {
            continue;
        }
        let sep = if policy.is_empty() { "" } else { ", " };
        // Room for a member at once (the name, its quotes and escapes aside, 56 bytes hold
        // the separator and two 20-digit integers with their keys): grown push by push, the
        // two fields took six allocations for one rule.
        let room = rule.name.len() + 56;
        policy.reserve(room);
        state.reserve(room);
        policy.push_str(sep);
        push_policy_member(policy, rule);
        let (remaining, t) = state_numbers(d);
        state.push_str(sep);
        push_state_prefix(state, rule);
        push_state_numbers(state, remaining, t);
        if legacy {
            let tighter = match tightest {
                None => true,
                Some((_, r, _)) => remaining < r,
            };
            if tighter {
                tightest = Some((rule.limit.limit(), remaining, t));
            }
        }
    }
    tightest
}

/// Appends `rule`'s `RateLimit-Policy` member: `"name";q=limit;w=window`.
fn push_policy_member(policy: &mut String, rule: &Policy) {
    push_sf_string(policy, &rule.name);
    policy.push_str(";q=");
    push_sf_integer(policy, rule.limit.limit());
    if let Some(c) = rule.limit.calendar() {
        // A calendar period's own length: a day is 23 or 25 hours across DST.
        policy.push_str(";w=");
        push_sf_integer(policy, ceil_secs(c.length_at(unix_now_ns())).max(1));
    } else if !rule.limit.window().is_zero() {
        policy.push_str(";w=");
        push_sf_integer(policy, ceil_secs(rule.limit.window()).max(1));
    }
}

/// Appends the start of `rule`'s `RateLimit` member: `"name";r=`.
fn push_state_prefix(state: &mut String, rule: &Policy) {
    push_sf_string(state, &rule.name);
    state.push_str(";r=");
}

/// Appends the rest of a `RateLimit` member: `remaining;t=t`.
fn push_state_numbers(state: &mut String, remaining: u64, t: u64) {
    push_sf_integer(state, remaining);
    state.push_str(";t=");
    push_sf_integer(state, t);
}

/// A rule's `RateLimit` numbers for its decision `d`: what is left (`r`) and `t`, the seconds
/// until its quota is all back, or for a rule that refused the request until it would pass
/// (its `Retry-After`). On a refused request the engine already shows what each rule really
/// has left (uncharged or charged: see `Applied::decision`).
fn state_numbers(d: &Decision) -> (u64, u64) {
    let t = if d.allowed {
        ceil_secs(d.reset)
    } else {
        whole_seconds_at_least_one(d.retry_after)
    };
    (d.remaining, t)
}

/// `n` in decimal as a header value, in one allocation of its digits' size (from a `String`
/// or `u64::into` a value takes two: the buffer, then the shared handle of a buffer with
/// room to spare).
fn number_value(n: u64) -> HeaderValue {
    HeaderValue::from_str(itoa::Buffer::new().format(n))
        .unwrap_or_else(|_| HeaderValue::from_static("0"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::policy::Scope;
    use crate::limiter::{Algorithm, Limit};

    fn fields(rule: &Arc<Policy>, remaining: u64) -> RateLimitHeaders {
        let d = Decision {
            allowed: true,
            limit: rule.limit.limit(),
            remaining,
            reset: Duration::from_secs(2),
            retry_after: Duration::ZERO,
            delay: Duration::ZERO,
        };
        RateLimitHeaders::build(std::iter::once((rule, &d)), true)
    }

    /// A rule shown alone gets its fields from what the thread keeps for its policy: the
    /// numbers of each decision, and after a reload (a new policy of the same name) the new
    /// rule's limit and window, not the old one's.
    #[test]
    fn a_lone_rules_fields_follow_its_decisions_and_a_reload() {
        let policy = |limit, secs| {
            let limit = Limit::police(
                Algorithm::TokenBucket,
                limit,
                Duration::from_secs(secs),
                limit,
            );
            Arc::new(Policy::with_defaults("per-ip", limit, Scope::Local))
        };
        let old = policy(10, 1);
        for remaining in [9, 4] {
            let h = fields(&old, remaining);
            assert_eq!(h.policy(), "\"per-ip\";q=10;w=1");
            assert_eq!(h.state(), format!("\"per-ip\";r={remaining};t=2"));
            assert_eq!(h.legacy, Some((10, remaining, 2)));
        }
        let reloaded = policy(20, 60);
        let h = fields(&reloaded, 19);
        assert_eq!(h.policy(), "\"per-ip\";q=20;w=60");
        assert_eq!(h.state(), "\"per-ip\";r=19;t=2");
        assert_eq!(h.legacy, Some((20, 19, 2)));
        assert_eq!(fields(&old, 3).policy(), "\"per-ip\";q=10;w=1");
    }

    /// The eight-bytes-at-a-time check says what a byte-by-byte one says: every byte value at
    /// every position of strings of 1 to 24 bytes among harmless ones, and random strings.
    #[test]
    fn the_escape_check_agrees_with_a_byte_scan() {
        let naive = |s: &[u8]| s.iter().any(|&b| b == b'"' || b == b'\\' || b < 0x20);
        for len in 1..=24 {
            for at in 0..len {
                for byte in 0..=255u8 {
                    let mut s = vec![b'a'; len];
                    s[at] = byte;
                    assert_eq!(needs_json_escape(&s), naive(&s), "{s:?}");
                }
            }
        }
        let mut rng = fastrand::Rng::with_seed(7);
        for _ in 0..20_000 {
            let len = rng.usize(0..40);
            // Mostly bytes near the ones that matter (0x1f/0x20, 0x22, 0x5c, 0x80).
            let s: Vec<u8> = (0..len)
                .map(|_| match rng.u8(0..4) {
                    0 => rng.u8(..),
                    1 => rng.u8(0x18..0x28),
                    2 => rng.u8(0x58..0x60),
                    _ => rng.u8(0x21..0x7f),
                })
                .collect();
            assert_eq!(needs_json_escape(&s), naive(&s), "{s:?}");
        }
    }

    #[test]
    fn numbers_are_their_decimal_digits() {
        for n in [0, 7, 10, 227, 3600, u64::MAX] {
            assert_eq!(number_value(n), n.to_string().as_str());
        }
    }

    #[test]
    fn seconds_round_up() {
        assert_eq!(whole_seconds_at_least_one(Duration::ZERO), 1);
        assert_eq!(whole_seconds_at_least_one(Duration::from_millis(1001)), 2);
        assert_eq!(ceil_secs(Duration::from_secs(3)), 3);
        assert_eq!(ceil_secs(Duration::ZERO), 0);
    }

    fn json(p: &Problem) -> serde_json::Value {
        serde_json::from_slice(&p.to_body()).expect("valid JSON")
    }

    #[test]
    fn problem_is_rfc9457_json() {
        let rules: Vec<Arc<str>> = vec!["login".into(), "burst".into()];
        let mut p = Problem::rate_limited(429, rules.clone(), 3);
        p.request_id = Some("abc-1".into());
        let v = json(&p);
        assert_eq!(v["type"], "urn:floodgate:problem:rate-limited");
        assert_eq!(v["title"], "Too Many Requests");
        assert_eq!(v["status"], 429);
        assert_eq!(v["detail"], "rate limit exceeded for rule(s) login, burst");
        assert_eq!(v["violated_rules"][1], "burst");
        assert_eq!(v["retry_after"], 3);
        assert_eq!(v["request_id"], "abc-1");
        assert_eq!(
            json(&Problem::rate_limited(403, rules.clone(), 1))["title"],
            "Request Rejected"
        );
        let v = json(&Problem::unauthorized(true));
        assert!(v.get("request_id").is_none() && v.get("violated_rules").is_none());
    }

    #[test]
    fn every_answer_has_its_status_and_headers() {
        let rules: Vec<Arc<str>> = vec!["r".into()];
        let cases = [
            (Problem::bad_request("x"), 400, true),
            (Problem::unauthorized(true), 401, false),
            (Problem::not_found("/x"), 404, false),
            (Problem::request_timeout(), 408, false),
            (Problem::rate_limited(429, rules.clone(), 2), 429, false),
            (Problem::internal(), 500, false),
            (Problem::upstream(502, "orders"), 502, false),
            (Problem::limiter_unavailable(rules.clone(), 1), 503, false),
            (Problem::upstream(504, "orders"), 504, false),
        ];
        for (p, status, close) in cases {
            assert_eq!(json(&p)["status"], status);
            let mut a = p.answer();
            assert_eq!(a.status(), status);
            assert_eq!(a.close, close, "{status}");
            let h = a.header(&HeaderValue::from_static("id-1"), 10).unwrap();
            assert_eq!(h.status.as_u16(), status);
            assert_eq!(h.headers["content-type"], PROBLEM_JSON);
            assert_eq!(h.headers["content-length"], "10");
            assert_eq!(h.headers["x-request-id"], "id-1");
            assert_eq!(
                h.headers.contains_key("retry-after"),
                matches!(status, 429 | 503)
            );
            assert_eq!(h.headers.contains_key("www-authenticate"), status == 401);
        }
        assert_eq!(
            Problem::unauthorized(false).answer().challenge(),
            Some(CHALLENGE_INVALID)
        );
    }

    #[test]
    fn request_paths_are_escaped() {
        let v = json(&Problem::not_found("/a\"b\\c\u{1}d\u{e9}"));
        assert_eq!(v["detail"], "no route matches /a\"b\\c\u{1}d\u{e9}");
    }

    #[test]
    fn the_408_is_a_whole_http_answer() {
        let raw = String::from_utf8(request_timeout_bytes()).unwrap();
        let (head, body) = raw.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 408 Request Timeout\r\n"));
        assert!(head.contains(&format!("content-length: {}", body.len())));
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["status"], 408);
        let id = v["request_id"].as_str().unwrap();
        assert_eq!(id.len(), 32);
        assert!(head.contains(&format!("x-request-id: {id}")));
        let other = String::from_utf8(request_timeout_bytes()).unwrap();
        assert!(!other.contains(id), "each answer has its own id");
    }
}
