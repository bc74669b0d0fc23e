//! Connection exhaustion: silent, slow and idle clients are cut off on time; past the caps new
//! connections are closed at once while clients under them (and the admin listener) are served;
//! pipelined requests are all answered.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

use crate::common::*;

fn config(api: SocketAddr) -> String {
    format!(
        "{}\n[[routes]]\nname = \"all\"\nmatch = {{ path_prefix = \"/\" }}\nupstream = \"orders\"\nauth = \"none\"\n",
        orders_upstream(&[api])
    )
}

/// A connection from `source` (any 127.0.0.0/8 address) to `to`.
async fn connect_from(source: &str, to: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(format!("{source}:0").parse().unwrap())?;
    socket.connect(to).await
}

/// Reads until the peer closes or `limit` passes: (bytes read, closed by the peer?).
async fn read_until_close(conn: &mut TcpStream, limit: Duration) -> (String, bool) {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(deadline, conn.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return (String::from_utf8_lossy(&out).into_owned(), true),
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
            Err(_) => return (String::from_utf8_lossy(&out).into_owned(), false),
        }
    }
}

const GET: &[u8] = b"GET /orders HTTP/1.1\r\nhost: floodgate.test\r\n\r\n";

/// Sends [`GET`] on a kept-alive connection and checks the answer is a 200 (one read: the
/// answer is small).
async fn get_200(conn: &mut TcpStream) {
    conn.write_all(GET).await.unwrap();
    let mut buf = vec![0u8; 8192];
    let n = tokio::time::timeout(Duration::from_secs(10), conn.read(&mut buf))
        .await
        .expect("response in time")
        .unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
}

