//! How floodgate's rate-limit service is served: on `[rls] threads` runtime threads (not the
//! one thread of a Pingora background service), over TLS with `[rls] tls`, and stopped with the
//! rest of the process. The real binary, tonic clients on Envoy's protos.

mod common;

use std::time::{Duration, Instant};

use common::rls::{ask, descriptor, request, RlsGateway};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;

const OK: i32 = Code::Ok as i32;

/// One local limit that admits everything the tests send.
const ROOMY: &str = "[[rls.limits]]\nname = \"per-user\"\ndomain = \"edge\"\ndescriptor = [{ key = \"user\" }]\nalgorithm = \"token_bucket\"\nlimit = 1000000000\nwindow = \"1s\"\nscope = \"local\"\n";

/// The CPU time (ns, from `/proc/PID/task/TID/schedstat`) of each thread of `pid` named
/// `name`.
fn thread_cpu(pid: u32, name: &str) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).expect("/proc tasks") {
        let path = task.expect("task").path();
        let comm = std::fs::read_to_string(path.join("comm")).unwrap_or_default();
        if comm.trim() != name {
            continue;
        }
        let stat = std::fs::read_to_string(path.join("schedstat")).unwrap_or_default();
        let ns = stat
            .split_whitespace()
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        let tid = path.file_name().unwrap().to_string_lossy().into_owned();
        out.push((tid, ns));
    }
    out.sort();
    out
}

/// `calls` ShouldRateLimit calls over `connections` connections with `streams` in flight on
/// each, bounded by `limit` too; returns how many were answered OK.
async fn load(
    gw: &RlsGateway,
    connections: usize,
    streams: usize,
    calls: usize,
    limit: Duration,
) -> usize {
    let deadline = Instant::now() + limit;
    let mut tasks = Vec::new();
    for conn in 0..connections {
        let client = gw.client().await;
        for s in 0..streams {
            let mut c = client.clone();
            let per_task = calls / (connections * streams);
            tasks.push(tokio::spawn(async move {
                let mut ok = 0;
                for i in 0..per_task {
                    if Instant::now() > deadline {
                        break;
                    }
                    let user = format!("u{conn}-{s}-{}", i % 4);
                    let r = ask(
                        &mut c,
                        request("edge", vec![descriptor(&[("user", &user)])]),
                    )
                    .await;
                    ok += usize::from(r.overall_code == OK);
                }
                ok
            }));
        }
    }
    let mut ok = 0;
    for t in tasks {
        ok += t.await.expect("load task");
    }
    ok
}

#[tokio::test]
async fn the_service_answers_on_rls_threads_threads_and_stops_on_sigterm() {
    let mut gw = RlsGateway::start(&format!("threads = 2\n\n{ROOMY}"));
    // The port accepts (bound at build) before the service's runtime starts: counted once a
    // call is answered.
    let mut first = gw.client().await;
    let r = ask(
        &mut first,
        request("edge", vec![descriptor(&[("user", "x")])]),
    )
    .await;
    assert_eq!(r.overall_code, OK);
    let before = thread_cpu(gw.pid(), "floodgate-rls");
    assert_eq!(
        before.len(),
        2,
        "[rls] threads = 2: two runtime threads of the service: {before:?}"
    );
    let calls = 6_400;
    let ok = load(&gw, 8, 8, calls, Duration::from_secs(60)).await;
    assert_eq!(ok, calls, "every call answered OK within the bound");
    let after = thread_cpu(gw.pid(), "floodgate-rls");
    let used: Vec<u64> = after
        .iter()
        .zip(&before)
        .map(|((_, a), (_, b))| a.saturating_sub(*b))
        .collect();
    let total: u64 = used.iter().sum();
    assert!(total > 0, "{used:?}");
    // Both threads answered a real share of the load (work stealing spreads Envoy's streams),
    // not only the one a Pingora background service runs on.
    for u in &used {
        assert!(
            *u * 20 >= total,
            "a service thread did less than 5% of the work: {used:?} ns"
        );
    }

    // A reload that changes threads keeps serving and says it waits for a restart.
    let path = gw.config_path();
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(
        &path,
        text.replace("threads = 2\n\n[[rls", "threads = 1\n\n[[rls"),
    )
    .unwrap();
    common::eventually(
        Duration::from_secs(10),
        "the reload names rls.threads",
        || {
            let url = gw.admin_url("/readyz");
            async move {
                let body = reqwest::get(url).await.ok()?.text().await.ok()?;
                body.contains("rls.threads").then_some(())
            }
        },
    )
    .await;
    let mut c = gw.client().await;
    let r = ask(&mut c, request("edge", vec![descriptor(&[("user", "x")])])).await;
    assert_eq!(r.overall_code, OK);
    assert_eq!(thread_cpu(gw.pid(), "floodgate-rls").len(), 2);

    common::send_signal(gw.pid(), "TERM");
    assert!(
        gw.wait_exit(Duration::from_secs(15)).is_some(),
        "still running after SIGTERM"
    );
    assert!(
        std::net::TcpStream::connect(gw.rls).is_err(),
        "the rls listener outlived the process"
    );
}

