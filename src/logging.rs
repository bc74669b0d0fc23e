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
    // Access lines reach stderr through the access log's buffer (crate::access_log).
    // Colours only for a person at a terminal: escape codes in a log file or a collector are
    // noise to read and to parse (and formatting them is a fifth of the access log's cost).
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let fmt = tracing_subscriber::fmt::layer()
        .with_ansi(ansi)
        .with_writer(crate::access_log::LogWriter);
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

/// The filter described in the module doc.
#[derive(Debug, Clone, Copy)]
pub struct QuietPingora;

impl<S> Filter<S> for QuietPingora {
    fn enabled(&self, meta: &Metadata<'_>, _cx: &Context<'_, S>) -> bool {
        !(from_pingora(meta) && *meta.level() > Level::INFO)
    }

    fn event_enabled(&self, event: &Event<'_>, _cx: &Context<'_, S>) -> bool {
        if !from_pingora(event.metadata()) {
            return true;
        }
        [HEAD_TIMEOUT_MESSAGE, POOL_MESSAGE].iter().all(|needle| {
            let mut found = MessageContains {
                needle,
                found: false,
            };
            event.record(&mut found);
            !found.found
        })
    }
}

struct MessageContains {
    needle: &'static str,
    found: bool,
}

impl Visit for MessageContains {
    fn record_debug(&mut self, field: &Field, value: &dyn Debug) {
        if field.name() == "message" && format!("{value:?}").contains(self.needle) {
            self.found = true;
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" && value.contains(self.needle) {
            self.found = true;
        }
    }
}
