//! The access log (`server.access_log`), written off the request path.
//!
//! Writing the line from the worker that served the request (a formatted `tracing` event and a
//! `write(2)` to stderr per request) halved throughput in `make bench`. Instead, the request path moves the line's fields into a bounded
//! queue ([`record`]), and one thread, `floodgate-access-log`, emits them as the same `tracing`
//! event as before (target `access`, same fields), so the text and JSON formats and `RUST_LOG`
//! apply unchanged. [`LogWriter`], the subscriber's writer, sends that thread's access lines
//! into a buffer instead of straight to stderr. The buffer is written out:
//! - as soon as the queue is empty after a quiet spell, so a lone request's line is on stderr
//!   at once;
//! - under steady traffic, every [`GATHER`] (or sooner when it fills);
//! - at process exit (an `atexit` hook waits, briefly, for the queue to be written).
//!
//! A full queue never blocks a request: the line is dropped and counted in
//! `floodgate_access_log_dropped_total`.
//!
//! The line carries the key's id, never its secret, and no header: nothing secret is logged.
//! The path is the client's, shown through `crate::text::log_safe::Shown` (controls escaped, at most
//! 1 KiB), and every line, access or not, passes `crate::text::log_safe::line` in [`LogWriter`].

use std::cell::Cell;
use std::io::{BufWriter, Stderr, Write};
use std::net::IpAddr;
use std::sync::mpsc::{self, Receiver, SyncSender, TryRecvError, TrySendError};
use std::sync::{Arc, LazyLock, OnceLock};
use std::time::Duration;

use http::Method;
use parking_lot::{Mutex, MutexGuard};
use tracing::Metadata;
use tracing_subscriber::fmt::MakeWriter;

use crate::metrics::metrics;
use crate::wire::auth::Identity;
use crate::wire::client::RequestId;

/// Lines the queue holds. At 25k req/s that is 300 ms of lines, far more than the writer
/// needs between two looks at the queue; a line is about 150 bytes, so 1.2 MB at most.
const QUEUE_LINES: usize = 8192;

/// Under steady traffic, how long the writer lets lines gather before writing them out. It
/// sleeps meanwhile rather than waiting on the queue: a waiting receiver would make every
/// request's send wake it (a system call on the request path).
const GATHER: Duration = Duration::from_millis(10);

/// Size of the buffer in front of stderr.
const BUFFER_BYTES: usize = 64 * 1024;

/// How long the exit hook waits for queued lines to be written.
const EXIT_WAIT: Duration = Duration::from_secs(1);

/// One request's access line: the fields of the `access` event, owned so that they can cross
/// to the writer thread.
#[derive(Debug, Clone)]
pub struct AccessLine {
    /// Request method.
    pub method: Method,
    /// Request path (no query string).
    pub path: String,
    /// The path the upstream received, when the route's rewrite changed it (`-` otherwise).
    pub upstream_path: Option<String>,
    /// Status sent, 0 if none was.
    pub status: u16,
    /// Route name, `-` when none matched (the config's own string: no copy per request).
    pub route: Arc<str>,
    /// Upstream name, if the route has one.
    pub upstream: Option<Arc<str>>,
    /// The caller, if it had a valid key: the line shows the key's id (never its secret).
    pub identity: Option<Arc<Identity>>,
    /// Client address.
    pub client_ip: IpAddr,
    /// The rules that refused the request, comma-separated.
    pub rejected_by: Option<String>,
    /// The request was slowed (`mode = "slow"`), not refused: `rejected_by` names the rules
    /// that slowed it, and the line shows them as `slowed_by` (a flag, not a second list, so
    /// that a queued line stays as small as it was).
    pub slowed: bool,
    /// The request's `x-request-id`.
    pub request_id: RequestId,
    /// The request's W3C trace id when `[tracing]` is on (all zero: none; shown as `-`).
    pub trace_id: [u8; 16],
    /// Milliseconds from the request's start to the end of its answer.
    pub latency_ms: f64,
    /// Pingora's error type name, `-` when the exchange succeeded.
    pub error: &'static str,
}