#[tokio::test]
async fn rls_threads_default_to_the_servers() {
    // RlsGateway's [server] has threads = 1.
    let gw = RlsGateway::start(ROOMY);
    let mut c = gw.client().await;
    let r = ask(&mut c, request("edge", vec![descriptor(&[("user", "x")])])).await;
    assert_eq!(r.overall_code, OK);
    // Counted once a call is answered: the port accepts (bound at build) before the service's
    // runtime is started.
    assert_eq!(thread_cpu(gw.pid(), "floodgate-rls").len(), 1);
}

/// A self-signed certificate for `localhost`: (certificate PEM, key PEM).
fn self_signed() -> (String, String) {
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).expect("cert");
    (cert.cert.pem(), cert.key_pair.serialize_pem())
}

#[tokio::test]
async fn rls_tls_serves_grpc_over_tls_with_the_listeners_keys() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let files = tempfile::tempdir().unwrap();
    let (cert, key) = self_signed();
    let cert_path = files.path().join("rls.crt");
    let key_path = files.path().join("rls.key");
    std::fs::write(&cert_path, &cert).unwrap();
    std::fs::write(&key_path, &key).unwrap();
    let gw = RlsGateway::start(&format!(
        "tls = {{ cert = \"{}\", key = \"{}\" }}\n\n{ROOMY}",
        cert_path.display(),
        key_path.display()
    ));
    let tls = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(&cert))
        .domain_name("localhost");
    let channel = tonic::transport::Channel::from_shared(format!("https://{}", gw.rls))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
        .expect("a TLS connection to the rate-limit service");
    let mut c = RateLimitServiceClient::new(channel);
    for _ in 0..3 {
        let r = ask(
            &mut c,
            request("edge", vec![descriptor(&[("user", "alice")])]),
        )
        .await;
        assert_eq!(r.overall_code, OK);
        assert_eq!(
            r.statuses[0].current_limit.as_ref().unwrap().name,
            "per-user"
        );
    }
    // Cleartext HTTP/2 to the TLS listener is not answered.
    let plain = RateLimitServiceClient::connect(format!("http://{}", gw.rls)).await;
    if let Ok(mut plain) = plain {
        let r = tokio::time::timeout(
            Duration::from_secs(10),
            plain.should_rate_limit(request("edge", vec![descriptor(&[("user", "bob")])])),
        )
        .await;
        assert!(
            !matches!(r, Ok(Ok(_))),
            "a cleartext call was answered on the TLS listener"
        );
    }
    assert!(
        gw.logs().contains("scheme=\"TLS\"") || gw.logs().contains("scheme=TLS"),
        "{}",
        gw.logs()
    );
}

