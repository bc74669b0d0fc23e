//! What one client connection may hold: caps on open connections (in all and per IP) and
//! deadlines for slow and idle clients, enforced below Pingora's HTTP layer.
//!
//! Pingora reads a request head with a timeout per read (a client sending a byte a minute is
//! never cut off) and waits for the next request on a kept-alive HTTP/1.1 connection forever.
//! [`GuardedApp`] wraps the proxy's [`ServerApp`]: each accepted connection takes a [`Slot`]
//! (or is closed at once when a cap is reached) and its stream is wrapped in a
//! [`GuardedStream`], whose reads carry one deadline while a request head is awaited:
//! - from accept: the whole first head within `header_timeout`;
//! - after an exchange: the first byte of the next request within `keepalive_timeout`, then the
//!   rest of that head within `header_timeout` of its first byte.
//!
//! Past the deadline the read fails; when part of a head had arrived, a `408` problem+json is
//! written first. The proxy marks the phases: [`head_received`] once Pingora has parsed a head
//! (request bodies are then Pingora's, with its own read timeouts) and [`exchange_done`] when
//! the response is complete. h2 connections (prior knowledge or ALPN) are only held to
//! `header_timeout` for their preface; Pingora's `h2_idle_timeout` closes them when idle.

use std::future::Future;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use async_trait::async_trait;
use pingora::apps::{HttpServerApp, ServerApp};
use pingora::protocols::raw_connect::ProxyDigest;
use pingora::protocols::tls::{SslDigest, TlsRef};
use pingora::protocols::{
    GetProxyDigest, GetSocketDigest, GetTimingDigest, Peek, Shutdown, SocketDigest, Ssl, Stream,
    TimingDigest, UniqueID, UniqueIDType, ALPN,
};
use pingora::proxy::Session;
use pingora::server::ShutdownWatch;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

pub mod serve;
pub mod table;
pub mod tls;
pub mod write_buffer;

pub use table::{rls_budget, set_open_file_limit, Budget, ConnectionTable, Refusal, Slot};

use crate::config::Connections;
use crate::gateway::Gateway;
use crate::metrics::metrics;

/// The error a read returns when the head deadline passes (also how the logging filter
/// recognizes Pingora's line about it).
pub const HEAD_TIMEOUT_MESSAGE: &str = "request head not received in time";

/// The h2 connection preface: a client that sends it speaks HTTP/2 with prior knowledge.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// How much the peek for the h2 preface reads at once: a whole usual request head.
const PEEK_READ: usize = 1024;

/// The proxy's [`ServerApp`] behind the connection caps and deadlines (and, on TLS listeners,
/// the TLS handshake: see [`tls`]).
pub struct GuardedApp<A> {
    inner: Arc<A>,
    gateway: Arc<Gateway>,
    table: Arc<ConnectionTable>,
    /// The acceptor and the addresses of the TLS listeners (registered as plain TCP).
    tls: Option<(Arc<pingora::listeners::tls::Acceptor>, Vec<SocketAddr>)>,
    /// Closes the idle kept-alive connections when the service stops.
    closing: Arc<serve::Closing>,
}

impl<A> GuardedApp<A> {
    /// Wraps `inner`; limits are read from the config in force at each accept.
    pub fn new(inner: A, gateway: Arc<Gateway>) -> Self {
        GuardedApp {
            inner: Arc::new(inner),
            gateway,
            table: Arc::default(),
            tls: None,
            closing: Arc::default(),
        }
    }

    /// Connections accepted on `listeners` (TLS listeners registered as plain TCP in the same
    /// service, so that they are bound with the others) take their slot first, then complete
    /// the handshake with `acceptor`.
    pub fn with_tls(
        mut self,
        acceptor: Arc<pingora::listeners::tls::Acceptor>,
        listeners: Vec<SocketAddr>,
    ) -> Self {
        self.tls = Some((acceptor, listeners));
        self
    }
}

