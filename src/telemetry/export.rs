//! The export path: a bounded queue between the request path and the OTLP exporter.
//!
//! A finished sampled span is handed to [`Queue::send`], which only `try_send`s its record into
//! a bounded channel: a full queue drops the span and counts it
//! (`floodgate_trace_spans_dropped_total`), it never waits. One thread, `floodgate-otlp`, with
//! a runtime of its own, wakes every `schedule_delay` (sooner when spans come fast enough to
//! fill a quarter of the queue before then: [`next_delay`], or woken by a send that finds it
//! half full), takes what is queued in batches of
//! `max_export_batch_size`, encodes each batch into one OTLP request ([`super::otlp`]) and sends
//! it on one kept-alive connection (OTLP/HTTP: a `POST` of the protobuf body; OTLP/gRPC:
//! `TraceService/Export` on one HTTP/2 channel), at most `export_timeout` per batch. A batch
//! that fails or times out is dropped and counted too: a collector that is down or slow fills
//! the queue, never a request's time. The worker polls instead of waiting on the channel, so
//! that a request's `try_send` never has a sleeping receiver to wake (a system call per span);
//! only a queue past half full wakes it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use tokio::sync::mpsc::{self, error::TryRecvError, Receiver, Sender};
use tokio::sync::Notify;

use super::otlp::Encoder;
use super::span::SpanRecord;
use super::{Protocol, Settings};
use crate::metrics::metrics;

/// How often, at most, a failing export is logged (each failure is counted).
const WARN_EVERY: Duration = Duration::from_secs(60);

/// Most of a collector's answer read (and dropped): OTLP's partial-success answer is small,
/// and a hostile or broken collector must not make the export thread hold its garbage.
const MAX_ANSWER: usize = 64 * 1024;

/// The gRPC method an OTLP/gRPC export calls.
const GRPC_EXPORT: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";

/// Where the request path leaves finished spans.
#[derive(Debug)]
pub(super) struct Queue {
    tx: Sender<SpanRecord>,
    /// Wakes the export thread early: a burst fills the queue faster than its schedule.
    wake: Arc<Notify>,
    /// Room left in the queue below which a send wakes the export thread (half of it).
    low_water: usize,
}

impl Queue {
    /// Queues a finished span; a full queue (or a stopped exporter) drops and counts it. A
    /// queue past half full wakes the export thread (an atomic store while it drains, a
    /// wake-up only when it sleeps): otherwise a send never wakes it.
    pub fn send(&self, span: SpanRecord) {
        if self.tx.try_send(span).is_err() {
            metrics().trace_spans_dropped.inc();
            self.wake.notify_one();
        } else if self.tx.capacity() < self.low_water {
            self.wake.notify_one();
        }
    }
}

/// Starts the export thread; the queue it reads. `None` (logged) if no thread could be
/// started: spans are then not recorded at all.
pub(super) fn start(settings: &Settings) -> Option<Queue> {
    let capacity = settings.max_queue_size.max(1);
    let (tx, rx) = mpsc::channel(capacity);
    let wake = Arc::new(Notify::new());
    let woken = wake.clone();
    let settings = settings.clone();
    let spawned = crate::threads::spawn(
        "floodgate-otlp",
        move || run(settings, rx, woken),
        |e| tracing::error!(error = %e, "trace export runtime could not start; spans are dropped"),
    );
    match spawned {
        Ok(_) => Some(Queue {
            tx,
            wake,
            low_water: capacity / 2,
        }),
        Err(e) => {
            tracing::error!(error = %e, "trace export thread could not start; tracing is off");
            None
        }
    }
}

/// The spans' resource: `service.name`, the operator's attributes, and what produced them.
fn resource(settings: &Settings) -> Vec<(&str, &str)> {
    let mut out = vec![("service.name", settings.service_name.as_str())];
    out.extend(
        settings
            .resource_attributes
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str())),
    );
    out.push(("telemetry.sdk.language", "rust"));
    out.push(("telemetry.sdk.name", "floodgate"));
    out.push(("service.version", env!("CARGO_PKG_VERSION")));
    out
}

