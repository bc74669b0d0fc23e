//! Turns the raw schema into a [`Config`], checking everything a request would trip over later.
//!
//! Every error carries the span of the value at fault, so `floodgate check` can say
//! `gateway.toml:42:9: route "orders" names upstream "order", which is not defined`. One module
//! per section of the file, in the order they are validated; each has its invalid fixtures
//! (`fixtures/<section>/*.toml`, each saying the error it must give) and a test that loads them.

mod auth;
mod jwt;
mod keys_file;
mod rls;
mod route_edges;
mod routes;
mod rules;
mod server;
mod source;
mod store;
mod tracing;
mod upstreams;
mod webhooks;

#[cfg(test)]
mod fixtures;

use std::path::Path;

use super::schema::RawConfig;
use super::{fingerprint_of, Config, ConfigError};
use source::Src;

/// Parses and validates `text`, the contents of `path`.
pub fn validate(path: &Path, text: &str) -> Result<Config, ConfigError> {
    let src = Src { path, text };
    let raw: RawConfig = toml::from_str(text)
        .map_err(|e| ConfigError::at(path, text, e.span(), e.message().trim_end().to_string()))?;
    let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();

    let mut warnings = Vec::new();
    let (mut server, token_text) = server::server(&src, &raw.server, &dir, &mut warnings)?;
    let store = store::store(&src, &raw.store)?;
    let (auth, keys_text) = auth::auth(&src, &raw.auth, &dir, &mut warnings)?;
    let upstreams = upstreams::upstreams(&src, &raw.upstreams, &dir, &mut warnings)?;
    let routes = routes::routes(&src, &raw.routes, &upstreams)?;
    let rules = rules::rules(&src, &raw.rules, &routes)?;
    let rls = rls::rls(&src, &raw.rls, &rules, server.threads, &dir)?;
    let webhooks = webhooks::webhooks(&src, &raw.webhooks, &own_listeners(&server, &rls))?;
    let tracing = tracing::tracing(&src, &raw.tracing)?;
    if rls.is_some() && routes.is_empty() && raw.server.listen.is_none() {
        // A rate-limit service only: no proxy listener unless one is asked for.
        server.listen.clear();
    }
    if routes.is_empty() && rls.is_none() {
        // Checked last, so that a file with other mistakes names those first. A zero-byte or truncated file parses as TOML; in force it would answer 404 to
        // everything while looking healthy.
        let what = if text.trim().is_empty() {
            "the file is empty"
        } else {
            "the file defines no [[routes]]"
        };
        return Err(ConfigError::whole_file(
            path,
            format!("{what}: a gateway needs at least one [[routes]] entry, or every request gets 404 (a truncated file?)"),
        ));
    }
    Ok(Config {
        path: path.to_path_buf(),
        server,
        store,
        auth,
        upstreams,
        route_index: crate::config::route_index(&routes),
        rule_index: crate::config::rule_index(&rules, &routes),
        rule_by_policy: crate::config::rule_by_policy(&rules),
        routes,
        rules,
        webhooks,
        rls,
        tracing,
        // The same files, in the same order, as the reloader fingerprints (`watch::files_of`): a
        // keys or token file only when one is named (an extra empty entry made every start
        // reload once).
        fingerprint: {
            let files = [Some(text), keys_text.as_deref(), token_text.as_deref()];
            let bytes: Vec<&[u8]> = files.iter().flatten().map(|t| t.as_bytes()).collect();
            fingerprint_of(&bytes)
        },
        warnings,
    })
}

/// Every listener of this process with the key that configures it: a webhook must not name
/// one (each event would be a request to floodgate itself).
fn own_listeners(
    server: &super::Server,
    rls: &Option<crate::rls::limits::Settings>,
) -> Vec<(std::net::SocketAddr, &'static str)> {
    let mut own = vec![(server.admin_listen, "server.admin_listen")];
    own.extend(server.listen.iter().map(|a| (*a, "server.listen")));
    if let Some(tls) = &server.tls {
        own.extend(tls.listen.iter().map(|a| (*a, "server.tls.listen")));
    }
    if let Some(rls) = rls {
        own.push((rls.listen, "rls.listen"));
    }
    own
}

#[cfg(test)]
mod tests {
    /// Every invalid whole-file (TOML, unknown keys, no routes) fixture fails with the error, line and column it names.
    #[test]
    fn every_invalid_fixture_fails_as_it_says() {
        super::fixtures::check_section("file");
    }

    /// Every invalid `[tracing]` fixture fails with the error, line and column it names.
    #[test]
    fn every_invalid_tracing_section_fails_as_it_says() {
        super::fixtures::check_section("tracing");
    }

    /// Every invalid `[[webhooks]]` fixture fails with the error, line and column it names.
    #[test]
    fn every_invalid_webhook_fails_as_it_says() {
        super::fixtures::check_section("webhooks");
    }
}
