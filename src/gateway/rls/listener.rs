//! The rate-limit service's listener: bound when the server is built (so that a taken port or
//! an unreadable certificate fails the start with its error, as the proxy's listeners do), and
//! served, once Pingora starts its services, on a runtime of its own with `[rls] threads`
//! worker threads.
//!
//! It is a Pingora service of its own (not a background service) for the zero-downtime
//! upgrade: it declares its address and puts its socket in Pingora's table of listening
//! sockets, which Pingora hands to a process started with `--upgrade` on SIGQUIT; that process
//! takes the socket from the table instead of binding (the old one still holds the port).
//!
//! Pingora runs a background service on one thread of one runtime, and every call of the
//! service would be decided there whatever `threads` says: with one hot HTTP/2 connection
//! from Envoy that one thread was the ceiling. The runtime is work-stealing so that the
//! streams of Envoy's few connections (hyper runs each stream as a task) spread over every
//! thread, not only the connections.

use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;
use pingora::server::{ListenFds, ShutdownWatch};
use tonic::transport::{Identity, ServerTlsConfig};

use super::{Rls, MAX_STREAMS};
use crate::gateway::Gateway;
use crate::rls::bounds;
use crate::rls::limits::Tls;

/// How long a client has to complete its TLS handshake: Envoy does so at once, and a
/// connection that never does must not hold a descriptor for long.
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The listener and what it is served with.
pub struct RlsServer {
    gateway: Arc<Gateway>,
    addr: SocketAddr,
    /// Bound at build; `None` on `--upgrade` (the socket is taken over at start) and once
    /// served.
    listener: Option<std::net::TcpListener>,
    threads: usize,
    tls: Option<ServerTlsConfig>,
}

impl RlsServer {
    /// Binds `[rls] listen` of `gateway`'s config (unless `upgrade`: the running process's
    /// socket is taken over at start) and loads its `tls` certificate and key; `None` without
    /// `[rls]`.
    pub fn bind(gateway: Arc<Gateway>, upgrade: bool) -> Result<Option<RlsServer>, String> {
        let cfg = gateway.config.load_full();
        let Some(settings) = cfg.rls.as_ref() else {
            return Ok(None);
        };
        let tls = settings.tls.as_ref().map(tls_config).transpose()?;
        let addr = settings.listen;
        let listener = if upgrade { None } else { Some(bind(addr)?) };
        Ok(Some(RlsServer {
            addr,
            threads: settings.threads,
            tls,
            gateway,
            listener,
        }))
    }

    /// The listening socket: the one bound at build, else the one a running process handed
    /// over (`--upgrade`), else a new one (the old process served no `[rls]` there). It is put
    /// in Pingora's table so that the next upgrade hands it on.
    fn socket(&mut self, fds: Option<&ListenFds>) -> Result<std::net::TcpListener, String> {
        let key = self.addr.to_string();
        let listener = match self.listener.take() {
            Some(l) => l,
            None => match fds.and_then(|f| f.lock().get(&key).copied()) {
                Some(fd) => {
                    tracing::info!(listen = %key, "rate-limit service: socket taken over from the running process");
                    // SAFETY: the fd is a listening socket the old process sent (SCM_RIGHTS);
                    // this service is the only one that claims its address.
                    let l = unsafe { std::net::TcpListener::from_raw_fd(fd) };
                    l.set_nonblocking(true)
                        .map_err(|e| format!("cannot serve rls.listen {key}: {e}"))?;
                    l
                }
                None => bind(self.addr)?,
            },
        };
        if let Some(fds) = fds {
            fds.lock().add(key, listener.as_raw_fd());
        }
        Ok(listener)
    }
}

/// A non-blocking listener on `addr`.
fn bind(addr: SocketAddr) -> Result<std::net::TcpListener, String> {
    std::net::TcpListener::bind(addr)
        .and_then(|l| l.set_nonblocking(true).map(|()| l))
        .map_err(|e| format!("cannot listen on rls.listen {addr}: {e}"))
}

/// The TLS settings for `tls`, checked now: a certificate or key that does not load fails the
/// start with the listeners' message (never the key's bytes).
fn tls_config(tls: &Tls) -> Result<ServerTlsConfig, String> {
    let read = |p: &std::path::Path| {
        std::fs::read(p).map_err(|e| {
            format!(
                "cannot load TLS certificate or key: {}: {e}",
                p.to_string_lossy()
            )
        })
    };
    let identity = Identity::from_pem(read(&tls.cert)?, read(&tls.key)?);
    let config = ServerTlsConfig::new()
        .identity(identity)
        .timeout(TLS_HANDSHAKE_TIMEOUT);
    // rustls needs a process-wide crypto provider; Pingora's is ring, as the proxy's TLS uses.
    pingora::tls::install_default_crypto_provider();
    tonic::transport::Server::builder()
        .tls_config(config.clone())
        .map_err(|e| format!("cannot load TLS certificate or key: {}", source_chain(&e)))?;
    Ok(config)
}

