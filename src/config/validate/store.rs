//! `[store]`: the backend, its URL(s) as the store itself judges them, and its bounds.

use std::ops::Range;
use std::time::Duration;

use toml::Spanned;

use super::source::Src;
use crate::config::schema::*;
use crate::config::*;

/// The longest `store.connect_timeout`: a start that waits longer for Redis is a start that
/// looks hung.
const MAX_CONNECT_TIMEOUT: Duration = Duration::from_secs(300);

/// `[store]`: the backend and, for Redis, the URL(s) as a Redis client would take them (the
/// client is built to judge them, and dropped: it connects to nothing).
pub(super) fn store(src: &Src, raw: &RawStore) -> Result<Store, ConfigError> {
    let backend = match &raw.backend {
        Some(b) => src.one_of(b, "store.backend", Backend::NAMES)?,
        None => Backend::Memory,
    };
    let check_url = |u: &Spanned<String>| -> Result<String, ConfigError> {
        let text = u.get_ref();
        if text.starts_with("redis://") || text.starts_with("rediss://") {
            Ok(text.clone())
        } else {
            Err(src.err(u.span(), "a Redis URL starts with redis:// or rediss://"))
        }
    };
    // The store's own parser and client construction judge the URL(s), so that what passes
    // `check` is exactly what the store can use (its errors never repeat the URL).
    let usable = |urls: Vec<String>, spans: &[Range<usize>], whole: Range<usize>| {
        crate::limiter::redis::RedisClient::build(backend, &urls)
            .map(|_client| urls)
            .map_err(|e| {
                let span = e.index.and_then(|i| spans.get(i).cloned()).unwrap_or(whole);
                src.err(span, e.message)
            })
    };
    let urls = match backend {
        Backend::Memory => Vec::new(),
        Backend::Redis => match &raw.url {
            Some(u) => usable(vec![check_url(u)?], &[u.span()], u.span())?,
            None => {
                let span = raw.backend.as_ref().map_or(0..0, |b| b.span());
                return Err(src.err(span, "store.backend = \"redis\" needs store.url"));
            }
        },
        Backend::RedisCluster => match &raw.urls {
            Some(list) if !list.get_ref().is_empty() => {
                let urls = list
                    .get_ref()
                    .iter()
                    .map(check_url)
                    .collect::<Result<_, _>>()?;
                let spans: Vec<Range<usize>> = list.get_ref().iter().map(|u| u.span()).collect();
                usable(urls, &spans, list.span())?
            }
            _ => {
                let span = raw.backend.as_ref().map_or(0..0, |b| b.span());
                return Err(src.err(
                    span,
                    "store.backend = \"redis-cluster\" needs store.urls (seed nodes)",
                ));
            }
        },
    };
    let timeout = match &raw.timeout {
        Some(t) => {
            let d = src.duration(t)?;
            if d.is_zero() {
                return Err(src.err(t.span(), "store.timeout must be longer than 0ms"));
            }
            d
        }
        None => Duration::from_millis(20),
    };
    let instances = match &raw.instances {
        Some(i) => src.positive(i, "store.instances")?,
        None => 1,
    };
    let max_keys = match &raw.max_keys {
        Some(m) => src.positive(m, "store.max_keys")? as usize,
        None => 1_000_000,
    };
    let max_bans = match &raw.max_bans {
        Some(m) => src.positive(m, "store.max_bans")? as usize,
        None => crate::limiter::settings::DEFAULT_MAX_BANS,
    };
    let connect_timeout = match &raw.connect_timeout {
        Some(t) => {
            let d = src.duration(t)?;
            if d.is_zero() || d > MAX_CONNECT_TIMEOUT {
                return Err(src.err(
                    t.span(),
                    "store.connect_timeout must be longer than 0ms and at most 5m",
                ));
            }
            d
        }
        None => crate::limiter::settings::DEFAULT_CONNECT_TIMEOUT,
    };
    Ok(Store {
        backend,
        urls,
        timeout,
        key_prefix: raw
            .key_prefix
            .clone()
            .unwrap_or_else(|| "floodgate:".to_string()),
        instances,
        max_keys,
        max_bans,
        connect_timeout,
    })
}

#[cfg(test)]
mod tests {
    /// Every invalid `[store]` fixture fails with the error, line and column it names.
    #[test]
    fn every_invalid_fixture_fails_as_it_says() {
        super::super::fixtures::check_section("store");
    }
}
