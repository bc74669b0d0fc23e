//! The admission core without a socket: routing, auth modes, every rule outcome and every
//! answer, against a config parsed from text and the in-process limiter.

use std::net::IpAddr;
use std::path::Path;

use http::{HeaderMap, Method, Uri};

use super::*;
use crate::config::Config;
use crate::limiter::engine::Limiter;

const CONFIG: &str = r#"
[[auth.keys]]
id = "acme-prod"
secret = "test"
user = "acme"
plan = "pro"

[[upstreams]]
name = "orders"
targets = ["127.0.0.1:9"]

[[routes]]
name = "api-host"
match = { host = "api.example.com", path_prefix = "/hosted" }
upstream = "orders"
auth = "none"

[[routes]]
name = "orders"
match = { path_prefix = "/orders" }
upstream = "orders"
auth = "required"

[[routes]]
name = "catalog"
match = { path_prefix = "/catalog" }
upstream = "orders"
auth = "optional"

[[routes]]
name = "open"
match = { path_prefix = "/open" }
upstream = "orders"
auth = "none"

[[rules]]
name = "orders-per-key"
match = { route = "orders" }
key = ["api_key"]
algorithm = "fixed_window"
limit = 2
window = "1m"

[[rules]]
name = "open-forbidden"
match = { route = "open", path = "/open/strict" }
key = ["ip"]
algorithm = "fixed_window"
limit = 1
window = "1m"
status = 403

[[rules]]
name = "open-shadow"
match = { route = "open", path = "/open/shadow" }
key = ["ip"]
algorithm = "fixed_window"
limit = 1
window = "1m"
shadow = true

[[rules]]
name = "hosted"
match = { host = "api.example.com" }
key = ["ip"]
algorithm = "fixed_window"
limit = 1
window = "1m"

[[rules]]
name = "in-flight"
match = { route = "catalog" }
key = ["ip"]
algorithm = "concurrency"
limit = 1
"#;

struct Fixture {
    cfg: Config,
    limiter: Limiter,
}

fn fixture(text: &str) -> Fixture {
    let cfg = Config::from_str(Path::new("/tmp/admission-test/gateway.toml"), text)
        .unwrap_or_else(|e| panic!("{e}"));
    let limiter = Limiter::new(&cfg.store);
    Fixture { cfg, limiter }
}

/// A request: `target` as the client sent it, `headers` as (name, value) pairs.
struct Req {
    method: Method,
    uri: Uri,
    raw: String,
    headers: HeaderMap,
    peer: IpAddr,
}

fn req(target: &str, headers: &[(&str, &str)]) -> Req {
    let mut h = HeaderMap::new();
    for (k, v) in headers {
        h.append(
            http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
            v.parse().unwrap(),
        );
    }
    // Pingora keeps only the path of an absolute-form target in the URI.
    let path_only = match target.split_once("://") {
        Some((_, rest)) => rest.find('/').map_or("/", |i| &rest[i..]).to_string(),
        None => target.to_string(),
    };
    Req {
        method: Method::GET,
        uri: path_only.parse().unwrap(),
        raw: target.to_string(),
        headers: h,
        peer: "192.0.2.7".parse().unwrap(),
    }
}

impl Fixture {
    async fn admit(&self, r: &Req) -> Admission {
        let request = Request {
            method: &r.method,
            uri: &r.uri,
            raw_target: r.raw.as_bytes(),
            headers: &r.headers,
            peer: r.peer,
            request_id: "req-1",
            traced: false,
        };
        admit(&self.cfg, &self.limiter, &request).await
    }
}

fn answer(a: &Admission) -> &Answer {
    match &a.next {
        Next::Answer(ans) => ans,
        Next::Forward { .. } | Next::Preflight(_) => {
            panic!("expected an answer, got a forward: {a:?}")
        }
    }
}

fn forwarded(a: &Admission) -> bool {
    matches!(a.next, Next::Forward { .. })
}

fn body(a: &Answer) -> serde_json::Value {
    serde_json::from_slice(&a.problem.to_body()).unwrap()
}

