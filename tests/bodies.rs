//! Request bodies: a body that arrives slowly, or never ends, must not
//! hold an upstream connection; every body has a deadline (`body_timeout`, answered 408); and
//! what is buffered ahead of the upstream arrives there whole, whatever its size or framing.
//!
//! The upstream is the test's own: it counts the connections it accepts and answers each
//! request with the length and SHA-256 of the body it received.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use sha2::{Digest, Sha256};

/// An HTTP/1.1 upstream that reads each request's body (length-framed or chunked) and answers
/// `<length> <sha256 hex>`. It counts connections accepted and open.
struct CountingUpstream {
    addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
    open: Arc<AtomicUsize>,
}

impl CountingUpstream {
    fn start() -> CountingUpstream {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let open = Arc::new(AtomicUsize::new(0));
        let (a, o) = (accepted.clone(), open.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { return };
                a.fetch_add(1, Ordering::SeqCst);
                o.fetch_add(1, Ordering::SeqCst);
                let o = o.clone();
                std::thread::spawn(move || {
                    let _ = serve(conn);
                    o.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
        CountingUpstream {
            addr,
            accepted,
            open,
        }
    }
}

/// Serves requests on one connection until it closes.
fn serve(mut conn: TcpStream) -> std::io::Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(60)))?;
    let mut buf = Vec::new();
    loop {
        let head_end = loop {
            if let Some(i) = find(&buf, b"\r\n\r\n") {
                break i + 4;
            }
            if read_more(&mut conn, &mut buf)? == 0 {
                return Ok(());
            }
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
        buf.drain(..head_end);
        let body = if head.contains("transfer-encoding: chunked") {
            read_chunked(&mut conn, &mut buf)?
        } else {
            let len = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map_or(0, |v| v.trim().parse().unwrap());
            while buf.len() < len {
                if read_more(&mut conn, &mut buf)? == 0 {
                    return Ok(());
                }
            }
            buf.drain(..len).collect()
        };
        let answer = format!("{} {}", body.len(), hex::encode(Sha256::digest(&body)));
        conn.write_all(
            format!(
                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{answer}",
                answer.len()
            )
            .as_bytes(),
        )?;
    }
}

fn read_more(conn: &mut TcpStream, buf: &mut Vec<u8>) -> std::io::Result<usize> {
    let mut chunk = [0u8; 65536];
    let n = conn.read(&mut chunk)?;
    buf.extend_from_slice(&chunk[..n]);
    Ok(n)
}

fn read_chunked(conn: &mut TcpStream, buf: &mut Vec<u8>) -> std::io::Result<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let line_end = loop {
            if let Some(i) = find(buf, b"\r\n") {
                break i;
            }
            if read_more(conn, buf)? == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
        };
        let size = usize::from_str_radix(
            String::from_utf8_lossy(&buf[..line_end])
                .split(';')
                .next()
                .unwrap()
                .trim(),
            16,
        )
        .unwrap();
        buf.drain(..line_end + 2);
        while buf.len() < size + 2 {
            if read_more(conn, buf)? == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
        }
        body.extend_from_slice(&buf[..size]);
        buf.drain(..size + 2);
        if size == 0 {
            return Ok(body);
        }
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// A gateway in front of `up` with `body_timeout = "1s"`.
fn gateway(up: &CountingUpstream) -> Gateway {
    Gateway::start_with(
        "body_timeout = \"1s\"\n",
        &format!(
            "[[upstreams]]\nname = \"up\"\ntargets = [\"{}\"]\nread_timeout = \"30s\"\n\n\
             [[routes]]\nname = \"all\"\nupstream = \"up\"\nauth = \"none\"\n",
            up.addr
        ),
        &[],
    )
}

/// Reads an answer's status and body (up to the connection's close or the body's length).
fn read_answer(conn: &mut TcpStream) -> Option<(u16, String, String)> {
    let mut buf = Vec::new();
    let head_end = loop {
        if let Some(i) = find(&buf, b"\r\n\r\n") {
            break i + 4;
        }
        if read_more(conn, &mut buf).ok()? == 0 {
            return None;
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let status = head.split(' ').nth(1)?.parse().ok()?;
    let len: usize = head
        .to_ascii_lowercase()
        .lines()
        .find_map(|l| {
            l.strip_prefix("content-length:")
                .map(|v| v.trim().parse().unwrap())
        })
        .unwrap_or(0);
    while buf.len() < head_end + len {
        if read_more(conn, &mut buf).ok()? == 0 {
            break;
        }
    }
    Some((
        status,
        head,
        String::from_utf8_lossy(&buf[head_end..]).to_string(),
    ))
}

/// Connects to `gw` from `source` (any 127.0.0.0/8 address), as a blocking std stream.
fn connect_from(
    rt: &tokio::runtime::Runtime,
    source: std::net::Ipv4Addr,
    gw: SocketAddr,
) -> TcpStream {
    let s = rt
        .block_on(async {
            let sock = tokio::net::TcpSocket::new_v4()?;
            sock.bind(SocketAddr::from((source, 0)))?;
            sock.connect(gw).await
        })
        .unwrap();
    let s = s.into_std().unwrap();
    s.set_nonblocking(false).unwrap();
    s
}

#[test]
fn slow_and_endless_bodies_never_reach_the_upstream() {
    let up = CountingUpstream::start();
    let gw = gateway(&up);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut conns = Vec::new();
    // 40 slow length-framed bodies and 40 endless chunked ones, half from one IP and half
    // from 20 others.
    for i in 0..80u8 {
        let source = if i < 40 {
            std::net::Ipv4Addr::new(127, 0, 0, 1)
        } else {
            std::net::Ipv4Addr::new(127, 0, 1, i - 39)
        };
        let mut c = connect_from(&rt, source, gw.addr);
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        if i % 2 == 0 {
            c.write_all(b"POST /up HTTP/1.1\r\nhost: a\r\ncontent-length: 1000\r\n\r\nx")
                .unwrap();
        } else {
            c.write_all(
                b"POST /up HTTP/1.1\r\nhost: a\r\ntransfer-encoding: chunked\r\n\r\n1\r\nx\r\n",
            )
            .unwrap();
        }
        conns.push(c);
    }
    let started = Instant::now();
    // Keep every body trickling (a byte per connection every 200 ms) past body_timeout.
    while started.elapsed() < Duration::from_millis(1600) {
        for (i, c) in conns.iter_mut().enumerate() {
            let piece: &[u8] = if i % 2 == 0 { b"x" } else { b"1\r\nx\r\n" };
            let _ = c.write_all(piece);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    for c in &mut conns {
        let (status, head, body) = read_answer(c).expect("an answer");
        assert_eq!(status, 408, "{head}{body}");
        assert!(head.contains("application/problem+json"), "{head}");
        assert!(body.contains("body_timeout"), "{body}");
    }
    assert_eq!(
        up.accepted.load(Ordering::SeqCst),
        0,
        "a slow body reached the upstream"
    );
    let m = admin_get(gw.admin, "/metrics").unwrap().1;
    assert_eq!(
        metric_value(&m, "floodgate_connection_timeouts_total{kind=\"body\"}"),
        Some(80.0)
    );
}

/// Sends `POST /up` with `body`, framed by length or chunked (in `chunk`-byte chunks), written
/// in pieces of `piece` bytes, and returns the answer.
fn post(gw: SocketAddr, body: &[u8], chunked: Option<usize>, piece: usize) -> (u16, String) {
    let mut c = TcpStream::connect(gw).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut wire = Vec::new();
    match chunked {
        None => {
            wire.extend_from_slice(
                format!(
                    "POST /up HTTP/1.1\r\nhost: a\r\ncontent-length: {}\r\n\r\n",
                    body.len()
                )
                .as_bytes(),
            );
            wire.extend_from_slice(body);
        }
        Some(size) => {
            wire.extend_from_slice(
                b"POST /up HTTP/1.1\r\nhost: a\r\ntransfer-encoding: chunked\r\n\r\n",
            );
            for chunk in body.chunks(size) {
                wire.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
                wire.extend_from_slice(chunk);
                wire.extend_from_slice(b"\r\n");
            }
            wire.extend_from_slice(b"0\r\n\r\n");
        }
    }
    for p in wire.chunks(piece) {
        c.write_all(p).unwrap();
    }
    let (status, head, answer) = read_answer(&mut c).expect("an answer");
    (status, format!("{head}{answer}"))
}

/// What is read ahead of the upstream, held past Pingora's 64 KiB retry buffer, and streamed
/// reaches the upstream byte for byte, for every size around the buffer's edges and every
/// framing, written at once or in pieces.
#[test]
fn bodies_arrive_whole_at_every_size_and_framing() {
    let up = CountingUpstream::start();
    let gw = gateway(&up);
    let sizes = [
        0, 1, 1000, 65_535, 65_536, 65_537, 100_000, 131_072, 131_073, 300_000,
    ];
    for &size in &sizes {
        let body: Vec<u8> = (0..size).map(|i| (i * 7 % 251) as u8).collect();
        let want = format!("{} {}", body.len(), hex::encode(Sha256::digest(&body)));
        for chunked in [None, Some(1 << 20), Some(8192)] {
            for piece in [usize::MAX, 10_000] {
                let (status, answer) = post(gw.addr, &body, chunked, piece);
                assert_eq!(status, 200, "size {size} chunked {chunked:?}: {answer}");
                assert!(
                    answer.ends_with(&want),
                    "size {size} chunked {chunked:?} piece {piece}: got {answer}, want {want}"
                );
            }
        }
    }
}

/// A body larger than the buffer streams past it, and is cut at `body_timeout` when it stops
/// arriving: the upstream connection it held is released, the client gets 408.
#[test]
fn a_body_past_the_buffer_that_stalls_is_cut_at_its_deadline() {
    let up = CountingUpstream::start();
    let gw = gateway(&up);
    let mut c = TcpStream::connect(gw.addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    c.write_all(b"POST /up HTTP/1.1\r\nhost: a\r\ncontent-length: 1048576\r\n\r\n")
        .unwrap();
    c.write_all(&vec![b'x'; 200_000]).unwrap();
    let started = Instant::now();
    let (status, head, _) = read_answer(&mut c).expect("an answer");
    assert_eq!(status, 408, "{head}");
    let took = started.elapsed();
    assert!(took < Duration::from_secs(8), "cut after {took:?}");
    assert_eq!(
        up.accepted.load(Ordering::SeqCst),
        1,
        "past the buffer it streams"
    );
    let released = Instant::now();
    while up.open.load(Ordering::SeqCst) != 0 {
        assert!(
            released.elapsed() < Duration::from_secs(10),
            "the upstream connection is still held"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// HTTP/2: one connection may have 16 requests reading their bodies ahead at once; more are
/// answered 429 at once, and none of the slow ones reaches the upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2_streams_waiting_on_bodies_are_bounded_per_connection() {
    let up = CountingUpstream::start();
    let gw = gateway(&up);
    let c = reqwest::Client::builder()
        .no_proxy()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    let url = gw.url("/up");
    let sends: Vec<_> = (0..20)
        .map(|_| {
            let c = c.clone();
            let url = url.clone();
            tokio::spawn(async move {
                // A byte every 200 ms, for up to 3 s.
                let trickle = futures::stream::unfold(0u32, |n| async move {
                    if n >= 15 {
                        return None;
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    Some((
                        Ok::<_, std::io::Error>(bytes::Bytes::from_static(b"x")),
                        n + 1,
                    ))
                });
                let r = c
                    .post(&url)
                    .header("content-length", "100")
                    .body(reqwest::Body::wrap_stream(trickle))
                    .send()
                    .await;
                r.map(|r| r.status().as_u16()).unwrap_or(0)
            })
        })
        .collect();
    let mut statuses = Vec::new();
    for s in sends {
        statuses.push(s.await.unwrap());
    }
    statuses.sort();
    let too_many = statuses.iter().filter(|&&s| s == 429).count();
    let timed_out = statuses.iter().filter(|&&s| s == 408).count();
    assert_eq!(too_many, 4, "{statuses:?}");
    assert_eq!(timed_out, 16, "{statuses:?}");
    assert_eq!(up.accepted.load(Ordering::SeqCst), 0);
}

/// A client that waits for `100 Continue` before it sends its body (as curl does for large
/// uploads) is told to go on by floodgate, which reads the body before the upstream is asked:
/// without that it would wait out body_timeout.
#[test]
fn expect_100_continue_is_answered_before_the_body_is_read() {
    let up = CountingUpstream::start();
    let gw = gateway(&up);
    let body: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
    let mut c = TcpStream::connect(gw.addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.write_all(
        format!(
            "POST /up HTTP/1.1\r\nhost: a\r\ncontent-length: {}\r\nexpect: 100-continue\r\n\r\n",
            body.len()
        )
        .as_bytes(),
    )
    .unwrap();
    let interim = read_head(&mut c).expect("closed before 100 Continue");
    let interim = String::from_utf8_lossy(&interim);
    assert!(interim.starts_with("HTTP/1.1 100"), "{interim}");
    c.write_all(&body).unwrap();
    let (status, head, answer) = read_answer(&mut c).expect("an answer");
    assert_eq!(status, 200, "{head}{answer}");
    let want = format!("{} {}", body.len(), hex::encode(Sha256::digest(&body)));
    assert!(answer.ends_with(&want), "{answer}");
}
