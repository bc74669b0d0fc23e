//! Every store fault ends: after Redis is black-holed, delayed past `store.timeout`, cut,
//! restarted or paused, exact limiting is back within three seconds, whatever the number of
//! concurrent clients during the fault and whatever each rule's `on_store_error`, on the proxy
//! port and on the rate-limit service port; and a reply lost in the middle of a pipeline is
//! never taken as another call's answer.
//!
//! A fault relay (`common::fault`) sits between floodgate and a real `redis-server`. Each test
//! runs one gateway with three global fixed-window rules, one per failure mode, and:
//! 1. checks that a fresh key is decided by the store (its first request shows `limit - 1`
//!    left: the `open` fallback shows the whole limit, `local` its share, `closed` answers 503);
//! 2. starts the fault while `clients` clients send requests for a while;
//! 3. ends the fault and asks a fresh key of each rule every 50 ms: from some instant on, every
//!    answer of every rule must come from the store, and that instant must be within
//!    [`RECOVERY_BOUND`] of the end of the fault;
//! 4. spends the key the clients used, rule by rule: the store's count goes down by one per
//!    admitted request, and once it says none is left nothing more is admitted.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use common::fault::FaultProxy;
use common::redis::{gateway_on_threads, store as store_table, RedisServer, ROUTES};
use common::rls::{descriptor, request, RlsGateway};
use common::*;

/// Each rule's limit per hour.
const LIMIT: u64 = 40;
/// `[store] instances`: the `local` fallback admits `LIMIT / INSTANCES` per key.
const INSTANCES: u64 = 4;
/// The rules, one per `on_store_error`.
const MODES: [&str; 3] = ["closed", "open", "local"];
/// `store.timeout`: short, as in production, and far above a loopback round trip even on a
/// busy machine.
const STORE_TIMEOUT: &str = "100ms";
/// How long each fault lasts while the clients send.
const FAULT_FOR: Duration = Duration::from_millis(1500);
/// The promise: exact limiting back within this long after a fault ends.
const RECOVERY_BOUND: Duration = Duration::from_secs(3);
/// After recovery, how long every answer must stay exact.
const STAYS_EXACT_FOR: Duration = Duration::from_secs(1);

/// What is done to Redis or to the path to it.
#[derive(Clone, Copy, Debug)]
enum Fault {
    /// Bytes dropped both ways, connections kept open.
    BlackHole,
    /// Every byte held 400 ms (four times `store.timeout`).
    Delay,
    /// Every connection closed, again and again.
    Cut,
    /// Redis killed, then started again (empty).
    Restart,
    /// `CLIENT PAUSE ... ALL`: Redis answers nothing until the pause ends.
    Pause,
}

/// The rules of [`MODES`], matched by the `x-mode` header and keyed on `x-user` (proxy).
fn proxy_rules() -> String {
    MODES
        .iter()
        .map(|mode| {
            format!(
                "\n[[rules]]\nname = \"{mode}\"\nmatch = {{ header = {{ name = \"x-mode\", value = \"{mode}\" }} }}\nkey = [\"header:x-user\"]\nalgorithm = \"fixed_window\"\nlimit = {LIMIT}\nwindow = \"1h\"\non_store_error = \"{mode}\"\n"
            )
        })
        .collect()
}

/// The same three limits for the rate-limit service: descriptor key = the mode's name.
fn rls_limits() -> String {
    MODES
        .iter()
        .map(|mode| {
            format!(
                "[[rls.limits]]\nname = \"{mode}\"\ndomain = \"edge\"\ndescriptor = [{{ key = \"{mode}\" }}]\nalgorithm = \"fixed_window\"\nlimit = {LIMIT}\nwindow = \"1h\"\non_store_error = \"{mode}\"\n\n"
            )
        })
        .collect()
}

/// One answer, as far as exactness goes.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Answer {
    /// Admitted, with this many left by the rule.
    Admitted(u64),
    /// Refused by the limit.
    Limited,
    /// Anything else: 503 (closed, store down), an error, no answer.
    Other(String),
}

/// The gateway under test: the HTTP proxy or the rate-limit service.
enum Front {
    Proxy(Gateway),
    Rls(RlsGateway),
}

