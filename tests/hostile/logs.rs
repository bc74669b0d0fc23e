//! Log lines a client tries to forge or flood: C1 controls in a path, a
//! 64 KB Host, a path of many kilobytes quoted by Pingora's error line, and Pingora's own
//! benign error lines. Raw sockets, the real binary, its real stderr.

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use crate::common::*;
use crate::spellings::send;

/// The longest log line floodgate writes (`log_safe::MAX_LINE`), and room for the note that
/// says how much was cut.
const MAX_LINE: usize = 8 * 1024 + 64;

/// Waits until the log has a line with `needle`; its bytes then.
fn log_with(gw: &Gateway, needle: &str) -> Vec<u8> {
    let start = Instant::now();
    loop {
        let logs = std::fs::read(&gw.log).unwrap_or_default();
        if logs.windows(needle.len()).any(|w| w == needle.as_bytes()) {
            return logs;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no log line with {needle:?}: {}",
            String::from_utf8_lossy(&logs)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether `bytes` hold a UTF-8 encoded C1 control (U+0080-U+009F).
fn has_c1(bytes: &[u8]) -> bool {
    bytes
        .windows(2)
        .any(|w| w[0] == 0xc2 && (0x80..=0x9f).contains(&w[1]))
}

fn config(api: SocketAddr, dead: SocketAddr) -> String {
    format!(
        r#"{}
[[upstreams]]
name = "dead"
targets = ["{dead}"]
connect_timeout = "300ms"

[[routes]]
name = "dead"
match = {{ path_prefix = "/dead" }}
upstream = "dead"
auth = "none"

[[routes]]
name = "all"
upstream = "orders"
auth = "none"
"#,
        orders_upstream(&[api])
    )
}

/// A gateway in front of `api` (and a dead upstream) that logs as `format` (text or json).
fn logging_as(format: &str, api: &OrdersApi) -> Gateway {
    Gateway::start_with(
        &format!("log_format = \"{format}\"\n"),
        &config(api.addr, free_addr()),
        &[],
    )
}

#[test]
fn c1_controls_never_reach_the_log_in_either_format() {
    let api = OrdersApi::start("orders-1");
    for format in ["text", "json"] {
        let gw = logging_as(format, &api);
        // U+009B is CSI: `CSI 2 J` clears a terminal that obeys 8-bit controls.
        let id = format!("c1-{format}");
        let head = format!(
            "GET /debug/\u{9b}2J\u{85}x HTTP/1.1\r\nhost: floodgate.test\r\nx-request-id: {id}"
        );
        let (status, answer) = send(gw.addr, head.as_bytes());
        assert_eq!(status, 200, "{answer}");
        // And through Pingora's error line, which quotes the path.
        let dead = format!(
            "GET /dead/\u{9b}2J HTTP/1.1\r\nhost: floodgate.test\r\nx-request-id: {id}-dead"
        );
        assert_eq!(send(gw.addr, dead.as_bytes()).0, 502);
        let logs = log_with(&gw, &format!("{id}-dead"));
        let logs = String::from_utf8_lossy(&logs);
        assert!(logs.contains(&id), "{logs}");
        assert!(
            !has_c1(logs.as_bytes()),
            "{format}: a raw C1 control in the log:\n{logs}"
        );
        if format == "json" {
            for line in logs.lines() {
                serde_json::from_str::<serde_json::Value>(line)
                    .unwrap_or_else(|e| panic!("{e}: {line}"));
            }
        }
    }
}

#[test]
fn hosts_are_capped_and_every_logged_line_is_bounded() {
    let api = OrdersApi::start("orders-1");
    for format in ["text", "json"] {
        let gw = logging_as(format, &api);
        // A Host longer than any DNS name is refused, before a route could send it upstream
        // (and Pingora's error line could quote it).
        let host = "a".repeat(64 * 1024);
        let (status, answer) = send(
            gw.addr,
            format!("GET /dead/x HTTP/1.1\r\nhost: {host}\r\nx-request-id: long-host").as_bytes(),
        );
        assert_eq!(status, 400, "{}", &answer[..answer.len().min(300)]);
        assert!(answer.contains("urn:floodgate:problem:bad-request"));
        let longest = format!("{}.example", "a".repeat(245));
        let (status, _) = send(
            gw.addr,
            format!("GET /debug/x HTTP/1.1\r\nhost: {longest}").as_bytes(),
        );
        assert_eq!(status, 200, "a 253-character host is a host");

        // A 20 KB path to an upstream that is down: the access line and Pingora's error line
        // both quote it.
        let path = format!("/dead/{}", "p".repeat(20 * 1024));
        let (status, _) = send(
            gw.addr,
            format!("GET {path} HTTP/1.1\r\nhost: floodgate.test\r\nx-request-id: long-path")
                .as_bytes(),
        );
        assert_eq!(status, 502);
        let logs = log_with(&gw, "long-path");
        let logs = String::from_utf8_lossy(&logs);
        assert!(
            logs.contains("Fail to proxy"),
            "Pingora's line is there: {logs:.2000}"
        );
        for line in logs.lines() {
            assert!(
                line.len() <= MAX_LINE,
                "{format}: a {}-byte log line: {:.300}...",
                line.len(),
                line
            );
            if format == "json" {
                serde_json::from_str::<serde_json::Value>(line)
                    .unwrap_or_else(|e| panic!("{e}: {line:.300}"));
            }
        }
        assert!(logs.contains("bytes cut]"), "the cut is marked");
        assert!(
            !logs.contains(&"a".repeat(300)),
            "the long Host is not logged"
        );
    }
}

#[test]
fn pingoras_error_line_for_a_head_timeout_is_held_back() {
    let api = OrdersApi::start("orders-1");
    let gw = Gateway::start_with(
        "header_timeout = \"300ms\"\n",
        &config(api.addr, free_addr()),
        &[],
    );
    let mut slow = TcpStream::connect(gw.addr).expect("connect");
    slow.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    slow.write_all(b"GET /debug/x HTTP/1.1\r\nhost: floodgate.test\r\n")
        .unwrap();
    let mut answer = Vec::new();
    // Pingora logs the failed head before it closes the connection: at EOF the line is out.
    let _ = slow.read_to_end(&mut answer);
    assert!(
        answer.starts_with(b"HTTP/1.1 408"),
        "{}",
        answer.escape_ascii()
    );
    // A request after it, whose access line comes later still.
    let (status, _) = send(
        gw.addr,
        b"GET /debug/x HTTP/1.1\r\nhost: floodgate.test\r\nx-request-id: after-timeout",
    );
    assert_eq!(status, 200);
    let logs = log_with(&gw, "after-timeout");
    let logs = String::from_utf8_lossy(&logs);
    assert!(
        !logs.contains("request head not received in time"),
        "counted in floodgate_connection_timeouts_total, not logged per connection:\n{logs}"
    );
}
