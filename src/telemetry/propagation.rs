//! W3C trace context (`traceparent`, `tracestate`) in and out of HTTP headers.

use http::{HeaderMap, HeaderValue};
use pingora::http::RequestHeader;

pub use crate::wire::header_names::{TRACEPARENT, TRACESTATE};

/// Longest `tracestate` continued (W3C: a vendor may cut one past 512 bytes).
const MAX_TRACESTATE: usize = 512;
/// Most `tracestate` members (W3C's limit).
const MAX_MEMBERS: usize = 32;

/// A caller's trace context, as its `traceparent` and `tracestate` name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Remote {
    /// The trace's id.
    pub trace_id: [u8; 16],
    /// The caller's span: floodgate's server span's parent.
    pub span_id: [u8; 8],
    /// The caller sampled the trace.
    pub sampled: bool,
    /// Its `tracestate`, when it sent a valid one.
    pub state: Option<String>,
}

/// The context a request continues: `None` (a new trace) when it has no `traceparent`, an
/// invalid one, or more than one (W3C says to start a new trace then).
pub fn extract(headers: &HeaderMap) -> Option<Remote> {
    let mut all = headers.get_all(TRACEPARENT.name()).iter();
    let first = all.next()?;
    if all.next().is_some() {
        return None;
    }
    let (trace_id, span_id, flags) = parse_traceparent(first.as_bytes())?;
    Some(Remote {
        trace_id,
        span_id,
        sampled: flags & 1 == 1,
        state: tracestate(headers),
    })
}

/// `version-traceid-parentid-flags` (W3C Trace Context, level 1): lowercase hex, ids not all
/// zero, version `ff` refused; a later version may append fields after a `-`.
fn parse_traceparent(v: &[u8]) -> Option<([u8; 16], [u8; 8], u8)> {
    if v.len() < 55 || v[2] != b'-' || v[35] != b'-' || v[52] != b'-' {
        return None;
    }
    let version = hex::<1>(&v[..2])?[0];
    if version == 0xff || (version == 0 && v.len() != 55) || (v.len() > 55 && v[55] != b'-') {
        return None;
    }
    let trace_id = hex::<16>(&v[3..35])?;
    let span_id = hex::<8>(&v[36..52])?;
    let flags = hex::<1>(&v[53..55])?[0];
    if trace_id == [0; 16] || span_id == [0; 8] {
        return None;
    }
    Some((trace_id, span_id, flags))
}

/// `N` bytes from `2N` lowercase hex digits.
fn hex<const N: usize>(s: &[u8]) -> Option<[u8; N]> {
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut out = [0u8; N];
    for (i, pair) in s.chunks_exact(2).enumerate().take(N) {
        out[i] = digit(pair[0])? << 4 | digit(pair[1])?;
    }
    (s.len() == 2 * N).then_some(out)
}

/// The request's `tracestate` lines joined, when every member is `key=value` (keys of
/// lowercase letters, digits and `_-*/@`, values of printable ASCII without `,` and `=`), there
/// are at most 32 and the whole is at most 512 bytes; `None` otherwise (not continued).
fn tracestate(headers: &HeaderMap) -> Option<String> {
    let mut out = String::new();
    let mut members = 0;
    for line in headers.get_all(TRACESTATE.name()) {
        for member in line.to_str().ok()?.split(',') {
            let member = member.trim_matches([' ', '\t']);
            if member.is_empty() {
                continue;
            }
            let (key, value) = member.split_once('=')?;
            let key_ok = !key.is_empty()
                && key
                    .bytes()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || b"_-*/@".contains(&c));
            let value_ok = !value.is_empty()
                && value
                    .bytes()
                    .all(|c| (0x20..=0x7e).contains(&c) && c != b',' && c != b'=')
                && !value.ends_with(' ');
            members += 1;
            if !key_ok || !value_ok || members > MAX_MEMBERS {
                return None;
            }
            if !out.is_empty() {
                out.push(',');
            }
            out.push_str(member);
        }
    }
    (!out.is_empty() && out.len() <= MAX_TRACESTATE).then_some(out)
}

