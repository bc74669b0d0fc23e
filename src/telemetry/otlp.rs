//! OTLP protobuf, written by hand: a batch of [`SpanRecord`]s becomes one
//! `ExportTraceServiceRequest` (opentelemetry/proto/collector/trace/v1) in one buffer, handed
//! to the transport as it is. No per-span message objects are built: the spans' fields go
//! straight from the records to the wire, which is most of what made a sampled request dear when the
//! OpenTelemetry SDK and its exporter did it. The same bytes are the body of an OTLP/HTTP
//! export and the message of an OTLP/gRPC one. `tests` decodes them with the generated types
//! of opentelemetry-proto to hold the encoding to the schema.

use std::net::IpAddr;

use bytes::Bytes;

use super::span::{Attr, Name, SpanRecord, Value};

/// Protobuf wire types.
const VARINT: u32 = 0;
const I64: u32 = 1;
const LEN: u32 = 2;
const I32: u32 = 5;

/// The tags of `KeyValue.key` (1, bytes), `KeyValue.value` (2, message), and of
/// `AnyValue.string_value` (1, bytes), `.int_value` (3, varint), `.double_value` (4, 64-bit).
const KEY: u8 = 1 << 3 | LEN as u8;
const VALUE: u8 = 2 << 3 | LEN as u8;
const ANY_STRING: u8 = 1 << 3 | LEN as u8;
const ANY_INT: u8 = 3 << 3 | VARINT as u8;
const ANY_DOUBLE: u8 = 4 << 3 | I64 as u8;

/// OTLP `Status.StatusCode.STATUS_CODE_ERROR`.
const STATUS_ERROR: u64 = 2;
/// OTLP `SpanFlags`: the span knows whether its parent is remote, and that it is.
const HAS_IS_REMOTE: u32 = 0x100;
const IS_REMOTE: u32 = 0x200;
/// W3C trace flags: sampled (every exported span is).
const SAMPLED: u32 = 0x01;

/// The instrumentation scope's name on every span.
pub(super) const SCOPE: &str = "floodgate";

/// Writes export requests; holds the encoded resource and the buffer between batches.
pub(super) struct Encoder {
    /// The `Resource` message's body, encoded once.
    resource: Vec<u8>,
    /// The `InstrumentationScope` message's body, encoded once.
    scope: Vec<u8>,
    /// The last address written as text.
    ip: IpText,
}

/// An address as text, kept for the next attribute of the same address (a request's client
/// and peer addresses are usually one).
#[derive(Default)]
struct IpText {
    ip: Option<IpAddr>,
    text: String,
}

impl IpText {
    fn of(&mut self, ip: IpAddr) -> &[u8] {
        if self.ip != Some(ip) {
            self.text.clear();
            crate::text::push_ip(&mut self.text, ip);
            self.ip = Some(ip);
        }
        self.text.as_bytes()
    }
}