/// An error with its causes (tonic's own message is only "transport error").
fn source_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        out.push_str(": ");
        out.push_str(&c.to_string());
        cause = c.source();
    }
    out
}

#[async_trait]
impl pingora::services::Service for RlsServer {
    async fn start_service(
        &mut self,
        fds: Option<ListenFds>,
        shutdown: ShutdownWatch,
        _listeners_per_fd: usize,
    ) {
        let listener = match self.socket(fds.as_ref()) {
            Ok(l) => l,
            Err(e) => {
                // Only on --upgrade can the socket be missing this late: nothing to serve on.
                tracing::error!(error = %e, "the rate-limit service cannot listen");
                return;
            }
        };
        // Built here, not at bind: Pingora starts services after a `-d` fork, which threads
        // started before it would not survive.
        if self.threads == 1 {
            // One thread: a current-thread runtime of its own, as Pingora's own services run
            // here (`work_stealing = false`). A work-stealing runtime of one worker costs a
            // call about twice the CPU (measured: 19.3 against 9.3 µs per local call), since
            // hyper spawns a task per HTTP/2 stream and every spawn and wake goes through the
            // runtime's shared queues.
            let (done, finished) = tokio::sync::oneshot::channel::<()>();
            let (gateway, tls) = (self.gateway.clone(), self.tls.clone());
            let spawned = std::thread::Builder::new()
                .name("floodgate-rls".into())
                .spawn(move || {
                    match tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                    {
                        Ok(rt) => rt.block_on(serve(gateway, listener, tls, 1, shutdown)),
                        Err(e) => {
                            tracing::error!(error = %e, "cannot start the rate-limit service's thread")
                        }
                    }
                    let _ = done.send(());
                });
            match spawned {
                Ok(_) => {
                    let _ = finished.await;
                }
                Err(e) => {
                    tracing::error!(error = %e, "cannot start the rate-limit service's thread")
                }
            }
            return;
        }
        let runtime = match tokio::runtime::Builder::new_multi_thread()
            .worker_threads(self.threads)
            .thread_name("floodgate-rls")
            .enable_all()
            .build()
        {
            Ok(rt) => rt,
            Err(e) => {
                tracing::error!(error = %e, "cannot start the rate-limit service's threads");
                return;
            }
        };
        let served = runtime.spawn(serve(
            self.gateway.clone(),
            listener,
            self.tls.clone(),
            self.threads,
            shutdown,
        ));
        if let Err(e) = served.await {
            tracing::error!(error = %e, "the rate-limit service stopped");
        }
        // Not dropped here: dropping a runtime from async code panics; its threads end as
        // they finish what they hold.
        runtime.shutdown_background();
    }

    fn name(&self) -> &str {
        "rate-limit service"
    }

    /// The Pingora runtime only starts the service; its calls run on its own runtime.
    fn threads(&self) -> Option<usize> {
        Some(1)
    }

    /// Its socket's key in Pingora's table: an inherited socket not declared by any service is
    /// closed at start.
    fn listen_addresses(&self) -> Option<Vec<String>> {
        Some(vec![self.addr.to_string()])
    }
}

/// Serves the service on `listener` until `shutdown` flips (SIGTERM, or the end of an
/// upgrade's handover).
async fn serve(
    gateway: Arc<Gateway>,
    listener: std::net::TcpListener,
    tls: Option<ServerTlsConfig>,
    threads: usize,
    mut shutdown: ShutdownWatch,
) {
    // Descriptors are decided on the store: serve once it is ready (or its start-up deadline
    // passed), as the proxy does.
    gateway.warm_up().await;
    let addr = listener.local_addr().ok();
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(error = %e, "cannot serve the rate-limit service");
            return;
        }
    };
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    let service = RateLimitServiceServer::new(Rls { gateway })
        .max_decoding_message_size(bounds::MAX_MESSAGE_BYTES);
    let mut server = tonic::transport::Server::builder().max_concurrent_streams(MAX_STREAMS);
    let scheme = if tls.is_some() { "TLS" } else { "cleartext" };
    if let Some(tls) = tls {
        server = match server.tls_config(tls) {
            Ok(s) => s,
            Err(e) => {
                // The same bytes were loaded at bind: this is the type's own guard.
                tracing::error!(error = %source_chain(&e), "cannot serve the rate-limit service over TLS");
                return;
            }
        };
    }
    tracing::info!(listen = ?addr, threads, scheme, "rate-limit service (envoy.service.ratelimit.v3) listening");
    let served = server
        .add_service(service)
        .serve_with_incoming_shutdown(incoming, async move {
            let _ = shutdown.changed().await;
        })
        .await;
    if let Err(e) = served {
        tracing::error!(error = %source_chain(&e), "the rate-limit service stopped");
    }
}
