//! Request bodies: a deadline for the whole body, and buffering before the upstream is asked.
//!
//! A client that sends its body a byte every few seconds (or an endless chunked body) must not
//! hold an upstream connection while it does: floodgate reads a request's body into memory
//! before it connects upstream, up to [`BUFFER`] bytes (as nginx's `proxy_request_buffering`
//! and Envoy's buffer filter do), and streams only what is past that. The whole body must
//! arrive within `[server] body_timeout` of its head; past it the client gets `408` and the
//! connection is closed, whether the body was still being buffered (the upstream never saw the
//! request) or streaming (the exchange is cut).
//!
//! The buffer is Pingora's retry buffer (64 KiB): what was read ahead is what Pingora sends
//! upstream first, and it makes the request replayable on a retry. A body larger than the
//! buffer overflows it; the bytes read ahead are then held here and put in front of the next
//! piece Pingora reads ([`Body::take_held`]). Reading ahead stops before a read could both
//! overflow the buffer and end the body (there would be no next piece to put them in front
//! of): see [`may_read_ahead`].
//!
//! A client that sends `Expect: 100-continue` gets floodgate's `100 Continue` once the request
//! is admitted (the upstream is not asked yet), and the request goes upstream without the
//! `Expect`.
//!
//! HTTP/2 multiplexes: one connection may have at most [`MAX_WAITING_PER_H2_CONNECTION`]
//! requests reading their bodies ahead at once; more are answered `429`, so a connection's
//! read-ahead memory stays bounded (`100 streams × 64 KiB` otherwise).

use std::sync::LazyLock;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use hashbrown::HashMap;
use parking_lot::Mutex;
use pingora::proxy::Session;

/// How much of a body is read ahead before the upstream is connected: Pingora's retry buffer.
pub const BUFFER: usize = 64 * 1024;

/// The most an HTTP/1.1 body read returns (Pingora's body buffer).
const H1_MAX_READ: usize = 64 * 1024;

/// The most an HTTP/2 body read returns: one DATA frame at the default (and Pingora's)
/// `SETTINGS_MAX_FRAME_SIZE`.
const H2_MAX_READ: usize = 16 * 1024;

/// Requests of one HTTP/2 connection that may read their bodies ahead at once.
pub const MAX_WAITING_PER_H2_CONNECTION: usize = 16;

/// What is known of a body before a read, for [`may_read_ahead`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Framing {
    /// HTTP/2 (else HTTP/1.1).
    pub h2: bool,
    /// The declared length (`Content-Length`); `None` for chunked or undeclared bodies.
    pub length: Option<usize>,
}

/// Whether another piece may be read ahead after `read` bytes: while the buffer has room, and
/// never a read that could overflow the buffer *and* end the body. An HTTP/1.1 chunked body
/// ends only on a read that returns no data, so a read that overflows never ends it; a
/// declared length tells when the next read could be the last; HTTP/2 may end a body with its
/// last DATA frame, so reading stops while one more frame still fits.
pub fn may_read_ahead(read: usize, framing: Framing) -> bool {
    if read >= BUFFER {
        return false;
    }
    if framing.h2 {
        return read + H2_MAX_READ <= BUFFER;
    }
    match framing.length {
        // Fits whole: read it all.
        Some(len) if len <= BUFFER => true,
        // The next read may end it (at most H1_MAX_READ) and would overflow: stop.
        Some(len) => len - read > H1_MAX_READ,
        None => true,
    }
}

/// A request body's state across the proxy's phases (one per request).
#[derive(Debug, Default)]
pub struct Body {
    /// When the whole body is due.
    deadline: Option<Instant>,
    /// Bytes read ahead that Pingora's retry buffer could not hold (it overflowed).
    held: Vec<Bytes>,
    /// floodgate answered the client's `Expect: 100-continue` itself (the upstream must not
    /// be asked to again).
    continued: bool,
}

