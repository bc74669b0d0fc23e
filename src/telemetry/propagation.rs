//! W3C trace context (`traceparent`, `tracestate`) in and out of HTTP headers.

use http::{HeaderMap, HeaderName, HeaderValue};
use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::{SpanContext, SpanId, TraceId};
use opentelemetry::Context;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use pingora::http::RequestHeader;

/// `traceparent`.
pub const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
/// `tracestate`.
pub const TRACESTATE: HeaderName = HeaderName::from_static("tracestate");

/// Reads a request's headers for the propagator.
struct Headers<'a>(&'a HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        // A repeated traceparent is ambiguous: W3C says to start a new trace then.
        let mut all = self.0.get_all(key).iter();
        let first = all.next()?;
        if all.next().is_some() && key == TRACEPARENT.as_str() {
            return None;
        }
        first.to_str().ok()
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(HeaderName::as_str).collect()
    }
}

/// The context a request continues: the remote parent its `traceparent` names, or an empty
/// context (a new trace) when it has none or an invalid one.
pub fn extract(headers: &HeaderMap) -> Context {
    if !headers.contains_key(TRACEPARENT) {
        return Context::new();
    }
    TraceContextPropagator::new().extract(&Headers(headers))
}

/// The `traceparent` value naming `span` as the parent.
pub fn traceparent(span: &SpanContext) -> String {
    format!(
        "00-{}-{}-{:02x}",
        span.trace_id(),
        span.span_id(),
        span.trace_flags().to_u8()
    )
}

/// Sets `traceparent` (and `tracestate`, when the trace has one) on the upstream request for
/// `sc`, replacing whatever the client sent. Through Pingora's header methods, which keep its
/// record of header-name spellings in step.
pub fn inject(sc: &SpanContext, req: &mut RequestHeader) {
    req.remove_header(&TRACESTATE);
    if !sc.is_valid() {
        req.remove_header(&TRACEPARENT);
        return;
    }
    if let Ok(v) = HeaderValue::from_str(&traceparent(sc)) {
        let _ = req.insert_header(TRACEPARENT, v);
    }
    let state = sc.trace_state().header();
    if !state.is_empty() {
        if let Ok(v) = HeaderValue::from_str(&state) {
            let _ = req.insert_header(TRACESTATE, v);
        }
    }
}

/// Sets `traceparent` on the upstream request of an unsampled trace `trace_id`, with `span_id`
/// as the parent and the sampled flag clear; the caller's `tracestate` goes on only when its
/// context was `continued`. Written into a buffer on the stack: the header value is the one
/// allocation.
pub fn inject_unsampled(
    trace_id: TraceId,
    span_id: SpanId,
    continued: bool,
    req: &mut RequestHeader,
) {
    if !continued {
        req.remove_header(&TRACESTATE);
    }
    let mut buf = [0u8; 55];
    buf[..3].copy_from_slice(b"00-");
    hex_into(&trace_id.to_bytes(), &mut buf[3..35]);
    buf[35] = b'-';
    hex_into(&span_id.to_bytes(), &mut buf[36..52]);
    buf[52..].copy_from_slice(b"-00");
    if let Ok(v) = HeaderValue::from_bytes(&buf) {
        let _ = req.insert_header(TRACEPARENT, v);
    }
}

/// `bytes` as lowercase hex into `out` (twice their length).
fn hex_into(bytes: &[u8], out: &mut [u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for (i, b) in bytes.iter().enumerate() {
        out[2 * i] = DIGITS[usize::from(b >> 4)];
        out[2 * i + 1] = DIGITS[usize::from(b & 0xf)];
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::TraceContextExt;

    #[test]
    fn a_valid_traceparent_is_continued_and_a_repeated_one_is_not() {
        let mut h = HeaderMap::new();
        h.insert(
            TRACEPARENT,
            HeaderValue::from_static("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
        );
        let cx = extract(&h);
        let sc = cx.span().span_context().clone();
        assert!(sc.is_valid() && sc.is_remote() && sc.is_sampled());
        assert_eq!(
            sc.trace_id().to_string(),
            "0af7651916cd43dd8448eb211c80319c"
        );
        h.append(
            TRACEPARENT,
            HeaderValue::from_static("00-1af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
        );
        assert!(!extract(&h).span().span_context().is_valid());
    }

    #[test]
    fn an_unsampled_trace_passes_its_ids_on_with_the_sampled_flag_clear() {
        let mut out = RequestHeader::build("GET", b"/", None).unwrap();
        out.insert_header(TRACESTATE, "vendor=1").unwrap();
        let trace = TraceId::from_hex("0af7651916cd43dd8448eb211c80319c").unwrap();
        let span = SpanId::from_hex("b7ad6b7169203331").unwrap();
        inject_unsampled(trace, span, true, &mut out);
        assert_eq!(
            out.headers.get(TRACEPARENT).unwrap(),
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"
        );
        assert_eq!(out.headers.get(TRACESTATE).unwrap(), "vendor=1");
        // A new trace (not a caller's) passes on no tracestate of the client's.
        inject_unsampled(trace, span, false, &mut out);
        assert!(out.headers.get(TRACESTATE).is_none());
    }

    #[test]
    fn inject_replaces_the_clients_headers() {
        let mut h = HeaderMap::new();
        h.insert(
            TRACEPARENT,
            HeaderValue::from_static("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
        );
        h.insert(TRACESTATE, HeaderValue::from_static("vendor=1"));
        let mut out = RequestHeader::build("GET", b"/", None).unwrap();
        out.insert_header(TRACESTATE, "evil=1").unwrap();
        inject(extract(&h).span().span_context(), &mut out);
        assert_eq!(
            out.headers.get(TRACEPARENT).unwrap(),
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
        );
        assert_eq!(out.headers.get(TRACESTATE).unwrap(), "vendor=1");
        inject(&SpanContext::empty_context(), &mut out);
        assert!(out.headers.get(TRACEPARENT).is_none() && out.headers.get(TRACESTATE).is_none());
    }
}