impl Encoder {
    /// An encoder whose requests carry `resource` (key, value) attributes.
    pub fn new<'a>(resource: impl IntoIterator<Item = (&'a str, &'a str)>) -> Encoder {
        let mut ip = IpText::default();
        let mut body = Vec::new();
        for (k, v) in resource {
            tag(&mut body, 1, LEN);
            key_value(&mut body, &mut ip, k, &Value::from(v.to_owned()));
        }
        let mut scope = Vec::new();
        string(&mut scope, 1, SCOPE);
        Encoder {
            resource: body,
            scope,
            ip,
        }
    }

    /// One `ExportTraceServiceRequest` of `spans`, whose [`room`]s add up to `spans_room`
    /// (the exporter counted them when it took the spans: the buffer is allocated once, at
    /// its final size). The spans are written once, after room left for the envelope, whose
    /// lengths are known only then; the envelope is written into the end of that room, so no
    /// byte of a span is moved.
    pub fn encode(&mut self, spans: &[SpanRecord], spans_room: usize) -> Bytes {
        let room = self.resource.len() + self.scope.len() + 6 * 10;
        let mut b = Vec::with_capacity(room + spans_room);
        b.resize(room, 0);
        for s in spans {
            nested(&mut b, 2, 2, |b| span(b, &mut self.ip, s));
        }
        let spans_len = b.len() - room;
        // scope_spans = { scope = 1, spans = 2... }
        let mut head = Vec::with_capacity(room);
        let scope_spans = 1 + varint_len(self.scope.len()) + self.scope.len() + spans_len;
        let resource_spans = 1
            + varint_len(self.resource.len())
            + self.resource.len()
            + 1
            + varint_len(scope_spans)
            + scope_spans;
        // ExportTraceServiceRequest { resource_spans = 1 { resource = 1, scope_spans = 2 } }
        tag(&mut head, 1, LEN);
        varint(&mut head, resource_spans as u64);
        tag(&mut head, 1, LEN);
        varint(&mut head, self.resource.len() as u64);
        head.extend_from_slice(&self.resource);
        tag(&mut head, 2, LEN);
        varint(&mut head, scope_spans as u64);
        tag(&mut head, 1, LEN);
        varint(&mut head, self.scope.len() as u64);
        head.extend_from_slice(&self.scope);
        let start = room - head.len();
        b[start..room].copy_from_slice(&head);
        Bytes::from(b).slice(start..)
    }
}

/// About the bytes `s` takes encoded, framed as one of a request's spans (a little more: room
/// for its framing).
pub(super) fn room(s: &SpanRecord) -> usize {
    let events: usize = s.events.iter().map(|e| 32 + attrs_room(&e.attrs)).sum();
    128 + attrs_room(&s.attrs) + events + s.trace_state.as_deref().map_or(0, str::len)
}

/// About the bytes `attrs` take encoded.
fn attrs_room(attrs: &[Attr]) -> usize {
    attrs.iter().map(|(k, v)| k.len() + value_room(v)).sum()
}

/// A `Span` message's body.
fn span(b: &mut Vec<u8>, ip: &mut IpText, s: &SpanRecord) {
    bytes(b, 1, &s.trace_id);
    bytes(b, 2, &s.span_id);
    if let Some(state) = s.trace_state.as_deref() {
        string(b, 3, state);
    }
    if s.parent != [0; 8] {
        bytes(b, 4, &s.parent);
    }
    match &s.name {
        Name::Text(t) => string(b, 5, t),
        Name::MethodRoute(method, route) => {
            tag(b, 5, LEN);
            varint(b, (method.len() + 1 + route.len()) as u64);
            b.extend_from_slice(method.as_bytes());
            b.push(b' ');
            b.extend_from_slice(route.as_bytes());
        }
    }
    tag(b, 6, VARINT);
    varint(b, s.kind as u64);
    fixed64(b, 7, s.start);
    fixed64(b, 8, s.end.max(s.start));
    for (k, v) in &s.attrs {
        tag(b, 9, LEN);
        key_value(b, ip, k, v);
    }
    for e in &s.events {
        nested(b, 11, 1, |b| {
            fixed64(b, 1, e.time);
            string(b, 2, e.name);
            for (k, v) in &e.attrs {
                tag(b, 3, LEN);
                key_value(b, ip, k, v);
            }
        });
    }
    if let Some(message) = &s.error {
        nested(b, 15, 1, |b| {
            if !message.is_empty() {
                string(b, 2, message);
            }
            tag(b, 3, VARINT);
            varint(b, STATUS_ERROR);
        });
    }
    let remote = if s.remote_parent { IS_REMOTE } else { 0 };
    tag(b, 16, I32);
    b.extend_from_slice(&(SAMPLED | HAS_IS_REMOTE | remote).to_le_bytes());
}

/// About what an attribute's value takes on the wire (with its key's and its own framing).
fn value_room(v: &Value) -> usize {
    // Two heads, each copied whole before its tail is cut.
    2 * HEAD
        + match v {
            Value::Str(s) => s.len(),
            Value::Shared(s) => s.len(),
            Value::Int(_) | Value::F64(_) => 10,
            Value::Ip(_) => 45,
        }
}

