//! A route's `request_headers` and `response_headers`: headers removed, set (replacing) and
//! added (beside what is there), with values that may name parts of floodgate's own view of
//! the request (`${key_id}`, `${user}`, `${plan}`, `${client_ip}`, `${request_id}`,
//! `${route}`).
//!
//! Everything is parsed and checked when the config is loaded: names, the values' text (no
//! control characters), the variables. On a request the only work is the edits themselves;
//! a value without a variable is a header value built once. A variable's value comes from
//! floodgate's identity and connection facts, never from a header the client wrote, so a
//! client cannot put a line break or another header into an edited one.

use std::net::IpAddr;

use http::{HeaderName, HeaderValue};
use pingora::http::{CaseHeaderName, RequestHeader, ResponseHeader};

use crate::wire::auth::Identity;

/// The most headers one `request_headers` or `response_headers` table may edit.
pub const MAX_EDITS: usize = 64;
/// The longest value, in bytes, before and after its variables are filled in.
pub const MAX_VALUE: usize = 4096;

/// One direction's edits, in the order they are applied: remove, set, add.
#[derive(Debug, Clone, Default)]
pub struct HeaderEdits {
    remove: Vec<HeaderName>,
    set: Vec<Edit>,
    add: Vec<Edit>,
}

/// A header to set or add.
#[derive(Debug, Clone)]
struct Edit {
    name: HeaderName,
    /// The spelling written on HTTP/1.1, as the config wrote it.
    case: CaseHeaderName,
    value: Template,
}

/// A header value, fixed or with variables.
#[derive(Debug, Clone)]
enum Template {
    Fixed(HeaderValue),
    Parts(Vec<Part>),
}

#[derive(Debug, Clone)]
enum Part {
    Text(Box<str>),
    Var(Var),
}

/// A variable a value may name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Var {
    /// `${key_id}`: the authenticated key's id (or the token's `key_id_claim`).
    KeyId,
    /// `${user}`.
    User,
    /// `${plan}`.
    Plan,
    /// `${client_ip}`: as resolved (`trusted_proxies` respected).
    ClientIp,
    /// `${request_id}`.
    RequestId,
    /// `${route}`: the route's name.
    Route,
}

impl Var {
    /// Every variable with its name: the one list that parsing and errors read.
    pub const NAMES: &'static [(&'static str, Var)] = &[
        ("key_id", Var::KeyId),
        ("user", Var::User),
        ("plan", Var::Plan),
        ("client_ip", Var::ClientIp),
        ("request_id", Var::RequestId),
        ("route", Var::Route),
    ];
}

/// What variables are filled in from.
#[derive(Debug, Clone, Copy)]
pub struct Vars<'a> {
    /// The caller, when a key or token authenticated.
    pub identity: Option<&'a Identity>,
    /// The client's address.
    pub client_ip: IpAddr,
    /// The request id.
    pub request_id: &'a str,
    /// The route's name.
    pub route: &'a str,
}

/// Why a header may not be edited, when floodgate owns it or it frames the message; `None`
/// for a name a route may edit. `cors`: the route answers CORS itself, so the
/// `Access-Control-*` headers are floodgate's too.
pub fn owned_by_gateway(name: &str, cors: bool) -> Option<&'static str> {
    let n = name.to_ascii_lowercase();
    const HOP_BY_HOP: &[&str] = &[
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "upgrade",
    ];
    if HOP_BY_HOP.contains(&n.as_str()) {
        return Some("a hop-by-hop header, which belongs to one connection");
    }
    match n.as_str() {
        "content-length" | "transfer-encoding" => {
            return Some("it frames the message; floodgate writes it")
        }
        "host" => return Some("the upstream's Host is set with host_rewrite"),
        "x-request-id" => return Some("floodgate sets and forwards the request id"),
        "retry-after" | "forwarded" => return Some("floodgate writes it"),
        _ => {}
    }
    if n.starts_with("x-forwarded-") {
        return Some("floodgate writes the forwarding headers");
    }
    if n.starts_with("x-floodgate-") {
        return Some("the identity headers are floodgate's alone");
    }
    if n.starts_with("ratelimit") || n.starts_with("x-ratelimit-") {
        return Some("floodgate writes the RateLimit fields");
    }
    if cors && n.starts_with("access-control-") {
        return Some("the route's cors table writes the CORS headers");
    }
    None
}

