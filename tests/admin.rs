//! The admin API and metrics through the real binary: health, readiness, rules (JSON and
//! Markdown), the diagram, Prometheus metrics matching the traffic sent, and the admin token.

mod common;

use std::collections::HashMap;
use std::time::Duration;

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
    // Requests are counted in the logging phase, just after their answer is written: the
    // client can scrape before the last one is counted.
    let text = eventually(Duration::from_secs(10), "the 404 counted", || {
        let c = c.clone();
        let url = gw.admin_url("/metrics");
        async move {
            let text = get_text(&c, &url).await;
            text.contains("floodgate_requests_total{route=\"-\",status=\"404\"} 1")
                .then_some(text)
        }
    })
    .await;
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
    // The columns the README promises: cost, shadow, headers, status.
    assert!(
        lines[0].ends_with("| on store error | cost | shadow | headers | status |"),
        "{md}"
    );
    assert!(lines[4].ends_with("| 1 | yes | yes | 429 |"), "{md}");

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
    // Readiness without a token is the bare status (probes cannot send one).
    let bare: Value = get_json(&c, gw.admin_url("/readyz")).await;
    assert_eq!(bare, serde_json::json!({"status": "ready"}));
    for path in ["/metrics", "/rules", "/diagram", "/stats", "/upstreams"] {
        let r = c.get(gw.admin_url(path)).send().await.unwrap();
        assert_eq!(r.status(), 401, "{path} without token");
        assert_eq!(r.headers()["content-type"], "application/problem+json");
        let r = get_with_token(&c, gw.admin_url(path), "wrong").await;
        assert_eq!(r.status(), 401, "{path} with a wrong token");
        let r = get_with_token(&c, gw.admin_url(path), "s3cret-admin").await;
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
    let metrics = get_with_token(&c, gw.admin_url("/metrics"), "s3cret-admin")
        .await
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

/// A client that resolves `names` to `addr`, as a DNS-rebinding attacker's name resolves to the
/// admin listener once the attacker re-points it.
fn resolving(names: &[&str], addr: std::net::SocketAddr) -> reqwest::Client {
    names
        .iter()
        .fold(reqwest::Client::builder().no_proxy(), |b, n| {
            b.resolve(n, addr)
        })
        .timeout(std::time::Duration::from_secs(20))
        .build()
        .unwrap()
}

#[tokio::test]
async fn a_host_the_admin_listener_does_not_know_is_refused() {
    let api = OrdersApi::start("orders");
    let gw = Gateway::start(&config(api.addr));
    let port = gw.admin.port();
    let c = resolving(&["rebind.example", "localhost", "app.localhost"], gw.admin);
    for path in [
        "/stats",
        "/top?rule=per-ip",
        "/rules",
        "/metrics",
        "/readyz",
        "/upstreams",
        "/",
    ] {
        let r = c
            .get(format!("http://rebind.example:{port}{path}"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 421, "{path} for a foreign Host");
        assert_eq!(r.headers()["content-type"], "application/problem+json");
        let p: Value = r.json().await.unwrap();
        assert!(p["detail"].as_str().unwrap().contains("admin_hosts"), "{p}");
    }
    let r = c
        .post(format!("http://rebind.example:{port}/reload"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 421);
    // Liveness says only "ok", to any Host.
    let r = c
        .get(format!("http://rebind.example:{port}/healthz"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // IP literals, localhost and *.localhost are answered.
    for base in [
        format!("http://{}", gw.admin),
        format!("http://localhost:{port}"),
        format!("http://app.localhost:{port}"),
    ] {
        let r = c.get(format!("{base}/stats")).send().await.unwrap();
        assert_eq!(r.status(), 200, "{base}");
    }
    let ready: Value = get_json(&c, gw.admin_url("/readyz")).await;
    assert_eq!(
        ready["reload"]["generation"], 1,
        "the refused POST reloaded nothing"
    );
}

#[tokio::test]
async fn admin_hosts_names_the_hosts_answered_besides_ips_and_localhost() {
    let api = OrdersApi::start("orders");
    let gw = Gateway::start_with("admin_hosts = [\"Gateway-1.\"]", &config(api.addr), &[]);
    let port = gw.admin.port();
    let c = resolving(&["gateway-1", "gateway-2"], gw.admin);
    let r = c
        .get(format!("http://gateway-1:{port}/stats"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.status(),
        200,
        "a listed name (case and trailing dot normalized)"
    );
    let r = c
        .get(format!("http://gateway-2:{port}/stats"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 421, "an unlisted name");
}

/// The reload generation on /readyz (with the token, when one is given).
async fn generation(c: &reqwest::Client, gw: &Gateway, token: Option<&str>) -> u64 {
    let mut req = c.get(gw.admin_url("/readyz"));
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let v: Value = req.send().await.unwrap().json().await.unwrap();
    v["reload"]["generation"].as_u64().unwrap()
}

#[tokio::test]
async fn a_cross_site_post_is_refused_token_or_not() {
    let api = OrdersApi::start("orders");
    let open = Gateway::start(&config(api.addr));
    let guarded = Gateway::start_with("admin_token = \"s3cret-admin\"", &config(api.addr), &[]);
    let c = client();
    for (gw, token) in [(&open, None), (&guarded, Some("s3cret-admin"))] {
        let attempts: [&[(&str, &str)]; 5] = [
            &[("origin", "http://attacker.example")],
            &[("origin", "null")],
            &[("sec-fetch-site", "cross-site")],
            // Another port of the same host is another origin (and the same "site").
            &[
                ("origin", "http://127.0.0.1:1"),
                ("sec-fetch-site", "same-site"),
            ],
            &[("content-type", "application/x-www-form-urlencoded")],
        ];
        for headers in attempts {
            let mut req = c.post(gw.admin_url("/reload")).body("a=b");
            for (k, v) in headers {
                req = req.header(*k, *v);
            }
            if let Some(t) = token {
                req = req.bearer_auth(t);
            }
            let r = req.send().await.unwrap();
            assert_eq!(r.status(), 403, "{headers:?} (token {token:?})");
            assert_eq!(r.headers()["content-type"], "application/problem+json");
        }
        assert_eq!(generation(&c, gw, token).await, 1, "nothing was reloaded");
        // A script's POST (no form body, no browser headers) and a same-origin one still work.
        let origin = format!("http://{}", gw.admin);
        for headers in [
            vec![],
            vec![
                ("origin", origin.as_str()),
                ("sec-fetch-site", "same-origin"),
            ],
        ] {
            let mut req = c.post(gw.admin_url("/reload"));
            for (k, v) in &headers {
                req = req.header(*k, *v);
            }
            if let Some(t) = token {
                req = req.bearer_auth(t);
            }
            assert_eq!(req.send().await.unwrap().status(), 200, "{headers:?}");
        }
        assert_eq!(generation(&c, gw, token).await, 3);
    }
}

#[tokio::test]
async fn the_token_from_a_file_keeps_probes_working_and_follows_the_file() {
    let api = OrdersApi::start("orders");
    let gw = Gateway::start_env(
        |addr, admin| {
            format!(
                "{}admin_token_file = \"admin-token\"\n",
                server_section(addr, admin)
            )
        },
        &config(api.addr),
        &[("admin-token", "first-t0ken-9f2\n")],
        &[("RUST_LOG", "debug")],
    );
    let c = client();
    // Probes send no token: liveness, and readiness as a bare status.
    assert_eq!(
        c.get(gw.admin_url("/healthz"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    let r = c.get(gw.admin_url("/readyz")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let bare: Value = r.json().await.unwrap();
    assert_eq!(
        bare,
        serde_json::json!({"status": "ready"}),
        "details need the token"
    );
    // A token that is presented must be right, on /readyz too.
    let r = get_with_token(&c, gw.admin_url("/readyz"), "wrong").await;
    assert_eq!(r.status(), 401);
    for path in ["/metrics", "/stats", "/rules", "/top?rule=per-ip"] {
        let r = c.get(gw.admin_url(path)).send().await.unwrap();
        assert_eq!(r.status(), 401, "{path} without the token");
        let r = get_with_token(&c, gw.admin_url(path), "first-t0ken-9f2").await;
        assert_eq!(
            r.status(),
            200,
            "{path} with the file's token (newline trimmed)"
        );
    }
    assert_eq!(generation(&c, &gw, Some("first-t0ken-9f2")).await, 1);

    // A new token in the file is picked up like any change of the config.
    std::fs::write(gw.dir.path().join("admin-token"), "second-t0ken-4c1\n").unwrap();
    eventually(Duration::from_secs(10), "the new token in force", || {
        let c = c.clone();
        let url = gw.admin_url("/stats");
        async move {
            let r = c
                .get(&url)
                .bearer_auth("second-t0ken-4c1")
                .send()
                .await
                .ok()?;
            (r.status() == 200).then_some(())
        }
    })
    .await;
    let r = get_with_token(&c, gw.admin_url("/stats"), "first-t0ken-9f2").await;
    assert_eq!(r.status(), 401, "the old token is refused");

    let metrics = get_with_token(&c, gw.admin_url("/metrics"), "second-t0ken-4c1")
        .await
        .text()
        .await
        .unwrap();
    let logs = gw.logs();
    for token in ["first-t0ken-9f2", "second-t0ken-4c1"] {
        assert!(
            !metrics.contains(token) && !logs.contains(token),
            "{token} leaked"
        );
    }
}

#[test]
fn admin_settings_are_checked_with_file_line_and_column() {
    let body = "[[upstreams]]\nname = \"u\"\ntargets = [\"127.0.0.1:9000\"]\n\n[[routes]]\nname = \"r\"\nupstream = \"u\"\n";
    for (server, files, expected) in [
        (
            "admin_hosts = [\"ok.example\", \"http://evil:80/\"]",
            &[][..],
            "gateway.toml:2:30: admin_hosts entry \"http://evil:80/\" is not a host name",
        ),
        (
            "admin_hosts = [\"*.example\"]",
            &[][..],
            "gateway.toml:2:16: admin_hosts entry \"*.example\"",
        ),
        (
            "admin_token = \"x\"\nadmin_token_file = \"t\"",
            &[("t", "y")][..],
            "gateway.toml:3:20: set admin_token or admin_token_file, not both",
        ),
        (
            "admin_token_file = \"t\"",
            &[("t", " \n")][..],
            "gateway.toml:2:20: admin_token_file",
        ),
        (
            "admin_token_file = \"missing\"",
            &[][..],
            "gateway.toml:2:20: cannot read admin_token_file",
        ),
    ] {
        let (ok, stdout, stderr) = check(&format!("[server]\n{server}\n\n{body}"), files);
        assert!(!ok, "{server}: {stdout}");
        assert!(stderr.contains(expected), "{server}: {stderr}");
    }
    // A token file's content never appears in an error.
    let (ok, _, stderr) = check(
        &format!("[server]\nadmin_token_file = \"t\"\n\n{body}"),
        &[("t", "has space-s3cr3t")],
    );
    assert!(!ok);
    assert!(!stderr.contains("s3cr3t"), "{stderr}");
    // An admin listener open to the network without a token passes, with a warning.
    let (ok, stdout, stderr) = check(
        &format!("[server]\nadmin_listen = \"0.0.0.0:9901\"\n\n{body}"),
        &[],
    );
    assert!(ok, "{stderr}");
    assert!(
        format!("{stdout}{stderr}").contains("no admin token is set"),
        "{stdout}{stderr}"
    );
}

/// The admin listener's refusals are problem+json with a request id (body and
/// `x-request-id`), as every other answer floodgate makes.
#[tokio::test]
async fn admin_refusals_carry_a_request_id() {
    let api = OrdersApi::start("orders-1");
    let gw = Gateway::start_with("admin_token = \"s3cret-admin\"", &config(api.addr), &[]);
    let c = client();
    let with_token = |path: &str| {
        c.get(gw.admin_url(path))
            .header("authorization", "Bearer s3cret-admin")
    };
    // A config that no longer validates, for the 422.
    let path = gw.config_path();
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, format!("{text}\n[[rules]]\nname = 1\n")).unwrap();
    let cases = [
        (c.get(gw.admin_url("/stats")), 401),
        (with_token("/nowhere"), 404),
        (with_token("/top?rule=x&bogus=1"), 400),
        (
            c.post(gw.admin_url("/reload"))
                .header("authorization", "Bearer s3cret-admin"),
            422,
        ),
    ];
    for (req, status) in cases {
        let r = req.send().await.unwrap();
        assert_eq!(r.status().as_u16(), status);
        let header = r
            .headers()
            .get("x-request-id")
            .unwrap_or_else(|| panic!("{status}: no x-request-id"))
            .to_str()
            .unwrap()
            .to_string();
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["status"], status, "{v}");
        assert_eq!(v["request_id"], header.as_str(), "{v}");
    }
}

/// A reload that changes `store.backend` waits for a restart, and every count
/// stays where it was: `/readyz`, `/stats` and the metrics say the backend in force, and name
/// the configured one as waiting, instead of claiming the new one.
#[tokio::test]
async fn a_backend_change_waiting_for_a_restart_is_reported_as_such() {
    let api = OrdersApi::start("orders-1");
    let gw = Gateway::start(&config(api.addr));
    let c = client();
    let path = gw.config_path();
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(
        &path,
        format!("{text}\n[store]\nbackend = \"redis\"\nurl = \"redis://127.0.0.1:1/0\"\n"),
    )
    .unwrap();
    let r = c.post(gw.admin_url("/reload")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let ready = get_json(&c, gw.admin_url("/readyz")).await;
    assert_eq!(ready["store"]["backend"], "memory", "{ready}");
    assert_eq!(ready["store"]["configured_backend"], "redis", "{ready}");
    assert_eq!(ready["store"]["waits_for_restart"], true, "{ready}");
    let waiting = ready["reload"]["restart_required"]
        .as_array()
        .unwrap()
        .len();
    assert!(waiting >= 1, "{ready}");
    let stats = get_json(&c, gw.admin_url("/stats")).await;
    assert_eq!(stats["store"]["backend"], "memory", "{stats}");
    assert_eq!(stats["store"]["configured_backend"], "redis", "{stats}");
    let m = get_text(&c, gw.admin_url("/metrics")).await;
    assert_eq!(
        metric_value(&m, "floodgate_store_backend{backend=\"memory\"}"),
        Some(1.0),
        "{m}"
    );
    assert_eq!(
        metric_value(&m, "floodgate_restart_required"),
        Some(waiting as f64),
        "{m}"
    );
}
