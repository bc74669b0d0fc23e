//! Real `redis-server` processes for tests, on free loopback ports: a standalone server that
//! can be stopped and restarted on the same port, and a 3-master Redis Cluster. Every process
//! is killed when its handle drops, also when the test panics. Nothing listens beyond
//! 127.0.0.1, nothing is persisted (`--save "" --appendonly no`), and each server keeps its
//! files (log, cluster config) in its own temp folder. `DEBUG` is enabled for loopback clients
//! so that tests can stall a server with `DEBUG SLEEP`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::free_port;

// Test files that `use common::*` import this module under the name `redis`, which hides the
// `redis` crate there; re-exporting the crate's items keeps `redis::cmd`, `redis::Client`, ...
// working in those files as if they named the crate.
pub use ::redis::*;

/// How long a server may take to answer PING after being started.
const START_LIMIT: Duration = Duration::from_secs(20);

/// One `redis-server` process.
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
    /// Arguments after the common ones, kept for restarts.
    extra: Vec<String>,
}

impl RedisServer {
    /// Starts a standalone server on a free loopback port and waits until it answers PING.
    pub fn start() -> RedisServer {
        RedisServer::start_with(|_, _| Vec::new())
    }

    /// Starts a server with more arguments, computed from its port and its folder.
    pub fn start_with(extra: impl FnOnce(u16, &Path) -> Vec<String>) -> RedisServer {
        let dir = tempfile::tempdir().expect("temp dir for redis-server");
        let port = free_port();
        let extra = extra(port, dir.path());
        let mut server = RedisServer {
            child: None,
            port,
            dir,
            extra,
        };
        server.spawn();
        server
    }

    fn spawn(&mut self) {
        assert!(self.child.is_none(), "redis-server already running");
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            // Tests stall Redis with DEBUG SLEEP, which Redis 7 refuses by default.
            .args(["--enable-debug-command", "local"])
            .arg("--dir")
            .arg(self.dir.path())
            .arg("--logfile")
            .arg(self.log_path())
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server (is it installed? `make deps`)");
        self.child = Some(child);
        self.wait_ready();
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("redis.log")
    }