impl<A> GuardedApp<A> {
    /// Takes a slot for a connection from `ip`, or counts the refusal (the caller then drops
    /// the stream, closing it: nothing is read from or written to a client over a cap).
    fn admit(&self, ip: IpAddr, limits: &Connections) -> Option<Slot> {
        match self.table.admit(ip, limits) {
            Ok(slot) => Some(slot),
            Err(why) => {
                metrics()
                    .connections_refused
                    .with_label_values(&[why.as_str()])
                    .inc();
                None
            }
        }
    }
}

/// What `process_new` returns (the signature `#[async_trait]` gives the trait method).
type ProcessNew<'a> = Pin<Box<dyn Future<Output = Option<Stream>> + Send + 'a>>;

// Written out instead of with `#[async_trait]`: the admission at accept is synchronous. The
// keep-alive loop is floodgate's own (`serve`), so that an idle connection does not hold
// Pingora's per-request future.
impl<A: HttpServerApp + Send + Sync + 'static> ServerApp for GuardedApp<A> {
    fn process_new<'life0, 'life1, 'async_trait>(
        self: &'life0 Arc<Self>,
        stream: Stream,
        shutdown: &'life1 ShutdownWatch,
    ) -> ProcessNew<'async_trait>
    where
        'life0: 'async_trait,
        'life1: 'async_trait,
        Self: 'async_trait,
    {
        let accepted = Instant::now();
        let limits = self.gateway.config.load().server.connections.clone();
        let digest = stream.get_socket_digest();
        let ip = digest
            .as_ref()
            .and_then(|d| d.peer_addr().and_then(|a| a.as_inet()).map(|a| a.ip()))
            .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |ip| ip.to_canonical());
        let tls = self.tls.as_ref().filter(|(_, listeners)| {
            let local = digest
                .as_ref()
                .and_then(|d| d.local_addr().and_then(|a| a.as_inet()).copied());
            local.is_some_and(|l| tls::is_listener(listeners, l))
        });
        let Some((acceptor, _)) = tls else {
            // A plain connection is served in a task of its own and Pingora's accept task ends
            // here: that task's future is sized for Pingora's own TLS handshake (rustls state
            // inline, ~9 KiB) and would stay allocated for the connection's life, idle or not.
            // The slot is taken in the new task, so that a connection the client has already
            // closed gives it back in the same poll that took it.
            let app = self.clone();
            let shutdown = shutdown.clone();
            tokio::spawn(async move {
                let Some(slot) = app.admit(ip, &limits) else {
                    return;
                };
                let guarded = Box::new(GuardedStream::new(stream, &limits, slot, accepted));
                let (inner, closing) = (app.inner.clone(), app.closing.clone());
                drop(app);
                serve::serve(inner, guarded, shutdown, closing).await;
            });
            return Box::pin(std::future::ready(None));
        };
        let Some(slot) = self.admit(ip, &limits) else {
            return Box::pin(std::future::ready(None));
        };
        let inner = self.inner.clone();
        let closing = self.closing.clone();
        let acceptor = acceptor.clone();
        let shutdown = shutdown.clone();
        Box::pin(async move {
            let stream = tls::handshake(&acceptor, stream, accepted, limits.header_timeout).await?;
            let guarded = GuardedStream::new(stream, &limits, slot, accepted);
            serve::serve(inner, Box::new(guarded), shutdown, closing).await;
            None
        })
    }

    fn cleanup<'life0, 'async_trait>(
        &'life0 self,
    ) -> Pin<Box<dyn Future<Output = ()> + Send + 'async_trait>>
    where
        'life0: 'async_trait,
        Self: 'async_trait,
    {
        self.closing.close();
        self.inner.cleanup()
    }
}

/// Phase bits of [`GuardedStream::phase`]: the low bit says a head is awaited, the rest counts
/// exchanges (so the reader can tell a new wait from the one it already timed).
const AWAITING_HEAD: u32 = 1;
const EXCHANGE: u32 = 2;

