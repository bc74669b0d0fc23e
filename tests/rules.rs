//! Rate-limit rules end to end through the binary: ordering, composite keys, all-or-nothing
//! charging, the exact header syntax, Retry-After honesty, shadow mode, shaping and
//! concurrency slots released on disconnect.

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

fn config(api: std::net::SocketAddr, rules: &str) -> String {
    format!(
        "{DEMO_KEYS}\n{}\n[[routes]]\nname = \"orders\"\nmatch = {{ path_prefix = \"/orders\" }}\nupstream = \"orders\"\nauth = \"optional\"\n\n[[routes]]\nname = \"debug\"\nmatch = {{ path_prefix = \"/debug\" }}\nupstream = \"orders\"\nauth = \"none\"\n{rules}",
        orders_upstream(&[api])
    )
}

fn header(r: &reqwest::Response, name: &str) -> String {
    r.headers()
        .get(name)
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default()
}

/// Parses `RateLimit` into (name, r, t) items, checking the structured-field syntax strictly.
fn parse_ratelimit(v: &str) -> Vec<(String, u64, u64)> {
    v.split(", ")
        .map(|item| {
            let mut parts = item.split(';');
            let name = parts.next().unwrap();
            assert!(
                name.starts_with('"') && name.ends_with('"') && name.len() > 2,
                "sf-string: {item}"
            );
            let mut r = None;
            let mut t = None;
            for p in parts {
                let (k, v) = p
                    .split_once('=')
                    .unwrap_or_else(|| panic!("param without value: {item}"));
                let n: u64 = v.parse().unwrap_or_else(|_| panic!("sf-integer: {item}"));
                match k {
                    "r" => r = Some(n),
                    "t" => t = Some(n),
                    other => panic!("unexpected parameter {other} in {item}"),
                }
            }
            (
                name.trim_matches('"').to_string(),
                r.expect("r"),
                t.expect("t"),
            )
        })
        .collect()
}

#[tokio::test]
async fn ordered_rules_composite_keys_and_header_syntax() {
    let api = OrdersApi::start("orders");
    let rules = r#"
[[rules]]
name = "per-key-and-path"
match = { route = "orders" }
key = ["api_key", "path"]
algorithm = "fixed_window"
limit = 2
window = "1h"

[[rules]]
name = "per-ip"
key = ["ip"]
algorithm = "token_bucket"
limit = 100
window = "1h"
burst = 50

[[rules]]
name = "hidden"
key = ["ip"]
algorithm = "fixed_window"
limit = 1000
window = "1h"
headers = false
"#;
    let gw = Gateway::start(&config(api.addr, rules));
    let c = client();
    let get =
        |path: &'static str, key: &'static str| c.get(gw.url(path)).header("x-api-key", key).send();

    let r = get("/orders/1", "test").await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        header(&r, "ratelimit-policy"),
        "\"per-key-and-path\";q=2;w=3600, \"per-ip\";q=100;w=3600",
        "rules in file order, hidden rule absent"
    );
    let items = parse_ratelimit(&header(&r, "ratelimit"));
    assert_eq!(items[0].0, "per-key-and-path");
    assert_eq!(items[0].1, 1);
    assert!(items[0].2 <= 3600);
    assert_eq!(items[1], ("per-ip".to_string(), 49, items[1].2));

    // Composite key: another path or another key is another counter.
    assert_eq!(get("/orders/1", "test").await.unwrap().status(), 200);
    let r = get("/orders/1", "test").await.unwrap();
    assert_eq!(r.status(), 429);
    assert_eq!(get("/orders/2", "test").await.unwrap().status(), 200);
    assert_eq!(get("/orders/1", "partner").await.unwrap().status(), 200);

    // Anonymous requests cannot be keyed by api_key: that rule does not apply to them.
    let r = c.get(gw.url("/orders/1")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(!header(&r, "ratelimit-policy").contains("per-key-and-path"));
}

