//! Spellings that a backend framework reads as the protected resource while a gateway routes
//! Or counts them as something else: lower-case methods, path
//! parameters and control bytes, encoded query keys, repeated keyed values, underscore
//! headers, list-valued Content-Length, and X-Forwarded-For chains with one bad element.
//! Raw sockets, so that no client library tidies the request, and the demo upstream echoes
//! what it received.

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use crate::common::*;

/// Sends `head` (request line and headers, without the blank line) as bytes on a fresh
/// connection: (status, the whole answer).
pub fn send(addr: SocketAddr, head: &[u8]) -> (u16, String) {
    let mut conn = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect");
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut request = head.to_vec();
    request.extend_from_slice(b"\r\nconnection: close\r\n\r\n");
    conn.write_all(&request).expect("write");
    let mut out = Vec::new();
    let _ = conn.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {text:?} for {:?}", head.escape_ascii()));
    (status, text)
}

/// `METHOD target HTTP/1.1` with a Host and `headers` (each `\r\nname: value`).
fn request(addr: SocketAddr, method: &str, target: &[u8], headers: &[u8]) -> (u16, String) {
    let mut head = format!("{method} ").into_bytes();
    head.extend_from_slice(target);
    head.extend_from_slice(b" HTTP/1.1\r\nhost: floodgate.test");
    head.extend_from_slice(headers);
    send(addr, &head)
}

fn get(addr: SocketAddr, target: &[u8], headers: &[u8]) -> (u16, String) {
    request(addr, "GET", target, headers)
}

/// The JSON body of an answer.
pub fn body(answer: &str) -> serde_json::Value {
    let (_, b) = answer.split_once("\r\n\r\n").expect("a body");
    serde_json::from_str(b).unwrap_or_else(|e| panic!("{e}: {b}"))
}

/// Asserts that floodgate itself refused the request with a problem+json 400.
fn assert_refused(answer: &(u16, String), what: &str) {
    let (status, text) = answer;
    assert_eq!(*status, 400, "{what}: {text}");
    assert!(text.contains("application/problem+json"), "{what}: {text}");
    assert_eq!(
        body(text)["type"],
        "urn:floodgate:problem:bad-request",
        "{what}"
    );
}

