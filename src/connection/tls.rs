//! TLS termination inside the connection guard: the handshake runs after the connection has
//! taken its slot, so stalled handshakes count against `max_connections` and
//! `max_connections_per_ip` like any other connection, and it is bounded by `header_timeout`
//! from accept instead of Pingora's fixed 60 s.
//!
//! Pingora's own TLS listeners shake hands before the application sees the connection: one IP
//! could hold thousands of descriptors with silent or half-sent ClientHellos, outside every
//! cap. floodgate therefore listens on its TLS addresses as plain TCP and completes the
//! handshake here with Pingora's rustls acceptor, so the HTTP layer above sees the same
//! `TlsStream` (ALPN `h2` selects HTTP/2, the SSL digest marks the request `https`). The TLS
//! addresses are listeners of the same service as the plain ones, so all are bound together;
//! a connection is TLS when its local address is a TLS listener's.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use pingora::listeners::tls::{Acceptor, TlsSettings};
use pingora::protocols::l4::stream::Stream as L4Stream;
use pingora::protocols::Stream;
use tokio::time::Instant;

use crate::metrics::metrics;

/// Builds the acceptor for a `[server.tls]` certificate and key (HTTP/2 offered by ALPN).
pub fn acceptor(cert: &str, key: &str) -> Result<Arc<Acceptor>, String> {
    let mut settings = TlsSettings::intermediate(cert, key)
        .map_err(|e| format!("cannot load TLS certificate or key: {e}"))?;
    settings.enable_h2();
    Ok(Arc::new(settings.build()))
}

/// Whether a connection whose local address is `local` was accepted on one of `listeners`
/// (a listener on `0.0.0.0` or `[::]` matches any address with its port).
pub fn is_listener(listeners: &[SocketAddr], local: SocketAddr) -> bool {
    listeners.iter().any(|l| {
        l.port() == local.port()
            && (l.ip().is_unspecified() || l.ip().to_canonical() == local.ip().to_canonical())
    })
}

/// Completes the server handshake on an accepted TCP stream within what is left of
/// `budget` since `accepted`; `None` (the connection is dropped, closing it) when it fails or
/// runs out of time. Timeouts are counted as `floodgate_connection_timeouts_total{kind="tls"}`.
pub async fn handshake(
    acceptor: &Acceptor,
    stream: Stream,
    accepted: Instant,
    budget: Duration,
) -> Option<Stream> {
    // The listener is a plain TCP one: its streams are Pingora's L4 streams.
    let l4 = match stream.into_any().downcast::<L4Stream>() {
        Ok(l4) => *l4,
        Err(_) => {
            tracing::error!("TLS listener produced a stream that is not TCP; closing it");
            return None;
        }
    };
    match tokio::time::timeout_at(accepted + budget, acceptor.tls_handshake(l4)).await {
        Ok(Ok(tls)) => Some(Box::new(tls)),
        Ok(Err(e)) => {
            // A client's failed handshake (wrong protocol, no shared cipher, a scanner) is
            // routine: not worth an error line per connection.
            tracing::debug!(error = %e, "TLS handshake with a client failed");
            None
        }
        Err(_) => {
            metrics()
                .connection_timeouts
                .with_label_values(&["tls"])
                .inc();
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_is_tls_when_its_local_address_is_a_tls_listener() {
        let listeners: Vec<SocketAddr> = vec![
            "0.0.0.0:8443".parse().unwrap(),
            "127.0.0.2:9443".parse().unwrap(),
        ];
        assert!(is_listener(&listeners, "10.1.2.3:8443".parse().unwrap()));
        assert!(is_listener(&listeners, "127.0.0.2:9443".parse().unwrap()));
        assert!(!is_listener(&listeners, "127.0.0.3:9443".parse().unwrap()));
        assert!(!is_listener(&listeners, "127.0.0.1:8080".parse().unwrap()));
        let v6: Vec<SocketAddr> = vec!["[::]:8443".parse().unwrap()];
        assert!(is_listener(&v6, "[::ffff:127.0.0.1]:8443".parse().unwrap()));
    }
}
