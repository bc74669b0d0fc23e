//! `bare-proxy`: the smallest Pingora proxy, a system of its own in the load benchmark
//! (benches/load/run.py, docs/benchmarks.md). Its `ProxyHttp` only picks the one upstream;
//! everything else is what floodgate runs with — Pingora 0.9, jemalloc as the global allocator,
//! one single-threaded runtime per thread (`work_stealing: false`), h2c on the plain listener —
//! so that floodgate without rules against this shows the cost of floodgate's own work per
//! request.
//!
//! `bare-proxy --listen 127.0.0.1:8081 --upstream 127.0.0.1:9000 --threads 1`

use std::net::SocketAddr;

use async_trait::async_trait;
use clap::Parser;
use pingora::apps::HttpServerOptions;
use pingora::prelude::{HttpPeer, ProxyHttp, Result, Session};
use pingora::server::configuration::{Opt, ServerConf};
use pingora::server::Server;
use pingora::services::listening::Service;

// The same allocator as floodgate's binary (src/main.rs), or the comparison would measure it.
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// A minimal Pingora reverse proxy to one upstream (a benchmark baseline, not a product).
#[derive(Parser, Debug)]
#[command(name = "bare-proxy")]
struct Cli {
    /// Address to accept plain HTTP on.
    #[arg(long)]
    listen: SocketAddr,
    /// The one upstream every request goes to (plain HTTP).
    #[arg(long)]
    upstream: SocketAddr,
    /// Worker threads (floodgate's `[server] threads`).
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Answer every request `429` with a small body in `request_filter` instead of proxying:
    /// Pingora's floor for an answer made at the edge (floodgate's 429 path).
    #[arg(long)]
    reject: bool,
}

/// Sends every request to the same peer (or answers it 429) and does nothing else.
struct Bare {
    upstream: SocketAddr,
    reject: bool,
}

#[async_trait]
impl ProxyHttp for Bare {
    type CTX = ();

    fn new_ctx(&self) {}

    async fn request_filter(&self, session: &mut Session, _ctx: &mut ()) -> Result<bool> {
        if !self.reject {
            return Ok(false);
        }
        const BODY: &[u8] = b"{\"status\":429}";
        let mut resp = pingora::http::ResponseHeader::build(429, Some(2))?;
        resp.insert_header("content-type", "application/problem+json")?;
        resp.insert_header("content-length", BODY.len().to_string())?;
        session.write_response_header(Box::new(resp), false).await?;
        session
            .write_response_body(Some(bytes::Bytes::from_static(BODY)), true)
            .await?;
        Ok(true)
    }

    async fn upstream_peer(&self, _session: &mut Session, _ctx: &mut ()) -> Result<Box<HttpPeer>> {
        Ok(Box::new(HttpPeer::new(self.upstream, false, String::new())))
    }
}

fn main() {
    let cli = Cli::parse();
    // The settings of floodgate's src/server.rs that shape the request path; the shutdown
    // waits are zero because the benchmark stops this process with SIGTERM.
    let conf = ServerConf {
        threads: cli.threads.max(1),
        work_stealing: false,
        grace_period_seconds: Some(0),
        graceful_shutdown_timeout_seconds: Some(1),
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(Opt::default(), conf);
    server.bootstrap();
    let mut http = pingora::proxy::http_proxy(
        &server.configuration,
        Bare {
            upstream: cli.upstream,
            reject: cli.reject,
        },
    );
    let mut opts = HttpServerOptions::default();
    opts.h2c = true;
    http.server_options = Some(opts);
    let mut proxy = Service::new("bare proxy".to_string(), http);
    proxy.add_tcp(&cli.listen.to_string());
    server.add_service(proxy);
    server.run_forever();
}
