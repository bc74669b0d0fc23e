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
    let r = get_with_key(&h2, &url, "test").await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.version(), reqwest::Version::HTTP_2, "ALPN picks h2");
    let h = get_with_key(
        &h2,
        format!("https://localhost:{tls_port}/orders/1"),
        "test",
    )
    .await;
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

/// The first flight of a real TLS client (a ClientHello), as a client that then goes silent
/// would send it.
fn client_hello() -> Vec<u8> {
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
    let mut conn =
        rustls::ClientConnection::new(std::sync::Arc::new(config), "localhost".try_into().unwrap())
            .unwrap();
    let mut hello = Vec::new();
    conn.write_tls(&mut hello).unwrap();
    hello
}

/// Stalled handshakes (silent, half a ClientHello, a ClientHello and then
/// silence) used to be invisible to the caps and live for Pingora's 60 s handshake timeout.
/// They now take a connection slot from accept and end at `header_timeout`.
#[tokio::test]
async fn stalled_handshakes_take_slots_and_end_at_header_timeout() {
    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::time::{Duration, Instant};

    let api = OrdersApi::start("orders-1");
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).expect("cert");
    let tls_port = free_port();
    let extra = format!(
        "header_timeout = \"1s\"\nmax_connections_per_ip = 4\n\n[server.tls]\nlisten = [\"127.0.0.1:{tls_port}\"]\ncert = \"gw.crt\"\nkey = \"gw.key\"\n"
    );
    let body = format!(
        "{}\n[[routes]]\nname = \"orders\"\nmatch = {{ path_prefix = \"/orders\" }}\nupstream = \"orders\"\nauth = \"none\"\n",
        orders_upstream(&[api.addr])
    );
    let gw = Gateway::start_with(
        &extra,
        &body,
        &[
            ("gw.crt", &cert.cert.pem()),
            ("gw.key", &cert.key_pair.serialize_pem()),
        ],
    );
    let tls_addr: std::net::SocketAddr = format!("127.0.0.1:{tls_port}").parse().unwrap();
    let hello = client_hello();
    let c = client();
    let metrics_url = gw.admin_url("/metrics");

    // The start-up probe's connection (from the same IP, to the plain listener) must have
    // come and gone before the four stalls take the per-IP cap.
    probe_connection_gone(&gw).await;
    let started = Instant::now();
    let mut stalls = Vec::new();
    for sent in [&[][..], &hello[..hello.len() / 2], &hello[..], &hello[..]] {
        let mut s = TcpStream::connect(tls_addr).unwrap();
        s.write_all(sent).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        stalls.push(s);
    }
    eventually(Duration::from_secs(10), "the 4 stalls hold slots", || {
        let c = c.clone();
        let url = metrics_url.clone();
        async move {
            let m = get_text(&c, &url).await;
            (metric_value(&m, "floodgate_connections_open") == Some(4.0)).then_some(())
        }
    })
    .await;

    // The fifth from the same IP is over max_connections_per_ip: closed at once, unanswered.
    let mut fifth = TcpStream::connect(tls_addr).unwrap();
    fifth.write_all(&hello).unwrap();
    fifth
        .set_read_timeout(Some(Duration::from_millis(900)))
        .unwrap();
    let mut buf = [0u8; 64];
    assert!(
        matches!(fifth.read(&mut buf), Ok(0) | Err(_)),
        "a connection past the per-IP cap got an answer"
    );
    let m = get_text(&c, &metrics_url).await;
    assert_eq!(
        metric_value(
            &m,
            "floodgate_connections_refused_total{reason=\"max_connections_per_ip\"}"
        ),
        Some(1.0),
        "{m}"
    );
    // Admitted: the probe and the four stalls, not the refused fifth.
    assert_eq!(
        metric_value(&m, "floodgate_connections_total"),
        Some(5.0),
        "{m}"
    );

    // Each stall is closed by the gateway at header_timeout, not after 60 s.
    for (i, s) in stalls.iter_mut().enumerate() {
        let mut sink = Vec::new();
        let _ = s.read_to_end(&mut sink);
        let after = started.elapsed();
        assert!(
            after < Duration::from_secs(8),
            "stall {i} still open after {after:?}"
        );
    }
    assert!(started.elapsed() >= Duration::from_millis(900));
    // Each was closed by its handshake deadline, and counted so.
    eventually(
        Duration::from_secs(5),
        "4 TLS handshake timeouts counted",
        || {
            let c = c.clone();
            let url = metrics_url.clone();
            async move {
                let m = get_text(&c, &url).await;
                (metric_value(&m, "floodgate_connection_timeouts_total{kind=\"tls\"}") == Some(4.0))
                    .then_some(())
            }
        },
    )
    .await;

    // The slots came back: a real client is served.
    let https = reqwest::Client::builder()
        .no_proxy()
        .add_root_certificate(reqwest::Certificate::from_pem(cert.cert.pem().as_bytes()).unwrap())
        .resolve("localhost", tls_addr)
        .build()
        .unwrap();
    let r = https
        .get(format!("https://localhost:{tls_port}/orders/1"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

/// With a low open-file limit, stalled handshakes used to take every descriptor,
/// and then plain clients and the admin `/healthz` timed out. Client connections are now
/// bounded by the limit too (half of it less a reserve), so the admin listener keeps answering.
#[tokio::test]
async fn the_admin_listener_answers_when_stalled_handshakes_fill_the_descriptors() {
    use std::io::Write;
    use std::net::TcpStream;
    use std::os::unix::process::CommandExt;
    use std::time::Duration;

    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).expect("cert");
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("gw.crt"), cert.cert.pem()).unwrap();
    std::fs::write(dir.path().join("gw.key"), cert.key_pair.serialize_pem()).unwrap();
    let (addr, admin, tls_addr) = (free_addr(), free_addr(), free_addr());
    let config = format!(
        "{}\n[server.tls]\nlisten = [\"{tls_addr}\"]\ncert = \"gw.crt\"\nkey = \"gw.key\"\n\n\
         [[upstreams]]\nname = \"orders\"\ntargets = [\"127.0.0.1:9\"]\n\n\
         [[routes]]\nname = \"all\"\nupstream = \"orders\"\nauth = \"none\"\n",
        server_section(addr, admin)
    );
    let path = dir.path().join("gateway.toml");
    std::fs::write(&path, config).unwrap();
    let log = dir.path().join("floodgate.log");
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_floodgate"));
    cmd.arg("-c")
        .arg(&path)
        .arg("--pid-file")
        .arg(dir.path().join("floodgate.pid"))
        .arg("--upgrade-sock")
        .arg(dir.path().join("upgrade.sock"))
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    // SAFETY: setrlimit is async-signal-safe and touches only the child being started.
    unsafe {
        cmd.pre_exec(|| {
            let lim = libc::rlimit {
                rlim_cur: 256,
                rlim_max: 256,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut gw = Spawned {
        child: cmd.spawn().unwrap(),
    };
    wait_for_port(
        admin,
        Duration::from_secs(20),
        &mut gw.child,
        "floodgate admin",
    );
    wait_for_port(
        tls_addr,
        Duration::from_secs(20),
        &mut gw.child,
        "floodgate tls",
    );

    // 300 silent handshakes from one IP: more than the 256 descriptors the process has.
    let mut stalls = Vec::new();
    for _ in 0..300 {
        if let Ok(mut s) = TcpStream::connect_timeout(&tls_addr, Duration::from_secs(2)) {
            let _ = s.write_all(b"\x16\x03\x01");
            stalls.push(s);
        }
    }
    let c = client();
    let metrics_url = format!("http://{admin}/metrics");
    let n = stalls.len() as f64;
    // Every one of them has been accepted: held in a slot or closed past the budget.
    eventually(Duration::from_secs(15), "every stall accepted", || {
        let c = c.clone();
        let url = metrics_url.clone();
        async move {
            let m = get_text(&c, &url).await;
            let open = metric_value(&m, "floodgate_connections_open")?;
            let refused = metric_value(
                &m,
                "floodgate_connections_refused_total{reason=\"max_connections\"}",
            )?;
            (open + refused == n).then_some(())
        }
    })
    .await;
    let healthz = tokio::time::timeout(
        Duration::from_secs(5),
        c.get(format!("http://{admin}/healthz")).send(),
    )
    .await;
    let logs = std::fs::read_to_string(&log).unwrap_or_default();
    let healthz = healthz
        .unwrap_or_else(|_| panic!("/healthz timed out with the listeners full\n{logs}"))
        .unwrap_or_else(|e| panic!("/healthz failed: {e}\n{logs}"));
    assert_eq!(healthz.status(), 200);
    let m = get_text(&c, &metrics_url).await;
    assert_eq!(
        metric_value(&m, "floodgate_connections_open"),
        Some(96.0),
        "(256 - 64) / 2 client connections at most\n{m}"
    );
    assert!(
        logs.contains("allows fewer client connections than max_connections"),
        "{logs}"
    );
    drop(stalls);
}
