//! Pingora's guard on reusing a pooled upstream connection, kept as published in the vendored
//! pingora-core: a connection taken from the pool is handed out only when its descriptor is
//! connected to the peer it was pooled under (`Peer::matches_fd`, which asks the kernel).

use std::os::fd::AsRawFd;

use pingora::connectors::TransportConnector;
use pingora::upstreams::peer::{BasicPeer, Peer};

#[tokio::test]
async fn a_pooled_stream_whose_descriptor_names_another_connection_is_not_reused() {
    let upstream = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let elsewhere = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let peer = BasicPeer::new(&upstream.local_addr().unwrap().to_string());
    let connector = TransportConnector::new(None);

    // A sound pooled connection is reused.
    let stream = connector.new_stream(&peer).await.expect("connects");
    connector.release_stream(stream, peer.reuse_hash(), None);
    let stream = connector
        .reused_stream(&peer)
        .await
        .expect("a pooled connection to its peer is reused");

    // The same connection, its descriptor now naming a connection to another address (what a
    // descriptor closed and reused behind the pool's back would look like).
    let other = std::net::TcpStream::connect(elsewhere.local_addr().unwrap()).unwrap();
    // SAFETY: dup2 replaces the socket behind a descriptor the stream owns with a copy of
    // `other`'s; the stream still owns (and closes) its descriptor.
    let fd = unsafe { libc::dup2(other.as_raw_fd(), stream.id()) };
    assert_eq!(fd, stream.id(), "dup2");
    connector.release_stream(stream, peer.reuse_hash(), None);
    assert!(
        connector.reused_stream(&peer).await.is_none(),
        "a pooled connection whose descriptor is not connected to its peer must not be reused"
    );
}

/// The proxy's first try for an upstream connection (`Connector::reused_h1_only_session`, the
/// vendored pingora-core's): an idle pooled HTTP/1 connection is handed out without a
/// connect, once (the pool gives it up), and never to a peer whose ALPN allows HTTP/2, which
/// `get_http_session` serves as before.
#[tokio::test]
async fn a_pooled_http1_session_is_taken_first_and_only_for_an_http1_peer() {
    use pingora::connectors::http::Connector;
    use pingora::http::RequestHeader;
    use pingora::protocols::http::client::HttpSession;
    use pingora::protocols::ALPN;
    use pingora::upstreams::peer::HttpPeer;
    use std::io::{Read, Write};

    // An upstream that answers every request on a connection with a kept-alive `200 ok`.
    let upstream = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = upstream.local_addr().unwrap();
    std::thread::spawn(move || {
        for conn in upstream.incoming().take(4) {
            let Ok(mut conn) = conn else { return };
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while let Ok(n) = conn.read(&mut buf) {
                    if n == 0
                        || conn
                            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                            .is_err()
                    {
                        return;
                    }
                }
            });
        }
    });

    let connector: Connector = Connector::new(None);
    let peer = HttpPeer::new(addr, false, String::new());
    assert!(
        connector.reused_h1_only_session(&peer).await.is_none(),
        "nothing pooled yet"
    );
    let (session, reused) = connector.get_http_session(&peer).await.expect("connects");
    assert!(!reused);
    let HttpSession::H1(mut h1) = session else {
        panic!("a peer without ALPN is spoken to in HTTP/1");
    };
    let req = RequestHeader::build("GET", b"/", None).unwrap();
    h1.write_request_header(Box::new(req)).await.unwrap();
    h1.read_response().await.unwrap();
    while h1.read_body_ref().await.unwrap().is_some() {}
    connector
        .release_http_session(HttpSession::H1(h1), &peer, None)
        .await;

    // A peer that may speak HTTP/2 is not handed the pooled HTTP/1 connection by this call.
    let mut h2_peer = peer.clone();
    h2_peer.options.alpn = ALPN::H2H1;
    assert!(connector.reused_h1_only_session(&h2_peer).await.is_none());

    let pooled = connector.reused_h1_only_session(&peer).await;
    assert!(
        matches!(pooled, Some(HttpSession::H1(_))),
        "the pooled HTTP/1 connection is taken without a connect"
    );
    assert!(
        connector.reused_h1_only_session(&peer).await.is_none(),
        "taken once: the pool gave it up"
    );
}
