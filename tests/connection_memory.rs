//! What an idle kept-alive client connection costs the gateway in memory: the real
//! binary, real sockets, its resident set read from /proc before and after many connections
//! that each served one request and stay open.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::{admin_get, metric_value, orders_upstream, Gateway, OrdersApi};

/// Connections held open by the test: enough that a per-connection cost of a few KiB stands
/// far above what the rest of the process moves by.
const CONNECTIONS: usize = 1000;

/// The target is 8 KiB per idle connection in a release build (docs/benchmarks.md: 2.6 KiB
/// measured there, 14.6 KiB while Pingora's accept task, a 1 KiB read buffer and Pingora's
/// 1.5 KiB write buffer stayed with every connection, 49 KiB with Pingora's 64 KiB read buffer
/// too); a debug build's futures are larger.
const MAX_KIB_PER_CONNECTION: f64 = 8.0;

/// A connection whose request waits on the upstream: Pingora's per-request state (its proxy
/// future, the 4 KiB buffer of the upstream's response head, both HTTP sessions, the upstream
/// connection) is most of it: 32 KiB in a release build (33 in a debug one), 36 while the
/// request head was parsed in a 4 KiB buffer of its own, 48 before the accept task and the
/// write buffer went.
const MAX_KIB_MID_REQUEST: f64 = 40.0;

/// The process's resident set in KiB (VmRSS).
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("VmRSS")
}

/// Opens a connection, sends one GET, reads the whole answer (by its Content-Length) and
/// hands the connection back still open.
fn one_request(gw: &Gateway) -> TcpStream {
    let mut conn = TcpStream::connect(gw.addr).expect("connect");
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    conn.write_all(b"GET /orders HTTP/1.1\r\nhost: floodgate.test\r\n\r\n")
        .expect("write");
    let mut got = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = conn.read(&mut chunk).expect("read the answer");
        assert!(n > 0, "closed before the answer was whole: {got:?}");
        got.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&got);
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            assert!(head.starts_with("HTTP/1.1 200 "), "answer: {head}");
            let length: usize = head
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse().ok())?
                })
                .expect("a Content-Length");
            if body.len() >= length {
                return conn;
            }
        }
    }
}

/// A gateway in front of `api` that lets this test's connections (all from 127.0.0.1) in and
/// waits on the upstream for minutes: a held request must still be in flight when the last
/// of the thousand is sent, however slowly a loaded machine sends them (with the usual 2 s
/// read timeout the first ones timed out before the last arrived).
fn gateway(api: &OrdersApi) -> Gateway {
    Gateway::start_with(
        &format!(
            "access_log = false\nkeepalive_timeout = \"5m\"\nmax_connections_per_ip = {}\n",
            CONNECTIONS + 100
        ),
        &format!(
            "{}\n[[routes]]\nname = \"all\"\nmatch = {{}}\nupstream = \"orders\"\nauth = \"none\"\n",
            orders_upstream(&[api.addr]).replace("read_timeout = \"2s\"", "read_timeout = \"5m\"")
        ),
        &[],
    )
}

#[test]
fn an_idle_keepalive_connection_costs_a_few_kib() {
    let api = OrdersApi::start("a");
    let gw = gateway(&api);
    // The first connections warm what is not any one connection's: the upstream pool, lazy
    // statics, the allocator's first pages.
    let warm: Vec<TcpStream> = (0..50).map(|_| one_request(&gw)).collect();
    drop(warm);
    let before = rss_kib(gw.pid());
    let held: Vec<TcpStream> = (0..CONNECTIONS).map(|_| one_request(&gw)).collect();
    let after = rss_kib(gw.pid());
    let (status, metrics) = admin_get(gw.admin, "/metrics").expect("metrics");
    assert_eq!(status, 200);
    let open = metric_value(&metrics, "floodgate_connections_open").expect("connections gauge");
    assert!(
        open >= CONNECTIONS as f64,
        "{open} connections open, {CONNECTIONS} held"
    );
    at_most_per_each(
        before,
        after,
        CONNECTIONS,
        MAX_KIB_PER_CONNECTION,
        "idle connection",
    );
    drop(held);
}

/// Asserts that a resident set that grew from `before` to `after` KiB (VmRSS) for the `n`
/// things (`what`) the gateway now holds grew by at most `max` KiB for each.
fn at_most_per_each(before: u64, after: u64, n: usize, max: f64, what: &str) {
    let per = after.saturating_sub(before) as f64 / n as f64;
    eprintln!("{per:.1} KiB per {what} ({before} KiB before, {after} KiB after)");
    assert!(
        per <= max,
        "{per:.1} KiB per {what} ({before} KiB before, {after} KiB with {n})"
    );
}

