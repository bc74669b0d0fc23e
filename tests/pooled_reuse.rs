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
