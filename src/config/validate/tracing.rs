//! `[tracing]`: the OTLP collector, the sampling ratio, whose trace context is believed, and
//! the export queue's bounds.

use toml::Spanned;

use super::source::Src;
use crate::config::schema::RawTracing;
use crate::config::telemetry::{Protocol, Settings};
use crate::config::ConfigError;

/// Longest `service_name` and resource attribute key or value: they travel with every batch.
const MAX_TEXT: usize = 255;

/// Most `resource_attributes`.
const MAX_ATTRIBUTES: usize = 64;

/// `[tracing]`, or `None` when the file has none.
pub(super) fn tracing(
    src: &Src,
    raw: &Option<Spanned<RawTracing>>,
) -> Result<Option<Settings>, ConfigError> {
    let Some(raw) = raw else {
        return Ok(None);
    };
    let raw = raw.get_ref();
    let endpoint = match &raw.otlp_endpoint {
        Some(e) => endpoint(src, e)?,
        None => Settings::DEFAULT_ENDPOINT.to_string(),
    };
    // OTLP/HTTP's traces path names the protocol; anything else is a gRPC collector.
    let by_path = if endpoint.trim_end_matches('/').ends_with("/v1/traces") {
        Protocol::HttpProtobuf
    } else {
        Protocol::Grpc
    };
    let protocol = match &raw.protocol {
        Some(p) => src.one_of(
            p,
            "tracing.protocol",
            &[
                ("grpc", Protocol::Grpc),
                ("http/protobuf", Protocol::HttpProtobuf),
            ],
        )?,
        None => by_path,
    };
    let service_name = match &raw.service_name {
        Some(n) => text(src, n, "tracing.service_name")?,
        None => Settings::DEFAULT_SERVICE_NAME.to_string(),
    };
    let sample_ratio =
        match &raw.sample_ratio {
            Some(r) if (0.0..=1.0).contains(r.get_ref()) => *r.get_ref(),
            Some(r) => return Err(src.err(
                r.span(),
                "tracing.sample_ratio must be between 0 and 1 (0.01: one new trace in a hundred)",
            )),
            None => Settings::DEFAULT_SAMPLE_RATIO,
        };
    let mut resource_attributes = Vec::new();
    if let Some(attrs) = &raw.resource_attributes {
        if attrs.get_ref().len() > MAX_ATTRIBUTES {
            return Err(src.err(
                attrs.span(),
                format!("tracing.resource_attributes has more than {MAX_ATTRIBUTES} entries"),
            ));
        }
        for (k, v) in attrs.get_ref() {
            if k == "service.name" {
                return Err(src.err(
                    v.span(),
                    "tracing.resource_attributes must not set service.name; use tracing.service_name",
                ));
            }
            if k.is_empty() || k.len() > MAX_TEXT {
                return Err(src.err(
                    v.span(),
                    format!("tracing.resource_attributes keys must be 1 to {MAX_TEXT} bytes"),
                ));
            }
            let v = text(src, v, "a tracing.resource_attributes value")?;
            resource_attributes.push((k.clone(), v));
        }
    }
    let export_timeout = src.nonzero_duration_or(
        &raw.export_timeout,
        Settings::DEFAULT_EXPORT_TIMEOUT,
        "tracing.export_timeout",
    )?;
    let schedule_delay = src.nonzero_duration_or(
        &raw.schedule_delay,
        Settings::DEFAULT_SCHEDULE_DELAY,
        "tracing.schedule_delay",
    )?;
    let max_queue_size = match &raw.max_queue_size {
        Some(n) => {
            let got = src.positive(n, "tracing.max_queue_size")?;
            if got > Settings::MAX_QUEUE_SIZE as u64 {
                return Err(src.err(
                    n.span(),
                    format!(
                        "tracing.max_queue_size must be at most {}",
                        Settings::MAX_QUEUE_SIZE
                    ),
                ));
            }
            got as usize
        }
        None => Settings::DEFAULT_MAX_QUEUE_SIZE,
    };
    let max_export_batch_size = match &raw.max_export_batch_size {
        Some(n) => {
            let got = src.positive(n, "tracing.max_export_batch_size")?;
            if got > max_queue_size as u64 {
                return Err(src.err(
                    n.span(),
                    format!("tracing.max_export_batch_size must be at most max_queue_size ({max_queue_size})"),
                ));
            }
            got as usize
        }
        None => Settings::DEFAULT_MAX_EXPORT_BATCH_SIZE.min(max_queue_size),
    };
    Ok(Some(Settings {
        endpoint,
        protocol,
        service_name,
        sample_ratio,
        trust_incoming: raw.trust_incoming.unwrap_or(false),
        resource_attributes,
        export_timeout,
        max_queue_size,
        max_export_batch_size,
        schedule_delay,
    }))
}

/// `otlp_endpoint`: an http(s) URL with a host and no credentials (they would be logged with
/// export errors).
fn endpoint(src: &Src, e: &Spanned<String>) -> Result<String, ConfigError> {
    let url = e.get_ref();
    let uri: http::Uri = url.parse().map_err(|_| {
        src.err(
            e.span(),
            format!("tracing.otlp_endpoint \"{url}\" is not a URL"),
        )
    })?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) {
        return Err(src.err(
            e.span(),
            "tracing.otlp_endpoint must start with http:// or https:// (gRPC or HTTP/protobuf is chosen by `protocol`)",
        ));
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(src.err(e.span(), "tracing.otlp_endpoint needs a host"));
    }
    if uri.authority().is_some_and(|a| a.as_str().contains('@')) {
        return Err(src.err(e.span(), "tracing.otlp_endpoint must not hold credentials"));
    }
    Ok(url.clone())
}

/// A non-empty text of at most [`MAX_TEXT`] bytes.
fn text(src: &Src, v: &Spanned<String>, what: &str) -> Result<String, ConfigError> {
    let s = v.get_ref();
    if s.is_empty() || s.len() > MAX_TEXT {
        return Err(src.err(v.span(), format!("{what} must be 1 to {MAX_TEXT} bytes")));
    }
    Ok(s.clone())
}