/// One connection to the collector, by protocol.
enum Transport {
    /// OTLP/HTTP: `POST` to the traces URL, kept alive by hyper's pool.
    Http {
        client: Box<HttpClient>,
        uri: http::Uri,
    },
    /// OTLP/gRPC: unary `Export` calls on one channel.
    Grpc(tonic::client::Grpc<tonic::transport::Channel>),
}

/// The OTLP/HTTP client: one pooled connection, TLS for `https://`.
type HttpClient = hyper_util::client::legacy::Client<
    hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
    Full<Bytes>,
>;

/// Whether the collector is reached over TLS (verified against the Mozilla roots).
fn is_https(uri: &http::Uri) -> bool {
    uri.scheme() == Some(&http::uri::Scheme::HTTPS)
}

impl Transport {
    /// The transport `settings` name (built inside the export thread's runtime: the gRPC
    /// channel needs one). Connections are made on first use.
    fn new(settings: &Settings) -> Result<Transport, String> {
        match settings.protocol {
            Protocol::HttpProtobuf => {
                let uri: http::Uri = settings.endpoint.parse().map_err(|e| format!("{e}"))?;
                let builder = hyper_rustls::HttpsConnectorBuilder::new();
                let provider = rustls::crypto::ring::default_provider();
                // The Mozilla roots are read (about 150 KiB of certificates) only for an
                // https:// collector; a plain one gets an empty store it never uses.
                let builder = match is_https(&uri) {
                    true => builder.with_provider_and_webpki_roots(provider),
                    false => rustls::ClientConfig::builder_with_provider(provider.into())
                        .with_safe_default_protocol_versions()
                        .map(|c| {
                            builder.with_tls_config(
                                c.with_root_certificates(rustls::RootCertStore::empty())
                                    .with_no_client_auth(),
                            )
                        }),
                };
                let tls = builder
                    .map_err(|e| e.to_string())?
                    .https_or_http()
                    .enable_http1()
                    .build();
                let client = hyper_util::client::legacy::Client::builder(
                    hyper_util::rt::TokioExecutor::new(),
                )
                .pool_max_idle_per_host(1)
                .build(tls);
                Ok(Transport::Http {
                    client: Box::new(client),
                    uri,
                })
            }
            Protocol::Grpc => {
                let mut endpoint =
                    tonic::transport::Endpoint::from_shared(settings.endpoint.clone())
                        .map_err(|e| e.to_string())?
                        .connect_timeout(settings.export_timeout)
                        .timeout(settings.export_timeout);
                if is_https(endpoint.uri()) {
                    endpoint = endpoint
                        .tls_config(tonic::transport::ClientTlsConfig::new().with_webpki_roots())
                        .map_err(|e| e.to_string())?;
                }
                Ok(Transport::Grpc(tonic::client::Grpc::new(
                    endpoint.connect_lazy(),
                )))
            }
        }
    }

    /// Sends one encoded export request.
    async fn send(&mut self, body: Bytes) -> Result<(), String> {
        match self {
            Transport::Http { client, uri } => {
                let req = http::Request::post(uri.clone())
                    .header(http::header::CONTENT_TYPE, "application/x-protobuf")
                    .body(Full::new(body))
                    .map_err(|e| e.to_string())?;
                let answer = client.request(req).await.map_err(|e| e.to_string())?;
                let status = answer.status();
                // Read the (small) answer so that the connection can be reused; a larger one
                // is not read and the connection goes.
                let _ = Limited::new(answer.into_body(), MAX_ANSWER).collect().await;
                if status.is_success() {
                    Ok(())
                } else {
                    Err(format!("the collector answered {status}"))
                }
            }
            Transport::Grpc(grpc) => {
                grpc.ready().await.map_err(|e| e.to_string())?;
                let path = http::uri::PathAndQuery::from_static(GRPC_EXPORT);
                grpc.unary(tonic::Request::new(body), path, raw::Codec)
                    .await
                    .map(|_| ())
                    .map_err(|s| format!("{}: {}", s.code(), s.message()))
            }
        }
    }
}

