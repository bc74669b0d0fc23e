//! Request shapes that try to walk past a limit: re-spelled paths, odd hosts, absolute-form
//! targets and IPv4-mapped peers. Raw sockets, so that no client library tidies the request.

use std::net::SocketAddr;

use crate::common::*;
use crate::spellings::{body, send};

/// [`send`] of a head written as text.
fn raw(addr: SocketAddr, head: &str) -> (u16, String) {
    send(addr, head.as_bytes())
}

fn get(addr: SocketAddr, target: &str, headers: &str) -> (u16, String) {
    raw(
        addr,
        &format!("GET {target} HTTP/1.1\r\nhost: floodgate.test{headers}"),
    )
}

fn paths_config(api: SocketAddr) -> String {
    format!(
        r#"{DEMO_KEYS}
{}
[[routes]]
name = "orders"
match = {{ path_prefix = "/orders" }}
upstream = "orders"
auth = "required"

[[routes]]
name = "public"
match = {{ path_prefix = "/" }}
upstream = "orders"
auth = "none"

[[rules]]
name = "per-order"
match = {{ route = "orders" }}
key = ["api_key", "path"]
algorithm = "fixed_window"
limit = 3
window = "1h"

[[rules]]
name = "debug-paths"
match = {{ path_prefix = "/debug/limited" }}
key = ["ip", "path"]
algorithm = "fixed_window"
limit = 2
window = "1h"
"#,
        orders_upstream(&[api])
    )
}

#[test]
fn respelled_paths_are_one_resource_and_reach_the_upstream_normalized() {
    let api = OrdersApi::start("orders-1");
    let gw = Gateway::start(&paths_config(api.addr));
    let key = "\r\nx-api-key: test";

    // `//orders` is the orders route: its auth applies (today the catch-all served it).
    assert_eq!(get(gw.addr, "//orders", "").0, 401);
    assert_eq!(get(gw.addr, "/x/../orders", "").0, 401);
    assert_eq!(get(gw.addr, "/%6Frders", "").0, 401);

    // Five spellings of /orders/1, one counter of 3.
    let spellings = [
        "/orders/1",
        "/orders/1/",
        "/orders/1//",
        "//orders/./1",
        "/%6frders/%31",
    ];
    let statuses: Vec<u16> = spellings.iter().map(|p| get(gw.addr, p, key).0).collect();
    assert_eq!(statuses, [200, 200, 200, 429, 429], "{spellings:?}");

    // The upstream serves exactly what was charged.
    let (status, answer) = get(gw.addr, "/debug//a/./b/../c?x=1", "");
    assert_eq!(status, 200, "{answer}");
    let echoed = body(&answer);
    assert_eq!(echoed["path"], "/debug/a/c");
    assert_eq!(echoed["query"], "x=1");

    // `..` never climbs above the root.
    let (_, answer) = get(gw.addr, "/../../debug/root", "");
    assert_eq!(body(&answer)["path"], "/debug/root");

    // The `path` key part ignores a trailing slash.
    let limited: Vec<u16> = ["/debug/limited/x", "/debug/limited/x/", "/debug/limited//x"]
        .iter()
        .map(|p| get(gw.addr, p, "").0)
        .collect();
    assert_eq!(limited, [200, 200, 429]);

    // Encoded slashes are refused by default, with a problem+json 400.
    let (status, answer) = get(gw.addr, "/orders%2F1", key);
    assert_eq!(status, 400, "{answer}");
    assert!(answer.contains("application/problem+json"), "{answer}");
    assert_eq!(body(&answer)["type"], "urn:floodgate:problem:bad-request");
    assert_eq!(get(gw.addr, "/debug/a%5cb", "").0, 400);
    // So is a broken escape.
    assert_eq!(get(gw.addr, "/debug/a%zz", "").0, 400);
}

