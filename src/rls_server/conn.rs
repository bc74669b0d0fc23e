//! The rate-limit service's connections, accepted by floodgate itself (not by tonic's
//! server, which bounds none of this) and served by hyper's HTTP/2 server with tonic's
//! service (`super::call`) behind it:
//! - each connection takes a slot of the listener's own [`ConnectionTable`]
//!   (`[rls] max_connections`, `max_connections_per_ip`, and the open-file budget that the
//!   proxy's connections share: `crate::connection::set_open_file_limit`), or is closed at
//!   accept (counted in `floodgate_connections_refused_total{reason="rls_..."}`);
//! - the TLS handshake (with `[rls] tls`) and the 24-byte HTTP/2 preface must arrive within
//!   `header_timeout` of accept;
//! - a connection with no call open and no PING from the client for `idle_timeout` is closed
//!   with GOAWAY (an Envoy that keeps its connection warm with PINGs keeps it; see
//!   `super::pings`);
//! - at most `max_streams` calls at once per connection, each with its message due within
//!   `request_timeout` (`super::call`).

use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use pingora::server::ShutdownWatch;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::watch;
use tokio::time::{Instant, Sleep};
use tokio_rustls::TlsAcceptor;

use super::activity::Activity;
use super::call::Calls;
use super::pings::PingCounter;
use crate::connection::table::{rls_budget, ConnectionTable};
use crate::gateway::Gateway;
use crate::metrics::metrics;
use crate::rls::limits::Serving;

/// Flow-control window of one call: a whole largest message (64 KiB and its prefix) need
/// not wait for a window update, and a stalled call holds no more.
const STREAM_WINDOW: u32 = 128 << 10;

/// Flow-control window of a connection: what a client may send unread over all its calls.
const CONNECTION_WINDOW: u32 = 1 << 20;

/// Largest header block of a call: gRPC's headers are a few hundred bytes.
const MAX_HEADER_LIST: u32 = 16 << 10;

/// How long a closing connection (GOAWAY sent) may take to finish its calls past
/// `request_timeout` before it is dropped.
const CLOSE_GRACE: Duration = Duration::from_secs(10);

/// What every accept loop of the listener shares: the caps hold over all of them.
pub struct Shared {
    /// The config in force (caps and deadlines are read at each accept).
    pub gateway: Arc<Gateway>,
    /// tonic's service for the calls.
    pub service: RateLimitServiceServer<super::Rls>,
    /// With `[rls] tls`: the handshake.
    pub tls: Option<TlsAcceptor>,
    /// The listener's open connections.
    pub table: Arc<ConnectionTable>,
    /// The caps and deadlines at start, used if a reload removes `[rls]`.
    pub serving: Serving,
}

impl Shared {
    /// The caps and deadlines in force.
    fn serving(&self) -> Serving {
        self.gateway
            .config
            .load()
            .rls
            .as_ref()
            .map_or_else(|| self.serving.clone(), |r| r.serving.clone())
    }
}

