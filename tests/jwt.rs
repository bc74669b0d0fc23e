//! `[[auth.jwt]]` through the release binary: tokens minted by PyJWT (every hostile shape) and
//! by a real OpenID provider (node-oidc-provider, client_credentials, discovery, key rotation by
//! restart), verified at the front door, turned into an identity that rules match and key on.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use common::*;
use serde_json::Value;

const AUD: &str = "orders-api";
const ISS: &str = "https://idp.test";

/// Tokens and keys minted by `tests/jwt/mint.py` for issuer [`ISS`] and audience [`AUD`].
struct Minted {
    _dir: tempfile::TempDir,
    jwks: String,
    hs_secret: PathBuf,
    tokens: HashMap<String, String>,
}

fn mint() -> Minted {
    let dir = tempfile::tempdir().unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/jwt/mint.py");
    let out = Command::new("python3")
        .arg(&script)
        .arg(dir.path())
        .args([ISS, AUD])
        .output()
        .expect("python3 runs (make test installs pyjwt[crypto])");
    assert!(
        out.status.success(),
        "mint.py failed (is pyjwt[crypto] installed? make test installs it): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tokens: HashMap<String, String> =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("tokens.json")).unwrap())
            .unwrap();
    Minted {
        jwks: std::fs::read_to_string(dir.path().join("jwks.json")).unwrap(),
        hs_secret: dir.path().join("hs_secret.txt"),
        tokens,
        _dir: dir,
    }
}

/// An issuer with the minted JWK Set inline, an HMAC issuer reading `x-hs-token` (not
/// forwarded), a route that takes tokens, one that takes either, and `rules`.
fn minted_config(api: std::net::SocketAddr, m: &Minted, rules: &str) -> String {
    format!(
        r#"{upstream}
[auth]
token_cache_size = 1000
{keys}
[[auth.jwt]]
name = "idp"
issuer = "{ISS}"
audiences = ["{AUD}"]
algorithms = ["ES256", "RS256", "PS256", "EdDSA"]
jwks = '''{jwks}'''
plan_claim = "plan"

[[auth.jwt]]
name = "hs"
issuer = "{ISS}"
audiences = ["{AUD}"]
algorithms = ["HS256"]
secret_file = "{secret}"
header = "x-hs-token"
forward_token = false

[[routes]]
name = "tokens"
match = {{ path_prefix = "/debug" }}
upstream = "orders"
auth = "token"

[[routes]]
name = "either"
match = {{ path_prefix = "/orders" }}
upstream = "orders"
auth = "required"
{rules}"#,
        upstream = orders_upstream(&[api]),
        keys = DEMO_KEYS,
        jwks = m.jwks,
        secret = m.hs_secret.display(),
    )
}

async fn echoed(r: reqwest::Response) -> serde_json::Map<String, Value> {
    let v: Value = r.json().await.expect("an echo");
    v["headers"].as_object().cloned().unwrap_or_default()
}

/// Every hostile shape gets a 401 problem with `error="invalid_token"`, counted by its reason
/// and charged to no rule; no token appears in the logs.
#[tokio::test]
async fn hostile_tokens_get_a_401_and_are_charged_nothing() {
    let m = mint();
    let api = OrdersApi::start("orders-jwt");
    let rules = r#"
[[rules]]
name = "per-ip"
key = ["ip"]
algorithm = "fixed_window"
limit = 2
window = "1h"
"#;
    let gw = Gateway::start(&minted_config(api.addr, &m, rules));
    let c = client();
    let hostile = [
        ("alg_none", "alg_none"),
        ("hs256_confusion", "alg_not_allowed"),
        ("expired", "expired"),
        ("not_yet_valid", "not_yet_valid"),
        ("wrong_iss", "unknown_issuer"),
        ("wrong_aud", "wrong_audience"),
        ("unknown_kid", "unknown_kid"),
        ("bad_signature", "bad_signature"),
        ("bad_base64", "bad_encoding"),
        ("bad_json", "bad_json"),
        ("duplicate_claims", "duplicate_claim"),
        ("crit_header", "crit"),
        ("no_exp", "missing_exp"),
    ];
    for (case, _) in hostile {
        let r = get_with_token(&c, gw.url("/orders"), &m.tokens[case]).await;
        assert_eq!(r.status(), 401, "{case}");
        let challenge = r.headers()["www-authenticate"]
            .to_str()
            .unwrap()
            .to_string();
        assert!(
            challenge.contains("error=\"invalid_token\""),
            "{case}: {challenge}"
        );
        assert_eq!(
            r.headers()["content-type"],
            "application/problem+json",
            "{case}"
        );
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["status"], 401, "{case}");
    }
    // A token too large for any real use: refused before it is decoded (or by the head limit).
    let huge = &m.tokens["huge"];
    assert!(huge.len() > 64 * 1024);
    let r = get_with_token(&c, gw.url("/orders"), huge).await;
    assert_eq!(r.status(), 401, "a 64 KiB token");
    // The same shapes in the HMAC issuer's own header: the signature, not the header, decides.
    let r = c
        .get(gw.url("/debug/headers"))
        .header("x-hs-token", &m.tokens["valid_es256"])
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.status(),
        401,
        "an ES256 token offered to the HS256 issuer"
    );

    let metrics = get_text(&c, gw.admin_url("/metrics")).await;
    for (case, reason) in hostile {
        let issuer = if reason == "unknown_issuer"
            || reason == "bad_encoding"
            || reason == "bad_json"
            || reason == "duplicate_claim"
            || reason == "crit"
            || reason == "alg_none"
        {
            "unknown"
        } else {
            "idp"
        };
        let series =
            format!("floodgate_jwt_verifications_total{{issuer=\"{issuer}\",result=\"{reason}\"}}");
        assert!(
            metric_value(&metrics, &series) >= Some(1.0),
            "{case}: {series} in\n{metrics}"
        );
    }
    // Nothing was charged: the two requests the rule allows are both still there.
    for _ in 0..2 {
        let r = get_with_token(&c, gw.url("/orders"), &m.tokens["valid_es256"]).await;
        assert_eq!(r.status(), 200);
    }
    let r = get_with_token(&c, gw.url("/orders"), &m.tokens["valid_es256"]).await;
    assert_eq!(r.status(), 429, "the third is over the limit of 2");

    let logs = gw.logs();
    for (case, token) in &m.tokens {
        let signature = token.rsplit('.').next().unwrap();
        if signature.len() > 16 {
            assert!(!logs.contains(signature), "{case}'s token is in the logs");
        }
    }
}

