//! The export path: a bounded queue between the request path and the OTLP exporter.
//!
//! A finished sampled span is handed to [`Queue::send`], which pushes its record onto a
//! lock-free queue whose length a counter bounds: a full queue drops the span and counts it
//! (`floodgate_trace_spans_dropped_total`), it never waits. One thread, `floodgate-otlp`, with
//! a runtime of its own, wakes every `schedule_delay` (sooner when spans come fast enough to
//! fill a quarter of the queue before then: [`next_delay`], or woken by a send that finds it
//! half full), takes what is queued in batches of
//! `max_export_batch_size`, encodes each batch into one OTLP request ([`super::otlp`]) and sends
//! it on one kept-alive connection (OTLP/HTTP: a `POST` of the protobuf body; OTLP/gRPC:
//! `TraceService/Export` on one HTTP/2 channel), at most `export_timeout` per batch. A batch
//! that fails or times out is dropped and counted too: a collector that is down or slow fills
//! the queue, never a request's time. The worker polls instead of waiting on the queue, so
//! that a request's send never has a sleeping receiver to wake (a system call per span); only
//! a queue past half full wakes it. (A bounded tokio channel cost a sampled request about 850
//! instructions for its two spans: a semaphore permit per span, whose release takes a lock.)

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use crossbeam_queue::SegQueue;
use http_body_util::{BodyExt, Full, Limited};
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
    spans: Arc<Spans>,
    /// Most spans queued (`max_queue_size`).
    capacity: usize,
    /// Spans already queued from which a send wakes the export thread (half the queue).
    high_water: usize,
}

/// The queue the export thread takes from.
#[derive(Debug)]
struct Spans {
    queue: SegQueue<SpanRecord>,
    /// Spans queued or being queued: a send counts itself in before it pushes, so the queue
    /// never holds more than its capacity.
    len: AtomicUsize,
    /// Wakes the export thread early: a burst fills the queue faster than its schedule.
    wake: Notify,
    /// The [`Queue`] is gone: the export thread ends once it has taken what is left.
    closed: AtomicBool,
}

impl Queue {
    /// A queue of `capacity` spans and its taking end.
    fn new(capacity: usize) -> (Queue, Arc<Spans>) {
        let capacity = capacity.max(1);
        let spans = Arc::new(Spans {
            queue: SegQueue::new(),
            len: AtomicUsize::new(0),
            wake: Notify::new(),
            closed: AtomicBool::new(false),
        });
        let queue = Queue {
            spans: spans.clone(),
            capacity,
            high_water: capacity - capacity / 2,
        };
        (queue, spans)
    }

    /// Queues a finished span; a full queue (or a stopped exporter) drops and counts it. A
    /// queue past half full wakes the export thread (an atomic store while it drains, a
    /// wake-up only when it sleeps): otherwise a send never wakes it.
    pub fn send(&self, span: SpanRecord) {
        let s = &*self.spans;
        let queued = s.len.fetch_add(1, Ordering::Relaxed);
        if queued >= self.capacity {
            s.len.fetch_sub(1, Ordering::Relaxed);
            metrics().trace_spans_dropped.inc();
            s.wake.notify_one();
            return;
        }
        s.queue.push(span);
        if queued >= self.high_water {
            s.wake.notify_one();
        }
    }
}

impl Drop for Queue {
    fn drop(&mut self) {
        self.spans.closed.store(true, Ordering::Release);
        self.spans.wake.notify_one();
    }
}

/// Starts the export thread; the queue it reads. `None` (logged) if no thread could be
/// started: spans are then not recorded at all.
pub(super) fn start(settings: &Settings) -> Option<Queue> {
    let (queue, spans) = Queue::new(settings.max_queue_size);
    let settings = settings.clone();
    let spawned = crate::threads::spawn(
        "floodgate-otlp",
        move || run(settings, spans),
        |e| tracing::error!(error = %e, "trace export runtime could not start; spans are dropped"),
    );
    match spawned {
        Ok(_) => Some(queue),
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

/// The export thread's loop: runs until the [`Queue`] is gone and its spans taken.
async fn run(settings: Settings, spans: Arc<Spans>) {
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
            () = spans.wake.notified() => {}
        }
        let since = woke.elapsed();
        woke = Instant::now();
        let mut taken = 0usize;
        loop {
            let (closed, room) = take(&spans, &mut batch, batch_size);
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
/// whether the queue is closed and empty, and the spans' encoded size
/// ([`super::otlp::room`]'s sum).
fn take(spans: &Spans, batch: &mut Vec<SpanRecord>, max: usize) -> (bool, usize) {
    let mut bytes = 0;
    while batch.len() < max && bytes < MAX_EXPORT_BYTES {
        match spans.queue.pop() {
            Some(span) => {
                spans.len.fetch_sub(1, Ordering::Relaxed);
                bytes += super::otlp::room(&span);
                batch.push(span);
            }
            // Closed is read before emptiness: a span sent before the queue went is seen.
            None => {
                let closed = spans.closed.load(Ordering::Acquire);
                return (closed && spans.queue.is_empty(), bytes);
            }
        }
    }
    (false, bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(path: usize) -> SpanRecord {
        let mut s = SpanRecord::start(
            [1; 16],
            [0; 8],
            super::super::span::Name::Text("GET".into()),
            super::super::span::Kind::Server,
        );
        s.push("url.path", "/".repeat(path));
        s
    }

    #[test]
    fn a_batch_stops_at_its_count_or_its_bytes() {
        let (queue, spans) = Queue::new(64);
        for _ in 0..10 {
            queue.send(span(10));
        }
        let mut batch = Vec::new();
        assert!(!take(&spans, &mut batch, 4).0);
        assert_eq!(batch.len(), 4, "the count");
        // Spans of 1 MiB each: three fill an export, whatever the count allows.
        let (queue, spans) = Queue::new(64);
        for _ in 0..5 {
            queue.send(span(1 << 20));
        }
        batch.clear();
        let (closed, room) = take(&spans, &mut batch, 512);
        assert!(!closed);
        assert_eq!(batch.len(), 3, "the bytes");
        assert_eq!(
            room,
            batch.iter().map(super::super::otlp::room).sum::<usize>()
        );
        drop(queue);
        batch.clear();
        assert!(take(&spans, &mut batch, 512).0, "closed once drained");
        assert_eq!(batch.len(), 2);
    }

    #[test]
    fn a_full_queue_drops_what_comes_past_its_capacity_and_takes_again_once_drained() {
        let (queue, spans) = Queue::new(8);
        let mut batch = Vec::new();
        // The second round: taken, the queue has room again, counted right.
        for round in 0..2 {
            for _ in 0..20 {
                queue.send(span(1));
            }
            batch.clear();
            assert!(!take(&spans, &mut batch, 512).0);
            assert_eq!(
                batch.len(),
                8,
                "round {round}: never more than its capacity"
            );
            assert_eq!(spans.len.load(Ordering::Relaxed), 0);
        }
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