/// A `KeyValue` message, length first (its tag is the caller's): `key = 1`, `value = 2` (an
/// `AnyValue`). Its size is counted before it is written (an address is written as text
/// into `ip` first).
fn key_value(b: &mut Vec<u8>, ip: &mut IpText, key: &str, value: &Value) {
    /// The `AnyValue` field and its payload.
    enum Any<'a> {
        Text(&'a [u8]),
        Int(u64),
        Double(f64),
    }
    let any = match value {
        Value::Str(s) => Any::Text(s.as_bytes()),
        Value::Shared(s) => Any::Text(s.as_bytes()),
        // int64: a negative number is its two's complement, ten bytes.
        Value::Int(n) => Any::Int(*n as u64),
        Value::F64(x) => Any::Double(*x),
        Value::Ip(addr) => Any::Text(ip.of(*addr)),
    };
    // The KeyValue's size were every length one byte: `KEY`, key length, key, `VALUE`,
    // value length, and the `AnyValue` (its tag and payload).
    let short = 4
        + key.len()
        + match any {
            Any::Text(t) => 2 + t.len(),
            Any::Int(n) => 1 + varint_len_u64(n),
            Any::Double(_) => 1 + 8,
        };
    // The framing goes through a buffer on the stack: three copies into `b` per attribute
    // rather than one per field.
    let mut head = [0u8; HEAD];
    let mut n;
    if short < 0x80 {
        // Nearly every attribute: every length is under 128, so each is the one byte
        // written as it is (no varint computed).
        b.extend_from_slice(&[short as u8, KEY, key.len() as u8]);
        b.extend_from_slice(key.as_bytes());
        head[..2].copy_from_slice(&[VALUE, (short - 4 - key.len()) as u8]);
        n = 2;
    } else {
        let any_len = match any {
            Any::Text(t) => 1 + varint_len(t.len()) + t.len(),
            Any::Int(n) => 1 + varint_len_u64(n),
            Any::Double(_) => 1 + 8,
        };
        let kv_len = 1 + varint_len(key.len()) + key.len() + 1 + varint_len(any_len) + any_len;
        n = varint_at(&mut head, kv_len as u64);
        head[n] = KEY;
        n += 1;
        n += varint_at(&mut head[n..], key.len() as u64);
        put_head(b, &head, n);
        b.extend_from_slice(key.as_bytes());
        head[0] = VALUE;
        n = 1 + varint_at(&mut head[1..], any_len as u64);
    }
    match any {
        Any::Text(t) => {
            head[n] = ANY_STRING;
            n += 1;
            n += varint_at(&mut head[n..], t.len() as u64);
            put_head(b, &head, n);
            b.extend_from_slice(t);
        }
        Any::Int(v) => {
            head[n] = ANY_INT;
            n += 1;
            n += varint_at(&mut head[n..], v);
            put_head(b, &head, n);
        }
        Any::Double(x) => {
            head[n] = ANY_DOUBLE;
            head[n + 1..n + 9].copy_from_slice(&x.to_le_bytes());
            put_head(b, &head, n + 9);
        }
    }
}

/// Room for an attribute's framing: two varints of at most ten bytes and two tags.
const HEAD: usize = 32;

/// Appends the first `n` bytes of `head`: the whole fixed-size array is copied (two vector
/// moves, where a copy of `n` bytes is a call into libc's `memcpy`) and the tail cut off.
#[inline(always)]
fn put_head(b: &mut Vec<u8>, head: &[u8; HEAD], n: usize) {
    let len = b.len();
    b.extend_from_slice(head);
    b.truncate(len + n);
}

/// A length-delimited field whose body `f` writes in place, after `guess` bytes left for its
/// length (a span's body takes two: 128 bytes to 16 KiB); the body is moved only when its
/// length's size turns out another.
fn nested(b: &mut Vec<u8>, field: u32, guess: usize, f: impl FnOnce(&mut Vec<u8>)) {
    tag(b, field, LEN);
    let at = b.len();
    b.resize(at + guess, 0);
    f(b);
    let len = b.len() - at - guess;
    let mut prefix = [0u8; 10];
    let n = varint_at(&mut prefix, len as u64);
    if n != guess {
        let body = at + guess;
        if n > guess {
            b.resize(b.len() + n - guess, 0);
        }
        b.copy_within(body..body + len, at + n);
        b.truncate(at + n + len);
    }
    b[at..at + n].copy_from_slice(&prefix[..n]);
}

