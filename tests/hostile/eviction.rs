//! Eviction: a client must not reset its own exhausted limit by flooding another
//! rule with random keys until the in-process store, full, evicts the exhausted counter.

use crate::common::*;

/// Distinct `x-junk` values the attacker sends: many times `max_keys`, so that under the old
/// policy (evict the sampled key closest to expiry, whatever its rule) the login counter is
/// all but certain to be sampled and dropped.
const FLOOD: usize = 3_000;

/// The value of `metric{rule="<rule>"}` in a Prometheus text exposition, if present.
fn rule_series(metrics: &str, metric: &str, rule: &str) -> Option<f64> {
    metric_value(metrics, &format!("{metric}{{rule=\"{rule}\"}}"))
}

#[tokio::test]
async fn a_flood_of_keys_on_one_rule_does_not_reset_another_rules_exhausted_limit() {
    let api = OrdersApi::start("orders");
    // One shard of 100 keys. The login counter (a sliding log of one minute) expires well
    // before the junk counters (a sliding window counter of one hour), so a policy that only
    // looks at expiry picks it first.
    let body = format!(
        r#"
[store]
max_keys = 100

{}
[[routes]]
name = "login"
match = {{ path_prefix = "/login" }}
upstream = "orders"
auth = "none"

[[routes]]
name = "junk"
match = {{ path_prefix = "/orders" }}
upstream = "orders"
auth = "none"

[[rules]]
name = "login-per-ip"
match = {{ route = "login" }}
key = ["ip"]
algorithm = "sliding_window_log"
limit = 3
window = "1m"

[[rules]]
name = "junk-per-value"
match = {{ route = "junk" }}
key = ["header:x-junk"]
algorithm = "sliding_window_counter"
limit = 100
window = "1h"
"#,
        orders_upstream(&[api.addr])
    );
    let gw = Gateway::start(&body);
    let c = client();
    let login = gw.url("/login");

    for attempt in 0..3 {
        let status = c.get(&login).send().await.expect("login").status();
        assert_ne!(
            status.as_u16(),
            429,
            "attempt {attempt} is within the limit"
        );
    }
    let status = c.get(&login).send().await.expect("login").status();
    assert_eq!(status.as_u16(), 429, "the fourth login attempt is limited");

    // The same client floods a rule keyed on a header it controls, over keep-alive.
    let junk = gw.url("/orders");
    for value in 0..FLOOD {
        let status = c
            .get(&junk)
            .header("x-junk", format!("junk-{value}"))
            .send()
            .await
            .expect("junk request")
            .status();
        assert_ne!(status.as_u16(), 429, "every junk value is new");
    }

    let status = c.get(&login).send().await.expect("login").status();
    assert_eq!(
        status.as_u16(),
        429,
        "the flood must not have reset the exhausted login limit"
    );

    // The flood is paid for by the flooding rule, and shows in its own eviction counter.
    let metrics = get_text(&c, gw.admin_url("/metrics")).await;
    assert!(
        metrics.contains("# TYPE floodgate_memory_store_evictions_total counter"),
        "evictions are a counter:\n{metrics}"
    );
    let evictions = "floodgate_memory_store_evictions_total";
    let junk_evictions = rule_series(&metrics, evictions, "junk-per-value").unwrap_or(0.0);
    assert!(
        junk_evictions >= (FLOOD - 100) as f64,
        "the junk rule's evictions are counted: {junk_evictions}\n{metrics}"
    );
    assert_eq!(
        rule_series(&metrics, evictions, "login-per-ip").unwrap_or(0.0),
        0.0,
        "no login counter was evicted"
    );
}
