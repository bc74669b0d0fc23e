//! Builds and runs the Pingora server from a validated config: the proxy service on every
//! plain (HTTP/1.1 + h2c) and TLS (HTTP/2 by ALPN) listener, and the admin service.

use std::sync::Arc;

use pingora::apps::HttpServerOptions;
use pingora::listeners::{L4BufferSettings, ListenerConfig};
use pingora::server::configuration::{Opt, ServerConf};
use pingora::server::Server;
use pingora::services::background::background_service;
use pingora::services::listening::Service;

use crate::admin::Admin;
use crate::config::Config;
use crate::connection::GuardedApp;
use crate::gateway::{Gateway, Reloader};
use crate::request::proxy::Proxy;
use crate::shutdown::{requests, Drain};

/// The socket buffers of a plain (HTTP/1.1 and h2c) client connection: none. Pingora's default
/// read buffer is 64 KiB per connection, held (and, once reused from the allocator, resident)
/// for as long as the connection is open, idle or not (about 7 KiB of the 47 KiB an idle
/// keep-alive connection measured with it). Without it a request head is read straight into
/// the head buffer Pingora parses it from and a body into the body's own buffer, with the
/// same one read per head (docs/benchmarks.md, "Memory per connection"). Its write buffer (one
/// MSS, so that a response's head and a small body leave in one write) is replaced by the
/// connection guard's own, which is held only while an exchange writes
/// (`crate::connection::write_buffer`).
const PLAIN_L4_BUFFER: L4BufferSettings = L4BufferSettings {
    read: Some(0),
    write: Some(0),
};

/// Pingora's own process flags that floodgate passes through.
#[derive(Debug, Clone, Default)]
pub struct ProcessFlags {
    /// Take over the listening sockets of a running instance (`--upgrade`).
    pub upgrade: bool,
    /// Run in the background.
    pub daemon: bool,
    /// Where the upgrade socket lives (shared by the old and new process).
    pub upgrade_sock: Option<String>,
    /// Where the pid file is written.
    pub pid_file: Option<String>,
}

/// Builds the server; `run_forever` on the result serves until a signal stops it.
pub fn build(config: Config, flags: &ProcessFlags) -> Result<Server, String> {
    let opt = Opt {
        upgrade: flags.upgrade,
        daemon: flags.daemon,
        ..Opt::default()
    };
    let mut server = Server::new_with_opt_and_conf(opt, server_conf(&config, flags));
    server.bootstrap();

    let server_conf = server.configuration.clone();
    let grace_period = config.server.grace_period;
    // Names are resolved once before serving (bounded), so the first requests find addresses;
    // after that only the upstream service resolves, in the background.
    crate::upstream::service::prime(
        config.upstreams.iter().map(|u| (&u.name, &*u.settings)),
        std::time::Duration::from_secs(2),
    );
    let gateway = Arc::new(Gateway::new(config));

    // A rate-limit service only ([rls] without listeners or routes) runs no proxy.
    if let Some(proxy) = proxy_service(&gateway, &server_conf)? {
        server.add_service(AfterWarmUp {
            inner: proxy,
            gateway: gateway.clone(),
        });
    }
    // Envoy's rate-limit service: a background service that serves on a runtime of its own
    // with `[rls] threads` threads (crate::rls_server).
    if let Some(rls) = crate::rls_server::RlsServer::bind(gateway.clone(), flags.upgrade)? {
        server.add_service(rls);
    }
    add_background_services(&mut server, &gateway);

    let admin_listen = gateway.config.load().server.admin_listen;
    let mut admin = Service::new(
        "floodgate admin".to_string(),
        Admin {
            gateway: gateway.clone(),
        },
    );
    admin.add_tcp(&admin_listen.to_string());
    server.add_service(admin);

    // SIGTERM / upgrade: exit once no request is in flight instead of Pingora's fixed wait.
    server.add_service(background_service(
        "drain",
        Drain::new(requests().clone(), grace_period),
    ));
    Ok(server)
}

/// Pingora's server settings for `config` and the process flags.
fn server_conf(config: &Config, flags: &ProcessFlags) -> ServerConf {
    let mut conf = ServerConf {
        threads: config.server.threads,
        daemon: flags.daemon,
        // Only a backstop: the drain service (crate::shutdown) exits when the requests in
        // flight are done or at grace_period to the millisecond; Pingora's whole-second wait
        // runs a second longer so that it never cuts the drain short.
        grace_period_seconds: Some(config.server.grace_period.as_secs() + 1),
        graceful_shutdown_timeout_seconds: Some(1),
        // One single-threaded runtime per thread, connections spread over them at accept (as
        // nginx workers): a task woken by another runs after the tasks already ready instead
        // of at once, so the Redis commands of requests that became ready together leave in
        // one write, and cost less CPU per request with global rules (docs/benchmarks.md).
        work_stealing: false,
        // Timeouts of a second or more (every upstream read and write timeout by default) on
        // tokio's timer wheel, which each single-threaded runtime has to itself, instead of
        // Pingora's process-wide "fast" timer, whose registration takes a lock, an ordered
        // map, a shared notifier and a boxed future per wait (docs/benchmarks.md). Shorter
        // ones stay on Pingora's. The vendored pingora-timeout recycles tokio's timers per
        // thread, so that most waits move a registered timer's expiry instead of filing a new
        // one (its PATCHES.md).
        fast_timeout_to_tokio_threshold_seconds: Some(0),
        ..ServerConf::default()
    };
    if let Some(sock) = &flags.upgrade_sock {
        conf.upgrade_sock = sock.clone();
    }
    if let Some(pid) = &flags.pid_file {
        conf.pid_file = pid.clone();
    }
    conf
}

