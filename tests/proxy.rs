//! The gateway as a reverse proxy, through the real binary: routing, auth, identity headers,
//! forwarding headers, round robin, and upstream failures.

mod common;

use common::*;
use serde_json::Value;

fn base(targets: &[std::net::SocketAddr]) -> String {
    format!(
        "{DEMO_KEYS}\n{}\n{}",
        orders_upstream(targets),
        r#"
[[routes]]
name = "login"
match = { path = "/login", methods = ["POST"] }
upstream = "orders"
auth = "none"

[[routes]]
name = "debug"
match = { path_prefix = "/debug" }
upstream = "orders"
auth = "optional"

[[routes]]
name = "orders"
match = { path_prefix = "/orders" }
upstream = "orders"
auth = "required"
"#
    )
}

async fn echoed_headers(resp: reqwest::Response) -> serde_json::Map<String, Value> {
    let v: Value = resp.json().await.expect("json");
    v["headers"].as_object().cloned().expect("headers object")
}

#[tokio::test]
async fn routes_auth_and_404() {
    let api = OrdersApi::start("orders-1");
    let gw = Gateway::start(&base(&[api.addr]));
    let c = client();

    // Valid hashed key through the configured header.
    let r = get_with_key(&c, gw.url("/orders"), "test").await;
    assert_eq!(r.status(), 200);
    assert!(r.headers().get("x-request-id").is_some());
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["orders"][0]["id"], 1);

    // Plaintext (`secret =`) key through Authorization: Bearer.
    let r = get_with_token(&c, gw.url("/orders/2"), "partner").await;
    assert_eq!(r.status(), 200);

    // Missing key: 401 problem+json with a challenge.
    let r = c.get(gw.url("/orders")).send().await.unwrap();
    assert_eq!(r.status(), 401);
    assert!(r.headers()["www-authenticate"]
        .to_str()
        .unwrap()
        .starts_with("Bearer"));
    assert_eq!(r.headers()["content-type"], "application/problem+json");
    let p: Value = r.json().await.unwrap();
    assert_eq!(p["status"], 401);

    // Unknown key: 401 with invalid_token.
    let r = get_with_key(&c, gw.url("/orders"), "wrong").await;
    assert_eq!(r.status(), 401);
    assert!(r.headers()["www-authenticate"]
        .to_str()
        .unwrap()
        .contains("invalid_token"));

    // Optional route: anonymous passes, a wrong key does not.
    let r = c.get(gw.url("/debug/headers")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let r = get_with_key(&c, gw.url("/debug/headers"), "wrong").await;
    assert_eq!(r.status(), 401);

    // Route with auth = "none" and a method filter.
    let r = c.post(gw.url("/login")).send().await.unwrap();
    assert_eq!(
        r.status(),
        401,
        "the demo API refuses a login without the password, and the gateway routed it"
    );
    assert!(r.headers().get("x-served-by").is_some());
    let r = c.get(gw.url("/login")).send().await.unwrap();
    assert_eq!(r.status(), 404, "GET /login matches no route");
    assert_eq!(r.headers()["content-type"], "application/problem+json");
    assert!(r.headers().get("x-served-by").is_none());

    // No route at all.
    let r = c.get(gw.url("/nowhere")).send().await.unwrap();
    assert_eq!(r.status(), 404);
    let p: Value = r.json().await.unwrap();
    assert_eq!(p["type"], "urn:floodgate:problem:no-route");

    // POST with a JSON body reaches the API.
    let r = c
        .post(gw.url("/orders"))
        .header("x-api-key", "test")
        .json(&serde_json::json!({"item": "filter papers", "quantity": 3}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let created: Value = r.json().await.unwrap();
    assert_eq!(created["item"], "filter papers");
}

#[tokio::test]
async fn identity_headers_and_key_stripping() {
    let api = OrdersApi::start("orders-1");
    let gw = Gateway::start(&base(&[api.addr]));
    let c = client();

    let r = c
        .get(gw.url("/debug/headers"))
        .header("x-api-key", "test")
        .header("x-floodgate-user", "spoofed")
        .header("x-request-id", "trace-42")
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["x-request-id"], "trace-42");
    let h = echoed_headers(r).await;
    assert_eq!(h["x-floodgate-key-id"], "acme-prod");
    assert_eq!(
        h["x-floodgate-user"], "acme",
        "a client cannot claim an identity"
    );
    assert_eq!(h["x-floodgate-plan"], "pro");
    assert!(
        !h.contains_key("x-api-key"),
        "the key is stripped by default"
    );
    assert_eq!(h["x-request-id"], "trace-42");
    assert_eq!(h["x-forwarded-proto"], "http");
    assert_eq!(h["x-forwarded-for"], "127.0.0.1");

    // Bearer keys are stripped too; an insane request id is replaced.
    let r = c
        .get(gw.url("/debug/headers"))
        .bearer_auth("partner")
        .header("x-request-id", "has spaces and is bad")
        .send()
        .await
        .unwrap();
    let id = r.headers()["x-request-id"].to_str().unwrap().to_string();
    assert_eq!(id.len(), 32);
    let h = echoed_headers(r).await;
    assert!(!h.contains_key("authorization"));
    assert_eq!(h["x-floodgate-key-id"], "globex-partner");
    assert_eq!(h["x-request-id"], id.as_str());

    // Anonymous on an optional route: no identity headers at all, claimed ones stripped.
    let r = c
        .get(gw.url("/debug/headers"))
        .header("x-floodgate-plan", "enterprise")
        .header("x-forwarded-for", "198.51.100.4")
        .send()
        .await
        .unwrap();
    let h = echoed_headers(r).await;
    assert!(!h.contains_key("x-floodgate-key-id"));
    assert!(!h.contains_key("x-floodgate-plan"), "{h:?}");
    // The chain the client sent, the peer appended (the peer is not a trusted proxy: the
    // chain is passed on, not believed).
    assert_eq!(h["x-forwarded-for"], "198.51.100.4, 127.0.0.1");

    // Two ids are no id: a fresh one replaces both, upstream and in the answer alike.
    let r = c
        .get(gw.url("/debug/headers"))
        .header("x-request-id", "first")
        .header("x-request-id", "second")
        .send()
        .await
        .unwrap();
    let id = r.headers()["x-request-id"].to_str().unwrap().to_string();
    assert_eq!(id.len(), 32, "{id}");
    assert_eq!(r.headers().get_all("x-request-id").iter().count(), 1);
    let h = echoed_headers(r).await;
    assert_eq!(h["x-request-id"], id.as_str(), "exactly one id upstream");
}

#[tokio::test]
async fn forward_key_keeps_the_key() {
    let api = OrdersApi::start("orders-1");
    let body = base(&[api.addr]).replacen(
        "[[auth.keys]]",
        "[auth]\nforward_key = true\n\n[[auth.keys]]",
        1,
    );
    let gw = Gateway::start(&body);
    let h = echoed_headers(
        client()
            .get(gw.url("/debug/headers"))
            .header("x-api-key", "test")
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(h["x-api-key"], "test");
}

/// The status of `GET /debug/headers` sent with `X-Forwarded-For: xff`.
async fn forwarded_for(c: &reqwest::Client, gw: &Gateway, xff: &str) -> u16 {
    c.get(gw.url("/debug/headers"))
        .header("x-forwarded-for", xff)
        .send()
        .await
        .expect("GET")
        .status()
        .as_u16()
}

#[tokio::test]
async fn forwarded_for_is_believed_only_from_trusted_peers() {
    let api = OrdersApi::start("orders-1");
    let c = client();

    // Untrusted peer (nothing trusted): the peer is the client; its XFF is kept in the chain
    // for the upstream, with the peer appended.
    let gw = Gateway::start(&base(&[api.addr]));
    let h = echoed_headers(
        c.get(gw.url("/debug/headers"))
            .header("x-forwarded-for", "6.6.6.6")
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(h["x-forwarded-for"], "6.6.6.6, 127.0.0.1");
    drop(gw);

    // Trusted loopback peer: rules see the rightmost untrusted address. A rule keyed on ip
    // with limit 1 shows whose counter is charged.
    let rules = r#"
[[rules]]
name = "per-ip"
match = { route = "debug" }
key = ["ip"]
algorithm = "fixed_window"
limit = 1
window = "1h"
"#;
    let gw = Gateway::start_with(
        "trusted_proxies = [\"127.0.0.0/8\"]",
        &format!("{}{rules}", base(&[api.addr])),
        &[],
    );
    let send = |xff: &'static str| forwarded_for(&c, &gw, xff);
    assert_eq!(send("1.1.1.1").await, 200);
    assert_eq!(send("1.1.1.1").await, 429, "same client IP");
    assert_eq!(
        send("2.2.2.2, 127.0.0.5").await,
        200,
        "trusted hops are skipped"
    );
    assert_eq!(
        send("1.1.1.1, 2.2.2.2").await,
        429,
        "rightmost untrusted wins"
    );
    drop(gw);

    // Untrusted peer sending XFF: the header is ignored for identity.
    let gw = Gateway::start(&format!("{}{rules}", base(&[api.addr])));
    let send = |xff: &'static str| forwarded_for(&c, &gw, xff);
    assert_eq!(send("1.1.1.1").await, 200);
    assert_eq!(send("3.3.3.3").await, 429, "both are the peer 127.0.0.1");
}

#[tokio::test]
async fn round_robin_skips_refusing_targets_and_reports_502_504() {
    let a = OrdersApi::start("orders-a");
    let b = OrdersApi::start("orders-b");
    let dead = free_addr();
    let gw = Gateway::start(&base(&[a.addr, dead, b.addr]));
    let c = client();
    let mut served = std::collections::BTreeMap::new();
    for _ in 0..12 {
        let r = get_with_key(&c, gw.url("/orders"), "test").await;
        assert_eq!(
            r.status(),
            200,
            "a refusing target is skipped, never surfaced"
        );
        let by = r.headers()["x-served-by"].to_str().unwrap().to_string();
        *served.entry(by).or_insert(0) += 1;
    }
    assert_eq!(served.len(), 2, "both live targets serve: {served:?}");
    assert!(
        served.values().all(|n| *n >= 3),
        "round robin spreads the load: {served:?}"
    );
    drop(gw);

    // Every target down: 502 problem+json.
    let gw = Gateway::start(&base(&[dead]));
    let r = get_with_key(&c, gw.url("/orders"), "test").await;
    assert_eq!(r.status(), 502);
    assert_eq!(r.headers()["content-type"], "application/problem+json");
    drop(gw);

    // A slow upstream past read_timeout (2s in the harness): 504.
    let gw = Gateway::start(&base(&[a.addr]));
    let r = get_with_key(&c, gw.url("/orders?delay_ms=5000"), "test").await;
    assert_eq!(r.status(), 504);
    let p: Value = r.json().await.unwrap();
    assert_eq!(p["status"], 504);
}

#[tokio::test]
async fn h2c_on_plain_listener() {
    let api = OrdersApi::start("orders-1");
    let gw = Gateway::start(&base(&[api.addr]));
    let c = reqwest::Client::builder()
        .no_proxy()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    let r = get_with_key(&c, gw.url("/orders/1"), "test").await;
    assert_eq!(r.version(), reqwest::Version::HTTP_2);
    assert_eq!(r.status(), 200);
    let r = c.get(gw.url("/orders/1")).send().await.unwrap();
    assert_eq!(r.status(), 401);
}

/// Over HTTP/2: a `CONNECT` stream was refused with Pingora's bare 405 (no
/// body, no request id); it gets floodgate's problem+json like HTTP/1.1.
#[tokio::test]
async fn an_h2_connect_is_refused_with_problem_json() {
    let api = OrdersApi::start("orders-1");
    let gw = Gateway::start(&format!(
        "{}\n[[routes]]\nname = \"all\"\nupstream = \"orders\"\nauth = \"none\"\n",
        orders_upstream(&[api.addr])
    ));
    let tcp = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    let (mut client, connection) = h2::client::handshake(tcp).await.unwrap();
    let driver = tokio::spawn(connection);
    let request = http::Request::builder()
        .method(http::Method::CONNECT)
        .uri("example.com:443")
        .body(())
        .unwrap();
    let (response, _send) = client.send_request(request, true).unwrap();
    let response = tokio::time::timeout(std::time::Duration::from_secs(10), response)
        .await
        .expect("an answer")
        .unwrap();
    assert_eq!(response.status(), 405);
    let headers = response.headers().clone();
    assert_eq!(headers["content-type"], "application/problem+json");
    assert!(!headers.contains_key("server"), "{headers:?}");
    let mut body = response.into_body();
    let mut bytes = Vec::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.unwrap();
        let _ = body.flow_control().release_capacity(chunk.len());
        bytes.extend_from_slice(&chunk);
    }
    let v: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(v["type"], "urn:floodgate:problem:method-not-allowed");
    assert_eq!(v["status"], 405);
    let id = v["request_id"].as_str().unwrap();
    assert_eq!(headers["x-request-id"], id);
    driver.abort();
}

#[test]
fn secrets_never_reach_the_logs() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let api = OrdersApi::start("orders-1");
    let mut gw = Gateway::start(&base(&[api.addr]));
    rt.block_on(async {
        let c = client();
        c.get(gw.url("/orders"))
            .header("x-api-key", "test")
            .send()
            .await
            .unwrap();
        c.get(gw.url("/orders"))
            .header("x-api-key", "sup3r-s3cret-guess")
            .send()
            .await
            .unwrap();
        c.get(gw.url("/orders"))
            .bearer_auth("partner")
            .send()
            .await
            .unwrap();
    });
    // Stopping writes out the access lines still queued.
    gw.stop();
    let logs = gw.logs();
    assert!(
        logs.contains("acme-prod"),
        "access log names the key id: {logs}"
    );
    assert!(!logs.contains("sup3r-s3cret-guess"));
    assert!(!logs.contains("Bearer partner"));
    assert!(!logs.contains("\"partner\""));
}

/// The answers Pingora makes on its own — a head it cannot parse, a `CONNECT` —
/// were a bare status with `Server: Pingora`. They are floodgate's problem+json, with a
/// request id, like every other answer.
#[test]
fn answers_pingora_would_make_are_problem_json_with_a_request_id() {
    use std::io::{Read, Write};
    let api = OrdersApi::start("orders-1");
    let gw = Gateway::start(&format!(
        "{}\n[[routes]]\nname = \"all\"\nupstream = \"orders\"\nauth = \"none\"\n",
        orders_upstream(&[api.addr])
    ));
    let cases: [(&[u8], u16, &str); 3] = [
        (
            b"GET /orders HTTP/1.1\r\nhost: a\r\nhost: b\r\n\r\n",
            400,
            "bad-request",
        ),
        (
            b"GET /orders HTTP/1.1\r\nhost: a\r\ncontent-length: x\r\n\r\n",
            400,
            "bad-request",
        ),
        (
            b"CONNECT example.com:443 HTTP/1.1\r\nhost: example.com:443\r\n\r\n",
            405,
            "method-not-allowed",
        ),
    ];
    for (request, status, kind) in cases {
        let mut c = std::net::TcpStream::connect(gw.addr).unwrap();
        c.set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
        c.write_all(request).unwrap();
        let mut raw = Vec::new();
        let _ = c.read_to_end(&mut raw);
        let text = String::from_utf8_lossy(&raw);
        let what = String::from_utf8_lossy(request);
        assert!(
            text.starts_with(&format!("HTTP/1.1 {status} ")),
            "{what}: {text}"
        );
        assert!(
            !text.to_ascii_lowercase().contains("server: pingora"),
            "{what}: {text}"
        );
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.contains("application/problem+json"), "{what}: {head}");
        let v: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{what}: {e}: {body}"));
        assert_eq!(v["type"], format!("urn:floodgate:problem:{kind}"), "{what}");
        assert_eq!(v["status"], status);
        let id = v["request_id"].as_str().unwrap();
        assert!(head.contains(&format!("x-request-id: {id}")), "{head}");
    }
}

