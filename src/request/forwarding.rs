//! The forwarding half of a request, as functions a unit test calls without a Pingora session:
//! the status an error becomes, whether a failed attempt is tried again, and the headers the
//! upstream receives. `proxy` gathers the facts from the session and calls these.

use crate::jwt::Carrier;
use std::net::IpAddr;

use http::{HeaderName, HeaderValue, Uri};
use pingora::http::RequestHeader;
use pingora::{ErrorSource, ErrorType};

use crate::wire::auth::Identity;
use crate::wire::client::{forwarded_for, RequestId};
use crate::wire::header_names as names;

/// The status floodgate answers for a proxying error; 0: answer nothing, only close (the
/// client is gone, or the connection is a tunnel whose stream must not be written into).
pub fn error_status(etype: &ErrorType, source: &ErrorSource, tunnel: bool) -> u16 {
    if tunnel {
        return 0;
    }
    let downstream = matches!(source, ErrorSource::Downstream);
    match etype {
        ErrorType::HTTPStatus(code) => *code,
        // The client's body stopped arriving (body_timeout, or a read past it).
        ErrorType::ReadTimedout if downstream => 408,
        ErrorType::ConnectTimedout | ErrorType::ReadTimedout | ErrorType::WriteTimedout => 504,
        _ => match source {
            ErrorSource::Upstream => 502,
            ErrorSource::Downstream => match etype {
                ErrorType::WriteError | ErrorType::ReadError | ErrorType::ConnectionClosed => 0,
                _ => 400,
            },
            _ => 500,
        },
    }
}

/// Whether an attempt whose connection failed (TLS included) is tried on another target:
/// idempotent requests only, within `retries`, while a target not yet tried is left.
/// `attempts` counts the failed attempts so far, this one included.
pub fn retry_after_connect_failure(
    idempotent: bool,
    attempts: usize,
    retries: usize,
    other_target: bool,
) -> bool {
    idempotent && attempts <= retries && other_target
}

/// What happens after an error while proxying over an established connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyRetry {
    /// Give up: the error is answered.
    No,
    /// Try the same target again: a pooled connection the upstream had closed is not the
    /// target's fault (as Pingora does by default).
    SameTarget,
    /// Try another target (counts as an attempt).
    Another,
}

/// The facts [`retry_after_proxy_error`] decides on.
#[derive(Debug, Clone, Copy)]
pub struct ProxyError<'a> {
    /// The request can be sent again: idempotent, and its body (if any) still buffered.
    pub replayable: bool,
    /// The connection came from the pool.
    pub reused: bool,
    /// The upstream's response head had arrived.
    pub responded: bool,
    /// The error.
    pub etype: &'a ErrorType,
    /// Attempts counted so far.
    pub attempts: usize,
    /// The upstream's `retries`.
    pub retries: usize,
    /// A target not yet tried is left.
    pub other_target: bool,
}

/// Whether a request that failed mid-exchange is tried again, and where: only a replayable
/// one, at once on a reused connection, elsewhere on a reset before any response byte.
pub fn retry_after_proxy_error(e: ProxyError<'_>) -> ProxyRetry {
    if !e.replayable {
        return ProxyRetry::No;
    }
    if e.reused {
        return ProxyRetry::SameTarget;
    }
    let reset = matches!(
        e.etype,
        ErrorType::ConnectionClosed | ErrorType::ReadError | ErrorType::WriteError
    );
    if !e.responded && reset && e.attempts < e.retries && e.other_target {
        ProxyRetry::Another
    } else {
        ProxyRetry::No
    }
}

/// What the identity headers' names (`header_names::IDENTITY`: key id, user, plan; set by
/// floodgate only, never by a client) start with.
const IDENTITY_PREFIX: &str = "x-floodgate-";

/// What the upstream request is built from, besides the client's own head.
#[derive(Debug)]
pub struct Forwarded<'a> {
    /// The connection's peer (appended to `X-Forwarded-For`).
    pub peer: IpAddr,
    /// The client connection is TLS (`X-Forwarded-Proto: https`).
    pub tls: bool,
    /// The request id (sent when floodgate made it; a client's own is already there).
    pub request_id: &'a RequestId,
    /// The caller, if a key authenticated.
    pub identity: Option<&'a Identity>,
    /// The normalized target, when it differs from what the client sent.
    pub target: Option<&'a Uri>,
    /// The host of an absolute-form target.
    pub host: Option<&'a str>,
    /// The upstream's `host_header` (wins over `host`).
    pub host_header: Option<&'a str>,
    /// The key header to remove, with any `Authorization: Bearer` (routes that read keys,
    /// unless `forward_key`) but a verified token its issuer forwards.
    pub strip_key: Option<&'a HeaderName>,
    /// Where the verified token to remove is (its issuer has `forward_token = false`).
    pub strip_token: Option<&'a Carrier>,
    /// Headers the caller adds after this (a route's `request_headers`): room is made for
    /// them with floodgate's own, in one reserve.
    pub more_headers: usize,
}

