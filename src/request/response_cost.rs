//! What the proxy hands the limiter from the upstream's response (see
//! [`crate::limiter::reservation`]): its status, for the reservations of `count` rules, and the
//! true cost `cost_from` rules read from it.
//!
//! `count` reservations are settled when the upstream's response head arrives, before it is
//! sent on, so that the client's next request already sees a refund. `cost_from` ones when the
//! exchange ends (`logging`, which also runs when the client leaves mid-stream), from what was
//! read by then. An exchange that never gets an upstream response keeps its reservations.
//!
//! The body is streamed to the client unchanged as it arrives; reading a cost inspects a
//! bounded number of its bytes and keeps no more: the first [`JSON_BYTES`] of a JSON body,
//! and for `text/event-stream` each `data:` line as it completes (a line longer than
//! [`SSE_LINE_BYTES`] is skipped), keeping the last number found. A compressed body
//! (`Content-Encoding`) is not read: its cost is unread.

use pingora::http::ResponseHeader;

use crate::limiter::engine::Slots;
use crate::limiter::reservation::CostFrom;

/// The most of a JSON body inspected for a cost: 64 KiB, the first bytes (a body past it
/// settles at the reservation).
pub const JSON_BYTES: usize = 64 * 1024;

/// The longest `data:` line of an event stream inspected: 64 KiB (a longer line is skipped;
/// at most this much is carried over between chunks).
pub const SSE_LINE_BYTES: usize = 64 * 1024;

/// Settles the request's `count` reservations on the upstream's `status` (informational 1xx
/// heads are not the answer, and wait for the final one).
pub async fn settle_on_status(slots: Option<&mut Slots>, status: http::StatusCode) {
    if status.is_informational() && status != http::StatusCode::SWITCHING_PROTOCOLS {
        return;
    }
    if let Some(slots) = slots {
        let reservations = slots.reservations();
        if !reservations.is_empty() {
            reservations.settle(status.as_u16()).await;
        }
    }
}

/// Settles the request's `cost_from` reservations at the end of the exchange, from what
/// `reader` read (none: nothing was readable).
pub async fn settle_costs(slots: Option<&mut Slots>, reader: Option<CostReader>) {
    let Some(slots) = slots else { return };
    let reservations = slots.reservations();
    if reservations.is_empty() {
        return;
    }
    reservations
        .settle_costs(|from| reader.as_ref().and_then(|r| r.cost_of(from)))
        .await;
}

/// Reads the true costs of one response as it streams by.
pub struct CostReader {
    /// Each source with the last number it read.
    found: Vec<(CostFrom, Option<u64>)>,
    body: Body,
}

/// How the body is inspected.
enum Body {
    /// Not at all (headers only, compressed, or past the bound).
    Skip,
    /// A JSON document: its first bytes, parsed at the end.
    Json(Vec<u8>),
    /// Server-sent events: the incomplete line carried over, or skipping an overlong one.
    Events { carry: Vec<u8>, skipping: bool },
}

impl CostReader {
    /// A reader for the response `head`, when the request holds `cost_from` reservations.
    /// Header sources are read at once.
    pub fn start(slots: Option<&mut Slots>, head: &ResponseHeader) -> Option<CostReader> {
        let sources = slots?.reservations().cost_sources();
        if sources.is_empty() {
            return None;
        }
        let found: Vec<(CostFrom, Option<u64>)> = sources
            .into_iter()
            .map(|from| {
                let value = match &from {
                    CostFrom::Header(name) => header_cost(head.headers.get_all(name)),
                    CostFrom::Json(_) => None,
                };
                (from, value)
            })
            .collect();
        let wants_body = found.iter().any(|(f, _)| matches!(f, CostFrom::Json(_)));
        let compressed = head
            .headers
            .get(http::header::CONTENT_ENCODING)
            .is_some_and(|v| !v.as_bytes().eq_ignore_ascii_case(b"identity"));
        let events = head
            .headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| {
                v.trim_start()
                    .to_ascii_lowercase()
                    .starts_with("text/event-stream")
            });
        let body = match (wants_body && !compressed, events) {
            (false, _) => Body::Skip,
            (true, true) => Body::Events {
                carry: Vec::new(),
                skipping: false,
            },
            (true, false) => Body::Json(Vec::new()),
        };
        Some(CostReader { found, body })
    }

    /// Inspects the next piece of the body (which goes on to the client unchanged).
    pub fn feed(&mut self, chunk: &[u8]) {
        match &mut self.body {
            Body::Skip => {}
            Body::Json(buf) => {
                if buf.len() + chunk.len() > JSON_BYTES {
                    self.body = Body::Skip;
                } else {
                    buf.extend_from_slice(chunk);
                }
            }
            Body::Events { carry, skipping } => {
                let mut rest = chunk;
                while let Some(end) = rest.iter().position(|&b| b == b'\n') {
                    let (piece, after) = rest.split_at(end);
                    rest = &after[1..];
                    if std::mem::take(skipping) {
                        carry.clear();
                        continue;
                    }
                    if carry.is_empty() {
                        read_event_line(&mut self.found, piece);
                    } else {
                        carry.extend_from_slice(piece);
                        let line = std::mem::take(carry);
                        read_event_line(&mut self.found, &line);
                    }
                }
                if *skipping {
                    return;
                }
                if carry.len() + rest.len() > SSE_LINE_BYTES {
                    carry.clear();
                    *skipping = true;
                } else {
                    carry.extend_from_slice(rest);
                }
            }
        }
    }

    /// The body is complete: a JSON body is read now.
    pub fn finish(&mut self) {
        match std::mem::replace(&mut self.body, Body::Skip) {
            Body::Json(buf) => {
                if let Ok(doc) = serde_json::from_slice::<serde_json::Value>(&buf) {
                    read_document(&mut self.found, &doc);
                }
            }
            Body::Events { carry, skipping } if !skipping => {
                read_event_line(&mut self.found, &carry);
            }
            _ => {}
        }
    }

    /// The true cost `from` read, if it read one.
    pub fn cost_of(&self, from: &CostFrom) -> Option<u64> {
        self.found
            .iter()
            .find(|(f, _)| f == from)
            .and_then(|(_, v)| *v)
    }
}