#[test]
fn escaped_slashes_keep_and_unescape() {
    let api = OrdersApi::start("orders-1");
    let keep = Gateway::start_with("escaped_slashes = \"keep\"\n", &paths_config(api.addr), &[]);
    let (status, answer) = get(keep.addr, "/debug/a%2fb", "");
    assert_eq!(status, 200, "{answer}");
    assert_eq!(body(&answer)["path"], "/debug/a%2Fb");

    let unescape = Gateway::start_with(
        "escaped_slashes = \"unescape\"\n",
        &paths_config(api.addr),
        &[],
    );
    let (status, answer) = get(unescape.addr, "/debug/a%2F..%2Fb", "");
    assert_eq!(status, 200, "{answer}");
    assert_eq!(body(&answer)["path"], "/debug/b");
    // Decoded, `/%2Forders` is `//orders`: the orders route and its auth.
    assert_eq!(get(unescape.addr, "/%2Forders", "").0, 401);
}

fn hosts_config(api: SocketAddr) -> String {
    format!(
        r#"{}
[[routes]]
name = "api"
match = {{ host = "api.example.com", path_prefix = "/debug" }}
upstream = "orders"
auth = "none"

[[routes]]
name = "other"
match = {{ path_prefix = "/debug" }}
upstream = "orders"
auth = "none"

[[rules]]
name = "api-host"
match = {{ host = "API.example.com." }}
key = ["ip"]
algorithm = "fixed_window"
limit = 1
window = "1h"
"#,
        orders_upstream(&[api])
    )
}

#[test]
fn hosts_are_normalized_and_absolute_targets_use_their_authority() {
    let api = OrdersApi::start("orders-1");
    let gw = Gateway::start(&hosts_config(api.addr));
    let on =
        |target: &str, host: &str| raw(gw.addr, &format!("GET {target} HTTP/1.1\r\nhost: {host}"));
    // Case, trailing dot and port do not make another host: the first request is charged,
    // the second (spelled differently) is refused.
    assert_eq!(on("/debug/x", "API.Example.COM.:8080").0, 200);
    assert_eq!(on("/debug/x", "api.example.com").0, 429);
    // Malformed hosts are refused.
    let (status, answer) = on("/debug/x", "api.example.com:");
    assert_eq!(status, 400, "{answer}");
    assert!(
        answer.contains("urn:floodgate:problem:bad-request"),
        "{answer}"
    );
    assert_eq!(on("/debug/x", ":abc").0, 400);
    // Another host is another route, not limited by the host rule.
    assert_eq!(on("/debug/x", "other.example.com").0, 200);
    // An absolute-form target names the host (RFC 9112 §3.2.2): without a Host header the
    // host rule still applies (today it was skipped), and the upstream sees that host and an
    // origin-form target.
    let (status, answer) = raw(gw.addr, "GET http://api.example.com/debug/y HTTP/1.1");
    assert_eq!(status, 429, "{answer}");
    // A Host that disagrees with the target is refused (by Pingora's parser).
    assert_eq!(
        on("http://api.example.com/debug/y", "other.example.com").0,
        400
    );

    let fresh = Gateway::start(&hosts_config(api.addr));
    let (status, answer) = raw(
        fresh.addr,
        "GET http://Api.Example.com:80/debug/y?q=1 HTTP/1.1",
    );
    assert_eq!(status, 200, "{answer}");
    let echoed = body(&answer);
    assert_eq!(echoed["path"], "/debug/y");
    assert_eq!(echoed["query"], "q=1");
    assert_eq!(echoed["headers"]["host"], "Api.Example.com:80");
    assert_eq!(
        raw(fresh.addr, "GET http://api.example.com/debug/y HTTP/1.1").0,
        429
    );
}

