//! Delivery of quota events off the request path: a bounded queue, a claim in the store per
//! event (once per counter and window across instances), batches of at most [`BATCH`] events
//! per POST, retries with exponential backoff, and counted drops.

use std::sync::{Arc, LazyLock, OnceLock};
use std::time::Duration;

use hmac::{Hmac, Mac};
use prometheus::{IntCounterVec, Opts};
use sha2::Sha256;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

use super::{Event, EventKind, Webhook};
use crate::limiter::algorithm::MAX_WINDOW;
use crate::limiter::store::SharedStore;
use crate::limiter::{Algorithm, Check, Limit};

/// Events waiting for delivery, at most (the internal `FLOODGATE_TEST_WEBHOOK_QUEUE` lowers
/// it for the queue-bound test; README, "Running the tests").
pub const QUEUE: usize = 10_000;
/// Events per POST, at most.
pub const BATCH: usize = 100;
/// Tries per batch before it is dropped (counted): about 25 s of backoff in all.
const ATTEMPTS: u32 = 10;
/// The first retry's wait; each next one doubles, up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// One delivery attempt's budget (connect, TLS, send, status line).
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(5);
/// The rule name the once-per-window markers count under in the store.
const MARKER_RULE: &str = "floodgate-webhook-marker";

/// `floodgate_webhook_events_total{result}`: `queued` (candidates noticed), `duplicate`
/// (claimed already, by this or another instance), `delivered`, `dropped_queue_full`,
/// `dropped_undeliverable`.
pub fn webhook_metrics() -> &'static IntCounterVec {
    static EVENTS: LazyLock<IntCounterVec> = LazyLock::new(|| {
        let c = IntCounterVec::new(
            Opts::new(
                "floodgate_webhook_events_total",
                "Quota webhook events by result: queued, duplicate, delivered, dropped_queue_full, dropped_undeliverable.",
            ),
            &["result"],
        )
        .expect("static metric definition");
        for r in RESULTS {
            c.with_label_values(&[r]);
        }
        crate::metrics::metrics().register(Box::new(c.clone()));
        c
    });
    &EVENTS
}

/// Every `result` label of `floodgate_webhook_events_total`.
pub const RESULTS: [&str; 5] = [
    "queued",
    "duplicate",
    "delivered",
    "dropped_queue_full",
    "dropped_undeliverable",
];

/// A queued candidate with what its delivery needs from the config in force.
struct Item {
    event: Event,
    webhooks: Arc<[Webhook]>,
    store: Arc<dyn SharedStore>,
    timeout: Duration,
}

static SENDER: OnceLock<mpsc::Sender<Item>> = OnceLock::new();

fn queue_size() -> usize {
    std::env::var("FLOODGATE_TEST_WEBHOOK_QUEUE")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or(QUEUE)
}

/// Where a request's events go: the webhooks in force, the store their markers are claimed
/// in, and the store's time budget.
pub(super) struct Target<'a> {
    pub(super) webhooks: &'a Arc<[Webhook]>,
    pub(super) store: &'a Arc<dyn SharedStore>,
    pub(super) timeout: Duration,
}

/// Queues `event` without waiting; a full queue drops it (counted).
pub(super) fn offer(to: &Target<'_>, event: Event) {
    let sender = SENDER.get_or_init(|| {
        let (tx, rx) = mpsc::channel(queue_size());
        // A thread and runtime of its own: the proxy's runtimes are Pingora's, sized and run
        // for requests, and a delivery stuck on a slow receiver must not sit among them.
        let started = std::thread::Builder::new()
            .name("floodgate-webhooks".into())
            .spawn(move || {
                match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt.block_on(run(rx)),
                    Err(e) => tracing::error!(error = %e, "webhook delivery cannot start"),
                }
            });
        if let Err(e) = started {
            tracing::error!(error = %e, "webhook delivery cannot start");
        }
        tx
    });
    let item = Item {
        event,
        webhooks: to.webhooks.clone(),
        store: to.store.clone(),
        timeout: to.timeout,
    };
    let result = match sender.try_send(item) {
        Ok(()) => "queued",
        Err(_) => "dropped_queue_full",
    };
    webhook_metrics().with_label_values(&[result]).inc();
}

async fn run(mut rx: mpsc::Receiver<Item>) {
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        while batch.len() < BATCH {
            match rx.try_recv() {
                Ok(item) => batch.push(item),
                Err(_) => break,
            }
        }
        let mut claimed = Vec::new();
        for item in batch {
            if claim(&item).await {
                claimed.push(item);
            } else {
                webhook_metrics().with_label_values(&["duplicate"]).inc();
            }
        }
        let Some(last) = claimed.last() else {
            continue;
        };
        let webhooks = last.webhooks.clone();
        let mut sent = vec![false; claimed.len()];
        for w in webhooks.iter() {
            let mut events = Vec::new();
            for (i, item) in claimed.iter().enumerate() {
                if wants(w, &item.event) {
                    events.push(&item.event);
                    sent[i] = true;
                }
            }
            if !events.is_empty() {
                send_with_retries(w, &events).await;
            }
        }
        // An event no webhook of the config in force wants any more (a reload removed it) is
        // delivered nowhere: counted as such.
        let unsent = sent.iter().filter(|s| !**s).count() as u64;
        webhook_metrics()
            .with_label_values(&["dropped_undeliverable"])
            .inc_by(unsent);
    }
}