/// One route, without auth, sending every request to the upstream at `up`.
fn every_path_to(up: std::net::SocketAddr) -> String {
    format!(
        "{}\n[[routes]]\nname = \"all\"\nmatch = {{}}\nupstream = \"orders\"\nauth = \"none\"\n",
        orders_upstream(&[up])
    )
}

/// Sends `n` requests one after another over one kept-alive client, each answered `200 ok`.
async fn get_ok_in_a_row(gw: &Gateway, n: usize) {
    let c = client();
    for i in 0..n {
        let r = c.get(gw.url("/any")).send().await.unwrap();
        assert_eq!(r.status(), 200, "request {i}");
        assert_eq!(r.text().await.unwrap(), "ok");
    }
}

/// Connections the keep-alive upstream of `requests_reuse_the_kept_alive_upstream_connection`
/// accepted.
static KEPT_ALIVE_ACCEPTED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Counts the connection in `accepted`, then answers its requests `200 ok` without
/// `Connection: close`: every one with `keep_alive`, else only the first, closing the
/// connection right after it.
fn answer_ok(
    mut conn: std::net::TcpStream,
    accepted: &std::sync::atomic::AtomicUsize,
    keep_alive: bool,
) {
    use std::io::Write as _;
    accepted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    while read_head(&mut conn).is_some() {
        let answered = conn
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
            .is_ok();
        if !answered || !keep_alive {
            return;
        }
    }
}

