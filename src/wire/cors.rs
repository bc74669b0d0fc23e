//! A route's `cors`: browsers' cross-origin requests answered at the edge.
//!
//! A preflight (`OPTIONS` with `Origin` and `Access-Control-Request-Method`) is answered `204`
//! by floodgate, before authentication: it carries no credentials, and forwarding it or
//! refusing it `401` would make the page's real request fail. Every other answer to an allowed
//! origin — the upstream's, and floodgate's own `401`, `403`, `429` and `503` — carries
//! `Access-Control-Allow-Origin` and `Vary: Origin`, and exposes the RateLimit fields and
//! `Retry-After`, so that a page can read why it was refused and when to come back (a gateway
//! that adds CORS headers only to proxied answers shows the page an opaque network error
//! instead). An origin that is not allowed gets no CORS header at all.

use http::{HeaderMap, HeaderName, HeaderValue, Method};
use pingora::http::ResponseHeader;

/// Headers a page can read on every answer, besides the route's own `expose_headers`: what
/// floodgate writes so that a client can pace itself.
pub const ALWAYS_EXPOSED: &[&str] = &[
    "RateLimit",
    "RateLimit-Policy",
    "Retry-After",
    "X-Request-Id",
];
/// Methods allowed when the route's `allow_methods` is not given.
pub const DEFAULT_METHODS: &[&str] = &["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"];
/// The longest `Origin` or `Access-Control-Request-Headers` looked at; longer ones are not
/// CORS requests any browser sends.
pub const MAX_FIELD: usize = 2048;

/// One `allow_origins` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Origin {
    /// `"*"`.
    Any,
    /// An exact origin, lower-cased.
    Exact(Box<str>),
    /// `"https://*.example.com"`: one DNS label in place of the `*`.
    OneLabel {
        /// `https://`.
        scheme: Box<str>,
        /// `.example.com` (with any port).
        suffix: Box<str>,
    },
}

impl Origin {
    fn allows(&self, origin: &str) -> bool {
        match self {
            Origin::Any => true,
            Origin::Exact(o) => o.eq_ignore_ascii_case(origin),
            Origin::OneLabel { scheme, suffix } => {
                let lower = origin.to_ascii_lowercase();
                let Some(rest) = lower.strip_prefix(&**scheme) else {
                    return false;
                };
                let Some(label) = rest.strip_suffix(&**suffix) else {
                    return false;
                };
                !label.is_empty()
                    && label
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-')
            }
        }
    }
}

/// A route's CORS policy, its header values built once.
#[derive(Debug, Clone)]
pub struct Cors {
    origins: Vec<Origin>,
    allow_methods: HeaderValue,
    /// `None`: the preflight's requested headers are allowed (echoed).
    allow_headers: Option<HeaderValue>,
    expose_headers: HeaderValue,
    max_age: Option<HeaderValue>,
    allow_credentials: bool,
}

/// The config's `cors` table, as text.
#[derive(Debug, Default)]
pub struct CorsText<'a> {
    /// `allow_origins`.
    pub allow_origins: Vec<&'a str>,
    /// `allow_methods`, when given.
    pub allow_methods: Option<Vec<&'a str>>,
    /// `allow_headers`, when given.
    pub allow_headers: Option<Vec<&'a str>>,
    /// `expose_headers`.
    pub expose_headers: Vec<&'a str>,
    /// `max_age` in seconds, when given.
    pub max_age: Option<u64>,
    /// `allow_credentials`.
    pub allow_credentials: bool,
}

/// Why a `cors` table is refused, and which list entry (its index in `allow_origins`, ...)
/// when one is to blame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CorsError {
    /// The key at fault.
    pub key: &'static str,
    /// The entry of that list at fault, if one.
    pub index: Option<usize>,
    /// What is wrong.
    pub message: String,
}

fn refuse(key: &'static str, index: Option<usize>, message: String) -> CorsError {
    CorsError {
        key,
        index,
        message,
    }
}