/// Applies the forwarding header policy to the upstream request: the forwarding headers, the
/// normalized target and host, floodgate's identity headers (a client's claims removed) and
/// the client's key removed.
pub fn apply(req: &mut RequestHeader, f: &Forwarded<'_>) -> pingora::Result<()> {
    // Names go in pre-parsed (`header_names`), values are built once (`forwarded_for`, the
    // request id), nothing is inserted that is already there, and the room for what is added
    // is made once: a client's head of few headers would otherwise grow both of Pingora's
    // header maps on each insert. The peer is appended to the chain it sent.
    req.reserve_headers(3 + if f.identity.is_some() { 3 } else { 0 } + f.more_headers)?;
    let xff = forwarded_for(req.headers.get(names::X_FORWARDED_FOR.name()), f.peer);
    names::X_FORWARDED_FOR.set_request(req, xff)?;
    if let Some(target) = f.target {
        // Cloned, not taken: a retry's upstream_peer hashes the normalized path again.
        req.set_uri(target.clone());
    }
    if let Some(host) = f.host_header.or(f.host) {
        req.insert_header(http::header::HOST, host)?;
    }
    let proto = if f.tls { "https" } else { "http" };
    names::X_FORWARDED_PROTO.set_request(req, HeaderValue::from_static(proto))?;
    if !f.request_id.from_client() {
        names::X_REQUEST_ID.set_request(req, f.request_id.header_value().clone())?;
    }
    // Identity headers are ours alone: a client must not be able to claim one. (One pass over
    // the names finds them; three lookups would cost more on every request.)
    let claimed = req
        .headers
        .keys()
        .any(|k| k.as_str().starts_with(IDENTITY_PREFIX));
    if claimed {
        for h in &names::IDENTITY {
            req.remove_header(h.name());
        }
    }
    if let Some(id) = f.identity {
        // Checked to be header values when the config was loaded: these cannot fail.
        names::IDENTITY[0].set_request(req, id.id.header_value().clone())?;
        names::IDENTITY[1].set_request(req, id.user.header_value().clone())?;
        if let Some(plan) = &id.plan {
            names::IDENTITY[2].set_request(req, plan.header_value().clone())?;
        }
    }
    // Every header that can carry a key goes, whichever one authenticated: a client that sends
    // an empty x-api-key beside a Bearer token must not get the token forwarded.
    // A verified token goes on when its issuer forwards tokens (the backend may read its
    // claims); else, like a key, it is removed.
    let token = f.identity.and_then(|i| i.claims.as_deref());
    if let Some(key) = f.strip_key {
        req.remove_header(key);
        if token.is_none_or(|t| !t.forward) && crate::wire::auth::is_bearer(&req.headers) {
            req.remove_header(&http::header::AUTHORIZATION);
        }
    }
    match f.strip_token {
        None => {}
        Some(Carrier::Bearer) => {
            req.remove_header(&http::header::AUTHORIZATION);
        }
        Some(Carrier::Header(name)) => {
            req.remove_header(name);
        }
        Some(Carrier::Cookie(name)) => remove_cookie(req, name)?,
    }
    Ok(())
}