/// Requests the upstream answers only after the test is over.
const HELD: &str = "GET /orders?delay_ms=60000 HTTP/1.1\r\nhost: floodgate.test\r\n\r\n";

#[test]
fn a_connection_mid_request_costs_less_than_pingoras_own_state() {
    let api = OrdersApi::start("a");
    let gw = gateway(&api);
    let warm: Vec<TcpStream> = (0..50).map(|_| one_request(&gw)).collect();
    drop(warm);
    let before = rss_kib(gw.pid());
    let held: Vec<TcpStream> = (0..CONNECTIONS)
        .map(|_| {
            let mut conn = TcpStream::connect(gw.addr).expect("connect");
            conn.write_all(HELD.as_bytes()).expect("write");
            conn
        })
        .collect();
    // Every request has been sent upstream once the upstream counts them all in flight (an
    // upper bound, so a request still connecting only makes the reading lower).
    let in_flight = || {
        let (_, body) = admin_get(gw.admin, "/upstreams").expect("upstreams");
        let v: serde_json::Value = serde_json::from_str(&body).expect("json");
        v.pointer("/upstreams/0/targets/0/addrs/0/in_flight")
            .and_then(|n| n.as_u64())
            .unwrap_or(0)
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mut most = 0;
    loop {
        most = most.max(in_flight());
        if most >= CONNECTIONS as u64 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "at most {most} of {CONNECTIONS} requests were in flight upstream at once"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let after = rss_kib(gw.pid());
    at_most_per_each(
        before,
        after,
        CONNECTIONS,
        MAX_KIB_MID_REQUEST,
        "connection mid-request",
    );
    drop(held);
}

/// Slowed downloads held at once by [`a_slowed_download_holds_a_few_small_pieces`].
const SLOWED: usize = 200;

/// What one slowed download may hold: the pieces Pingora keeps queued for the client while
/// the pace holds them. With 64 KiB reads of the upstream that was 954 KiB per download in a
/// release build (`benches/slowdown/run.py`, 4 MiB at 64 KiB/s) and 850 KiB here; with the
/// upstream's receive window sized by the rate, 124 KiB there and 137 KiB here.
const MAX_KIB_PER_SLOWED_DOWNLOAD: f64 = 320.0;

#[test]
fn a_slowed_download_holds_a_few_small_pieces() {
    let api = OrdersApi::start("a");
    let gw = Gateway::start_with(
        &format!(
            "access_log = false\nmax_connections_per_ip = {}\n",
            SLOWED + 100
        ),
        &format!(
            "{}\n[[routes]]\nname = \"all\"\nmatch = {{}}\nupstream = \"orders\"\nauth = \"none\"\n\n[[rules]]\nname = \"slowed\"\nkey = [\"header:x-client\"]\nalgorithm = \"fixed_window\"\nlimit = 1\nwindow = \"1h\"\nmode = \"slow\"\nslow_rate = \"64KiB\"\n",
            orders_upstream(&[api.addr])
                .replace("read_timeout = \"2s\"", "read_timeout = \"60s\"\ntimeout = \"10m\"")
        ),
        &[],
    );
    // What is not any one download's: the upstream pool, lazy statics, the allocator's first
    // pages.
    let warm: Vec<TcpStream> = (0..20).map(|_| one_request(&gw)).collect();
    drop(warm);
    let before = rss_kib(gw.pid());
    let request =
        "GET /download?bytes=4194304 HTTP/1.1\r\nhost: floodgate.test\r\nx-client: one\r\n\r\n";
    // Clients that read nothing: every download runs at the pace until the sockets' buffers
    // fill, and what floodgate queues for them is what is measured.
    let held: Vec<TcpStream> = (0..SLOWED)
        .map(|_| {
            let mut conn = TcpStream::connect(gw.addr).expect("connect");
            conn.write_all(request.as_bytes()).expect("write");
            conn
        })
        .collect();
    std::thread::sleep(Duration::from_secs(3));
    let (_, metrics) = admin_get(gw.admin, "/metrics").expect("metrics");
    let slowed = metric_value(
        &metrics,
        "floodgate_ratelimit_decisions_total{result=\"slowed\",rule=\"slowed\"}",
    )
    .unwrap_or(0.0);
    // The rule admits the first at full speed and slows every other.
    assert!(
        slowed >= (SLOWED - 1) as f64,
        "{slowed} requests slowed of {SLOWED}"
    );
    let after = rss_kib(gw.pid());
    at_most_per_each(
        before,
        after,
        SLOWED,
        MAX_KIB_PER_SLOWED_DOWNLOAD,
        "slowed download",
    );
    drop(held);
}