/// One line of an event stream: a `data:` line holding a JSON document updates the JSON
/// sources whose path it has (a later event wins).
fn read_event_line(found: &mut [(CostFrom, Option<u64>)], line: &[u8]) {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let Some(data) = line.strip_prefix(b"data:") else {
        return;
    };
    let data = data.strip_prefix(b" ").unwrap_or(data);
    if data.first() != Some(&b'{') {
        return;
    }
    if let Ok(doc) = serde_json::from_slice::<serde_json::Value>(data) {
        read_document(found, &doc);
    }
}

/// Updates each JSON source whose path holds a non-negative whole number in `doc`.
fn read_document(found: &mut [(CostFrom, Option<u64>)], doc: &serde_json::Value) {
    for (from, value) in found.iter_mut() {
        let CostFrom::Json(path) = from else { continue };
        let at = path.iter().try_fold(doc, |v, key| v.get(key.as_str()));
        if let Some(n) = at.and_then(json_cost) {
            *value = Some(n);
        }
    }
}

/// The most a cost reads as: the most a rule may count (10^15). A larger number is a cost
/// of 10^15 (the reservation layer caps it there too), not an unreadable one: an upstream
/// that reports more than the budget must not get away with the reservation.
const MAX_READ: u64 = crate::limiter::algorithm::MAX_COUNT;

/// The cost in a header: exactly one value, a non-negative number (see [`number_cost`]). A
/// repeated header is unreadable: which copy is the true one is the sender's secret, and
/// picking the first would let an upstream (or a proxy in front of it) choose the smaller.
fn header_cost(values: http::header::GetAll<'_, http::HeaderValue>) -> Option<u64> {
    let mut all = values.iter();
    let value = all.next()?;
    if all.next().is_some() {
        return None;
    }
    number_cost(value.to_str().ok()?.trim())
}

/// A JSON value as a cost: a non-negative number (an integer past 2^64 arrives as a float).
fn json_cost(value: &serde_json::Value) -> Option<u64> {
    let n = value.as_number()?;
    match n.as_u64() {
        Some(whole) => Some(whole.min(MAX_READ)),
        None => float_cost(n.as_f64()?),
    }
}

/// A number written as JSON writes one (`42`, `3000.0`, `3e3`, `2.1`) as a cost: capped at
/// 10^15, a fraction rounded up (a cost of 2.1 takes 3 units: rounding down would let many
/// small answers spend for free). Negative numbers, NaN, `inf` and anything else are
/// unreadable.
fn number_cost(text: &str) -> Option<u64> {
    if let Ok(whole) = text.parse::<u64>() {
        return Some(whole.min(MAX_READ));
    }
    // Rust's float syntax also takes `inf` and `NaN`: only digits make a number here.
    let json_like = text
        .bytes()
        .all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'E' | b'-' | b'+'))
        && text
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_digit() || b == b'-' || b == b'+');
    if !json_like {
        return None;
    }
    float_cost(text.parse::<f64>().ok()?)
}

