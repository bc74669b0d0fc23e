//! Log output: the format, and what never reaches it.
//!
//! Two things from Pingora are held back whatever `RUST_LOG` asks for:
//! - its `debug` and `trace` lines, which print whole request and response headers (API keys,
//!   bearer tokens, the admin token);
//! - its error line for each connection closed by `header_timeout` ("Fail to proxy ... request
//!   head not received in time"): a slowloris attack would otherwise write a line per
//!   connection. Those closes are counted in `floodgate_connection_timeouts_total` instead.
//!
//! And one is demoted to debug (so, like Pingora's other debug lines, never shown): its
//! "failed to acquire reusable stream", logged at ERROR whenever a pooled upstream connection
//! turns out closed, which is routine and followed by a fresh connection.
//!
//! Pingora logs through the `log` crate, whose records `tracing-log` hands over as events of
//! target `log` with the real target in a `log.target` field: the two messages above are
//! recognized by that field (matching on the event's own target let them all through).
//!
//! Every line is then written through `crate::request::access_log::LogWriter`, which escapes C1
//! controls and bounds its length (`crate::text::log_safe`).

use std::fmt::Debug;

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Metadata};
use tracing_subscriber::layer::{Context, Filter};
use tracing_subscriber::prelude::*;

use crate::config::LogFormat;
use crate::connection::HEAD_TIMEOUT_MESSAGE;

/// Installs the global subscriber: `RUST_LOG` (default `info`), `format`, and the filter above.
pub fn init(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Access lines reach stderr through the access log's buffer (crate::request::access_log).
    // Colours only for a person at a terminal: escape codes in a log file or a collector are
    // noise to read and to parse (and formatting them is a fifth of the access log's cost).
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let fmt = tracing_subscriber::fmt::layer()
        .with_ansi(ansi)
        .with_writer(crate::request::access_log::LogWriter::new(
            format == LogFormat::Json,
        ));
    let registry = tracing_subscriber::registry().with(filter);
    let _ = match format {
        LogFormat::Json => registry
            .with(fmt.json().with_filter(QuietPingora))
            .try_init(),
        LogFormat::Text => registry.with(fmt.with_filter(QuietPingora)).try_init(),
    };
}

/// Pingora's benign pool message (see the module doc).
const POOL_MESSAGE: &str = "failed to acquire reusable stream";

fn from_pingora(meta: &Metadata<'_>) -> bool {
    meta.target().starts_with("pingora")
}

/// The target `tracing-log` gives the events it makes of `log` records.
const LOG_BRIDGE_TARGET: &str = "log";

/// The filter described in the module doc.
#[derive(Debug, Clone, Copy)]
pub struct QuietPingora;

impl<S> Filter<S> for QuietPingora {
    fn enabled(&self, meta: &Metadata<'_>, _cx: &Context<'_, S>) -> bool {
        !(from_pingora(meta) && *meta.level() > Level::INFO)
    }

    fn event_enabled(&self, event: &Event<'_>, _cx: &Context<'_, S>) -> bool {
        let meta = event.metadata();
        let bridged = meta.target() == LOG_BRIDGE_TARGET;
        if !bridged && !from_pingora(meta) {
            return true;
        }
        let mut seen = Seen::default();
        event.record(&mut seen);
        let pingora = if bridged { seen.pingora } else { true };
        !(pingora && seen.quiet)
    }
}

/// What [`QuietPingora`] reads of an event's fields.
#[derive(Default)]
struct Seen {
    /// The message holds one of the held-back messages.
    quiet: bool,
    /// `log.target` names a Pingora crate.
    pingora: bool,
}

impl Seen {
    fn message(&mut self, text: &str) {
        self.quiet |= [HEAD_TIMEOUT_MESSAGE, POOL_MESSAGE]
            .iter()
            .any(|needle| text.contains(needle));
    }
}

impl Visit for Seen {
    fn record_debug(&mut self, field: &Field, value: &dyn Debug) {
        if field.name() == "message" {
            self.message(&format!("{value:?}"));
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "message" => self.message(value),
            "log.target" => self.pingora = value.starts_with("pingora"),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// A writer into a shared buffer, for a subscriber of the test's own.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// What the filter lets through of events emitted by `emit`.
    fn logged(emit: impl FnOnce()) -> String {
        let out = Captured::default();
        let sink = out.clone();
        let fmt = tracing_subscriber::fmt::layer()
            .with_ansi(false)
            .with_writer(move || sink.clone())
            .with_filter(QuietPingora);
        let subscriber = tracing_subscriber::registry().with(fmt);
        tracing::subscriber::with_default(subscriber, emit);
        let bytes = out.0.lock().unwrap().clone();
        String::from_utf8(bytes).unwrap()
    }

    #[test]
    fn pingoras_benign_errors_are_held_back_as_the_log_bridge_delivers_them() {
        // The shape `tracing-log` gives Pingora's `log::error!` records.
        let logs = logged(|| {
            tracing::error!(target: "log", { "log.target" = "pingora_core::connectors" }, "failed to acquire reusable stream");
            tracing::error!(target: "log", { "log.target" = "pingora_proxy" }, "Fail to proxy: Downstream ReadError cause: request head not received in time");
            tracing::error!(target: "log", { "log.target" = "pingora_proxy" }, "Fail to proxy: Upstream ConnectRefused");
            tracing::error!(target: "log", { "log.target" = "some_other_crate" }, "failed to acquire reusable stream");
        });
        assert!(!logs.contains("not received in time"), "{logs}");
        assert!(
            logs.contains("ConnectRefused"),
            "other Pingora errors stay: {logs}"
        );
        assert_eq!(
            logs.matches("reusable stream").count(),
            1,
            "only the other crate's: {logs}"
        );
        // Events of Pingora's own targets (through `tracing`) are held back as before.
        let logs = logged(|| {
            tracing::error!(target: "pingora_core::connectors", "failed to acquire reusable stream");
            tracing::info!("floodgate's own line");
        });
        assert!(!logs.contains("reusable"), "{logs}");
        assert!(logs.contains("floodgate's own line"), "{logs}");
    }
}