#[test]
fn an_rls_key_that_does_not_load_fails_the_start_and_is_not_shown() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, _) = self_signed();
    std::fs::write(dir.path().join("rls.crt"), cert).unwrap();
    let secret = "c2VjcmV0LWtleS1ieXRlcy1uZXZlci1zaG93bg";
    std::fs::write(
        dir.path().join("rls.key"),
        format!("-----BEGIN PRIVATE KEY-----\n{secret}\n-----END PRIVATE KEY-----\n"),
    )
    .unwrap();
    let (rls, admin) = (common::free_addr(), common::free_addr());
    let config = dir.path().join("gateway.toml");
    std::fs::write(
        &config,
        format!("[server]\nadmin_listen = \"{admin}\"\nthreads = 1\n\n[rls]\nlisten = \"{rls}\"\ntls = {{ cert = \"rls.crt\", key = \"rls.key\" }}\n\n{ROOMY}"),
    )
    .unwrap();
    let log = dir.path().join("floodgate.log");
    let mut child = common::spawn_floodgate(&config, dir.path(), &log, &[]);
    let status = common::wait_exit(&mut child, Duration::from_secs(30));
    if status.is_none() {
        common::stop(&mut child);
    }
    let logs = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(status.and_then(|s| s.code()), Some(2), "{logs}");
    assert!(
        logs.contains("cannot load TLS certificate or key"),
        "{logs}"
    );
    assert!(!logs.contains(secret), "the key's bytes were shown: {logs}");
    assert!(std::net::TcpStream::connect(rls).is_err());
}

#[tokio::test]
async fn upgrade_hands_the_grpc_socket_over_without_failing_a_call() {
    let mut old = RlsGateway::start(ROOMY);
    let dir = old.dir.path().to_path_buf();
    let addr = old.rls;
    // Calls on fresh connections, back to back, until told to stop (at most two minutes): what
    // an upgrade must not break is accepting connections (a client on an old connection is
    // sent GOAWAY when the old process stops, and reconnects).
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let ok = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let load = {
        let (stop, ok) = (stop.clone(), ok.clone());
        tokio::spawn(async move {
            let mut failures = Vec::new();
            let deadline = Instant::now() + Duration::from_secs(120);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && Instant::now() < deadline {
                let call = async {
                    let mut c = RateLimitServiceClient::connect(format!("http://{addr}"))
                        .await
                        .map_err(|e| format!("connect: {e}"))?;
                    c.should_rate_limit(request("edge", vec![descriptor(&[("user", "u")])]))
                        .await
                        .map_err(|e| format!("call: {e}"))
                        .map(|r| r.into_inner().overall_code)
                };
                match call.await {
                    Ok(OK) => {
                        ok.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    Ok(code) => failures.push(format!("code {code}")),
                    Err(e) => failures.push(e),
                }
            }
            failures
        })
    };
    let ok_now = || ok.load(std::sync::atomic::Ordering::Relaxed);
    let wait_ok = |n: usize, what: &'static str| {
        let ok = ok.clone();
        async move {
            let start = Instant::now();
            while ok.load(std::sync::atomic::Ordering::Relaxed) < n {
                assert!(
                    start.elapsed() < Duration::from_secs(30),
                    "{what}: stuck below {n} calls"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    };
    wait_ok(20, "before the upgrade").await;

    let config = old.config_path();
    let common::upgrade::HandedOver {
        mut new,
        new_log,
        old_status: status,
    } = common::upgrade::hand_over(&mut old, &config, &dir).await;
    assert!(status.success(), "old exit status {status}\n{}", old.logs());

    let after = ok_now();
    wait_ok(after + 40, "after the upgrade").await;
    assert!(
        new.child.try_wait().unwrap().is_none(),
        "the new process exited: {}",
        std::fs::read_to_string(&new_log).unwrap_or_default()
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let failures = load.await.unwrap();
    let new_logs = std::fs::read_to_string(&new_log).unwrap_or_default();
    assert!(
        failures.is_empty(),
        "{} calls failed during the upgrade: {failures:?}\nold:\n{}\nnew:\n{new_logs}",
        failures.len(),
        old.logs()
    );
    assert!(new_logs.contains("socket taken over"), "{new_logs}");
}