impl Front {
    fn start(rls: bool, store: &Store, api: std::net::SocketAddr) -> Front {
        let table = store.table();
        let mut env: Vec<(&str, &str)> = store
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        if rls {
            return Front::Rls(RlsGateway::start_env(
                &format!("{table}\n{}", rls_limits()),
                &env,
            ));
        }
        // Two serving threads: each has a connection of its own to Redis.
        let body = format!(
            "{}{table}{ROUTES}{}",
            orders_upstream(&[api]),
            proxy_rules()
        );
        env.push(("RUST_LOG", "info"));
        Front::Proxy(Gateway::start_env(
            |addr, admin| server_section(addr, admin).replace("threads = 1\n", "threads = 2\n"),
            &body,
            &[],
            &env,
        ))
    }

    fn admin_url(&self, path: &str) -> String {
        match self {
            Front::Proxy(gw) => gw.admin_url(path),
            Front::Rls(gw) => gw.admin_url(path),
        }
    }

    fn logs(&self) -> String {
        match self {
            Front::Proxy(gw) => gw.logs(),
            Front::Rls(gw) => gw.logs(),
        }
    }

    /// A client for [`Front::ask`].
    async fn client(&self) -> Client {
        match self {
            Front::Proxy(gw) => Client::Http(
                reqwest::Client::builder()
                    .no_proxy()
                    .timeout(Duration::from_secs(5))
                    .build()
                    .unwrap(),
                gw.url("/orders"),
            ),
            Front::Rls(gw) => Client::Grpc(gw.client().await),
        }
    }
}

#[derive(Clone)]
enum Client {
    Http(reqwest::Client, String),
    Grpc(common::rls::Client),
}

impl Client {
    /// One request for `user` under the rule `mode`.
    async fn ask(&mut self, mode: &str, user: &str) -> Answer {
        match self {
            Client::Http(c, url) => {
                let sent = c
                    .get(url.as_str())
                    .header("x-mode", mode)
                    .header("x-user", user)
                    .send()
                    .await;
                let r = match sent {
                    Ok(r) => r,
                    Err(e) => return Answer::Other(format!("no answer: {e}")),
                };
                let status = r.status().as_u16();
                let left = r
                    .headers()
                    .get("ratelimit")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| remaining(v, mode));
                match (status, left) {
                    (200, Some(left)) => Answer::Admitted(left),
                    (429, _) => Answer::Limited,
                    _ => Answer::Other(format!("{status} {left:?}")),
                }
            }
            Client::Grpc(c) => {
                let req = request("edge", vec![descriptor(&[(mode, user)])]);
                let r = match tokio::time::timeout(Duration::from_secs(5), c.should_rate_limit(req))
                    .await
                {
                    Ok(Ok(r)) => r.into_inner(),
                    Ok(Err(e)) => return Answer::Other(format!("{:?}", e.code())),
                    Err(_) => return Answer::Other("no answer".into()),
                };
                let left = r.statuses.first().map(|s| u64::from(s.limit_remaining));
                match (r.overall_code, left) {
                    (1, Some(left)) => Answer::Admitted(left),
                    (2, _) => Answer::Limited,
                    (code, left) => Answer::Other(format!("code {code} {left:?}")),
                }
            }
        }
    }
}

/// `r=` of the member named `rule` in a `RateLimit` field.
fn remaining(field: &str, rule: &str) -> Option<u64> {
    let member = field
        .split(',')
        .map(str::trim)
        .find(|m| m.starts_with(&format!("\"{rule}\";")))?;
    member
        .split(';')
        .find_map(|p| p.strip_prefix("r="))
        .and_then(|n| n.parse().ok())
}

/// Fresh keys, never asked before.
fn fresh(n: &AtomicUsize) -> String {
    format!("fresh-{}", n.fetch_add(1, Ordering::Relaxed))
}

/// The first request of a fresh key decided by the store leaves `LIMIT - 1`.
const EXACT_FRESH: Answer = Answer::Admitted(LIMIT - 1);

/// Which store the gateway uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Backend {
    /// `redis://`: floodgate's own pipelined connections (shared and one per thread).
    Redis,
    /// `rediss://`: redis-rs's TLS connection, to a server with a certificate of a test CA.
    Tls,
    /// A 3-master Redis Cluster, each master behind a relay of its own (it announces the
    /// relay's port, so every connection the client makes goes through one).
    Cluster,
}

