//! The HTTP/1.1 keep-alive loop of a guarded connection, run by floodgate instead of Pingora so
//! that an idle connection holds only what waiting for bytes needs.
//!
//! Pingora's own loop (its `ServerApp` for every `HttpServerApp`) waits for the next request
//! inside `process_new_http`, whose future is the whole proxy state machine (request, upstream
//! exchange, body pumps: 16 KiB) and stays allocated for as long as the connection is idle.
//! Here each exchange's `process_new_http` ends when its response is done, and the wait for the
//! next request's first bytes happens in the connection's own task (640 bytes in all, no read
//! or write buffer held: [`GuardedStream`]'s deadlines apply to the wait as to any head read).
//! h2 (prior knowledge or ALPN) goes to Pingora's loop unchanged.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::BytesMut;
use pingora::apps::{HttpPersistentSettings, HttpServerApp, ReusedHttpStream, ServerApp};
use pingora::protocols::http::ServerSession;
use pingora::protocols::{Peek, Ssl, Stream, ALPN};
use pingora::server::ShutdownWatch;
use tokio::sync::Notify;

use super::{GuardedStream, H2_PREFACE};

/// Set when the service stops ([`ServerApp::cleanup`]): idle kept-alive connections waiting
/// here close, as Pingora's own wait does.
#[derive(Debug, Default)]
pub struct Closing {
    closed: AtomicBool,
    notify: Notify,
}

impl Closing {
    /// Wakes every idle connection: they close.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.notify.notify_waiters();
    }

    /// Resolves once [`Closing::close`] was called (before or while waiting).
    async fn closed(&self) {
        let notified = self.notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if self.closed.load(Ordering::Acquire) {
            return;
        }
        notified.await;
    }
}

/// Serves one admitted connection to its end (the task of its own that the connection runs
/// in: owned arguments).
pub async fn serve<A>(
    app: Arc<A>,
    mut stream: Box<GuardedStream>,
    shutdown: ShutdownWatch,
    closing: Arc<Closing>,
) where
    A: HttpServerApp + Send + Sync + 'static,
{
    let shutdown = &shutdown;
    let Some(h2) = is_h2(&*app, &mut stream).await else {
        return;
    };
    if h2 {
        // Pingora's loop peeks again and finds the same bytes (GuardedStream keeps them). It
        // returns nothing to reuse for h2.
        ServerApp::process_new(&app, stream, shutdown).await;
        return;
    }
    // The first request's bytes are awaited here too, as a kept-alive one's, so that its head
    // is parsed from an allocation of its own size.
    let Some(read_ahead) = request_start(&mut stream, &closing).await else {
        return;
    };
    let mut result = exchange(&app, stream, Some(read_ahead), Exchange::First, shutdown).await;
    // The exchange began with bytes Pingora carried over from the one before.
    let mut carried = false;
    while let Some((mut stream, settings)) = result.map(|r| r.consume()) {
        // Reads that returned exactly the request's bytes left Pingora nothing to carry: the
        // settings need not be asked (their `Debug`, about 4% of a proxied request's
        // instructions).
        let pipelined = settings
            .as_ref()
            .is_some_and(|s| (carried || !read_exactly(&stream)) && carries_pipelined_bytes(s));
        let mut read_ahead = None;
        if !pipelined {
            let Some((next, first)) = next_request(stream, &closing).await else {
                return;
            };
            (stream, read_ahead) = (next, Some(first));
        }
        carried = pipelined;
        result = exchange(&app, stream, read_ahead, Exchange::Next(settings), shutdown).await;
    }
}

/// Which exchange of the connection a session is for.
enum Exchange {
    /// The first: Pingora's loop's settings for a new connection.
    First,
    /// A later one, with what the previous exchange handed over.
    Next(Option<HttpPersistentSettings>),
}

/// One exchange's future: the session is built here, outside `serve`'s own state, so that the
/// connection's task (alive for as long as the connection) does not keep room for one.
/// `read_ahead`: the request's first bytes, already read (see
/// [`GuardedStream::take_read_ahead`]).
fn exchange<'a, A>(
    app: &'a Arc<A>,
    stream: Stream,
    read_ahead: Option<BytesMut>,
    which: Exchange,
    shutdown: &'a ShutdownWatch,
) -> impl std::future::Future<Output = Option<ReusedHttpStream>> + Send + 'a
where
    A: HttpServerApp + Send + Sync + 'static,
{
    let mut session = ServerSession::new_http1(stream);
    match which {
        Exchange::First => {
            // As Pingora's loop: no keep-alive once the service is shutting down.
            session.set_keepalive(if *shutdown.borrow() { None } else { Some(60) });
            session.set_keepalive_reuses_remaining(
                app.server_options().and_then(|o| o.keepalive_request_limit),
            );
        }
        Exchange::Next(Some(settings)) => settings.apply_to_session(&mut session),
        Exchange::Next(None) => {}
    }
    if let Some(first) = read_ahead {
        session.set_pipelined_prefix(first);
    }
    app.process_new_http(session, shutdown)
}

/// Whether the connection's reads returned exactly its last request's bytes (see
/// [`GuardedStream::read_exactly_its_request`]).
fn read_exactly(stream: &Stream) -> bool {
    stream
        .as_any()
        .downcast_ref::<GuardedStream>()
        .is_some_and(GuardedStream::read_exactly_its_request)
}

/// Whether Pingora hands the next request's first bytes over in `settings` (the client
/// pipelined): they are no longer on the socket, and waiting for bytes there would wait for a
/// request that has already arrived. Pingora says so only through `Debug`; the formatting stops
/// at the field. When the field is not found, this says yes: the next exchange then waits in
/// Pingora, correct with more memory.
fn carries_pipelined_bytes(settings: &HttpPersistentSettings) -> bool {
    use std::fmt::Write as _;
    let mut scan = Scan::default();
    let _ = write!(scan, "{settings:?}");
    scan.answer.unwrap_or(true)
}