/// A client stream whose reads time out while a request head is awaited (see the module doc).
pub struct GuardedStream {
    inner: Stream,
    /// Written by the proxy (through `&self`), read by `poll_read`.
    phase: AtomicU32,
    /// The exchange count the current deadline was set for.
    timed_exchange: u32,
    header_timeout: Duration,
    keepalive_timeout: Duration,
    /// When the awaited head is late; `None`: not set yet, it is set by the first read that
    /// has to wait (from then: `keepalive_timeout` before any byte, `header_timeout` after).
    /// Most reads of a kept-alive connection find their bytes there and never read the clock.
    deadline: Option<Instant>,
    /// Bytes of the awaited head have arrived (a timeout then answers 408).
    received: bool,
    /// Armed at or before `deadline`: a deadline that moves later is not re-armed (a timer
    /// reset per request costs a timer-wheel update); the timer fires early and is re-armed
    /// then.
    timer: Option<Pin<Box<Sleep>>>,
    /// Bytes read while peeking for the h2 preface, handed out by the next reads.
    peeked: Vec<u8>,
    /// floodgate's answer in place of a bare one of Pingora's, and how much of it is written
    /// (see [`GuardedStream::replace_bare_answer`]).
    replaced: Option<(Vec<u8>, usize)>,
    /// Plain connections: the response write buffer, allocated only while an exchange writes
    /// (see [`write_buffer`]). TLS connections keep Pingora's.
    writes: Option<write_buffer::WriteBuffer>,
    /// Bytes the reads have returned since the exchange began ([`GuardedStream::begin_exchange`]).
    handed: usize,
    /// What the exchange's request takes on the wire (head and `Content-Length` body), plus
    /// one; 0 while unknown. Set by the proxy once the head is parsed ([`head_received`]).
    request_length: AtomicUsize,
    _slot: Slot,
}

impl std::fmt::Debug for GuardedStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuardedStream")
            .field("inner", &self.inner)
            .field("phase", &self.phase)
            .finish_non_exhaustive()
    }
}

impl GuardedStream {
    /// `accepted`: when the connection was accepted; the first head is due `header_timeout`
    /// after it (a TLS handshake spends from the same budget).
    fn new(inner: Stream, limits: &Connections, slot: Slot, accepted: Instant) -> Self {
        // An h2 connection by ALPN carries many requests at once: only Pingora's h2 idle
        // timeout applies to it.
        let h2 = matches!(inner.selected_alpn_proto(), Some(ALPN::H2));
        let plain = inner.get_ssl_digest().is_none();
        GuardedStream {
            inner,
            phase: AtomicU32::new(if h2 { 0 } else { AWAITING_HEAD }),
            timed_exchange: 0,
            header_timeout: limits.header_timeout,
            keepalive_timeout: limits.keepalive_timeout,
            deadline: Some(accepted + limits.header_timeout),
            received: false,
            timer: None,
            peeked: Vec::new(),
            replaced: None,
            writes: plain.then(write_buffer::WriteBuffer::default),
            handed: 0,
            request_length: AtomicUsize::new(0),
            _slot: slot,
        }
    }

    /// The connection waits for its next request: its write buffer (empty: Pingora flushes
    /// every response) is given back. `false`: buffered bytes could not be written.
    async fn idle(&mut self) -> bool {
        use tokio::io::AsyncWriteExt;
        if self.writes.as_ref().is_some_and(|w| !w.is_empty()) && self.flush().await.is_err() {
            return false;
        }
        if let Some(w) = &mut self.writes {
            w.release();
        }
        true
    }