/// Where the store is, for the gateway, and how to hurt it.
struct Store {
    backend: Backend,
    servers: Vec<RedisServer>,
    relays: Vec<FaultProxy>,
    /// What the gateway needs in its environment (the test CA, for TLS).
    env: Vec<(String, String)>,
    /// The certificates' folder, kept while the servers run.
    _certs: Option<tempfile::TempDir>,
}

impl Store {
    fn start(backend: Backend) -> Store {
        let loopback = |port: u16| std::net::SocketAddr::from(([127, 0, 0, 1], port));
        match backend {
            Backend::Redis => {
                let redis = RedisServer::start();
                let relay = FaultProxy::start(redis.addr());
                Store {
                    backend,
                    servers: vec![redis],
                    relays: vec![relay],
                    env: Vec::new(),
                    _certs: None,
                }
            }
            Backend::Tls => {
                let certs = tempfile::tempdir().unwrap();
                let ca = test_ca(certs.path());
                let tls_port = free_port();
                let file = |name: &str| certs.path().join(name).display().to_string();
                // The plain port stays open for the test's own commands (readiness, CLIENT
                // PAUSE); the gateway speaks TLS only.
                let redis = RedisServer::start_with(|_, _| {
                    vec![
                        "--tls-port".into(),
                        tls_port.to_string(),
                        "--tls-cert-file".into(),
                        file("redis.pem"),
                        "--tls-key-file".into(),
                        file("redis.key"),
                        "--tls-ca-cert-file".into(),
                        file("ca.pem"),
                        "--tls-auth-clients".into(),
                        "no".into(),
                    ]
                });
                let relay = FaultProxy::start(loopback(tls_port));
                Store {
                    backend,
                    servers: vec![redis],
                    relays: vec![relay],
                    // rustls' native roots honour SSL_CERT_FILE: the gateway trusts the test
                    // CA and checks the server's name, as in production.
                    env: vec![("SSL_CERT_FILE".into(), ca)],
                    _certs: Some(certs),
                }
            }
            Backend::Cluster => {
                let announce: Vec<u16> = (0..3).map(|_| free_port()).collect();
                let nodes = common::redis::RedisCluster::spawn_masters(3, |i| {
                    vec!["--cluster-announce-port".into(), announce[i].to_string()]
                });
                let relays = nodes
                    .iter()
                    .zip(&announce)
                    .map(|(node, &port)| FaultProxy::start_at(loopback(port), node.addr()))
                    .collect();
                let cluster = common::redis::RedisCluster::join(nodes);
                Store {
                    backend,
                    servers: cluster.nodes,
                    relays,
                    env: Vec::new(),
                    _certs: None,
                }
            }
        }
    }

    /// The gateway's `[store]` table: through the relays.
    fn table(&self) -> String {
        self.table_with(STORE_TIMEOUT)
    }

    /// [`Store::table`] with another `store.timeout`.
    fn table_with(&self, timeout: &str) -> String {
        let extra = format!("instances = {INSTANCES}");
        match self.backend {
            Backend::Redis => store_table(&self.relays[0].url(), timeout, &extra),
            Backend::Tls => store_table(
                &format!("rediss://localhost:{}/", self.relays[0].addr().port()),
                timeout,
                &extra,
            ),
            Backend::Cluster => {
                let urls: Vec<String> = self
                    .relays
                    .iter()
                    .map(|r| format!("\"{}\"", r.url()))
                    .collect();
                format!(
                    "\n[store]\nbackend = \"redis-cluster\"\nurls = [{}]\ntimeout = \"{timeout}\"\n{extra}\n",
                    urls.join(", ")
                )
            }
        }
    }

    /// Has the next bulk-string reply of every relay dropped.
    fn swallow_reply(&self) {
        self.relays.iter().for_each(FaultProxy::swallow_reply);
    }

    /// Replies the relays dropped so far.
    fn swallowed(&self) -> usize {
        self.relays.iter().map(FaultProxy::swallowed).sum()
    }

    /// Connections the relays accepted so far.
    fn accepted(&self) -> usize {
        self.relays.iter().map(FaultProxy::accepted).sum()
    }