    /// What the server logged (for assertion messages).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    fn wait_ready(&mut self) {
        let start = Instant::now();
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    panic!(
                        "redis-server on port {} exited at start ({status}):\n{}",
                        self.port,
                        self.log()
                    );
                }
            }
            if self.ping() {
                return;
            }
            assert!(
                start.elapsed() < START_LIMIT,
                "redis-server on port {} did not answer PING within {START_LIMIT:?}:\n{}",
                self.port,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn ping(&self) -> bool {
        let Ok(client) = redis::Client::open(self.url()) else {
            return false;
        };
        let Ok(mut conn) = client.get_connection_with_timeout(Duration::from_millis(500)) else {
            return false;
        };
        redis::cmd("PING").query::<String>(&mut conn).is_ok()
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:PORT`.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// A new synchronous connection (its own TCP connection, separate from the store's).
    pub fn connection(&self) -> redis::Connection {
        let client = redis::Client::open(self.url()).expect("client");
        let conn = client
            .get_connection_with_timeout(Duration::from_secs(5))
            .expect("connect to redis-server");
        conn.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("read timeout");
        conn
    }

    /// Runs one command on a new connection and returns its reply.
    pub fn query<T: redis::FromRedisValue>(&self, args: &[&str]) -> T {
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        cmd.query(&mut self.connection())
            .unwrap_or_else(|e| panic!("redis {args:?}: {e}"))
    }

    /// How many times `command` (lower case, e.g. "evalsha") ran since the last
    /// `CONFIG RESETSTAT`, from `INFO commandstats`.
    pub fn command_calls(&self, command: &str) -> u64 {
        let info: String = self.query(&["INFO", "commandstats"]);
        command_calls(&info, command)
    }

    /// Whether the process is running.
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Kills the server (SIGKILL, like a crash) and waits for it to be gone.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port (stopping it first if it runs), with empty memory,
    /// and waits until it answers PING.
    pub fn restart(&mut self) {
        self.stop();
        self.spawn();
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `calls=` of `cmdstat_<command>` in an `INFO commandstats` text, 0 when absent.
pub fn command_calls(info: &str, command: &str) -> u64 {
    let prefix = format!("cmdstat_{command}:");
    info.lines()
        .find_map(|line| line.trim().strip_prefix(prefix.as_str()))
        .and_then(|rest| {
            rest.split(',')
                .find_map(|kv| kv.strip_prefix("calls="))
                .and_then(|n| n.parse().ok())
        })
        .unwrap_or(0)
}

/// A Redis Cluster of masters without replicas, each a [`RedisServer`] with its own cluster
/// bus port.
pub struct RedisCluster {
    /// The masters, in creation order.
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts 3 masters and joins them with `redis-cli --cluster create`; returns once every
    /// node reports `cluster_state:ok`.
    pub fn start() -> RedisCluster {
        RedisCluster::start_masters(3)
    }

    /// Starts `masters` masters (at least 3, Redis' minimum) as one cluster.
    pub fn start_masters(masters: usize) -> RedisCluster {
        RedisCluster::start_masters_with(masters, &[])
    }

    /// Starts 3 masters whose survivors keep serving their own slots when one of them dies
    /// (`cluster-require-full-coverage no`), as a cluster without replicas should be run.
    pub fn start_partial_coverage() -> RedisCluster {
        RedisCluster::start_masters_with(3, &["--cluster-require-full-coverage", "no"])
    }

    /// Starts `masters` masters with `extra` arguments each.
    pub fn start_masters_with(masters: usize, extra: &[&str]) -> RedisCluster {
        let extra: Vec<String> = extra.iter().map(|a| a.to_string()).collect();
        RedisCluster::join(RedisCluster::spawn_masters(masters, |_| extra.clone()))
    }

    /// Starts `masters` cluster-enabled servers, node `i` with `extra(i)` more arguments, not
    /// yet joined (see [`RedisCluster::join`]): a test that puts something in front of each
    /// node (a fault relay, announced with `--cluster-announce-port`) starts it in between.
    pub fn spawn_masters(masters: usize, extra: impl Fn(usize) -> Vec<String>) -> Vec<RedisServer> {
        (0..masters)
            .map(|i| {
                RedisServer::start_with(|port, dir| {
                    // The bus port defaults to port + 10000, which may be taken or past 65535:
                    // pick a free one (and announce it, whatever client port is announced).
                    let bus = free_port().to_string();
                    let mut args = extra(i);
                    args.extend([
                        "--cluster-enabled".into(),
                        "yes".into(),
                        "--cluster-config-file".into(),
                        dir.join(format!("nodes-{port}.conf")).display().to_string(),
                        "--cluster-port".into(),
                        bus.clone(),
                        "--cluster-announce-bus-port".into(),
                        bus,
                        "--cluster-node-timeout".into(),
                        "5000".into(),
                    ]);
                    args
                })
            })
            .collect()
    }

    /// Joins `nodes` into one cluster with `redis-cli --cluster create`; returns once every
    /// node reports `cluster_state:ok`.
    pub fn join(nodes: Vec<RedisServer>) -> RedisCluster {
        let addrs: Vec<String> = nodes.iter().map(|n| n.addr().to_string()).collect();
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .expect("run redis-cli --cluster create");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let cluster = RedisCluster { nodes };
        cluster.wait_ok();
        cluster
    }

    fn wait_ok(&self) {
        let start = Instant::now();
        let limit = Duration::from_secs(30);
        loop {
            let ok = self.nodes.iter().all(|n| {
                let info: String = n.query(&["CLUSTER", "INFO"]);
                info.contains("cluster_state:ok") && info.contains("cluster_slots_assigned:16384")
            });
            if ok {
                return;
            }
            assert!(start.elapsed() < limit, "cluster not ok within {limit:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A `[store]` table for this cluster with a decision budget of `timeout`, then `extra`
    /// (as [`store`] writes one for a standalone server).
    pub fn store(&self, timeout: &str, extra: &str) -> String {
        let urls: Vec<String> = self.urls().iter().map(|u| format!("\"{u}\"")).collect();
        format!(
            "\n[store]\nbackend = \"redis-cluster\"\nurls = [{}]\ntimeout = \"{timeout}\"\n{extra}\n",
            urls.join(", ")
        )
    }

    /// Seed URLs of every master.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The index of the master that owns `key`'s slot: the only one that does not answer
    /// `EXISTS key` with a MOVED redirection.
    pub fn owner_of(&self, key: &str) -> usize {
        self.nodes
            .iter()
            .position(|n| {
                redis::cmd("EXISTS")
                    .arg(key)
                    .query::<i64>(&mut n.connection())
                    .is_ok()
            })
            .unwrap_or_else(|| panic!("no master owns {key}"))
    }
}

/// The store's settings for `urls` with a decision budget of `timeout` and keys under
/// `key_prefix`, the rest as the config's defaults (one instance, 10,000 keys), for the tests
/// that open a `RedisStore` directly.
pub fn store_settings(
    backend: floodgate::config::Backend,
    urls: Vec<String>,
    timeout: Duration,
    key_prefix: &str,
) -> floodgate::config::Store {
    floodgate::config::Store {
        backend,
        urls,
        timeout,
        key_prefix: key_prefix.into(),
        instances: 1,
        max_keys: 10_000,
        max_bans: floodgate::limiter::settings::DEFAULT_MAX_BANS,
        connect_timeout: floodgate::limiter::settings::DEFAULT_CONNECT_TIMEOUT,
    }
}

/// Stalls a server with `DEBUG SLEEP seconds` on its own connection in a thread (Redis
/// answers nothing meanwhile); joined on drop so that no thread outlives the test.
pub struct Stall(Option<std::thread::JoinHandle<()>>);

impl Stall {
    /// Starts the stall; it lasts `seconds` (`"1.5"`) from about now.
    pub fn start(server: &RedisServer, seconds: &str) -> Stall {
        let mut conn = server.connection();
        let seconds = seconds.to_string();
        Stall(Some(std::thread::spawn(move || {
            let r: Result<(), _> = cmd("DEBUG").arg("SLEEP").arg(seconds).query(&mut conn);
            r.expect("DEBUG SLEEP");
        })))
    }
}

impl Drop for Stall {
    fn drop(&mut self) {
        if let Some(t) = self.0.take() {
            let _ = t.join();
        }
    }
}

/// The one route the Redis end-to-end tests use: `/orders` to the orders upstream, no key.
pub const ROUTES: &str = "\n[[routes]]\nname = \"orders\"\nmatch = { path_prefix = \"/orders\" }\nupstream = \"orders\"\nauth = \"none\"\n";

/// A `[store]` table for `url` with a decision budget of `timeout`.
pub fn store(url: &str, timeout: &str, extra: &str) -> String {
    format!("\n[store]\nbackend = \"redis\"\nurl = \"{url}\"\ntimeout = \"{timeout}\"\n{extra}\n")
}

/// A gateway in front of `api` with `store` (see [`store`]), [`ROUTES`] and `rules`.
pub fn gateway(api: std::net::SocketAddr, store: &str, rules: &str) -> super::Gateway {
    gateway_on_threads(1, api, store, rules)
}

/// [`gateway`] serving on `threads` threads.
pub fn gateway_on_threads(
    threads: usize,
    api: std::net::SocketAddr,
    store: &str,
    rules: &str,
) -> super::Gateway {
    super::Gateway::start_custom(
        |addr, admin| {
            super::server_section(addr, admin)
                .replace("threads = 1\n", &format!("threads = {threads}\n"))
        },
        &format!("{}{store}{ROUTES}{rules}", super::orders_upstream(&[api])),
        &[],
    )
}

/// Sends `n` requests spread round robin over `gws`, `parallel` at a time; counts statuses.
pub async fn hammer(
    gws: &[&super::Gateway],
    n: usize,
    parallel: usize,
    path: &str,
    headers: &[(&str, &str)],
) -> std::collections::BTreeMap<u16, usize> {
    let mut counts = std::collections::BTreeMap::new();
    for (status, _) in hammer_ratelimit(gws, n, parallel, path, headers).await {
        *counts.entry(status).or_insert(0) += 1;
    }
    counts
}

/// [`hammer`], answer by answer: each request's status (0: no answer) and its `RateLimit`
/// header, in the order sent.
pub async fn hammer_ratelimit(
    gws: &[&super::Gateway],
    n: usize,
    parallel: usize,
    path: &str,
    headers: &[(&str, &str)],
) -> Vec<(u16, Option<String>)> {
    let c = super::client();
    let sem = std::sync::Arc::new(tokio::sync::Semaphore::new(parallel));
    let mut tasks = Vec::new();
    for i in 0..n {
        let mut req = c.get(gws[i % gws.len()].url(path));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let permit = sem.clone().acquire_owned().await.unwrap();
        tasks.push(tokio::spawn(async move {
            let answer = req.send().await.map(|r| {
                let state = r
                    .headers()
                    .get("ratelimit")
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string);
                (r.status().as_u16(), state)
            });
            drop(permit);
            answer.unwrap_or((0, None))
        }));
    }
    let mut answers = Vec::with_capacity(n);
    for t in tasks {
        answers.push(t.await.unwrap());
    }
    answers
}

/// A TCP server on a free loopback port that answers whatever it is sent with bytes that are
/// not RESP, and counts the connections it accepts: a "Redis" node that answers garbage (a
/// wrong service on the port, a proxy gone mad). Stopped, with every connection it holds, when
/// it drops.
pub struct JunkServer {
    addr: SocketAddr,
    accepted: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl JunkServer {
    /// Starts it on a free loopback port.
    pub fn start() -> JunkServer {
        JunkServer::start_on(0)
    }

    /// Starts it on `port` of 127.0.0.1 (0: a free one), e.g. where a Redis node was.
    pub fn start_on(port: u16) -> JunkServer {
        use std::io::{Read, Write};
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
        use std::sync::Arc;
        let listener = std::net::TcpListener::bind(("127.0.0.1", port)).expect("bind junk server");
        listener.set_nonblocking(true).expect("non-blocking");
        let addr = listener.local_addr().expect("junk server address");
        let accepted = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (count, done) = (accepted.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut peers = Vec::new();
            while !done.load(Ordering::Acquire) {
                match listener.accept() {
                    Ok((mut stream, _)) => {
                        count.fetch_add(1, Ordering::AcqRel);
                        let done = done.clone();
                        peers.push(std::thread::spawn(move || {
                            let _ = stream.set_read_timeout(Some(Duration::from_millis(20)));
                            let mut buf = [0u8; 4096];
                            while !done.load(Ordering::Acquire) {
                                match stream.read(&mut buf) {
                                    Ok(0) => return,
                                    Ok(_) => {
                                        if stream.write_all(b"%%garbage, not RESP\r\n").is_err() {
                                            return;
                                        }
                                    }
                                    Err(e)
                                        if matches!(
                                            e.kind(),
                                            std::io::ErrorKind::WouldBlock
                                                | std::io::ErrorKind::TimedOut
                                        ) => {}
                                    Err(_) => return,
                                }
                            }
                        }));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(2)),
                }
            }
            for peer in peers {
                let _ = peer.join();
            }
        });
        JunkServer {
            addr,
            accepted,
            stop,
            thread: Some(thread),
        }
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.accepted.load(std::sync::atomic::Ordering::Acquire)
    }
}

impl Drop for JunkServer {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Release);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
