//! The admin dashboard and `GET /top` through the real binary: who is being limited, by which
//! rule, with bounded counts and no secret shown; and the page itself in a real headless
//! Chromium driven through WebDriver (Debian's `chromium` and `chromium-driver`, installed by
//! `make deps`). Without chromedriver the browser test skips with a message, except under CI
//! (`CI` set), where it fails. Every run leaves a screenshot in `target/dashboard.png` (and
//! `target/dashboard-phone.png`). The same browser also runs a page of another origin that
//! calls the gateway with `fetch`, through a route's `cors`: what a page sees of its limits.

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use fantoccini::{Client, ClientBuilder, Locator};
use futures::FutureExt as _;
use serde_json::Value;

/// One rule that limits the demo key after 4 requests, one that never limits and is keyed on
/// the auth header (a secret the page must never show), and a per-IP rule.
const RULES: &str = r#"
[[rules]]
name = "tight"
match = { route = "orders" }
key = ["api_key"]
algorithm = "fixed_window"
limit = 4
window = "1h"

[[rules]]
name = "by-secret-header"
key = ["header:x-api-key", "query:page"]
algorithm = "token_bucket"
limit = 1000
window = "1s"
scope = "local"

[[rules]]
name = "per-ip"
key = ["ip"]
algorithm = "sliding_window_counter"
limit = 10000
window = "1m"

[[rules]]
name = "per-tenant"
match = { header = { name = "x-tenant" } }
key = ["header:x-tenant"]
algorithm = "fixed_window"
limit = 1
window = "1h"
"#;

/// A request header value made to read as three key parts when shown unquoted.
const SPOOF: &str = "x api_key=acme-prod ip=10.0.0.1";

/// The key parts a reader takes from a shown client: `name=value` separated by spaces, where a
/// value is either a JSON string (quoted) or the text up to the next space.
fn read_parts(shown: &str) -> Vec<(String, String)> {
    let mut parts = Vec::new();
    let mut rest = shown.trim();
    while let Some((name, after)) = rest.split_once('=') {
        let (value, tail) = if after.starts_with('"') {
            let mut de = serde_json::Deserializer::from_str(after).into_iter::<String>();
            let value = de.next().expect("a value").expect("a JSON string");
            (value, &after[de.byte_offset()..])
        } else {
            let end = after.find(' ').unwrap_or(after.len());
            (after[..end].to_string(), &after[end..])
        };
        parts.push((name.trim().to_string(), value));
        rest = tail.trim_start();
    }
    parts
}

/// A token issuer with its key in the config: the page lists it with its key ids.
const ISSUER: &str = r#"[[auth.jwt]]
name = "corp"
issuer = "https://idp.corp.example"
audiences = ["orders"]
jwks = '''{"keys": [{"kty": "EC", "crv": "P-256", "kid": "ec-1", "alg": "ES256", "use": "sig",
  "x": "f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU",
  "y": "x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"}]}'''
"#;

fn config(api: SocketAddr) -> String {
    format!(
        "{DEMO_KEYS}\n{ISSUER}\n{}[upstreams.protect]\nmin_limit = 6\n\n[[routes]]\nname = \"orders\"\nmatch = {{ path_prefix = \"/orders\" }}\nupstream = \"orders\"\nauth = \"optional\"\n{RULES}",
        orders_upstream(&[api])
    )
}

/// Sends `n` requests with the demo key `test`; returns how many were rejected with 429.
async fn send(c: &reqwest::Client, gw: &Gateway, n: usize) -> usize {
    let mut rejected = 0;
    for _ in 0..n {
        let r = c
            .get(gw.url("/orders?page=2"))
            .header("x-api-key", "test")
            .send()
            .await
            .expect("request");
        match r.status().as_u16() {
            200 => {}
            429 => rejected += 1,
            other => panic!("unexpected status {other}"),
        }
    }
    rejected
}

fn top_url(gw: &Gateway, query: &str) -> String {
    gw.admin_url(&format!("/top?{query}"))
}