/// Valid tokens of every algorithm identify the caller; the upstream sees the identity, and the
/// HMAC issuer's token (not forwarded) is stripped.
#[tokio::test]
async fn valid_tokens_identify_the_caller() {
    let m = mint();
    let api = OrdersApi::start("orders-jwt");
    let gw = Gateway::start(&minted_config(api.addr, &m, ""));
    let c = client();
    for case in ["valid_es256", "valid_rs256", "valid_ps256", "valid_eddsa"] {
        let r = get_with_token(&c, gw.url("/debug/headers"), &m.tokens[case]).await;
        assert_eq!(r.status(), 200, "{case}");
        let h = echoed(r).await;
        assert_eq!(h["x-floodgate-user"], "user-1", "{case}");
        assert_eq!(h["x-floodgate-plan"], "pro", "{case}");
        assert_eq!(
            h["authorization"],
            format!("Bearer {}", m.tokens[case]),
            "{case}: forwarded by default"
        );
    }
    let r = c
        .get(gw.url("/debug/headers"))
        .header("x-hs-token", &m.tokens["hs256_secret"])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let h = echoed(r).await;
    assert_eq!(h["x-floodgate-user"], "user-1");
    assert!(
        !h.contains_key("x-hs-token"),
        "forward_token = false strips it"
    );

    // A route that takes tokens only: an API key is not read there.
    let r = get_with_key(&c, gw.url("/debug/headers"), "test").await;
    assert_eq!(r.status(), 401);
    // A route that takes either: the key still works, and a key in Bearer form too.
    assert_eq!(
        get_with_key(&c, gw.url("/orders"), "test").await.status(),
        200
    );
    assert_eq!(
        get_with_token(&c, gw.url("/orders"), "test").await.status(),
        200
    );

    // The second request with a token is served from the cache.
    let cached = r#"floodgate_jwt_verifications_total{issuer="idp",result="cached"}"#;
    let r = get_with_token(&c, gw.url("/orders"), &m.tokens["valid_es256"]).await;
    assert_eq!(r.status(), 200);
    let r = get_with_token(&c, gw.url("/orders"), &m.tokens["valid_es256"]).await;
    assert_eq!(r.status(), 200);
    let metrics = get_text(&c, gw.admin_url("/metrics")).await;
    assert!(metric_value(&metrics, cached) >= Some(1.0), "{metrics}");
}

