//! A fault-injecting TCP relay between floodgate and a real `redis-server`: it passes bytes both
//! ways until told to misbehave as a network or a Redis in trouble does.
//!
//! - [`FaultProxy::black_hole`]: bytes are read and dropped in both directions while every
//!   connection stays open (no FIN, no RST), and new connections are accepted into the same
//!   hole: what a dropped route, a firewall change or a failed-over address looks like.
//! - [`FaultProxy::delay`]: every chunk is held for a while before it is passed on.
//! - [`FaultProxy::cut`]: every live connection is closed at once; new ones pass.
//! - [`FaultProxy::swallow_reply`]: the next bulk-string reply Redis sends is dropped whole
//!   while the replies around it pass: a reply lost in the middle of a pipeline.
//! - [`FaultProxy::pass`]: heals every fault above.
//!
//! It runs on a thread of its own (a runtime of its own, so it serves whatever the test's
//! runtime is doing) on a free loopback port, and stops with every connection it holds when
//! dropped, also when the test panics. Each connection's queued bytes are bounded by the
//! channel between its reader and writer (64 chunks of at most 16 KiB).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::free_port;

/// How the relay treats bytes right now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Pass,
    BlackHole,
    Delay(Duration),
}

/// What the relay's tasks share with the test.
struct Control {
    mode: Mutex<Mode>,
    /// Bumped by [`FaultProxy::cut`]: each connection ends when it changes.
    cuts: watch::Sender<u64>,
    /// Bulk-string replies still to drop.
    swallow: AtomicUsize,
    swallowed: AtomicUsize,
    accepted: AtomicUsize,
}

/// The relay: listens on [`FaultProxy::addr`], connects each client to the upstream.
pub struct FaultProxy {
    addr: SocketAddr,
    control: Arc<Control>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FaultProxy {
    /// A relay on a free loopback port to `upstream`, passing bytes.
    pub fn start(upstream: SocketAddr) -> FaultProxy {
        FaultProxy::start_at(SocketAddr::from(([127, 0, 0, 1], free_port())), upstream)
    }

    /// A relay listening on `listen` to `upstream`.
    pub fn start_at(listen: SocketAddr, upstream: SocketAddr) -> FaultProxy {
        let (cuts, _) = watch::channel(0);
        let control = Arc::new(Control {
            mode: Mutex::new(Mode::Pass),
            cuts,
            swallow: AtomicUsize::new(0),
            swallowed: AtomicUsize::new(0),
            accepted: AtomicUsize::new(0),
        });
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let shared = control.clone();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("relay runtime");
            runtime.block_on(async move {
                let listener = TcpListener::bind(listen).await.expect("relay listens");
                ready_tx.send(()).expect("test waits");
                let serve = async {
                    loop {
                        let Ok((client, _)) = listener.accept().await else {
                            continue;
                        };
                        shared.accepted.fetch_add(1, Ordering::Relaxed);
                        tokio::spawn(relay(client, upstream, shared.clone()));
                    }
                };
                tokio::select! {
                    _ = serve => {}
                    _ = stopped => {}
                }
            });
            // Dropping the runtime ends every connection task and closes its sockets.
        });
        ready_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the relay starts");
        FaultProxy {
            addr: listen,
            control,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `redis://` URL of the relay.
    pub fn url(&self) -> String {
        format!("redis://{}/", self.addr)
    }

    /// Passes bytes again (ends a black hole or a delay).
    pub fn pass(&self) {
        *self.control.mode.lock() = Mode::Pass;
    }

    /// Drops every byte both ways, keeping every connection open.
    pub fn black_hole(&self) {
        *self.control.mode.lock() = Mode::BlackHole;
    }

    /// Holds every chunk for `by` before passing it on.
    pub fn delay(&self, by: Duration) {
        *self.control.mode.lock() = Mode::Delay(by);
    }

    /// Closes every live connection now; later ones pass.
    pub fn cut(&self) {
        self.control.cuts.send_modify(|n| *n += 1);
    }

    /// Drops the next bulk-string reply from the upstream, whole.
    pub fn swallow_reply(&self) {
        self.control.swallow.fetch_add(1, Ordering::AcqRel);
    }

    /// Replies dropped by [`FaultProxy::swallow_reply`] so far.
    pub fn swallowed(&self) -> usize {
        self.control.swallowed.load(Ordering::Acquire)
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.control.accepted.load(Ordering::Relaxed)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// One client connection: a reader and a writer task per direction, until either side closes
/// or the relay cuts.
async fn relay(client: TcpStream, upstream: SocketAddr, control: Arc<Control>) {
    let mut cuts = control.cuts.subscribe();
    cuts.mark_unchanged();
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let (to_server, server_queue) = mpsc::channel(64);
    let (to_client, client_queue) = mpsc::channel(64);
    let pumps = async {
        tokio::join!(
            read_side(client_read, to_server, control.clone(), false),
            write_side(server_queue, server_write),
            read_side(server_read, to_client, control.clone(), true),
            write_side(client_queue, client_write),
        )
    };
    tokio::select! {
        _ = pumps => {}
        _ = cuts.changed() => {}
    }
}

/// Reads chunks and queues each with the instant it may be written, or drops it (black hole,
/// swallowed reply). From the server, `replies` cuts the bytes at reply boundaries so that a
/// swallowed reply goes whole; bytes that are not RESP (TLS) are passed as they come.
async fn read_side(
    mut from: tokio::net::tcp::OwnedReadHalf,
    to: mpsc::Sender<(Instant, Vec<u8>)>,
    control: Arc<Control>,
    mut replies: bool,
) {
    let mut buf = vec![0u8; 16 * 1024];
    let mut pending: Vec<u8> = Vec::new();
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let mode = *control.mode.lock();
        let at = match mode {
            Mode::BlackHole => {
                pending.clear();
                continue;
            }
            Mode::Pass => Instant::now(),
            Mode::Delay(by) => Instant::now() + by,
        };
        let chunk = if replies {
            pending.extend_from_slice(&buf[..n]);
            let mut out = Vec::with_capacity(pending.len());
            let mut at_byte = 0;
            loop {
                let rest = &pending[at_byte..];
                let resp = rest.first().is_none_or(|b| b"+-:$*".contains(b));
                let parsed = floodgate::limiter::redis::resp::parse(rest, 0);
                let used = match parsed {
                    Ok(Some((_, used))) if resp => used,
                    Ok(None) if resp => break,
                    _ => {
                        // Not RESP: from now on this connection's bytes pass as they come.
                        replies = false;
                        out.extend_from_slice(&pending[at_byte..]);
                        at_byte = pending.len();
                        break;
                    }
                };
                let reply = &pending[at_byte..at_byte + used];
                let swallow = reply.first() == Some(&b'$')
                    && control
                        .swallow
                        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
                        .is_ok();
                if swallow {
                    control.swallowed.fetch_add(1, Ordering::AcqRel);
                } else {
                    out.extend_from_slice(reply);
                }
                at_byte += used;
            }
            pending.drain(..at_byte);
            out
        } else {
            buf[..n].to_vec()
        };
        if !chunk.is_empty() && to.send((at, chunk)).await.is_err() {
            return;
        }
    }
}

/// Writes queued chunks, each no earlier than its instant.
async fn write_side(
    mut queue: mpsc::Receiver<(Instant, Vec<u8>)>,
    mut to: tokio::net::tcp::OwnedWriteHalf,
) {
    while let Some((at, chunk)) = queue.recv().await {
        tokio::time::sleep_until(at).await;
        if to.write_all(&chunk).await.is_err() {
            return;
        }
    }
}