    /// Waits for the next request's first bytes (under the head deadlines, as any read while a
    /// head is awaited) and keeps them for the reads that follow. `Ok(false)`: the client
    /// closed. Each poll reads into a buffer of its own, dropped when nothing came: an idle
    /// connection holds no read buffer, and the bytes still come in the one read call that
    /// also finds them ready.
    async fn await_next_request(&mut self) -> io::Result<bool> {
        use tokio::io::AsyncReadExt;
        std::future::poll_fn(|cx| {
            let mut first = Vec::with_capacity(PEEK_READ);
            let n = {
                let read = std::pin::pin!(self.read_buf(&mut first));
                std::task::ready!(read.poll(cx))?
            };
            if n == 0 {
                return Poll::Ready(Ok(false));
            }
            self.peeked = first;
            Poll::Ready(Ok(true))
        })
        .await
    }

    /// The bytes read ahead of the exchange (the wait for its first bytes, the h2c preface
    /// peek), taken out to be handed to the session as its first bytes: copied into an
    /// allocation of their own size. Pingora's head parser would otherwise read them into a
    /// 4 KiB buffer that the parsed request keeps (its header values point into it) for the
    /// whole exchange, waiting on the upstream included. They count as handed, as if read.
    fn take_read_ahead(&mut self) -> Option<bytes::BytesMut> {
        if self.peeked.is_empty() {
            return None;
        }
        let prefix = bytes::BytesMut::from(&self.peeked[..]);
        self.handed += prefix.len();
        self.peeked = Vec::new();
        Some(prefix)
    }

    /// Whether bytes read ahead of the exchange wait to be handed out.
    fn has_read_ahead(&self) -> bool {
        !self.peeked.is_empty()
    }

    /// The whole head was read: the rest of the exchange is not on the head deadline.
    fn head_received(&self) {
        self.phase.fetch_and(!AWAITING_HEAD, Ordering::Relaxed);
    }

    /// A new exchange reads from here on (its bytes may already wait in the peek buffer).
    fn begin_exchange(&mut self) {
        self.handed = 0;
        self.request_length.store(0, Ordering::Relaxed);
    }

    /// Whether the exchange's reads returned exactly its request's bytes, and so nothing of a
    /// next request (Pingora holds no pipelined bytes). `false` when unknown (a chunked body).
    /// Meaningful only for an exchange that began without bytes carried over from the last.
    pub(crate) fn read_exactly_its_request(&self) -> bool {
        let length = self.request_length.load(Ordering::Relaxed);
        length != 0 && self.handed == length - 1
    }

    /// The response is complete: the next read waits for a new request.
    fn exchange_done(&self) {
        let p = self.phase.load(Ordering::Relaxed);
        self.phase.store(
            (p & !AWAITING_HEAD).wrapping_add(EXCHANGE) | AWAITING_HEAD,
            Ordering::Relaxed,
        );
    }

    /// Whether the deadline has passed (registering the waker for it when not). Sets the
    /// deadline first if this is the wait's first pending read.
    fn deadline_passed(&mut self, cx: &mut Context<'_>) -> bool {
        let deadline = *self.deadline.get_or_insert_with(|| {
            let allowed = if self.received {
                self.header_timeout
            } else {
                self.keepalive_timeout
            };
            Instant::now() + allowed
        });
        let timer = self
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        if timer.deadline() > deadline {
            timer.as_mut().reset(deadline);
        }
        loop {
            if timer.as_mut().poll(cx).is_pending() {
                return false;
            }
            if timer.deadline() >= deadline {
                return true;
            }
            // It fired for an earlier deadline than the one that holds now.
            timer.as_mut().reset(deadline);
        }
    }
}

impl AsyncRead for GuardedStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.peeked.is_empty() {
            let n = this.peeked.len().min(buf.remaining());
            buf.put_slice(&this.peeked[..n]);
            this.peeked.drain(..n);
            if this.peeked.is_empty() {
                // Freed, not kept: an idle connection holds no peek buffer.
                this.peeked = Vec::new();
            }
            this.handed += n;
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        let read = this.read_inner(cx, buf);
        this.handed += buf.filled().len() - before;
        read
    }
}