#[inline(always)]
fn string(b: &mut Vec<u8>, field: u32, s: &str) {
    bytes(b, field, s.as_bytes());
}

#[inline(always)]
fn bytes(b: &mut Vec<u8>, field: u32, v: &[u8]) {
    tag(b, field, LEN);
    varint(b, v.len() as u64);
    b.extend_from_slice(v);
}

#[inline(always)]
fn fixed64(b: &mut Vec<u8>, field: u32, v: u64) {
    tag(b, field, I64);
    b.extend_from_slice(&v.to_le_bytes());
}

#[inline(always)]
fn tag(b: &mut Vec<u8>, field: u32, wire: u32) {
    varint(b, u64::from(field << 3 | wire));
}

#[inline(always)]
fn varint(b: &mut Vec<u8>, v: u64) {
    if v < 0x80 {
        b.push(v as u8);
        return;
    }
    let mut out = [0u8; 10];
    let n = varint_at(&mut out, v);
    b.extend_from_slice(&out[..n]);
}

/// The size of `n` as a varint.
#[inline(always)]
fn varint_len(n: usize) -> usize {
    varint_len_u64(n as u64)
}

#[inline(always)]
fn varint_len_u64(n: u64) -> usize {
    // 7 bits a byte, at least one.
    (64 - (n | 1).leading_zeros() as usize).div_ceil(7)
}

/// `v` as a base-128 varint at the start of `out` (room for ten bytes); its length.
#[inline(always)]
fn varint_at(out: &mut [u8], mut v: u64) -> usize {
    let mut i = 0;
    while v >= 0x80 {
        out[i] = (v as u8) | 0x80;
        v >>= 7;
        i += 1;
    }
    out[i] = v as u8;
    i + 1
}

#[cfg(test)]
mod tests {
    use super::super::span::{Event, Kind, SpanRecord};
    use super::*;
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
    use prost::Message as _;
    use std::borrow::Cow;
    use std::sync::Arc;

    fn text(v: &Option<opentelemetry_proto::tonic::common::v1::AnyValue>) -> String {
        match v.as_ref().and_then(|v| v.value.as_ref()) {
            Some(Any::StringValue(s)) => s.clone(),
            Some(Any::IntValue(i)) => format!("i{i}"),
            Some(Any::DoubleValue(d)) => format!("d{d}"),
            other => format!("{other:?}"),
        }
    }

    fn pairs(kvs: &[opentelemetry_proto::tonic::common::v1::KeyValue]) -> Vec<(String, String)> {
        kvs.iter()
            .map(|kv| (kv.key.clone(), text(&kv.value)))
            .collect()
    }

    #[test]
    fn a_nested_field_is_framed_alike_whatever_room_its_length_was_given() {
        for len in [0, 5, 127, 128, 200, 16_383, 16_384, 20_000] {
            let body: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let mut want = vec![0xee];
            bytes(&mut want, 3, &body);
            for guess in [1, 2] {
                let mut got = vec![0xee];
                nested(&mut got, 3, guess, |b| b.extend_from_slice(&body));
                assert_eq!(got, want, "{len} bytes, {guess} left for the length");
            }
        }
    }

