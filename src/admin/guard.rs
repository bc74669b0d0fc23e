//! What the admin listener checks before it looks at a request's endpoint: that the request
//! was meant for it (its `Host`), and that a browser did not send it on behalf of another site.
//! Pure functions of the request head, so that unit tests need no socket.
//!
//! Why both: the admin API sends no CORS headers, so a page of another site cannot read its
//! answers, with two exceptions. A DNS-rebinding page (`evil.example` re-resolved to 127.0.0.1)
//! is same-origin with the admin listener as far as the browser knows; its requests carry
//! `Host: evil.example`, which is refused here. And a cross-site form can still *send* a
//! `POST` (it just cannot read the answer); such requests carry `Origin` and
//! `Sec-Fetch-Site`, or a form content type, and are refused whether a token is set or not.

use std::net::IpAddr;

use http::{HeaderMap, Method};

/// The host part of a `Host` value (`name`, `name:port`, `1.2.3.4:port`, `[::1]:port`),
/// lower-cased, without a trailing dot. `None` when it is not one of those forms.
pub fn host_name(host: &str) -> Option<String> {
    let name = if let Some(rest) = host.strip_prefix('[') {
        let (inside, after) = rest.split_once(']')?;
        if !(after.is_empty() || after.strip_prefix(':').is_some_and(is_port)) {
            return None;
        }
        inside.parse::<std::net::Ipv6Addr>().ok()?;
        return Some(inside.to_ascii_lowercase());
    } else {
        match host.rsplit_once(':') {
            Some((name, port)) if is_port(port) => name,
            Some(_) => return None,
            None => host,
        }
    };
    let name = name.strip_suffix('.').unwrap_or(name);
    if name.is_empty() || name.contains(['[', ']', '/', '@', ' ']) {
        return None;
    }
    Some(name.to_ascii_lowercase())
}

fn is_port(p: &str) -> bool {
    !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit())
}

/// Whether the admin listener answers for `host` (the request's `Host`, or its URI authority):
/// an IP literal, `localhost` or a `*.localhost` name (browsers resolve those to loopback
/// themselves, so no DNS answer can rebind them), or a name listed in `admin_hosts`. A request
/// with no host at all (HTTP/1.0) comes from no browser and is answered.
pub fn host_allowed(host: Option<&str>, admin_hosts: &[String]) -> bool {
    let Some(host) = host else {
        return true;
    };
    let Some(name) = host_name(host) else {
        return false;
    };
    name.parse::<IpAddr>().is_ok()
        || name == "localhost"
        || name.ends_with(".localhost")
        || admin_hosts.contains(&name)
}

/// Why a request that changes something (any method but `GET`, `HEAD` and `OPTIONS`) looks
/// sent by a browser for another site, or `None` when it does not. `host` is the request's
/// own `Host`, which an `Origin` must match.
pub fn cross_site(method: &Method, headers: &HeaderMap, host: Option<&str>) -> Option<String> {
    if matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS) {
        return None;
    }
    let text = |name: &str| headers.get(name).map(|v| v.to_str().unwrap_or("?"));
    // Every current browser sends it; "same-site" includes another port of the same host.
    if let Some(site) = text("sec-fetch-site") {
        if site != "same-origin" && site != "none" {
            return Some(format!("Sec-Fetch-Site: {}", shown(site)));
        }
    }
    if let Some(origin) = text("origin") {
        let authority = origin
            .split_once("://")
            .map(|(_, rest)| rest.trim_end_matches('/'));
        let same = match (authority, host) {
            (Some(a), Some(h)) => a.eq_ignore_ascii_case(h),
            _ => false,
        };
        if !same {
            return Some(format!("Origin: {}", shown(origin)));
        }
    }
    // What an HTML form can send (its three enctypes). The admin endpoints take no form body,
    // so this refuses a form even from a browser that sends neither header above.
    if let Some(ct) = text("content-type") {
        let media = ct.split(';').next().unwrap_or("").trim();
        let form = [
            "application/x-www-form-urlencoded",
            "multipart/form-data",
            "text/plain",
        ];
        if form.iter().any(|f| media.eq_ignore_ascii_case(f)) {
            return Some(format!("Content-Type: {}", shown(media)));
        }
    }
    None
}

/// A request value for an error message: short, and only printable ASCII.
pub fn shown(v: &str) -> String {
    let mut s: String = v
        .chars()
        .take(64)
        .map(|c| {
            if c.is_ascii_graphic() || c == ' ' {
                c
            } else {
                '?'
            }
        })
        .collect();
    if v.chars().count() > 64 {
        s.push('…');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_names_and_ports() {
        assert_eq!(
            host_name("Admin.Example:9901").as_deref(),
            Some("admin.example")
        );
        assert_eq!(
            host_name("admin.example.").as_deref(),
            Some("admin.example")
        );
        assert_eq!(host_name("[::1]:9901").as_deref(), Some("::1"));
        assert_eq!(host_name("[::1]").as_deref(), Some("::1"));
        assert_eq!(host_name("10.0.0.1:80").as_deref(), Some("10.0.0.1"));
        for bad in [
            "",
            ":80",
            "[::1",
            "[zz]:1",
            "a:b",
            "a b",
            "user@host",
            "[::1]x",
        ] {
            assert_eq!(host_name(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn only_ip_literals_localhost_and_listed_names_are_answered() {
        let listed = vec!["gateway-1".to_string()];
        for ok in [
            "127.0.0.1:9901",
            "10.1.2.3",
            "[::1]:9901",
            "localhost:9901",
            "LOCALHOST",
            "app.localhost",
            "gateway-1:9901",
        ] {
            assert!(host_allowed(Some(ok), &listed), "{ok}");
        }
        for refused in [
            "evil.example:9901",
            "gateway-2:9901",
            "localhost.evil.example",
            "127.0.0.1.nip.io",
            "x:y",
        ] {
            assert!(!host_allowed(Some(refused), &listed), "{refused}");
        }
        assert!(host_allowed(None, &[]));
    }

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn cross_site_posts_are_recognized() {
        let host = Some("127.0.0.1:9901");
        let post = Method::POST;
        // curl, scripts, and same-origin pages pass.
        assert_eq!(cross_site(&post, &headers(&[]), host), None);
        let same = headers(&[
            ("origin", "http://127.0.0.1:9901"),
            ("sec-fetch-site", "same-origin"),
            ("content-type", "application/json"),
        ]);
        assert_eq!(cross_site(&post, &same, host), None);
        for refused in [
            headers(&[("sec-fetch-site", "cross-site")]),
            headers(&[("sec-fetch-site", "same-site")]),
            headers(&[("origin", "http://127.0.0.1:8000")]),
            headers(&[("origin", "null")]),
            headers(&[("content-type", "application/x-www-form-urlencoded")]),
            headers(&[("content-type", "multipart/form-data; boundary=x")]),
            headers(&[("content-type", "Text/Plain;charset=utf-8")]),
        ] {
            assert!(cross_site(&post, &refused, host).is_some(), "{refused:?}");
        }
        // Reading is not changing: GET passes whatever it carries (the Host check guards it).
        let cross = headers(&[("sec-fetch-site", "cross-site"), ("origin", "http://x")]);
        assert_eq!(cross_site(&Method::GET, &cross, host), None);
    }
}