impl GuardedStream {
    /// A read from the socket, under the head deadline while a head is awaited.
    fn read_inner(&mut self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self;
        let phase = this.phase.load(Ordering::Relaxed);
        if phase & AWAITING_HEAD == 0 {
            return Pin::new(&mut this.inner).poll_read(cx, buf);
        }
        let exchange = phase >> 1;
        if exchange != this.timed_exchange {
            // A new wait after a response: idle until the first byte.
            this.timed_exchange = exchange;
            this.received = false;
            this.deadline = None;
        }
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before && !this.received {
                    this.received = true;
                    if exchange != 0 {
                        // The rest of the head within `header_timeout`: set when a read has
                        // to wait for it (microseconds after this byte at most).
                        this.deadline = None;
                    }
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => {
                if !this.deadline_passed(cx) {
                    return Poll::Pending;
                }
                let kind = if this.received {
                    // Best effort: the socket's send buffer is empty while a head is awaited,
                    // so this small write completes at once or not at all.
                    let answer = crate::wire::response::request_timeout_bytes();
                    let _ = Pin::new(&mut this.inner).poll_write(cx, &answer);
                    let _ = Pin::new(&mut this.inner).poll_flush(cx);
                    "header"
                } else if exchange == 0 {
                    "header"
                } else {
                    "keepalive"
                };
                metrics()
                    .connection_timeouts
                    .with_label_values(&[kind])
                    .inc();
                Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    HEAD_TIMEOUT_MESSAGE,
                )))
            }
        }
    }
}

impl GuardedStream {
    /// Pingora answers a head it cannot parse (two Host headers, bad framing: `400`) itself,
    /// before any floodgate code runs, with a bare body and `Server: Pingora` (`CONNECT`, which
    /// it would refuse so too, is let through to admission: `crate::server`). While a head is awaited, such a write is replaced by floodgate's own
    /// problem+json answer (with a request id); whatever Pingora writes after it is dropped,
    /// and the connection closes as Pingora intended. `None`: not such a write.
    fn replace_bare_answer(
        &mut self,
        cx: &mut Context<'_>,
        first: &[u8],
        total: usize,
    ) -> Option<Poll<io::Result<usize>>> {
        if self.replaced.is_none() {
            if self.phase.load(Ordering::Relaxed) & AWAITING_HEAD == 0 {
                return None;
            }
            if !first.starts_with(b"HTTP/1.1 400 ") {
                return None;
            }
            let problem =
                crate::wire::response::Problem::bad_request("the request head could not be parsed");
            self.replaced = Some((crate::wire::response::raw_answer(problem), 0));
        }
        let (answer, written) = self.replaced.as_mut()?;
        while *written < answer.len() {
            match Pin::new(&mut self.inner).poll_write(cx, &answer[*written..]) {
                Poll::Ready(Ok(0)) => {
                    return Some(Poll::Ready(Err(io::ErrorKind::WriteZero.into())))
                }
                Poll::Ready(Ok(n)) => *written += n,
                Poll::Ready(Err(e)) => return Some(Poll::Ready(Err(e))),
                Poll::Pending => return Some(Poll::Pending),
            }
        }
        // Pingora's own bytes are taken as written.
        Some(Poll::Ready(Ok(total)))
    }
}

