//! A finished span as the request path records it: ids, times and typed attributes, with
//! nothing formatted or encoded. The export thread turns records into OTLP protobuf
//! ([`super::otlp`]), so a sampled request pays for a few small values and one queue send per
//! span, and the encoding's cost stays off the request thread.

use std::borrow::Cow;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// OTLP `Span.SpanKind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// `SPAN_KIND_INTERNAL`.
    Internal = 1,
    /// `SPAN_KIND_SERVER`.
    Server = 2,
    /// `SPAN_KIND_CLIENT`.
    Client = 3,
}

/// An attribute's value, kept as the request path has it.
#[derive(Debug, Clone)]
pub(super) enum Value {
    /// A text known at build time or copied once.
    Str(Cow<'static, str>),
    /// A name shared with the config (a route's, a rule's).
    Shared(Arc<str>),
    /// An integer.
    Int(i64),
    /// A floating-point number.
    F64(f64),
    /// An address, written as text by the export thread.
    Ip(IpAddr),
}

impl From<&'static str> for Value {
    fn from(s: &'static str) -> Self {
        Value::Str(Cow::Borrowed(s))
    }
}

impl From<String> for Value {
    fn from(s: String) -> Self {
        Value::Str(Cow::Owned(s))
    }
}

impl From<Cow<'static, str>> for Value {
    fn from(s: Cow<'static, str>) -> Self {
        Value::Str(s)
    }
}

impl From<Arc<str>> for Value {
    fn from(s: Arc<str>) -> Self {
        Value::Shared(s)
    }
}

impl From<i64> for Value {
    fn from(n: i64) -> Self {
        Value::Int(n)
    }
}

impl From<f64> for Value {
    fn from(n: f64) -> Self {
        Value::F64(n)
    }
}

impl From<IpAddr> for Value {
    fn from(ip: IpAddr) -> Self {
        Value::Ip(ip)
    }
}

/// One attribute: keys are floodgate's own (semantic-convention names), never a client's.
pub(super) type Attr = (&'static str, Value);

/// A span event (`floodgate.rule`).
#[derive(Debug, Clone)]
pub(super) struct Event {
    /// The event's name.
    pub name: &'static str,
    /// When it happened, nanoseconds since the Unix epoch.
    pub time: u64,
    /// Its attributes.
    pub attrs: Vec<Attr>,
}

/// A span's name: the server span's `{method} {route}` is joined by the export thread.
#[derive(Debug, Clone)]
pub(super) enum Name {
    /// A whole name.
    Text(Cow<'static, str>),
    /// `{method} {route}`.
    MethodRoute(Cow<'static, str>, Arc<str>),
}

/// A span, finished or in the making.
#[derive(Debug, Clone)]
pub(super) struct SpanRecord {
    /// The trace's id.
    pub trace_id: [u8; 16],
    /// This span's id.
    pub span_id: [u8; 8],
    /// The parent's id; zero for a root.
    pub parent: [u8; 8],
    /// The parent is the caller's (a continued `traceparent`), not one of floodgate's spans.
    pub remote_parent: bool,
    /// The caller's `tracestate`, carried by every span of a continued trace.
    pub trace_state: Option<Arc<str>>,
    /// The span's name.
    pub name: Name,
    /// Its kind.
    pub kind: Kind,
    /// Start, nanoseconds since the Unix epoch.
    pub start: u64,
    /// End, nanoseconds since the Unix epoch.
    pub end: u64,
    /// Attributes, in the order they were set; a later one of the same key wins.
    pub attrs: Vec<Attr>,
    /// Events.
    pub events: Vec<Event>,
    /// `Some(message)`: the span's status is ERROR.
    pub error: Option<Cow<'static, str>>,
}

impl SpanRecord {
    /// A span of `trace_id` under `parent` (zero: a root), started now, with a new id.
    pub fn start(trace_id: [u8; 16], parent: [u8; 8], name: Name, kind: Kind) -> SpanRecord {
        SpanRecord {
            trace_id,
            span_id: new_span_id(),
            parent,
            remote_parent: false,
            trace_state: None,
            name,
            kind,
            start: now(),
            end: 0,
            attrs: Vec::new(),
            events: Vec::new(),
            error: None,
        }
    }

    /// A child of this span, started now (or at `start`), that carries the trace's state.
    pub fn child(&self, name: Name, kind: Kind, start: Option<u64>) -> SpanRecord {
        let mut child = SpanRecord::start(self.trace_id, self.span_id, name, kind);
        child.trace_state = self.trace_state.clone();
        if let Some(at) = start {
            child.start = at;
        }
        child
    }

    /// Adds `key`, which the span does not have yet (its first attributes).
    pub fn push(&mut self, key: &'static str, value: impl Into<Value>) {
        debug_assert!(self.attrs.iter().all(|(k, _)| *k != key), "{key} twice");
        self.attrs.push((key, value.into()));
    }

    /// Sets `key` to `value` (replacing an earlier value of it).
    pub fn set(&mut self, key: &'static str, value: impl Into<Value>) {
        let value = value.into();
        match self.attrs.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = value,
            None => self.attrs.push((key, value)),
        }
    }
}

/// A random, non-zero span id.
pub(super) fn new_span_id() -> [u8; 8] {
    fastrand::u64(1..).to_be_bytes()
}

/// The wall clock in nanoseconds since the Unix epoch (0 before it).
pub(super) fn now() -> u64 {
    nanos(SystemTime::now())
}

/// `at` in nanoseconds since the Unix epoch (0 before it, saturating far after it).
pub(super) fn nanos(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}
