//! What routes and rules both match a request on: host, path, path prefix and methods. One
//! type, one function, so a route and a rule written alike match alike.
//!
//! Both sides are normalized before they meet (`crate::wire::normalize`): config values when the file
//! is loaded, the request's once per request. Comparisons here are therefore plain equality.

use http::Method;

/// The request-shape part of a route's or a rule's `match`. Every field that is set must fit.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestMatch {
    /// Exact (normalized) path.
    pub path: Option<String>,
    /// Path prefix, on segment boundaries (`/orders` matches `/orders`, `/orders/1` and
    /// `/orders.json`; not `/ordersx`).
    pub path_prefix: Option<String>,
    /// Host, normalized (lower case, no port, no trailing dot).
    pub host: Option<String>,
    /// Methods, any when `None`. `GET` covers `HEAD`.
    pub methods: Option<Vec<Method>>,
}

impl RequestMatch {
    /// Whether a request with this (normalized) host, method and path fits, paths compared
    /// exactly.
    pub fn matches(&self, host: Option<&str>, method: &Method, path: &str) -> bool {
        self.matches_case(host, method, path, true)
    }

    /// [`Self::matches`], with `path` and `path_prefix` compared ignoring ASCII case unless
    /// `case_sensitive` (a route's `case_sensitive = false`, for backends that serve `/Orders`
    /// as `/orders`: a rule on `/orders` must then count `/ORDERS` too).
    pub fn matches_case(
        &self,
        host: Option<&str>,
        method: &Method,
        path: &str,
        case_sensitive: bool,
    ) -> bool {
        if !self.path_matches(path, case_sensitive) {
            return false;
        }
        if !self.takes_method(method) {
            return false;
        }
        match &self.host {
            Some(want) => host == Some(want.as_str()),
            None => true,
        }
    }

    /// Whether `method` fits the `methods` field (true when it is not set).
    pub fn takes_method(&self, method: &Method) -> bool {
        let Some(methods) = &self.methods else {
            return true;
        };
        // Every common framework serves HEAD with the GET handler: a GET route or rule that
        // let HEAD by would let a client reach (and cost) the same handler unmatched.
        methods.contains(method) || (*method == Method::HEAD && methods.contains(&Method::GET))
    }

    /// Whether `path` fits the `path` and `path_prefix` fields (true when neither is set).
    pub fn path_matches(&self, path: &str, case_sensitive: bool) -> bool {
        if let Some(p) = self.path.as_deref() {
            let same = if case_sensitive {
                p == path
            } else {
                p.eq_ignore_ascii_case(path)
            };
            if !same {
                return false;
            }
        }
        match &self.path_prefix {
            Some(prefix) => path_has_prefix_case(path, prefix, case_sensitive),
            None => true,
        }
    }

    /// The match as `key=value` phrases, in a fixed order (for `check`, `/rules`, `/diagram`).
    pub fn describe(&self) -> Vec<String> {
        let mut parts = Vec::new();
        if let Some(h) = &self.host {
            parts.push(format!("host={h}"));
        }
        if let Some(p) = &self.path {
            parts.push(format!("path={p}"));
        }
        if let Some(p) = &self.path_prefix {
            parts.push(format!("path_prefix={p}"));
        }
        if let Some(m) = &self.methods {
            let names: Vec<&str> = m.iter().map(Method::as_str).collect();
            parts.push(format!("methods={}", names.join("|")));
        }
        parts
    }
}

/// Prefix match on path segments, so that `/orders` does not match `/ordersx`, and a last
/// segment `PREFIX.ext` is covered too: `/orders.json` is the orders index to Rails (and
/// Django's and Laravel's format suffixes), and nginx's `location /orders` and Envoy's
/// `prefix: /orders` match it. `/orders.json/1` is not covered (no framework reads it as
/// `/orders/1`).
pub fn path_has_prefix(path: &str, prefix: &str) -> bool {
    path_has_prefix_case(path, prefix, true)
}

