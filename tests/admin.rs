//! The admin API and metrics through the real binary: health, readiness, rules (JSON and
//! Markdown), the diagram, Prometheus metrics matching the traffic sent, and the admin token.

mod common;

use std::collections::HashMap;

use common::*;
use serde_json::Value;

const RULES: &str = r#"
[[rules]]
name = "per-ip"
key = ["ip"]
algorithm = "fixed_window"
limit = 3
window = "1h"

[[rules]]
name = "per-key"
match = { route = "orders", methods = ["GET"] }
key = ["api_key"]
algorithm = "token_bucket"
limit = 100
window = "1m"
burst = 20
scope = "global"
on_store_error = "local"

[[rules]]
name = "dark"
key = ["header:x-tenant"]
algorithm = "sliding_window_log"
limit = 1
window = "1h"
shadow = true
"#;

fn config(api: std::net::SocketAddr) -> String {
    format!(
        "{DEMO_KEYS}\n{}\n[[routes]]\nname = \"orders\"\nmatch = {{ path_prefix = \"/orders\" }}\nupstream = \"orders\"\nauth = \"optional\"\n{RULES}",
        orders_upstream(&[api])
    )
}

/// Parses the Prometheus text format into `name{labels}` -> value.
fn scrape(text: &str) -> HashMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

#[tokio::test]
async fn metrics_match_the_traffic_sent() {
    let api = OrdersApi::start("orders");
    let gw = Gateway::start(&config(api.addr));
    let c = client();
    for _ in 0..5 {
        c.get(gw.url("/orders"))
            .header("x-api-key", "test")
            .header("x-tenant", "t1")
            .send()
            .await
            .unwrap();
    }
    c.get(gw.url("/nowhere")).send().await.unwrap();
    let text = get_text(&c, gw.admin_url("/metrics")).await;
    let m = scrape(&text);
    let get = |k: &str| {
        m.get(k)
            .copied()
            .unwrap_or_else(|| panic!("{k} missing from:\n{text}"))
    };
    assert_eq!(
        get("floodgate_requests_total{route=\"orders\",status=\"200\"}"),
        3.0
    );
    assert_eq!(
        get("floodgate_requests_total{route=\"orders\",status=\"429\"}"),
        2.0
    );
    assert_eq!(
        get("floodgate_requests_total{route=\"-\",status=\"404\"}"),
        1.0
    );
    assert_eq!(
        get("floodgate_ratelimit_decisions_total{result=\"allowed\",rule=\"per-ip\"}"),
        3.0
    );
    assert_eq!(
        get("floodgate_ratelimit_decisions_total{result=\"rejected\",rule=\"per-ip\"}"),
        2.0
    );
    assert_eq!(
        get("floodgate_ratelimit_decisions_total{result=\"allowed\",rule=\"per-key\"}"),
        3.0
    );
    // Shadow rules are only evaluated for admitted requests: 1 allowed, 2 shadow-rejected.
    assert_eq!(
        get("floodgate_ratelimit_decisions_total{result=\"allowed\",rule=\"dark\"}"),
        1.0
    );
    assert_eq!(
        get("floodgate_ratelimit_decisions_total{result=\"shadow_rejected\",rule=\"dark\"}"),
        2.0
    );
    assert_eq!(get("floodgate_decision_duration_seconds_count"), 5.0);
    assert_eq!(
        get("floodgate_upstream_duration_seconds_count{upstream=\"orders\"}"),
        3.0
    );
    assert_eq!(
        get("floodgate_config_reloads_total{result=\"failure\"}"),
        0.0
    );
    assert!(get("floodgate_config_last_reload_success_timestamp_seconds") > 1.6e9);
    assert_eq!(get("floodgate_store_up"), 1.0);
    assert!(get("floodgate_memory_store_keys") >= 2.0);
    assert!(text.contains("# TYPE floodgate_decision_duration_seconds histogram"));

    // Anonymous requests skip the api_key rule, and that is counted.
    c.get(gw.url("/orders"))
        .header("x-forwarded-for", "9.9.9.9")
        .send()
        .await
        .unwrap();
    let text = get_text(&c, gw.admin_url("/metrics")).await;
    let m = scrape(&text);
    assert_eq!(
        m.get("floodgate_ratelimit_decisions_total{result=\"skipped\",rule=\"per-key\"}"),
        Some(&1.0)
    );
}