/// Why a header name cannot be edited at all (not a token), or `Ok` with it parsed.
pub fn parse_name(name: &str) -> Result<(HeaderName, CaseHeaderName), String> {
    let parsed = HeaderName::from_bytes(name.as_bytes())
        .map_err(|_| format!("\"{name}\" is not a header name"))?;
    Ok((parsed, CaseHeaderName::new(name.to_owned())))
}

/// Parses a value: text with `${name}` variables. `$` not followed by `{` is text.
fn parse_template(value: &str) -> Result<Template, String> {
    if value.len() > MAX_VALUE {
        return Err(format!("the value is longer than {MAX_VALUE} bytes"));
    }
    if let Some(c) = value.chars().find(|c| c.is_control()) {
        return Err(format!(
            "the value has a control character ({:?}); header values cannot carry one",
            c
        ));
    }
    let mut parts = Vec::new();
    let mut rest = value;
    while let Some(at) = rest.find("${") {
        if at > 0 {
            parts.push(Part::Text(rest[..at].into()));
        }
        let inner = &rest[at + 2..];
        let end = inner
            .find('}')
            .ok_or_else(|| "the value has a \"${\" without its \"}\"".to_string())?;
        let name = &inner[..end];
        let var = Var::NAMES
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| *v)
            .ok_or_else(|| {
                let known: Vec<String> = Var::NAMES
                    .iter()
                    .map(|(n, _)| format!("${{{n}}}"))
                    .collect();
                format!(
                    "the value names \"${{{name}}}\", which is not a variable (variables: {})",
                    known.join(", ")
                )
            })?;
        parts.push(Part::Var(var));
        rest = &inner[end + 1..];
    }
    if !rest.is_empty() {
        parts.push(Part::Text(rest.into()));
    }
    if parts.iter().all(|p| matches!(p, Part::Text(_))) {
        let fixed = HeaderValue::from_str(value)
            .or_else(|_| HeaderValue::from_bytes(value.as_bytes()))
            .map_err(|_| "the value is not a header value".to_string())?;
        return Ok(Template::Fixed(fixed));
    }
    Ok(Template::Parts(parts))
}

/// Which table of a `request_headers` / `response_headers` an edit is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `remove`: the header goes.
    Remove,
    /// `set`: the header gets this value, replacing any.
    Set,
    /// `add`: the value is added beside any the header has.
    Add,
}