/// Parses one `allow_origins` entry.
fn parse_origin(text: &str) -> Result<Origin, String> {
    if text == "*" {
        return Ok(Origin::Any);
    }
    let lower = text.to_ascii_lowercase();
    let Some((scheme, host)) = lower.split_once("://") else {
        return Err(format!(
            "origin \"{text}\" is not \"*\" nor an origin like \"https://app.example.com\""
        ));
    };
    if scheme.is_empty()
        || !scheme
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b))
    {
        return Err(format!("origin \"{text}\" has no valid scheme"));
    }
    if host.is_empty() || host.contains(['/', '?', '#', ' ']) {
        return Err(format!(
            "origin \"{text}\" is a scheme and a host (and port) only, without a path or a trailing \"/\""
        ));
    }
    match host.matches('*').count() {
        0 => Ok(Origin::Exact(lower.into())),
        1 if host.starts_with("*.") && host.len() > 2 => Ok(Origin::OneLabel {
            scheme: format!("{scheme}://").into(),
            suffix: host[1..].into(),
        }),
        _ => Err(format!(
            "origin \"{text}\": a wildcard stands for one whole first label, as in \"https://*.example.com\""
        )),
    }
}

/// A comma-separated header value of `items`.
fn joined(items: impl IntoIterator<Item = impl AsRef<str>>) -> Option<HeaderValue> {
    let text = items
        .into_iter()
        .map(|s| s.as_ref().to_owned())
        .collect::<Vec<_>>()
        .join(", ");
    HeaderValue::from_str(&text).ok()
}

