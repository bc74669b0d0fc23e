//! Everyday routing at the front door, through the real binary and the demo Orders API (whose
//! `/debug/...` echoes the path, query and headers it received): path rewrites, header edits on
//! upstream and own answers, CORS answered at the edge, IP lists by peer and through a trusted
//! proxy, and escaped paths that cannot reach a route through a catch-all.

mod common;

use common::*;
use serde_json::Value;

/// The Orders API's count of requests it served (not counting this one).
async fn upstream_total(c: &reqwest::Client, gw: &Gateway) -> u64 {
    let v = get_json(c, gw.url("/svc/debug/load")).await;
    v["total"].as_u64().expect("total")
}

async fn echo(c: &reqwest::Client, url: String) -> (u16, Value) {
    let r = c.get(url).send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

fn rewrites(api: &OrdersApi, api_prefix_to: &str) -> String {
    format!(
        r#"{upstream}
[[routes]]
name = "svc"
match = {{ path_prefix = "/svc" }}
upstream = "orders"
auth = "none"
strip_prefix = true

[[routes]]
name = "api"
match = {{ path_prefix = "/api/v1" }}
upstream = "orders"
auth = "none"
prefix_rewrite = "{api_prefix_to}"

[[routes]]
name = "users"
match = {{ path_prefix = "/re" }}
upstream = "orders"
auth = "none"
regex_rewrite = {{ pattern = "^/re/users/([0-9]+)$", substitution = "/debug/user-${{1}}" }}

[[routes]]
name = "bad"
match = {{ path_prefix = "/bad" }}
upstream = "orders"
auth = "none"
regex_rewrite = {{ pattern = "^/bad/(.*)$", substitution = "/debug/../$1" }}

[[routes]]
name = "hosted"
match = {{ path = "/hosted" }}
upstream = "orders"
auth = "none"
prefix_rewrite = "/debug/hosted"
host_rewrite = "orders.internal:8080"

[[rules]]
name = "api-by-client-path"
match = {{ path_prefix = "/api/v1/limited" }}
key = ["ip"]
algorithm = "fixed_window"
limit = 2
window = "1h"
"#,
        upstream = orders_upstream(&[api.addr])
    )
}

#[tokio::test]
async fn rewrites_send_the_upstream_the_path_the_route_makes() {
    let api = OrdersApi::start("orders");
    let mut gw = Gateway::start(&rewrites(&api, "/debug"));
    let c = client();

    // strip_prefix: the rest with its query as sent; the whole prefix becomes "/".
    let (s, v) = echo(&c, gw.url("/svc/debug/a/b?x=1&y=%20z")).await;
    assert_eq!(
        (s, v["path"].as_str(), v["query"].as_str()),
        (200, Some("/debug/a/b"), Some("x=1&y=%20z"))
    );
    let (s, v) = echo(&c, gw.url("/svc")).await;
    assert_eq!(
        (s, v["path"].as_str()),
        (404, Some("/")),
        "the Orders API's own 404 for /"
    );
    // Encoded characters that stay encoded after normalization stay so upstream.
    let (_, v) = echo(&c, gw.url("/svc/debug/caf%C3%A9%20au%20lait")).await;
    assert_eq!(v["path"], "/debug/caf%C3%A9%20au%20lait");

    // prefix_rewrite, of the whole prefix and below it.
    let (_, v) = echo(&c, gw.url("/api/v1/orders/7?expand=items")).await;
    assert_eq!(
        (v["path"].as_str(), v["query"].as_str()),
        (Some("/debug/orders/7"), Some("expand=items"))
    );
    let (_, v) = echo(&c, gw.url("/api/v1")).await;
    assert_eq!(v["path"], "/debug");

    // regex_rewrite: a match is replaced, a path it does not match goes as it is.
    let (_, v) = echo(&c, gw.url("/re/users/42")).await;
    assert_eq!(v["path"], "/debug/user-42");
    let (s, v) = echo(&c, gw.url("/re/other?q=1")).await;
    assert_eq!((s, v["path"].as_str()), (404, Some("/re/other")));

    // A rewrite that would make a path normalization refuses is a 400, never forwarded.
    let before = upstream_total(&c, &gw).await;
    let r = c.get(gw.url("/bad/admin")).send().await.unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(r.headers()["content-type"], "application/problem+json");
    assert!(r.text().await.unwrap().contains("rewrite"));
    assert_eq!(
        upstream_total(&c, &gw).await,
        before,
        "the refused rewrite reached the upstream"
    );

    // host_rewrite sets the upstream's Host.
    let (_, v) = echo(&c, gw.url("/hosted")).await;
    assert_eq!(
        (v["path"].as_str(), v["headers"]["host"].as_str()),
        (Some("/debug/hosted"), Some("orders.internal:8080"))
    );

    // Rules match the client's path, not the rewritten one.
    let statuses: Vec<u16> = futures::future::join_all((0..3).map(|_| {
        let c = c.clone();
        let url = gw.url("/api/v1/limited");
        async move { c.get(url).send().await.unwrap().status().as_u16() }
    }))
    .await;
    assert_eq!(
        statuses.iter().filter(|s| **s == 429).count(),
        1,
        "{statuses:?}"
    );

    // Hot reload: the new rewrite applies to the next request.
    std::fs::write(gw.dir.path().join("gateway.toml"), {
        let mut text = server_section(gw.addr, gw.admin);
        text.push_str(&rewrites(&api, "/debug/v2"));
        text
    })
    .unwrap();
    let r = c.post(gw.admin_url("/reload")).send().await.unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let (_, v) = echo(&c, gw.url("/api/v1/orders/7")).await;
    assert_eq!(v["path"], "/debug/v2/orders/7");

    // The access log carries both paths.
    gw.stop();
    let logs = gw.logs();
    let line = logs
        .lines()
        .find(|l| {
            l.contains("path=/api/v1/orders/7") && l.contains("upstream_path=/debug/orders/7")
        })
        .unwrap_or_else(|| panic!("no access line with both paths:\n{logs}"));
    assert!(
        line.contains("route=api") || line.contains("route=\"api\""),
        "{line}"
    );
}

fn edits(api: &OrdersApi) -> String {
    format!(
        r#"{DEMO_KEYS}{upstream}
[[routes]]
name = "edited"
match = {{ path_prefix = "/debug" }}
upstream = "orders"
auth = "required"
request_headers = {{ set = {{ "X-Tenant" = "${{user}}", "X-Client" = "${{client_ip}}", "X-Plan" = "${{plan}}" }}, add = {{ "X-Via" = "floodgate-${{route}}" }}, remove = ["X-Secret"] }}
response_headers = {{ set = {{ "X-Served-By" = "floodgate", "X-Key" = "${{key_id}}" }}, add = {{ "Cache-Control" = "private" }} }}

[[rules]]
name = "per-key"
key = ["api_key"]
algorithm = "fixed_window"
limit = 2
window = "1h"
"#,
        upstream = orders_upstream(&[api.addr])
    )
}

#[tokio::test]
async fn header_edits_reach_the_upstream_and_every_answer() {
    let api = OrdersApi::start("orders");
    let gw = Gateway::start(&edits(&api));
    let c = client();
    let r = c
        .get(gw.url("/debug/x"))
        .header("x-api-key", "test")
        .header("x-tenant", "forged")
        .header("x-via", "1.1 corp-proxy")
        .header("x-secret", "s3cret")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-served-by"], "floodgate");
    assert_eq!(r.headers()["x-key"], "acme-prod");
    let v: Value = r.json().await.unwrap();
    let h = &v["headers"];
    assert_eq!(
        h["x-tenant"], "acme",
        "set replaces what the client sent: {h}"
    );
    assert_eq!(h["x-client"], "127.0.0.1");
    assert_eq!(h["x-plan"], "pro");
    assert_eq!(h["x-via"], "1.1 corp-proxy, floodgate-edited");
    assert!(h.get("x-secret").is_none(), "{h}");

    // floodgate's own answers get the response edits too: 429 and 401.
    let mut last = None;
    for _ in 0..2 {
        last = Some(
            c.get(gw.url("/debug/x"))
                .header("x-api-key", "test")
                .send()
                .await
                .unwrap(),
        );
    }
    let r = last.unwrap();
    assert_eq!(r.status(), 429);
    assert_eq!(r.headers()["x-served-by"], "floodgate");
    assert_eq!(r.headers()["x-key"], "acme-prod");
    let cache: Vec<_> = r.headers().get_all("cache-control").iter().collect();
    assert_eq!(
        cache,
        ["no-store", "private"],
        "add keeps floodgate's own value"
    );
    assert!(r.headers().contains_key("retry-after"));
    let r = c
        .get(gw.url("/debug/x"))
        .header("x-api-key", "nope")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(r.headers()["x-served-by"], "floodgate");
    assert!(
        r.headers().get("x-key").is_none(),
        "no key, no value, no header"
    );
}

fn ip_lists(api: &OrdersApi) -> String {
    format!(
        r#"{upstream}
[[routes]]
name = "internal"
match = {{ path_prefix = "/debug/internal" }}
upstream = "orders"
auth = "none"
allow_ips = ["10.0.0.0/8", "2001:db8::/32"]

[[routes]]
name = "open"
upstream = "orders"
auth = "none"
deny_ips = ["203.0.113.0/24", "198.51.100.7"]

[[rules]]
name = "all-traffic"
key = ["route"]
algorithm = "fixed_window"
limit = 3
window = "1h"
"#,
        upstream = orders_upstream(&[api.addr])
    )
}

#[tokio::test]
async fn ip_lists_refuse_before_anything_is_charged_or_forwarded() {
    let api = OrdersApi::start("orders");
    let gw = Gateway::start_with(
        "trusted_proxies = [\"127.0.0.1/32\"]\n",
        &ip_lists(&api),
        &[],
    );
    let c = client();
    let served = get_json(&c, format!("http://{}/debug/load", api.addr)).await["total"]
        .as_u64()
        .unwrap();
    let get = |path: &str, xff: Option<&str>| {
        let mut r = c.get(gw.url(path));
        if let Some(x) = xff {
            r = r.header("x-forwarded-for", x);
        }
        r.send()
    };
    // Through the trusted proxy (the loopback peer), the client is the forwarded address.
    for _ in 0..5 {
        let r = get("/debug/x", Some("203.0.113.9")).await.unwrap();
        assert_eq!(r.status(), 403);
        assert_eq!(r.headers()["content-type"], "application/problem+json");
        let r = get("/debug/internal/x", Some("192.0.2.1")).await.unwrap();
        assert_eq!(r.status(), 403, "not in the allow list");
    }
    let r = get("/debug/x", Some("198.51.100.7, 203.0.113.200"))
        .await
        .unwrap();
    assert_eq!(r.status(), 403, "the rightmost untrusted hop is the client");
    // None of the refused requests was charged: the route's rule still has all three.
    assert_eq!(
        get("/debug/x", Some("192.0.2.1")).await.unwrap().status(),
        200
    );
    assert_eq!(
        get("/debug/internal/y", Some("10.9.8.7"))
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(
        get("/debug/internal/z", Some("2001:db8::5"))
            .await
            .unwrap()
            .status(),
        200
    );
    // The direct peer (127.0.0.1, no forwarded address) is not in the internal allow list.
    assert_eq!(get("/debug/internal/x", None).await.unwrap().status(), 403);
    let metrics = get_text(&c, gw.admin_url("/metrics")).await;
    assert_eq!(
        metric_value(&metrics, "floodgate_ip_refused_total{route=\"open\"}"),
        Some(6.0)
    );
    assert_eq!(
        metric_value(&metrics, "floodgate_ip_refused_total{route=\"internal\"}"),
        Some(6.0)
    );
    // Nothing refused reached the upstream: it served the two admitted requests only.
    let api_load = get_json(&c, format!("http://{}/debug/load", api.addr)).await;
    assert_eq!(api_load["total"].as_u64(), Some(served + 3), "{api_load}");

    // [server] lists cover every route, and paths no route matches.
    let strict = Gateway::start_with("deny_ips = [\"127.0.0.0/8\"]\n", &ip_lists(&api), &[]);
    let r = c.get(strict.url("/debug/x")).send().await.unwrap();
    assert_eq!(r.status(), 403);
    let metrics = get_text(&c, strict.admin_url("/metrics")).await;
    assert_eq!(
        metric_value(&metrics, "floodgate_ip_refused_total{route=\"open\"}"),
        Some(1.0)
    );
}

fn escapes(api: &OrdersApi) -> String {
    format!(
        r#"{DEMO_KEYS}{upstream}
[[routes]]
name = "orders"
match = {{ path_prefix = "/debug/orders" }}
upstream = "orders"
auth = "required"

[[routes]]
name = "api"
match = {{ path_prefix = "/api" }}
upstream = "orders"
auth = "none"
prefix_rewrite = "/debug/public"

[[routes]]
name = "public"
upstream = "orders"
auth = "none"

[[rules]]
name = "private-files"
match = {{ path_prefix = "/debug/files/private" }}
key = ["ip"]
algorithm = "fixed_window"
limit = 1000
window = "1h"
"#,
        upstream = orders_upstream(&[api.addr])
    )
}

#[tokio::test]
async fn escaped_separators_cannot_reach_a_route_through_a_catch_all() {
    let api = OrdersApi::start("orders");
    let gw = Gateway::start_with("escaped_slashes = \"keep\"\n", &escapes(&api), &[]);
    let c = client();
    let before = get_json(&c, format!("http://{}/debug/load", api.addr)).await["total"].clone();
    for path in [
        "/debug/orders%2F1",
        "/debug/orders%2f1",
        "/debug/orders%3Bx",
        "/debug/orders%5C1",
        "/debug/x/..%2Forders",
        "/debug%2Forders/1",
        // Reads as the api route either way, but the kept `..%2F` would climb out of the
        // rewrite's target once the backend decodes it.
        "/api/..%2Fapi",
        // The same route either way, but a rule counts one reading and not the other.
        "/debug/files/private%2Fx",
    ] {
        let r = c.get(gw.url(path)).send().await.unwrap();
        assert_eq!(r.status(), 400, "{path} went through");
        assert_eq!(r.headers()["content-type"], "application/problem+json");
    }
    let after = get_json(&c, format!("http://{}/debug/load", api.addr)).await["total"].clone();
    assert_eq!(before, after, "a refused path reached the upstream");
    // A kept escape that reads as the same route either way is forwarded as it was kept.
    let (s, v) = echo(&c, gw.url("/debug/files/a%2Fb")).await;
    assert_eq!((s, v["path"].as_str()), (200, Some("/debug/files/a%2Fb")));
    let (s, v) = echo(&c, gw.url("/api/a%2Fb")).await;
    assert_eq!((s, v["path"].as_str()), (200, Some("/debug/public/a%2Fb")));
    // The protected route itself still wants its key.
    assert_eq!(
        c.get(gw.url("/debug/orders/1"))
            .send()
            .await
            .unwrap()
            .status(),
        401
    );
}

fn cors(api: &OrdersApi) -> String {
    format!(
        r#"{DEMO_KEYS}{upstream}
[[routes]]
name = "orders"
match = {{ path_prefix = "/debug", methods = ["GET", "POST"] }}
upstream = "orders"
auth = "required"
cors = {{ allow_origins = ["http://app.test", "https://*.example.com"], max_age = "10m", expose_headers = ["X-Total"] }}
deny_ips = ["203.0.113.0/24"]

[[rules]]
name = "per-key"
key = ["api_key"]
algorithm = "fixed_window"
limit = 1
window = "1h"

[[rules]]
name = "preflights"
match = {{ methods = ["OPTIONS"] }}
key = ["ip"]
algorithm = "fixed_window"
limit = 3
window = "1h"
"#,
        upstream = orders_upstream(&[api.addr])
    )
}

#[tokio::test]
async fn cors_preflights_are_answered_at_the_edge_and_every_answer_carries_cors() {
    let api = OrdersApi::start("orders");
    let gw = Gateway::start_with("trusted_proxies = [\"127.0.0.1/32\"]\n", &cors(&api), &[]);
    let c = client();
    let load = || get_json(&c, format!("http://{}/debug/load", api.addr));
    let before = load().await["total"].clone();
    let preflight = |origin: &str| {
        c.request(reqwest::Method::OPTIONS, gw.url("/debug/orders"))
            .header("origin", origin)
            .header("access-control-request-method", "GET")
            .header("access-control-request-headers", "x-api-key")
            .send()
    };
    let r = preflight("http://app.test").await.unwrap();
    assert_eq!(r.status(), 204, "answered before authentication");
    let h = r.headers();
    assert_eq!(h["access-control-allow-origin"], "http://app.test");
    assert_eq!(h["access-control-allow-headers"], "x-api-key");
    assert_eq!(h["access-control-max-age"], "600");
    assert!(h["access-control-allow-methods"]
        .to_str()
        .unwrap()
        .contains("GET"));
    assert!(h["vary"].to_str().unwrap().contains("Origin"));
    let r = preflight("https://shop.example.com").await.unwrap();
    assert_eq!(
        r.headers()["access-control-allow-origin"],
        "https://shop.example.com"
    );
    let r = preflight("https://evil.test").await.unwrap();
    assert_eq!(r.status(), 204);
    assert!(
        r.headers().get("access-control-allow-origin").is_none(),
        "an origin not allowed gets no CORS header"
    );
    // The rule that names OPTIONS limits a flood of them, and its 429 carries CORS too.
    let r = preflight("http://app.test").await.unwrap();
    assert_eq!(r.status(), 429);
    assert_eq!(
        r.headers()["access-control-allow-origin"],
        "http://app.test"
    );
    assert_eq!(load().await["total"], before, "a preflight was forwarded");

    // The per-key rule was not charged by the preflights: the first real request passes.
    let get = |key: &str| {
        c.get(gw.url("/debug/orders"))
            .header("origin", "http://app.test")
            .header("x-api-key", key)
            .send()
    };
    let r = get("test").await.unwrap();
    assert_eq!(r.status(), 200);
    let exposed = r.headers()["access-control-expose-headers"]
        .to_str()
        .unwrap()
        .to_owned();
    for name in ["RateLimit", "RateLimit-Policy", "Retry-After", "X-Total"] {
        assert!(exposed.contains(name), "{exposed}");
    }
    assert_eq!(
        r.headers()["access-control-allow-origin"],
        "http://app.test"
    );
    assert!(r.headers().contains_key("ratelimit"));
    // floodgate's own 429 and 401 carry the CORS headers.
    let r = get("test").await.unwrap();
    assert_eq!(r.status(), 429);
    assert_eq!(
        r.headers()["access-control-allow-origin"],
        "http://app.test"
    );
    assert!(r.headers().contains_key("retry-after"));
    assert!(r.headers()["vary"].to_str().unwrap().contains("Origin"));
    let r = get("wrong").await.unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(
        r.headers()["access-control-allow-origin"],
        "http://app.test"
    );
    // floodgate's 403 of the route's deny_ips carries them too.
    let r = c
        .get(gw.url("/debug/orders"))
        .header("origin", "http://app.test")
        .header("x-forwarded-for", "203.0.113.5")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    assert_eq!(
        r.headers()["access-control-allow-origin"],
        "http://app.test"
    );
    // Without an allowed origin, no CORS header at all, and Vary keeps caches apart.
    let r = c
        .get(gw.url("/debug/orders"))
        .header("origin", "https://evil.test")
        .header("x-api-key", "partner")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.headers().get("access-control-allow-origin").is_none());
    assert!(r.headers()["vary"].to_str().unwrap().contains("Origin"));
    // An OPTIONS that is no preflight is routed as itself (this route takes GET and POST only).
    let r = c
        .request(reqwest::Method::OPTIONS, gw.url("/debug/orders"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
}
