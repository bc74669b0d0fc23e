//! Shared test harness: starts the real `floodgate` and `orders-api` binaries on free loopback
//! ports with generated configs, waits until they answer, and stops them on drop (also when a
//! test panics), with SIGINT so that no grace period is waited out.

#![allow(dead_code)]

use std::io::Write as _;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A port that was free a moment ago on 127.0.0.1, and never one this test process handed out
/// before: tests run in parallel, the kernel may give a port just released to the next
/// `bind(0)`, and two servers told the same port would let one test talk to another test's
/// process (the likely cause of a one-off 502 in tests/proxy.rs routes_auth_and_404).
///
/// It is drawn below the kernel's ephemeral range (`ip_local_port_range`, usually from 32768), not
/// from `bind(0)`: a port from that range may become the local port of some outgoing
/// connection (a gateway to its upstream, a client to Redis) in the moment between this call
/// and the server's own bind, which then fails with "address in use" (seen in CI:
/// quotas.rs's webhook receiver).
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    let ephemeral = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|t| t.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    const LOWEST: u16 = 10000;
    if ephemeral > LOWEST + 1000 {
        let span = u64::from(ephemeral - LOWEST);
        // A different sequence in every test process (several may run at once).
        let seed = u64::from(std::process::id())
            ^ std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0);
        let _ = NEXT.compare_exchange(
            0,
            seed | 1,
            std::sync::atomic::Ordering::Relaxed,
            std::sync::atomic::Ordering::Relaxed,
        );
        for _ in 0..10_000 {
            // xorshift64: cheap, and good enough to spread the draws over the span.
            let mut x = NEXT.load(std::sync::atomic::Ordering::Relaxed);
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            NEXT.store(x, std::sync::atomic::Ordering::Relaxed);
            let port = LOWEST + (x % span) as u16;
            if given.contains(&port) || TcpListener::bind(("127.0.0.1", port)).is_err() {
                continue;
            }
            given.push(port);
            return port;
        }
    }
    loop {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
        let port = l.local_addr().expect("local addr").port();
        if !given.contains(&port) {
            given.push(port);
            return port;
        }
    }
}