#[tokio::test]
async fn routes_first_match_and_404() {
    let f = fixture(CONFIG);
    let a = f.admit(&req("/nowhere", &[("host", "x")])).await;
    let ans = answer(&a);
    assert_eq!(ans.status(), 404);
    assert_eq!(body(ans)["detail"], "no route matches /nowhere");
    assert_eq!(body(ans)["request_id"], "req-1");
    assert_eq!(a.route, None);

    let a = f.admit(&req("/open/x", &[("host", "x")])).await;
    assert!(forwarded(&a));
    assert_eq!(f.cfg.routes[a.route.unwrap()].name.as_ref(), "open");
    assert!(
        a.target.is_none(),
        "an already normal target is forwarded as it is"
    );
}

#[tokio::test]
async fn auth_modes() {
    let f = fixture(CONFIG);
    // required: missing, wrong, right (header or bearer)
    let a = f.admit(&req("/orders", &[])).await;
    assert_eq!(answer(&a).status(), 401);
    assert_eq!(
        answer(&a).challenge(),
        Some(crate::wire::response::CHALLENGE_MISSING)
    );
    let a = f.admit(&req("/orders", &[("x-api-key", "nope")])).await;
    assert_eq!(
        answer(&a).challenge(),
        Some(crate::wire::response::CHALLENGE_INVALID)
    );
    let a = f
        .admit(&req("/orders", &[("authorization", "Bearer test")]))
        .await;
    assert!(forwarded(&a));
    assert_eq!(a.identity.as_ref().unwrap().id, "acme-prod");
    // An empty header is absent: the Bearer token decides.
    let a = f
        .admit(&req(
            "/orders",
            &[("x-api-key", " "), ("authorization", "Bearer test")],
        ))
        .await;
    assert!(forwarded(&a));
    // optional: anonymous passes, a wrong key does not
    let a = f.admit(&req("/catalog/1", &[])).await;
    assert!(forwarded(&a) && a.identity.is_none());
    let a = f.admit(&req("/catalog/1", &[("x-api-key", "nope")])).await;
    assert_eq!(answer(&a).status(), 401);
    // none: keys are not even read
    let a = f.admit(&req("/open/x", &[("x-api-key", "nope")])).await;
    assert!(forwarded(&a) && a.identity.is_none());
}

#[tokio::test]
async fn malformed_hosts_and_paths_are_400_and_close() {
    let f = fixture(CONFIG);
    for r in [
        req("/open/x", &[("host", "api.example.com:")]),
        req("/open/x", &[("host", ":abc")]),
        req("/open/x", &[("host", "a.example"), ("host", "b.example")]),
        req("/open/a%2Fb", &[]),
        req("/open/a%zz", &[]),
    ] {
        let a = f.admit(&r).await;
        let ans = answer(&a);
        assert_eq!(ans.status(), 400, "{}", r.raw);
        assert!(ans.close);
        assert_eq!(body(ans)["type"], "urn:floodgate:problem:bad-request");
    }
}

#[tokio::test]
async fn normalized_targets_and_absolute_form() {
    let f = fixture(CONFIG);
    // A re-spelled path is routed (and authenticated) as what it is, and forwarded normalized.
    let a = f.admit(&req("//x/../orders/1?a=b", &[])).await;
    assert_eq!(answer(&a).status(), 401);
    let a = f.admit(&req("/open//x/./y/", &[])).await;
    assert_eq!(a.target.as_ref().unwrap(), "/open/x/y/");
    // Absolute form without Host: the authority is the host for routes and rules, and the
    // Host to forward.
    let a = f.admit(&req("http://API.example.com/hosted/1", &[])).await;
    assert!(forwarded(&a), "{a:?}");
    assert_eq!(a.host.as_deref(), Some("API.example.com"));
    assert_eq!(a.target.as_ref().unwrap(), "/hosted/1");
    let a = f
        .admit(&req("/hosted/1", &[("host", "api.example.com.:8080")]))
        .await;
    assert_eq!(
        answer(&a).status(),
        429,
        "the host rule counts both spellings"
    );
}