impl HeaderEdits {
    /// Builds the edits from whole tables (for tests and callers without spans).
    pub fn new<'a>(
        remove: impl IntoIterator<Item = &'a str>,
        set: impl IntoIterator<Item = (&'a str, &'a str)>,
        add: impl IntoIterator<Item = (&'a str, &'a str)>,
        cors: bool,
    ) -> Result<HeaderEdits, String> {
        let mut edits = HeaderEdits::default();
        for name in remove {
            edits.push(Op::Remove, name, "", cors)?;
        }
        for (name, value) in set {
            edits.push(Op::Set, name, value, cors)?;
        }
        for (name, value) in add {
            edits.push(Op::Add, name, value, cors)?;
        }
        Ok(edits)
    }

    /// Adds one edit: its name checked to be a token and not one floodgate owns
    /// ([`owned_by_gateway`]; `cors`: the route answers CORS), its value parsed (`value` is
    /// ignored for [`Op::Remove`]). A name a table already edits, or one edit past
    /// [`MAX_EDITS`], is refused.
    pub fn push(&mut self, op: Op, name: &str, value: &str, cors: bool) -> Result<(), String> {
        let what = match op {
            Op::Remove => "remove",
            Op::Set => "set",
            Op::Add => "add",
        };
        let (parsed, case) = parse_name(name)?;
        if let Some(why) = owned_by_gateway(name, cors) {
            return Err(format!(
                "{what} \"{name}\": the header is not editable: {why}"
            ));
        }
        let twice = match op {
            Op::Remove => self.remove.contains(&parsed),
            Op::Set | Op::Add => self.set.iter().chain(&self.add).any(|e| e.name == parsed),
        };
        if twice {
            return Err(format!("\"{name}\" is edited twice"));
        }
        if self.remove.len() + self.set.len() + self.add.len() >= MAX_EDITS {
            return Err(format!(
                "at most {MAX_EDITS} headers are edited in one table"
            ));
        }
        if op == Op::Remove {
            self.remove.push(parsed);
            return Ok(());
        }
        let value = parse_template(value).map_err(|e| format!("{what} \"{name}\": {e}"))?;
        let edit = Edit {
            name: parsed,
            case,
            value,
        };
        if op == Op::Set {
            self.set.push(edit);
        } else {
            self.add.push(edit);
        }
        Ok(())
    }

    /// The edits in a few words, for `check`: `set X-Tenant, add Via, remove Cookie`.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        for (what, names) in [
            ("set", self.set.iter().map(|e| &e.name).collect::<Vec<_>>()),
            ("add", self.add.iter().map(|e| &e.name).collect()),
            ("remove", self.remove.iter().collect()),
        ] {
            if !names.is_empty() {
                let list: Vec<&str> = names.iter().map(|n| n.as_str()).collect();
                parts.push(format!("{what} {}", list.join(" ")));
            }
        }
        parts.join(", ")
    }

    /// Whether there is nothing to do.
    pub fn is_empty(&self) -> bool {
        self.remove.is_empty() && self.set.is_empty() && self.add.is_empty()
    }

    /// How many headers the edits may add (the room a caller reserves once, with its own).
    pub fn added(&self) -> usize {
        self.set.len() + self.add.len()
    }

    /// Applies the edits to the upstream request (the caller has made room for
    /// [`Self::added`] headers, with its own, in one reserve: each growth of Pingora's two
    /// header maps is an allocation and a rehash of every header).
    pub fn apply_request(&self, req: &mut RequestHeader, vars: &Vars<'_>) -> pingora::Result<()> {
        for name in &self.remove {
            req.remove_header(name);
        }
        for e in &self.set {
            match e.value.fill(vars) {
                Some(v) => req.insert_header_parsed(&e.name, &e.case, v)?,
                // Empty (its variables absent): the header goes, so that what `set` controls
                // is never the client's own value.
                None => {
                    req.remove_header(&e.name);
                }
            }
        }
        for e in &self.add {
            if let Some(v) = e.value.fill(vars) {
                if req.headers.contains_key(&e.name) {
                    req.append_header(e.case.clone(), v)?;
                } else {
                    // Nothing to add beside: the pre-parsed insert (no name parsed or copied).
                    req.insert_header_parsed(&e.name, &e.case, v)?;
                }
            }
        }
        Ok(())
    }

    /// Applies the edits to an answer: the upstream's, or floodgate's own.
    pub fn apply_response(
        &self,
        resp: &mut ResponseHeader,
        vars: &Vars<'_>,
    ) -> pingora::Result<()> {
        for name in &self.remove {
            resp.remove_header(name);
        }
        for e in &self.set {
            match e.value.fill(vars) {
                Some(v) => resp.insert_header_parsed(&e.name, &e.case, v)?,
                None => {
                    resp.remove_header(&e.name);
                }
            }
        }
        for e in &self.add {
            if let Some(v) = e.value.fill(vars) {
                if resp.headers.contains_key(&e.name) {
                    resp.append_header(e.case.clone(), v)?;
                } else {
                    resp.insert_header_parsed(&e.name, &e.case, v)?;
                }
            }
        }
        Ok(())
    }
}

impl Template {
    /// The value for this request; `None` when it comes out empty (a header whose only
    /// variable is absent is not sent) or could not be a header value.
    fn fill(&self, vars: &Vars<'_>) -> Option<HeaderValue> {
        let parts = match self {
            Template::Fixed(v) => return Some(v.clone()),
            Template::Parts(parts) => parts,
        };
        let mut out = String::new();
        for p in parts {
            match p {
                Part::Text(t) => out.push_str(t),
                Part::Var(v) => push_var(&mut out, *v, vars),
            }
        }
        if out.is_empty() || out.len() > MAX_VALUE {
            return None;
        }
        // Every part is a checked header value (config text, identity text, an address, a
        // request id, a route name): this holds, and a value that would not is not sent. The
        // text's buffer becomes the value's (checked, not copied).
        HeaderValue::from_maybe_shared(bytes::Bytes::from(out)).ok()
    }
}

