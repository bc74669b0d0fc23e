//! `bare-proxy`: the smallest Pingora proxy, a system of its own in the load benchmark
//! (benches/load/run.py, docs/benchmarks.md). Its `ProxyHttp` only picks the one upstream;
//! everything else is what floodgate runs with — Pingora 0.9, jemalloc as the global allocator,
//! one single-threaded runtime per thread (`work_stealing: false`), tokio's timers for timeouts of
//! a second or more, h2c on the plain listener —
//! so that floodgate without rules against this shows the cost of floodgate's own work per
//! request. Two variants are floors of their own: `--reject` answers every request 429 at the
//! edge (`pingora-429`), `--contract` does only the per-request work floodgate's contract asks
//! for, forwarding headers and upstream timeouts (`pingora-contract`).
//!
//! `bare-proxy --listen 127.0.0.1:8081 --upstream 127.0.0.1:9000 --threads 1 [--reject | --contract]`

use std::net::SocketAddr;
use std::time::Duration;

use async_trait::async_trait;
use clap::Parser;
use http::HeaderValue;
use pingora::apps::HttpServerOptions;
use pingora::http::{RequestHeader, ResponseHeader};
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
    /// Do, and only do, what floodgate's contract asks of every proxied request (README, "What
    /// the upstream receives" and the `[[upstreams]]` timeout defaults): append the peer to
    /// `X-Forwarded-For`, set `X-Forwarded-Proto`, send a fresh 128-bit `X-Request-Id` upstream
    /// and back to the client, and give the upstream peer floodgate's default connect, read,
    /// write and idle timeouts. Pingora's own cost for that work: the floor under floodgate
    /// without rules.
    #[arg(long)]
    contract: bool,
}

/// Sends every request to the same peer (or answers it 429) and does nothing else.
struct Bare {
    upstream: SocketAddr,
    reject: bool,
    contract: bool,
}

/// A request id as 32 hex digits.
fn fresh_id() -> HeaderValue {
    let n = fastrand::u128(..);
    let mut hex = [0u8; 32];
    for (i, d) in hex.iter_mut().enumerate() {
        *d = b"0123456789abcdef"[((n >> (124 - 4 * i)) & 0xf) as usize];
    }
    HeaderValue::from_bytes(&hex).expect("hex digits")
}

#[async_trait]
impl ProxyHttp for Bare {
    /// The request id (`--contract`).
    type CTX = Option<HeaderValue>;

    fn new_ctx(&self) -> Option<HeaderValue> {
        None
    }

    async fn request_filter(
        &self,
        session: &mut Session,
        ctx: &mut Option<HeaderValue>,
    ) -> Result<bool> {
        if self.contract {
            *ctx = Some(fresh_id());
        }
        if !self.reject {
            return Ok(false);
        }
        const BODY: &[u8] = b"{\"status\":429}";
        let mut resp = ResponseHeader::build(429, Some(2))?;
        resp.insert_header("content-type", "application/problem+json")?;
        resp.insert_header("content-length", BODY.len().to_string())?;
        session.write_response_header(Box::new(resp), false).await?;
        session
            .write_response_body(Some(bytes::Bytes::from_static(BODY)), true)
            .await?;
        Ok(true)
    }

    async fn upstream_peer(
        &self,
        _session: &mut Session,
        _ctx: &mut Option<HeaderValue>,
    ) -> Result<Box<HttpPeer>> {
        let mut peer = HttpPeer::new(self.upstream, false, String::new());
        if self.contract {
            let o = &mut peer.options;
            o.connection_timeout = Some(Duration::from_secs(1));
            o.read_timeout = Some(Duration::from_secs(30));
            o.write_timeout = Some(Duration::from_secs(30));
            o.idle_timeout = Some(Duration::from_secs(60));
        }
        Ok(Box::new(peer))
    }

    async fn upstream_request_filter(
        &self,
        session: &mut Session,
        req: &mut RequestHeader,
        ctx: &mut Option<HeaderValue>,
    ) -> Result<()> {
        let Some(id) = ctx else {
            return Ok(());
        };
        let peer = session
            .client_addr()
            .and_then(|a| a.as_inet())
            .map(|a| a.ip().to_string())
            .unwrap_or_default();
        let chain = match req.headers.get("x-forwarded-for") {
            Some(sent) => {
                let mut v = sent.as_bytes().to_vec();
                v.extend_from_slice(b", ");
                v.extend_from_slice(peer.as_bytes());
                v
            }
            None => peer.into_bytes(),
        };
        req.insert_header("x-forwarded-for", chain)?;
        req.insert_header("x-forwarded-proto", HeaderValue::from_static("http"))?;
        req.insert_header("x-request-id", id.clone())?;
        Ok(())
    }

    async fn response_filter(
        &self,
        _session: &mut Session,
        resp: &mut ResponseHeader,
        ctx: &mut Option<HeaderValue>,
    ) -> Result<()> {
        if let Some(id) = ctx {
            resp.insert_header("x-request-id", id.clone())?;
        }
        Ok(())
    }
}

fn main() {
    let cli = Cli::parse();
    // The settings of floodgate's src/server.rs that shape the request path; the shutdown
    // waits are zero because the benchmark stops this process with SIGTERM.
    let conf = ServerConf {
        threads: cli.threads.max(1),
        work_stealing: false,
        // As floodgate (src/server.rs): tokio's timers for timeouts of a second or more.
        fast_timeout_to_tokio_threshold_seconds: Some(0),
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
            contract: cli.contract,
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
