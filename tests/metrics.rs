//! `/metrics` follows Prometheus' conventions: `promtool check metrics` (Debian's `prometheus`
//! package, installed by `make deps`) passes on what a gateway that has seen traffic exports,
//! without a single lint line.

mod common;

use std::io::Write as _;
use std::process::{Command, Stdio};

use common::{
    client, free_port, get_text, get_with_key, orders_upstream, Gateway, OrdersApi, DEMO_KEYS,
};

/// `promtool`, or `None` when it is absent and this is not CI. Under CI (`CI` set) a missing
/// promtool fails the test: the check must not be skipped silently where it matters.
fn promtool() -> Option<&'static str> {
    let found = Command::new("promtool")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if found {
        return Some("promtool");
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "promtool is missing (CI is set, so this fails rather than skips): run `make deps`"
    );
    eprintln!(
        "SKIPPED: promtool is not installed (`make deps` installs Debian's prometheus package)"
    );
    None
}

/// Runs `promtool check metrics` on `text`; panics unless it exits 0 and prints nothing.
fn assert_promtool_clean(promtool: &str, text: &str) {
    let mut child = Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run promtool");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .expect("write to promtool");
    let out = child.wait_with_output().expect("promtool output");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && said.trim().is_empty(),
        "promtool check metrics: {}\n{said}\non:\n{text}",
        out.status
    );
}

/// Routes with and without auth, a local rule that rejects, a shadow rule and a global rule.
fn config(api: &OrdersApi, store: &str) -> String {
    format!(
        "{store}{DEMO_KEYS}{}
[[routes]]
name = \"orders\"
match = {{ path_prefix = \"/orders\" }}
upstream = \"orders\"

[[routes]]
name = \"public\"
match = {{ path_prefix = \"/public\" }}
upstream = \"orders\"
auth = \"none\"

[[rules]]
name = \"per-key\"
match = {{ route = \"orders\" }}
key = [\"api_key\"]
scope = \"local\"
algorithm = \"fixed_window\"
limit = 2
window = \"1h\"

[[rules]]
name = \"dark-launch\"
key = [\"ip\"]
scope = \"local\"
algorithm = \"fixed_window\"
limit = 1
window = \"1h\"
shadow = true

[[rules]]
name = \"shared\"
match = {{ route = \"public\" }}
key = [\"ip\"]
algorithm = \"token_bucket\"
limit = 100
window = \"1s\"
on_store_error = \"local\"
",
        orders_upstream(&[api.addr])
    )
}

/// Sends allowed, rejected, unauthorized and unrouted requests, then returns `/metrics`.
async fn metrics_after_traffic(gw: &Gateway) -> String {
    let c = client();
    let mut statuses = Vec::new();
    for _ in 0..3 {
        let r = get_with_key(&c, gw.url("/orders/1"), "test").await;
        statuses.push(r.status().as_u16());
    }
    assert_eq!(statuses, [200, 200, 429], "allowed, then rejected");
    for path in ["/orders/1", "/public/x", "/nowhere"] {
        c.get(gw.url(path)).send().await.unwrap();
    }
    get_text(&c, gw.admin_url("/metrics")).await
}

#[tokio::test]
async fn metrics_pass_promtool_with_the_memory_store() {
    let Some(promtool) = promtool() else { return };
    let api = OrdersApi::start("metrics-memory");
    let gw = Gateway::start(&config(&api, ""));
    let text = metrics_after_traffic(&gw).await;
    // The families a dashboard reads are there, with the traffic's series.
    for series in [
        "floodgate_ratelimit_decisions_total{result=\"rejected\",rule=\"per-key\"} 1",
        "floodgate_ratelimit_decisions_total{result=\"shadow_rejected\",rule=\"dark-launch\"}",
        "floodgate_requests_total{route=\"orders\",status=\"429\"} 1",
        "floodgate_upstream_duration_seconds_bucket{upstream=\"orders\"",
        "floodgate_decision_duration_seconds_count",
        "floodgate_access_log_dropped_total 0",
    ] {
        assert!(text.contains(series), "{series} missing from:\n{text}");
    }
    assert_promtool_clean(promtool, &text);
}

#[tokio::test]
async fn metrics_pass_promtool_with_a_redis_store_down() {
    let Some(promtool) = promtool() else { return };
    let api = OrdersApi::start("metrics-redis-down");
    // Nothing listens there: store errors, the breaker and failure modes get series too.
    let store = format!(
        "[store]\nbackend = \"redis\"\nurl = \"redis://127.0.0.1:{}/0\"\n",
        free_port()
    );
    let gw = Gateway::start(&config(&api, &store));
    let text = metrics_after_traffic(&gw).await;
    for series in [
        "floodgate_store_errors_total{kind=",
        "floodgate_failure_mode_decisions_total{mode=\"local\",rule=\"shared\"} 1",
        "floodgate_store_up 0",
    ] {
        assert!(text.contains(series), "{series} missing from:\n{text}");
    }
    assert_promtool_clean(promtool, &text);
}

/// Every series whose labels are known at start is exported at 0 before its
/// first event (store errors by kind, a leased rule's lease series, each upstream target's
/// responses by class), so a panel shows 0 and an `increase()` alert sees the first event.
#[tokio::test]
async fn series_known_at_start_are_exported_at_zero() {
    use common::{eventually, metric_value};
    let api = OrdersApi::start("orders-1");
    let body = format!(
        "[store]\nbackend = \"redis\"\nurl = \"redis://127.0.0.1:1/0\"\n\n{}\n\
         [[routes]]\nname = \"orders\"\nupstream = \"orders\"\nauth = \"none\"\n\n\
         [[rules]]\nname = \"leased\"\nkey = [\"ip\"]\nalgorithm = \"token_bucket\"\nlimit = 1000\n\
         window = \"1m\"\nscope = \"global\"\nlease = \"auto\"\n",
        orders_upstream(&[api.addr])
    );
    let gw = Gateway::start(&body);
    let c = client();
    let target = api.addr.to_string();
    let text = eventually(
        std::time::Duration::from_secs(10),
        "target series exported",
        || {
            let c = c.clone();
            let url = gw.admin_url("/metrics");
            let target = target.clone();
            async move {
                let t = get_text(&c, &url).await;
                t.contains(&format!("target=\"{target}\"")).then_some(t)
            }
        },
    )
    .await;
    for series in [
        "floodgate_store_errors_total{kind=\"error\"}".to_string(),
        "floodgate_store_errors_total{kind=\"timeout\"}".to_string(),
        "floodgate_store_errors_total{kind=\"circuit_open\"}".to_string(),
        "floodgate_lease_taken_total{rule=\"leased\"}".to_string(),
        "floodgate_lease_permits_total{event=\"spent\",rule=\"leased\"}".to_string(),
        format!(
            "floodgate_upstream_target_responses_total{{class=\"error\",target=\"{target}\",upstream=\"orders\"}}"
        ),
        format!(
            "floodgate_upstream_target_responses_total{{class=\"2xx\",target=\"{target}\",upstream=\"orders\"}}"
        ),
    ] {
        assert_eq!(metric_value(&text, &series), Some(0.0), "{series}\n{text}");
    }
}