impl Cors {
    /// The policy of a `cors` table, or why it is refused.
    pub fn new(t: &CorsText<'_>) -> Result<Cors, CorsError> {
        if t.allow_origins.is_empty() {
            return Err(refuse(
                "allow_origins",
                None,
                "cors.allow_origins needs at least one origin (\"*\" for any)".into(),
            ));
        }
        let mut origins = Vec::new();
        for (i, o) in t.allow_origins.iter().enumerate() {
            let origin = parse_origin(o).map_err(|m| refuse("allow_origins", Some(i), m))?;
            if origin == Origin::Any && t.allow_credentials {
                return Err(refuse(
                    "allow_origins",
                    Some(i),
                    "\"*\" cannot be combined with allow_credentials = true (browsers refuse it, and it \
                     would let every site call the API with the user's cookies): list the origins"
                        .into(),
                ));
            }
            origins.push(origin);
        }
        let methods: Vec<&str> = match &t.allow_methods {
            Some(list) => {
                for (i, m) in list.iter().enumerate() {
                    let ok = Method::from_bytes(m.as_bytes())
                        .is_ok_and(|m| crate::wire::normalize::method_is_canonical(&m));
                    if !ok {
                        return Err(refuse(
                            "allow_methods",
                            Some(i),
                            format!("\"{m}\" is not an upper-case HTTP method"),
                        ));
                    }
                }
                list.clone()
            }
            None => DEFAULT_METHODS.to_vec(),
        };
        let names = |key: &'static str, list: &[&str]| -> Result<(), CorsError> {
            for (i, h) in list.iter().enumerate() {
                if HeaderName::from_bytes(h.as_bytes()).is_err() {
                    return Err(refuse(
                        key,
                        Some(i),
                        format!("\"{h}\" is not a header name"),
                    ));
                }
            }
            Ok(())
        };
        if let Some(list) = &t.allow_headers {
            names("allow_headers", list)?;
        }
        names("expose_headers", &t.expose_headers)?;
        let mut exposed: Vec<&str> = ALWAYS_EXPOSED.to_vec();
        for h in &t.expose_headers {
            if !exposed.iter().any(|e| e.eq_ignore_ascii_case(h)) {
                exposed.push(h);
            }
        }
        let bad = |key| refuse(key, None, "the list is not a header value".into());
        Ok(Cors {
            origins,
            allow_methods: joined(&methods).ok_or_else(|| bad("allow_methods"))?,
            allow_headers: match &t.allow_headers {
                Some(list) => Some(joined(list).ok_or_else(|| bad("allow_headers"))?),
                None => None,
            },
            expose_headers: joined(&exposed).ok_or_else(|| bad("expose_headers"))?,
            max_age: t.max_age.map(HeaderValue::from),
            allow_credentials: t.allow_credentials,
        })
    }

    /// The policy in a few words, for `check`: its origins, credentials and max age.
    pub fn describe(&self) -> String {
        let origins: Vec<String> = self
            .origins
            .iter()
            .map(|o| match o {
                Origin::Any => "*".to_owned(),
                Origin::Exact(e) => e.to_string(),
                Origin::OneLabel { scheme, suffix } => format!("{scheme}*{suffix}"),
            })
            .collect();
        let mut out = format!("origins [{}]", origins.join(", "));
        if self.allow_credentials {
            out.push_str(" with credentials");
        }
        if let Some(age) = self.max_age.as_ref().and_then(|a| a.to_str().ok()) {
            out.push_str(&format!(" max_age {age}s"));
        }
        out
    }

    /// The request's `Origin` when this policy allows it (the value to echo), else `None`.
    pub fn allowed_origin(&self, headers: &HeaderMap) -> Option<HeaderValue> {
        let mut all = headers.get_all(http::header::ORIGIN).iter();
        let (Some(origin), None) = (all.next(), all.next()) else {
            return None;
        };
        if origin.len() > MAX_FIELD {
            return None;
        }
        let text = origin.to_str().ok()?;
        self.origins
            .iter()
            .any(|o| o.allows(text))
            .then(|| origin.clone())
    }

    /// The headers of the `204` that answers a preflight from `origin` (allowed): the allowed
    /// methods and headers, how long the browser may keep them, credentials when allowed.
    pub fn preflight_headers(
        &self,
        origin: HeaderValue,
        request: &HeaderMap,
    ) -> Vec<(HeaderName, HeaderValue)> {
        use http::header::*;
        let mut out = vec![
            (ACCESS_CONTROL_ALLOW_ORIGIN, origin),
            (ACCESS_CONTROL_ALLOW_METHODS, self.allow_methods.clone()),
            (
                VARY,
                HeaderValue::from_static(
                    "Origin, Access-Control-Request-Method, Access-Control-Request-Headers",
                ),
            ),
        ];
        let headers = match &self.allow_headers {
            Some(v) => Some(v.clone()),
            None => requested_headers(request),
        };
        if let Some(h) = headers {
            out.push((ACCESS_CONTROL_ALLOW_HEADERS, h));
        }
        if let Some(age) = &self.max_age {
            out.push((ACCESS_CONTROL_MAX_AGE, age.clone()));
        }
        if self.allow_credentials {
            out.push((
                ACCESS_CONTROL_ALLOW_CREDENTIALS,
                HeaderValue::from_static("true"),
            ));
        }
        out
    }

    /// How many headers [`Self::decorate`] may add (the room a caller reserves).
    pub const ADDED: usize = 4;

    /// Adds the CORS headers of an actual (not preflight) answer to an allowed `origin`:
    /// the upstream's own `Access-Control-*` headers are replaced, `Origin` joins its `Vary`.
    pub fn decorate(&self, resp: &mut ResponseHeader, origin: &HeaderValue) -> pingora::Result<()> {
        // Pre-parsed names (`header_names`): nothing parsed or copied per answer.
        use crate::wire::header_names as names;
        names::ACCESS_CONTROL_ALLOW_ORIGIN.set_response(resp, origin.clone())?;
        names::ACCESS_CONTROL_EXPOSE_HEADERS.set_response(resp, self.expose_headers.clone())?;
        if self.allow_credentials {
            names::ACCESS_CONTROL_ALLOW_CREDENTIALS
                .set_response(resp, HeaderValue::from_static("true"))?;
        } else if resp
            .headers
            .contains_key(names::ACCESS_CONTROL_ALLOW_CREDENTIALS.name())
        {
            resp.remove_header(names::ACCESS_CONTROL_ALLOW_CREDENTIALS.name());
        }
        add_vary_origin(resp)
    }
}

/// The answer on a `cors` route to a request whose origin is not allowed (or that sent
/// none): no CORS header at all, the upstream's own removed (an upstream that reflects any
/// `Origin` must not open the API to the origins the route leaves out), and `Vary: Origin`,
/// so that a shared cache does not hand this answer to an allowed origin or the other way.
pub fn not_allowed(resp: &mut ResponseHeader) -> pingora::Result<()> {
    // Collected first (the map is edited after); an empty collection allocates nothing.
    let theirs: Vec<HeaderName> = resp
        .headers
        .keys()
        .filter(|k| k.as_str().starts_with("access-control-"))
        .cloned()
        .collect();
    for name in theirs {
        resp.remove_header(&name);
    }
    add_vary_origin(resp)
}

