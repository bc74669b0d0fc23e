//! How a store connection's TCP socket is set up, whoever opens it (redis-rs for `rediss://`
//! and cluster nodes, floodgate's own [`super::resp::RespConn`]): the connect and handshake
//! budgets, no Nagle delay, keepalive probes and the user timeout.

use std::time::Duration;

use redis::io::tcp::{socket2, TcpSettings};

/// Budget of one connection attempt (TCP, TLS, AUTH), separate from the decision timeout.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Budget of the round trips that prove a new connection answers (`AUTH`, `SELECT`, `PING`):
/// a black-holed path accepts TCP connections and answers nothing, and an attempt stuck there
/// delays the recovery after the fault ends by as much, so it is short.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(1);

/// TCP keepalive on store connections: the first probe after this much silence...
pub const KEEPALIVE_IDLE: Duration = Duration::from_secs(5);
/// ...then one probe every...
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(1);
/// ...and the connection is dead after this many unanswered probes.
pub const KEEPALIVE_PROBES: u32 = 3;
/// `TCP_USER_TIMEOUT`: data unacknowledged this long kills the connection (the kernel fails
/// its reads and writes). So a connection whose peer vanished without a word (a dropped route,
/// a failed-over address) is found within about 8 s, with or without traffic, before a request
/// needs it.
pub const USER_TIMEOUT: Duration = Duration::from_secs(8);

/// The TCP settings of every store connection redis-rs makes (`rediss://`, Unix sockets have
/// none, cluster nodes): no Nagle delay, keepalive and the user timeout above.
pub(super) fn tcp_settings() -> TcpSettings {
    TcpSettings::default()
        .set_nodelay(true)
        .set_keepalive(keepalive())
        .set_user_timeout(USER_TIMEOUT)
}

fn keepalive() -> socket2::TcpKeepalive {
    socket2::TcpKeepalive::new()
        .with_time(KEEPALIVE_IDLE)
        .with_interval(KEEPALIVE_INTERVAL)
        .with_retries(KEEPALIVE_PROBES)
}

/// The same settings on floodgate's own connections ([`RespConn`]).
pub(super) fn configure_socket(stream: &tokio::net::TcpStream) -> std::io::Result<()> {
    let socket = socket2::SockRef::from(stream);
    socket.set_tcp_nodelay(true)?;
    socket.set_tcp_keepalive(&keepalive())?;
    socket.set_tcp_user_timeout(Some(USER_TIMEOUT))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn store_sockets_get_keepalive_and_a_user_timeout() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let stream = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        configure_socket(&stream).unwrap();
        let socket = socket2::SockRef::from(&stream);
        assert!(socket.keepalive().unwrap());
        assert_eq!(socket.tcp_keepalive_time().unwrap(), KEEPALIVE_IDLE);
        assert_eq!(socket.tcp_keepalive_interval().unwrap(), KEEPALIVE_INTERVAL);
        assert_eq!(socket.tcp_keepalive_retries().unwrap(), KEEPALIVE_PROBES);
        assert_eq!(socket.tcp_user_timeout().unwrap(), Some(USER_TIMEOUT));
        assert!(socket.tcp_nodelay().unwrap());
        // What redis-rs applies to its own connections (rediss://, cluster nodes).
        let settings = tcp_settings();
        assert!(settings.nodelay() && settings.keepalive().is_some());
        assert_eq!(settings.user_timeout(), Some(USER_TIMEOUT));
        // Within the time a dead peer is found, keepalive gives up before the user timeout.
        assert!(KEEPALIVE_IDLE + KEEPALIVE_INTERVAL * KEEPALIVE_PROBES <= USER_TIMEOUT);
    }
}
