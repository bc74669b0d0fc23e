//! Requests floodgate makes itself (quota webhooks, JWK Set fetches): a TLS connection to a
//! public server, verified against the Mozilla roots that are compiled in, and one bounded GET.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use tokio_rustls::rustls;

/// A TLS connection to `host` over `tcp`, its certificate verified against the compiled-in
/// Mozilla roots (`webpki-roots`): the same on every machine, whatever the system trusts.
pub async fn tls_connect(
    host: &str,
    tcp: tokio::net::TcpStream,
) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    static CONFIG: LazyLock<Option<Arc<rustls::ClientConfig>>> = LazyLock::new(|| {
        let roots =
            rustls::RootCertStore::from_iter(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .ok()
        .map(|b| Arc::new(b.with_root_certificates(roots).with_no_client_auth()))
    });
    let config = CONFIG
        .clone()
        .ok_or_else(|| std::io::Error::other("no TLS configuration"))?;
    let name = rustls::pki_types::ServerName::try_from(host.to_string())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    tokio_rustls::TlsConnector::from(config)
        .connect(name, tcp)
        .await
}

/// What a GET brought back: a 200's body and its `Cache-Control: max-age`.
#[derive(Debug)]
pub struct Fetched {
    /// The body, at most the cap asked for.
    pub body: Bytes,
    /// `max-age` of the answer's `Cache-Control`, if it has one (`no-store`/`no-cache`: zero).
    pub max_age: Option<Duration>,
}

/// GET `url` (http or https) over a fresh connection: the whole exchange within `timeout`, a
/// body of at most `cap` bytes, status 200 only, no redirect followed. The error says which
/// step failed, never what the body held.
pub async fn get(url: &http::Uri, timeout: Duration, cap: usize) -> Result<Fetched, String> {
    match tokio::time::timeout(timeout, get_inner(url, cap)).await {
        Ok(r) => r,
        Err(_) => Err(format!(
            "no answer within {}",
            crate::text::humantime(timeout)
        )),
    }
}

async fn get_inner(url: &http::Uri, cap: usize) -> Result<Fetched, String> {
    let tls = match url.scheme_str() {
        Some("https") => true,
        Some("http") => false,
        _ => return Err("the URL is not http or https".into()),
    };
    let host = url.host().ok_or("the URL has no host")?;
    let port = url.port_u16().unwrap_or(if tls { 443 } else { 80 });
    let connect_host = host.trim_start_matches('[').trim_end_matches(']');
    let tcp = tokio::net::TcpStream::connect((connect_host, port))
        .await
        .map_err(|e| format!("cannot connect: {e}"))?;
    let authority = url.authority().map_or(host, |a| a.as_str());
    let path = url.path_and_query().map_or("/", |p| p.as_str());
    let req = http::Request::get(path)
        .header(http::header::HOST, authority)
        .header(http::header::USER_AGENT, "floodgate")
        .header(http::header::ACCEPT, "application/json")
        .body(http_body_util::Empty::<Bytes>::new())
        .map_err(|e| format!("cannot build the request: {e}"))?;
    let resp = if tls {
        let stream = tls_connect(connect_host, tcp)
            .await
            .map_err(|e| format!("TLS: {e}"))?;
        send(hyper_util::rt::TokioIo::new(stream), req).await?
    } else {
        send(hyper_util::rt::TokioIo::new(tcp), req).await?
    };
    if resp.status() != http::StatusCode::OK {
        return Err(format!("answered {}", resp.status().as_u16()));
    }
    let max_age = resp
        .headers()
        .get_all(http::header::CACHE_CONTROL)
        .iter()
        .find_map(|v| v.to_str().ok().and_then(max_age));
    let body = http_body_util::Limited::new(resp.into_body(), cap)
        .collect()
        .await
        .map_err(|e| {
            if e.is::<http_body_util::LengthLimitError>() {
                format!("the body is larger than {cap} bytes")
            } else {
                format!("reading the body: {e}")
            }
        })?
        .to_bytes();
    Ok(Fetched { body, max_age })
}

async fn send<IO>(
    io: IO,
    req: http::Request<http_body_util::Empty<Bytes>>,
) -> Result<http::Response<hyper::body::Incoming>, String>
where
    IO: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| format!("HTTP: {e}"))?;
    // The connection is driven beside the request and ends with it (dropped with the body).
    tokio::spawn(async move {
        let _ = conn.await;
    });
    sender
        .send_request(req)
        .await
        .map_err(|e| format!("HTTP: {e}"))
}

/// `max-age` of one `Cache-Control` value; `no-store` and `no-cache` read as zero.
pub fn max_age(value: &str) -> Option<Duration> {
    for directive in value.split(',') {
        let d = directive.trim();
        if d.eq_ignore_ascii_case("no-store") || d.eq_ignore_ascii_case("no-cache") {
            return Some(Duration::ZERO);
        }
        if let Some((name, secs)) = d.split_once('=') {
            if name.trim().eq_ignore_ascii_case("max-age") {
                return secs
                    .trim()
                    .trim_matches('"')
                    .parse()
                    .ok()
                    .map(Duration::from_secs);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_control_gives_its_max_age() {
        assert_eq!(
            max_age("public, max-age=300"),
            Some(Duration::from_secs(300))
        );
        assert_eq!(max_age("max-age=\"60\""), Some(Duration::from_secs(60)));
        assert_eq!(max_age("no-store"), Some(Duration::ZERO));
        assert_eq!(max_age("public"), None);
        assert_eq!(max_age("max-age=x"), None);
    }
}