    /// Starts `fault`.
    fn begin(&mut self, fault: Fault) {
        for relay in &self.relays {
            match fault {
                Fault::BlackHole => relay.black_hole(),
                Fault::Delay => relay.delay(Duration::from_millis(400)),
                Fault::Cut => relay.cut(),
                Fault::Restart | Fault::Pause => {}
            }
        }
        for server in &mut self.servers {
            match fault {
                Fault::Restart => server.stop(),
                Fault::Pause => {
                    let ms = FAULT_FOR.as_millis().to_string();
                    let _: () = server.query(&["CLIENT", "PAUSE", &ms, "ALL"]);
                }
                Fault::BlackHole | Fault::Delay | Fault::Cut => {}
            }
        }
    }

    /// What a fault does again during its span (a cut, every 100 ms).
    fn again(&self, fault: Fault) {
        if let Fault::Cut = fault {
            self.relays.iter().for_each(FaultProxy::cut);
        }
    }

    /// Ends `fault`; returns when it is over.
    async fn end(&mut self, fault: Fault, began: Instant) {
        match fault {
            Fault::BlackHole | Fault::Delay => self.relays.iter().for_each(FaultProxy::pass),
            Fault::Cut => {}
            Fault::Restart => self.servers.iter_mut().for_each(RedisServer::restart),
            Fault::Pause => tokio::time::sleep_until(began + FAULT_FOR).await,
        }
    }
}

/// A CA and a certificate for `localhost` signed by it, in `dir` (ca.pem, redis.pem,
/// redis.key); returns the CA file's path.
fn test_ca(dir: &std::path::Path) -> String {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_string()])
        .unwrap()
        .signed_by(&key, &ca, &ca_key)
        .unwrap();
    std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
    std::fs::write(dir.join("redis.pem"), cert.pem()).unwrap();
    std::fs::write(dir.join("redis.key"), key.serialize_pem()).unwrap();
    dir.join("ca.pem").display().to_string()
}

