//! Secrets stay secret: no key reaches the upstream when `forward_key = false`, whichever
//! header carried it, and no log level prints one.

use std::net::SocketAddr;

use crate::common::*;

fn config(api: SocketAddr, forward_key: bool) -> String {
    format!(
        r#"[auth]
forward_key = {forward_key}
{DEMO_KEYS}
{}
[[routes]]
name = "debug"
match = {{ path_prefix = "/debug" }}
upstream = "orders"
auth = "optional"

[[routes]]
name = "open"
match = {{ path_prefix = "/open" }}
upstream = "orders"
auth = "none"
"#,
        orders_upstream(&[api])
    )
}

async fn upstream_headers(gw: &Gateway, headers: &[(&str, &str)]) -> serde_json::Value {
    let mut req = client().get(gw.url("/debug/headers"));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.unwrap();
    assert_eq!(resp.status(), 200);
    resp.json::<serde_json::Value>().await.unwrap()["headers"].clone()
}

#[tokio::test]
async fn no_key_header_is_forwarded_whichever_authenticated() {
    let api = OrdersApi::start("orders-1");
    let gw = Gateway::start(&config(api.addr, false));

    // An empty x-api-key beside a Bearer token: the token authenticates and is not forwarded.
    let h = upstream_headers(
        &gw,
        &[("x-api-key", ""), ("authorization", "Bearer partner")],
    )
    .await;
    assert_eq!(h["x-floodgate-key-id"], "globex-partner");
    assert!(h.get("authorization").is_none(), "{h}");
    assert!(h.get("x-api-key").is_none(), "{h}");

    // Whitespace counts as absent too.
    let h = upstream_headers(
        &gw,
        &[("x-api-key", "   "), ("authorization", "Bearer partner")],
    )
    .await;
    assert_eq!(h["x-floodgate-key-id"], "globex-partner");
    assert!(h.get("authorization").is_none(), "{h}");

    // The header authenticates: a Bearer token beside it goes too.
    let h = upstream_headers(
        &gw,
        &[("x-api-key", "test"), ("authorization", "Bearer partner")],
    )
    .await;
    assert_eq!(h["x-floodgate-key-id"], "acme-prod");
    assert!(h.get("authorization").is_none(), "{h}");
    assert!(h.get("x-api-key").is_none(), "{h}");

    // A route that reads no keys passes Authorization through untouched: it is not a key there.
    let resp = client()
        .get(gw.url("/open/debug"))
        .header("authorization", "Bearer upstream-token")
        .send()
        .await
        .unwrap();
    assert_eq!(
        resp.status(),
        404,
        "the demo API has no /open; the gateway forwarded it"
    );
    let _ = resp.text().await;
}

#[tokio::test]
async fn forward_key_true_keeps_them() {
    let api = OrdersApi::start("orders-1");
    let gw = Gateway::start(&config(api.addr, true));
    let h = upstream_headers(&gw, &[("x-api-key", "test")]).await;
    assert_eq!(h["x-api-key"], "test");
}

/// A key secret that appears nowhere else in the config or the traffic.
const KEY_SECRET: &str = "sk-trace-7f3a9c51d2";

#[tokio::test]
async fn trace_logging_prints_no_secret() {
    let api = OrdersApi::start("orders-1");
    let admin_token = "admin-token-s3cr3t";
    let mut gw = Gateway::start_logging(
        |addr, admin| {
            format!(
                "{}admin_token = \"{admin_token}\"\n",
                server_section(addr, admin)
            )
        },
        &format!(
            "{}\n[[auth.keys]]\nid = \"tracer\"\nsecret = \"{KEY_SECRET}\"\nuser = \"t\"\n",
            config(api.addr, true)
        ),
        &[],
        "trace",
    );
    let c = client();
    for (h, v) in [
        ("x-api-key", KEY_SECRET.to_string()),
        ("authorization", format!("Bearer {KEY_SECRET}")),
        ("x-api-key", "sk-unknown-key-99".to_string()),
    ] {
        let r = c
            .get(gw.url("/debug/headers"))
            .header(h, v)
            .send()
            .await
            .unwrap();
        let _ = r.text().await;
    }
    let r = get_with_token(&c, gw.admin_url("/rules"), admin_token).await;
    assert_eq!(r.status(), 200);
    let _ = r.text().await;
    // Stopping writes out the access lines still queued.
    gw.stop();
    let logs = gw.logs();
    // Trace logging is on (our own debug lines are there) ...
    assert!(logs.contains("TRACE") || logs.contains("DEBUG"), "{logs}");
    // ... and no secret is.
    for secret in [KEY_SECRET, admin_token, "sk-unknown-key-99"] {
        assert!(
            !logs.to_lowercase().contains(&secret.to_lowercase()),
            "secret {secret:?} in the logs:\n{logs}"
        );
    }
}