#[tokio::test]
async fn rule_outcomes() {
    let f = fixture(CONFIG);
    let key = [("x-api-key", "test")];
    // Allowed, with RateLimit fields; then rejected with Retry-After and the rule named.
    for remaining in ["1", "0"] {
        let a = f.admit(&req("/orders", &key)).await;
        let Next::Forward { ratelimit, delay } = &a.next else {
            panic!("{a:?}")
        };
        assert!(delay.is_zero());
        let rl = ratelimit.as_ref().unwrap();
        assert!(rl.state().contains(&format!("r={remaining}")), "{rl:?}");
    }
    let a = f.admit(&req("/orders", &key)).await;
    let ans = answer(&a);
    assert_eq!(ans.status(), 429);
    assert!(ans.retry_after().unwrap() >= 1);
    assert_eq!(ans.rejected_by().as_deref(), Some("orders-per-key"));
    assert!(ans.ratelimit.as_ref().unwrap().state().contains("r=0"));
    assert_eq!(body(ans)["violated_rules"][0], "orders-per-key");
    // A rule's own status.
    assert!(forwarded(&f.admit(&req("/open/strict", &[])).await));
    let a = f.admit(&req("/open/strict", &[])).await;
    assert_eq!(answer(&a).status(), 403);
    assert_eq!(body(answer(&a))["title"], "Request Rejected");
    // Shadow rules never reject.
    for _ in 0..3 {
        assert!(forwarded(&f.admit(&req("/open/shadow", &[])).await));
    }
}

#[tokio::test]
async fn concurrency_slots_are_held_until_they_drop() {
    let f = fixture(CONFIG);
    let first = f.admit(&req("/catalog/1", &[])).await;
    assert!(forwarded(&first));
    assert!(first.slots.is_some());
    let second = f.admit(&req("/catalog/1", &[])).await;
    assert_eq!(answer(&second).status(), 429);
    drop(first);
    assert!(forwarded(&f.admit(&req("/catalog/1", &[])).await));
}

#[tokio::test]
async fn a_down_store_with_closed_rules_is_503() {
    // Nothing listens on port 1 of loopback: every decision fails fast.
    let f = fixture(
        r#"
[store]
backend = "redis"
url = "redis://127.0.0.1:1"
timeout = "50ms"

[[upstreams]]
name = "orders"
targets = ["127.0.0.1:9"]

[[routes]]
name = "all"
upstream = "orders"
auth = "none"

[[rules]]
name = "strict"
key = ["ip"]
algorithm = "fixed_window"
limit = 5
window = "1m"
scope = "global"
on_store_error = "closed"
"#,
    );
    let a = f.admit(&req("/x", &[])).await;
    let ans = answer(&a);
    assert_eq!(ans.status(), 503);
    assert_eq!(
        body(ans)["type"],
        "urn:floodgate:problem:limiter-unavailable"
    );
    assert!(ans.retry_after().is_some());
    assert_eq!(ans.rejected_by().as_deref(), Some("strict"));
}

/// Routes and rules that read headers and query parameters, for the spelling tests.
const KEYED: &str = r#"
[server]
headers_with_underscores = "reject"

[[upstreams]]
name = "hashed"
targets = ["127.0.0.1:9", "127.0.0.1:10"]
balance = "consistent"
hash_key = ["query:cart", "header:x-cart"]

[[upstreams]]
name = "plain"
targets = ["127.0.0.1:9"]

[[routes]]
name = "carts"
match = { path_prefix = "/carts" }
upstream = "hashed"
auth = "none"

[[routes]]
name = "login"
match = { path = "/login", methods = ["POST"] }
upstream = "plain"
auth = "none"

[[routes]]
name = "all"
upstream = "plain"
auth = "none"

[[rules]]
name = "per-user"
match = { path_prefix = "/users" }
key = ["query:user"]
algorithm = "fixed_window"
limit = 1
window = "1m"

[[rules]]
name = "shadow-per-region"
match = { path_prefix = "/regions" }
key = ["header:x-region"]
algorithm = "fixed_window"
limit = 1
window = "1m"
shadow = true

[[rules]]
name = "per-tenant"
match = { path_prefix = "/tenants", header = ["x-tier", "free"] }
key = ["header:x-tenant"]
algorithm = "fixed_window"
limit = 1
window = "1m"
"#;

