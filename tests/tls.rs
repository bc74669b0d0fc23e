//! TLS termination with a certificate the test generates: HTTPS served, HTTP/2 negotiated by
//! ALPN, HTTP/1.1 still possible.

mod common;

use common::*;

#[tokio::test]
async fn https_with_h2_by_alpn() {
    let api = OrdersApi::start("orders-1");
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).expect("cert");
    let cert_pem = cert.cert.pem();
    let key_pem = cert.key_pair.serialize_pem();
    let tls_port = free_port();
    let tls = format!("\n[server.tls]\nlisten = [\"127.0.0.1:{tls_port}\"]\ncert = \"gw.crt\"\nkey = \"gw.key\"\n");
    let body = format!(
        "{DEMO_KEYS}\n{}\n[[routes]]\nname = \"orders\"\nmatch = {{ path_prefix = \"/orders\" }}\nupstream = \"orders\"\n",
        orders_upstream(&[api.addr])
    );
    let gw = Gateway::start_with(&tls, &body, &[("gw.crt", &cert_pem), ("gw.key", &key_pem)]);
    let tls_addr: std::net::SocketAddr = format!("127.0.0.1:{tls_port}").parse().unwrap();
    let root = reqwest::Certificate::from_pem(cert_pem.as_bytes()).unwrap();
    let url = format!("https://localhost:{tls_port}/orders/1");

    let h2 = reqwest::Client::builder()
        .no_proxy()
        .add_root_certificate(root.clone())
        .resolve("localhost", tls_addr)
        .build()
        .unwrap();
    let r = h2
        .get(&url)
        .header("x-api-key", "test")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.version(), reqwest::Version::HTTP_2, "ALPN picks h2");
    let h = h2
        .get(format!("https://localhost:{tls_port}/orders/1"))
        .header("x-api-key", "test")
        .send()
        .await
        .unwrap();
    assert_eq!(h.status(), 200);

    let h1 = reqwest::Client::builder()
        .no_proxy()
        .add_root_certificate(root)
        .resolve("localhost", tls_addr)
        .http1_only()
        .build()
        .unwrap();
    let r = h1.get(&url).send().await.unwrap();
    assert_eq!(r.version(), reqwest::Version::HTTP_11);
    assert_eq!(r.status(), 401, "auth applies on TLS too");

    // The plain listener keeps working beside TLS.
    let r = client()
        .get(gw.url("/orders/1"))
        .header("x-api-key", "test")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

#[tokio::test]
async fn forwarded_proto_is_https_behind_tls() {
    let api = OrdersApi::start("orders-1");
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).expect("cert");
    let tls_port = free_port();
    let tls = format!("\n[server.tls]\nlisten = [\"127.0.0.1:{tls_port}\"]\ncert = \"gw.crt\"\nkey = \"gw.key\"\n");
    let body = format!(
        "{}\n[[routes]]\nname = \"debug\"\nmatch = {{ path_prefix = \"/debug\" }}\nupstream = \"orders\"\nauth = \"none\"\n",
        orders_upstream(&[api.addr])
    );
    let _gw = Gateway::start_with(
        &tls,
        &body,
        &[
            ("gw.crt", &cert.cert.pem()),
            ("gw.key", &cert.key_pair.serialize_pem()),
        ],
    );
    let c = reqwest::Client::builder()
        .no_proxy()
        .add_root_certificate(reqwest::Certificate::from_pem(cert.cert.pem().as_bytes()).unwrap())
        .resolve(
            "localhost",
            format!("127.0.0.1:{tls_port}").parse().unwrap(),
        )
        .build()
        .unwrap();
    let v: serde_json::Value =
        get_json(&c, format!("https://localhost:{tls_port}/debug/headers")).await;
    assert_eq!(v["headers"]["x-forwarded-proto"], "https");
}