/// Appends variable `v`'s value (nothing when absent).
fn push_var(out: &mut String, v: Var, vars: &Vars<'_>) {
    match v {
        Var::KeyId => {
            if let Some(i) = vars.identity {
                out.push_str(i.id.as_str());
            }
        }
        Var::User => {
            if let Some(i) = vars.identity {
                out.push_str(i.user.as_str());
            }
        }
        Var::Plan => {
            if let Some(p) = vars.identity.and_then(|i| i.plan.as_ref()) {
                out.push_str(p.as_str());
            }
        }
        Var::ClientIp => crate::text::push_ip(out, vars.client_ip),
        Var::RequestId => out.push_str(vars.request_id),
        Var::Route => out.push_str(vars.route),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::auth::HeaderText;

    fn vars<'a>(identity: Option<&'a Identity>) -> Vars<'a> {
        Vars {
            identity,
            client_ip: "192.0.2.7".parse().unwrap(),
            request_id: "rid-1",
            route: "orders",
        }
    }

    fn get(resp: &ResponseHeader, name: &str) -> Vec<String> {
        resp.headers
            .get_all(name)
            .iter()
            .map(|v| v.to_str().unwrap().to_owned())
            .collect()
    }

    #[test]
    fn set_replaces_add_appends_remove_goes_first() {
        let edits = HeaderEdits::new(
            ["server"],
            [("X-Tenant", "t-${user}"), ("Cache-Control", "no-store")],
            [("Via", "floodgate ${route}")],
            false,
        )
        .unwrap();
        let mut resp = ResponseHeader::build(200, None).unwrap();
        resp.insert_header("server", "nginx").unwrap();
        resp.insert_header("cache-control", "max-age=60").unwrap();
        resp.insert_header("via", "1.1 cdn").unwrap();
        let id = Identity {
            id: HeaderText::new("k1").unwrap(),
            user: HeaderText::new("acme").unwrap(),
            plan: None,
            claims: None,
        };
        edits.apply_response(&mut resp, &vars(Some(&id))).unwrap();
        assert!(get(&resp, "server").is_empty());
        assert_eq!(get(&resp, "x-tenant"), ["t-acme"]);
        assert_eq!(get(&resp, "cache-control"), ["no-store"]);
        assert_eq!(get(&resp, "via"), ["1.1 cdn", "floodgate orders"]);
        let mut wire = Vec::new();
        resp.header_to_h1_wire(&mut wire);
        assert!(
            String::from_utf8_lossy(&wire).contains("X-Tenant: t-acme"),
            "the config's spelling goes on the wire"
        );
    }

    #[test]
    fn absent_parts_are_empty_and_an_empty_value_is_not_sent() {
        let edits = HeaderEdits::new(
            [],
            [
                ("x-plan", "${plan}"),
                ("x-who", "${user}@${client_ip} ${request_id}"),
            ],
            [],
            false,
        )
        .unwrap();
        let mut req = RequestHeader::build("GET", b"/", None).unwrap();
        req.insert_header("x-plan", "enterprise").unwrap();
        edits.apply_request(&mut req, &vars(None)).unwrap();
        assert!(
            req.headers.get("x-plan").is_none(),
            "a set that comes out empty removes the client's own value"
        );
        assert_eq!(req.headers.get("x-who").unwrap(), "@192.0.2.7 rid-1");
        let mut resp = ResponseHeader::build(200, None).unwrap();
        resp.insert_header("x-plan", "from-upstream").unwrap();
        edits.apply_response(&mut resp, &vars(None)).unwrap();
        assert!(resp.headers.get("x-plan").is_none());
    }

    #[test]
    fn owned_and_malformed_names_and_values_are_refused() {
        for name in [
            "Connection",
            "content-length",
            "Transfer-Encoding",
            "host",
            "X-Forwarded-For",
            "x-forwarded-host",
            "X-Request-Id",
            "x-floodgate-user",
            "RateLimit",
            "RateLimit-Policy",
            "x-ratelimit-remaining",
            "Retry-After",
            "upgrade",
            "te",
        ] {
            let e = HeaderEdits::new([], [(name, "x")], [], false).unwrap_err();
            assert!(e.contains("not editable"), "{name}: {e}");
            assert!(HeaderEdits::new([name], [], [], false).is_err(), "{name}");
        }
        assert!(HeaderEdits::new([], [("access-control-allow-origin", "*")], [], true).is_err());
        assert!(HeaderEdits::new([], [("access-control-allow-origin", "*")], [], false).is_ok());
        assert!(HeaderEdits::new([], [("bad name", "x")], [], false).is_err());
        let e = HeaderEdits::new([], [("x-a", "a\r\nx-b: c")], [], false).unwrap_err();
        assert!(e.contains("control character"), "{e}");
        let e = HeaderEdits::new([], [("x-a", "${secret}")], [], false).unwrap_err();
        assert!(e.contains("${secret}") && e.contains("${user}"), "{e}");
        let e = HeaderEdits::new([], [("x-a", "${user")], [], false).unwrap_err();
        assert!(e.contains("without"), "{e}");
        assert!(HeaderEdits::new([], [("x-a", "a"), ("X-A", "b")], [], false).is_err());
        assert!(
            HeaderEdits::new([], [("x-a", "$5 and ${route}")], [], false).is_ok(),
            "a lone $ is text"
        );
    }
}
