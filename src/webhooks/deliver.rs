//! Delivery of quota events off the request path: a bounded intake queue, a claim in the store
//! per event (once per counter and window across instances), then a bounded queue and a worker
//! per webhook, so that a receiver that never answers delays and drops only its own events.
//! Each worker sends batches of at most [`BATCH`] events per POST, retries with exponential
//! backoff, and counts what it drops.

use std::sync::{Arc, LazyLock, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hmac::{Hmac, Mac};
use prometheus::{IntCounterVec, Opts};
use sha2::Sha256;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

use super::{Event, EventKind, Webhook};
use crate::limiter::algorithm::MAX_WINDOW;
use crate::limiter::store::SharedStore;
use crate::limiter::{Algorithm, Check, Limit};

/// Candidate events waiting to be claimed, at most (the internal
/// `FLOODGATE_TEST_WEBHOOK_QUEUE` lowers it and [`WEBHOOK_QUEUE`] for the queue-bound test;
/// README, "Running the tests").
pub const QUEUE: usize = 10_000;
/// Claimed events waiting for one webhook's worker, at most.
pub const WEBHOOK_QUEUE: usize = 1_000;
/// Events per POST, at most.
pub const BATCH: usize = 100;
/// Tries per batch before it is dropped (counted): about 25 s of backoff in all.
const ATTEMPTS: u32 = 10;
/// The first retry's wait; each next one doubles, up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// One delivery attempt's budget (connect, TLS, send, status line) when the webhook sets no
/// `timeout`.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
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

/// `floodgate_webhook_dropped_total{webhook, reason}`: events one webhook lost, by its name
/// (never its URL, whose path may hold a token): `queue_full` (its own queue was full: its
/// receiver is slow or gone) or `undeliverable` (every try failed).
pub fn dropped_metrics() -> &'static IntCounterVec {
    static DROPPED: LazyLock<IntCounterVec> = LazyLock::new(|| {
        let c = IntCounterVec::new(
            Opts::new(
                "floodgate_webhook_dropped_total",
                "Quota webhook events one webhook dropped, by webhook name and reason: queue_full, undeliverable.",
            ),
            &["webhook", "reason"],
        )
        .expect("static metric definition");
        crate::metrics::metrics().register(Box::new(c.clone()));
        c
    });
    &DROPPED
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

/// `FLOODGATE_TEST_WEBHOOK_QUEUE`, when set to a positive number: both queues' size.
fn test_queue_size() -> Option<usize> {
    std::env::var("FLOODGATE_TEST_WEBHOOK_QUEUE")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|&n| n > 0)
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
        let (tx, rx) = mpsc::channel(test_queue_size().unwrap_or(QUEUE));
        // A thread and runtime of its own: the proxy's runtimes are Pingora's, sized and run
        // for requests, and a delivery stuck on a slow receiver must not sit among them.
        let started = crate::threads::spawn(
            "floodgate-webhooks",
            move || run(rx),
            |e| tracing::error!(error = %e, "webhook delivery cannot start"),
        );
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

/// Claims the queued candidates and hands each claimed event to the worker of every webhook
/// that wants it. Never waits on a receiver: only on the store (within its `timeout`).
async fn run(mut rx: mpsc::Receiver<Item>) {
    let mut workers = Workers::default();
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
        // The config in force is the newest item's.
        let webhooks = last.webhooks.clone();
        workers.follow(&webhooks);
        let mut sent = vec![false; claimed.len()];
        for w in webhooks.iter() {
            for (i, item) in claimed.iter().enumerate() {
                if wants(w, &item.event) {
                    sent[i] = true;
                    workers.hand(w, item.event.clone());
                }
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

/// The worker of each webhook in force: its config and the sending end of its queue.
#[derive(Default)]
struct Workers {
    /// The webhooks the list was last matched to.
    config: Option<Arc<[Webhook]>>,
    list: Vec<(Webhook, mpsc::Sender<Event>)>,
}

impl Workers {
    /// Keeps the workers of the webhooks still in `webhooks` (a reload that keeps a webhook
    /// as it was keeps its queue) and lets the others end once their queue is sent.
    fn follow(&mut self, webhooks: &Arc<[Webhook]>) {
        if self
            .config
            .as_ref()
            .is_some_and(|c| Arc::ptr_eq(c, webhooks))
        {
            return;
        }
        // Dropping a sender ends its worker after the events already queued.
        self.list.retain(|(w, _)| webhooks.contains(w));
        self.config = Some(webhooks.clone());
    }

    /// Queues `event` for `w`'s worker (started on first use) without waiting; its full
    /// queue drops it, counted under its name.
    fn hand(&mut self, w: &Webhook, event: Event) {
        let at = match self.list.iter().position(|(o, _)| o == w) {
            Some(at) => at,
            None => {
                let size = test_queue_size().unwrap_or(WEBHOOK_QUEUE);
                let (tx, rx) = mpsc::channel(size);
                tokio::spawn(work(w.clone(), rx));
                self.list.push((w.clone(), tx));
                self.list.len() - 1
            }
        };
        if self.list[at].1.try_send(event).is_err() {
            webhook_metrics()
                .with_label_values(&["dropped_queue_full"])
                .inc();
            dropped_metrics()
                .with_label_values(&[&w.name, "queue_full"])
                .inc();
        }
    }
}

/// One webhook's worker: sends what its queue holds, in batches, until its queue is closed
/// (a reload removed the webhook) and empty.
async fn work(w: Webhook, mut rx: mpsc::Receiver<Event>) {
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        while batch.len() < BATCH {
            match rx.try_recv() {
                Ok(e) => batch.push(e),
                Err(_) => break,
            }
        }
        send_with_retries(&w, &batch).await;
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

/// Sends `events` to `w` in one POST, retried with backoff; each attempt within `w.timeout`.
/// Logs name the webhook, never its URL (whose path or query may hold a token).
async fn send_with_retries(w: &Webhook, events: &[Event]) {
    let body = serde_json::to_vec(&events.iter().map(|e| e.to_json()).collect::<Vec<_>>())
        .unwrap_or_default();
    let mut wait = FIRST_BACKOFF;
    for attempt in 1..=ATTEMPTS {
        match tokio::time::timeout(w.timeout, post(w, &body)).await {
            Ok(Ok(status)) if (200..300).contains(&status) => {
                webhook_metrics()
                    .with_label_values(&["delivered"])
                    .inc_by(events.len() as u64);
                return;
            }
            Ok(Ok(status)) => {
                tracing::info!(webhook = %w.name, status, attempt, "webhook receiver refused the events; retrying");
            }
            Ok(Err(e)) => {
                tracing::info!(webhook = %w.name, error = %e, attempt, "webhook delivery failed; retrying")
            }
            Err(_) => {
                tracing::info!(webhook = %w.name, attempt, "webhook delivery timed out; retrying")
            }
        }
        if attempt < ATTEMPTS {
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(MAX_BACKOFF);
        }
    }
    tracing::warn!(webhook = %w.name, events = events.len(), "webhook events dropped after {ATTEMPTS} attempts");
    webhook_metrics()
        .with_label_values(&["dropped_undeliverable"])
        .inc_by(events.len() as u64);
    dropped_metrics()
        .with_label_values(&[&w.name, "undeliverable"])
        .inc_by(events.len() as u64);
}

/// The `X-Floodgate-Signature` value of `body` sent at `timestamp` (Unix seconds) under
/// `secret`: `t=<timestamp>,v1=<hex HMAC-SHA256 of "<timestamp>.<body>">`, as Stripe signs.
/// The timestamp is signed with the body, so that a receiver that checks it is recent cannot
/// be replayed a captured delivery later.
pub fn signature(secret: &str, timestamp: u64, body: &[u8]) -> String {
    // HMAC takes a key of any length.
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("any key length");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!(
        "t={timestamp},v1={}",
        hex::encode(mac.finalize().into_bytes())
    )
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
        // Signed at each attempt: a retry carries its own, fresh timestamp.
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        head.push_str(&format!(
            "x-floodgate-signature: {}\r\n",
            signature(secret, now, body)
        ));
    }
    head.push_str("\r\n");
    let tcp = tokio::net::TcpStream::connect((w.host.as_str(), w.port)).await?;
    if w.tls {
        let mut stream = crate::wire::outbound::tls_connect(&w.host, tcp).await?;
        exchange(&mut stream, head.as_bytes(), body).await
    } else {
        let mut stream = tcp;
        exchange(&mut stream, head.as_bytes(), body).await
    }
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

#[cfg(test)]
mod tests {
    /// A known answer, computed independently (Python's `hmac`, as the README's receiver
    /// check does): the timestamp and the body are signed together.
    #[test]
    fn the_signature_covers_the_timestamp_and_the_body() {
        let got = super::signature("whsec", 1_700_000_000, b"[]");
        assert_eq!(
            got,
            "t=1700000000,v1=ab976ebd8648dad322b167e6ad6d1217338a7300f243afc224592c75e7742e51"
        );
        assert_ne!(got, super::signature("whsec", 1_700_000_001, b"[]"));
        assert_ne!(got, super::signature("whsec", 1_700_000_000, b"[ ]"));
    }
}