#[tokio::test]
async fn rejected_requests_charge_no_rule_and_tell_the_truth() {
    let api = OrdersApi::start("orders");
    let rules = r#"
[[rules]]
name = "tight"
match = { path = "/orders/1" }
key = ["ip"]
algorithm = "fixed_window"
limit = 1
window = "2s"

[[rules]]
name = "roomy"
key = ["ip"]
algorithm = "fixed_window"
limit = 5
window = "1h"
"#;
    let gw = Gateway::start(&config(api.addr, rules));
    let c = client();
    // "tight" counts per aligned 2 s window: the four requests below must share one.
    early_in_window(Duration::from_secs(2), Duration::from_millis(1500)).await;
    assert_eq!(
        c.get(gw.url("/orders/1")).send().await.unwrap().status(),
        200
    );
    // Three rejections by "tight" must not consume "roomy".
    let mut retry_after = 0;
    for _ in 0..3 {
        let r = c.get(gw.url("/orders/1")).send().await.unwrap();
        assert_eq!(r.status(), 429);
        assert_eq!(header(&r, "content-type"), "application/problem+json");
        retry_after = header(&r, "retry-after")
            .parse::<u64>()
            .expect("Retry-After is whole seconds");
        assert!((1..=2).contains(&retry_after), "Retry-After {retry_after}");
        let p: Value = r.json().await.unwrap();
        assert_eq!(p["status"], 429);
        assert_eq!(p["violated_rules"], serde_json::json!(["tight"]));
        assert_eq!(p["retry_after"], retry_after);
    }
    let r = c.get(gw.url("/orders/2")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let items = parse_ratelimit(&header(&r, "ratelimit"));
    assert_eq!(
        items,
        vec![("roomy".to_string(), 3, items[0].2)],
        "only two requests were charged"
    );

    // Honesty: a client that waits Retry-After seconds is admitted.
    tokio::time::sleep(Duration::from_secs(retry_after)).await;
    assert_eq!(
        c.get(gw.url("/orders/1")).send().await.unwrap().status(),
        200
    );
}

#[tokio::test]
async fn shadow_rules_count_but_never_reject() {
    let api = OrdersApi::start("orders");
    let rules = r#"
[[rules]]
name = "dark-launch"
key = ["ip"]
algorithm = "fixed_window"
limit = 1
window = "1h"
shadow = true
"#;
    let gw = Gateway::start(&config(api.addr, rules));
    let c = client();
    for _ in 0..4 {
        let r = c.get(gw.url("/orders")).send().await.unwrap();
        assert_eq!(r.status(), 200);
        assert!(
            header(&r, "ratelimit").is_empty(),
            "shadow rules are not advertised"
        );
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while gw.logs().matches("shadow rule would have rejected").count() < 3 {
        assert!(
            Instant::now() < deadline,
            "shadow rejections not logged: {}",
            gw.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(gw.logs().contains("dark-launch"));
}

#[tokio::test]
async fn custom_status_and_legacy_headers() {
    let api = OrdersApi::start("orders");
    let rules = r#"
[[rules]]
name = "loose"
key = ["ip"]
algorithm = "fixed_window"
limit = 10
window = "1h"

[[rules]]
name = "strict"
key = ["ip"]
algorithm = "sliding_window_log"
limit = 2
window = "1h"
status = 503
"#;
    let gw = Gateway::start_with("legacy_headers = true", &config(api.addr, rules), &[]);
    let c = client();
    let r = c.get(gw.url("/orders")).send().await.unwrap();
    assert_eq!(
        header(&r, "x-ratelimit-limit"),
        "2",
        "the most restrictive rule"
    );
    assert_eq!(header(&r, "x-ratelimit-remaining"), "1");
    assert!(header(&r, "x-ratelimit-reset").parse::<u64>().is_ok());
    c.get(gw.url("/orders")).send().await.unwrap();
    let r = c.get(gw.url("/orders")).send().await.unwrap();
    assert_eq!(r.status(), 503);
    assert!(!header(&r, "retry-after").is_empty());
}

#[tokio::test]
async fn leaky_bucket_shapes_instead_of_rejecting() {
    let api = OrdersApi::start("orders");
    let rules = r#"
[[rules]]
name = "smooth"
key = ["ip"]
algorithm = "leaky_bucket"
limit = 10
window = "1s"
burst = 10
mode = "shape"
max_delay = "2s"
"#;
    let gw = Gateway::start(&config(api.addr, rules));
    let c = client();
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..6 {
        let c = c.clone();
        let url = gw.url("/orders");
        tasks.push(tokio::spawn(async move {
            c.get(url).send().await.unwrap().status()
        }));
    }
    for t in tasks {
        assert_eq!(
            t.await.unwrap(),
            200,
            "within max_delay requests wait, not fail"
        );
    }
    // Six requests spaced 100ms apart: the last leaves no sooner than 500ms after the first.
    assert!(
        start.elapsed() >= Duration::from_millis(450),
        "not shaped: {:?}",
        start.elapsed()
    );
}

#[tokio::test]
async fn concurrency_slots_are_released_when_the_client_disconnects() {
    let api = OrdersApi::start("orders");
    let rules = r#"
[[rules]]
name = "one-at-a-time"
match = { route = "orders" }
key = ["ip"]
algorithm = "concurrency"
limit = 1
"#;
    let gw = Gateway::start(&config(api.addr, rules));
    let c = client();

    // A slow request holds the only slot...
    let slow = hold_slots(&c, &gw.url("/orders?delay_ms=1500"), &[], 1).remove(0);
    wait_for_status(
        &c,
        &gw.url("/orders"),
        &[],
        429,
        "the slow request never held the slot",
    )
    .await;
    assert_eq!(slow.await.unwrap(), 200);
    // ...and gives it back when it finishes.
    assert_eq!(c.get(gw.url("/orders")).send().await.unwrap().status(), 200);

    // A client that gives up mid-request gives the slot back too.
    let impatient = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    assert!(impatient
        .get(gw.url("/orders?delay_ms=3000"))
        .send()
        .await
        .is_err());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let status = c.get(gw.url("/orders")).send().await.unwrap().status();
        if status == 200 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "slot leaked after the client disconnected"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // An upstream failure releases it as well: after a 504, the next request is admitted.
    let r = c.get(gw.url("/orders?delay_ms=5000")).send().await.unwrap();
    assert_eq!(r.status(), 504);
    assert_eq!(c.get(gw.url("/orders")).send().await.unwrap().status(), 200);
}
