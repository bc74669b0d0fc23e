//! Configs a careless operator or a hostile generator writes at scale: more routes or rules
//! than floodgate serves, a keys file of a gigabyte or one that never ends, and ten thousand
//! routes whose prefixes overlap. Each is refused with the count or size and the limit, or
//! served with every request on its own route and rule (docs/hostile-clients.md, "Configs at
//! scale").

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use crate::common::*;

const UPSTREAM: &str = "[[upstreams]]\nname = \"u\"\ntargets = [\"127.0.0.1:9\"]\n\n";

fn rule(name: &str, matcher: &str, limit: usize) -> String {
    format!(
        "[[rules]]\nname = \"{name}\"\nmatch = {{ {matcher} }}\nkey = [\"ip\"]\nalgorithm = \"fixed_window\"\nlimit = {limit}\nwindow = \"1h\"\n\n"
    )
}

/// 10,001 routes, or 10,001 rules, are refused at the first one past the limit, saying how
/// many there are and how many are allowed.
#[test]
fn more_routes_or_rules_than_allowed_are_refused_with_the_count() {
    let mut routes = String::from(UPSTREAM);
    for i in 0..10_001 {
        let _ = write!(
            routes,
            "[[routes]]\nname = \"r{i}\"\nmatch = {{ path_prefix = \"/r{i}\" }}\nupstream = \"u\"\n\n"
        );
    }
    let (ok, _, err) = check(&routes, &[]);
    assert!(!ok);
    // The 10,001st route's name is on line 4 + 10,000 * 5 + 2 (after its header).
    assert!(
        err.contains("gateway.toml:50006:8: 10001 [[routes]]: at most 10000"),
        "{err}"
    );

    let mut rules = format!("{UPSTREAM}[[routes]]\nname = \"r\"\nupstream = \"u\"\n\n");
    for i in 0..10_001 {
        rules.push_str(&rule(&format!("q{i}"), "", 1));
    }
    let (ok, _, err) = check(&rules, &[]);
    assert!(!ok);
    assert!(err.contains("10001 [[rules]]: at most 10000"), "{err}");
}

/// A keys file past 256 MiB is refused from its size, without being read (a sparse file of
/// 1 GiB takes no disk), and one that never ends (`/dev/zero`) is read only up to the limit.
/// The error names the keys file, as written in the config.
#[test]
fn a_gigabyte_or_endless_keys_file_is_refused_unread() {
    let dir = tempfile::tempdir().unwrap();
    let huge = dir.path().join("huge.toml");
    std::fs::File::create(&huge)
        .unwrap()
        .set_len(1 << 30)
        .unwrap();
    let config = |file: &str| {
        format!(
            "[auth]\nkeys_file = \"{file}\"\n\n{UPSTREAM}[[routes]]\nname = \"r\"\nupstream = \"u\"\n"
        )
    };
    let started = Instant::now();
    let (ok, _, err) = check(&config(&huge.display().to_string()), &[]);
    assert!(!ok);
    assert!(
        err.contains("cannot read keys file") && err.contains("holds 1.0 GiB; at most 256 MiB"),
        "{err}"
    );
    let (ok, _, err) = check(&config("/dev/zero"), &[]);
    assert!(!ok);
    assert!(err.contains("at most 256 MiB"), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "refusing took {:?}",
        started.elapsed()
    );
}