/// Rules match on a claim (a word of `scope`), key on one (a URI-named claim), and take each
/// caller's limit from a claim, bounded by `limit_max`.
#[tokio::test]
async fn rules_match_and_key_on_claims() {
    let m = mint();
    let api = OrdersApi::start("orders-jwt");
    let rules = r#"
[[rules]]
name = "writers-by-tenant"
match = { claim = { name = "scope", contains = "orders:write" } }
key = ["claim:https://example.com/tenant"]
algorithm = "fixed_window"
limit = 100
limit_from = "claim:rate_limit"
limit_max = 5
window = "1h"

[[rules]]
name = "admins-never"
match = { claim = { name = "realm_access.roles", contains = "nobody" } }
key = ["ip"]
algorithm = "fixed_window"
limit = 1
window = "1h"
"#;
    let gw = Gateway::start(&minted_config(api.addr, &m, rules));
    let c = client();
    // rate_limit = 3 in the token: three, then 429, with the policy saying q=3.
    for i in 0..3 {
        let r = get_with_token(&c, gw.url("/orders"), &m.tokens["valid_es256"]).await;
        assert_eq!(r.status(), 200, "request {i}");
        let policy = r.headers()["ratelimit-policy"]
            .to_str()
            .unwrap()
            .to_string();
        assert!(policy.contains("q=3"), "{policy}");
    }
    let r = get_with_token(&c, gw.url("/orders"), &m.tokens["valid_rs256"]).await;
    assert_eq!(r.status(), 429, "the same tenant by another token");
    // Another tenant has its own counter.
    let r = get_with_token(&c, gw.url("/orders"), &m.tokens["valid_es256_sub2"]).await;
    assert_eq!(r.status(), 200, "globex is counted apart");
    // An API key has no claims: neither rule applies.
    for _ in 0..5 {
        assert_eq!(
            get_with_key(&c, gw.url("/orders"), "test").await.status(),
            200
        );
    }
}

// ---- A real identity provider ----

/// node-oidc-provider (`tests/idp`), started on `port` with a fresh signing key.
struct Idp {
    child: Child,
    port: u16,
}