/// Sets `traceparent` on the upstream request: trace `trace_id`, `span_id` as the parent, the
/// sampled flag as `sampled`. The client's `tracestate` is replaced by `state` when `state` is
/// given, kept when the trace is the caller's (`continued`), removed otherwise. Written into a
/// buffer on the stack, under names parsed once: the header value is the one allocation.
/// Through Pingora's header methods, which keep its record of header-name spellings in step.
pub fn inject(
    trace_id: [u8; 16],
    span_id: [u8; 8],
    sampled: bool,
    continued: bool,
    state: Option<&str>,
    req: &mut RequestHeader,
) {
    match state {
        Some(state) => {
            if let Ok(v) = HeaderValue::from_str(state) {
                let _ = TRACESTATE.set_request(req, v);
            }
        }
        // Looked up once before removing: a removal looks in both of Pingora's header maps,
        // and nearly every request has no `tracestate`.
        None if !continued && req.headers.contains_key(TRACESTATE.name()) => {
            req.remove_header(TRACESTATE.name());
        }
        None => {}
    }
    let mut buf = [0u8; 55];
    buf[..3].copy_from_slice(b"00-");
    hex_into(&trace_id, &mut buf[3..35]);
    buf[35] = b'-';
    hex_into(&span_id, &mut buf[36..52]);
    buf[52..].copy_from_slice(if sampled { b"-01" } else { b"-00" });
    if let Ok(v) = HeaderValue::from_bytes(&buf) {
        let _ = TRACEPARENT.set_request(req, v);
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
    use crate::wire::header_names::Known;

    const PARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

    fn headers(lines: &[(&Known, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (name, v) in lines {
            h.append(name.name().clone(), HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn a_valid_traceparent_is_continued_and_a_repeated_one_is_not() {
        let remote = extract(&headers(&[(&TRACEPARENT, PARENT)])).expect("continued");
        assert!(remote.sampled);
        assert_eq!(remote.trace_id[..2], [0x0a, 0xf7]);
        assert_eq!(remote.span_id[7], 0x31);
        assert_eq!(remote.state, None);
        let twice = headers(&[(&TRACEPARENT, PARENT), (&TRACEPARENT, PARENT)]);
        assert_eq!(extract(&twice), None);
    }

    #[test]
    fn malformed_traceparents_start_a_new_trace() {
        for bad in [
            "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",
            "00-00000000000000000000000000000000-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
            "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b716920333-01",
            "00_0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "",
        ] {
            assert_eq!(extract(&headers(&[(&TRACEPARENT, bad)])), None, "{bad:?}");
        }
        // A later version may carry more fields.
        let later = "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00-more";
        let remote = extract(&headers(&[(&TRACEPARENT, later)])).expect("a later version");
        assert!(!remote.sampled);
    }

    #[test]
    fn tracestate_is_continued_only_when_well_formed() {
        let ok = headers(&[
            (&TRACEPARENT, PARENT),
            (&TRACESTATE, "rojo=00f0, congo=t61"),
        ]);
        assert_eq!(
            extract(&ok).unwrap().state.as_deref(),
            Some("rojo=00f0,congo=t61")
        );
        for bad in ["novalue", "UPPER=1", "a=1,b", &"k=v,".repeat(40)] {
            let h = headers(&[(&TRACEPARENT, PARENT), (&TRACESTATE, bad)]);
            assert_eq!(extract(&h).unwrap().state, None, "{bad:?}");
        }
    }

    #[test]
    fn inject_writes_the_ids_and_settles_the_clients_tracestate() {
        let mut out = RequestHeader::build("GET", b"/", None).unwrap();
        out.insert_header(TRACESTATE.name().clone(), "vendor=1")
            .unwrap();
        let (trace, span) = ([0x0a; 16], [0xb7; 8]);
        inject(trace, span, false, true, None, &mut out);
        assert_eq!(
            out.headers.get(TRACEPARENT.name()).unwrap(),
            "00-0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a-b7b7b7b7b7b7b7b7-00"
        );
        assert_eq!(out.headers.get(TRACESTATE.name()).unwrap(), "vendor=1");
        inject(trace, span, true, true, Some("mine=2"), &mut out);
        assert!(out
            .headers
            .get(TRACEPARENT.name())
            .unwrap()
            .to_str()
            .unwrap()
            .ends_with("-01"));
        assert_eq!(out.headers.get(TRACESTATE.name()).unwrap(), "mine=2");
        // A new trace (not a caller's) passes on no tracestate of the client's.
        inject(trace, span, false, false, None, &mut out);
        assert!(out.headers.get(TRACESTATE.name()).is_none());
    }
}