#[tokio::test]
async fn rules_markdown_and_diagram() {
    let api = OrdersApi::start("orders");
    let gw = Gateway::start(&config(api.addr));
    let c = client();

    let v: Value = get_json(&c, gw.admin_url("/rules")).await;
    let rules = v["rules"].as_array().unwrap();
    let names: Vec<&str> = rules.iter().map(|r| r["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["per-ip", "per-key", "dark"]);
    assert_eq!(rules[1]["algorithm"], "token_bucket");
    assert_eq!(rules[1]["limit"], 100);
    assert_eq!(rules[1]["window"], "1m");
    assert_eq!(rules[1]["burst"], 20);
    assert_eq!(rules[1]["scope"], "global");
    assert_eq!(rules[1]["on_store_error"], "local");
    assert_eq!(rules[1]["match"]["route"], "orders");
    assert_eq!(rules[1]["match"]["methods"], serde_json::json!(["GET"]));
    assert_eq!(rules[2]["shadow"], true);
    assert_eq!(rules[2]["key"], serde_json::json!(["header:x-tenant"]));

    let md = get_text(&c, gw.admin_url("/rules?format=markdown")).await;
    let lines: Vec<&str> = md.lines().collect();
    assert!(lines[0].starts_with("| # | rule | match | key | algorithm |"));
    assert!(lines[1].starts_with("|---|"));
    assert!(
        lines[2].starts_with("| 1 | per-ip | every request | ip | fixed_window |"),
        "{md}"
    );
    assert!(
        lines[3].contains("| 2 | per-key | route=orders methods=GET | api_key | token_bucket |"),
        "{md}"
    );
    assert!(lines[4].ends_with("| yes |"), "{md}");

    let diagram = get_text(&c, gw.admin_url("/diagram")).await;
    assert!(diagram.starts_with("flowchart LR\n"));
    let p1 = diagram.find("1. per-ip").unwrap();
    let p2 = diagram.find("2. per-key").unwrap();
    let p3 = diagram.find("3. dark (shadow)").unwrap();
    assert!(p1 < p2 && p2 < p3, "rules in order");
    assert!(diagram.contains("r1 -- over limit --> rej"));
    assert!(
        !diagram.contains("r3 -- over limit"),
        "a shadow rule never rejects"
    );
    assert!(diagram.contains("r3 -- allowed --> upstreams"));
    assert!(
        diagram.contains("r2 -.- store"),
        "global rules touch the store"
    );
    assert!(diagram.contains("prom[Prometheus] -.->"));

    // The command line prints the same diagram for the same file.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_floodgate"))
        .arg("diagram")
        .arg("-c")
        .arg(gw.dir.path().join("gateway.toml"))
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout), diagram);

    let ready: Value = get_json(&c, gw.admin_url("/readyz")).await;
    assert_eq!(ready["status"], "ready");
    assert_eq!(ready["rules"], 3);
    assert_eq!(ready["store"]["backend"], "memory");
    assert!(ready["reload"]["last_error"].is_null());
}

#[tokio::test]
async fn admin_token_protects_all_but_healthz() {
    let api = OrdersApi::start("orders");
    let gw = Gateway::start_with("admin_token = \"s3cret-admin\"", &config(api.addr), &[]);
    let c = client();
    assert_eq!(
        c.get(gw.admin_url("/healthz"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    for path in ["/readyz", "/metrics", "/rules", "/diagram"] {
        let r = c.get(gw.admin_url(path)).send().await.unwrap();
        assert_eq!(r.status(), 401, "{path} without token");
        assert_eq!(r.headers()["content-type"], "application/problem+json");
        let r = c
            .get(gw.admin_url(path))
            .bearer_auth("wrong")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 401, "{path} with a wrong token");
        let r = c
            .get(gw.admin_url(path))
            .bearer_auth("s3cret-admin")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{path} with the token");
    }
    assert_eq!(
        c.post(gw.admin_url("/reload"))
            .send()
            .await
            .unwrap()
            .status(),
        401
    );
    let metrics = c
        .get(gw.admin_url("/metrics"))
        .bearer_auth("s3cret-admin")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(!metrics.contains("s3cret-admin"));
    assert!(!gw.logs().contains("s3cret-admin"));
}

#[test]
fn admin_listens_on_loopback_by_default() {
    // Nothing about the admin listener, only the one route a config needs.
    let minimal = "[[upstreams]]\nname = \"u\"\ntargets = [\"127.0.0.1:9000\"]\n\n[[routes]]\nname = \"r\"\nupstream = \"u\"\n";
    let cfg =
        floodgate::config::Config::from_str(std::path::Path::new("gateway.toml"), minimal).unwrap();
    assert_eq!(cfg.server.admin_listen.to_string(), "127.0.0.1:9901");
    assert!(cfg.server.admin_listen.ip().is_loopback());
}