/// The proxy service on every plain and TLS listener of the config, or `None` when it has none.
fn proxy_service(
    gateway: &Arc<Gateway>,
    server_conf: &Arc<ServerConf>,
) -> Result<Option<Service<GuardedApp<pingora::proxy::HttpProxy<Proxy>>>>, String> {
    let config = gateway.config.load();
    let (tls, listen) = (&config.server.tls, &config.server.listen);
    let mut http = pingora::proxy::http_proxy(
        server_conf,
        Proxy {
            gateway: gateway.clone(),
        },
    );
    let mut opts = HttpServerOptions::default();
    opts.h2c = true;
    // CONNECT reaches admission, which refuses it with floodgate's own 405 on every protocol
    // (Pingora's would be bare); nothing ever tunnels.
    opts.allow_connect_method_proxying = true;
    // h2 connections are idle-timed by Pingora; HTTP/1.1 ones by crate::connection.
    opts.h2_idle_timeout = Some(config.server.connections.keepalive_timeout);
    http.server_options = Some(opts);
    let mut app = GuardedApp::new(http, gateway.clone());
    if let Some(tls) = tls {
        // Plain TCP listeners of the same service: the handshake happens inside the connection
        // guard, after the connection has taken its slot (crate::connection::tls).
        let acceptor = crate::connection::tls::acceptor(
            &tls.cert.to_string_lossy(),
            &tls.key.to_string_lossy(),
        )?;
        app = app.with_tls(acceptor, tls.listen.clone());
    }
    let mut proxy = Service::new("floodgate proxy".to_string(), app);
    let mut proxy_listens = false;
    for addr in listen {
        proxy.add_listener(ListenerConfig::tcp(addr.to_string()).l4_buffer(PLAIN_L4_BUFFER));
        proxy_listens = true;
    }
    for addr in tls.iter().flat_map(|t| &t.listen) {
        // rustls reads records in small pieces: Pingora's read buffer saves read calls there.
        proxy.add_tcp(&addr.to_string());
        proxy_listens = true;
    }
    Ok(proxy_listens.then_some(proxy))
}

/// The services that run beside the listeners: the memory store's sweeper, the quota lease
/// returner, the counter reset listener, the upstreams' discovery and health checks, and the
/// config reloader.
fn add_background_services(server: &mut Server, gateway: &Arc<Gateway>) {
    server.add_service(background_service(
        "memory store sweeper",
        gateway.limiter.sweeper(),
    ));
    server.add_service(background_service(
        "quota lease returner",
        gateway.limiter.returner(),
    ));
    server.add_service(background_service(
        "counter reset listener",
        gateway.limiter.reset_listener(),
    ));
    server.add_service(background_service(
        "upstreams",
        crate::upstream::service::UpstreamService::new(gateway.clone()),
    ));
    server.add_service(background_service(
        "config reloader",
        Reloader {
            gateway: gateway.clone(),
        },
    ));
}

/// A listening service whose listeners are bound only once the gateway's store is ready (or
/// its `store.connect_timeout` has passed): see [`Gateway::warm_up`]. The warm-up runs on this
/// service's runtime, so the store's connection lives where requests are served, as it did when
/// the first request made it.
struct AfterWarmUp<S> {
    inner: S,
    gateway: Arc<Gateway>,
}

#[async_trait::async_trait]
impl<S: pingora::services::Service> pingora::services::Service for AfterWarmUp<S> {
    async fn start_service(
        &mut self,
        fds: Option<pingora::server::ListenFds>,
        shutdown: pingora::server::ShutdownWatch,
        listeners_per_fd: usize,
    ) {
        self.gateway.warm_up().await;
        self.inner
            .start_service(fds, shutdown, listeners_per_fd)
            .await;
    }

    fn name(&self) -> &str {
        self.inner.name()
    }

    fn threads(&self) -> Option<usize> {
        self.inner.threads()
    }

    fn runtime_opts_override(
        &self,
        global: &pingora::server::RuntimeOpts,
    ) -> Option<pingora::server::RuntimeOpts> {
        self.inner.runtime_opts_override(global)
    }

    fn listen_addresses(&self) -> Option<Vec<String>> {
        self.inner.listen_addresses()
    }
}