/// How reading ahead ended.
#[derive(Debug)]
pub enum ReadAhead {
    /// Forward the request (the body is buffered, or what is past the buffer will stream).
    Forward,
    /// The body did not arrive in time: answer 408 and close.
    TimedOut,
    /// Too many requests of this HTTP/2 connection are reading ahead: answer 429.
    TooManyWaiting,
}

impl Body {
    /// Reads the request's body ahead, up to [`BUFFER`], within `timeout` of now (the head has
    /// just been read). Errors are the client's (a broken or malformed body).
    pub async fn read_ahead(
        &mut self,
        session: &mut Session,
        timeout: Duration,
    ) -> pingora::Result<ReadAhead> {
        // A request without a body (most) has no body deadline to keep: no clock read.
        if session.as_mut().is_body_empty() || session.as_mut().is_body_done() {
            return Ok(ReadAhead::Forward);
        }
        let deadline = Instant::now() + timeout;
        self.deadline = Some(deadline);
        let h2 = session.as_ref().is_http2();
        let _waiting = if h2 {
            match Waiting::enter(connection_key(session)) {
                Some(w) => Some(w),
                None => return Ok(ReadAhead::TooManyWaiting),
            }
        } else {
            None
        };
        let framing = Framing {
            h2,
            length: declared_length(session),
        };
        if !h2 && expects_continue(session) {
            // A client that waits for `100 Continue` before its body would wait for an
            // upstream that is not asked yet: floodgate says it, once the request is admitted.
            let interim = pingora::http::ResponseHeader::build(100, Some(0))?;
            session
                .write_response_header(Box::new(interim), false)
                .await?;
            self.continued = true;
        }
        session.as_mut().enable_retry_buffering();
        let mut read = 0;
        let mut pieces = Vec::new();
        while may_read_ahead(read, framing) && !session.as_mut().is_body_done() {
            let next = tokio::time::timeout_at(deadline.into(), session.read_request_body());
            match next.await {
                Err(_) => return Ok(ReadAhead::TimedOut),
                Ok(Ok(Some(piece))) => {
                    read += piece.len();
                    pieces.push(piece);
                }
                Ok(Ok(None)) => break,
                Ok(Err(e)) => return Err(e),
            }
        }
        if session.as_ref().retry_buffer_truncated() {
            self.held = pieces;
        }
        self.set_read_timeout(session);
        Ok(ReadAhead::Forward)
    }

    /// The bytes read ahead that Pingora does not hold, to go in front of the next piece it
    /// forwards (called from `request_body_filter`; empty after the first call).
    pub fn take_held(&mut self, piece: &mut Option<Bytes>) {
        if self.held.is_empty() {
            return;
        }
        let rest = piece.take().unwrap_or_default();
        let len = self.held.iter().map(Bytes::len).sum::<usize>() + rest.len();
        let mut out = BytesMut::with_capacity(len);
        for h in self.held.drain(..) {
            out.extend_from_slice(&h);
        }
        out.extend_from_slice(&rest);
        *piece = Some(out.freeze());
    }

    /// Whether floodgate answered `Expect: 100-continue` itself: the request goes upstream
    /// without its `Expect` (the body is already on its way).
    pub fn continued(&self) -> bool {
        self.continued
    }

    /// Whether the body's deadline has passed (checked as each streamed piece goes upstream).
    pub fn late(&self) -> bool {
        self.deadline.is_some_and(|d| Instant::now() > d)
    }

    /// Caps Pingora's HTTP/1.1 per-read timeout at what is left of the deadline, so that a
    /// streaming body that stops sending is cut at the deadline too (Pingora has no read
    /// timeout for HTTP/2 bodies: those are cut by the check on each piece, and by the
    /// upstream's `read_timeout` while it waits).
    pub fn set_read_timeout(&self, session: &mut Session) {
        if let Some(d) = self.deadline {
            let left = d.saturating_duration_since(Instant::now());
            session
                .as_downstream_mut()
                .set_read_timeout(Some(left.max(Duration::from_millis(1))));
        }
    }
}