/// Ten thousand routes whose prefixes overlap (a hundred services, each with a hundred
/// deeper routes listed before it, most specific first), each with its own rule: `check`
/// passes, and every request is routed and counted as the first matching route says, the
/// last routes as well as the first.
#[test]
fn ten_thousand_overlapping_routes_route_and_count_each_request_as_written() {
    let api = OrdersApi::start("scale-overlap");
    let mut body = format!("{}\n", orders_upstream(&[api.addr]));
    let mut rules = String::new();
    let mut n = 0;
    for service in 0..100 {
        // `/debug/sS/dD` for D = 98..0, then `/debug/sS` itself: all overlap `/debug/sS`.
        for deeper in (0..99).rev() {
            let _ = write!(
                body,
                "[[routes]]\nname = \"s{service}-d{deeper}\"\nmatch = {{ path_prefix = \"/debug/s{service}/d{deeper}\" }}\nupstream = \"orders\"\nauth = \"none\"\n\n"
            );
            rules.push_str(&rule(
                &format!("q{n}"),
                &format!("route = \"s{service}-d{deeper}\""),
                n + 1,
            ));
            n += 1;
        }
        let _ = write!(
            body,
            "[[routes]]\nname = \"s{service}\"\nmatch = {{ path_prefix = \"/debug/s{service}\" }}\nupstream = \"orders\"\nauth = \"none\"\n\n"
        );
        rules.push_str(&rule(
            &format!("q{n}"),
            &format!("route = \"s{service}\""),
            n + 1,
        ));
        n += 1;
    }
    assert_eq!(n, 10_000);
    body.push_str(&rules);
    let (ok, out, err) = check(&body, &[]);
    assert!(ok, "{err}");
    assert!(!out.contains("never sees a request"), "{out}");
    assert!(!out.contains("can never match"), "{out}");
    let gw = Gateway::start(&body);
    let expect = |path: &str, rule: usize| {
        let (status, _) = http_get_headers(gw.addr, path);
        assert_eq!(status.0, 200, "{path}");
        let policy = status.1;
        assert!(
            policy.starts_with(&format!("\"q{rule}\";q={}", rule + 1)),
            "{path}: {policy}"
        );
    };
    expect("/debug/s0/d98/x", 0);
    expect("/debug/s0/d0", 98);
    expect("/debug/s0/other", 99);
    expect("/debug/s99/d0/deeper/still", 9_998);
    expect("/debug/s99", 9_999);
    expect("/debug/s99/d5.json", 9_999 - 6);
    let (status, _) = http_get_headers(gw.addr, "/debug/s100/d0");
    assert_eq!(status.0, 404, "no route");
}

/// `GET path`: (status, the RateLimit-Policy header), and the body.
fn http_get_headers(addr: std::net::SocketAddr, path: &str) -> ((u16, String), String) {
    let text = http_get_raw(addr, path, Duration::from_secs(10)).expect("answer");
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let policy = text
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("ratelimit-policy")
                .then(|| value.trim().to_string())
        })
        .unwrap_or_default();
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    ((status, policy), body)
}

/// Resident memory of a process, in bytes (`VmRSS`).
fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kib| kib * 1024)
}

/// A reload of 100,000 keys leaves one key table in memory, not two: the gateway keeps only
/// the settings of the config it started with, frees the replaced config, and gives what the
/// load used back at once. (The table itself takes about 23 MB: a process holding the old one
/// beside the new would grow by that much.)
#[tokio::test]
async fn reloads_of_a_large_key_table_keep_one_table() {
    use sha2::{Digest, Sha256};
    let mut keys = String::with_capacity(100_000 * 150);
    for i in 0..100_000 {
        let digest = hex::encode(Sha256::digest(format!("secret-{i}").as_bytes()));
        let _ = write!(
            keys,
            "[[keys]]\nid = \"key-{i:06}\"\nsha256 = \"{digest}\"\nuser = \"customer-{}\"\nplan = \"pro\"\n\n",
            i / 3
        );
    }
    let api = OrdersApi::start("scale-reload");
    let body = format!(
        "[auth]\nkeys_file = \"keys.toml\"\n\n{}\n[[routes]]\nname = \"r\"\nmatch = {{ path_prefix = \"/debug\" }}\nupstream = \"orders\"\n",
        orders_upstream(&[api.addr])
    );
    let gw = Gateway::start_with("", &body, &[("keys.toml", &keys)]);
    let c = client();
    let get = |key: &'static str| {
        let c = c.clone();
        let url = gw.url("/debug/x");
        async move {
            c.get(url)
                .header("x-api-key", key)
                .send()
                .await
                .unwrap()
                .status()
        }
    };
    assert_eq!(get("secret-99999").await, 200);
    assert_eq!(get("secret-100000").await, 401);
    let reload = || async {
        let r = c.post(gw.admin_url("/reload")).send().await.unwrap();
        assert_eq!(r.status(), 200);
    };
    // The first reload also frees what the start's load left; measure from after it.
    reload().await;
    let before = rss_bytes(gw.pid());
    for _ in 0..3 {
        reload().await;
    }
    assert_eq!(get("secret-0").await, 200);
    // The replaced config is freed on a blocking thread: give it a moment, no more.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut after = rss_bytes(gw.pid());
    while after > before + (12 << 20) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        after = rss_bytes(gw.pid());
    }
    assert!(
        after <= before + (12 << 20),
        "resident memory grew from {before} to {after} bytes over three reloads"
    );
}