/// The whole scenario (see the module doc) for `fault` with `clients` concurrent clients.
async fn recovers(backend: Backend, fault: Fault, clients: usize, rls: bool) {
    let mut store = Store::start(backend);
    let api = OrdersApi::start("orders");
    let front = Front::start(rls, &store, api.addr);
    let mut probe = front.client().await;
    let n = AtomicUsize::new(0);

    // 1. Healthy: the store decides.
    for mode in MODES {
        assert_eq!(
            probe.ask(mode, &fresh(&n)).await,
            EXACT_FRESH,
            "{mode}: decided by the store before the fault\n{}",
            front.logs()
        );
    }
    let accepted_before = store.accepted();

    // 2. The fault, under load.
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicUsize::new(0));
    let mut load = Vec::new();
    for i in 0..clients {
        let mut c = front.client().await;
        let (stop, sent) = (stop.clone(), sent.clone());
        load.push(tokio::spawn(async move {
            let mut k = i;
            // Bounded in count and in time.
            while !stop.load(Ordering::Relaxed) && k < 20_000 {
                c.ask(MODES[k % 3], "load").await;
                sent.fetch_add(1, Ordering::Relaxed);
                k += clients;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let began = Instant::now();
    store.begin(fault);
    while began.elapsed() < FAULT_FOR {
        tokio::time::sleep(Duration::from_millis(100)).await;
        store.again(fault);
    }
    store.end(fault, began).await;
    let healed = Instant::now();
    stop.store(true, Ordering::Relaxed);
    for t in load {
        t.await.unwrap();
    }
    eprintln!(
        "{fault:?}, {clients} clients: {} requests during the fault",
        sent.load(Ordering::Relaxed)
    );

    // 3. Back to exact within the bound, and it stays so.
    let mut exact_since: Option<Instant> = None;
    let mut last_off = String::new();
    let until = healed + RECOVERY_BOUND + STAYS_EXACT_FOR;
    while Instant::now() < until || exact_since.is_none_or(|t| t.elapsed() < STAYS_EXACT_FOR) {
        let round = Instant::now();
        let mut all = true;
        for mode in MODES {
            let got = probe.ask(mode, &fresh(&n)).await;
            if got != EXACT_FRESH {
                all = false;
                last_off = format!("{mode}: {got:?}");
            }
        }
        if !all {
            exact_since = None;
        } else if exact_since.is_none() {
            exact_since = Some(round);
        }
        assert!(
            round < healed + RECOVERY_BOUND + STAYS_EXACT_FOR * 3,
            "{fault:?}, {clients} clients: not exact {:?} after the fault ended (last: {last_off})\n{}",
            healed.elapsed(),
            front.logs()
        );
        tokio::time::sleep_until(round + Duration::from_millis(50)).await;
    }
    let took = exact_since.expect("exact") - healed;
    eprintln!("{fault:?}, {clients} clients: exact again {took:?} after the fault ended");
    assert!(
        took <= RECOVERY_BOUND,
        "{fault:?}, {clients} clients: exact only {took:?} after the fault ended (bound {RECOVERY_BOUND:?}; last off: {last_off})\n{}",
        front.logs()
    );

    // 4. The key the clients used: the store's count, spent to the end, then nothing more.
    for mode in MODES {
        let mut answers = Vec::new();
        loop {
            let a = probe.ask(mode, "load").await;
            let done = a == Answer::Limited;
            answers.push(a);
            if done || answers.len() > LIMIT as usize + 1 {
                break;
            }
        }
        for _ in 0..3 {
            answers.push(probe.ask(mode, "load").await);
        }
        let admitted: Vec<u64> = answers
            .iter()
            .filter_map(|a| match a {
                Answer::Admitted(left) => Some(*left),
                _ => None,
            })
            .collect();
        let expected: Vec<u64> = match admitted.first() {
            Some(&first) => (0..=first).rev().collect(),
            None => Vec::new(),
        };
        assert_eq!(
            admitted, expected,
            "{mode}: each admitted request takes one from the store's count, down to 0: {answers:?}"
        );
        assert!(
            answers[admitted.len()..]
                .iter()
                .all(|a| *a == Answer::Limited),
            "{mode}: nothing admitted past the limit: {answers:?}"
        );
    }

    // What operators see agrees with what requests see.
    let ready: serde_json::Value = get_json(&client(), front.admin_url("/readyz")).await;
    assert_eq!(ready["store"]["up"], true, "{ready}");
    if matches!(fault, Fault::BlackHole | Fault::Delay) {
        // The connections that lost replies were replaced, not read again.
        assert!(
            store.accepted() > accepted_before,
            "no new connection to Redis after the fault"
        );
    }
}

macro_rules! recovery_tests {
    ($($name:ident: $backend:ident, $fault:ident, $clients:expr, $rls:expr;)*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            recovers(Backend::$backend, Fault::$fault, $clients, $rls).await;
        }
    )*};
}

recovery_tests! {
    black_hole_1_client: Redis, BlackHole, 1, false;
    black_hole_4_clients: Redis, BlackHole, 4, false;
    black_hole_16_clients: Redis, BlackHole, 16, false;
    delay_1_client: Redis, Delay, 1, false;
    delay_4_clients: Redis, Delay, 4, false;
    delay_16_clients: Redis, Delay, 16, false;
    cut_1_client: Redis, Cut, 1, false;
    cut_4_clients: Redis, Cut, 4, false;
    cut_16_clients: Redis, Cut, 16, false;
    restart_1_client: Redis, Restart, 1, false;
    restart_4_clients: Redis, Restart, 4, false;
    restart_16_clients: Redis, Restart, 16, false;
    pause_1_client: Redis, Pause, 1, false;
    pause_4_clients: Redis, Pause, 4, false;
    pause_16_clients: Redis, Pause, 16, false;
    rls_black_hole_1_client: Redis, BlackHole, 1, true;
    rls_black_hole_4_clients: Redis, BlackHole, 4, true;
    rls_black_hole_16_clients: Redis, BlackHole, 16, true;
    rls_delay_16_clients: Redis, Delay, 16, true;
    rls_restart_4_clients: Redis, Restart, 4, true;
    tls_black_hole_4_clients: Tls, BlackHole, 4, false;
    tls_black_hole_16_clients: Tls, BlackHole, 16, false;
    tls_delay_16_clients: Tls, Delay, 16, false;
    tls_cut_4_clients: Tls, Cut, 4, false;
    tls_restart_4_clients: Tls, Restart, 4, false;
    rls_tls_black_hole_16_clients: Tls, BlackHole, 16, true;
    cluster_black_hole_4_clients: Cluster, BlackHole, 4, false;
    cluster_black_hole_16_clients: Cluster, BlackHole, 16, false;
    cluster_delay_16_clients: Cluster, Delay, 16, false;
    cluster_cut_4_clients: Cluster, Cut, 4, false;
    cluster_pause_4_clients: Cluster, Pause, 4, false;
    rls_cluster_black_hole_16_clients: Cluster, BlackHole, 16, true;
}

/// A reply lost in the middle of a pipeline: the calls around it never take another call's
/// reply for their own. Sixteen clients, each on a key of its own that starts at its own
/// count, so that a reply of another key shows another count; the relay drops one reply at a
/// time while they send. Every admitted answer must show the count of its own key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_swallowed_reply_is_never_taken_for_another_calls_answer() {
    swallowed_replies(Backend::Redis).await;
}

/// The same through a Redis Cluster's connections (redis-rs's, one per master).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_swallowed_reply_on_a_cluster_is_never_taken_for_another_calls_answer() {
    swallowed_replies(Backend::Cluster).await;
}