/// `Origin` added to the answer's `Vary` unless it is there (or `Vary: *`).
fn add_vary_origin(resp: &mut ResponseHeader) -> pingora::Result<()> {
    use crate::wire::header_names::VARY;
    let mut values = resp.headers.get_all(VARY.name()).iter().peekable();
    if values.peek().is_none() {
        return VARY.set_response(resp, HeaderValue::from_static("Origin"));
    }
    let present = values.any(|v| {
        v.as_bytes()
            .split(|b| *b == b',')
            .map(<[u8]>::trim_ascii)
            .any(|t| t == b"*" || t.eq_ignore_ascii_case(b"origin"))
    });
    if !present {
        resp.append_header(http::header::VARY, HeaderValue::from_static("Origin"))?;
    }
    Ok(())
}

/// The preflight's `Access-Control-Request-Headers`, when it is a sane list of header names
/// (echoed as what is allowed when the route lists none).
fn requested_headers(request: &HeaderMap) -> Option<HeaderValue> {
    let v = request.get(http::header::ACCESS_CONTROL_REQUEST_HEADERS)?;
    if v.is_empty() || v.len() > MAX_FIELD {
        return None;
    }
    let ok = v
        .as_bytes()
        .split(|b| *b == b',')
        .map(<[u8]>::trim_ascii)
        .all(|name| !name.is_empty() && HeaderName::from_bytes(name).is_ok());
    ok.then(|| v.clone())
}