fn wants(w: &Webhook, e: &Event) -> bool {
    w.events.contains(&e.kind)
        && (e.kind == EventKind::Rejected || e.threshold.is_some_and(|t| w.thresholds.contains(&t)))
}

/// Whether this instance is the first to see `item`'s event in its window: a counter of limit
/// 1 in the store, for the rest of the window. A store that cannot answer lets it through
/// (at least once: a rare duplicate rather than a lost event).
async fn claim(item: &Item) -> bool {
    let window = item.event.ttl.clamp(Duration::from_millis(1), MAX_WINDOW);
    let check = Check {
        rule: MARKER_RULE.into(),
        counter: item.event.marker(),
        limit: Limit::police(Algorithm::SlidingWindowLog, 1, window, 1),
        cost: 1,
    };
    let holder = fastrand::u64(..);
    match item.store.decide(&[check], holder, item.timeout).await {
        Ok(d) => d.first().is_some_and(|d| d.allowed),
        Err(e) => {
            tracing::debug!(error = %e, "webhook marker not claimed; the event is sent anyway");
            true
        }
    }
}

async fn send_with_retries(w: &Webhook, events: &[&Event]) {
    let body = serde_json::to_vec(&events.iter().map(|e| e.to_json()).collect::<Vec<_>>())
        .unwrap_or_default();
    let mut wait = FIRST_BACKOFF;
    for attempt in 1..=ATTEMPTS {
        match tokio::time::timeout(ATTEMPT_TIMEOUT, post(w, &body)).await {
            Ok(Ok(status)) if (200..300).contains(&status) => {
                webhook_metrics()
                    .with_label_values(&["delivered"])
                    .inc_by(events.len() as u64);
                return;
            }
            Ok(Ok(status)) => {
                tracing::info!(url = %w.url, status, attempt, "webhook receiver refused the events; retrying");
            }
            Ok(Err(e)) => {
                tracing::info!(url = %w.url, error = %e, attempt, "webhook delivery failed; retrying")
            }
            Err(_) => tracing::info!(url = %w.url, attempt, "webhook delivery timed out; retrying"),
        }
        if attempt < ATTEMPTS {
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(MAX_BACKOFF);
        }
    }
    tracing::warn!(url = %w.url, events = events.len(), "webhook events dropped after {ATTEMPTS} attempts");
    webhook_metrics()
        .with_label_values(&["dropped_undeliverable"])
        .inc_by(events.len() as u64);
}

/// The `X-Floodgate-Signature` value of `body` under `secret`: `sha256=<hex HMAC-SHA256>`.
pub fn signature(secret: &str, body: &[u8]) -> String {
    // HMAC takes a key of any length.
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("any key length");
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

/// One POST of `body` to `w`: the response's status.
async fn post(w: &Webhook, body: &[u8]) -> std::io::Result<u16> {
    let mut head = format!(
        "POST {} HTTP/1.1\r\nhost: {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nuser-agent: floodgate\r\nconnection: close\r\n",
        w.path,
        w.host,
        body.len()
    );
    if let Some(secret) = &w.secret {
        head.push_str(&format!(
            "x-floodgate-signature: {}\r\n",
            signature(secret, body)
        ));
    }
    head.push_str("\r\n");
    let tcp = tokio::net::TcpStream::connect((w.host.as_str(), w.port)).await?;
    if w.tls {
        let mut stream = tls_connect(&w.host, tcp).await?;
        exchange(&mut stream, head.as_bytes(), body).await
    } else {
        let mut stream = tcp;
        exchange(&mut stream, head.as_bytes(), body).await
    }
}

async fn tls_connect(
    host: &str,
    tcp: tokio::net::TcpStream,
) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    use tokio_rustls::rustls;
    static CONFIG: LazyLock<Option<Arc<rustls::ClientConfig>>> = LazyLock::new(|| {
        let roots =
            rustls::RootCertStore::from_iter(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .ok()
        .map(|b| Arc::new(b.with_root_certificates(roots).with_no_client_auth()))
    });
    let config = CONFIG
        .clone()
        .ok_or_else(|| std::io::Error::other("no TLS configuration"))?;
    let name = rustls::pki_types::ServerName::try_from(host.to_string())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    tokio_rustls::TlsConnector::from(config)
        .connect(name, tcp)
        .await
}

async fn exchange<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    stream: &mut S,
    head: &[u8],
    body: &[u8],
) -> std::io::Result<u16> {
    stream.write_all(head).await?;
    stream.write_all(body).await?;
    stream.flush().await?;
    // The status line is all that is read: "HTTP/1.1 204 ...".
    let mut buf = [0u8; 64];
    let mut got = 0;
    while got < 12 {
        let n = stream.read(&mut buf[got..]).await?;
        if n == 0 {
            break;
        }
        got += n;
    }
    let line = String::from_utf8_lossy(&buf[..got]);
    line.split(' ')
        .nth(1)
        .and_then(|s| s.get(..3))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other("no HTTP status line"))
}
