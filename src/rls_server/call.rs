//! One call on a rate-limit service connection, before tonic decodes it: its request message
//! must arrive within `[rls] request_timeout` of its headers, must be one gRPC message (a
//! unary call carrying two is refused `INTERNAL`, as grpc-go refuses it, and nothing is
//! charged), and the calls open and the request bytes they hold are bounded process-wide.
//!
//! The message is read here whole (at most [`bounds::MAX_MESSAGE_BYTES`] and its 5-byte
//! prefix) and handed to tonic as one buffer: tonic's unary decoder reads the first message
//! and ignores the rest of the body, and it waits for that message as long as the client
//! likes.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use tonic::codegen::Service as _;
use tonic::Status;

use super::activity::Activity;
use super::Rls;
use crate::metrics::metrics;
use crate::rls::bounds;
use crate::rls::metrics::rls_metrics;

/// Calls open at once over every connection: each holds a task and hyper's stream state
/// (about 10 KiB when stalled), so this bounds what stalled calls can cost in all (~100 MiB)
/// whatever the caps on connections and streams multiply to. Past it a call is refused
/// `RESOURCE_EXHAUSTED` at once.
pub const MAX_OPEN_CALLS: usize = 10_000;

/// Request bytes held at once by calls whose message has not arrived whole: a flood of
/// large, never-finished messages costs at most this. Past it such a call is refused
/// `RESOURCE_EXHAUSTED`. Envoy's messages are a few hundred bytes and arrive in one frame.
pub const MAX_PENDING_BYTES: usize = 32 << 20;

/// The length prefix of a gRPC message: a compression flag and a 4-byte big-endian length.
const PREFIX: usize = 5;

static OPEN_CALLS: AtomicUsize = AtomicUsize::new(0);
static PENDING_BYTES: AtomicUsize = AtomicUsize::new(0);

/// The hyper service of one connection: tonic's generated service behind the checks above.
#[derive(Clone)]
pub struct Calls {
    /// tonic's service (its decoder still bounds the message size).
    pub service: RateLimitServiceServer<Rls>,
    /// `[rls] request_timeout`.
    pub request_timeout: Duration,
    /// The connection's open calls, for its idle timeout.
    pub activity: Arc<Activity>,
    /// The connection's addresses, put on every call as tonic's own server does
    /// (`Request::remote_addr`).
    pub connect_info: tonic::transport::server::TcpConnectInfo,
}

/// A call's response (tonic's body; refusals are trailers-only).
type Answer = http::Response<tonic::body::Body>;

impl hyper::service::Service<http::Request<Incoming>> for Calls {
    type Response = Answer;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Answer, Infallible>> + Send>>;

    fn call(&self, req: http::Request<Incoming>) -> Self::Future {
        let open = self.activity.enter();
        let mut service = self.service.clone();
        let timeout = self.request_timeout;
        let connect_info = self.connect_info.clone();
        Box::pin(async move {
            let _open = open;
            let Some(_call) = OpenCall::take() else {
                return Ok(refuse(Status::resource_exhausted(
                    "the rate-limit service has too many calls open; retry",
                )));
            };
            let (mut parts, body) = req.into_parts();
            parts.extensions.insert(connect_info);
            let message = match tokio::time::timeout(timeout, one_message(body)).await {
                Ok(Ok(m)) => m,
                Ok(Err(status)) => return Ok(refuse(status)),
                Err(_) => {
                    metrics()
                        .connection_timeouts
                        .with_label_values(&["rls_request"])
                        .inc();
                    return Ok(Status::deadline_exceeded(
                        "the request message did not arrive within rls.request_timeout",
                    )
                    .into_http());
                }
            };
            let req = http::Request::from_parts(
                parts,
                tonic::body::Body::new(http_body_util::Full::new(message)),
            );
            match service.call(req).await {
                Ok(answer) => Ok(answer),
                Err(never) => match never {},
            }
        })
    }
}

/// A refusal before tonic, counted as an `invalid` call.
fn refuse(status: Status) -> Answer {
    rls_metrics().answered.invalid.inc();
    status.into_http()
}

/// One of [`MAX_OPEN_CALLS`].
struct OpenCall;