#[test]
fn ipv4_mapped_peers_are_ipv4_for_trust_and_keys() {
    let api = OrdersApi::start("orders-1");
    let body = format!(
        r#"{}
[[routes]]
name = "all"
match = {{ path_prefix = "/" }}
upstream = "orders"
auth = "none"

[[rules]]
name = "per-client"
key = ["ip"]
algorithm = "fixed_window"
limit = 1
window = "1h"
"#,
        orders_upstream(&[api.addr])
    );
    // A dual-stack listener sees 127.0.0.1 as ::ffff:127.0.0.1.
    let gw = Gateway::start_custom(
        |addr, admin| {
            format!(
                "[server]\nlisten = [\"[::]:{}\"]\nadmin_listen = \"{admin}\"\nthreads = 1\ngrace_period = \"1s\"\ntrusted_proxies = [\"127.0.0.1\"]\n",
                addr.port()
            )
        },
        &body,
        &[],
    );
    let xff = |ip: &str| get(gw.addr, "/debug/x", &format!("\r\nx-forwarded-for: {ip}")).0;
    // The peer is a trusted proxy: each forwarded client has its own counter.
    assert_eq!(xff("203.0.113.1"), 200);
    assert_eq!(xff("203.0.113.1"), 429);
    assert_eq!(xff("203.0.113.2"), 200);
    // A mapped hop is the same client as its IPv4 form.
    assert_eq!(xff("::ffff:203.0.113.2"), 429);
}

/// Asserts a 404 the upstream answered, not one of floodgate's problem+json answers.
fn assert_upstreams_404((status, answer): &(u16, String)) {
    assert_eq!(*status, 404, "{answer}");
    assert!(
        !answer.contains("problem+json"),
        "the upstream's answer: {answer}"
    );
}

fn protected_config(api: SocketAddr) -> String {
    format!(
        r#"{DEMO_KEYS}
{}
[[routes]]
name = "orders"
match = {{ path_prefix = "/orders" }}
upstream = "orders"
auth = "required"

[[routes]]
name = "reports"
match = {{ path_prefix = "/debug/reports", methods = ["GET"] }}
upstream = "orders"
auth = "required"

[[routes]]
name = "files"
match = {{ path_prefix = "/debug/files" }}
upstream = "orders"
auth = "none"
escaped_slashes = "keep"

[[routes]]
name = "public"
match = {{ path_prefix = "/" }}
upstream = "orders"
auth = "none"

[[rules]]
name = "gets"
match = {{ path_prefix = "/debug/counted", methods = ["GET"] }}
key = ["ip"]
algorithm = "fixed_window"
limit = 1
window = "1h"
"#,
        orders_upstream(&[api])
    )
}

/// With a catch-all route in front of the same upstream, the spellings a backend serves as
/// a protected route get that route's auth, or a 400: `/orders.json` (Rails' orders index),
/// `/orders%2F1` and `/orders%3Bx` (backends that decode before routing), and HEAD on a GET
/// route or rule (every common framework serves HEAD with the GET handler). A route may opt
/// out of refusing encoded slashes with its own `escaped_slashes`.
#[test]
fn spellings_a_backend_serves_as_a_protected_route_are_covered() {
    let api = OrdersApi::start("orders-1");
    let gw = Gateway::start(&protected_config(api.addr));
    let key = "\r\nx-api-key: test";

    // A format suffix is the prefix's resource: its auth applies.
    assert_eq!(get(gw.addr, "/orders.json", "").0, 401);
    // With the key it passes to the upstream (the demo API has no `/orders.json`: its 404).
    assert_upstreams_404(&get(gw.addr, "/orders.json", key));
    // `/ordersfoo` is another segment: the catch-all's, no key needed (segment-wise prefixes,
    // as before).
    assert_upstreams_404(&get(gw.addr, "/ordersfoo", ""));
    // Encoded `/`, `\` and `;`, in any case, are refused with a problem+json 400.
    for target in [
        "/orders%2F1",
        "/orders%2f1",
        "/orders%5C1",
        "/orders%3Bx",
        "/orders%3bx",
    ] {
        let (status, answer) = get(gw.addr, target, "");
        assert_eq!(status, 400, "{target}: {answer}");
        assert!(
            answer.contains("application/problem+json"),
            "{target}: {answer}"
        );
        assert_eq!(body(&answer)["type"], "urn:floodgate:problem:bad-request");
    }
    // HEAD is GET to the backend: a GET route covers it, and a GET rule counts it.
    assert_eq!(
        raw(gw.addr, "HEAD /debug/reports HTTP/1.1\r\nhost: x").0,
        401
    );
    assert_eq!(get(gw.addr, "/debug/counted", "").0, 200);
    assert_eq!(
        raw(gw.addr, "HEAD /debug/counted HTTP/1.1\r\nhost: x").0,
        429
    );
    // A route that keeps encoded slashes as data gets them, as sent (hex upper-cased);
    // elsewhere they are still refused.
    let (status, answer) = get(gw.addr, "/debug/files/a%2fb%3Bc", "");
    assert_eq!(status, 200, "{answer}");
    assert_eq!(body(&answer)["path"], "/debug/files/a%2Fb%3Bc");
    assert_eq!(get(gw.addr, "/debug/other/a%2fb", "").0, 400);
}