fn bad_request_detail(a: &Admission) -> String {
    let ans = answer(a);
    assert_eq!(ans.status(), 400, "{a:?}");
    assert!(ans.close);
    assert_eq!(body(ans)["type"], "urn:floodgate:problem:bad-request");
    body(ans)["detail"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn methods_that_are_not_upper_case_are_400() {
    let f = fixture(KEYED);
    for m in ["post", "Post", "pOST"] {
        let mut r = req("/login", &[]);
        r.method = Method::from_bytes(m.as_bytes()).unwrap();
        let detail = bad_request_detail(&f.admit(&r).await);
        assert!(detail.contains("upper-case"), "{detail}");
    }
    let mut r = req("/login", &[]);
    r.method = Method::POST;
    let a = f.admit(&r).await;
    assert_eq!(f.cfg.routes[a.route.unwrap()].name.as_ref(), "login");
}

#[tokio::test]
async fn repeated_content_length_and_underscores_are_400() {
    let f = fixture(KEYED);
    for headers in [
        &[("content-length", "5, 5")][..],
        &[("content-length", "0"), ("content-length", "0")],
    ] {
        let detail = bad_request_detail(&f.admit(&req("/x", headers)).await);
        assert!(detail.contains("Content-Length"), "{detail}");
    }
    assert!(forwarded(
        &f.admit(&req("/x", &[("content-length", "0")])).await
    ));
    // headers_with_underscores = "reject" in this config.
    let detail = bad_request_detail(&f.admit(&req("/x", &[("x_floodgate_user", "a")])).await);
    assert!(detail.contains("underscore"), "{detail}");
    // The default drops them when forwarding instead (crate::wire::header_policy).
    let lax = fixture(CONFIG);
    assert!(forwarded(
        &lax.admit(&req("/open/x", &[("x_floodgate_user", "a")]))
            .await
    ));
}

#[tokio::test]
async fn a_target_that_is_not_utf8_is_400() {
    let f = fixture(KEYED);
    let mut r = req("/x", &[]);
    r.raw = "/x".into();
    let ok = f.admit(&r).await;
    assert!(forwarded(&ok));
    let request = Request {
        method: &r.method,
        uri: &r.uri,
        raw_target: b"/x\xc0\xae",
        headers: &r.headers,
        peer: r.peer,
        request_id: "req-1",
        traced: false,
    };
    let a = admit(&f.cfg, &f.limiter, &request).await;
    assert!(bad_request_detail(&a).contains("UTF-8"));
}

#[tokio::test]
async fn repeated_values_that_rules_or_hashing_read_are_400() {
    let f = fixture(KEYED);
    // Consistent hashing on `cart`: one target per cart, whichever spelling.
    for r in [
        req("/carts/1?cart=a&cart=b", &[]),
        req("/carts/1?cart=a&%63art=a", &[]),
        req("/carts/1", &[("x-cart", "a"), ("x-cart", "b")]),
    ] {
        let detail = bad_request_detail(&f.admit(&r).await);
        assert!(detail.contains("cart"), "{detail}");
    }
    assert!(forwarded(
        &f.admit(&req("/carts/1?cart=a", &[("x-cart", "a")])).await
    ));
    // The hash_key of another route's upstream is not read.
    assert!(forwarded(&f.admit(&req("/other?cart=a&cart=b", &[])).await));

    // A rule's query key: decoded, and repetition refused.
    assert!(forwarded(&f.admit(&req("/users/1?user=alice", &[])).await));
    for q in ["user=%61lice", "%75ser=alice", "x=1;user=alice"] {
        let a = f.admit(&req(&format!("/users/1?{q}"), &[])).await;
        assert_eq!(answer(&a).status(), 429, "{q} is alice's counter");
    }
    let detail = bad_request_detail(&f.admit(&req("/users/1?user=bob&user=alice", &[])).await);
    assert!(detail.contains("\"user\""), "{detail}");
    // A rule that does not apply to the path does not care.
    assert!(forwarded(
        &f.admit(&req("/x?user=bob&user=alice", &[])).await
    ));

    // A header the rule matches on, or counts by, sent twice.
    let tier_twice = [("x-tier", "pro"), ("x-tier", "free"), ("x-tenant", "t1")];
    assert!(bad_request_detail(&f.admit(&req("/tenants/1", &tier_twice)).await).contains("x-tier"));
    let tenant_twice = [("x-tier", "free"), ("x-tenant", "t1"), ("x-tenant", "t2")];
    assert!(
        bad_request_detail(&f.admit(&req("/tenants/1", &tenant_twice)).await).contains("x-tenant")
    );
    // A shadow rule never refuses, not even a request it cannot count.
    let regions = [("x-region", "eu"), ("x-region", "us")];
    assert!(forwarded(&f.admit(&req("/regions/1", &regions)).await));
    let once = [("x-tier", "free"), ("x-tenant", "t1")];
    assert!(forwarded(&f.admit(&req("/tenants/1", &once)).await));
    assert_eq!(
        answer(&f.admit(&req("/tenants/1", &once)).await).status(),
        429
    );
}
