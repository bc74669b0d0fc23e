//! A route's edges: its path rewrite, host rewrite, header edits, CORS and IP lists (and
//! `[server]`'s IP lists). Everything a request would trip over is refused here, at its line.

use toml::Spanned;

use super::source::Src;
use crate::config::schema::*;
use crate::config::{ConfigError, Edges};
use crate::wire::cors::{Cors, CorsText};
use crate::wire::header_edits::{HeaderEdits, Op};
use crate::wire::ip_list::{parse_network, IpRules, IpSet, MAX_NETWORKS};
use crate::wire::matching::RequestMatch;
use crate::wire::normalize::EscapedSlashes;
use crate::wire::rewrite::{self, Rewrite};

/// The edges of route `r`, whose match is `matcher`.
pub(super) fn edges(src: &Src, r: &RawRoute, matcher: &RequestMatch) -> Result<Edges, ConfigError> {
    let cors = r.cors.as_ref().map(|c| cors(src, c)).transpose()?;
    Ok(Edges {
        rewrite: rewrite(src, r, matcher)?,
        host_rewrite: r.host_rewrite.as_ref().map(|h| host(src, h)).transpose()?,
        request_headers: header_edits(src, &r.request_headers, false)?,
        response_headers: header_edits(src, &r.response_headers, cors.is_some())?,
        cors: cors.map(Box::new),
        ips: ip_rules(src, &r.allow_ips, &r.deny_ips)?,
    })
}

/// `strip_prefix`, `prefix_rewrite` or `regex_rewrite` (one at most).
fn rewrite(
    src: &Src,
    r: &RawRoute,
    matcher: &RequestMatch,
) -> Result<Option<Rewrite>, ConfigError> {
    let strip = r.strip_prefix.as_ref().filter(|s| *s.get_ref());
    let given = [
        strip.map(|s| s.span()),
        r.prefix_rewrite.as_ref().map(|p| p.span()),
        r.regex_rewrite.as_ref().map(|x| x.span()),
    ];
    let mut spans = given.iter().flatten();
    if let (Some(_), Some(second)) = (spans.next(), spans.next()) {
        return Err(src.err(
            second.clone(),
            "a route takes one of strip_prefix, prefix_rewrite and regex_rewrite",
        ));
    }
    // The text the route matched, which strip_prefix and prefix_rewrite replace.
    let matched = |span: std::ops::Range<usize>| -> Result<Box<str>, ConfigError> {
        match (&matcher.path_prefix, &matcher.path) {
            (Some(p), _) => Ok(p.strip_suffix('/').unwrap_or(p).into()),
            (None, Some(p)) => Ok(p.as_str().into()),
            (None, None) => Err(src.err(
                span,
                "strip_prefix and prefix_rewrite replace the route's match.path_prefix (or \
                 match.path), and this route has neither",
            )),
        }
    };
    if let Some(s) = strip {
        return Ok(Some(Rewrite::StripPrefix(matched(s.span())?)));
    }
    if let Some(p) = &r.prefix_rewrite {
        let text = p.get_ref();
        if !text.starts_with('/') {
            return Err(src.err(
                p.span(),
                format!("prefix_rewrite \"{text}\" must start with \"/\""),
            ));
        }
        rewrite::check(text, EscapedSlashes::Reject).map_err(|e| {
            src.err(
                p.span(),
                format!(
                    "prefix_rewrite \"{text}\" is not a normalized path: {}",
                    e.reason()
                ),
            )
        })?;
        return Ok(Some(Rewrite::Prefix(
            matched(p.span())?,
            text.as_str().into(),
        )));
    }
    if let Some(x) = &r.regex_rewrite {
        let x = x.get_ref();
        let case_sensitive = r.case_sensitive.unwrap_or(true);
        let re = rewrite::compile(
            x.pattern.get_ref(),
            x.substitution.get_ref(),
            case_sensitive,
        )
        .map_err(|m| {
            let span = if m.contains("substitution") {
                x.substitution.span()
            } else {
                x.pattern.span()
            };
            src.err(span, format!("regex_rewrite: {m}"))
        })?;
        return Ok(Some(Rewrite::Regex(
            Box::new(re),
            x.substitution.get_ref().as_str().into(),
        )));
    }
    Ok(None)
}

