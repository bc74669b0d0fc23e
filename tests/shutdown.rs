//! Graceful shutdown through the real binary: SIGTERM closes the listeners, lets the request in
//! flight finish and exits right after it (long before `grace_period`); a request that outlives
//! `grace_period` does not keep the process alive; SIGINT exits at once.
//!
//! The slow request goes to a test-controlled upstream that holds its answer until the test
//! releases it, so "the request is in flight" is a fact the test knows, not a timing guess.

mod common;

use std::io::{ErrorKind, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::*;

/// An HTTP/1.1 upstream that, for each request, reports its arrival and answers `200 held`
/// only when released. Its thread ends when the test drops the upstream.
struct HeldUpstream {
    addr: SocketAddr,
    arrived: mpsc::Receiver<()>,
    release: mpsc::Sender<()>,
}

impl HeldUpstream {
    fn start() -> HeldUpstream {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind upstream");
        let addr = listener.local_addr().unwrap();
        let (arrived_tx, arrived) = mpsc::channel();
        let (release, release_rx) = mpsc::channel::<()>();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { return };
                if read_head(&mut conn).is_none() {
                    continue;
                }
                if arrived_tx.send(()).is_err() || release_rx.recv().is_err() {
                    return;
                }
                let _ = conn.write_all(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 4\r\n\
                      connection: close\r\n\r\nheld",
                );
            }
        });
        HeldUpstream {
            addr,
            arrived,
            release,
        }
    }

    /// Sends `GET path` to the gateway at `gateway` from a thread, and returns once the request
    /// is held here. The thread yields the answer and the instant it came.
    fn hold(&self, gateway: SocketAddr, path: &'static str) -> JoinHandle<(Answer, Instant)> {
        let request = std::thread::spawn(move || {
            let out = http_get(gateway, path, Duration::from_secs(60));
            (out, Instant::now())
        });
        self.arrived
            .recv_timeout(Duration::from_secs(20))
            .expect("the request reaches the upstream");
        request
    }
}

/// What [`http_get`] answers.
type Answer = Result<(u16, String), String>;

/// The `[server]` table with `grace` as the grace period.
fn server(grace: &'static str) -> impl FnOnce(SocketAddr, SocketAddr) -> String {
    move |addr, admin| {
        format!(
            "[server]\nlisten = [\"{addr}\"]\nadmin_listen = \"{admin}\"\nthreads = 1\n\
             grace_period = \"{grace}\"\n"
        )
    }
}

/// Everything routed to `upstream`, no auth, no rules.
fn body(upstream: SocketAddr) -> String {
    format!(
        r#"
[[upstreams]]
name = "held"
targets = ["{upstream}"]
connect_timeout = "1s"
read_timeout = "60s"

[[routes]]
name = "all"
match = {{ path_prefix = "/" }}
upstream = "held"
auth = "none"
"#
    )
}