/// Requests the gateway has sent to any upstream target so far (every attempt is counted,
/// whatever its outcome).
fn upstream_attempts(gw: &Gateway) -> f64 {
    let (_, metrics) = admin_get(gw.admin, "/metrics").expect("metrics");
    metrics
        .lines()
        .filter(|l| l.starts_with("floodgate_upstream_target_responses_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn config(api: SocketAddr) -> String {
    format!(
        r#"{DEMO_KEYS}
{}
[[upstreams]]
name = "hashed"
targets = ["{api}"]
balance = "consistent"
hash_key = ["query:cart"]

[[routes]]
name = "login"
match = {{ path_prefix = "/debug/login", methods = ["POST"] }}
upstream = "orders"
auth = "required"

[[routes]]
name = "orders"
match = {{ path_prefix = "/debug/orders" }}
upstream = "orders"
auth = "required"

[[routes]]
name = "carts"
match = {{ path_prefix = "/debug/carts" }}
upstream = "hashed"
auth = "none"

[[routes]]
name = "public"
match = {{ path_prefix = "/" }}
upstream = "orders"
auth = "none"

[[rules]]
name = "per-user"
match = {{ path_prefix = "/debug/users" }}
key = ["query:user"]
algorithm = "fixed_window"
limit = 1
window = "1h"

[[rules]]
name = "per-tenant"
match = {{ path_prefix = "/debug/tenants" }}
key = ["header:x-tenant"]
algorithm = "fixed_window"
limit = 1
window = "1h"
"#,
        orders_upstream(&[api])
    )
}

#[test]
fn methods_and_paths_a_backend_reads_as_the_protected_route_are_400() {
    let api = OrdersApi::start("orders-1");
    let gw = Gateway::start(&config(api.addr));

    // `post` misses `methods = ["POST"]` (and its auth) but reaches servers that upper-case it.
    for method in ["post", "Post"] {
        assert_refused(&request(gw.addr, method, b"/debug/login", b""), method);
    }
    assert_eq!(request(gw.addr, "POST", b"/debug/login", b"").0, 401);

    // Each of these is /debug/orders (auth required) to some framework, and fell through to
    // the public catch-all.
    for target in [
        &b"/debug/orders;x"[..],
        b"/debug/orders;jsessionid=1/1",
        b"/debug/x/..;/orders",
        b"/debug/orders%00",
        b"/debug/orders\x00",
        b"/debug/orders%0a",
        b"/debug/orders%09",
        b"/debug/orders%20",
        b"/debug/%20orders",
        b"/debug/orders ",
        b"/x\\..\\debug\\orders",
        b"/debug\\orders",
        b"/debug/%c0%ae%c0%ae/debug/orders",
        // An encoded `;`: a backend that decodes before it strips path parameters reads
        // `/debug/orders`.
        b"/debug/orders%3bx",
        b"/debug/orders%3Bx",
    ] {
        assert_refused(
            &get(gw.addr, target, b""),
            &target.escape_ascii().to_string(),
        );
    }
    // Bytes that are not UTF-8: Pingora's parser refuses them before floodgate sees them
    // (admission would too: routes would see replacement characters, the upstream the bytes).
    assert_eq!(get(gw.addr, b"/debug/orders\xff", b"").0, 400);
    let refused = upstream_attempts(&gw);
    assert_eq!(refused, 0.0, "no refused request reached the upstream");

    // Data stays data, and reaches the upstream as sent.
    for (target, path) in [
        ("/debug/a%20b", "/debug/a%20b"),
        ("/debug/caf%C3%A9", "/debug/caf%C3%A9"),
    ] {
        let (status, answer) = get(gw.addr, target.as_bytes(), b"");
        assert_eq!(status, 200, "{target}: {answer}");
        assert_eq!(body(&answer)["path"], path);
    }
    assert_eq!(upstream_attempts(&gw), 2.0);
}

#[test]
fn query_and_header_keys_count_what_the_upstream_reads() {
    let api = OrdersApi::start("orders-1");
    let gw = Gateway::start(&config(api.addr));

    // One counter for alice, however her name is spelled.
    let (status, answer) = get(gw.addr, b"/debug/users?user=alice", b"");
    assert_eq!(status, 200, "{answer}");
    for spelling in [
        "user=%61lice",
        "%75ser=alice",
        "%75%73%65%72=%61%6C%69%63%65",
        "x=1;user=alice",
    ] {
        let target = format!("/debug/users?{spelling}");
        assert_eq!(
            get(gw.addr, target.as_bytes(), b"").0,
            429,
            "{spelling} is alice"
        );
    }
    assert_eq!(get(gw.addr, b"/debug/users?user=a+b", b"").0, 200);
    assert_eq!(get(gw.addr, b"/debug/users?user=a%20b", b"").0, 429);

    // A repeated keyed parameter or header would be charged to one value while the upstream
    // may read another.
    for target in [
        &b"/debug/users?user=bob&user=alice"[..],
        b"/debug/users?user=carol&%75ser=alice",
        b"/debug/users?user=dave;user=alice",
        b"/debug/carts/1?cart=a&cart=b",
    ] {
        let answer = get(gw.addr, target, b"");
        assert_refused(&answer, &target.escape_ascii().to_string());
    }
    let twice = get(
        gw.addr,
        b"/debug/tenants/1",
        b"\r\nx-tenant: t1\r\nx-tenant: t2",
    );
    assert_refused(&twice, "x-tenant twice");
    assert!(body(&twice.1)["detail"]
        .as_str()
        .unwrap()
        .contains("x-tenant"));
    assert_eq!(
        get(gw.addr, b"/debug/tenants/1", b"\r\nx-tenant: t1").0,
        200
    );
    assert_eq!(
        get(gw.addr, b"/debug/tenants/1", b"\r\nx-tenant: t1").0,
        429
    );
    // Repetition of what no applying rule reads is no one's business.
    let (status, answer) = get(gw.addr, b"/debug/other?user=a&user=b", b"");
    assert_eq!(status, 200, "{answer}");
    assert_eq!(body(&answer)["query"], "user=a&user=b");
    let (status, _) = get(gw.addr, b"/debug/carts/1?cart=a", b"");
    assert_eq!(status, 200);
    // alice, a+b, t1, /debug/other and the cart: nothing refused or rejected went upstream.
    assert_eq!(upstream_attempts(&gw), 5.0);
}

#[test]
fn underscore_headers_and_list_content_length_do_not_reach_the_upstream() {
    let api = OrdersApi::start("orders-1");
    let gw = Gateway::start(&config(api.addr));
    let forged = b"\r\nX_Floodgate_Key_Id: acme-prod\r\nx_floodgate_plan: pro\r\nx_forwarded_for: 198.51.100.7\r\nX_Request_Id: forged\r\nx_custom: 1\r\nx-custom: 2";

    // Default: dropped, as nginx does (a CGI upstream would read X_Floodgate_Key_Id as the
    // identity header).
    let (status, answer) = get(gw.addr, b"/debug/headers", forged);
    assert_eq!(status, 200, "{answer}");
    let headers = body(&answer)["headers"].clone();
    let names: Vec<&String> = headers.as_object().unwrap().keys().collect();
    assert!(names.iter().all(|n| !n.contains('_')), "{names:?}");
    assert_eq!(headers["x-custom"], "2");
    assert_eq!(headers["x-forwarded-for"], "127.0.0.1");

    // A Content-Length list or repetition is refused (RFC 9110 §8.6), whatever its values.
    for lengths in [
        &b"\r\ncontent-length: 0, 0"[..],
        b"\r\ncontent-length: 0\r\ncontent-length: 0",
    ] {
        let answer = get(gw.addr, b"/debug/headers", lengths);
        assert_refused(&answer, &lengths.escape_ascii().to_string());
        assert!(answer.1.contains("Content-Length"), "{}", answer.1);
    }
    assert_eq!(
        get(gw.addr, b"/debug/headers", b"\r\ncontent-length: 0").0,
        200
    );
    assert_eq!(upstream_attempts(&gw), 2.0);

    let reject = Gateway::start_with(
        "headers_with_underscores = \"reject\"\n",
        &config(api.addr),
        &[],
    );
    assert_refused(
        &get(reject.addr, b"/debug/headers", b"\r\nx_custom: 1"),
        "reject",
    );
    assert_eq!(
        get(reject.addr, b"/debug/headers", b"\r\nx-custom: 1").0,
        200
    );

    // "allow" forwards them, but never a spelling of a header floodgate sets itself.
    let allow = Gateway::start_with(
        "headers_with_underscores = \"allow\"\n",
        &config(api.addr),
        &[],
    );
    let (status, answer) = get(allow.addr, b"/debug/headers", forged);
    assert_eq!(status, 200, "{answer}");
    let headers = body(&answer)["headers"].clone();
    assert_eq!(headers["x_custom"], "1");
    for ours in [
        "x_floodgate_key_id",
        "x_floodgate_plan",
        "x_forwarded_for",
        "x_request_id",
    ] {
        assert!(headers.get(ours).is_none(), "{ours}: {headers}");
    }
}

#[test]
fn headers_with_underscores_is_checked_with_its_position() {
    let (ok, _, err) = check(
        "[server]\nheaders_with_underscores = \"sometimes\"\n\n[[upstreams]]\nname = \"u\"\ntargets = [\"127.0.0.1:9\"]\n\n[[routes]]\nname = \"r\"\nupstream = \"u\"\n",
        &[],
    );
    assert!(!ok);
    assert!(err.contains("gateway.toml:2:"), "{err}");
    assert!(
        err.contains("\"drop\", \"reject\", \"allow\""),
        "names the choices: {err}"
    );
}

fn forwarded_config(api: SocketAddr) -> String {
    format!(
        r#"{}
[[routes]]
name = "all"
upstream = "orders"
auth = "none"

[[rules]]
name = "per-client"
match = {{ path_prefix = "/debug/ip" }}
key = ["ip"]
algorithm = "fixed_window"
limit = 1
window = "1h"
"#,
        orders_upstream(&[api])
    )
}

#[test]
fn a_bad_forwarded_for_element_does_not_merge_clients_or_lose_the_chain() {
    let api = OrdersApi::start("orders-1");
    let gw = Gateway::start_with(
        "trusted_proxies = [\"127.0.0.1\"]\n",
        &forwarded_config(api.addr),
        &[],
    );
    let from = |chain: &[u8]| {
        let mut h = b"\r\nx-forwarded-for: ".to_vec();
        h.extend_from_slice(chain);
        get(gw.addr, b"/debug/ip", &h).0
    };
    // Each is its own client: one bad or empty element left of it changes nothing (it made
    // the trusted proxy the client, one counter for everyone behind it).
    for chain in [
        &b"\xc3\xa9, 203.0.113.1"[..],
        b"\xc3\xa9, 203.0.113.2",
        b"unknown, 203.0.113.3",
        b"203.0.113.4,",
        b"203.0.113.5, , ",
        b"\xff, 203.0.113.6",
    ] {
        assert_eq!(from(chain), 200, "{}", chain.escape_ascii());
    }
    // And each was counted as itself.
    assert_eq!(from(b"203.0.113.1"), 429);
    assert_eq!(from(b"203.0.113.4"), 429);
    assert_eq!(from(b"203.0.113.7"), 200);

    // The upstream gets the whole chain, as sent, with the peer appended; several lines are
    // one chain.
    let (status, answer) = get(
        gw.addr,
        b"/debug/headers",
        b"\r\nx-forwarded-for: \xc3\xa9, 203.0.113.9",
    );
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        body(&answer)["headers"]["x-forwarded-for"],
        "\u{e9}, 203.0.113.9, 127.0.0.1"
    );
    let (_, answer) = get(
        gw.addr,
        b"/debug/headers",
        b"\r\nx-forwarded-for: 198.51.100.1\r\nx-forwarded-for: 203.0.113.9",
    );
    assert_eq!(
        body(&answer)["headers"]["x-forwarded-for"],
        "198.51.100.1, 203.0.113.9, 127.0.0.1"
    );
}

#[test]
fn consistent_hashing_reads_query_keys_decoded() {
    let apis = [
        OrdersApi::start("orders-a"),
        OrdersApi::start("orders-b"),
        OrdersApi::start("orders-c"),
    ];
    let body = format!(
        "[[upstreams]]\nname = \"orders\"\ntargets = [\"{}\", \"{}\", \"{}\"]\n\
         balance = \"consistent\"\nhash_key = [\"query:cart\"]\n\
         [[routes]]\nname = \"all\"\nupstream = \"orders\"\nauth = \"none\"\n",
        apis[0].addr, apis[1].addr, apis[2].addr
    );
    let gw = Gateway::start(&body);
    let served_by = |target: String| {
        let (status, answer) = get(gw.addr, target.as_bytes(), b"");
        assert_eq!(status, 200, "{target}: {answer}");
        answer
            .lines()
            .find_map(|l| l.strip_prefix("x-served-by: "))
            .unwrap_or_else(|| panic!("{target}: no x-served-by in {answer}"))
            .to_string()
    };
    // Eight carts, each spelled three ways: one target per cart (by chance, for eight carts
    // over three targets, about once in 6561 runs of a hashing that read the raw text).
    for cart in ["a", "b", "c", "d", "e", "f", "g", "h"] {
        let encoded: String = cart.bytes().map(|b| format!("%{b:02X}")).collect();
        let home = served_by(format!("/debug/x?cart={cart}"));
        assert_eq!(
            served_by(format!("/debug/x?cart={encoded}")),
            home,
            "{cart}"
        );
        assert_eq!(served_by(format!("/debug/x?%63art={cart}")), home, "{cart}");
    }
}