/// A route stricter than the server: `[server] escaped_slashes = "keep"`, and the orders
/// route refuses them.
#[test]
fn a_route_can_refuse_what_the_server_keeps() {
    let api = OrdersApi::start("orders-1");
    let config = protected_config(api.addr).replace(
        "auth = \"required\"\n\n[[routes]]\nname = \"reports\"",
        "auth = \"required\"\nescaped_slashes = \"reject\"\n\n[[routes]]\nname = \"reports\"",
    );
    assert!(config.contains("escaped_slashes = \"reject\""));
    let gw = Gateway::start_with("escaped_slashes = \"keep\"\n", &config, &[]);
    assert_eq!(get(gw.addr, "/orders/a%2Fb", "\r\nx-api-key: test").0, 400);
    let (status, answer) = get(gw.addr, "/debug/a%2Fb", "");
    assert_eq!(status, 200, "{answer}");
    assert_eq!(body(&answer)["path"], "/debug/a%2Fb");
}

/// A case-insensitive backend serves `/ORDERS` as `/orders`: by default that spelling is not
/// the orders route's (it falls to the catch-all, as Envoy's and nginx's default matching
/// would), and with `case_sensitive = false` on the route it is, with the route's auth, and
/// the rules on its paths count every spelling as one.
#[test]
fn a_case_insensitive_route_covers_every_spelling_of_its_paths() {
    let api = OrdersApi::start("orders-1");
    let gw = Gateway::start(&protected_config(api.addr));
    // Case-sensitive by default: another resource to floodgate.
    let (status, answer) = get(gw.addr, "/ORDERS", "");
    assert_eq!(status, 404, "the catch-all's upstream answer: {answer}");
    drop(gw);

    let config = protected_config(api.addr)
        .replace(
            "name = \"orders\"\nmatch = { path_prefix = \"/orders\" }\nupstream = \"orders\"\nauth = \"required\"",
            "name = \"orders\"\nmatch = { path_prefix = \"/orders\" }\nupstream = \"orders\"\nauth = \"required\"\ncase_sensitive = false",
        )
        .replace(
            "match = { path_prefix = \"/debug/counted\", methods = [\"GET\"] }",
            "match = { path_prefix = \"/orders/counted\", methods = [\"GET\"] }",
        );
    assert!(config.contains("case_sensitive = false"), "{config}");
    let gw = Gateway::start(&config);
    for spelling in ["/ORDERS", "/Orders/1", "/oRdErS.json"] {
        let (status, answer) = get(gw.addr, spelling, "");
        assert_eq!(status, 401, "{spelling}: {answer}");
    }
    let key = "\r\nx-api-key: test";
    // Admitted and counted (the demo API has no such path: its 404).
    let (status, answer) = get(gw.addr, "/orders/counted", key);
    assert_eq!(status, 404, "{answer}");
    let (status, answer) = get(gw.addr, "/ORDERS/Counted", key);
    assert_eq!(status, 429, "one counter for every spelling: {answer}");
}