/// A `fmt::Write` that reads what follows `pipelined_prefix` and stops the formatting there.
///
/// The key is looked for byte by byte across the pieces the formatter writes (a
/// Knuth-Morris-Pratt match), not with `str::split_once` on each piece: that built a substring
/// searcher per piece, about 20 per request, which made it a large share of floodgate's own
/// work on a proxied request.
#[derive(Default)]
struct Scan {
    /// How many bytes of [`KEY`] the output ends with so far.
    matched: usize,
    after_key: bool,
    answer: Option<bool>,
}

/// The field of `HttpPersistentSettings` that holds the pipelined bytes.
const KEY: &[u8] = b"pipelined_prefix";

/// `FALLBACK[i]`: the length of the longest proper prefix of `KEY[..=i]` that is also a suffix
/// of it (where a match continues after a mismatch).
const FALLBACK: [usize; KEY.len()] = {
    let mut table = [0; KEY.len()];
    let mut len = 0;
    let mut i = 1;
    while i < KEY.len() {
        while len > 0 && KEY[i] != KEY[len] {
            len = table[len - 1];
        }
        if KEY[i] == KEY[len] {
            len += 1;
        }
        table[i] = len;
        i += 1;
    }
    table
};

impl std::fmt::Write for Scan {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let mut rest = s;
        if !self.after_key {
            let Some(end) = self.find_key_end(s.as_bytes()) else {
                return Ok(());
            };
            self.after_key = true;
            rest = &s[end..];
        }
        let value = rest.trim_start_matches([':', ' ']);
        if value.is_empty() {
            return Ok(());
        }
        self.answer = Some(!value.starts_with("None"));
        Err(std::fmt::Error)
    }
}

impl Scan {
    /// Where in `piece` the key's last byte was just passed (the key may have begun in earlier
    /// pieces), if it was.
    fn find_key_end(&mut self, piece: &[u8]) -> Option<usize> {
        for (i, &b) in piece.iter().enumerate() {
            while self.matched > 0 && b != KEY[self.matched] {
                self.matched = FALLBACK[self.matched - 1];
            }
            if b == KEY[self.matched] {
                self.matched += 1;
                if self.matched == KEY.len() {
                    return Some(i + 1);
                }
            }
        }
        None
    }
}

/// Whether the connection speaks h2: by ALPN, or by the h2c preface where h2c is on (plain
/// connections only, as in Pingora). `None`: the client went away while peeking.
async fn is_h2<A: HttpServerApp>(app: &A, stream: &mut GuardedStream) -> Option<bool> {
    if matches!(stream.selected_alpn_proto(), Some(ALPN::H2)) {
        return Some(true);
    }
    let h2c = app.server_options().is_some_and(|o| o.h2c);
    if !h2c || stream.get_ssl_digest().is_some() {
        return Some(false);
    }
    let mut buf = [0u8; H2_PREFACE.len()];
    stream.try_peek(&mut buf).await.ok()?;
    Some(buf == H2_PREFACE)
}

/// Waits for the first bytes of the next request on a kept-alive connection (or its close, a
/// deadline, the service stopping: `None`), and takes them out for the session.
async fn next_request(stream: Stream, closing: &Closing) -> Option<(Stream, BytesMut)> {
    let mut guarded: Box<GuardedStream> = stream.into_any().downcast().ok()?;
    if !guarded.idle().await {
        return None;
    }
    let first = request_start(&mut guarded, closing).await?;
    Some((guarded, first))
}

/// Begins an exchange on `guarded`: waits for its request's first bytes unless they were
/// already read (the h2c peek), and takes them out for the session. `None`: the client closed,
/// a deadline passed, or the service is stopping.
async fn request_start(guarded: &mut GuardedStream, closing: &Closing) -> Option<BytesMut> {
    if !guarded.has_read_ahead() {
        let arrived = tokio::select! {
            biased;
            r = guarded.await_next_request() => r,
            _ = closing.closed() => return None,
        };
        if !matches!(arrived, Ok(true)) {
            return None;
        }
    }
    guarded.begin_exchange();
    guarded.take_read_ahead()
}

#[cfg(test)]
mod tests {
    use super::Scan;
    use std::fmt::Write as _;

    fn answer(debug: &str) -> Option<bool> {
        let mut scan = Scan::default();
        let _ = scan.write_str(debug);
        scan.answer
    }

    #[test]
    fn the_pipelined_prefix_is_read_from_the_settings_debug() {
        assert_eq!(
            answer("S { a: None, pipelined_prefix: None, b: true }"),
            Some(false)
        );
        assert_eq!(
            answer("S { a: None, pipelined_prefix: Some(b\"GET /\"), b: true }"),
            Some(true)
        );
        // Written in pieces, as `debug_struct` does.
        let mut scan = Scan::default();
        for piece in ["S", " { ", "pipelined_prefix", ": ", "None", " }"] {
            if scan.write_str(piece).is_err() {
                break;
            }
        }
        assert_eq!(scan.answer, Some(false));
        assert_eq!(answer("S { other: None }"), None);
        // The key split across pieces, and after a partial match that overlaps it.
        let mut scan = Scan::default();
        for piece in ["S { pipipe", "lined_pre", "fix: Some(", "b\"x\")", " }"] {
            if scan.write_str(piece).is_err() {
                break;
            }
        }
        assert_eq!(scan.answer, Some(true));
        assert_eq!(
            answer("S { pipelined_prefi: Some(1), pipelined_prefix: None }"),
            Some(false)
        );
    }
}