impl Idp {
    fn start(port: u16) -> Idp {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/idp");
        assert!(
            dir.join("node_modules/oidc-provider").is_dir(),
            "tests/idp is not installed: run `npm ci --prefix tests/idp` (make test does)"
        );
        let mut child = Command::new("node")
            .arg(dir.join("server.mjs"))
            .env("IDP_PORT", port.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("node runs");
        let addr = format!("127.0.0.1:{port}").parse().unwrap();
        wait_for_port(
            addr,
            Duration::from_secs(30),
            &mut child,
            "the identity provider",
        );
        Idp { child, port }
    }

    fn issuer(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// A token by the client_credentials grant, on a connection of its own (a pooled one may
    /// be to the provider's previous process on the same port).
    async fn token(&self, _c: &reqwest::Client) -> String {
        let r = client()
            .post(format!("{}/token", self.issuer()))
            .form(&[
                ("grant_type", "client_credentials"),
                ("client_id", "orders-client"),
                ("client_secret", "orders-secret"),
                ("scope", "orders:read orders:write"),
                ("resource", AUD),
            ])
            .send()
            .await
            .expect("token request");
        assert_eq!(r.status(), 200, "the provider issues a token");
        let v: Value = r.json().await.unwrap();
        v["access_token"].as_str().unwrap().to_string()
    }

    fn stop(&mut self) {
        stop(&mut self.child);
    }
}

impl Drop for Idp {
    fn drop(&mut self) {
        stop(&mut self.child);
    }
}

fn idp_config(api: std::net::SocketAddr, issuer: &str, extra_rule: &str) -> String {
    format!(
        r#"{upstream}
[[auth.jwt]]
name = "oidc"
issuer = "{issuer}"
discovery_url = "{issuer}/.well-known/openid-configuration"
audiences = ["{AUD}"]
min_refetch = "1s"
refresh_interval = "1m"
fetch_timeout = "2s"

[[routes]]
name = "orders"
upstream = "orders"
auth = "token"
{extra_rule}"#,
        upstream = orders_upstream(&[api])
    )
}

/// Waits until `/readyz` says ready: the issuers' keys are in.
async fn ready(c: &reqwest::Client, gw: &Gateway) {
    eventually(
        Duration::from_secs(20),
        "ready with the issuers' keys",
        || {
            let (c, url) = (c.clone(), gw.admin_url("/readyz"));
            async move { (c.get(url).send().await.ok()?.status() == 200).then_some(()) }
        },
    )
    .await;
}

async fn fetches(c: &reqwest::Client, gw: &Gateway) -> f64 {
    let metrics = get_text(c, gw.admin_url("/metrics")).await;
    metric_value(
        &metrics,
        r#"floodgate_jwks_fetches_total{issuer="oidc",result="ok"}"#,
    )
    .unwrap_or(0.0)
}

/// `token` with its header's `kid` replaced (the signature no longer matters: the kid is
/// looked up first).
fn with_kid(token: &str, kid: &str) -> String {
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let (header, rest) = token.split_once('.').unwrap();
    let mut h: Value = serde_json::from_slice(&b64.decode(header).unwrap()).unwrap();
    h["kid"] = kid.into();
    format!("{}.{rest}", b64.encode(serde_json::to_vec(&h).unwrap()))
}

/// Tokens of a real provider, found by discovery; random `kid`s do not make floodgate hammer
/// it; a restart with a new key (rotation) is followed; while it is down, the last set serves.
#[tokio::test]
async fn tokens_from_a_real_identity_provider() {
    let port = free_port();
    let mut idp = Idp::start(port);
    let api = OrdersApi::start("orders-oidc");
    let gw = Gateway::start(&idp_config(api.addr, &idp.issuer(), ""));
    let c = client();
    ready(&c, &gw).await;

    let token = idp.token(&c).await;
    let r = get_with_token(&c, gw.url("/debug/headers"), &token).await;
    assert_eq!(r.status(), 200);
    assert_eq!(echoed(r).await["x-floodgate-user"], "orders-client");

    // A flood of unknown kids: at most one fetch per min_refetch (1 s) while it lasts.
    let before = fetches(&c, &gw).await;
    let started = Instant::now();
    for i in 0..200 {
        let r = get_with_token(
            &c,
            gw.url("/orders"),
            &with_kid(&token, &format!("mint-{i}")),
        )
        .await;
        assert_eq!(r.status(), 401);
    }
    let allowed = 1.0 + started.elapsed().as_secs_f64().ceil();
    let made = fetches(&c, &gw).await - before;
    assert!(
        made <= allowed,
        "{made} fetches for 200 unknown kids in {:?}",
        started.elapsed()
    );

    // Rotation: the provider restarts with a new key; its new token's kid is fetched for.
    idp.stop();
    let mut idp = Idp::start(port);
    let rotated = idp.token(&c).await;
    let served = eventually(
        Duration::from_secs(10),
        "the rotated key is fetched",
        || {
            let (c, url, t) = (c.clone(), gw.url("/orders"), rotated.clone());
            async move {
                let r = get_with_token(&c, url, &t).await;
                (r.status() == 200).then_some(r.status())
            }
        },
    )
    .await;
    assert_eq!(served, 200);

    // The provider goes down: a token of the set in force still verifies, and the gateway
    // stays ready.
    let unseen = idp.token(&c).await;
    idp.stop();
    let r = get_with_token(&c, gw.url("/orders"), &unseen).await;
    assert_eq!(
        r.status(),
        200,
        "the last good set serves while the provider is down"
    );
    let r = c.get(gw.admin_url("/readyz")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["issuers"][0]["name"], "oidc");
    assert_eq!(v["issuers"][0]["ready"], true);
}

/// `/readyz` says "starting" until the provider's keys are in, and the refresh brings them
/// when the provider comes up late.
#[tokio::test]
async fn readiness_waits_for_the_keys() {
    let port = free_port();
    let issuer = format!("http://127.0.0.1:{port}");
    let api = OrdersApi::start("orders-oidc");
    let gw = Gateway::start(&idp_config(api.addr, &issuer, ""));
    let c = client();
    let r = c.get(gw.admin_url("/readyz")).send().await.unwrap();
    assert_eq!(r.status(), 503, "no keys yet");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["issuers"][0]["ready"], false);
    assert!(v["issuers"][0]["last_error"].as_str().is_some(), "{v}");

    let idp = Idp::start(port);
    ready(&c, &gw).await;
    let token = idp.token(&c).await;
    assert_eq!(
        get_with_token(&c, gw.url("/orders"), &token).await.status(),
        200
    );
}

/// A reload that leaves an issuer as it was keeps its keys: no fetch, tokens keep verifying.
#[tokio::test]
async fn a_reload_keeps_the_keys_of_an_unchanged_issuer() {
    let idp = Idp::start(free_port());
    let api = OrdersApi::start("orders-oidc");
    let gw = Gateway::start(&idp_config(api.addr, &idp.issuer(), ""));
    let c = client();
    ready(&c, &gw).await;
    let before = fetches(&c, &gw).await;
    assert!(before >= 1.0);
    let rule = "\n[[rules]]\nname = \"per-client\"\nkey = [\"claim:client_id\"]\nalgorithm = \"fixed_window\"\nlimit = 1\nwindow = \"1h\"\n";
    std::fs::write(
        gw.config_path(),
        format!(
            "{}\n{}",
            server_section(gw.addr, gw.admin),
            idp_config(api.addr, &idp.issuer(), rule)
        ),
    )
    .unwrap();
    gw.signal("HUP");
    let token = idp.token(&c).await;
    eventually(Duration::from_secs(10), "the reloaded rule applies", || {
        let (c, url, t) = (c.clone(), gw.url("/orders"), token.clone());
        async move { (get_with_token(&c, url, &t).await.status() == 429).then_some(()) }
    })
    .await;
    assert_eq!(
        fetches(&c, &gw).await,
        before,
        "the reload fetched the keys again"
    );
}

/// The guide's worked example runs as written: examples/jwt.toml (ports moved to free ones),
/// its Python minting a token, and the answers the guide says.
#[tokio::test]
async fn the_guides_worked_example_runs_as_written() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let guide = std::fs::read_to_string(root.join("docs/rate-limiting.md")).unwrap();
    let section = guide
        .split("## Tokens (JWT / OIDC)")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .expect("the guide has a Tokens section");
    let python = section
        .split("```python\n")
        .nth(1)
        .and_then(|s| s.split("```").next())
        .expect("the section mints a token in Python");

    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("examples")).unwrap();
    std::fs::copy(
        root.join("examples/jwt-secret.txt"),
        dir.path().join("examples/jwt-secret.txt"),
    )
    .unwrap();
    std::fs::write(dir.path().join("mint.py"), python).unwrap();
    let out = Command::new("python3")
        .arg("mint.py")
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let token = std::fs::read_to_string(dir.path().join("token.txt")).unwrap();

    let api = OrdersApi::start("orders-example");
    let example = std::fs::read_to_string(root.join("examples/jwt.toml")).unwrap();
    let (addr, admin) = (free_addr(), free_addr());
    let config = example
        .replace("127.0.0.1:8080", &addr.to_string())
        .replace("127.0.0.1:9901", &admin.to_string())
        .replace("127.0.0.1:9000", &api.addr.to_string());
    let path = dir.path().join("examples/jwt.toml");
    std::fs::write(&path, config).unwrap();
    let log = dir.path().join("floodgate.log");
    let mut gw = spawn_floodgate_with(&path, dir.path(), &log, &[]);
    wait_for_port(addr, Duration::from_secs(30), &mut gw.child, "floodgate");
    let c = client();
    let url = format!("http://{addr}/orders");
    assert_eq!(get_with_token(&c, &url, &token).await.status(), 200);
    let mut codes = Vec::new();
    for _ in 0..4 {
        let r = c
            .post(&url)
            .bearer_auth(&token)
            .json(&serde_json::json!({"item": "beans", "quantity": 1}))
            .send()
            .await
            .unwrap();
        codes.push(r.status().as_u16());
    }
    assert_eq!(codes, [201, 201, 201, 429], "as the guide says");
    assert_eq!(c.get(&url).send().await.unwrap().status(), 401);
}