/// Waits until something accepts TCP connections on `addr`, or panics after `limit`.
pub fn wait_for_port(addr: SocketAddr, limit: Duration, child: &mut Child, what: &str) {
    let start = Instant::now();
    loop {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("{what} exited before listening on {addr}: {status}");
        }
        assert!(
            start.elapsed() < limit,
            "{what} did not listen on {addr} within {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// Sends SIGINT (Pingora's fast shutdown) and waits; SIGKILL if it lingers.
pub fn stop(child: &mut Child) {
    if let Ok(Some(_)) = child.try_wait() {
        return;
    }
    let _ = Command::new("kill")
        .arg("-INT")
        .arg(child.id().to_string())
        .status();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(10) {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// A running demo Orders API.
pub struct OrdersApi {
    child: Child,
    /// Where it listens.
    pub addr: SocketAddr,
}

impl OrdersApi {
    /// Starts one named `name` on a free port.
    pub fn start(name: &str) -> OrdersApi {
        OrdersApi::start_at(name, free_addr(), &[])
    }

    /// Starts one named `name` on `addr` (so that a test can restart it where it was), with
    /// `extra` flags (TLS, `--status`, ...).
    pub fn start_at(name: &str, addr: SocketAddr, extra: &[&str]) -> OrdersApi {
        let mut child = Command::new(env!("CARGO_BIN_EXE_orders-api"))
            .args(["--listen", &addr.to_string(), "--name", name])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start orders-api");
        wait_for_port(addr, Duration::from_secs(20), &mut child, "orders-api");
        OrdersApi { child, addr }
    }

    /// Kills it at once (a target that dies).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A loopback address on a free port.
pub fn free_addr() -> SocketAddr {
    format!("127.0.0.1:{}", free_port()).parse().unwrap()
}

impl Drop for OrdersApi {
    fn drop(&mut self) {
        stop(&mut self.child);
    }
}

/// A running floodgate with its own temp folder (config, keys, pid and upgrade socket).
pub struct Gateway {
    child: Child,
    /// The folder holding its files.
    pub dir: tempfile::TempDir,
    /// The plain listener.
    pub addr: SocketAddr,
    /// The admin listener.
    pub admin: SocketAddr,
    /// Where stderr (the logs) goes.
    pub log: PathBuf,
}

/// The `[server]` table every test config starts with: free ports, one thread.
pub fn server_section(addr: SocketAddr, admin: SocketAddr) -> String {
    format!("[server]\nlisten = [\"{addr}\"]\nadmin_listen = \"{admin}\"\nthreads = 1\ngrace_period = \"1s\"\n")
}

impl Gateway {
    /// Starts floodgate with `body` appended to a generated `[server]` table (use `extra_server`
    /// for more `[server]` keys). Files in `files` are written next to the config first.
    pub fn start_with(extra_server: &str, body: &str, files: &[(&str, &str)]) -> Gateway {
        Gateway::start_custom(
            |addr, admin| format!("{}{extra_server}", server_section(addr, admin)),
            body,
            files,
        )
    }

    /// Starts floodgate with `body` as everything after `[server]`.
    pub fn start(body: &str) -> Gateway {
        Gateway::start_with("", body, &[])
    }

    /// `http://127.0.0.1:PORT` + path.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// The admin URL for `path`.
    pub fn admin_url(&self, path: &str) -> String {
        format!("http://{}{}", self.admin, path)
    }

    /// What it has logged so far.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Stops it now (drop does the same).
    pub fn stop(&mut self) {
        stop(&mut self.child);
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        stop(&mut self.child);
    }
}

/// Spawns the binary for `config` with its process files in `dir`, logs to `log`, and
/// `extra` arguments such as `--upgrade`.
pub fn spawn_floodgate(config: &Path, dir: &Path, log: &Path, extra: &[&str]) -> Child {
    spawn_floodgate_logging(config, dir, log, extra, "info")
}

/// [`spawn_floodgate`] with `RUST_LOG` set to `rust_log`.
pub fn spawn_floodgate_logging(
    config: &Path,
    dir: &Path,
    log: &Path,
    extra: &[&str],
    rust_log: &str,
) -> Child {
    spawn_floodgate_env(config, dir, log, extra, &[("RUST_LOG", rust_log)])
}

/// [`spawn_floodgate`] with environment variables `env` (`RUST_LOG` defaults to `info`).
pub fn spawn_floodgate_env(
    config: &Path,
    dir: &Path,
    log: &Path,
    extra: &[&str],
    env: &[(&str, &str)],
) -> Child {
    let log_file = std::fs::File::create(log).expect("log file");
    Command::new(env!("CARGO_BIN_EXE_floodgate"))
        .arg("-c")
        .arg(config)
        .arg("--pid-file")
        .arg(dir.join("floodgate.pid"))
        .arg("--upgrade-sock")
        .arg(dir.join("upgrade.sock"))
        .args(extra)
        .env("RUST_LOG", "info")
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(log_file)
        .spawn()
        .expect("start floodgate")
}

/// Runs `floodgate check -c FILE` on `config` text (written as gateway.toml in a temp folder,
/// with `files` beside it) and returns (success, stdout, stderr).
pub fn check(config: &str, files: &[(&str, &str)]) -> (bool, String, String) {
    let dir = tempfile::tempdir().expect("temp dir");
    for (name, content) in files {
        std::fs::write(dir.path().join(name), content).expect("write file");
    }
    let path = dir.path().join("gateway.toml");
    let mut f = std::fs::File::create(&path).expect("config");
    f.write_all(config.as_bytes()).expect("write config");
    let out = Command::new(env!("CARGO_BIN_EXE_floodgate"))
        .arg("check")
        .arg("-c")
        .arg(&path)
        .output()
        .expect("run floodgate check");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// An upstream table and a route to it, the common case.
pub fn orders_upstream(targets: &[SocketAddr]) -> String {
    let list: Vec<String> = targets.iter().map(|t| format!("\"{t}\"")).collect();
    format!("[[upstreams]]\nname = \"orders\"\ntargets = [{}]\nconnect_timeout = \"500ms\"\nread_timeout = \"2s\"\n", list.join(", "))
}

/// The demo keys: `test` (acme-prod, user acme, plan pro) and `partner` (globex-partner).
pub const DEMO_KEYS: &str = r#"
[[auth.keys]]
id = "acme-prod"
sha256 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
user = "acme"
plan = "pro"

[[auth.keys]]
id = "globex-partner"
secret = "partner"
user = "globex"
plan = "partner"
"#;

/// Starts `n` slow requests (`GET url` with `headers`) that each hold a concurrency slot:
/// a request that finds the slots briefly taken by a probe gets 429 and tries again, until
/// `deadline`. The tasks return the final statuses.
pub fn hold_slots(
    c: &reqwest::Client,
    url: &str,
    headers: &[(&str, &str)],
    n: usize,
) -> Vec<tokio::task::JoinHandle<u16>> {
    (0..n)
        .map(|_| {
            let mut req = c.get(url);
            for (k, v) in headers {
                req = req.header(*k, *v);
            }
            let req = req.build().expect("request");
            let c = c.clone();
            tokio::spawn(async move {
                let deadline = Instant::now() + Duration::from_secs(10);
                loop {
                    let attempt = req.try_clone().expect("bodyless request");
                    let status = c
                        .execute(attempt)
                        .await
                        .expect("slow request")
                        .status()
                        .as_u16();
                    if status != 429 || Instant::now() > deadline {
                        return status;
                    }
                }
            })
        })
        .collect()
}

/// Polls `GET url` with `headers` until it answers `status`, or panics after 10 s with `why`.
pub async fn wait_for_status(
    c: &reqwest::Client,
    url: &str,
    headers: &[(&str, &str)],
    status: u16,
    why: &str,
) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut req = c.get(url);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        if req.send().await.expect("probe").status().as_u16() == status {
            return;
        }
        assert!(Instant::now() < deadline, "{why}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `GET url` and its body as text.
pub async fn get_text(c: &reqwest::Client, url: impl reqwest::IntoUrl) -> String {
    c.get(url)
        .send()
        .await
        .expect("GET")
        .text()
        .await
        .expect("body")
}

/// `GET url` with API key `key` in `x-api-key`, the header the demo keys are read from.
pub async fn get_with_key(
    c: &reqwest::Client,
    url: impl reqwest::IntoUrl,
    key: &str,
) -> reqwest::Response {
    c.get(url)
        .header("x-api-key", key)
        .send()
        .await
        .expect("GET")
}

/// `GET url` with `token` as a bearer token (the admin token, or an API key read from
/// `Authorization`).
pub async fn get_with_token(
    c: &reqwest::Client,
    url: impl reqwest::IntoUrl,
    token: &str,
) -> reqwest::Response {
    c.get(url).bearer_auth(token).send().await.expect("GET")
}

/// `GET url` and its body as JSON.
pub async fn get_json(c: &reqwest::Client, url: impl reqwest::IntoUrl) -> serde_json::Value {
    c.get(url)
        .send()
        .await
        .expect("GET")
        .json()
        .await
        .expect("JSON body")
}

/// One `GET path` on a fresh `connection: close` connection, by hand (no client library that
/// might retry, pool, or clean up the path): (status, body), or what went wrong. Reads give up
/// after `read_timeout`.
pub fn http_get(
    addr: SocketAddr,
    path: &str,
    read_timeout: Duration,
) -> Result<(u16, String), String> {
    status_and_body(&http_get_raw(addr, path, read_timeout)?)
}

/// An answer's status and body.
fn status_and_body(text: &str) -> Result<(u16, String), String> {
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("no status line in {text:?}"))?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((status, body))
}

/// `GET path` from the admin listener at `addr` on a raw connection, with a `Host` the admin
/// listener answers (`localhost`; it refuses names it does not know): (status, body).
pub fn admin_get(addr: SocketAddr, path: &str) -> Result<(u16, String), String> {
    status_and_body(&raw_get(addr, path, "localhost", Duration::from_secs(10))?)
}

/// [`http_get`]'s exchange, the whole answer as text (status line, headers and body).
pub fn http_get_raw(
    addr: SocketAddr,
    path: &str,
    read_timeout: Duration,
) -> Result<String, String> {
    raw_get(addr, path, "floodgate.test", read_timeout)
}

/// `GET path` with `Host: host` on a new connection, closed after the answer: all of it.
fn raw_get(
    addr: SocketAddr,
    path: &str,
    host: &str,
    read_timeout: Duration,
) -> Result<String, String> {
    use std::io::Read as _;
    let mut conn = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .map_err(|e| format!("connect: {e}"))?;
    conn.set_read_timeout(Some(read_timeout))
        .map_err(|e| e.to_string())?;
    conn.write_all(
        format!("GET {path} HTTP/1.1\r\nhost: {host}\r\nconnection: close\r\n\r\n").as_bytes(),
    )
    .map_err(|e| format!("write: {e}"))?;
    let mut raw = Vec::new();
    conn.read_to_end(&mut raw)
        .map_err(|e| format!("read: {e}"))?;
    Ok(String::from_utf8_lossy(&raw).into_owned())
}

/// Polls `f` every 20 ms until it returns `Some`, or panics after `limit` naming `what`.
pub async fn eventually<T, F, Fut>(limit: Duration, what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = std::time::Instant::now();
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until the gateway has admitted the start-up probe's connection (the harness's
/// connect to the proxy port, from 127.0.0.1) and seen it close, so that it takes no slot a
/// test counts on. The probe's connect succeeds as soon as the port is bound, which can be
/// before the listener's accept loop runs: an open count of 0 alone may be read before the
/// probe is even admitted.
pub async fn probe_connection_gone(gw: &Gateway) {
    let c = client();
    let url = gw.admin_url("/metrics");
    eventually(
        Duration::from_secs(10),
        "the probe connection admitted and closed",
        || {
            let (c, url) = (c.clone(), url.clone());
            async move {
                let m = get_text(&c, &url).await;
                let admitted = metric_value(&m, "floodgate_connections_total");
                let open = metric_value(&m, "floodgate_connections_open");
                (admitted >= Some(1.0) && open == Some(0.0)).then_some(())
            }
        },
    )
    .await;
}

/// The value of one series in a Prometheus text exposition: the line `series value`, where
/// `series` is the name with its labels as exposed (`name{a="x",b="y"}`, labels in name
/// order). `None` when the series is not there.
pub fn metric_value(metrics: &str, series: &str) -> Option<f64> {
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|value| value.trim().parse().ok())
}

/// A reqwest client with no proxy settings from the environment.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(20))
        .build()
        .expect("client")
}

// ---- Signals and process hand-off (tests/shutdown.rs, tests/upgrade.rs) ----

/// Sends `signal` ("TERM", "QUIT", "INT", ...) to process `pid` with kill(1).
pub fn send_signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{signal} {pid} failed: {status}");
}

/// Waits up to `limit` for `child` to exit: its status, or `None` if it is still running.
pub fn wait_exit(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let start = Instant::now();
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        if start.elapsed() >= limit {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Any child process, stopped like the others (SIGINT, then SIGKILL) when dropped.
pub struct Spawned {
    /// The process.
    pub child: Child,
}

impl Drop for Spawned {
    fn drop(&mut self) {
        stop(&mut self.child);
    }
}

/// [`spawn_floodgate`], stopped when dropped.
pub fn spawn_floodgate_with(config: &Path, dir: &Path, log: &Path, extra: &[&str]) -> Spawned {
    Spawned {
        child: spawn_floodgate(config, dir, log, extra),
    }
}

impl Gateway {
    /// Starts floodgate with a `[server]` table of the test's own: `server(addr, admin)` returns
    /// it (see [`server_section`]), and `body` follows it.
    pub fn start_custom(
        server: impl FnOnce(SocketAddr, SocketAddr) -> String,
        body: &str,
        files: &[(&str, &str)],
    ) -> Gateway {
        Gateway::start_logging(server, body, files, "info")
    }

    /// [`Gateway::start_custom`] with `RUST_LOG` set to `rust_log`.
    pub fn start_logging(
        server: impl FnOnce(SocketAddr, SocketAddr) -> String,
        body: &str,
        files: &[(&str, &str)],
        rust_log: &str,
    ) -> Gateway {
        Gateway::start_env(server, body, files, &[("RUST_LOG", rust_log)])
    }

    /// [`Gateway::start_custom`] with environment variables `env`.
    pub fn start_env(
        server: impl FnOnce(SocketAddr, SocketAddr) -> String,
        body: &str,
        files: &[(&str, &str)],
        env: &[(&str, &str)],
    ) -> Gateway {
        let dir = tempfile::tempdir().expect("temp dir");
        for (name, content) in files {
            std::fs::write(dir.path().join(name), content).expect("write file");
        }
        let addr = free_addr();
        let admin = free_addr();
        let config = format!("{}\n{body}", server(addr, admin));
        let path = dir.path().join("gateway.toml");
        std::fs::write(&path, config).expect("write config");
        let log = dir.path().join("floodgate.log");
        let child = spawn_floodgate_env(&path, dir.path(), &log, &[], env);
        let mut gw = Gateway {
            child,
            dir,
            addr,
            admin,
            log,
        };
        wait_for_port(
            admin,
            Duration::from_secs(30),
            &mut gw.child,
            "floodgate (admin)",
        );
        wait_for_port(addr, Duration::from_secs(30), &mut gw.child, "floodgate");
        gw
    }

    /// The config file it runs.
    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("gateway.toml")
    }

    /// Sends it `signal` ("TERM", "QUIT", "INT", ...).
    pub fn signal(&self, signal: &str) {
        send_signal(self.child.id(), signal);
    }

    /// Waits up to `limit` for it to exit: its status, or `None` if it is still running.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        wait_exit(&mut self.child, limit)
    }
}

pub mod fault;
pub mod redis;
pub mod rls;
pub mod upgrade;

/// [`admin_request`] with no extra header and a 10 s read timeout: (status, body as JSON).
pub fn admin_json(
    gw: &Gateway,
    token: &str,
    method: &str,
    path: &str,
    body: &str,
) -> (u16, serde_json::Value) {
    let (status, _, json) = admin_request(
        gw.admin,
        token,
        method,
        path,
        &[],
        body,
        Duration::from_secs(10),
    );
    (status, json)
}

/// A gateway with admin token `token`, the demo keys, `upstream` (an `[[upstreams]]` table
/// named `orders`, see [`orders_upstream`]), `store`, the route `/orders` behind a required
/// key, and `rules`: the usage API's and the bans' gateway.
pub fn keyed_gateway(token: &str, upstream: &str, store: &str, rules: &str) -> Gateway {
    Gateway::start_with(
        &format!("admin_token = \"{token}\"\n"),
        &format!(
            "{DEMO_KEYS}\n{upstream}{store}\n[[routes]]\nname = \"orders\"\nmatch = {{ path_prefix = \"/orders\" }}\nupstream = \"orders\"\nauth = \"required\"\n{rules}"
        ),
        &[],
    )
}

/// One admin request by hand on a connection of its own (`Host: localhost`, `Bearer token`, a
/// JSON content type, `headers` added, `connection: close`), read until the server closes:
/// (status, the response head in lower case, the body as JSON or `{"raw": body}`).
pub fn admin_request(
    admin: SocketAddr,
    token: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
    read_timeout: Duration,
) -> (u16, String, serde_json::Value) {
    use std::io::Read;
    let mut conn = TcpStream::connect(admin).expect("admin listener");
    conn.set_read_timeout(Some(read_timeout)).unwrap();
    let extra: String = headers
        .iter()
        .map(|(k, v)| format!("{k}: {v}\r\n"))
        .collect();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nhost: localhost\r\nauthorization: Bearer {token}\r\ncontent-type: application/json\r\n{extra}content-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes()).unwrap();
    conn.write_all(body.as_bytes()).unwrap();
    let mut raw = String::new();
    conn.read_to_string(&mut raw).unwrap();
    let status = raw
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let json = serde_json::from_str(body).unwrap_or_else(|_| serde_json::json!({ "raw": body }));
    (status, head.to_ascii_lowercase(), json)
}

/// Waits, when less than `budget` is left of the current `window` (windows aligned to the Unix
/// epoch, as fixed windows count), until the next one starts: a test whose steps must fall in
/// one window then has at least `budget` for them.
pub async fn early_in_window(window: Duration, budget: Duration) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis();
    let window_ms = window.as_millis().max(1);
    let left = window_ms - now % window_ms;
    if left < budget.as_millis() {
        tokio::time::sleep(Duration::from_millis(left as u64 + 20)).await;
    }
}

/// The shipped gateway.toml with its listeners and upstream moved to a test's ports, line for
/// line (its line numbers are the shipped file's).
pub fn shipped_config(gw_port: u16, admin_port: u16, api: SocketAddr) -> String {
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/gateway.toml")).unwrap();
    let replaced = text
        .replace("\"0.0.0.0:8080\"", &format!("\"127.0.0.1:{gw_port}\""))
        .replace("\"127.0.0.1:9901\"", &format!("\"127.0.0.1:{admin_port}\""))
        .replace("\"127.0.0.1:9000\"", &format!("\"{api}\""));
    assert_ne!(text, replaced);
    assert_eq!(replaced.lines().count(), text.lines().count());
    replaced
}

/// A hand-written upstream on a free loopback port: `serve` gets each accepted connection on
/// a thread of its own. The threads are detached: each waits only on accept or on a
/// connection the gateway closes when it stops.
pub fn raw_upstream(serve: fn(TcpStream)) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { return };
            std::thread::spawn(move || serve(conn));
        }
    });
    addr
}

/// Reads up to the end of a request or response head, byte by byte (so nothing after it is
/// consumed); `None` when the peer closes or the read fails first.
pub fn read_head(conn: &mut TcpStream) -> Option<Vec<u8>> {
    use std::io::Read as _;
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match conn.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => return None,
        }
    }
    Some(head)
}