/// The method a request asks the preflight about, when the request is a CORS preflight:
/// `OPTIONS` with an `Origin` and one valid `Access-Control-Request-Method`.
pub fn preflight_method(method: &Method, headers: &HeaderMap) -> Option<Method> {
    if *method != Method::OPTIONS || !headers.contains_key(http::header::ORIGIN) {
        return None;
    }
    let mut asked = headers
        .get_all(http::header::ACCESS_CONTROL_REQUEST_METHOD)
        .iter();
    let (Some(v), None) = (asked.next(), asked.next()) else {
        return None;
    };
    let m = Method::from_bytes(v.as_bytes()).ok()?;
    crate::wire::normalize::method_is_canonical(&m).then_some(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cors(origins: &[&str], credentials: bool) -> Result<Cors, CorsError> {
        Cors::new(&CorsText {
            allow_origins: origins.to_vec(),
            allow_credentials: credentials,
            ..CorsText::default()
        })
    }

    fn with_origin(origin: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(http::header::ORIGIN, origin.parse().unwrap());
        h
    }

    #[test]
    fn origins_match_exactly_by_one_label_or_any() {
        let c = cors(
            &["https://app.example.com", "https://*.example.org:8443"],
            false,
        )
        .unwrap();
        assert!(c
            .allowed_origin(&with_origin("https://app.example.com"))
            .is_some());
        assert!(c
            .allowed_origin(&with_origin("HTTPS://APP.example.com"))
            .is_some());
        assert!(c
            .allowed_origin(&with_origin("http://app.example.com"))
            .is_none());
        assert!(c
            .allowed_origin(&with_origin("https://app.example.com.evil"))
            .is_none());
        assert!(c
            .allowed_origin(&with_origin("https://a.example.org:8443"))
            .is_some());
        assert!(
            c.allowed_origin(&with_origin("https://a.b.example.org:8443"))
                .is_none(),
            "one label only"
        );
        assert!(c
            .allowed_origin(&with_origin("https://example.org:8443"))
            .is_none());
        assert!(c
            .allowed_origin(&with_origin("https://a.example.org"))
            .is_none());
        assert!(c.allowed_origin(&HeaderMap::new()).is_none());
        let any = cors(&["*"], false).unwrap();
        assert!(any.allowed_origin(&with_origin("null")).is_some());
    }

    #[test]
    fn a_careless_table_is_refused() {
        let e = cors(&["*"], true).unwrap_err();
        assert_eq!((e.key, e.index), ("allow_origins", Some(0)));
        assert!(cors(&[], false).is_err());
        for bad in [
            "example.com",
            "https://example.com/",
            "https://*example.com",
            "https://a.*.com",
            "https://*",
        ] {
            assert!(cors(&[bad], false).is_err(), "{bad}");
        }
        let e = Cors::new(&CorsText {
            allow_origins: vec!["*"],
            allow_methods: Some(vec!["GET", "get"]),
            ..CorsText::default()
        })
        .unwrap_err();
        assert_eq!((e.key, e.index), ("allow_methods", Some(1)));
    }

    #[test]
    fn preflights_are_recognized_and_answered() {
        let mut h = with_origin("https://app.example.com");
        assert_eq!(preflight_method(&Method::OPTIONS, &h), None);
        h.insert(
            http::header::ACCESS_CONTROL_REQUEST_METHOD,
            "PUT".parse().unwrap(),
        );
        assert_eq!(preflight_method(&Method::OPTIONS, &h), Some(Method::PUT));
        assert_eq!(preflight_method(&Method::GET, &h), None);
        h.insert(
            http::header::ACCESS_CONTROL_REQUEST_HEADERS,
            "x-api-key, content-type".parse().unwrap(),
        );
        let c = Cors::new(&CorsText {
            allow_origins: vec!["https://app.example.com"],
            max_age: Some(600),
            ..CorsText::default()
        })
        .unwrap();
        let origin = c.allowed_origin(&h).unwrap();
        let out: HeaderMap = c.preflight_headers(origin, &h).into_iter().collect();
        assert_eq!(
            out["access-control-allow-origin"],
            "https://app.example.com"
        );
        assert_eq!(
            out["access-control-allow-headers"],
            "x-api-key, content-type"
        );
        assert_eq!(out["access-control-max-age"], "600");
        assert!(out["access-control-allow-methods"]
            .to_str()
            .unwrap()
            .contains("PUT"));
        assert!(!out.contains_key("access-control-allow-credentials"));
    }

    #[test]
    fn answers_expose_the_rate_limit_fields_and_vary_on_origin() {
        let c = Cors::new(&CorsText {
            allow_origins: vec!["https://app.example.com"],
            expose_headers: vec!["X-Total", "retry-after"],
            allow_credentials: true,
            ..CorsText::default()
        })
        .unwrap();
        let mut resp = ResponseHeader::build(429, None).unwrap();
        resp.insert_header("vary", "Accept-Encoding").unwrap();
        resp.insert_header("access-control-allow-origin", "*")
            .unwrap();
        c.decorate(
            &mut resp,
            &HeaderValue::from_static("https://app.example.com"),
        )
        .unwrap();
        assert_eq!(
            resp.headers["access-control-allow-origin"],
            "https://app.example.com"
        );
        assert_eq!(
            resp.headers["access-control-expose-headers"],
            "RateLimit, RateLimit-Policy, Retry-After, X-Request-Id, X-Total"
        );
        assert_eq!(resp.headers["access-control-allow-credentials"], "true");
        let vary: Vec<_> = resp.headers.get_all("vary").iter().collect();
        assert_eq!(vary, ["Accept-Encoding", "Origin"]);
        c.decorate(
            &mut resp,
            &HeaderValue::from_static("https://app.example.com"),
        )
        .unwrap();
        assert_eq!(
            resp.headers.get_all("vary").iter().count(),
            2,
            "Origin once"
        );
    }

    #[test]
    fn an_origin_not_allowed_gets_none_of_the_upstreams_cors_headers() {
        let mut resp = ResponseHeader::build(200, None).unwrap();
        resp.insert_header("access-control-allow-origin", "https://evil.example")
            .unwrap();
        resp.insert_header("access-control-allow-credentials", "true")
            .unwrap();
        resp.insert_header("content-type", "application/json")
            .unwrap();
        not_allowed(&mut resp).unwrap();
        assert!(resp
            .headers
            .keys()
            .all(|k| !k.as_str().starts_with("access-control-")));
        assert_eq!(resp.headers["vary"], "Origin");
        assert_eq!(resp.headers["content-type"], "application/json");
    }
}
