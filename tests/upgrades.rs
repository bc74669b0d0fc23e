//! Upgraded connections: after a `101`, the connection is a tunnel. An
//! upstream read timeout must close it, never write a problem+json into it; the upstream's
//! total `timeout` does not cut a tunnel that is in use; and tunnels have their own idle
//! timeout, `tunnel_timeout`.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::*;

/// An upstream that answers every upgrade request with `101` and then echoes what it reads.
fn echo_upstream() -> SocketAddr {
    raw_upstream(|mut conn| {
        if read_head(&mut conn).is_none() {
            return;
        }
        let _ = conn.write_all(
            b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: upgrade\r\n\r\n",
        );
        let mut buf = [0u8; 4096];
        while let Ok(n) = conn.read(&mut buf) {
            if n == 0 || conn.write_all(&buf[..n]).is_err() {
                return;
            }
        }
    })
}

/// A gateway with a 1 s `read_timeout`, a 2 s total `timeout` and `tunnel_timeout = "3s"`.
fn gateway(up: SocketAddr) -> Gateway {
    Gateway::start(&format!(
        "[[upstreams]]\nname = \"ws\"\ntargets = [\"{up}\"]\nread_timeout = \"1s\"\ntimeout = \"2s\"\n\
         tunnel_timeout = \"3s\"\n\n[[routes]]\nname = \"all\"\nupstream = \"ws\"\nauth = \"none\"\n"
    ))
}

/// Opens a tunnel through `gw` and reads its 101 head.
fn open_tunnel(gw: SocketAddr) -> TcpStream {
    let mut c = TcpStream::connect(gw).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    c.write_all(
        b"GET /chat HTTP/1.1\r\nhost: a\r\nupgrade: websocket\r\nconnection: upgrade\r\n\
          sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\nsec-websocket-version: 13\r\n\r\n",
    )
    .unwrap();
    let head = read_head(&mut c).expect("the gateway closed before the 101");
    let head = String::from_utf8_lossy(&head);
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    c
}

#[test]
fn an_idle_tunnel_is_closed_at_tunnel_timeout_without_a_byte_written_into_it() {
    let gw = gateway(echo_upstream());
    let mut c = open_tunnel(gw.addr);
    let opened = Instant::now();
    let mut rest = Vec::new();
    let _ = c.read_to_end(&mut rest);
    let after = opened.elapsed();
    assert!(
        rest.is_empty(),
        "written into the tunnel: {:?}",
        String::from_utf8_lossy(&rest)
    );
    assert!(
        after >= Duration::from_millis(2500),
        "closed after {after:?}, before tunnel_timeout"
    );
    assert!(
        after < Duration::from_secs(10),
        "still open after {after:?}"
    );
}

#[test]
fn a_busy_tunnel_outlives_read_timeout_and_the_total_timeout() {
    let gw = gateway(echo_upstream());
    let mut c = open_tunnel(gw.addr);
    // 5 s of traffic, a message every 500 ms: past read_timeout (1 s) and timeout (2 s).
    let started = Instant::now();
    let mut n = 0u32;
    while started.elapsed() < Duration::from_secs(5) {
        let msg = format!("message {n};");
        c.write_all(msg.as_bytes()).unwrap();
        let mut got = vec![0u8; msg.len()];
        c.read_exact(&mut got)
            .unwrap_or_else(|e| panic!("tunnel cut after {:?}: {e}", started.elapsed()));
        assert_eq!(got, msg.as_bytes());
        n += 1;
        std::thread::sleep(Duration::from_millis(500));
    }
}