impl AsyncWrite for GuardedStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if let Some(done) = this.replace_bare_answer(cx, buf, buf.len()) {
            return done;
        }
        match &mut this.writes {
            Some(w) => w.poll_write(&mut this.inner, cx, buf),
            None => Pin::new(&mut this.inner).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let first = bufs
            .iter()
            .find(|b| !b.is_empty())
            .map_or(&[][..], |b| &b[..]);
        let total = bufs.iter().map(|b| b.len()).sum();
        if let Some(done) = this.replace_bare_answer(cx, first, total) {
            return done;
        }
        match &mut this.writes {
            Some(w) => w.poll_write_vectored(&mut this.inner, cx, bufs),
            None => Pin::new(&mut this.inner).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        // A buffer takes vectored writes whatever the socket does (as tokio's BufWriter).
        self.writes.is_some() || self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Some(w) = &mut this.writes {
            std::task::ready!(w.flush_into(&mut this.inner, cx))?;
        }
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Some(w) = &mut this.writes {
            std::task::ready!(w.flush_into(&mut this.inner, cx))?;
        }
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

impl Drop for GuardedStream {
    fn drop(&mut self) {
        // As Pingora's own buffer does when its stream drops: one try, without waiting.
        if let Some(w) = self.writes.as_mut().filter(|w| !w.is_empty()) {
            let _ = w.flush_into(
                &mut self.inner,
                &mut Context::from_waker(std::task::Waker::noop()),
            );
        }
    }
}

#[async_trait]
impl Shutdown for GuardedStream {
    async fn shutdown(&mut self) {
        if self.writes.as_ref().is_some_and(|w| !w.is_empty()) {
            // Pingora's stream flushes its buffer before it shuts down: so does this one.
            let _ = tokio::io::AsyncWriteExt::flush(self).await;
        }
        self.inner.shutdown().await;
    }
}

impl UniqueID for GuardedStream {
    fn id(&self) -> UniqueIDType {
        self.inner.id()
    }
}

impl Ssl for GuardedStream {
    fn get_ssl(&self) -> Option<&TlsRef> {
        self.inner.get_ssl()
    }

    fn get_ssl_digest(&self) -> Option<Arc<SslDigest>> {
        self.inner.get_ssl_digest()
    }

    fn selected_alpn_proto(&self) -> Option<ALPN> {
        self.inner.selected_alpn_proto()
    }
}

impl GetTimingDigest for GuardedStream {
    fn get_timing_digest(&self) -> Vec<Option<TimingDigest>> {
        self.inner.get_timing_digest()
    }

    fn get_read_pending_time(&self) -> Duration {
        self.inner.get_read_pending_time()
    }

    fn get_write_pending_time(&self) -> Duration {
        self.inner.get_write_pending_time()
    }
}

impl GetProxyDigest for GuardedStream {
    fn get_proxy_digest(&self) -> Option<Arc<ProxyDigest>> {
        self.inner.get_proxy_digest()
    }
}

impl GetSocketDigest for GuardedStream {
    fn get_socket_digest(&self) -> Option<Arc<SocketDigest>> {
        self.inner.get_socket_digest()
    }
}

#[async_trait]
impl Peek for GuardedStream {
    /// Pingora peeks for the h2 preface before it reads. Its own peek waits for the preface's
    /// 24 bytes however slowly they come (and forever for a shorter request); this one reads
    /// only while what came could still be the preface, at most until the head deadline, and
    /// hands the bytes to the reads that follow.
    async fn try_peek(&mut self, buf: &mut [u8]) -> io::Result<bool> {
        use tokio::io::AsyncReadExt;
        let want = buf.len().min(H2_PREFACE.len());
        let deadline = *self
            .deadline
            .get_or_insert_with(|| Instant::now() + self.header_timeout);
        while self.peeked.len() < want && H2_PREFACE.starts_with(&self.peeked) {
            // Plain listeners have no read buffer under this stream (crate::server): read as
            // much as a usual request head, so that it comes in this one read call.
            self.peeked.reserve(PEEK_READ);
            let read = self.inner.read_buf(&mut self.peeked);
            match tokio::time::timeout_at(deadline, read).await {
                Ok(Ok(0)) if self.peeked.is_empty() => {
                    return Err(io::ErrorKind::UnexpectedEof.into())
                }
                Ok(Ok(0)) => break,
                Ok(Ok(_)) => {}
                Ok(Err(e)) => return Err(e),
                Err(_) => {
                    if !self.peeked.is_empty() {
                        use tokio::io::AsyncWriteExt;
                        let answer = crate::wire::response::request_timeout_bytes();
                        let write = self.inner.write_all(&answer);
                        let _ = tokio::time::timeout(Duration::from_millis(100), write).await;
                    }
                    metrics()
                        .connection_timeouts
                        .with_label_values(&["header"])
                        .inc();
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        HEAD_TIMEOUT_MESSAGE,
                    ));
                }
            }
        }
        self.received = !self.peeked.is_empty();
        let n = self.peeked.len().min(buf.len());
        buf[..n].copy_from_slice(&self.peeked[..n]);
        buf[n..].fill(0);
        if self.peeked.starts_with(H2_PREFACE) {
            self.head_received();
        }
        Ok(true)
    }
}