/// Whether an HTTP/1.1 request asks for `100 Continue` before it sends its body.
fn expects_continue(session: &Session) -> bool {
    let req = session.req_header();
    req.version == http::Version::HTTP_11
        && req
            .headers
            .get(http::header::EXPECT)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"))
}

/// The body's declared length, when it is framed by `Content-Length` (not chunked).
fn declared_length(session: &Session) -> Option<usize> {
    let headers = &session.req_header().headers;
    if headers.contains_key(http::header::TRANSFER_ENCODING) {
        return None;
    }
    headers
        .get(http::header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Identifies the HTTP/2 connection a request came on: its streams share one digest.
fn connection_key(session: &Session) -> usize {
    session
        .as_downstream()
        .digest()
        .map_or(0, |d| d as *const _ as usize)
}

/// Requests reading ahead, per HTTP/2 connection.
static WAITING: LazyLock<Mutex<HashMap<usize, usize>>> = LazyLock::new(Default::default);

/// One request of an HTTP/2 connection reading its body ahead; dropping it counts it out.
struct Waiting(usize);

impl Waiting {
    fn enter(conn: usize) -> Option<Waiting> {
        let mut map = WAITING.lock();
        let n = map.entry(conn).or_insert(0);
        if *n >= MAX_WAITING_PER_H2_CONNECTION {
            return None;
        }
        *n += 1;
        Some(Waiting(conn))
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        let mut map = WAITING.lock();
        if let Some(n) = map.get_mut(&self.0) {
            *n -= 1;
            if *n == 0 {
                map.remove(&self.0);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const H1: Framing = Framing {
        h2: false,
        length: None,
    };

    #[test]
    fn a_small_declared_body_is_read_whole() {
        let f = Framing {
            length: Some(BUFFER),
            ..H1
        };
        assert!(may_read_ahead(0, f));
        assert!(may_read_ahead(BUFFER - 1, f));
        assert!(!may_read_ahead(BUFFER, f));
    }

    #[test]
    fn a_large_declared_body_stops_before_a_read_that_could_end_it() {
        let f = Framing {
            length: Some(BUFFER + 10),
            ..H1
        };
        // 65,546 left: the next read (at most 64 KiB) cannot end it.
        assert!(may_read_ahead(0, f));
        // 65,536 left: one read could end it and overflow the buffer.
        assert!(!may_read_ahead(10, f));
        let big = Framing {
            length: Some(10 * BUFFER),
            ..H1
        };
        assert!(may_read_ahead(BUFFER - 1, big));
        assert!(!may_read_ahead(BUFFER, big));
    }

    #[test]
    fn chunked_bodies_read_until_the_buffer_is_full() {
        assert!(may_read_ahead(0, H1));
        assert!(may_read_ahead(BUFFER - 1, H1));
        assert!(!may_read_ahead(BUFFER, H1));
    }

    #[test]
    fn h2_stops_while_one_more_frame_fits() {
        let f = Framing {
            h2: true,
            length: None,
        };
        assert!(may_read_ahead(BUFFER - H2_MAX_READ, f));
        assert!(!may_read_ahead(BUFFER - H2_MAX_READ + 1, f));
    }

    #[test]
    fn an_h2_connection_has_a_bound_on_waiting_requests() {
        let conn = 0xdead_beef;
        let held: Vec<_> = (0..MAX_WAITING_PER_H2_CONNECTION)
            .map(|_| Waiting::enter(conn).expect("under the bound"))
            .collect();
        assert!(Waiting::enter(conn).is_none());
        assert!(
            Waiting::enter(conn + 1).is_some(),
            "another connection is apart"
        );
        drop(held);
        assert!(Waiting::enter(conn).is_some());
        assert!(!WAITING.lock().contains_key(&conn));
    }
}
