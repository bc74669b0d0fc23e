//! The rate-limit service's listener: bound when the server is built (so that a taken port or
//! an unreadable certificate fails the start with its error, as the proxy's listeners do), and
//! served, once Pingora starts its services, on `[rls] threads` threads of its own, each a
//! current-thread runtime accepting from the same listening socket.
//!
//! It is a Pingora service of its own (not a background service) for the zero-downtime
//! upgrade: it declares its address and puts its socket in Pingora's table of listening
//! sockets, which Pingora hands to a process started with `--upgrade` on SIGQUIT; that process
//! takes the socket from the table instead of binding (the old one still holds the port).
//!
//! Pingora runs a background service on one thread of one runtime, and every call of the
//! service would be decided there whatever `threads` says. One work-stealing runtime of
//! `threads` workers spreads the streams of one connection over every thread, but each
//! HTTP/2 stream is a task, and every spawn and wake then goes through the runtime's shared
//! queues: measured, a local call cost about twice the CPU of a current-thread runtime's.
//! So each thread runs a current-thread runtime of its own (as Pingora's own services run
//! here, `work_stealing = false`) and accepts from its copy of the socket: a connection's
//! calls stay on the thread that accepted it, and Envoy's several connections spread over
//! the threads: a thread that serves more connections than another pauses before it accepts
//! again (`super::conn::Spread`), or connections that arrive together would all go to the
//! thread that woke first. The caps are one table over all of them (`super::conn::Shared`).

use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd};
use std::sync::Arc;

use async_trait::async_trait;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;
use pingora::server::{ListenFds, ShutdownWatch};
use tokio_rustls::rustls;
use tokio_rustls::TlsAcceptor;

use super::conn::{self, Shared};
use super::Rls;
use crate::connection::table::ConnectionTable;
use crate::gateway::Gateway;
use crate::rls::bounds;
use crate::rls::limits::Tls;

/// The listener and what it is served with.
pub struct RlsServer {
    gateway: Arc<Gateway>,
    addr: SocketAddr,
    /// Bound at build; `None` on `--upgrade` (the socket is taken over at start) and once
    /// served.
    listener: Option<std::net::TcpListener>,
    threads: usize,
    tls: Option<TlsAcceptor>,
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

/// The TLS acceptor for `tls` (HTTP/2 by ALPN), loaded now: a certificate or key that does
/// not load fails the start with the listeners' message (never the key's bytes).
fn tls_config(tls: &Tls) -> Result<TlsAcceptor, String> {
    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let failed = |p: &std::path::Path, e: &dyn std::fmt::Display| {
        format!(
            "cannot load TLS certificate or key: {}: {e}",
            p.to_string_lossy()
        )
    };
    let certs = CertificateDer::pem_file_iter(&tls.cert)
        .and_then(|i| i.collect::<Result<Vec<_>, _>>())
        .map_err(|e| failed(&tls.cert, &e))?;
    if certs.is_empty() {
        return Err(failed(&tls.cert, &"no certificate in the file"));
    }
    let key = PrivateKeyDer::from_pem_file(&tls.key).map_err(|e| failed(&tls.key, &e))?;
    // Pingora's provider (ring), as the proxy's TLS uses.
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .and_then(|b| b.with_no_client_auth().with_single_cert(certs, key))
        .map_err(|e| format!("cannot load TLS certificate or key: {e}"))?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
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
        let shared = shared(self.gateway.clone(), self.tls.clone());
        let threads = self.threads;
        let scheme = if self.tls.is_some() {
            "TLS"
        } else {
            "cleartext"
        };
        tracing::info!(listen = %self.addr, threads, scheme, "rate-limit service (envoy.service.ratelimit.v3) listening");
        // Every thread has started (and so has its name) before any accepts: none serves
        // until all are spawned, and none if one could not be.
        let go = Arc::new(Go::default());
        let mut finished = Vec::with_capacity(threads);
        // The socket itself (its descriptor is the one in Pingora's table, handed on at the
        // next upgrade) goes to the last thread, copies to the others.
        let mut listener = Some(listener);
        let spread = conn::Spread::new(threads);
        for i in 0..threads {
            let socket = match &listener {
                Some(l) if i + 1 < threads => l.try_clone(),
                _ => listener
                    .take()
                    .ok_or_else(|| std::io::ErrorKind::NotFound.into()),
            };
            let socket = match socket {
                Ok(s) => s,
                Err(e) => {
                    tracing::error!(error = %e, "cannot share the rate-limit service's socket");
                    break;
                }
            };
            let (done, wait) = tokio::sync::oneshot::channel::<()>();
            let (shared, shutdown, go) = (shared.clone(), shutdown.clone(), go.clone());
            let spread = spread.thread(i);
            // The runtime is built before the start signal is waited on: a thread whose runtime
            // cannot be built logs it and drops `done`, which ends its wait as a send does.
            let task = move || async move {
                if go.wait() {
                    serve(shared, socket, shutdown, spread).await;
                }
                let _ = done.send(());
            };
            let spawned = crate::threads::spawn(
                "floodgate-rls",
                task,
                |e| tracing::error!(error = %e, "cannot start a rate-limit service thread"),
            );
            match spawned {
                Ok(_) => finished.push(wait),
                Err(e) => {
                    tracing::error!(error = %e, "cannot start a rate-limit service thread");
                    break;
                }
            }
        }
        let all = finished.len() == threads;
        go.set(all);
        if !all {
            tracing::error!("the rate-limit service is not served: a thread could not start");
        }
        for wait in finished {
            let _ = wait.await;
        }
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

/// The service threads' start signal: `true` serve, `false` end (another thread could not
/// start). Waited on by each service thread before it serves, blocking (a std lock): nothing
/// else runs on that thread's runtime yet.
#[derive(Default)]
struct Go {
    state: std::sync::Mutex<Option<bool>>,
    changed: std::sync::Condvar,
}

impl Go {
    fn set(&self, serve: bool) {
        *self.state.lock().unwrap_or_else(|e| e.into_inner()) = Some(serve);
        self.changed.notify_all();
    }

    fn wait(&self) -> bool {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(serve) = *state {
                return serve;
            }
            state = self.changed.wait(state).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// What every thread of the service shares: one connection table, so that the caps hold
/// over all of them.
fn shared(gateway: Arc<Gateway>, tls: Option<TlsAcceptor>) -> Arc<Shared> {
    let serving = gateway
        .config
        .load()
        .rls
        .as_ref()
        .map(|r| r.serving.clone())
        .unwrap_or_default();
    let service = RateLimitServiceServer::new(Rls {
        gateway: gateway.clone(),
    })
    .max_decoding_message_size(bounds::MAX_MESSAGE_BYTES);
    Arc::new(Shared {
        gateway,
        service,
        tls,
        table: ConnectionTable::uncounted(),
        serving,
    })
}

/// Serves the service on this thread's copy of the listening socket until `shutdown` flips
/// (SIGTERM, or the end of an upgrade's handover).
async fn serve(
    shared: Arc<Shared>,
    listener: std::net::TcpListener,
    shutdown: ShutdownWatch,
    spread: conn::Spread,
) {
    // Descriptors are decided on the store: serve once it is ready (or its start-up deadline
    // passed), as the proxy does.
    shared.gateway.warm_up().await;
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(error = %e, "cannot serve the rate-limit service");
            return;
        }
    };
    conn::serve(shared, listener, shutdown, spread).await;
}
