//! `[[routes]]`: names, matches and the upstream each names.

use std::collections::HashSet;
use std::sync::Arc;

use super::source::Src;
use crate::config::schema::*;
use crate::config::*;

/// `[[routes]]` in file order, each naming a defined upstream.
pub(super) fn routes(
    src: &Src,
    raw: &[RawRoute],
    upstreams: &[Arc<Upstream>],
) -> Result<Vec<Route>, ConfigError> {
    if let Some(over) = raw.get(crate::config::MAX_ROUTES) {
        return Err(src.err(
            over.name.span(),
            format!(
                "{} [[routes]]: at most {}",
                raw.len(),
                crate::config::MAX_ROUTES
            ),
        ));
    }
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for r in raw {
        let name = r.name.get_ref();
        if !seen.insert(name.clone()) {
            return Err(src.err(r.name.span(), format!("route \"{name}\" is defined twice")));
        }
        let upstream = upstreams
            .iter()
            .find(|u| &*u.name == r.upstream.get_ref())
            .cloned()
            .ok_or_else(|| {
                src.err(
                    r.upstream.span(),
                    format!(
                        "route \"{name}\" names upstream \"{}\", which is not defined",
                        r.upstream.get_ref()
                    ),
                )
            })?;
        let auth = match &r.auth {
            Some(a) => src.one_of(a, "route auth", AuthMode::NAMES)?,
            None => AuthMode::Required,
        };
        let escaped_slashes = r
            .escaped_slashes
            .as_ref()
            .map(|e| {
                src.one_of(
                    e,
                    "escaped_slashes",
                    crate::wire::normalize::EscapedSlashes::NAMES,
                )
            })
            .transpose()?;
        let m = &r.matcher;
        let matcher = RequestMatch {
            path: src.path(&m.path)?,
            path_prefix: src.path(&m.path_prefix)?,
            host: src.host(&m.host)?,
            methods: m.methods.as_deref().map(|l| src.methods(l)).transpose()?,
        };
        let edges = super::route_edges::edges(src, r, &matcher)?;
        out.push(Route {
            name: name.as_str().into(),
            matcher,
            edges,
            upstream,
            auth,
            escaped_slashes,
            case_sensitive: r.case_sensitive.unwrap_or(true),
            requests: Default::default(),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    /// Every invalid `[[routes]]` fixture fails with the error, line and column it names.
    #[test]
    fn every_invalid_fixture_fails_as_it_says() {
        super::super::fixtures::check_section("routes");
    }
}
