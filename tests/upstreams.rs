//! Upstreams end to end, real processes on loopback: TLS to an upstream with a private CA
//! (rcgen), mTLS and HTTP/2 to it; health checks taking a killed target out and a restarted one
//! back; passive ejection of a target answering 500; every target down → 503; `localhost` and
//! a name that does not resolve; `check` of the Kubernetes ConfigMap without cluster DNS.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::*;
use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair};
use serde_json::Value;

/// A private CA and what it signs.
struct Ca {
    cert: rcgen::Certificate,
    key: KeyPair,
}

impl Ca {
    fn new(name: &str) -> Ca {
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.distinguished_name.push(DnType::CommonName, name);
        let key = KeyPair::generate().unwrap();
        let cert = p.self_signed(&key).unwrap();
        Ca { cert, key }
    }

    /// (cert PEM, key PEM) for `names`; `expired` gives one valid only in 2020.
    fn issue(&self, names: &[&str], expired: bool, client: bool) -> (String, String) {
        let mut p = CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
            .unwrap();
        p.distinguished_name.push(DnType::CommonName, names[0]);
        if expired {
            p.not_before = rcgen::date_time_ymd(2020, 1, 1);
            p.not_after = rcgen::date_time_ymd(2020, 12, 31);
        }
        if client {
            p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        }
        let key = KeyPair::generate().unwrap();
        let cert = p.signed_by(&key, &self.cert, &self.key).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

fn write(dir: &std::path::Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.to_string_lossy().into_owned()
}

async fn get(c: &reqwest::Client, url: &str) -> (u16, Value) {
    let r = c.get(url).send().await.expect("GET");
    let status = r.status().as_u16();
    let body = r.json().await.unwrap_or(Value::Null);
    (status, body)
}

/// The demo keys, an upstream `orders` over `targets` with `settings` (TOML lines of its
/// table), and the `/orders` route to it (API keys required).
fn orders_over(targets: &[SocketAddr], settings: &str) -> String {
    let targets: Vec<String> = targets.iter().map(|a| format!("\"{a}\"")).collect();
    format!(
        "{DEMO_KEYS}\n[[upstreams]]\nname = \"orders\"\ntargets = [{}]\n{settings}\n\
         [[routes]]\nname = \"orders\"\nmatch = {{ path_prefix = \"/orders\" }}\nupstream = \"orders\"\n",
        targets.join(", ")
    )
}

fn route(name: &str, upstream: &str) -> String {
    format!(
        "[[routes]]\nname = \"{name}\"\nmatch = {{ path_prefix = \"/debug/{name}\" }}\nupstream = \"{upstream}\"\nauth = \"none\"\n"
    )
}

#[tokio::test]
async fn tls_to_upstreams_with_a_private_ca() {
    let files = tempfile::tempdir().unwrap();
    let dir = files.path();
    let ca = Ca::new("floodgate test CA");
    let other_ca = Ca::new("some other CA");
    let (cert, key) = ca.issue(&["upstream.test"], false, false);
    let (old_cert, old_key) = ca.issue(&["upstream.test"], true, false);
    let (gw_cert, gw_key) = ca.issue(&["gateway.test"], false, true);
    let ca_pem = ca.cert.pem();
    let (cert, key) = (write(dir, "up.crt", &cert), write(dir, "up.key", &key));
    let (old_cert, old_key) = (
        write(dir, "old.crt", &old_cert),
        write(dir, "old.key", &old_key),
    );
    let ca_path = write(dir, "ca.pem", &ca_pem);

    let tls = ["--tls-cert", &cert, "--tls-key", &key];
    let good = OrdersApi::start_at("good", free_addr(), &tls);
    let expired = OrdersApi::start_at(
        "expired",
        free_addr(),
        &["--tls-cert", &old_cert, "--tls-key", &old_key],
    );
    let mtls = OrdersApi::start_at(
        "mtls",
        free_addr(),
        &[
            "--tls-cert",
            &cert,
            "--tls-key",
            &key,
            "--client-ca",
            &ca_path,
        ],
    );

    let up = |name: &str, addr: SocketAddr, extra: &str| {
        format!(
            "[[upstreams]]\nname = \"{name}\"\ntargets = [\"{addr}\"]\ntls = true\nsni = \"upstream.test\"\nconnect_timeout = \"2s\"\n{extra}\n"
        )
    };
    let mut body = String::new();
    body += &up("ok", good.addr, "ca_file = \"ca.pem\"");
    body += &up("wrongca", good.addr, "ca_file = \"other.pem\"");
    body += &up("expired", expired.addr, "ca_file = \"ca.pem\"");
    body += &format!(
        "[[upstreams]]\nname = \"wrongsni\"\ntargets = [\"{}\"]\ntls = true\nsni = \"elsewhere.test\"\nca_file = \"ca.pem\"\n",
        good.addr
    );
    body += &up("h2", good.addr, "ca_file = \"ca.pem\"\nhttp2 = true");
    body += &up(
        "mtls",
        mtls.addr,
        "ca_file = \"ca.pem\"\nclient_cert = \"gw.crt\"\nclient_key = \"gw.key\"",
    );
    body += &up("nocert", mtls.addr, "ca_file = \"ca.pem\"");
    for name in [
        "ok", "wrongca", "expired", "wrongsni", "h2", "mtls", "nocert",
    ] {
        body += &route(name, name);
    }
    let gw = Gateway::start_with(
        "",
        &body,
        &[
            ("ca.pem", &ca_pem),
            ("other.pem", &other_ca.cert.pem()),
            ("gw.crt", &gw_cert),
            ("gw.key", &gw_key),
        ],
    );
    let c = client();

    let (status, body) = get(&c, &gw.url("/debug/ok/headers")).await;
    assert_eq!(status, 200, "verified with ca_file: {body}");
    assert_eq!(body["version"], "HTTP/1.1");

    let (status, body) = get(&c, &gw.url("/debug/h2/headers")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["version"], "HTTP/2.0",
        "http2 = true speaks h2 upstream"
    );

    let (status, _) = get(&c, &gw.url("/debug/mtls/headers")).await;
    assert_eq!(status, 200, "the client certificate is presented");

    for (name, why) in [
        ("wrongca", "a certificate from another CA"),
        ("expired", "an expired certificate"),
        ("wrongsni", "a certificate for another name"),
        ("nocert", "an upstream that requires a client certificate"),
    ] {
        let r = c
            .get(gw.url(&format!("/debug/{name}/x")))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 502, "{why}: 502; logs:\n{}", gw.logs());
        assert_eq!(r.headers()["content-type"], "application/problem+json");
    }
    // Log lines reach stderr through the log writer's queue: wait for the last one.
    let deadline = Instant::now() + Duration::from_secs(10);
    let logs = loop {
        let logs = gw.logs();
        if logs.contains("TLS to upstream target failed upstream=nocert")
            || Instant::now() > deadline
        {
            break logs;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let tls_lines: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("TLS to upstream target failed"))
        .collect();
    // (A missing client certificate shows after the TLS 1.3 handshake, as the upstream's
    // "certificate required" alert on the first read: a 502 logged by Pingora with the peer.)
    for name in ["wrongca", "expired", "wrongsni"] {
        assert!(
            tls_lines
                .iter()
                .any(|l| l.contains(&format!("upstream={name}"))),
            "a log line names the upstream {name} and its target: {logs}"
        );
    }
    assert!(
        tls_lines
            .iter()
            .any(|l| l.to_lowercase().contains("expired")),
        "the reason is given: {tls_lines:?}"
    );
    assert!(
        !logs.contains("failed to acquire reusable stream"),
        "Pingora's pool message is not an error line"
    );
}

/// GETs spread over `tasks` concurrent loops until `stop` says so; returns the statuses seen,
/// and who served them.
async fn load(
    c: &reqwest::Client,
    url: String,
    tasks: usize,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Vec<(u16, String)> {
    let mut handles = Vec::new();
    for _ in 0..tasks {
        let (c, url, stop) = (c.clone(), url.clone(), stop.clone());
        handles.push(tokio::spawn(async move {
            let mut seen = Vec::new();
            while !*stop.borrow() {
                let r = c
                    .get(&url)
                    .header("x-api-key", "test")
                    .send()
                    .await
                    .expect("gateway answers");
                let by = r
                    .headers()
                    .get("x-served-by")
                    .map(|v| v.to_str().unwrap().to_string())
                    .unwrap_or_default();
                seen.push((r.status().as_u16(), by));
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            seen
        }));
    }
    let mut all = Vec::new();
    for h in handles {
        all.extend(h.await.unwrap());
    }
    all
}

async fn target_health(c: &reqwest::Client, gw: &Gateway, target: SocketAddr) -> Option<bool> {
    let v = get_json(c, gw.admin_url("/upstreams")).await;
    v["upstreams"][0]["targets"]
        .as_array()?
        .iter()
        .find(|t| t["target"] == target.to_string())
        .map(|t| t["healthy"] == true)
}

async fn wait_health(c: &reqwest::Client, gw: &Gateway, target: SocketAddr, healthy: bool) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while target_health(c, gw, target).await != Some(healthy) {
        assert!(
            Instant::now() < deadline,
            "{target} never became healthy={healthy}: {}",
            get_text(c, gw.admin_url("/upstreams")).await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_killed_target_is_taken_out_and_comes_back() {
    let mut a = OrdersApi::start_at("orders-a", free_addr(), &[]);
    let b = OrdersApi::start_at("orders-b", free_addr(), &[]);
    let body = orders_over(
        &[a.addr, b.addr],
        "connect_timeout = \"500ms\"\nretries = 1\n\
         health_check = { type = \"http\", path = \"/healthz\", interval = \"100ms\", timeout = \"500ms\", healthy_threshold = 2, unhealthy_threshold = 2 }",
    );
    let gw = Gateway::start(&body);
    let c = client();
    wait_health(&c, &gw, a.addr, true).await;

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let (c2, url) = (c.clone(), gw.url("/orders"));
    let running = tokio::spawn(async move { load(&c2, url, 4, stop_rx).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    a.kill();
    wait_health(&c, &gw, a.addr, false).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop_tx.send(true).unwrap();
    let seen = running.await.unwrap();
    let failed: Vec<&(u16, String)> = seen.iter().filter(|(s, _)| *s >= 500).collect();
    assert!(
        failed.is_empty(),
        "no GET fails while a target dies (retried on the other, then taken out): {failed:?} of {}",
        seen.len()
    );
    let metrics = get_text(&c, gw.admin_url("/metrics")).await;
    assert!(
        metrics.contains(&format!(
            "floodgate_upstream_target_healthy{{target=\"{}\",upstream=\"orders\"}} 0",
            a.addr
        )),
        "{metrics}"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while !gw.logs().contains(&format!(
        "upstream \"orders\" target {} ({}) becomes unhealthy",
        a.addr, a.addr
    )) {
        assert!(
            Instant::now() < deadline,
            "the transition is logged: {}",
            gw.logs()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // A reload that leaves the health check alone keeps each target's health: the dead target
    // is still out the moment the new config is in force.
    let path = gw.dir.path().join("gateway.toml");
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace("connect_timeout = \"500ms\"", "connect_timeout = \"400ms\"");
    std::fs::write(&path, text).unwrap();
    let r = c.post(gw.admin_url("/reload")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        target_health(&c, &gw, a.addr).await,
        Some(false),
        "a reload keeps the health of targets that stay"
    );

    // Restarted where it was: checked healthy again, it gets traffic.
    let _a = OrdersApi::start_at("orders-a", a.addr, &[]);
    wait_health(&c, &gw, a.addr, true).await;
    let mut by_a = 0;
    for _ in 0..10 {
        let r = get_with_key(&c, gw.url("/orders"), "test").await;
        assert_eq!(r.status(), 200);
        by_a += usize::from(r.headers()["x-served-by"] == "orders-a");
    }
    assert!(
        by_a >= 3,
        "the restarted target serves again ({by_a} of 10)"
    );
    drop(b);
}

#[tokio::test]
async fn passive_ejection_of_a_target_answering_500() {
    let good = OrdersApi::start_at("good", free_addr(), &[]);
    let sick = OrdersApi::start_at("sick", free_addr(), &["--status", "500"]);
    let body = orders_over(
        &[good.addr, sick.addr],
        "passive = { consecutive_failures = 2, eject = \"1h\" }",
    );
    let gw = Gateway::start(&body);
    let c = client();
    let mut statuses = Vec::new();
    for _ in 0..30 {
        let r = get_with_key(&c, gw.url("/orders"), "test").await;
        statuses.push(r.status().as_u16());
    }
    let errors = statuses.iter().filter(|s| **s == 500).count();
    assert_eq!(errors, 2, "two 500s eject the sick target: {statuses:?}");
    assert!(statuses[statuses.len() - 20..].iter().all(|s| *s == 200));
    let v = get_json(&c, gw.admin_url("/upstreams")).await;
    let sick_entry = &v["upstreams"][0]["targets"][1];
    assert_eq!(sick_entry["healthy"], false, "{v}");
    assert_eq!(sick_entry["addrs"][0]["ejected"], true, "{v}");
    assert!(gw.logs().contains("ejected after consecutive failures"));
}

#[tokio::test]
async fn consistent_hashing_on_the_normalized_path() {
    let apis = [
        OrdersApi::start_at("orders-a", free_addr(), &[]),
        OrdersApi::start_at("orders-b", free_addr(), &[]),
        OrdersApi::start_at("orders-c", free_addr(), &[]),
    ];
    let body = format!(
        "[[upstreams]]\nname = \"orders\"\ntargets = [\"{}\", \"{}\", \"{}\"]\n\
         balance = \"consistent\"\nhash_key = [\"path\"]\n\
         [[routes]]\nname = \"debug\"\nmatch = {{ path_prefix = \"/debug\" }}\nupstream = \"orders\"\nauth = \"none\"\n",
        apis[0].addr, apis[1].addr, apis[2].addr
    );
    let gw = Gateway::start(&body);
    // Raw requests: an HTTP client library would clean the dot segments itself.
    let served_by = |path: &str| {
        let answer = http_get_raw(gw.addr, path, Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("{path}: {e}"));
        assert!(answer.starts_with("HTTP/1.1 200"), "{path}: {answer}");
        answer
            .lines()
            .find_map(|l| l.strip_prefix("x-served-by: "))
            .unwrap_or_else(|| panic!("{path}: no x-served-by in {answer}"))
            .to_string()
    };
    // One path, one target, however often and however it is spelled: a client cannot move
    // its requests to another target (or spread them) by re-spelling the path.
    let home = served_by("/debug/items/42");
    for path in [
        "/debug/items/42",
        "/debug/items/./42",
        "/debug/x/../items/42",
        "/debug//items/42",
        "/debug/items/%34%32",
        "/debug/%69tems/42",
        "/debug/it%65ms/4%32",
        "/debug/%69%74%65%6D%73/%34%32",
    ] {
        for _ in 0..3 {
            assert_eq!(served_by(path), home, "{path}");
        }
    }
    // Different paths spread over the targets.
    let mut seen = std::collections::BTreeSet::new();
    for path in [
        "/debug/a", "/debug/b", "/debug/c", "/debug/d", "/debug/e", "/debug/f", "/debug/g",
        "/debug/h", "/debug/i", "/debug/j", "/debug/k", "/debug/l",
    ] {
        let target = served_by(path);
        // A trailing slash is the same resource to counters and to hashing alike (one
        // key-part reader): it goes where the path without it goes.
        assert_eq!(served_by(&format!("{path}/")), target, "{path}/");
        seen.insert(target);
    }
    assert!(seen.len() >= 2, "twelve paths all on one target: {seen:?}");
}

#[tokio::test]
async fn a_retry_forwards_the_normalized_path() {
    // A target that accepts each connection and closes it without a byte of answer (after
    // the request was sent: the request had already been prepared for it) and one that answers:
    // every request the round robin sends to the first is retried on the second, which must
    // receive the path as normalized, like a request that went there at once.
    let live = OrdersApi::start_at("orders-live", free_addr(), &[]);
    let closer = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dead = closer.local_addr().unwrap();
    let closing = tokio::spawn(async move {
        use tokio::io::AsyncReadExt;
        while let Ok((mut conn, _)) = closer.accept().await {
            // Read what comes (the request), then close without answering.
            let mut buf = [0u8; 4096];
            let _ = tokio::time::timeout(Duration::from_millis(200), conn.read(&mut buf)).await;
        }
    });
    let body = format!(
        "[[upstreams]]\nname = \"orders\"\ntargets = [\"{dead}\", \"{}\"]\n\
         [[routes]]\nname = \"debug\"\nmatch = {{ path_prefix = \"/debug\" }}\nupstream = \"orders\"\nauth = \"none\"\n",
        live.addr
    );
    let gw = Gateway::start(&body);
    let c = client();
    for _ in 0..4 {
        // Off the runtime's thread: the closing target above runs on it.
        let addr = gw.addr;
        let (status, body) = tokio::task::spawn_blocking(move || {
            http_get(addr, "/debug/x/../echo", Duration::from_secs(10))
        })
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(status, 200, "{body}");
        let echoed: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
        assert_eq!(echoed["path"], "/debug/echo", "{body}");
    }
    // The closing target was tried (and failed) at least once: the retry path ran.
    let metrics = get_text(&c, gw.admin_url("/metrics")).await;
    let failed: f64 = metrics
        .lines()
        .filter(|l| {
            l.starts_with("floodgate_upstream_target_responses_total{")
                && l.contains("class=\"error\"")
                && l.contains(&dead.to_string())
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(
        failed >= 1.0,
        "no attempt on the closing target:\n{metrics}"
    );
    closing.abort();
}

#[tokio::test]
async fn every_target_down_is_503_with_retry_after() {
    let dead = free_addr();
    let body = orders_over(
        &[dead],
        "health_check = { type = \"tcp\", interval = \"1s\", timeout = \"200ms\", unhealthy_threshold = 1 }",
    );
    let gw = Gateway::start(&body);
    let c = client();
    wait_for_status(
        &c,
        &gw.url("/orders"),
        &[("x-api-key", "test")],
        503,
        "a target failing its check is out; none left: 503",
    )
    .await;
    let r = get_with_key(&c, gw.url("/orders"), "test").await;
    assert_eq!(r.status(), 503);
    assert_eq!(r.headers()["retry-after"], "1");
    assert_eq!(r.headers()["content-type"], "application/problem+json");
    let p: Value = r.json().await.unwrap();
    assert_eq!(p["type"], "urn:floodgate:problem:no-healthy-upstream");
}

/// The Orders API on `port` of 127.0.0.1 (served by "v4") and, where the machine has it, of
/// ::1 ("v6"): `localhost` may resolve to both.
fn on_both_loopbacks(port: u16) -> (OrdersApi, Option<OrdersApi>) {
    let v4: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let a4 = OrdersApi::start_at("v4", v4, &[]);
    let v6: SocketAddr = format!("[::1]:{port}").parse().unwrap();
    let a6 = std::net::TcpListener::bind(v6)
        .ok()
        .map(drop)
        .map(|()| OrdersApi::start_at("v6", v6, &[]));
    (a4, a6)
}

#[tokio::test]
async fn localhost_resolves_and_an_unresolvable_name_is_a_target_down() {
    let port = free_port();
    let (_a4, _a6) = on_both_loopbacks(port);
    let body = format!(
        "[[upstreams]]\nname = \"orders\"\ntargets = [\"localhost:{port}\", \"nothere.invalid:{port}\"]\nhost_header = \"orders.internal\"\n\
         [[routes]]\nname = \"debug\"\nmatch = {{ path_prefix = \"/debug\" }}\nupstream = \"orders\"\nauth = \"none\"\n"
    );
    let gw = Gateway::start(&body);
    let c = client();
    let mut served = std::collections::BTreeSet::new();
    for _ in 0..10 {
        let r = c.get(gw.url("/debug/headers")).send().await.unwrap();
        assert_eq!(
            r.status(),
            200,
            "localhost serves; the .invalid name is skipped"
        );
        served.insert(r.headers()["x-served-by"].to_str().unwrap().to_string());
        let body: Value = r.json().await.unwrap();
        assert_eq!(
            body["headers"]["host"], "orders.internal",
            "host_header is sent"
        );
    }
    let resolved: Vec<SocketAddr> = std::net::ToSocketAddrs::to_socket_addrs(&("localhost", port))
        .unwrap()
        .collect();
    for addr in &resolved {
        let name = if addr.is_ipv4() { "v4" } else { "v6" };
        assert!(
            served.contains(name),
            "every address of localhost gets traffic: {served:?}"
        );
    }
    let v = get_json(&c, gw.admin_url("/upstreams")).await;
    let invalid = &v["upstreams"][0]["targets"][1];
    assert_eq!(invalid["target"], format!("nothere.invalid:{port}"));
    assert_eq!(invalid["healthy"], false, "{v}");
    assert!(invalid["resolve_error"].is_string(), "{v}");
    assert!(
        gw.logs().contains("does not resolve"),
        "a warning, not a refusal to start"
    );
}

#[tokio::test]
async fn a_name_that_resolves_late_becomes_healthy_with_every_address() {
    let port = free_port();
    let (_a4, a6) = on_both_loopbacks(port);
    // The name is in no resolver yet: floodgate's own hosts file is empty.
    let hosts_dir = tempfile::tempdir().unwrap();
    let hosts = hosts_dir.path().join("hosts");
    std::fs::write(&hosts, "# filled in by the test\n").unwrap();
    let body = format!(
        "[[upstreams]]\nname = \"orders\"\ntargets = [\"orders.late.test:{port}\"]\nresolve_interval = \"100ms\"\n\
         [[routes]]\nname = \"debug\"\nmatch = {{ path_prefix = \"/debug\" }}\nupstream = \"orders\"\nauth = \"none\"\n"
    );
    let gw = Gateway::start_env(
        server_section,
        &body,
        &[],
        &[("FLOODGATE_HOSTS_FILE", hosts.to_str().unwrap())],
    );
    let c = client();
    let r = c.get(gw.url("/debug/x")).send().await.unwrap();
    assert_eq!(r.status(), 503, "no address yet: no healthy target");
    let p: Value = r.json().await.unwrap();
    assert_eq!(p["type"], "urn:floodgate:problem:no-healthy-upstream");

    // The name starts resolving, to every address the test listens on.
    let mut records = String::from("127.0.0.1 orders.late.test\n");
    if a6.is_some() {
        records.push_str("::1 orders.late.test\n");
    }
    std::fs::write(&hosts, records).unwrap();
    let want: std::collections::BTreeSet<&str> = if a6.is_some() {
        ["v4", "v6"].into()
    } else {
        ["v4"].into()
    };
    let mut served = std::collections::BTreeSet::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while served.len() < want.len() {
        assert!(
            std::time::Instant::now() < deadline,
            "the name never served from every address: {served:?}"
        );
        let r = c.get(gw.url("/debug/x")).send().await.unwrap();
        if r.status() == 200 {
            let by = r.headers()["x-served-by"].to_str().unwrap().to_string();
            served.insert(by);
        } else {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    assert_eq!(
        served
            .iter()
            .map(String::as_str)
            .collect::<std::collections::BTreeSet<_>>(),
        want
    );
}

#[test]
fn check_never_resolves_names() {
    // A name no resolver knows passes `check`: it is syntax, not reachability.
    let (ok, stdout, stderr) = check(
        "[[upstreams]]\nname = \"o\"\ntargets = [\"orders.internal.invalid:443\", { addr = \"10.0.0.2:443\", weight = 3 }]\n\
         tls = true\nsni = \"orders.internal\"\nhealth_check = { type = \"http\", path = \"/healthz\" }\npassive = { consecutive_failures = 5, eject = \"30s\" }\n\
         [[routes]]\nname = \"r\"\nupstream = \"o\"\n",
        &[],
    );
    assert!(ok, "{stderr}");
    assert!(stdout.contains("TLS sni orders.internal"), "{stdout}");
    assert!(stdout.contains("http check /healthz"), "{stdout}");

    let (ok, _, stderr) = check(
        "[[upstreams]]\nname = \"o\"\ntargets = [\"no port\"]\n[[routes]]\nname = \"r\"\nupstream = \"o\"\n",
        &[],
    );
    assert!(!ok);
    assert!(stderr.contains("is not host:port"), "{stderr}");

    let (ok, _, stderr) = check(
        "[[upstreams]]\nname = \"o\"\ntargets = [\"a:1\"]\nsni = \"x\"\n[[routes]]\nname = \"r\"\nupstream = \"o\"\n",
        &[],
    );
    assert!(!ok);
    assert!(
        stderr.contains("sni applies only to an upstream with tls = true"),
        "{stderr}"
    );

    let (ok, _, stderr) = check(
        "[[upstreams]]\nname = \"o\"\ntargets = [\"a:1\"]\ntls = true\nca_file = \"missing.pem\"\n[[routes]]\nname = \"r\"\nupstream = \"o\"\n",
        &[],
    );
    assert!(!ok);
    assert!(stderr.contains("ca_file \"missing.pem\""), "{stderr}");

    let (ok, stdout, _) = check(
        "[[upstreams]]\nname = \"o\"\ntargets = [\"a:1\"]\ntls = true\nverify = false\n[[routes]]\nname = \"r\"\nupstream = \"o\"\n",
        &[],
    );
    assert!(ok);
    assert!(
        stdout.contains("warning: upstream \"o\" has verify = false"),
        "{stdout}"
    );
}

#[test]
fn k8s_configmap_checks_without_cluster_dns() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/k8s");
    let docs = |file: &str| -> Vec<serde_yaml::Value> {
        let text = std::fs::read_to_string(root.join(file)).unwrap();
        serde_yaml::Deserializer::from_str(&text)
            .map(|d| serde::Deserialize::deserialize(d).unwrap())
            .collect()
    };
    let config = docs("configmap.yaml")
        .into_iter()
        .find_map(|d| d["data"]["gateway.toml"].as_str().map(str::to_string))
        .expect("ConfigMap data gateway.toml");
    let keys = docs("secret.yaml")
        .into_iter()
        .find_map(|d| d["stringData"]["keys.toml"].as_str().map(str::to_string))
        .expect("Secret keys.toml");
    assert!(
        config.contains("\"orders-api:9000\""),
        "a cluster-only name"
    );
    // The admin token file comes from a Secret each operator makes (deploy/k8s).
    let (ok, stdout, stderr) = check(
        &config,
        &[("keys.toml", &keys), ("admin-token", "test-admin-token")],
    );
    assert!(ok, "{stderr}\n{stdout}");
}

#[tokio::test]
async fn total_timeout_and_retries_only_for_idempotent_methods() {
    let api = OrdersApi::start_at("live", free_addr(), &[]);
    let dead = free_addr();
    let body = format!(
        "{DEMO_KEYS}\n[[upstreams]]\nname = \"slow\"\ntargets = [\"{live}\"]\ntimeout = \"1s\"\nread_timeout = \"30s\"\n\
         [[upstreams]]\nname = \"flaky\"\ntargets = [\"{dead}\", \"{live}\"]\nretries = 1\n\
         [[routes]]\nname = \"debug\"\nmatch = {{ path_prefix = \"/debug\" }}\nupstream = \"slow\"\nauth = \"none\"\n\
         [[routes]]\nname = \"orders\"\nmatch = {{ path_prefix = \"/orders\" }}\nupstream = \"flaky\"\n",
        live = api.addr
    );
    let gw = Gateway::start(&body);
    let c = client();

    let r = c
        .get(gw.url("/debug/x?delay_ms=3000"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.status(),
        504,
        "past the total timeout, though within read_timeout"
    );
    let p: Value = r.json().await.unwrap();
    assert_eq!(p["type"], "urn:floodgate:problem:upstream");

    for _ in 0..6 {
        let r = get_with_key(&c, gw.url("/orders"), "test").await;
        assert_eq!(
            r.status(),
            200,
            "a GET refused by one target is retried on the other"
        );
    }
    let mut statuses = Vec::new();
    for _ in 0..6 {
        let r = c
            .post(gw.url("/orders"))
            .header("x-api-key", "test")
            .json(&serde_json::json!({"item": "tea"}))
            .send()
            .await
            .unwrap();
        statuses.push(r.status().as_u16());
    }
    assert!(
        statuses.contains(&502),
        "a POST is never retried: {statuses:?}"
    );
    assert!(statuses.contains(&201), "{statuses:?}");
}

/// Each attempt is counted once in `floodgate_upstream_target_responses_total`:
/// with one of two targets refusing connections and no retries, the dead target's `error`
/// count is exactly the number of requests answered 502.
#[tokio::test]
async fn each_failed_attempt_is_counted_once() {
    let api = OrdersApi::start("orders-live");
    let dead = free_addr();
    let body = format!(
        "[[upstreams]]\nname = \"orders\"\ntargets = [\"{}\", \"{dead}\"]\nretries = 0\n\n\
         [[routes]]\nname = \"debug\"\nmatch = {{ path_prefix = \"/debug\" }}\nupstream = \"orders\"\nauth = \"none\"\n",
        api.addr
    );
    let gw = Gateway::start(&body);
    let c = client();
    let (mut failed, mut served) = (0, 0);
    for i in 0..20 {
        let r = c.get(gw.url(&format!("/debug/{i}"))).send().await.unwrap();
        match r.status().as_u16() {
            502 => failed += 1,
            200 => served += 1,
            s => panic!("status {s}"),
        }
    }
    assert!(failed > 0 && served > 0, "{failed} failed, {served} served");
    let m = get_text(&c, gw.admin_url("/metrics")).await;
    let series = |target: &str, class: &str| {
        metric_value(
            &m,
            &format!(
                "floodgate_upstream_target_responses_total{{class=\"{class}\",target=\"{target}\",upstream=\"orders\"}}"
            ),
        )
        .unwrap_or(0.0)
    };
    assert_eq!(series(&dead.to_string(), "error"), f64::from(failed), "{m}");
    assert_eq!(
        series(&api.addr.to_string(), "2xx"),
        f64::from(served),
        "{m}"
    );
}

/// The same with retries: a target that accepts and closes at once (a reset before any
/// response byte) counts one `error` per connection it accepted, whatever the retry did next.
#[tokio::test]
async fn each_reset_attempt_is_counted_once_with_retries() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let api = OrdersApi::start("orders-live");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let bad = listener.local_addr().unwrap();
    let accepted = std::sync::Arc::new(AtomicUsize::new(0));
    let seen = accepted.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            seen.fetch_add(1, Ordering::SeqCst);
            // Read the request, then close without a byte of answer.
            let mut buf = [0u8; 4096];
            let _ = std::io::Read::read(&mut conn, &mut buf);
        }
    });
    let body = format!(
        "[[upstreams]]\nname = \"orders\"\ntargets = [\"{}\", \"{bad}\"]\nretries = 1\n\n\
         [[routes]]\nname = \"debug\"\nmatch = {{ path_prefix = \"/debug\" }}\nupstream = \"orders\"\nauth = \"none\"\n",
        api.addr
    );
    let gw = Gateway::start(&body);
    let c = client();
    for i in 0..20 {
        let r = c.get(gw.url(&format!("/debug/{i}"))).send().await.unwrap();
        assert_eq!(r.status(), 200);
    }
    let m = get_text(&c, gw.admin_url("/metrics")).await;
    let series = |target: &str, class: &str| {
        metric_value(
            &m,
            &format!(
                "floodgate_upstream_target_responses_total{{class=\"{class}\",target=\"{target}\",upstream=\"orders\"}}"
            ),
        )
        .unwrap_or(0.0)
    };
    let attempts = accepted.load(Ordering::SeqCst) as f64;
    assert!(attempts > 0.0);
    // Round robin gives the failing target every other request's first attempt, not more: a
    // retry does not take a turn (it used to: 19 of 20 requests tried the bad target first).
    assert!(
        attempts <= 11.0,
        "the failing target got {attempts} first attempts of 20"
    );
    assert_eq!(series(&bad.to_string(), "error"), attempts, "{m}");
    assert_eq!(series(&api.addr.to_string(), "2xx"), 20.0, "{m}");
}

/// A client that goes away mid-exchange is not the target's failure: hostile clients that
/// abort requests (reset their connection before the answer) must not get a healthy target
/// ejected by passive outlier detection, nor counted as its errors.
#[tokio::test]
async fn clients_that_abort_do_not_eject_a_healthy_target() {
    use std::io::Write;
    use std::os::fd::AsRawFd;
    let api = OrdersApi::start("orders-live");
    let body = format!(
        "[[upstreams]]\nname = \"orders\"\ntargets = [\"{}\"]\n\
         passive = {{ consecutive_failures = 2, eject = \"1h\" }}\n\n\
         [[routes]]\nname = \"debug\"\nmatch = {{ path_prefix = \"/debug\" }}\nupstream = \"orders\"\nauth = \"none\"\n",
        api.addr
    );
    let gw = Gateway::start(&body);
    for i in 0..6 {
        let mut s = std::net::TcpStream::connect(gw.addr).unwrap();
        s.write_all(
            format!("GET /debug/abort{i}?delay_ms=200 HTTP/1.1\r\nhost: a\r\n\r\n").as_bytes(),
        )
        .unwrap();
        // Reset (SO_LINGER 0) before the answer comes.
        let linger = libc::linger {
            l_onoff: 1,
            l_linger: 0,
        };
        // SAFETY: setsockopt on a socket this test owns, with a struct of the right size.
        unsafe {
            libc::setsockopt(
                s.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_LINGER,
                &linger as *const _ as *const libc::c_void,
                std::mem::size_of::<libc::linger>() as libc::socklen_t,
            );
        }
        std::thread::sleep(Duration::from_millis(50));
        drop(s);
    }
    // Let the aborted exchanges end (their upstream answers come after 200 ms).
    let c = client();
    eventually(
        Duration::from_secs(10),
        "the aborted requests are over",
        || {
            let c = c.clone();
            let url = gw.admin_url("/metrics");
            async move {
                let m = get_text(&c, &url).await;
                let ended: f64 = m
                    .lines()
                    .filter(|l| l.starts_with("floodgate_requests_total{route=\"debug\""))
                    .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                    .sum();
                (ended >= 6.0).then_some(())
            }
        },
    )
    .await;
    let v = get_json(&c, gw.admin_url("/upstreams")).await;
    let target = &v["upstreams"][0]["targets"][0]["addrs"][0];
    assert_eq!(target["ejected"], false, "{v}");
    let m = get_text(&c, gw.admin_url("/metrics")).await;
    let errors = m
        .lines()
        .find(|l| l.starts_with("floodgate_upstream_target_responses_total{class=\"error\""))
        .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok());
    assert_eq!(
        errors,
        Some(0.0),
        "a client's abort counted as the target's error\n{m}"
    );
    let r = c.get(gw.url("/debug/after")).send().await.unwrap();
    assert_eq!(r.status(), 200);
}

/// A target whose active health check fails gets no request, whichever floodgate balancer picks
/// (round robin and least requests ask the health check's readiness themselves), even while it
/// would answer them well: the check's path answers 404 on `orders-a` and 200 on `orders-b`
/// (`--status 200` answers every path but `/healthz` with 200), the route's path 200 on both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_failing_its_check_gets_no_request_from_either_balancer() {
    let a = OrdersApi::start_at("orders-a", free_addr(), &[]);
    let b = OrdersApi::start_at("orders-b", free_addr(), &["--status", "200"]);
    for balance in ["round_robin", "least_requests"] {
        let body = orders_over(
            &[a.addr, b.addr],
            &format!(
                "balance = \"{balance}\"\n\
                 health_check = {{ type = \"http\", path = \"/check\", interval = \"100ms\", timeout = \"500ms\", healthy_threshold = 1, unhealthy_threshold = 1 }}"
            ),
        );
        let gw = Gateway::start(&body);
        let c = client();
        wait_health(&c, &gw, a.addr, false).await;
        wait_health(&c, &gw, b.addr, true).await;
        let mut served_by = std::collections::BTreeMap::new();
        for _ in 0..20 {
            let r = get_with_key(&c, gw.url("/orders"), "test").await;
            assert_eq!(r.status(), 200, "{balance}");
            let by = r.headers()["x-served-by"].to_str().unwrap().to_string();
            *served_by.entry(by).or_insert(0) += 1;
        }
        assert_eq!(
            served_by,
            std::collections::BTreeMap::from([("orders-b".to_string(), 20)]),
            "{balance}: only the target that passes its check serves"
        );
    }
}