// Lines travel inline: boxing them would cost an allocation per request, and a flush is sent
// once per process exit; the queue's slots are ~220 bytes (8192 of them: under 2 MB).
#[allow(clippy::large_enum_variant)]
enum Message {
    Line(AccessLine),
    /// Write out everything queued before this, then answer (the exit hook).
    Flush(SyncSender<()>),
}

/// The queue to the writer thread, started on the first line rather than at start-up: with
/// `--daemon` Pingora forks after start-up, and a thread does not survive a fork (the queue
/// would fill and every line be dropped). `None` if the thread could not be started: lines are
/// then written by the caller, as before.
static QUEUE: OnceLock<Option<SyncSender<Message>>> = OnceLock::new();

/// The writer thread, woken early by [`flush`] from its [`GATHER`] pause.
static WRITER: OnceLock<std::thread::Thread> = OnceLock::new();

/// The buffer the writer thread's access lines go to; only that thread and the exit hook
/// write or flush it, so its lock is never contended on the request path.
static BUFFER: LazyLock<Mutex<BufWriter<Stderr>>> =
    LazyLock::new(|| Mutex::new(BufWriter::with_capacity(BUFFER_BYTES, std::io::stderr())));

thread_local! {
    /// True on the writer thread.
    static ON_WRITER: Cell<bool> = const { Cell::new(false) };
}

/// Queues the line `line` builds for the access log; called once per request when
/// `server.access_log` is on. The line is built only if it will be written (RUST_LOG may
/// silence the `access` target). Never blocks: if the writer has fallen a whole queue
/// behind, the line is dropped and counted in `floodgate_access_log_dropped_total`.
pub fn record(line: impl FnOnce() -> AccessLine) {
    if !tracing::enabled!(target: "access", tracing::Level::INFO) {
        return;
    }
    let line = line();
    let Some(queue) = QUEUE.get_or_init(start) else {
        emit(&line);
        return;
    };
    match queue.try_send(Message::Line(line)) {
        Ok(()) => {}
        Err(TrySendError::Full(_)) => metrics().access_log_dropped.inc(),
        // The writer thread is gone (it cannot end on its own): write the line here.
        Err(TrySendError::Disconnected(Message::Line(line))) => emit(&line),
        Err(TrySendError::Disconnected(Message::Flush(_))) => {}
    }
}

/// Writes out every line queued so far and waits for it (at most a second); a no-op if the
/// writer thread never started. The exit hook calls it; tests may too.
pub fn flush() {
    let Some(Some(queue)) = QUEUE.get() else {
        return;
    };
    let (done, wait) = mpsc::sync_channel(1);
    if queue.try_send(Message::Flush(done)).is_ok() {
        if let Some(writer) = WRITER.get() {
            writer.unpark();
        }
        let _ = wait.recv_timeout(EXIT_WAIT);
    }
}

/// The same event the request path used to emit, now emitted by the writer thread.
fn emit(line: &AccessLine) {
    tracing::info!(
        target: "access",
        method = %line.method,
        path = %crate::text::log_safe::Shown(&line.path),
        upstream_path = %crate::text::log_safe::Shown(line.upstream_path.as_deref().unwrap_or("-")),
        status = line.status,
        route = &*line.route,
        upstream = line.upstream.as_deref().unwrap_or("-"),
        key_id = line.identity.as_ref().map_or("-", |i| i.id.as_str()),
        client_ip = %line.client_ip,
        rejected_by = limited_by(line, false),
        slowed_by = limited_by(line, true),
        request_id = %line.request_id.as_str(),
        trace_id = %TraceId(line.trace_id),
        latency_ms = line.latency_ms,
        error = line.error,
    );
}

/// A trace id as W3C writes it (32 hex digits), `-` for none (all zero, which W3C forbids).
struct TraceId([u8; 16]);

impl std::fmt::Display for TraceId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.0 == [0; 16] {
            return f.write_str("-");
        }
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

