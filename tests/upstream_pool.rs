//! The idle upstream connections an instance keeps are bounded across its serving threads:
//! upstream connections are pooled per thread (a thread reuses the ones it made), in one pool
//! of at most 128 × `threads` idle connections, all upstreams together; past that the least
//! recently used is closed.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Connections open to an upstream: now, and at most at once.
#[derive(Default)]
struct Open {
    now: AtomicUsize,
    peak: AtomicUsize,
}

/// An HTTP/1.1 upstream that answers every request after `delay`, keeps connections alive, and
/// counts the connections open to it.
async fn slow_upstream(delay: Duration) -> (std::net::SocketAddr, Arc<Open>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let open = Arc::new(Open::default());
    let count = open.clone();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let count = count.clone();
            let now = count.now.fetch_add(1, Ordering::SeqCst) + 1;
            count.peak.fetch_max(now, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                'connection: loop {
                    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                        match socket.read(&mut chunk).await {
                            Ok(0) | Err(_) => break 'connection,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    let end = buf.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
                    buf.drain(..end);
                    tokio::time::sleep(delay).await;
                    let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                    if socket.write_all(answer).await.is_err() {
                        break;
                    }
                }
                count.now.fetch_sub(1, Ordering::SeqCst);
            });
        }
    });
    (addr, open)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_upstream_connections_are_bounded_across_threads() {
    const THREADS: usize = 2;
    const BOUND: usize = 128 * THREADS;
    const REQUESTS: usize = BOUND + 64;
    let (upstream, open) = slow_upstream(Duration::from_millis(500)).await;
    let gw = Gateway::start_custom(
        |addr, admin| {
            // All from one address: room beyond the default 256 per client IP.
            server_section(addr, admin).replace(
                "threads = 1\n",
                &format!("threads = {THREADS}\nmax_connections_per_ip = 1000\n"),
            )
        },
        // Generous upstream timeouts: the burst's connections are made at once, on a machine
        // that may be running other tests; what is measured is the pool, not their speed.
        &format!(
            "[[upstreams]]\nname = \"orders\"\ntargets = [\"{upstream}\"]\nconnect_timeout = \"10s\"\nread_timeout = \"20s\"\n\n[[routes]]\nname = \"all\"\nmatch = {{}}\nupstream = \"orders\"\nauth = \"none\"\n"
        ),
        &[],
    );
    // As many requests at once as the pool holds and more: each needs a connection of its own.
    let c = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let sends = (0..REQUESTS).map(|_| {
        let c = c.clone();
        let url = gw.url("/");
        async move { c.get(url).send().await.map(|r| r.status().as_u16()) }
    });
    let answers = futures::future::join_all(sends).await;
    let ok = answers.iter().filter(|a| matches!(a, Ok(200))).count();
    assert!(
        ok > BOUND,
        "{ok} of {REQUESTS} requests answered: {answers:?}"
    );
    // Every exchange is over: what stays open upstream is the pool, within its bound.
    let mut kept = usize::MAX;
    for _ in 0..50 {
        kept = open.now.load(Ordering::SeqCst);
        if kept <= BOUND {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        kept <= BOUND,
        "{kept} idle upstream connections kept open, bound {BOUND}"
    );
    assert!(kept > 0, "idle connections are kept for reuse");
    let peak = open.peak.load(Ordering::SeqCst);
    assert!(
        peak > BOUND,
        "the burst opened {peak} upstream connections, no more than the bound"
    );
    eprintln!("{peak} upstream connections at once, {kept} kept idle (bound {BOUND})");
}