/// Answers every request on the connection `200 ok`, keeping it open.
fn keep_alive_upstream(conn: std::net::TcpStream) {
    answer_ok(conn, &KEPT_ALIVE_ACCEPTED, true);
}

/// Requests one after another go over one kept-alive upstream connection: the pool hands the
/// connection back to the next request for the same target (the check that it is connected
/// to that target reads the address recorded at connect, without a system call).
#[tokio::test]
async fn requests_reuse_the_kept_alive_upstream_connection() {
    let up = raw_upstream(keep_alive_upstream);
    let gw = Gateway::start(&every_path_to(up));
    get_ok_in_a_row(&gw, 20).await;
    assert_eq!(
        KEPT_ALIVE_ACCEPTED.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "each request should reuse the first upstream connection"
    );
}

/// Connections the closing upstream of `an_upstream_that_drops_idle_connections_costs_no_request`
/// accepted.
static DROPPING_ACCEPTED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Answers one request `200 ok` as if keeping the connection, then closes it without a word.
fn dropping_upstream(conn: std::net::TcpStream) {
    answer_ok(conn, &DROPPING_ACCEPTED, false);
}

/// An upstream that closes each connection right after its answer, without saying so: whether
/// the close is seen when the next request takes the pooled connection or only when it writes
/// to it, that request goes over a new connection instead of failing.
#[tokio::test]
async fn an_upstream_that_drops_idle_connections_costs_no_request() {
    let up = raw_upstream(dropping_upstream);
    let gw = Gateway::start(&every_path_to(up));
    get_ok_in_a_row(&gw, 10).await;
    assert_eq!(
        DROPPING_ACCEPTED.load(std::sync::atomic::Ordering::SeqCst),
        10,
        "one connection per request"
    );
}