/// A float as a cost: not negative, rounded up, capped at 10^15 (a literal too large for an
/// f64, such as `1e999`, is a large number: capped too).
fn float_cost(n: f64) -> Option<u64> {
    if n.is_nan() || n < 0.0 {
        return None;
    }
    let capped = n.ceil().min(MAX_READ as f64);
    // In range: 0 <= capped <= 10^15, exact in an f64.
    Some(capped as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reader(content_type: &str) -> CostReader {
        let from = CostFrom::parse("json:usage.total_tokens").unwrap();
        let events = content_type == "text/event-stream";
        CostReader {
            found: vec![(from, None)],
            body: if events {
                Body::Events {
                    carry: Vec::new(),
                    skipping: false,
                }
            } else {
                Body::Json(Vec::new())
            },
        }
    }

    fn cost(r: &CostReader) -> Option<u64> {
        r.cost_of(&CostFrom::parse("json:usage.total_tokens").unwrap())
    }

    #[test]
    fn the_last_event_with_the_path_wins_across_chunk_boundaries() {
        let mut r = reader("text/event-stream");
        let stream = b"data: {\"usage\":{\"total_tokens\":3}}\n\ndata: {\"choices\":[]}\n\ndata: {\"usage\":{\"total_tokens\":42}}\n\ndata: [DONE]\n\n";
        for piece in stream.chunks(7) {
            r.feed(piece);
        }
        r.finish();
        assert_eq!(cost(&r), Some(42));
    }

    #[test]
    fn an_overlong_line_is_skipped_and_bounds_the_carry_over() {
        let mut r = reader("text/event-stream");
        r.feed(b"data: {\"usage\":{\"total_tokens\":7}}\n");
        r.feed(b"data: {\"pad\":\"");
        for _ in 0..(SSE_LINE_BYTES / 1000 + 2) {
            r.feed(&[b'x'; 1000]);
            if let Body::Events { carry, .. } = &r.body {
                assert!(carry.len() <= SSE_LINE_BYTES);
            }
        }
        r.feed(b"\",\"usage\":{\"total_tokens\":999}}\ndata: {\"usage\":{\"total_tokens\":9}}\n");
        assert_eq!(
            cost(&r),
            Some(9),
            "the overlong line was skipped, the next read"
        );
    }

    #[test]
    fn any_non_negative_number_is_a_cost_capped_and_rounded_up() {
        for (text, want) in [
            ("0", Some(0)),
            ("42", Some(42)),
            (" 42 ", None), // trimmed by the caller, not here
            ("3000.0", Some(3000)),
            ("3e3", Some(3000)),
            ("3E3", Some(3000)),
            ("2.1", Some(3)),
            ("0.0001", Some(1)),
            ("-0", Some(0)),
            ("1000000000000000", Some(MAX_READ)),
            ("1000000000000001", Some(MAX_READ)),
            ("18446744073709551615", Some(MAX_READ)),
            ("99999999999999999999", Some(MAX_READ)),
            ("1e300", Some(MAX_READ)),
            ("1e999", Some(MAX_READ)),
            ("-1", None),
            ("-2.5", None),
            ("NaN", None),
            ("nan", None),
            ("inf", None),
            ("infinity", None),
            ("+5", Some(5)),
            ("+5.5", Some(6)),
            ("+inf", None),
            ("", None),
            ("ten", None),
            ("3,4", None),
            ("0x10", None),
        ] {
            assert_eq!(number_cost(text), want, "{text:?}");
        }
    }

    #[test]
    fn json_numbers_are_costs_as_in_a_header() {
        for (doc, want) in [
            ("42", Some(42)),
            ("3000.0", Some(3000)),
            ("3e3", Some(3000)),
            ("2.1", Some(3)),
            ("99999999999999999999", Some(MAX_READ)),
            ("-1", None),
            ("-0.5", None),
            ("\"42\"", None),
            ("null", None),
            ("[1]", None),
        ] {
            let value: serde_json::Value = serde_json::from_str(doc).unwrap();
            assert_eq!(json_cost(&value), want, "{doc}");
        }
        let mut r = reader("application/json");
        r.feed(b"{\"usage\":{\"total_tokens\":99999999999999999999}}");
        r.finish();
        assert_eq!(cost(&r), Some(MAX_READ));
    }

    #[test]
    fn a_repeated_cost_header_is_unreadable() {
        let mut headers = http::HeaderMap::new();
        headers.append("x-cost", http::HeaderValue::from_static("5"));
        assert_eq!(header_cost(headers.get_all("x-cost")), Some(5));
        headers.append("x-cost", http::HeaderValue::from_static("7"));
        assert_eq!(header_cost(headers.get_all("x-cost")), None);
        assert_eq!(header_cost(headers.get_all("x-other")), None);
    }

    #[test]
    fn a_json_body_past_the_bound_reads_nothing() {
        let mut r = reader("application/json");
        r.feed(b"{\"usage\":{\"total_tokens\":5},\"pad\":\"");
        r.feed(&vec![b'x'; JSON_BYTES]);
        r.feed(b"\"}");
        r.finish();
        assert_eq!(cost(&r), None);
        let mut r = reader("application/json");
        r.feed(b"{\"usage\":{\"total_tokens\":5}}");
        r.finish();
        assert_eq!(cost(&r), Some(5));
    }
}