/// Key servers that never answer, or answer without end, cost a bounded wait and a bounded
/// read: the gateway starts, says why it is not ready, and serves its other routes.
#[tokio::test]
async fn a_hostile_key_server_cannot_hold_or_flood_the_gateway() {
    use std::io::Write as _;
    let silent = raw_upstream(|mut conn| {
        read_head(&mut conn);
        std::thread::sleep(Duration::from_secs(20));
    });
    let endless = raw_upstream(|mut conn| {
        read_head(&mut conn);
        let _ = conn.write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100000000\r\n\r\n{\"keys\":[");
        let chunk = vec![b' '; 64 * 1024];
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(20) && conn.write_all(&chunk).is_ok() {}
    });
    let api = OrdersApi::start("orders-hostile-jwks");
    let config = format!(
        r#"{upstream}
[[auth.jwt]]
name = "silent"
issuer = "https://silent.test"
audiences = ["{AUD}"]
jwks_url = "http://{silent}/jwks"
fetch_timeout = "300ms"
min_refetch = "1s"

[[auth.jwt]]
name = "endless"
issuer = "https://endless.test"
audiences = ["{AUD}"]
jwks_url = "http://{endless}/jwks"
fetch_timeout = "5s"

[[routes]]
name = "open"
upstream = "orders"
auth = "none"
"#,
        upstream = orders_upstream(&[api.addr])
    );
    let started = Instant::now();
    let gw = Gateway::start(&config);
    let c = client();
    assert_eq!(c.get(gw.url("/orders")).send().await.unwrap().status(), 200);
    let v = eventually(Duration::from_secs(15), "both fetches failed", || {
        let (c, url) = (c.clone(), gw.admin_url("/readyz"));
        async move {
            let r = c.get(url).send().await.ok()?;
            assert_eq!(r.status(), 503, "not ready without keys");
            let v: Value = r.json().await.ok()?;
            let issuers = v["issuers"].as_array()?;
            issuers
                .iter()
                .all(|i| i["last_error"].is_string())
                .then_some(v)
        }
    })
    .await;
    let errors: Vec<String> = v["issuers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["last_error"].as_str().unwrap().to_string())
        .collect();
    assert!(
        errors[0].contains("no answer within fetch_timeout (300ms)"),
        "{errors:?}"
    );
    assert!(errors[1].contains("larger than"), "{errors:?}");
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "a silent or endless key server held the start"
    );
}