/// Polls until a TCP connect to `addr` is refused; panics after `limit`.
fn wait_refused(addr: SocketAddr, limit: Duration) {
    let start = Instant::now();
    loop {
        match TcpStream::connect_timeout(&addr, Duration::from_millis(200)) {
            Err(e) if e.kind() == ErrorKind::ConnectionRefused => return,
            _ => {}
        }
        assert!(
            start.elapsed() < limit,
            "{addr} still accepts connections {limit:?} after the signal"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn sigterm_finishes_the_request_in_flight_then_exits() {
    let up = HeldUpstream::start();
    let mut gw = Gateway::start_custom(server("20s"), &body(up.addr), &[]);

    let request = up.hold(gw.addr, "/orders/slow");

    gw.signal("TERM");
    // New connections are refused while the request is still held upstream,
    wait_refused(gw.addr, Duration::from_secs(10));
    wait_refused(gw.admin, Duration::from_secs(10));
    // the process stays up as long as the request is held (here: one more second),
    assert!(
        gw.wait_exit(Duration::from_secs(1)).is_none(),
        "floodgate exited with a request in flight\n{}",
        gw.logs()
    );
    assert!(!request.is_finished(), "the held request ended early");

    // and once released, the request in flight completes.
    up.release.send(()).unwrap();
    let (out, finished) = request.join().unwrap();
    assert_eq!(out, Ok((200, "held".to_string())), "{}", gw.logs());

    // Then the process exits on its own, long before the 20s grace period.
    let status = gw
        .wait_exit(Duration::from_secs(10))
        .unwrap_or_else(|| panic!("still running 10s after its last request\n{}", gw.logs()));
    let exited = Instant::now();
    assert!(status.success(), "exit status {status}\n{}", gw.logs());
    assert!(
        exited - finished < Duration::from_secs(5),
        "exited {:?} after its last request",
        exited - finished
    );
    assert!(gw.logs().contains("no request in flight"), "{}", gw.logs());
}

#[test]
fn grace_period_ends_a_request_that_outlives_it() {
    let up = HeldUpstream::start();
    let mut gw = Gateway::start_custom(server("1s"), &body(up.addr), &[]);

    let request = up.hold(gw.addr, "/orders/forever");

    let signalled = Instant::now();
    gw.signal("TERM");
    let status = gw
        .wait_exit(Duration::from_secs(15))
        .unwrap_or_else(|| panic!("still running 15s after SIGTERM\n{}", gw.logs()));
    let waited = signalled.elapsed();
    assert!(status.success(), "exit status {status}\n{}", gw.logs());
    // It waited for the request as long as the grace period allowed, and no longer.
    assert!(
        waited >= Duration::from_millis(900),
        "exited after {waited:?}"
    );
    assert!(gw.logs().contains("grace period over"), "{}", gw.logs());
    // The client sees its connection end without an answer.
    assert!(request.join().unwrap().0.is_err());
}

#[test]
fn sigint_exits_at_once() {
    let up = HeldUpstream::start();
    let mut gw = Gateway::start_custom(server("20s"), &body(up.addr), &[]);

    let request = up.hold(gw.addr, "/orders/forever");

    gw.signal("INT");
    assert!(
        gw.wait_exit(Duration::from_secs(5)).is_some(),
        "SIGINT did not stop floodgate within 5s (grace period 20s)\n{}",
        gw.logs()
    );
    assert!(request.join().unwrap().0.is_err());
}

/// Pingora's accept loop, asked to accept while its runtime shuts down, spun at
/// 100 % CPU writing "Accept() failed" and never exited (about one SIGINT in eight). Every stop
/// here is tried while clients keep connecting, so accepts race the shutdown; each must end.
#[test]
fn sigint_always_exits_while_clients_connect() {
    const TRIES: usize = 24;
    let up = HeldUpstream::start();
    let mut hung = Vec::new();
    for attempt in 0..TRIES {
        // Two threads: Pingora runs an accept loop on a random one of a service's runtimes,
        // not always the one its listener is registered with, which is what made stops hang.
        let mut gw = Gateway::start_custom(
            |addr, admin| server("20s")(addr, admin).replace("threads = 1", "threads = 2"),
            &body(up.addr),
            &[],
        );
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let addr = gw.addr;
        let clients: Vec<_> = (0..2)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    // Bounded: at most 20,000 connects or until told to stop.
                    for _ in 0..20_000 {
                        if stop.load(std::sync::atomic::Ordering::Relaxed) {
                            break;
                        }
                        if let Ok(mut c) =
                            TcpStream::connect_timeout(&addr, Duration::from_millis(200))
                        {
                            let _ = c.write_all(b"GET /orders/x HTTP/1.1\r\nhost: a\r\n\r\n");
                        }
                    }
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(150));
        gw.signal("INT");
        let exited = gw.wait_exit(Duration::from_secs(5));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for c in clients {
            let _ = c.join();
        }
        if exited.is_none() {
            hung.push(attempt);
        }
    }
    assert!(hung.is_empty(), "SIGINT hung in tries {hung:?} of {TRIES}");
}

/// A SIGINT during a graceful stop (an operator who does not want to wait) ends it at once:
/// Pingora reads one signal only, so without floodgate's own watch it waited the grace out.
#[test]
fn sigint_during_a_graceful_stop_exits_at_once() {
    let up = HeldUpstream::start();
    let mut gw = Gateway::start_custom(server("30s"), &body(up.addr), &[]);
    let request = up.hold(gw.addr, "/orders/forever");
    gw.signal("TERM");
    let started = Instant::now();
    while !gw.logs().contains("graceful shutdown: listeners closed") {
        assert!(started.elapsed() < Duration::from_secs(10), "{}", gw.logs());
        std::thread::sleep(Duration::from_millis(20));
    }
    gw.signal("INT");
    assert!(
        gw.wait_exit(Duration::from_secs(5)).is_some(),
        "SIGINT after SIGTERM did not stop floodgate within 5s (grace period 30s)\n{}",
        gw.logs()
    );
    assert!(request.join().unwrap().0.is_err());
}