    #[test]
    fn a_batch_decodes_with_the_generated_types_field_for_field() {
        let mut server = SpanRecord::start([7; 16], [9; 8], Name::Text("x".into()), Kind::Server);
        server.remote_parent = true;
        server.trace_state = Some(Arc::from("vendor=1"));
        server.name = Name::MethodRoute(Cow::Borrowed("GET"), Arc::from("orders"));
        server.start = 1_700_000_000_000_000_001;
        server.end = server.start + 5;
        server.set("url.path", "/orders/1");
        server.set("http.response.status_code", 200i64);
        server.set(
            "network.peer.address",
            "::1".parse::<std::net::IpAddr>().unwrap(),
        );
        // Addresses one after another: the text kept for the last one is not reused for
        // another.
        server.set("client.address", IpAddr::from([10, 0, 0, 7]));
        server.set("server.address", IpAddr::from([0u16, 0, 0, 0, 0, 0, 0, 1]));
        server.set("neg", -3i64);
        server.set("ms", 1.5f64);
        server.set("http.response.status_code", 429i64);
        server.error = Some(Cow::Borrowed("boom"));
        let mut child = server.child(
            Name::Text("floodgate.admission".into()),
            Kind::Internal,
            Some(3),
        );
        child.events.push(Event {
            name: "floodgate.rule",
            time: 4,
            attrs: vec![("floodgate.rule.name", Value::Shared(Arc::from("r")))],
        });
        // A long value: lengths past one varint byte at every level.
        child.set("long", "a".repeat(300));
        let mut enc = Encoder::new([("service.name", "edge"), ("k", "v")]);
        let spans = [server.clone(), child.clone()];
        let wire = enc.encode(&spans, spans.iter().map(room).sum());
        let req = ExportTraceServiceRequest::decode(&wire[..]).expect("decodes");
        assert_eq!(req.resource_spans.len(), 1);
        let rs = &req.resource_spans[0];
        let res = rs.resource.as_ref().unwrap();
        assert_eq!(
            pairs(&res.attributes),
            [
                ("service.name".into(), "edge".into()),
                ("k".into(), "v".into())
            ]
        );
        let ss = &rs.scope_spans[0];
        assert_eq!(ss.scope.as_ref().unwrap().name, SCOPE);
        let [s, c] = &ss.spans[..] else {
            panic!("two spans: {:?}", ss.spans)
        };
        assert_eq!(s.trace_id, vec![7; 16]);
        assert_eq!(s.span_id, server.span_id.to_vec());
        assert_eq!(s.parent_span_id, vec![9; 8]);
        assert_eq!(s.trace_state, "vendor=1");
        assert_eq!(s.name, "GET orders");
        assert_eq!(s.kind, 2);
        assert_eq!(
            (s.start_time_unix_nano, s.end_time_unix_nano),
            (server.start, server.end)
        );
        assert_eq!(s.flags, 0x301);
        assert_eq!(
            pairs(&s.attributes),
            [
                ("url.path".into(), "/orders/1".into()),
                ("http.response.status_code".into(), "i429".into()),
                ("network.peer.address".into(), "::1".into()),
                ("client.address".into(), "10.0.0.7".into()),
                ("server.address".into(), "::1".into()),
                ("neg".into(), "i-3".into()),
                ("ms".into(), "d1.5".into()),
            ]
        );
        let status = s.status.as_ref().unwrap();
        assert_eq!((status.code, status.message.as_str()), (2, "boom"));
        assert_eq!(c.parent_span_id, server.span_id.to_vec());
        assert_eq!(c.trace_state, "vendor=1");
        assert_eq!((c.kind, c.start_time_unix_nano), (1, 3));
        assert_eq!(c.flags, 0x101);
        assert_eq!(c.events[0].name, "floodgate.rule");
        assert_eq!(c.events[0].time_unix_nano, 4);
        assert_eq!(text(&c.events[0].attributes[0].value), "r");
        assert_eq!(text(&c.attributes[0].value).len(), 300);
        assert!(c.status.is_none());
        // A second batch of the same spans is the same bytes again.
        // A room too small is a hint only: the buffer grows.
        assert_eq!(enc.encode(&spans, 0), wire);
        assert!(ExportTraceServiceRequest::decode(enc.encode(&[], 0)).is_ok());
        for n in [0u64, 1, 127, 128, 16_383, 16_384, u64::MAX] {
            let mut out = [0u8; 10];
            assert_eq!(varint_len_u64(n), varint_at(&mut out, n), "{n}");
        }
    }
}