#[tokio::test]
async fn top_names_the_limited_client_and_never_a_secret() {
    let api = OrdersApi::start("orders");
    let gw = Gateway::start(&config(api.addr));
    let c = client();
    assert_eq!(send(&c, &gw, 10).await, 6);

    let t = get_json(&c, top_url(&gw, "rule=tight&window=1m&by=rejected&limit=5")).await;
    assert_eq!(t["rule"], "tight");
    assert_eq!(t["window"], "1m");
    assert_eq!(t["by"], "rejected");
    assert_eq!(t["total"], 6);
    let first = &t["clients"][0];
    assert_eq!(first["key"], serde_json::json!({"api_key": "acme-prod"}));
    // Fewer clients than counters: the counts are exact.
    assert_eq!(first["count"], 6);
    assert_eq!(first["error"], 0);
    assert_eq!(first["rejected"], 6);
    assert_eq!(first["admitted"], 4);
    let t = get_json(&c, top_url(&gw, "rule=tight&window=1h&by=admitted")).await;
    assert_eq!(t["clients"][0]["count"], 4);

    // The auth header's value is the client's secret: shown as a digest, never as sent.
    let t = get_json(&c, top_url(&gw, "rule=by-secret-header&by=admitted")).await;
    let key = &t["clients"][0]["key"];
    let shown = key["header:x-api-key"].as_str().unwrap();
    assert!(shown.starts_with("sha256:"), "{key}");
    assert_eq!(key["query:page"], "2");
    for path in ["/top?rule=by-secret-header&by=admitted", "/stats"] {
        let body = get_text(&c, gw.admin_url(path)).await;
        assert!(
            !body.contains("\"test\""),
            "{path} shows the secret: {body}"
        );
    }

    let s = get_json(&c, gw.admin_url("/stats")).await;
    let tight = &s["rules"][0];
    assert_eq!(tight["name"], "tight");
    assert_eq!(tight["counters"]["rejected"], 6);
    let series: u64 = tight["series"]["rejected"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .sum();
    assert_eq!(series, 6);
    assert_eq!(s["store"]["backend"], "memory");
    assert_eq!(s["store"]["up"], true);
    assert_eq!(s["config"]["reload"]["generation"], 1);

    for (query, status) in [
        ("window=1m", 400),
        ("rule=tight&window=5m", 400),
        ("rule=tight&by=allowed", 400),
        ("rule=tight&limit=0", 400),
        ("rule=tight&limit=ten", 400),
        ("rule=tight&color=red", 400),
        ("rule=nope", 404),
    ] {
        let r = c.get(top_url(&gw, query)).send().await.unwrap();
        assert_eq!(r.status(), status, "{query}");
        assert_eq!(r.headers()["content-type"], "application/problem+json");
    }
    // Rule names are percent-decoded.
    let r = c.get(top_url(&gw, "rule=per%2Dip")).send().await.unwrap();
    assert_eq!(r.status(), 200);
}

#[tokio::test]
async fn top_clients_can_be_turned_off_and_the_token_guards_the_data() {
    let api = OrdersApi::start("orders");
    let gw = Gateway::start_with(
        "top_clients = false\nadmin_token = \"s3cret-admin\"",
        &config(api.addr),
        &[],
    );
    let c = client();
    send(&c, &gw, 6).await;
    for path in ["/top?rule=tight", "/stats"] {
        let r = c.get(gw.admin_url(path)).send().await.unwrap();
        assert_eq!(r.status(), 401, "{path} without the token");
    }
    // The page holds no data: it loads without the token and asks for it.
    let r = c.get(gw.admin_url("/")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/html"));
    let page = r.text().await.unwrap();
    assert!(!page.contains("tight") && !page.contains("acme"));
    let r = get_with_token(&c, top_url(&gw, "rule=tight"), "s3cret-admin").await;
    assert_eq!(r.status(), 404, "top clients are off");
    let s: Value = get_with_token(&c, gw.admin_url("/stats"), "s3cret-admin")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(s["top_clients"], false);
    assert!(s["rules"][0].get("series").is_none());
    assert_eq!(s["rules"][0]["counters"]["rejected"], 2);
}

// ---- The page in a real browser ----

/// A chromedriver on a free loopback port, killed on drop.
struct Driver {
    child: Child,
    url: String,
    _profile: tempfile::TempDir,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn on_path(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// chromedriver and the Chromium it drives, or `None` (the test then skips) when they are not
/// installed, unless under CI, where a missing browser is a failure.
fn browser() -> Option<(PathBuf, PathBuf)> {
    let driver = on_path("chromedriver");
    let chromium = ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .find_map(|n| on_path(n));
    match (driver, chromium) {
        (Some(d), Some(c)) => Some((d, c)),
        _ if std::env::var_os("CI").is_some() => {
            panic!("chromedriver and chromium are needed for the dashboard test (make deps installs Debian's chromium and chromium-driver)")
        }
        _ => {
            eprintln!("SKIPPED: chromedriver or chromium not found; `make deps` installs Debian's chromium and chromium-driver");
            None
        }
    }
}

fn start_driver(driver: &Path) -> Driver {
    let port = free_port();
    let mut child = Command::new(driver)
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start chromedriver");
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    wait_for_port(addr, Duration::from_secs(20), &mut child, "chromedriver");
    Driver {
        child,
        url: format!("http://{addr}"),
        _profile: tempfile::tempdir().expect("profile dir"),
    }
}

async fn connect(d: &Driver, chromium: &Path) -> Client {
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        serde_json::json!({
            "binary": chromium,
            "args": [
                "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1280,1100", "--no-first-run", "--disable-extensions",
                // Names of an attacker's that resolve to loopback, as a DNS-rebinding name
                // does once re-pointed.
                "--host-resolver-rules=MAP *.rebind.test 127.0.0.1",
                format!("--user-data-dir={}", d._profile.path().display()),
            ],
        }),
    );
    // WebDriver is plain HTTP on loopback, but fantoccini's client is built with rustls, and
    // the dependency tree enables two crypto providers: pick one.
    let _ = rustls::crypto::ring::default_provider().install_default();
    ClientBuilder::rustls()
        .expect("rustls client")
        .capabilities(caps)
        .connect(&d.url)
        .await
        .expect("WebDriver session")
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"))
}

async fn screenshot(b: &Client, name: &str) {
    if let Ok(png) = b.screenshot().await {
        let path = target_dir().join(name);
        let _ = std::fs::create_dir_all(target_dir());
        std::fs::write(&path, png).expect("write screenshot");
        eprintln!("screenshot: {}", path.display());
    }
}

/// Runs `script` in the page until it returns a truthy value, for at most `limit`; the last
/// value it returned otherwise (for the failure message).
async fn poll(b: &Client, script: &str, limit: Duration) -> Result<Value, Value> {
    let start = Instant::now();
    let mut last = Value::Null;
    while start.elapsed() < limit {
        last = b.execute(script, vec![]).await.expect("script");
        if !matches!(&last, Value::Null | Value::Bool(false)) && last != "" {
            return Ok(last);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(last)
}

async fn must(b: &Client, what: &str, script: &str) -> Value {
    match poll(b, script, Duration::from_secs(20)).await {
        Ok(v) => v,
        Err(last) => {
            screenshot(b, "dashboard.png").await;
            panic!("{what}: not seen within 20 s (last: {last})");
        }
    }
}

/// The text of the element `locator` finds.
async fn text_of(b: &Client, locator: Locator<'_>) -> String {
    b.find(locator).await.unwrap().text().await.unwrap()
}

/// Types `token` into the dashboard's token form and submits it.
async fn submit_token(b: &Client, token: &str) {
    let field = b.find(Locator::Id("token")).await.unwrap();
    field.send_keys(token).await.unwrap();
    b.find(Locator::Id("token-submit"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
}

/// Clicks the element `css` names. The page rebuilds a list when its numbers change, so an
/// element found may be replaced before the click lands: find it again, a bounded number of
/// times.
async fn click(b: &Client, css: &str) {
    let mut last = None;
    for _ in 0..20 {
        match b.find(Locator::Css(css)).await {
            Ok(e) => match e.click().await {
                Ok(()) => return,
                Err(err) => last = Some(err.to_string()),
            },
            Err(err) => last = Some(err.to_string()),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    screenshot(b, "dashboard.png").await;
    panic!("could not click {css}: {last:?}");
}

#[tokio::test]
async fn the_dashboard_shows_who_is_limited_in_a_real_browser() {
    let Some((driver, chromium)) = browser() else {
        return;
    };
    let api = OrdersApi::start("orders");
    let gw = Gateway::start(&config(api.addr));
    let guarded = Gateway::start_with("admin_token = \"s3cret-admin\"", &config(api.addr), &[]);
    let d = start_driver(&driver);
    let b = connect(&d, &chromium).await;
    let result = std::panic::AssertUnwindSafe(drive(&b, &gw, &guarded))
        .catch_unwind()
        .await;
    let _ = b.close().await;
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}

async fn drive(b: &Client, gw: &Gateway, guarded: &Gateway) {
    let c = client();
    b.goto(&gw.admin_url("/")).await.expect("open the page");
    // The rules, in file order, with their numbers.
    let names = must(
        b,
        "the rules",
        "const n = [...document.querySelectorAll('.rule .name')].map(e => e.textContent); return n.length === 4 && n.join(',');",
    )
    .await;
    assert_eq!(names, "tight,by-secret-header,per-ip,per-tenant");
    let limit = text_of(b, Locator::Css(r#".rule[data-rule="tight"] .limit"#)).await;
    assert!(limit.contains("4 per 1h"), "{limit}");
    // The token issuer, its key in.
    let issuer = must(
        b,
        "the token issuer",
        r#"const i = document.querySelector('li[data-issuer="corp"]'); return i && i.textContent;"#,
    )
    .await;
    let issuer = issuer.as_str().unwrap_or_default();
    assert!(
        issuer.contains("keys in")
            && issuer.contains("ec-1")
            && issuer.contains("https://idp.corp.example"),
        "{issuer}"
    );
    // The upstream's adaptive concurrency limit: it starts at min_limit, with no request out.
    let protect = must(
        b,
        "the upstream's adaptive limit",
        r#"const p = document.querySelector('.protect[data-protect="orders"]'); return p && p.textContent;"#,
    )
    .await;
    let protect = protect.as_str().unwrap_or_default();
    assert!(
        protect.contains("adaptive limit 6") && protect.contains("in flight 0"),
        "{protect}"
    );
    let before = must(
        b,
        "the rejected chart",
        r#"return document.querySelector('.rule[data-rule="tight"] canvas').dataset.rejected;"#,
    )
    .await;
    assert_eq!(before, "0");

    // One client gets limited.
    assert_eq!(send(&c, gw, 30).await, 26);
    let top = must(
        b,
        "the limited client in the top list",
        r#"const li = document.querySelector('.rule[data-rule="tight"] ol.top li'); return li && li.textContent.includes('26 rejected') && li.textContent;"#,
    )
    .await;
    assert!(
        top.as_str().unwrap().contains("api_key=\"acme-prod\""),
        "{top}"
    );
    must(
        b,
        "the rejected chart rising",
        r#"return document.querySelector('.rule[data-rule="tight"] canvas').dataset.rejected === '26';"#,
    )
    .await;
    // The secret-keyed rule never rejects: ranked by admissions it lists the client, by
    // digest only.
    b.find(Locator::Id("by"))
        .await
        .unwrap()
        .select_by_value("admitted")
        .await
        .unwrap();
    let secret_rule = must(
        b,
        "the secret-keyed rule's client",
        r#"const li = document.querySelector('.rule[data-rule="by-secret-header"] ol.top li'); return li && li.textContent;"#,
    )
    .await;
    assert!(secret_rule.as_str().unwrap().contains("sha256:"));
    assert!(!secret_rule.as_str().unwrap().contains("=test "));
    b.find(Locator::Id("by"))
        .await
        .unwrap()
        .select_by_value("rejected")
        .await
        .unwrap();

    // A header value that reads like other key parts is shown as one part, quoted: the page
    // never shows a client of the api_key acme-prod and the ip 10.0.0.1 for it.
    for _ in 0..3 {
        c.get(gw.url("/orders"))
            .header("x-tenant", SPOOF)
            .send()
            .await
            .expect("request");
    }
    let shown = must(
        b,
        "the tenant rule's client",
        r#"const li = document.querySelector('.rule[data-rule="per-tenant"] ol.top li'); return li && li.textContent.includes('2 rejected') && li.querySelector('.client').textContent;"#,
    )
    .await;
    let shown = shown.as_str().unwrap();
    assert_eq!(
        read_parts(shown),
        [("header:x-tenant".to_string(), SPOOF.to_string())],
        "shown as {shown}"
    );
    let structured = b
        .execute(
            r#"return [...document.querySelectorAll('.rule[data-rule="per-tenant"] ol.top li .part')].map(p => [p.dataset.part, JSON.parse(p.querySelector('.part-value').textContent)]);"#,
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(structured, serde_json::json!([["header:x-tenant", SPOOF]]));
    click(b, r#".rule[data-rule="per-tenant"] ol.top li"#).await;
    let title = must(
        b,
        "the spoofing client's card",
        "return !document.getElementById('client-card').hidden && document.getElementById('client-name').textContent;",
    )
    .await;
    assert_eq!(
        read_parts(title.as_str().unwrap()),
        [("header:x-tenant".to_string(), SPOOF.to_string())]
    );
    click(b, "#client-close").await;

    // Clicking the client shows its rules.
    click(b, r#".rule[data-rule="tight"] ol.top li"#).await;
    let rows = must(
        b,
        "the client's rules",
        "const t = document.getElementById('client'); return !document.getElementById('client-card').hidden && t.textContent.includes('tight') && t.textContent;",
    )
    .await;
    assert!(rows.as_str().unwrap().contains("26"), "{rows}");

    // The store and the config.
    let store = text_of(b, Locator::Id("store-card")).await;
    assert!(store.contains("memory") && store.contains("up"), "{store}");
    let cfg = text_of(b, Locator::Id("config-card")).await;
    assert!(
        cfg.contains("generation") && cfg.contains("gateway.toml"),
        "{cfg}"
    );
    // Quota use: the api_key rule, with its identities per threshold.
    let quotas = text_of(b, Locator::Id("quota-card")).await;
    assert!(
        quotas.contains("tight") && quotas.contains("≥80%") && quotas.contains("≥100%"),
        "{quotas}"
    );

    // Nothing was fetched from anywhere but the admin listener.
    let origin = format!("http://{}", gw.admin);
    let foreign = b
        .execute(
            "return performance.getEntriesByType('resource').map(e => e.name).filter(n => !n.startsWith(arguments[0]));",
            vec![Value::String(origin)],
        )
        .await
        .unwrap();
    assert_eq!(foreign, serde_json::json!([]));
    screenshot(b, "dashboard.png").await;

    // Readable at phone width: nothing wider than the screen.
    b.set_window_size(390, 1200).await.unwrap();
    let fits = must(
        b,
        "the page to fit a phone",
        "return document.documentElement.scrollWidth <= window.innerWidth + 1;",
    )
    .await;
    assert_eq!(fits, true);
    screenshot(b, "dashboard-phone.png").await;
    b.set_window_size(1280, 1100).await.unwrap();

    // With admin_token: the page refuses until the token is entered.
    send(&c, guarded, 6).await;
    b.goto(&guarded.admin_url("/")).await.unwrap();
    must(
        b,
        "the token prompt",
        "return !document.getElementById('login').hidden && document.getElementById('main').hidden;",
    )
    .await;
    let shown = b
        .execute("return document.body.innerText;", vec![])
        .await
        .unwrap();
    assert!(
        !shown.as_str().unwrap().contains("tight"),
        "rules shown without the token"
    );
    submit_token(b, "wrong").await;
    must(
        b,
        "a wrong token refused",
        "return document.getElementById('login-error').textContent.includes('refused') && document.getElementById('main').hidden;",
    )
    .await;
    submit_token(b, "s3cret-admin").await;
    must(
        b,
        "the dashboard after the token",
        r#"const li = document.querySelector('.rule[data-rule="tight"] ol.top li'); return document.getElementById('login').hidden && li && li.textContent.includes('2 rejected');"#,
    )
    .await;
    // The token lives in this tab's session only.
    let kept = b
        .execute(
            "return [sessionStorage.getItem('floodgate-admin-token'), localStorage.length];",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(kept, serde_json::json!(["s3cret-admin", 0]));
}

// ---- Another site's page against the admin API ----

/// An attacker's web server on a free loopback port: every request gets `page`. Stopped (and
/// its thread joined) on drop; it serves for at most a minute.
struct AttackSite {
    addr: SocketAddr,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl AttackSite {
    fn start(page: String) -> AttackSite {
        use std::io::{Read as _, Write as _};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(60);
            while !flag.load(std::sync::atomic::Ordering::Relaxed) && Instant::now() < deadline {
                match listener.accept() {
                    Ok((mut conn, _)) => {
                        let _ = conn.set_nonblocking(false);
                        let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
                        let mut head = [0u8; 4096];
                        let _ = conn.read(&mut head);
                        let _ = write!(
                            conn,
                            "HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{page}",
                            page.len()
                        );
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        });
        AttackSite {
            addr,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for AttackSite {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[tokio::test]
async fn a_page_of_another_site_can_neither_read_nor_reload_the_admin_api() {
    let Some((driver, chromium)) = browser() else {
        return;
    };
    let api = OrdersApi::start("orders");
    let gw = Gateway::start(&config(api.addr));
    // A form that posts itself to POST /reload as soon as it loads.
    let site = AttackSite::start(format!(
        "<!doctype html><form method=post action=\"http://{}/reload\"><input name=a value=b></form><script>document.forms[0].submit()</script>",
        gw.admin
    ));
    let d = start_driver(&driver);
    let b = connect(&d, &chromium).await;
    let result = std::panic::AssertUnwindSafe(attack(&b, &gw, site.addr))
        .catch_unwind()
        .await;
    let _ = b.close().await;
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}

async fn attack(b: &Client, gw: &Gateway, site: SocketAddr) {
    let c = client();
    // DNS rebinding: a script in a page of the attacker's name, which now resolves to the
    // admin listener, reads the admin API "same-origin".
    b.goto(&format!("http://evil.rebind.test:{}/", gw.admin.port()))
        .await
        .expect("open the rebound name");
    let read = b
        .execute_async(
            "const done = arguments[0]; fetch('/stats').then(r => r.text().then(t => done([r.status, t]))).catch(e => done([0, String(e)]));",
            vec![],
        )
        .await
        .unwrap();
    let body = read[1].as_str().unwrap_or_default();
    let start: String = body.chars().take(120).collect();
    assert_eq!(read[0], 421, "a rebound page read /stats: {start}");
    assert!(!body.contains("\"rules\""), "{start}");

    // Cross-site forms, from another port of the same host (same site) and from another
    // site: each submits itself at once; the browser then shows the admin's answer.
    for page in [
        format!("http://127.0.0.1:{}/form", site.port()),
        format!("http://attacker.rebind.test:{}/form", site.port()),
    ] {
        b.goto(&page).await.expect("open the attacking page");
        let answer = must(
            b,
            "the admin's answer to the form",
            "return location.pathname === '/reload' && document.body.innerText;",
        )
        .await;
        assert!(
            answer.as_str().unwrap().contains("cross-site"),
            "{page}: {answer}"
        );
        let ready = get_json(&c, gw.admin_url("/readyz")).await;
        assert_eq!(
            ready["reload"]["generation"], 1,
            "{page} reloaded the config"
        );
    }
}

// ---- A page of another origin calling the API (CORS) ----

#[tokio::test]
async fn a_page_of_another_origin_reads_its_limits_through_cors() {
    let Some((driver, chromium)) = browser() else {
        return;
    };
    let api = OrdersApi::start("orders");
    // The page's own origin: a plain site on another loopback port.
    let site = AttackSite::start("<!doctype html><title>app</title><p>app</p>".into());
    let gw = Gateway::start(&format!(
        r#"{DEMO_KEYS}{}
[[routes]]
name = "orders"
match = {{ path_prefix = "/orders" }}
upstream = "orders"
cors = {{ allow_origins = ["http://127.0.0.1:{}"], allow_headers = ["x-api-key"] }}

[[rules]]
name = "per-key"
key = ["api_key"]
algorithm = "fixed_window"
limit = 1
window = "1h"
"#,
        orders_upstream(&[api.addr]),
        site.addr.port()
    ));
    let d = start_driver(&driver);
    let b = connect(&d, &chromium).await;
    let result = std::panic::AssertUnwindSafe(call_from_page(&b, &gw, site.addr))
        .catch_unwind()
        .await;
    let _ = b.close().await;
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}

async fn call_from_page(b: &Client, gw: &Gateway, site: SocketAddr) {
    b.goto(&format!("http://127.0.0.1:{}/", site.port()))
        .await
        .expect("open the app's page");
    // Two calls with a key (a header that needs a preflight): the first is served, the second
    // refused by the rule; the page reads both answers' status and fields.
    let seen = b
        .execute_async(
            "const url = arguments[0], done = arguments[arguments.length - 1];
             (async () => {
               const out = [];
               for (let i = 0; i < 2; i++) {
                 const r = await fetch(url, { headers: { 'x-api-key': 'test' } });
                 out.push([r.status, r.headers.get('RateLimit'), r.headers.get('Retry-After')]);
               }
               done(out);
             })().catch(e => done(String(e)));",
            vec![Value::String(gw.url("/orders"))],
        )
        .await
        .expect("the page's script");
    let calls = seen
        .as_array()
        .unwrap_or_else(|| panic!("the page's fetch failed: {seen}"));
    assert_eq!(calls[0][0], 200, "{seen}");
    assert!(
        calls[0][1].as_str().is_some_and(|v| v.contains("r=0")),
        "the page reads the 200's RateLimit: {seen}"
    );
    assert_eq!(calls[1][0], 429, "{seen}");
    let retry: u64 = calls[1][2]
        .as_str()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("the page reads the 429's Retry-After: {seen}"));
    assert!(retry >= 1, "{seen}");
}
