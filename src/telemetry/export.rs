//! The export path: a bounded queue between the request path and the OTLP exporter.
//!
//! A finished sampled span is handed to [`QueueProcessor::on_end`], which only `try_send`s it
//! into a bounded channel: a full queue drops the span and counts it
//! (`floodgate_trace_spans_dropped_total`), it never waits. One thread, `floodgate-otlp`, with
//! a runtime of its own, wakes every `schedule_delay`, takes what is queued in batches of
//! `max_export_batch_size` and hands each batch to `opentelemetry_otlp::SpanExporter` (gRPC or
//! HTTP/protobuf), at most `export_timeout` per batch. A batch that fails or times out is
//! dropped and counted too: a collector that is down or slow fills the queue, never a
//! request's time. The worker polls instead of waiting on the channel, so that a request's
//! `try_send` never has a sleeping receiver to wake (a system call per span).

use std::time::{Duration, Instant};

use opentelemetry::Context;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{Span, SpanData, SpanExporter, SpanProcessor};
use opentelemetry_sdk::Resource;
use tokio::sync::mpsc::{self, error::TryRecvError, Receiver, Sender};

use super::{Protocol, Settings};
use crate::metrics::metrics;

/// How often, at most, a failing export is logged (each failure is counted).
const WARN_EVERY: Duration = Duration::from_secs(60);

/// The span processor the tracer provider calls: it queues, never exports.
#[derive(Debug)]
pub(super) struct QueueProcessor {
    tx: Sender<SpanData>,
}

impl SpanProcessor for QueueProcessor {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        if !span.span_context.is_sampled() {
            return;
        }
        if self.tx.try_send(span).is_err() {
            metrics().trace_spans_dropped.inc();
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        Ok(())
    }
}

/// Starts the export thread; its processor for the tracer provider. `None` (logged) if no
/// thread could be started: spans are then not recorded at all.
pub(super) fn start(settings: &Settings, resource: Resource) -> Option<QueueProcessor> {
    let (tx, rx) = mpsc::channel(settings.max_queue_size);
    let settings = settings.clone();
    let spawned = crate::threads::spawn(
        "floodgate-otlp",
        move || run(settings, resource, rx),
        |e| tracing::error!(error = %e, "trace export runtime could not start; spans are dropped"),
    );
    match spawned {
        Ok(_) => Some(QueueProcessor { tx }),
        Err(e) => {
            tracing::error!(error = %e, "trace export thread could not start; tracing is off");
            None
        }
    }
}

/// The OTLP exporter `settings` name (built inside the export thread's runtime: tonic's
/// channel needs one).
fn exporter(settings: &Settings) -> Result<opentelemetry_otlp::SpanExporter, String> {
    let built = match settings.protocol {
        Protocol::Grpc => opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(&settings.endpoint)
            .with_timeout(settings.export_timeout)
            .build(),
        Protocol::HttpProtobuf => opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_endpoint(&settings.endpoint)
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .with_timeout(settings.export_timeout)
            .build(),
    };
    built.map_err(|e| e.to_string())
}

/// The export thread's loop: runs until the processor (and with it the sender) is gone.
async fn run(settings: Settings, resource: Resource, mut rx: Receiver<SpanData>) {
    let mut exporter = match exporter(&settings) {
        Ok(e) => Some(e),
        Err(e) => {
            tracing::error!(error = %e, "the OTLP exporter could not be built; spans are dropped");
            None
        }
    };
    if let Some(e) = exporter.as_mut() {
        e.set_resource(&resource);
    }
    let batch_size = settings.max_export_batch_size;
    let mut last_warned: Option<Instant> = None;
    let mut batch = Vec::with_capacity(batch_size);
    loop {
        tokio::time::sleep(settings.schedule_delay).await;
        loop {
            let closed = take(&mut rx, &mut batch, batch_size);
            if batch.is_empty() {
                if closed {
                    return;
                }
                break;
            }
            let count = batch.len() as u64;
            let spans = std::mem::replace(&mut batch, Vec::with_capacity(batch_size));
            let failure = match &exporter {
                None => Some("no exporter".to_string()),
                Some(e) => {
                    match tokio::time::timeout(settings.export_timeout, e.export(spans)).await {
                        Ok(Ok(())) => None,
                        Ok(Err(err)) => Some(err.to_string()),
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
    }
}

/// Moves up to `max` queued spans into `batch`; true when the queue is closed.
fn take(rx: &mut Receiver<SpanData>, batch: &mut Vec<SpanData>, max: usize) -> bool {
    while batch.len() < max {
        match rx.try_recv() {
            Ok(span) => batch.push(span),
            Err(TryRecvError::Empty) => return false,
            Err(TryRecvError::Disconnected) => return true,
        }
    }
    false
}
