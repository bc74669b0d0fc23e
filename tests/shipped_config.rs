//! The shipped gateway.toml, run as it is (ports moved to free ones): the rule set of the
//! config contract working end to end.

mod common;

use std::time::{Duration, Instant};

use common::*;

#[tokio::test]
async fn the_shipped_rules_work() {
    let api = OrdersApi::start("orders");
    let (port, admin) = (free_port(), free_port());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.toml");
    std::fs::write(&path, shipped_config(port, admin, api.addr)).unwrap();
    let log = dir.path().join("log");
    let mut child = spawn_floodgate(&path, dir.path(), &log, &[]);
    let addr = format!("127.0.0.1:{port}").parse().unwrap();
    let guard = scopeguard(&mut child);
    wait_for_port(addr, Duration::from_secs(30), guard.0, "floodgate");
    let url = |p: &str| format!("http://127.0.0.1:{port}{p}");
    let c = client();

    // orders-per-key: token bucket, burst 20.
    for i in 0..20 {
        let r = get_with_key(&c, url("/orders"), "test").await;
        assert_eq!(r.status(), 200, "request {i}");
        let policy = r.headers()["ratelimit-policy"].to_str().unwrap();
        assert_eq!(
            policy,
            "\"per-ip-flood\";q=1000;w=1, \"orders-per-key\";q=100;w=60"
        );
    }
    let r = get_with_key(&c, url("/orders"), "test").await;
    assert_eq!(r.status(), 429);
    assert_eq!(
        r.headers()["retry-after"],
        "1",
        "100/min refills one token every 0.6s"
    );

    // login: sliding log, 5 failed logins per minute per IP (the demo API answers 401 to a
    // wrong password), then a 15-minute block.
    for _ in 0..5 {
        assert_eq!(c.post(url("/login")).send().await.unwrap().status(), 401);
    }
    let r = c.post(url("/login")).send().await.unwrap();
    assert_eq!(r.status(), 429);
    let wait: u64 = r.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        (895..=900).contains(&wait),
        "Retry-After {wait}: the 15m block"
    );

    // exports: at most 2 in flight per user.
    let slow = hold_slots(
        &c,
        &url("/exports?delay_ms=1500"),
        &[("x-api-key", "test")],
        2,
    );
    wait_for_status(
        &c,
        &url("/exports"),
        &[("x-api-key", "test")],
        429,
        "two slow exports never filled the slots",
    )
    .await;
    for s in slow {
        assert_eq!(
            s.await.unwrap(),
            404,
            "the demo API has no /exports: admitted and forwarded"
        );
    }

    // partner-smoothing: shaped to one request per 100 ms, not rejected.
    let start = Instant::now();
    let tasks: Vec<_> = (0..5)
        .map(|_| {
            let c = c.clone();
            let u = url("/orders/1");
            tokio::spawn(async move {
                c.get(u)
                    .header("x-api-key", "partner")
                    .send()
                    .await
                    .unwrap()
                    .status()
            })
        })
        .collect();
    for t in tasks {
        assert_eq!(t.await.unwrap(), 200);
    }
    assert!(
        start.elapsed() >= Duration::from_millis(350),
        "not shaped: {:?}",
        start.elapsed()
    );
}

/// Stops the child when the test ends, also on panic.
struct Guard<'a>(&'a mut std::process::Child);

fn scopeguard(child: &mut std::process::Child) -> Guard<'_> {
    Guard(child)
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        stop(self.0);
    }
}