#[tokio::test]
async fn silent_and_slow_clients_are_cut_off_by_header_timeout() {
    let api = OrdersApi::start("orders-1");
    let gw = Gateway::start_with(
        "header_timeout = \"1s\"\nkeepalive_timeout = \"30s\"\n",
        &config(api.addr),
        &[],
    );

    // Never sends a byte: closed after header_timeout, with nothing written.
    let mut silent = TcpStream::connect(gw.addr).await.unwrap();
    let started = Instant::now();
    let (got, closed) = read_until_close(&mut silent, Duration::from_secs(15)).await;
    assert!(closed, "a silent connection must be closed");
    assert!(
        got.is_empty(),
        "nothing is answered to a client that sent nothing: {got:?}"
    );
    assert!(started.elapsed() >= Duration::from_millis(900));

    // Sends its head a byte at a time, each read well inside any per-read timeout: the total
    // deadline still applies, and the partial head gets a 408.
    let slow = TcpStream::connect(gw.addr).await.unwrap();
    let (mut rx, mut tx) = slow.into_split();
    let answered = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop = answered.clone();
    // The writer stops once the gateway has answered: bytes sent after it closed would make the
    // kernel reset the connection and drop the answer before it is read.
    let writer = tokio::spawn(async move {
        for b in b"GET /orders HTTP/1.1\r\nhost: floodgate.test\r\nx-slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa" {
            if stop.load(std::sync::atomic::Ordering::SeqCst) || tx.write_all(&[*b]).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let mut closed = false;
    while let Ok(read) = tokio::time::timeout(Duration::from_secs(15), rx.read(&mut buf)).await {
        match read {
            Ok(0) | Err(_) => {
                closed = true;
                break;
            }
            Ok(n) => {
                answered.store(true, std::sync::atomic::Ordering::SeqCst);
                got.extend_from_slice(&buf[..n]);
            }
        }
    }
    writer.abort();
    let got = String::from_utf8_lossy(&got).into_owned();
    assert!(closed);
    assert!(
        got.starts_with("HTTP/1.1 408"),
        "a slow head gets 408: {got:?}"
    );
    assert!(got.contains("application/problem+json"), "{got}");
    assert!(
        got.contains("urn:floodgate:problem:request-timeout"),
        "{got}"
    );

    let metrics = get_text(&client(), gw.admin_url("/metrics")).await;
    assert!(
        metrics.contains("floodgate_connection_timeouts_total{kind=\"header\"} 2"),
        "{metrics}"
    );
}

#[tokio::test]
async fn idle_keepalive_connection_is_closed_and_a_busy_one_is_not() {
    let api = OrdersApi::start("orders-1");
    let gw = Gateway::start_with(
        "header_timeout = \"5s\"\nkeepalive_timeout = \"1s\"\n",
        &config(api.addr),
        &[],
    );
    // A client that keeps sending requests within the keepalive timeout stays connected
    // longer than the keepalive timeout in all.
    let mut busy = TcpStream::connect(gw.addr).await.unwrap();
    for i in 0..4 {
        if i > 0 {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        get_200(&mut busy).await;
    }
    // Then it goes idle: closed after about keepalive_timeout, without a 408.
    let started = Instant::now();
    let (got, closed) = read_until_close(&mut busy, Duration::from_secs(15)).await;
    assert!(closed, "an idle kept-alive connection must be closed");
    assert!(got.is_empty(), "{got:?}");
    assert!(started.elapsed() >= Duration::from_millis(800));
    let metrics = get_text(&client(), gw.admin_url("/metrics")).await;
    assert!(
        metrics.contains("floodgate_connection_timeouts_total{kind=\"keepalive\"} 1"),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_stalled_second_head_gets_408_after_header_timeout_not_keepalive_timeout() {
    let api = OrdersApi::start("orders-1");
    let gw = Gateway::start_with(
        "header_timeout = \"1s\"\nkeepalive_timeout = \"30s\"\n",
        &config(api.addr),
        &[],
    );
    let mut conn = TcpStream::connect(gw.addr).await.unwrap();
    get_200(&mut conn).await;
    // Idle past header_timeout (the connection now waits under the 30 s keepalive deadline,
    // and whatever timer the first request armed has fired and been re-armed to it), then half
    // a head and nothing more: the deadline is header_timeout from the first byte, earlier
    // than the armed timer.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    conn.write_all(b"GET /orders HTTP/1.1\r\nhost: flood")
        .await
        .unwrap();
    let started = Instant::now();
    let (got, closed) = read_until_close(&mut conn, Duration::from_secs(20)).await;
    let took = started.elapsed();
    assert!(closed, "a stalled head must be cut off");
    assert!(got.starts_with("HTTP/1.1 408"), "{got:?}");
    assert!(took >= Duration::from_millis(900), "{took:?}");
    assert!(
        took < Duration::from_secs(15),
        "held to keepalive_timeout: {took:?}"
    );
}

#[tokio::test]
async fn caps_close_new_connections_and_spare_everyone_else() {
    let api = OrdersApi::start("orders-1");
    let gw = Gateway::start_with(
        "header_timeout = \"60s\"\nmax_connections = 6\nmax_connections_per_ip = 3\n",
        &config(api.addr),
        &[],
    );
    // The start-up probe must not hold one of the six slots when they are counted.
    probe_connection_gone(&gw).await;
    // An attacker at 127.0.0.2 holds its 3 connections; the 4th is closed at once.
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(connect_from("127.0.0.2", gw.addr).await.unwrap());
    }
    // The slots are taken when Pingora hands the connections over: a served request on a
    // held connection proves the first three are in.
    for conn in &mut held {
        get_200(conn).await;
    }
    let mut over = connect_from("127.0.0.2", gw.addr).await.unwrap();
    let _ = over.write_all(GET).await;
    let (got, closed) = read_until_close(&mut over, Duration::from_secs(10)).await;
    assert!(
        closed && got.is_empty(),
        "over the per-IP cap: closed, got {got:?}"
    );

    // Another client is still served.
    let mut other = connect_from("127.0.0.3", gw.addr).await.unwrap();
    get_200(&mut other).await;
    held.push(other);

    // Two more from other IPs reach max_connections (6); the next one is closed.
    for ip in ["127.0.0.4", "127.0.0.5"] {
        let mut c = connect_from(ip, gw.addr).await.unwrap();
        get_200(&mut c).await;
        held.push(c);
    }
    let mut over = connect_from("127.0.0.6", gw.addr).await.unwrap();
    let _ = over.write_all(GET).await;
    let (got, closed) = read_until_close(&mut over, Duration::from_secs(10)).await;
    assert!(
        closed && got.is_empty(),
        "over max_connections: closed, got {got:?}"
    );

    // The admin listener answers while the client listener is full.
    let c = client();
    let health = c.get(gw.admin_url("/healthz")).send().await.unwrap();
    assert_eq!(health.status(), 200);
    let metrics = get_text(&c, gw.admin_url("/metrics")).await;
    assert!(
        metrics.contains("floodgate_connections_refused_total{reason=\"max_connections\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics
            .contains("floodgate_connections_refused_total{reason=\"max_connections_per_ip\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("floodgate_connections_open 6"),
        "{metrics}"
    );

    // Slots come back when connections close.
    drop(held);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut c = connect_from("127.0.0.2", gw.addr).await.unwrap();
        let _ = c.write_all(GET).await;
        let (got, _) = read_until_close(&mut c, Duration::from_millis(500)).await;
        if got.starts_with("HTTP/1.1 200") {
            break;
        }
        assert!(Instant::now() < deadline, "slots never came back: {got:?}");
    }
}

#[tokio::test]
async fn pipelined_requests_are_all_answered_in_order() {
    let api = OrdersApi::start("orders-1");
    let gw = Gateway::start(&config(api.addr));
    let mut conn = TcpStream::connect(gw.addr).await.unwrap();
    conn.write_all(
        b"GET /debug/one HTTP/1.1\r\nhost: floodgate.test\r\n\r\nGET /debug/two HTTP/1.1\r\nhost: floodgate.test\r\nconnection: close\r\n\r\n",
    )
    .await
    .unwrap();
    let (got, closed) = read_until_close(&mut conn, Duration::from_secs(10)).await;
    assert!(closed, "{got}");
    assert_eq!(got.matches("HTTP/1.1 200").count(), 2, "{got}");
    let one = got.find("/debug/one").expect("first answered");
    let two = got.find("/debug/two").expect("second answered");
    assert!(one < two, "answers in request order: {got}");
}

/// The keep-alive loop asks Pingora for carried-over bytes only when the connection's reads
/// returned more than the request: a request read alone, a body followed by a pipelined
/// request, and a pipelined head split across writes are all answered, in order.
#[tokio::test]
async fn kept_alive_requests_with_bodies_and_split_pipelined_heads_are_answered_in_order() {
    let api = OrdersApi::start("orders-1");
    let gw = Gateway::start(&config(api.addr));
    let mut conn = TcpStream::connect(gw.addr).await.unwrap();
    let pieces: [&[u8]; 3] = [
        b"GET /debug/one HTTP/1.1\r\nhost: floodgate.test\r\n\r\n",
        b"POST /debug/two HTTP/1.1\r\nhost: floodgate.test\r\ncontent-length: 5\r\n\r\nhello\
          GET /debug/three HTTP/1.1\r\nhost: floodgate.test\r\n\r\nGET /debug/fo",
        b"ur HTTP/1.1\r\nhost: floodgate.test\r\n\r\n\
          GET /debug/five HTTP/1.1\r\nhost: floodgate.test\r\nconnection: close\r\n\r\n",
    ];
    for piece in pieces {
        conn.write_all(piece).await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let (got, closed) = read_until_close(&mut conn, Duration::from_secs(10)).await;
    assert!(closed, "{got}");
    assert_eq!(got.matches("HTTP/1.1 ").count(), 5, "{got}");
    let one = got.find("/debug/one").expect("first answered");
    let three = got.find("/debug/three").expect("third answered");
    let four = got.find("/debug/four").expect("fourth answered");
    let five = got.find("/debug/five").expect("fifth answered");
    assert!(
        one < three && three < four && four < five,
        "answers in request order: {got}"
    );
}

/// floodgate reads a request's first bytes itself and hands them to the head parser: a head
/// that comes in pieces, and a head larger than that first read (1 KiB) with its last header
/// intact, are answered, on a connection's first exchange and on a kept-alive one.
#[tokio::test]
async fn heads_in_pieces_and_heads_past_the_first_read_are_answered_whole() {
    let api = OrdersApi::start("orders-1");
    let gw = Gateway::start(&config(api.addr));
    let filler = "f".repeat(3000);
    let big = |path: &str, close: &str| {
        format!("GET {path} HTTP/1.1\r\nhost: floodgate.test\r\nx-filler: {filler}\r\nx-last: the-last-header\r\n{close}\r\n")
    };
    let first = big("/debug/headers", "");
    let pieces: Vec<Vec<u8>> = vec![
        first.as_bytes()[..2].to_vec(),
        first.as_bytes()[2..1500].to_vec(),
        first.as_bytes()[1500..].to_vec(),
        b"GE".to_vec(),
        b"T /debug/two HTTP/1.1\r\nhost: floo".to_vec(),
        b"dgate.test\r\n\r\n".to_vec(),
        big("/debug/headers", "connection: close\r\n").into_bytes(),
    ];
    let mut conn = TcpStream::connect(gw.addr).await.unwrap();
    for piece in pieces {
        conn.write_all(&piece).await.unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (got, closed) = read_until_close(&mut conn, Duration::from_secs(10)).await;
    assert!(closed, "{got}");
    assert_eq!(got.matches("HTTP/1.1 200").count(), 3, "{got}");
    assert_eq!(
        got.matches(&filler).count(),
        2,
        "both large heads arrived whole: {got}"
    );
    assert_eq!(got.matches("the-last-header").count(), 2, "{got}");
    assert!(got.contains("/debug/two"), "{got}");
}

#[tokio::test]
async fn idle_h2_connection_is_closed_after_keepalive_timeout() {
    let api = OrdersApi::start("orders-1");
    let gw = Gateway::start_with("keepalive_timeout = \"1s\"\n", &config(api.addr), &[]);
    let mut conn = TcpStream::connect(gw.addr).await.unwrap();
    // The h2 preface and an empty SETTINGS frame: an h2c client that then says nothing.
    conn.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        .await
        .unwrap();
    let started = Instant::now();
    let (got, closed) = read_until_close(&mut conn, Duration::from_secs(15)).await;
    assert!(closed, "an idle h2 connection must be closed");
    assert!(!got.is_empty(), "the server spoke h2 first (SETTINGS)");
    assert!(started.elapsed() >= Duration::from_millis(800));
}