/// [`path_has_prefix`], the prefix compared ignoring ASCII case unless `case_sensitive`.
pub fn path_has_prefix_case(path: &str, prefix: &str, case_sensitive: bool) -> bool {
    if prefix == "/" || prefix.is_empty() {
        return true;
    }
    let prefix = prefix.strip_suffix('/').unwrap_or(prefix);
    let rest = if case_sensitive {
        path.strip_prefix(prefix)
    } else {
        let n = prefix.len();
        (path.len() >= n
            && path.is_char_boundary(n)
            && path.as_bytes()[..n].eq_ignore_ascii_case(prefix.as_bytes()))
        .then(|| &path[n..])
    };
    match rest {
        Some(rest) => {
            rest.is_empty()
                || rest.starts_with('/')
                || rest.strip_prefix('.').is_some_and(|ext| !ext.contains('/'))
        }
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_respects_segments() {
        assert!(path_has_prefix("/orders", "/orders"));
        assert!(path_has_prefix("/orders/1", "/orders"));
        assert!(path_has_prefix("/orders/1", "/orders/"));
        assert!(!path_has_prefix("/ordersx", "/orders"));
        assert!(path_has_prefix("/anything", "/"));
        // A format suffix on the last segment is the same resource.
        assert!(path_has_prefix("/orders.json", "/orders"));
        assert!(path_has_prefix("/orders.json", "/orders/"));
        assert!(path_has_prefix("/v1/orders.xml", "/v1/orders"));
        assert!(!path_has_prefix("/orders.json/1", "/orders"));
        assert!(!path_has_prefix("/ordersx.json", "/orders"));
    }

    #[test]
    fn a_case_insensitive_match_ignores_ascii_case_only() {
        let m = RequestMatch {
            path_prefix: Some("/orders".into()),
            ..RequestMatch::default()
        };
        assert!(!m.matches(None, &Method::GET, "/Orders/1"));
        assert!(m.matches_case(None, &Method::GET, "/Orders/1", false));
        assert!(m.matches_case(None, &Method::GET, "/ORDERS.JSON", false));
        assert!(!m.matches_case(None, &Method::GET, "/ordersx", false));
        let exact = RequestMatch {
            path: Some("/login".into()),
            ..RequestMatch::default()
        };
        assert!(exact.matches_case(None, &Method::POST, "/LogIn", false));
        assert!(!exact.matches(None, &Method::POST, "/LogIn"));
        // A multi-byte character where the prefix ends is no match (and no panic).
        assert!(!path_has_prefix_case("/ordeé", "/order", false));
    }

    #[test]
    fn every_set_field_must_fit() {
        let n = |h: &str| crate::wire::normalize::host(h).unwrap().into_owned();
        let m = RequestMatch {
            path: None,
            path_prefix: Some("/orders".into()),
            host: Some(n("API.example.com.")),
            methods: Some(vec![Method::GET]),
        };
        let host = n("api.example.com:8080");
        assert!(m.matches(Some(&host), &Method::GET, "/orders/1"));
        assert!(!m.matches(Some(&host), &Method::POST, "/orders/1"));
        assert!(
            m.matches(Some(&host), &Method::HEAD, "/orders/1"),
            "GET covers HEAD"
        );
        let head_only = RequestMatch {
            methods: Some(vec![Method::HEAD]),
            ..RequestMatch::default()
        };
        assert!(
            !head_only.matches(None, &Method::GET, "/x"),
            "not the other way"
        );
        assert!(!m.matches(None, &Method::GET, "/orders/1"));
        assert!(!m.matches(Some(&n("other.example.com")), &Method::GET, "/orders"));
        assert!(!m.matches(Some(&host), &Method::GET, "/ordersx"));
        assert!(RequestMatch::default().matches(None, &Method::PUT, "/x"));
        assert_eq!(
            m.describe(),
            ["host=api.example.com", "path_prefix=/orders", "methods=GET"]
        );
    }
}