/// The export thread's loop: runs until the queue's sender is gone.
async fn run(settings: Settings, mut rx: Receiver<SpanRecord>, wake: Arc<Notify>) {
    let mut transport = match Transport::new(&settings) {
        Ok(t) => Some(t),
        Err(e) => {
            tracing::error!(error = %e, "the OTLP exporter could not be built; spans are dropped");
            None
        }
    };
    let mut encoder = Encoder::new(resource(&settings));
    let batch_size = settings.max_export_batch_size.max(1);
    let mut last_warned: Option<Instant> = None;
    let mut batch = Vec::with_capacity(batch_size);
    let mut delay = settings.schedule_delay;
    let mut woke = Instant::now();
    loop {
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = wake.notified() => {}
        }
        let since = woke.elapsed();
        woke = Instant::now();
        let mut taken = 0usize;
        loop {
            let (closed, room) = take(&mut rx, &mut batch, batch_size);
            if batch.is_empty() {
                if closed {
                    return;
                }
                break;
            }
            let count = batch.len() as u64;
            taken += batch.len();
            let body = encoder.encode(&batch, room);
            batch.clear();
            let failure = match transport.as_mut() {
                None => Some("no exporter".to_string()),
                Some(t) => {
                    match tokio::time::timeout(settings.export_timeout, t.send(body)).await {
                        Ok(Ok(())) => None,
                        Ok(Err(err)) => Some(err),
                        Err(_) => Some(format!("no answer within {:?}", settings.export_timeout)),
                    }
                }
            };
            if let Some(why) = failure {
                metrics().trace_spans_dropped.inc_by(count);
                if last_warned.is_none_or(|t| t.elapsed() >= WARN_EVERY) {
                    last_warned = Some(Instant::now());
                    tracing::warn!(spans = count, error = %why, "trace export failed; the spans are dropped (counted in floodgate_trace_spans_dropped_total)");
                }
            }
            if closed {
                return;
            }
        }
        delay = next_delay(
            taken,
            since,
            settings.max_queue_size,
            settings.schedule_delay,
        );
    }
}

/// Shortest wait between two takes: a busy exporter still sends batches, not single spans.
const MIN_DELAY: Duration = Duration::from_millis(1);

/// How long to wait before the next take, when `taken` spans came in the `since` before this
/// one: `schedule_delay`, or less when spans come fast enough to fill a quarter of the queue
/// (`capacity`) sooner, so that a steady load is exported, not dropped, while the thread
/// still never waits on the channel (a request's send never wakes it).
fn next_delay(
    taken: usize,
    since: Duration,
    capacity: usize,
    schedule_delay: Duration,
) -> Duration {
    if taken == 0 {
        return schedule_delay;
    }
    let quarter = (capacity / 4).max(1) as f64;
    let fill = since.as_secs_f64() * quarter / taken as f64;
    Duration::from_secs_f64(fill.min(schedule_delay.as_secs_f64())).max(MIN_DELAY)
}

/// Most bytes one export carries (about: spans are measured before they are encoded): the
/// default limit of a collector's OTLP/gRPC receiver is 4 MiB, and a request past it would be
/// refused whole. A `max_export_batch_size` of large spans is sent in several exports.
const MAX_EXPORT_BYTES: usize = 3 * 1024 * 1024;