impl OpenCall {
    fn take() -> Option<OpenCall> {
        if OPEN_CALLS.fetch_add(1, Ordering::AcqRel) >= MAX_OPEN_CALLS {
            OPEN_CALLS.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Some(OpenCall)
    }
}

impl Drop for OpenCall {
    fn drop(&mut self) {
        OPEN_CALLS.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Bytes counted in [`PENDING_BYTES`] until dropped.
#[derive(Default)]
struct Pending(usize);

impl Pending {
    /// Counts `n` more bytes, or refuses them past [`MAX_PENDING_BYTES`].
    fn add(&mut self, n: usize) -> Result<(), Status> {
        if PENDING_BYTES.fetch_add(n, Ordering::AcqRel) + n > MAX_PENDING_BYTES {
            PENDING_BYTES.fetch_sub(n, Ordering::AcqRel);
            return Err(Status::resource_exhausted(
                "the rate-limit service holds too many unfinished request messages; retry",
            ));
        }
        self.0 += n;
        Ok(())
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        PENDING_BYTES.fetch_sub(self.0, Ordering::AcqRel);
    }
}

/// Reads the request body: one length-prefixed message (passed on as it is, trailers
/// ignored). A message declared over [`bounds::MAX_MESSAGE_BYTES`] is refused
/// `RESOURCE_EXHAUSTED` before it is read; bytes after the first message `INTERNAL`. A body
/// too short to be a message is passed on for tonic to refuse.
async fn one_message(mut body: Incoming) -> Result<Bytes, Status> {
    // The usual call is one DATA frame: kept as it came, copied only if a second arrives.
    let mut first: Option<Bytes> = None;
    let mut joined = BytesMut::new();
    let mut pending = Pending::default();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|_| Status::cancelled("the request body was cut off"))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if data.is_empty() {
            continue;
        }
        pending.add(data.len())?;
        let have = match first.take() {
            None if joined.is_empty() => {
                first = Some(data);
                first.as_deref().unwrap_or_default()
            }
            prior => {
                if let Some(p) = prior {
                    joined.extend_from_slice(&p);
                }
                joined.extend_from_slice(&data);
                &joined[..]
            }
        };
        check(have)?;
    }
    Ok(match first {
        Some(b) => b,
        None => joined.freeze(),
    })
}

/// Whether the bytes so far can still be one message of an allowed size.
fn check(have: &[u8]) -> Result<(), Status> {
    let Some(prefix) = have.get(..PREFIX) else {
        return Ok(());
    };
    let len = u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]) as usize;
    if len > bounds::MAX_MESSAGE_BYTES {
        return Err(Status::resource_exhausted(format!(
            "request message too large: {len} bytes, at most {}",
            bounds::MAX_MESSAGE_BYTES
        )));
    }
    if have.len() > PREFIX + len {
        return Err(Status::internal(
            "a unary call carried more than one request message",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn framed(len: u32, body: usize) -> Vec<u8> {
        let mut v = vec![0];
        v.extend_from_slice(&len.to_be_bytes());
        v.resize(PREFIX + body, 7);
        v
    }

    #[test]
    fn one_message_passes_a_second_or_a_large_one_does_not() {
        assert!(check(&framed(10, 10)).is_ok());
        assert!(check(&framed(10, 4)).is_ok(), "still arriving");
        assert!(check(&[0, 0]).is_ok(), "prefix still arriving");
        let two = check(&framed(10, 11)).unwrap_err();
        assert_eq!(two.code(), tonic::Code::Internal);
        let big = check(&framed(bounds::MAX_MESSAGE_BYTES as u32 + 1, 0)).unwrap_err();
        assert_eq!(big.code(), tonic::Code::ResourceExhausted);
        assert!(big.message().contains("too large"));
    }

    #[test]
    fn pending_bytes_are_bounded_and_given_back() {
        let mut a = Pending::default();
        a.add(MAX_PENDING_BYTES / 2).unwrap();
        let mut b = Pending::default();
        assert!(b.add(MAX_PENDING_BYTES).is_err());
        drop(a);
        b.add(MAX_PENDING_BYTES / 2).unwrap();
    }
}