async fn swallowed_replies(backend: Backend) {
    const KEYS: usize = 16;
    const BIG: u64 = 100_000;
    let store = Store::start(backend);
    let api = OrdersApi::start("orders");
    let rules = format!(
        "\n[[rules]]\nname = \"closed\"\nkey = [\"header:x-user\"]\nalgorithm = \"fixed_window\"\nlimit = {BIG}\nwindow = \"1h\"\non_store_error = \"closed\"\n"
    );
    let gw = gateway_on_threads(2, api.addr, &store.table_with("500ms"), &rules);
    let c = client();
    let ask = |user: String| {
        let req = c
            .get(gw.url("/orders"))
            .header("x-user", user)
            .header("x-mode", "closed");
        async move {
            let r = req.send().await.unwrap();
            let status = r.status().as_u16();
            let left = r
                .headers()
                .get("ratelimit")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| remaining(v, "closed"));
            (status, left)
        }
    };
    // Key i starts at 3 * i.
    for i in 0..KEYS {
        for _ in 0..3 * i {
            assert_eq!(ask(format!("k{i}")).await.0, 200);
        }
    }
    let accepted_before = store.accepted();
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for i in 0..KEYS {
        let stop = stop.clone();
        tasks.push(async move {
            // Charged for sure, and possibly charged (a call that failed may have run).
            let (mut charged, mut maybe) = (3 * i as u64, 0u64);
            let mut wrong = Vec::new();
            let mut failed = 0;
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) && n < 2_000 {
                n += 1;
                match ask(format!("k{i}")).await {
                    (200, Some(left)) => {
                        let count = BIG - left;
                        if count < charged + 1 || count > charged + 1 + maybe {
                            wrong.push((charged + 1, maybe, count));
                        }
                        charged = count;
                        maybe = 0;
                    }
                    _ => {
                        failed += 1;
                        maybe += 1;
                    }
                }
            }
            (i, wrong, failed, n)
        });
    }
    let swallow = async {
        for _ in 0..5 {
            tokio::time::sleep(Duration::from_millis(300)).await;
            store.swallow_reply();
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        stop.store(true, Ordering::Relaxed);
    };
    let (results, ()) = tokio::join!(futures::future::join_all(tasks), swallow);
    assert!(
        store.swallowed() >= 3,
        "the relay dropped {} replies: {results:?}",
        store.swallowed()
    );
    let mut total_failed = 0;
    for (i, wrong, failed, n) in results {
        assert!(
            wrong.is_empty(),
            "key k{i}: answers with another key's count (expected from, maybe more, shown): {wrong:?}"
        );
        assert!(n > 10, "key k{i}: only {n} requests");
        total_failed += failed;
    }
    eprintln!("{total_failed} requests failed around the swallowed replies");
    assert!(
        store.accepted() > accepted_before,
        "the connections that lost a reply were replaced"
    );
    // Exact afterwards: a fresh key starts at BIG - 1.
    assert_eq!(
        ask("after".into()).await,
        (200, Some(BIG - 1)),
        "{}",
        gw.logs()
    );
}