/// Moves up to `max` queued spans into `batch`, fewer when they reach [`MAX_EXPORT_BYTES`];
/// whether the queue is closed, and the spans' encoded size ([`super::otlp::room`]'s sum).
fn take(rx: &mut Receiver<SpanRecord>, batch: &mut Vec<SpanRecord>, max: usize) -> (bool, usize) {
    let mut bytes = 0;
    while batch.len() < max && bytes < MAX_EXPORT_BYTES {
        match rx.try_recv() {
            Ok(span) => {
                bytes += super::otlp::room(&span);
                batch.push(span);
            }
            Err(TryRecvError::Empty) => return (false, bytes),
            Err(TryRecvError::Disconnected) => return (true, bytes),
        }
    }
    (false, bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_stops_at_its_count_or_its_bytes() {
        let (tx, mut rx) = mpsc::channel(64);
        let span = |path: usize| {
            let mut s = SpanRecord::start(
                [1; 16],
                [0; 8],
                super::super::span::Name::Text("GET".into()),
                super::super::span::Kind::Server,
            );
            s.push("url.path", "/".repeat(path));
            s
        };
        for _ in 0..10 {
            tx.try_send(span(10)).unwrap();
        }
        let mut batch = Vec::new();
        assert!(!take(&mut rx, &mut batch, 4).0);
        assert_eq!(batch.len(), 4, "the count");
        // Spans of 1 MiB each: three fill an export, whatever the count allows.
        let (tx, mut rx) = mpsc::channel(64);
        for _ in 0..5 {
            tx.try_send(span(1 << 20)).unwrap();
        }
        batch.clear();
        assert!(!take(&mut rx, &mut batch, 512).0);
        assert_eq!(batch.len(), 3, "the bytes");
        drop(tx);
        batch.clear();
        assert!(take(&mut rx, &mut batch, 512).0, "closed once drained");
        assert_eq!(batch.len(), 2);
    }

    #[test]
    fn a_busy_queue_is_taken_before_a_quarter_of_it_fills() {
        let every = Duration::from_millis(200);
        // Idle, or slow: the schedule.
        assert_eq!(next_delay(0, every, 8192, every), every);
        assert_eq!(next_delay(100, every, 8192, every), every);
        // 14,400 spans in 200 ms (72,000 a second): a quarter of 8,192 in about 28 ms.
        let busy = next_delay(14_400, every, 8192, every);
        assert!(
            busy > Duration::from_millis(27) && busy < Duration::from_millis(29),
            "{busy:?}"
        );
        // Never below the floor, never above the schedule.
        assert_eq!(next_delay(usize::MAX, every, 4, every), MIN_DELAY);
        assert_eq!(next_delay(1, Duration::from_secs(60), 8192, every), every);
    }
}

/// A gRPC codec of already-encoded messages: the request goes as the bytes it is, the
/// answer (an `ExportTraceServiceResponse`, partial success at most) is read and dropped.
mod raw {
    use bytes::{Buf as _, BufMut as _, Bytes};
    use tonic::codec::{DecodeBuf, Decoder, EncodeBuf, Encoder};
    use tonic::Status;

    /// The codec.
    #[derive(Debug, Clone, Copy, Default)]
    pub(super) struct Codec;

    /// Writes a message's bytes as they are.
    #[derive(Debug)]
    pub(super) struct Raw;

    /// Reads an answer and keeps nothing of it.
    #[derive(Debug)]
    pub(super) struct Ignore;

    impl tonic::codec::Codec for Codec {
        type Encode = Bytes;
        type Decode = ();
        type Encoder = Raw;
        type Decoder = Ignore;

        fn encoder(&mut self) -> Raw {
            Raw
        }

        fn decoder(&mut self) -> Ignore {
            Ignore
        }
    }

    impl Encoder for Raw {
        type Item = Bytes;
        type Error = Status;

        fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
            dst.put_slice(&item);
            Ok(())
        }
    }

    impl Decoder for Ignore {
        type Item = ();
        type Error = Status;

        fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<()>, Status> {
            let n = src.remaining();
            src.advance(n);
            Ok(Some(()))
        }
    }
}