/// The guarded stream under a session, if it is an HTTP/1 session on a guarded connection.
fn guarded(session: &Session) -> Option<&GuardedStream> {
    session
        .as_downstream()
        .stream()?
        .as_any()
        .downcast_ref::<GuardedStream>()
}

/// Called once Pingora has parsed a request head: stops the head deadline, and notes how many
/// bytes the request takes (the keep-alive loop then knows whether Pingora read past it).
pub fn head_received(session: &Session) {
    if let Some(g) = guarded(session) {
        g.head_received();
        if let Some(length) = request_length(session) {
            g.request_length.store(length + 1, Ordering::Relaxed);
        }
    }
}

/// The bytes an HTTP/1 request takes on the wire: its head and a `Content-Length` body (plain
/// digits). `None` for anything else (a chunked body, a doubtful length).
fn request_length(session: &Session) -> Option<usize> {
    let h1 = session.as_downstream().as_http1()?;
    let headers = &session.req_header().headers;
    if headers.contains_key(http::header::TRANSFER_ENCODING) {
        return None;
    }
    let mut lengths = headers.get_all(http::header::CONTENT_LENGTH).iter();
    let body = match (lengths.next(), lengths.next()) {
        (None, _) => 0,
        (Some(v), None) => {
            let digits = v.as_bytes();
            if digits.is_empty() || digits.len() > 18 || !digits.iter().all(u8::is_ascii_digit) {
                return None;
            }
            digits.iter().fold(0, |n, d| n * 10 + usize::from(d - b'0'))
        }
        _ => return None,
    };
    Some(h1.get_headers_raw_bytes().len() + body)
}

/// Called when an exchange is over: the next read waits for a new request.
pub fn exchange_done(session: &Session) {
    if let Some(g) = guarded(session) {
        g.exchange_done();
    }
}

/// Raises the soft limit of open files to the hard limit (each connection is a descriptor) and
/// says what it is now.
pub fn raise_nofile_limit() -> io::Result<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct passed by pointer.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return Err(io::Error::last_os_error());
        }
        if lim.rlim_cur < lim.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: lim.rlim_max,
                rlim_max: lim.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) != 0 {
                return Err(io::Error::last_os_error());
            }
            lim = raised;
        }
    }
    Ok(lim.rlim_cur)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max: usize, per_ip: usize) -> Connections {
        Connections {
            header_timeout: Duration::from_secs(10),
            keepalive_timeout: Duration::from_secs(60),
            body_timeout: Duration::from_secs(60),
            max_connections: max,
            max_per_ip: per_ip,
        }
    }

    #[test]
    fn caps_apply_and_slots_come_back() {
        let table = Arc::new(ConnectionTable::default());
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let l = limits(3, 2);
        let s1 = table.admit(a, &l).unwrap();
        let _s2 = table.admit(a, &l).unwrap();
        assert_eq!(table.admit(a, &l).unwrap_err(), Refusal::MaxPerIp);
        let _s3 = table.admit(b, &l).unwrap();
        assert_eq!(table.admit(b, &l).unwrap_err(), Refusal::MaxConnections);
        assert_eq!(table.open(), 3);
        drop(s1);
        assert_eq!(table.open(), 2);
        assert!(table.admit(a, &l).is_ok());
    }
}
