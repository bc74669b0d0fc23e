//! The access log is written off the request path, through a buffer: no line is lost by the
//! time the process has exited, and the line is the same `access` event as ever, in both log
//! formats.

mod common;

use common::{client, orders_upstream, Gateway, OrdersApi, DEMO_KEYS};

fn config(api: &OrdersApi) -> String {
    format!(
        "{DEMO_KEYS}{}
[[routes]]
name = \"orders\"
match = {{ path_prefix = \"/orders\" }}
upstream = \"orders\"

[[rules]]
name = \"per-key\"
key = [\"api_key\"]
algorithm = \"fixed_window\"
limit = 20
window = \"1h\"
",
        orders_upstream(&[api.addr])
    )
}

/// Sends `n` requests with the key `test` and request ids `req-0` ... and returns how many got
/// 429 (the rule admits 20).
async fn traffic(gw: &Gateway, n: usize) -> usize {
    let c = client();
    let mut rejected = 0;
    for i in 0..n {
        let r = c
            .get(gw.url(&format!("/orders/{i}")))
            .header("x-api-key", "test")
            .header("x-request-id", format!("req-{i}"))
            .send()
            .await
            .unwrap();
        rejected += usize::from(r.status() == 429);
    }
    rejected
}

/// The access lines of `logs`.
fn access_lines(logs: &str) -> Vec<&str> {
    logs.lines()
        .filter(|l| l.contains("access") && l.contains("request_id"))
        .collect()
}

#[tokio::test]
async fn every_access_line_is_written_by_exit() {
    let api = OrdersApi::start("access-log-text");
    let mut gw = Gateway::start(&config(&api));
    let n = 60;
    assert_eq!(traffic(&gw, n).await, n - 20);
    // Stopping is the synchronization point: whatever the writer still held is written out
    // as the process exits.
    gw.stop();
    let logs = gw.logs();
    let lines = access_lines(&logs);
    assert_eq!(lines.len(), n, "{logs}");
    for i in 0..n {
        // The id is followed by a space in the text format.
        let id = format!("req-{i} ");
        let found = lines.iter().filter(|l| l.contains(&id)).count();
        assert_eq!(found, 1, "req-{i} in:\n{logs}");
    }
    assert!(lines.iter().all(|l| l.contains("acme-prod")), "{logs}");
    // stderr is a pipe here, not a terminal: no colour escape codes in what a file or a log
    // collector receives, and the fields read as written.
    assert!(!logs.contains('\u{1b}'), "{logs}");
    assert!(lines[0].contains("key_id=\"acme-prod\""), "{}", lines[0]);
    // The key's secret ("test") is never written: only its id.
    assert!(!logs.contains("x-api-key"), "{logs}");
}

#[tokio::test]
async fn json_access_lines_keep_their_fields() {
    let api = OrdersApi::start("access-log-json");
    let mut gw = Gateway::start_with("log_format = \"json\"\n", &config(&api), &[]);
    assert_eq!(traffic(&gw, 21).await, 1);
    gw.stop();
    let logs = gw.logs();
    let lines: Vec<serde_json::Value> = logs
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["target"] == "access")
        .collect();
    assert_eq!(lines.len(), 21, "{logs}");
    let last = lines
        .iter()
        .find(|v| v["fields"]["request_id"] == "req-20")
        .unwrap_or_else(|| panic!("req-20 missing:\n{logs}"));
    let f = &last["fields"];
    assert_eq!(last["level"], "INFO");
    assert_eq!(f["method"], "GET");
    assert_eq!(f["path"], "/orders/20");
    assert_eq!(f["status"], 429);
    assert_eq!(f["route"], "orders");
    assert_eq!(f["upstream"], "orders");
    assert_eq!(f["key_id"], "acme-prod");
    assert_eq!(f["client_ip"], "127.0.0.1");
    assert_eq!(f["rejected_by"], "per-key");
    assert_eq!(f["error"], "-");
    assert!(f["latency_ms"].as_f64().is_some_and(|ms| ms >= 0.0), "{f}");
}
