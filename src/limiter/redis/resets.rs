//! Resets heard from the store: every instance learns, within milliseconds, that the usage API
//! reset a counter, so that the quota lease permits it holds of the old epoch are not spent on
//! top of the new counter.
//!
//! `lua/usage.lua` publishes each reset on `<key_prefix>resets` as `<counter key> <epoch start,
//! us>`, atomically with the reset. Each instance keeps one subscriber connection (to the
//! server; in a cluster, to one seed at a time: a cluster delivers every `PUBLISH` to every
//! node), pings it every [`PING_EVERY`] so that a silently dead connection is noticed, and
//! reconnects with backoff. A reset published while an instance was not subscribed is not
//! heard: that instance's lease then ends as any lease does, within `lease_ttl`
//! (`floodgate_store_resets_listening` says whether it listens).

use std::sync::LazyLock;
use std::time::Duration;

use futures::StreamExt;
use prometheus::{IntCounter, IntGauge, Opts};

use super::conn::{Target, RECONNECT_MAX, RECONNECT_MIN};
use super::socket::CONNECT_TIMEOUT;
use super::Inner;
use crate::limiter::store::HeardReset;

/// How often the subscriber connection is pinged.
pub const PING_EVERY: Duration = Duration::from_secs(5);

/// The longest announcement read: a counter key (prefix, rule name, hash tag) and a number.
const MAX_ANNOUNCEMENT: usize = 4096;

/// The reset listener's metrics.
struct ResetMetrics {
    /// `floodgate_store_resets_heard_total`.
    heard: IntCounter,
    /// `floodgate_store_resets_listening`.
    listening: IntGauge,
}

fn reset_metrics() -> &'static ResetMetrics {
    static M: LazyLock<ResetMetrics> = LazyLock::new(|| {
        let heard = IntCounter::with_opts(Opts::new(
            "floodgate_store_resets_heard_total",
            "Counter resets announced by the shared store (made by any instance through the usage API); each drops this instance's lease permits of the old epoch.",
        ))
        .expect("static metric definition");
        let listening = IntGauge::with_opts(Opts::new(
            "floodgate_store_resets_listening",
            "1 while this instance is subscribed to the shared store's reset announcements, else 0.",
        ))
        .expect("static metric definition");
        let registry = crate::metrics::metrics();
        registry.register(Box::new(heard.clone()));
        registry.register(Box::new(listening.clone()));
        ResetMetrics { heard, listening }
    });
    &M
}

impl Inner {
    /// The channel resets are announced on.
    pub(super) fn resets_channel(&self) -> String {
        format!("{}resets", self.key_prefix)
    }

    /// Subscribes to the reset channel and calls `heard` for every announcement, forever
    /// (reconnecting with backoff, through each cluster seed in turn).
    pub(super) async fn hear_resets(&self, heard: &(dyn Fn(HeardReset) + Send + Sync)) {
        let clients: Vec<redis::Client> = match &self.target {
            Target::Single(client) => vec![(**client).clone()],
            Target::Cluster(_, seeds) => seeds.to_vec(),
            Target::Broken(_) => Vec::new(),
        };
        let m = reset_metrics();
        if clients.is_empty() {
            return std::future::pending().await;
        }
        let channel = self.resets_channel();
        let mut delay = RECONNECT_MIN;
        let mut failures = 0u64;
        for turn in 0usize.. {
            let client = &clients[turn % clients.len()];
            let outcome = listen(client, &channel, &self.key_prefix, heard, m).await;
            m.listening.set(0);
            match outcome {
                // It was listening: start the backoff over.
                Ok(()) => delay = RECONNECT_MIN,
                Err(error) => {
                    // One line at first, then one every ~30 attempts.
                    if failures.is_multiple_of(30) {
                        tracing::warn!(redis = %self.endpoint, %error, "cannot listen for counter resets; retrying (a reset made meanwhile by another instance leaves this instance's lease of that counter to end within lease_ttl)");
                    }
                    failures += 1;
                }
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(RECONNECT_MAX);
        }
    }
}

/// One subscription: Ok once it was established and then broke, Err when it could not be.
async fn listen(
    client: &redis::Client,
    channel: &str,
    prefix: &str,
    heard: &(dyn Fn(HeardReset) + Send + Sync),
    m: &ResetMetrics,
) -> Result<(), String> {
    let bounded = |what: &'static str| move |_| format!("{what} timed out");
    let pubsub = tokio::time::timeout(CONNECT_TIMEOUT, client.get_async_pubsub())
        .await
        .map_err(bounded("connecting"))?
        .map_err(|e| e.to_string())?;
    let (mut sink, mut stream) = pubsub.split();
    tokio::time::timeout(CONNECT_TIMEOUT, sink.subscribe(channel))
        .await
        .map_err(bounded("SUBSCRIBE"))?
        .map_err(|e| e.to_string())?;
    m.listening.set(1);
    let mut ping = tokio::time::interval(PING_EVERY);
    ping.tick().await;
    loop {
        tokio::select! {
            msg = stream.next() => {
                let Some(msg) = msg else { return Ok(()) };
                if let Some(reset) = parse(prefix, msg.get_payload_bytes()) {
                    m.heard.inc();
                    heard(reset);
                }
            }
            _ = ping.tick() => {
                let pong = tokio::time::timeout(CONNECT_TIMEOUT, sink.ping::<redis::Value>()).await;
                if !matches!(pong, Ok(Ok(_))) {
                    return Ok(());
                }
            }
        }
    }
}

/// Reads `<prefix><rule>:{<16 hex digits>} <us>`; anything else is ignored.
fn parse(prefix: &str, payload: &[u8]) -> Option<HeardReset> {
    if payload.len() > MAX_ANNOUNCEMENT {
        return None;
    }
    let text = std::str::from_utf8(payload).ok()?;
    let (key, at) = text.rsplit_once(' ')?;
    let at_us = at.parse().ok()?;
    let key = key.strip_prefix(prefix)?.strip_suffix('}')?;
    let (rule, hex) = key.rsplit_once(":{")?;
    if hex.len() != 16 || rule.is_empty() {
        return None;
    }
    let counter = u64::from_str_radix(hex, 16).ok()?;
    Some(HeardReset {
        rule: rule.to_string(),
        counter,
        at_us,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn announcements_are_read_and_anything_else_ignored() {
        let heard = parse("fg:", b"fg:per-key:a:{00000000000000ff} 1700000000000123");
        assert_eq!(
            heard,
            Some(HeardReset {
                rule: "per-key:a".into(),
                counter: 255,
                at_us: 1_700_000_000_000_123,
            })
        );
        for bad in [
            &b"other:per-key:{00000000000000ff} 1"[..],
            b"fg:per-key:{00000000000000ff}",
            b"fg:per-key:{ff} 1",
            b"fg::{00000000000000ff} 1",
            b"fg:per-key:{00000000000000fg} 1",
            b"fg:per-key:{00000000000000ff} -1",
            b"\xff\xfe",
        ] {
            assert_eq!(
                parse("fg:", bad),
                None,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        let long = format!("fg:{}:{{00000000000000ff}} 1", "r".repeat(MAX_ANNOUNCEMENT));
        assert_eq!(parse("fg:", long.as_bytes()), None);
    }
}
