//! The file being validated, and readers of the value types every section shares (durations,
//! counts, addresses, methods, paths, hosts, names from a list): each error points at the value.

use std::net::SocketAddr;
use std::ops::Range;
use std::path::Path;
use std::time::Duration;

use http::Method;
use toml::Spanned;

use crate::config::duration::parse_duration;
use crate::config::ConfigError;

/// The file being validated: every error points into it.
pub(super) struct Src<'a> {
    pub(super) path: &'a Path,
    pub(super) text: &'a str,
}

impl Src<'_> {
    /// An error at `span` of this file.
    pub(super) fn err(&self, span: Range<usize>, msg: impl Into<String>) -> ConfigError {
        ConfigError::at(self.path, self.text, Some(span), msg)
    }

    /// A duration as gateway.toml writes it (`250ms`, `1s`, ...).
    pub(super) fn duration(&self, v: &Spanned<String>) -> Result<Duration, ConfigError> {
        parse_duration(v.get_ref()).map_err(|m| self.err(v.span(), m))
    }

    /// A duration longer than 0 (`what` names it in the error), `default` when absent.
    pub(super) fn nonzero_duration_or(
        &self,
        v: &Option<Spanned<String>>,
        default: Duration,
        what: &str,
    ) -> Result<Duration, ConfigError> {
        let Some(d) = v else {
            return Ok(default);
        };
        let got = self.duration(d)?;
        if got.is_zero() {
            return Err(self.err(d.span(), format!("{what} must be longer than 0")));
        }
        Ok(got)
    }

    /// A whole number of at least 1 (`what` names it in the error).
    pub(super) fn positive(&self, v: &Spanned<i64>, what: &str) -> Result<u64, ConfigError> {
        match u64::try_from(*v.get_ref()) {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(self.err(
                v.span(),
                format!("{what} must be a whole number of at least 1"),
            )),
        }
    }

    /// An `ip:port` listen address.
    pub(super) fn socket_addr(
        &self,
        v: &Spanned<String>,
        what: &str,
    ) -> Result<SocketAddr, ConfigError> {
        v.get_ref().parse().map_err(|_| {
            self.err(
                v.span(),
                format!(
                    "{what} \"{}\" is not an address like \"0.0.0.0:8080\" or \"[::1]:8080\"",
                    v.get_ref()
                ),
            )
        })
    }

    /// HTTP methods, any case.
    pub(super) fn methods(&self, list: &[Spanned<String>]) -> Result<Vec<Method>, ConfigError> {
        list.iter()
            .map(|m| {
                let upper = m.get_ref().to_ascii_uppercase();
                Method::from_bytes(upper.as_bytes()).map_err(|_| {
                    self.err(
                        m.span(),
                        format!("\"{}\" is not an HTTP method", m.get_ref()),
                    )
                })
            })
            .collect()
    }

    /// A `match.path` / `path_prefix`: starting with `/`, normalized as request paths are.
    pub(super) fn path(&self, v: &Option<Spanned<String>>) -> Result<Option<String>, ConfigError> {
        match v {
            Some(p) if !p.get_ref().starts_with('/') => Err(self.err(
                p.span(),
                format!("path \"{}\" must start with \"/\"", p.get_ref()),
            )),
            // Compared with normalized request paths, so normalized the same way.
            Some(p) => crate::wire::normalize::path(
                p.get_ref(),
                crate::wire::normalize::EscapedSlashes::Keep,
            )
            .map(|n| Some(n.into_owned()))
            .map_err(|e| self.err(p.span(), format!("path \"{}\": {e}", p.get_ref()))),
            None => Ok(None),
        }
    }

    /// A `match.host`, normalized as request hosts are (lower case, no port, no trailing dot).
    pub(super) fn host(&self, v: &Option<Spanned<String>>) -> Result<Option<String>, ConfigError> {
        match v {
            Some(h) => crate::wire::normalize::host(h.get_ref())
                .map(|n| Some(n.into_owned()))
                .map_err(|e| self.err(h.span(), format!("host \"{}\": {e}", h.get_ref()))),
            None => Ok(None),
        }
    }

    /// One of the names of `options` (every accepted name is listed in the error).
    pub(super) fn one_of<T: Copy>(
        &self,
        v: &Spanned<String>,
        what: &str,
        options: &[(&str, T)],
    ) -> Result<T, ConfigError> {
        options
            .iter()
            .find(|(name, _)| *name == v.get_ref())
            .map(|(_, t)| *t)
            .ok_or_else(|| {
                let names: Vec<String> = options.iter().map(|(n, _)| format!("\"{n}\"")).collect();
                self.err(
                    v.span(),
                    format!(
                        "{what} \"{}\" is not one of {}",
                        v.get_ref(),
                        names.join(", ")
                    ),
                )
            })
    }
}