/// Removes cookie `name` from the request's `Cookie` headers, keeping the others.
fn remove_cookie(req: &mut RequestHeader, name: &str) -> pingora::Result<()> {
    let kept: Vec<Vec<u8>> = req
        .headers
        .get_all(http::header::COOKIE)
        .iter()
        .map(|v| {
            let pairs: Vec<&[u8]> = v
                .as_bytes()
                .split(|b| *b == b';')
                .map(<[u8]>::trim_ascii)
                .filter(|p| {
                    !p.is_empty() && p.split(|b| *b == b'=').next() != Some(name.as_bytes())
                })
                .collect();
            pairs.join(&b"; "[..])
        })
        .filter(|v| !v.is_empty())
        .collect();
    req.remove_header(&http::header::COOKIE);
    for v in kept {
        // Made of bytes of a valid header value: always valid.
        if let Ok(v) = HeaderValue::from_bytes(&v) {
            req.append_header(http::header::COOKIE, v)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::auth::HeaderText;

    #[test]
    fn the_claim_check_sees_every_identity_header() {
        for h in &names::IDENTITY {
            assert!(
                h.name().as_str().starts_with(IDENTITY_PREFIX),
                "{:?}",
                h.name()
            );
        }
    }

    #[test]
    fn errors_become_statuses() {
        use ErrorSource::*;
        use ErrorType::*;
        let cases: &[(ErrorType, ErrorSource, u16)] = &[
            (HTTPStatus(503), Internal, 503),
            (ReadTimedout, Downstream, 408),
            (ReadTimedout, Upstream, 504),
            (ConnectTimedout, Upstream, 504),
            (WriteTimedout, Upstream, 504),
            (ConnectRefused, Upstream, 502),
            (TLSHandshakeFailure, Upstream, 502),
            (ReadError, Downstream, 0),
            (ConnectionClosed, Downstream, 0),
            (InvalidHTTPHeader, Downstream, 400),
            (InternalError, Internal, 500),
        ];
        for (etype, source, want) in cases {
            assert_eq!(
                error_status(etype, source, false),
                *want,
                "{etype:?} {source:?}"
            );
            assert_eq!(
                error_status(etype, source, true),
                0,
                "a tunnel is only closed"
            );
        }
    }

    #[test]
    fn connect_failures_retry_idempotent_requests_elsewhere_within_retries() {
        assert!(retry_after_connect_failure(true, 1, 1, true));
        assert!(
            !retry_after_connect_failure(true, 2, 1, true),
            "retries used up"
        );
        assert!(
            !retry_after_connect_failure(false, 1, 1, true),
            "POST is not replayed"
        );
        assert!(
            !retry_after_connect_failure(true, 1, 1, false),
            "no target left"
        );
    }

    #[test]
    fn proxy_errors_retry_only_replayable_requests() {
        let base = ProxyError {
            replayable: true,
            reused: false,
            responded: false,
            etype: &ErrorType::ConnectionClosed,
            attempts: 0,
            retries: 1,
            other_target: true,
        };
        assert_eq!(retry_after_proxy_error(base), ProxyRetry::Another);
        let reused = ProxyError {
            reused: true,
            ..base
        };
        assert_eq!(retry_after_proxy_error(reused), ProxyRetry::SameTarget);
        for no in [
            ProxyError {
                replayable: false,
                ..base
            },
            ProxyError {
                responded: true,
                ..base
            },
            ProxyError {
                etype: &ErrorType::ReadTimedout,
                ..base
            },
            ProxyError {
                attempts: 1,
                ..base
            },
            ProxyError {
                other_target: false,
                ..base
            },
        ] {
            assert_eq!(retry_after_proxy_error(no), ProxyRetry::No, "{no:?}");
        }
    }

    fn request(headers: &[(&str, &str)]) -> RequestHeader {
        let mut r = RequestHeader::build("GET", b"/orders", None).unwrap();
        for (k, v) in headers {
            r.append_header(k.to_string(), *v).unwrap();
        }
        r
    }

    fn values(r: &RequestHeader, name: &str) -> Vec<String> {
        r.headers
            .get_all(name)
            .iter()
            .map(|v| v.to_str().unwrap().to_owned())
            .collect()
    }

    #[test]
    fn identity_is_ours_and_keys_are_stripped() {
        let id = Identity {
            id: HeaderText::new("acme-prod").unwrap(),
            user: HeaderText::new("acme").unwrap(),
            plan: None,
            claims: None,
        };
        let rid = RequestId::default();
        let key = HeaderName::from_static("x-api-key");
        let mut r = request(&[
            ("x-floodgate-plan", "enterprise"),
            ("x-floodgate-user", "someone-else"),
            ("x-api-key", "secret"),
            ("authorization", "Bearer secret2"),
            ("x-forwarded-for", "203.0.113.9"),
        ]);
        let f = Forwarded {
            peer: "10.0.0.1".parse().unwrap(),
            tls: true,
            request_id: &rid,
            identity: Some(&id),
            target: None,
            host: Some("api.example.com"),
            host_header: None,
            strip_key: Some(&key),
            strip_token: None,
            more_headers: 0,
        };
        apply(&mut r, &f).unwrap();
        assert_eq!(values(&r, "x-floodgate-key-id"), ["acme-prod"]);
        assert_eq!(values(&r, "x-floodgate-user"), ["acme"]);
        assert!(
            values(&r, "x-floodgate-plan").is_empty(),
            "a claimed plan is removed"
        );
        assert!(values(&r, "x-api-key").is_empty());
        assert!(values(&r, "authorization").is_empty());
        assert_eq!(values(&r, "x-forwarded-for"), ["203.0.113.9, 10.0.0.1"]);
        assert_eq!(values(&r, "x-forwarded-proto"), ["https"]);
        assert_eq!(values(&r, "host"), ["api.example.com"]);
        assert_eq!(
            values(&r, "x-request-id").len(),
            1,
            "floodgate's own id is sent"
        );
    }

    #[test]
    fn host_header_wins_and_keys_stay_when_forwarded() {
        let rid = RequestId::default();
        let mut r = request(&[("x-api-key", "secret"), ("host", "client.example")]);
        let f = Forwarded {
            peer: "10.0.0.1".parse().unwrap(),
            tls: false,
            request_id: &rid,
            identity: None,
            target: Some(&Uri::from_static("/orders/1")),
            host: Some("absolute.example"),
            host_header: Some("orders.internal"),
            strip_key: None,
            strip_token: None,
            more_headers: 0,
        };
        apply(&mut r, &f).unwrap();
        assert_eq!(values(&r, "host"), ["orders.internal"]);
        assert_eq!(values(&r, "x-api-key"), ["secret"]);
        assert_eq!(values(&r, "x-forwarded-proto"), ["http"]);
        assert_eq!(r.uri.path(), "/orders/1");
    }
}

/// What `[upstreams.protect]` gives a request on its way to `upstream`.
#[derive(Debug)]
pub enum Turn {
    /// The upstream has no `protect`: nothing was done (no lock, no allocation).
    Unguarded,
    /// A slot, held until dropped.
    Go(crate::upstream::protect::Permit),
    /// No turn: answer this 503 (`upstream-overloaded`) instead of forwarding.
    Shed(Box<crate::wire::response::Problem>),
    /// The client went away while the request waited: it left the queue, and nothing is to
    /// be answered or forwarded.
    Left,
}

/// The first step of a turn at `upstream`: nothing to do, a slot at once (one atomic), or a
/// wait in the fair queue ([`queue`]).
pub enum Entry {
    /// The upstream has no `protect`.
    Unguarded,
    /// Below the limit: the slot.
    Go(crate::upstream::protect::Permit),
    /// At the limit: the guard to wait at.
    Queue(std::sync::Arc<crate::upstream::protect::Guard>),
}

/// A turn at `upstream` for `tenant` (its hash and weight, `protect::tenant`) below the limit,
/// or the guard to queue at.
pub fn enter(upstream: &crate::config::Upstream, tenant: (u64, u32)) -> Entry {
    if upstream.settings.protect.is_none() {
        return Entry::Unguarded;
    }
    let Some(guard) = upstream.pool().protect.clone() else {
        return Entry::Unguarded;
    };
    match guard.try_enter(tenant) {
        Some(permit) => Entry::Go(permit),
        None => Entry::Queue(guard),
    }
}

/// A turn at `guard` in fair order as `tenant` of `weight`, or the 503 that refuses one, or
/// [`Turn::Left`] as soon as `gone` (the client went away) completes.
pub async fn queue(
    upstream: &crate::config::Upstream,
    settings: &crate::upstream::settings::Protect,
    guard: &std::sync::Arc<crate::upstream::protect::Guard>,
    (tenant, weight): (u64, u32),
    gone: impl std::future::Future<Output = ()>,
) -> Turn {
    match guard.wait_unless(tenant, weight, gone).await {
        None => Turn::Left,
        Some(Ok(permit)) => Turn::Go(permit),
        Some(Err(why)) => {
            let retry_after = settings.queue_timeout.as_secs_f64().ceil().max(1.0) as u64;
            Turn::Shed(Box::new(
                crate::wire::response::Problem::upstream_overloaded(
                    &upstream.name,
                    why.as_str(),
                    retry_after,
                ),
            ))
        }
    }
}