/// The line's `rejected_by` (`slowed` false) or `slowed_by` (true): its rules, or `-`.
fn limited_by(line: &AccessLine, slowed: bool) -> &str {
    match &line.rejected_by {
        Some(rules) if line.slowed == slowed => rules,
        _ => "-",
    }
}

fn start() -> Option<SyncSender<Message>> {
    let (tx, rx) = mpsc::sync_channel(QUEUE_LINES);
    let writer = std::thread::Builder::new()
        .name("floodgate-access-log".into())
        .spawn(move || run(rx))
        .ok()?;
    let _ = WRITER.set(writer.thread().clone());
    // SAFETY: registers a plain `extern "C" fn`; it only reads statics, and does nothing if
    // the queue is not set (an exit during this very initialization).
    unsafe {
        libc::atexit(flush_at_exit);
    }
    Some(tx)
}

extern "C" fn flush_at_exit() {
    flush();
}

/// The writer thread: park while idle; once lines come, write them out and keep gathering
/// every [`GATHER`] until a look at the queue finds nothing new.
fn run(rx: Receiver<Message>) {
    ON_WRITER.with(|w| w.set(true));
    while let Ok(first) = rx.recv() {
        handle(first);
        loop {
            let mut taken = 0usize;
            let open = loop {
                match rx.try_recv() {
                    Ok(m) => {
                        handle(m);
                        taken += 1;
                    }
                    Err(TryRecvError::Empty) => break true,
                    Err(TryRecvError::Disconnected) => break false,
                }
            };
            write_out();
            if !open {
                return;
            }
            if taken == 0 {
                break;
            }
            // A pause, not a sleep: `flush` wakes it.
            std::thread::park_timeout(GATHER);
        }
    }
    write_out();
}

fn handle(m: Message) {
    match m {
        Message::Line(line) => emit(&line),
        Message::Flush(done) => {
            write_out();
            let _ = done.try_send(());
        }
    }
}

fn write_out() {
    // Nothing to do about a failed write to stderr; the next write tries again.
    let _ = BUFFER.lock().flush();
}

/// The log subscriber's writer (see `crate::logging::init`): stderr, except for the access
/// lines the writer thread emits, which go to its buffer. Every event passes
/// `crate::text::log_safe::line` (C1 controls escaped, long lines cut) on the way.
#[derive(Debug, Clone, Copy, Default)]
pub struct LogWriter {
    json: bool,
}

impl LogWriter {
    /// The writer for the JSON format (`json`) or the text one.
    pub fn new(json: bool) -> LogWriter {
        LogWriter { json }
    }
}

/// What [`LogWriter`] hands the subscriber for one event.
pub struct EventWriter {
    json: bool,
    out: Out,
}

enum Out {
    /// Straight to stderr (every line but buffered access lines).
    Stderr(Stderr),
    /// Into the writer thread's buffer.
    Buffered(MutexGuard<'static, BufWriter<Stderr>>),
}

impl Write for EventWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.write_all(buf).map(|()| buf.len())
    }

    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        // The subscriber writes an event as one `write_all`, so this sees whole lines;
        // BufWriter writes whole events out.
        let line = crate::text::log_safe::line(buf, self.json);
        match &mut self.out {
            Out::Stderr(w) => w.write_all(&line),
            Out::Buffered(w) => w.write_all(&line),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match &mut self.out {
            Out::Stderr(w) => w.flush(),
            // Written out by the writer thread, not per event.
            Out::Buffered(_) => Ok(()),
        }
    }
}

impl<'a> MakeWriter<'a> for LogWriter {
    type Writer = EventWriter;

    fn make_writer(&'a self) -> EventWriter {
        EventWriter {
            json: self.json,
            out: Out::Stderr(std::io::stderr()),
        }
    }

    fn make_writer_for(&'a self, meta: &Metadata<'_>) -> EventWriter {
        if meta.target() == "access" && ON_WRITER.with(Cell::get) {
            EventWriter {
                json: self.json,
                out: Out::Buffered(BUFFER.lock()),
            }
        } else {
            self.make_writer()
        }
    }
}