/// `host_rewrite`: a host with an optional port.
fn host(src: &Src, h: &Spanned<String>) -> Result<Box<str>, ConfigError> {
    let text = h.get_ref();
    let ok = !text.is_empty()
        && !text.contains(['@', '/', '?', '#'])
        && text.parse::<http::uri::Authority>().is_ok()
        && http::HeaderValue::from_str(text).is_ok();
    if !ok {
        return Err(src.err(
            h.span(),
            format!("host_rewrite \"{text}\" is not a host with an optional port, like \"orders.internal:8080\""),
        ));
    }
    Ok(text.as_str().into())
}

/// `request_headers` / `response_headers`.
fn header_edits(
    src: &Src,
    raw: &Option<Spanned<RawHeaderEdits>>,
    cors: bool,
) -> Result<Option<Box<HeaderEdits>>, ConfigError> {
    let Some(raw) = raw else {
        return Ok(None);
    };
    let table = raw.get_ref();
    let mut edits = HeaderEdits::default();
    for name in table.remove.iter().flatten() {
        edits
            .push(Op::Remove, name.get_ref(), "", cors)
            .map_err(|m| src.err(name.span(), m))?;
    }
    for (op, map) in [(Op::Set, &table.set), (Op::Add, &table.add)] {
        for (name, value) in map.iter().flatten() {
            edits
                .push(op, name, value.get_ref(), cors)
                .map_err(|m| src.err(value.span(), m))?;
        }
    }
    Ok((!edits.is_empty()).then(|| Box::new(edits)))
}

/// `cors`.
fn cors(src: &Src, raw: &Spanned<RawCors>) -> Result<Cors, ConfigError> {
    let c = raw.get_ref();
    fn texts(list: &Option<Vec<Spanned<String>>>) -> Option<Vec<&str>> {
        list.as_ref()
            .map(|l| l.iter().map(|s| s.get_ref().as_str()).collect())
    }
    let max_age = c
        .max_age
        .as_ref()
        .map(|m| src.duration(m).map(|d| d.as_secs()))
        .transpose()?;
    let text = CorsText {
        allow_origins: c
            .allow_origins
            .iter()
            .map(|s| s.get_ref().as_str())
            .collect(),
        allow_methods: texts(&c.allow_methods),
        allow_headers: texts(&c.allow_headers),
        expose_headers: texts(&c.expose_headers).unwrap_or_default(),
        max_age,
        allow_credentials: c.allow_credentials,
    };
    Cors::new(&text).map_err(|e| {
        let list = match e.key {
            "allow_origins" => Some(&c.allow_origins),
            "allow_methods" => c.allow_methods.as_ref(),
            "allow_headers" => c.allow_headers.as_ref(),
            "expose_headers" => c.expose_headers.as_ref(),
            _ => None,
        };
        let span = e
            .index
            .and_then(|i| list.and_then(|l| l.get(i)))
            .map_or_else(|| raw.span(), |s| s.span());
        src.err(span, format!("cors.{}: {}", e.key, e.message))
    })
}

/// `allow_ips` and `deny_ips` (of a route or of `[server]`).
pub(super) fn ip_rules(
    src: &Src,
    allow: &Option<Spanned<Vec<Spanned<String>>>>,
    deny: &Option<Spanned<Vec<Spanned<String>>>>,
) -> Result<IpRules, ConfigError> {
    Ok(IpRules {
        allow: allow
            .as_ref()
            .map(|l| ip_set(src, l, "allow_ips"))
            .transpose()?,
        deny: deny
            .as_ref()
            .map(|l| ip_set(src, l, "deny_ips"))
            .transpose()?,
    })
}

fn ip_set(
    src: &Src,
    spanned: &Spanned<Vec<Spanned<String>>>,
    key: &str,
) -> Result<IpSet, ConfigError> {
    let list = spanned.get_ref();
    if list.is_empty() && key == "allow_ips" {
        return Err(src.err(
            spanned.span(),
            "allow_ips is empty, which would refuse every client: list the networks to let in, \
             or remove the key to let everyone in",
        ));
    }
    if list.len() > MAX_NETWORKS {
        return Err(src.err(
            list[MAX_NETWORKS].span(),
            format!("{key} lists more than {MAX_NETWORKS} networks"),
        ));
    }
    let nets = list
        .iter()
        .map(|s| parse_network(s.get_ref()).map_err(|m| src.err(s.span(), format!("{key}: {m}"))))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(IpSet::new(nets))
}

#[cfg(test)]
mod tests {
    /// Every invalid route-edge fixture fails with the error, line and column it names.
    #[test]
    fn every_invalid_fixture_fails_as_it_says() {
        super::super::fixtures::check_section("route_edges");
    }
}