/// Accepts connections on `listener` until `shutdown` flips, then closes every connection it
/// accepted with GOAWAY and returns once they have finished their calls.
pub async fn serve(
    shared: Arc<Shared>,
    listener: tokio::net::TcpListener,
    mut shutdown: ShutdownWatch,
    spread: Spread,
) {
    let (stop, stopping) = watch::channel(false);
    loop {
        if spread.ahead() {
            // Another thread serves fewer connections: it is woken by the same socket, so
            // let it take the next one. Connections that arrive together (Envoy opening its
            // pool) would otherwise all go to the thread that woke first, which accepts until
            // the backlog is empty. After the pause this thread accepts anyway: no connection
            // waits on a thread that is busy or stuck.
            tokio::select! {
                _ = shutdown.changed() => break,
                () = tokio::time::sleep(SPREAD_PAUSE) => {}
            }
        }
        tokio::select! {
            _ = shutdown.changed() => break,
            accepted = listener.accept() => match accepted {
                Ok((tcp, peer)) => {
                    admit(&shared, tcp, peer.ip().to_canonical(), &stopping, &spread);
                }
                Err(e) => {
                    // Out of descriptors or memory for a moment: wait instead of spinning on
                    // the same error.
                    tracing::debug!(error = %e, "rate-limit service: accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
        }
    }
    drop(listener);
    let _ = stop.send(true);
    drop(stopping);
    stop.closed().await;
}

/// How long a thread ahead of another in connections waits before it accepts again.
const SPREAD_PAUSE: Duration = Duration::from_millis(2);

/// The open connections of each of the service's threads (one socket, accepted from by all),
/// and which thread this is: a thread that serves more than another lets that one accept the
/// next connection first.
#[derive(Clone)]
pub struct Spread {
    open: Arc<[AtomicUsize]>,
    me: usize,
}

impl Spread {
    /// One counter per thread, for `threads` threads; the handle of thread 0.
    pub fn new(threads: usize) -> Spread {
        Spread {
            open: (0..threads.max(1)).map(|_| AtomicUsize::new(0)).collect(),
            me: 0,
        }
    }

    /// The handle of thread `me`.
    pub fn thread(&self, me: usize) -> Spread {
        Spread {
            open: self.open.clone(),
            me: me.min(self.open.len() - 1),
        }
    }

    /// Whether this thread serves more connections than another.
    fn ahead(&self) -> bool {
        let mine = self.open[self.me].load(Ordering::Relaxed);
        self.open.iter().any(|o| o.load(Ordering::Relaxed) < mine)
    }

    /// Counts a connection on this thread until the returned guard drops.
    fn enter(&self) -> SpreadGuard {
        self.open[self.me].fetch_add(1, Ordering::Relaxed);
        SpreadGuard(self.clone())
    }
}

/// One connection counted in its thread's [`Spread`].
struct SpreadGuard(Spread);

impl Drop for SpreadGuard {
    fn drop(&mut self) {
        self.0.open[self.0.me].fetch_sub(1, Ordering::Relaxed);
    }
}

/// Takes a slot for the connection and serves it in a task of its own, or closes it.
fn admit(
    shared: &Arc<Shared>,
    tcp: tokio::net::TcpStream,
    ip: IpAddr,
    stopping: &watch::Receiver<bool>,
    spread: &Spread,
) {
    let accepted = Instant::now();
    // `[server] allow_ips` / `deny_ips` cover this port too (on the peer: gRPC callers are
    // proxies, not clients behind one): a refused peer is closed before it costs a slot.
    if !shared.gateway.config.load().server.ips.admits(ip) {
        metrics()
            .connections_refused
            .with_label_values(&["rls_ip_refused"])
            .inc();
        return;
    }
    let serving = shared.serving();
    let max = serving.max_connections.min(rls_budget());
    let slot = match shared.table.admit_within(ip, max, serving.max_per_ip) {
        Ok(slot) => slot,
        Err(why) => {
            metrics()
                .connections_refused
                .with_label_values(&[why.rls_label()])
                .inc();
            return;
        }
    };
    let _ = tcp.set_nodelay(true);
    // What tonic's `Request::remote_addr` reads: the tracing of a call believes its trace
    // context only from a trusted peer.
    let connect_info = tonic::transport::server::TcpConnectInfo {
        local_addr: tcp.local_addr().ok(),
        remote_addr: tcp.peer_addr().ok(),
    };
    let shared = shared.clone();
    let mut stopping = stopping.clone();
    let counted = spread.enter();
    tokio::spawn(async move {
        let _slot = slot;
        let _counted = counted;
        let deadline = accepted + serving.header_timeout;
        let activity = Arc::new(Activity::new());
        let Some(tls) = &shared.tls else {
            let io = Preface::new(tcp, deadline, activity.clone());
            serve_h2(&shared, io, activity, &serving, &mut stopping, connect_info).await;
            return;
        };
        let handshake = tokio::time::timeout_at(deadline, tls.accept(tcp));
        let stream = tokio::select! {
            done = handshake => done,
            _ = stopping.wait_for(|s| *s) => return,
        };
        match stream {
            Ok(Ok(stream)) => {
                serve_h2(
                    &shared,
                    Preface::new(stream, deadline, activity.clone()),
                    activity,
                    &serving,
                    &mut stopping,
                    connect_info,
                )
                .await;
            }
            // A scanner or a client of the wrong protocol: routine, not an error line each.
            Ok(Err(e)) => tracing::debug!(error = %e, "rate-limit service: TLS handshake failed"),
            Err(_) => {
                metrics()
                    .connection_timeouts
                    .with_label_values(&["rls_header"])
                    .inc();
            }
        }
    });
}

/// Serves one connection's HTTP/2 until the client closes it, it stays idle, or the service
/// stops.
async fn serve_h2<IO>(
    shared: &Shared,
    io: IO,
    activity: Arc<Activity>,
    serving: &Serving,
    stopping: &mut watch::Receiver<bool>,
    connect_info: tonic::transport::server::TcpConnectInfo,
) where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let calls = Calls {
        service: shared.service.clone(),
        request_timeout: serving.request_timeout,
        activity: activity.clone(),
        connect_info,
    };
    let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .max_concurrent_streams(serving.max_streams)
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .max_header_list_size(MAX_HEADER_LIST);
    let mut conn = pin!(builder.serve_connection(TokioIo::new(io), calls));
    let mut idle = pin!(activity.idle(serving.idle_timeout));
    let mut closing: Option<Pin<Box<Sleep>>> = None;
    loop {
        tokio::select! {
            done = conn.as_mut() => {
                if let Err(e) = done {
                    tracing::debug!(error = %e, "rate-limit service connection ended");
                }
                return;
            }
            () = &mut idle, if closing.is_none() => {
                metrics()
                    .connection_timeouts
                    .with_label_values(&["rls_idle"])
                    .inc();
                conn.as_mut().graceful_shutdown();
                closing = Some(Box::pin(tokio::time::sleep(serving.request_timeout + CLOSE_GRACE)));
            }
            _ = stopping.wait_for(|s| *s), if closing.is_none() => {
                conn.as_mut().graceful_shutdown();
                closing = Some(Box::pin(tokio::time::sleep(serving.request_timeout + CLOSE_GRACE)));
            }
            () = async { closing.as_mut().expect("armed").await }, if closing.is_some() => return,
        }
    }
}

/// A connection's IO whose reads fail once `deadline` passes before the HTTP/2 preface's 24
/// bytes have arrived (counted as `floodgate_connection_timeouts_total{kind="rls_header"}`);
/// after them, the plain IO. Every read is also scanned for the client's PINGs, which mark
/// the connection's `activity`.
struct Preface<IO> {
    inner: IO,
    timer: Option<Pin<Box<Sleep>>>,
    /// Also where the reader is in the preface.
    pings: PingCounter,
    activity: Arc<Activity>,
}

impl<IO> Preface<IO> {
    fn new(inner: IO, deadline: Instant, activity: Arc<Activity>) -> Self {
        Preface {
            inner,
            timer: Some(Box::pin(tokio::time::sleep_until(deadline))),
            pings: PingCounter::default(),
            activity,
        }
    }

    /// Scans bytes just received for PINGs.
    fn scan(&mut self, received: &[u8]) {
        if self.pings.feed(received) > 0 {
            self.activity.touch();
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Preface<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            this.scan(&buf.filled()[before..]);
        }
        let Some(timer) = this.timer.as_mut() else {
            return polled;
        };
        match polled {
            Poll::Ready(Ok(())) => {
                if this.pings.past_preface() {
                    // The timer is freed: a served connection holds none.
                    this.timer = None;
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending if timer.as_mut().poll(cx).is_ready() => {
                metrics()
                    .connection_timeouts
                    .with_label_values(&["rls_header"])
                    .inc();
                Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "HTTP/2 preface not received within rls.header_timeout",
                )))
            }
            other => other,
        }
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Preface<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::Spread;

    /// A thread serving more connections than another is ahead until its connections end; with
    /// one thread, or threads level, nobody is.
    #[test]
    fn a_thread_is_ahead_only_while_it_serves_more_than_another() {
        let alone = Spread::new(1);
        let _one = alone.enter();
        assert!(
            !alone.ahead(),
            "one thread has nobody to leave a connection to"
        );

        let spread = Spread::new(2);
        let (first, second) = (spread.thread(0), spread.thread(1));
        assert!(!first.ahead() && !second.ahead());
        let held = first.enter();
        assert!(first.ahead(), "one connection more than the other thread");
        assert!(!second.ahead());
        let other = second.enter();
        assert!(!first.ahead() && !second.ahead(), "level");
        drop(held);
        assert!(second.ahead(), "the first thread's connection ended");
        drop(other);
        assert!(!first.ahead() && !second.ahead());
    }
}
