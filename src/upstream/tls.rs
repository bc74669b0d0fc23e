//! TLS to upstreams: the PEM files of `ca_file` / `client_cert` / `client_key` (read at load, so
//! a bad file fails `check`), and the `HttpPeer` each attempt connects with.

use std::path::Path;
use std::sync::Arc;

use pingora::protocols::ALPN;
use pingora::upstreams::peer::HttpPeer;
use pingora::utils::tls::{CertKey, WrappedX509};

use super::settings::Settings;
use super::TargetInfo;

/// The DER blocks of `label` (`CERTIFICATE`) in a PEM text.
fn pem_blocks(text: &str, label: &str) -> Result<Vec<Vec<u8>>, String> {
    let begin = format!("-----BEGIN {label}-----");
    let end = format!("-----END {label}-----");
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find(&begin) {
        let after = &rest[start + begin.len()..];
        let stop = after
            .find(&end)
            .ok_or_else(|| format!("a {label} block has no END line"))?;
        out.push(base64(&after[..stop]).ok_or_else(|| format!("a {label} block is not base64"))?);
        rest = &after[stop + end.len()..];
    }
    Ok(out)
}

/// Standard base64 with whitespace ignored (PEM bodies).
fn base64(s: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let mut acc = 0u32;
    let mut bits = 0;
    for c in s.bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            b'=' => break,
            b' ' | b'\n' | b'\r' | b'\t' => continue,
            _ => return None,
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    Some(out)
}

/// The certificates of a PEM file, as trust anchors.
pub fn load_ca(path: &Path) -> Result<Arc<[WrappedX509]>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read: {e}"))?;
    let blocks = pem_blocks(&text, "CERTIFICATE")?;
    if blocks.is_empty() {
        return Err("holds no PEM certificate".into());
    }
    let mut certs = Vec::with_capacity(blocks.len());
    for der in blocks {
        certs.push(wrap(der)?);
    }
    Ok(certs.into())
}

/// Checks a DER certificate with rustls' parser (which returns an error) before handing it to
/// Pingora's `WrappedX509`, whose own parser panics on bad input.
fn wrap(der: Vec<u8>) -> Result<WrappedX509, String> {
    let mut store = pingora::tls::RootCertStore::empty();
    store
        .add(pingora::tls::CertificateDer::from(der.as_slice()))
        .map_err(|e| format!("a certificate cannot be used: {e}"))?;
    Ok(WrappedX509::new(der, pingora::utils::tls::parse_x509))
}

/// A client certificate chain and its key (PEM files), for mTLS.
pub fn load_client(cert: &Path, key: &Path) -> Result<Arc<CertKey>, String> {
    let loaded =
        pingora::tls::load_certs_and_key_files(&cert.to_string_lossy(), &key.to_string_lossy())
            .map_err(|e| format!("cannot load: {e}"))?;
    let Some((certs, key)) = loaded else {
        return Err("needs a PEM certificate and a PEM private key".into());
    };
    for c in &certs {
        wrap(c.to_vec())?;
    }
    Ok(Arc::new(CertKey::new(
        certs.iter().map(|c| c.to_vec()).collect(),
        key.secret_der().to_vec(),
    )))
}

/// The peer one attempt connects to: address, TLS (SNI, verification, trust anchors, client
/// certificate, ALPN) and the timeouts. `read_budget` caps the read timeout so that a single
/// wait cannot outlast the request's total `timeout`. `group_key` keeps each upstream's pooled
/// connections apart: Pingora's reuse key holds neither the trust anchors nor the ALPN, so
/// without it a connection verified against one upstream's `ca_file` could serve another's.
pub fn peer(
    settings: &Settings,
    target: &TargetInfo,
    read_budget: std::time::Duration,
    group_key: u64,
) -> HttpPeer {
    let (tls, sni) = match &settings.tls {
        Some(t) => (
            true,
            t.sni.clone().unwrap_or_else(|| target.host.to_string()),
        ),
        None => (false, String::new()),
    };
    let mut peer = HttpPeer::new(target.addr, tls, sni);
    peer.group_key = group_key;
    let o = &mut peer.options;
    o.connection_timeout = Some(settings.connect_timeout);
    o.read_timeout = Some(settings.read_timeout.min(read_budget));
    o.write_timeout = Some(settings.write_timeout);
    o.idle_timeout = Some(settings.idle_timeout);
    if let Some(t) = &settings.tls {
        o.verify_cert = t.verify;
        o.verify_hostname = t.verify;
        o.ca = t.ca.clone();
        o.alpn = if settings.http2 { ALPN::H2 } else { ALPN::H1 };
        peer.client_cert_key = t.client.clone();
    }
    peer
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_decodes_pem_bodies() {
        assert_eq!(base64("aGVs\nbG8=").unwrap(), b"hello");
        assert_eq!(base64("aGk=").unwrap(), b"hi");
        assert!(base64("a*b").is_none());
    }

    #[test]
    fn pem_blocks_finds_each_certificate() {
        let text = "x\n-----BEGIN CERTIFICATE-----\naGk=\n-----END CERTIFICATE-----\n\
                    -----BEGIN CERTIFICATE-----\naGVsbG8=\n-----END CERTIFICATE-----\n";
        let blocks = pem_blocks(text, "CERTIFICATE").unwrap();
        assert_eq!(blocks, vec![b"hi".to_vec(), b"hello".to_vec()]);
        assert!(pem_blocks("-----BEGIN CERTIFICATE-----\naGk=", "CERTIFICATE").is_err());
    }
}
