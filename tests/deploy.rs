//! Static checks of what cannot be run on a machine without a Docker engine or a Kubernetes
//! cluster: the Dockerfile, the compose stack and the Kubernetes manifests parse, refer to
//! images, files, services and ports that exist, agree with each other on ports, and the
//! gateway.toml files they mount pass `floodgate check`.
//!
//! Host names of compose services and Kubernetes Services only resolve inside those networks,
//! and `floodgate check` resolves upstream targets; so before checking, every `"NAME:PORT"`
//! whose NAME is a service of the stack is replaced by `"127.0.0.1:PORT"`, and the test prints
//! what it replaced.
//!
//! The two gateway configs are also run for real on loopback (free ports, a real
//! `redis-server`, a token file), to show that the probes and health checks declared by the
//! manifests answer without the admin token while the admin API needs it.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use floodgate::config::duration::parse_duration;
use serde::Deserialize;
use serde_yaml::Value;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every YAML document of `path` (a file may hold several, separated by `---`).
fn yaml_docs(path: &Path) -> Vec<Value> {
    let text = read(path);
    serde_yaml::Deserializer::from_str(&text)
        .map(|doc| Value::deserialize(doc).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
        .filter(|v| !v.is_null())
        .collect()
}

/// `v[a][b]...` for a dotted path, panicking with the path when a step is missing.
fn at<'a>(v: &'a Value, path: &str) -> &'a Value {
    let mut cur = v;
    for step in path.split('.') {
        cur = match step.parse::<usize>() {
            Ok(i) => cur.get(i),
            Err(_) => cur.get(step),
        }
        .unwrap_or_else(|| panic!("missing `{path}` (at `{step}`)"));
    }
    cur
}

fn text<'a>(v: &'a Value, path: &str) -> &'a str {
    at(v, path)
        .as_str()
        .unwrap_or_else(|| panic!("`{path}` is not a string"))
}

fn seq<'a>(v: &'a Value, path: &str) -> &'a Vec<Value> {
    at(v, path)
        .as_sequence()
        .unwrap_or_else(|| panic!("`{path}` is not a list"))
}

fn int(v: &Value, path: &str) -> u64 {
    at(v, path)
        .as_u64()
        .unwrap_or_else(|| panic!("`{path}` is not a whole number"))
}

/// A gateway.toml's `[server]` and `[store]` values that the deployment files must agree with.
struct Facts {
    listen_port: u16,
    admin: SocketAddr,
    grace: Duration,
    trusted: Vec<ipnet::IpNet>,
    store_backend: String,
    store_host: String,
    upstream_hosts: Vec<(String, u16)>,
}

fn facts(config: &str) -> Facts {
    let t: toml::Table = config.parse().expect("gateway.toml is TOML");
    let server = t["server"].as_table().expect("[server]");
    let listen = server["listen"].as_array().expect("server.listen");
    assert_eq!(listen.len(), 1, "one plain listener");
    let listen: SocketAddr = listen[0].as_str().unwrap().parse().unwrap();
    let admin: SocketAddr = server["admin_listen"]
        .as_str()
        .expect("admin_listen is set: the default is loopback, unreachable from outside")
        .parse()
        .unwrap();
    let grace = parse_duration(server["grace_period"].as_str().expect("grace_period")).unwrap();
    let trusted = server
        .get("trusted_proxies")
        .and_then(toml::Value::as_array)
        .into_iter()
        .flatten()
        .map(|c| c.as_str().unwrap().parse().unwrap())
        .collect();
    let store = t["store"].as_table().expect("[store]");
    // "" for the memory store.
    let store_host = store
        .get("url")
        .and_then(toml::Value::as_str)
        .unwrap_or_default()
        .trim_start_matches("redis://")
        .split([':', '/'])
        .next()
        .unwrap()
        .to_string();
    let upstream_hosts = t["upstreams"]
        .as_array()
        .expect("[[upstreams]]")
        .iter()
        .flat_map(|u| u["targets"].as_array().unwrap().iter())
        .map(|target| {
            let (host, port) = target.as_str().unwrap().rsplit_once(':').unwrap();
            (host.to_string(), port.parse().unwrap())
        })
        .collect();
    Facts {
        listen_port: listen.port(),
        admin,
        grace,
        trusted,
        store_backend: store["backend"].as_str().unwrap_or("memory").to_string(),
        store_host,
        upstream_hosts,
    }
}

/// Runs `floodgate check` on `config` (with `files` beside it, in subfolders when their names
/// say so) after replacing every `"NAME:` of a service in `services` by `"127.0.0.1:`, which it
/// reports.
fn check_with_local_hosts(what: &str, config: &str, files: &[(&str, &str)], services: &[&str]) {
    let local = local_hosts(what, config, services);
    let dir = tempfile::tempdir().unwrap();
    write_files(
        dir.path(),
        &[&[("gateway.toml", local.as_str())], files].concat(),
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_floodgate"))
        .arg("check")
        .arg("-c")
        .arg(dir.path().join("gateway.toml"))
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.success(),
        "{what} fails `floodgate check`:\n{stderr}\n{stdout}"
    );
    assert!(
        !format!("{stdout}{stderr}").contains("no admin token"),
        "{what}: {stdout}{stderr}"
    );
    print!("{what}: {stdout}");
}

/// Writes `files` (names relative to `dir`, subfolders created).
fn write_files(dir: &Path, files: &[(&str, &str)]) {
    for (name, content) in files {
        let path = dir.join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, content).unwrap();
    }
}

/// `config` with every `"NAME:PORT"` of a service in `services` replaced by `"127.0.0.1:PORT"`.
fn local_hosts(what: &str, config: &str, services: &[&str]) -> String {
    let mut local = config.to_string();
    for name in services {
        let from = format!("\"{name}:");
        let mut replaced = false;
        let mut out = String::new();
        let mut rest = local.as_str();
        while let Some(i) = rest.find(&from) {
            let after = &rest[i + from.len()..];
            out.push_str(&rest[..i]);
            // Only "NAME:PORT", never a URL such as "redis://redis:6379".
            if after.starts_with(|c: char| c.is_ascii_digit()) {
                out.push_str("\"127.0.0.1:");
                replaced = true;
            } else {
                out.push_str(&from);
            }
            rest = after;
        }
        out.push_str(rest);
        local = out;
        if replaced {
            println!(
                "{what}: checking with \"{name}:PORT\" replaced by \"127.0.0.1:PORT\" \
                 (a service name resolves only inside its stack)"
            );
        }
    }
    local
}

// ---- Dockerfile -------------------------------------------------------------------------------

#[test]
fn dockerfile_builds_both_binaries_into_a_small_non_root_image() {
    let dockerfile = read(&repo().join("deploy/Dockerfile"));
    let lines: Vec<&str> = dockerfile
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#'))
        .collect();
    let from: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| l.starts_with("FROM "))
        .collect();
    assert_eq!(from.len(), 2, "multi-stage: a build and a runtime stage");
    assert!(from[0].starts_with("FROM rust:") && from[0].contains(" AS build"));
    assert!(from[1].starts_with("FROM debian:") && from[1].contains("-slim"));
    assert!(dockerfile.contains("install -y --no-install-recommends cmake"));
    assert!(dockerfile.contains("ca-certificates"));

    // Both binaries exist in Cargo.toml and are built and installed.
    let cargo: toml::Table = read(&repo().join("Cargo.toml")).parse().unwrap();
    let bins: BTreeSet<&str> = cargo["bin"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["name"].as_str().unwrap())
        .collect();
    for bin in ["floodgate", "orders-api"] {
        assert!(bins.contains(bin), "Cargo.toml has no [[bin]] {bin}");
        assert!(dockerfile.contains(&format!("--bin {bin}")));
        assert!(dockerfile.contains(&format!("target/release/{bin}")));
    }
    assert!(dockerfile.contains("/usr/local/bin/"));
    assert!(dockerfile.contains(r#"ENTRYPOINT ["/usr/local/bin/floodgate"]"#));
    assert!(dockerfile.contains(r#"CMD ["-c", "/etc/floodgate/gateway.toml"]"#));

    // Files copied from the context exist, and .dockerignore keeps the context small.
    assert!(dockerfile.contains("COPY gateway.toml /etc/floodgate/gateway.toml"));
    assert!(repo().join("gateway.toml").is_file());
    let ignore = read(&repo().join(".dockerignore"));
    for entry in ["target/", ".git/"] {
        assert!(
            ignore.lines().any(|l| l.trim() == entry),
            ".dockerignore lacks {entry}"
        );
    }
    for needed in ["src/", "Cargo.toml", "Cargo.lock", "lua/", "gateway.toml"] {
        assert!(
            !ignore.lines().any(|l| l.trim() == needed),
            ".dockerignore must not drop {needed}"
        );
    }

    // Runs as a non-root numeric user; ports and health check match the shipped config.
    let user = lines
        .iter()
        .rev()
        .find_map(|l| l.strip_prefix("USER "))
        .expect("USER");
    let uid = user.split(':').next().unwrap();
    assert!(uid.parse::<u32>().is_ok_and(|u| u != 0), "USER {user}");
    let shipped = facts(&read(&repo().join("gateway.toml")));
    let expose = lines
        .iter()
        .find_map(|l| l.strip_prefix("EXPOSE "))
        .expect("EXPOSE");
    let exposed: BTreeSet<u16> = expose
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    assert_eq!(
        exposed,
        BTreeSet::from([shipped.listen_port, shipped.admin.port()])
    );
    assert!(dockerfile.contains(&format!(
        "http://127.0.0.1:{}/healthz",
        shipped.admin.port()
    )));
    assert!(lines.iter().any(|l| l.starts_with("HEALTHCHECK ")));
    assert!(
        dockerfile.contains("curl"),
        "the health check needs curl in the image"
    );
}

// ---- docker compose ---------------------------------------------------------------------------

/// The `source:target[:mode]` volumes of a compose service (short syntax).
fn volumes(service: &Value) -> Vec<(String, String, Option<String>)> {
    service
        .get("volumes")
        .and_then(Value::as_sequence)
        .into_iter()
        .flatten()
        .map(|v| {
            let spec = v.as_str().expect("short volume syntax");
            let mut parts = spec.split(':');
            let source = parts.next().unwrap().to_string();
            let target = parts.next().expect("a target path").to_string();
            (source, target, parts.next().map(str::to_string))
        })
        .collect()
}

/// `host:container[:mode]` bind mounts of a compose service, sources resolved against deploy/.
fn binds(service: &Value) -> Vec<(PathBuf, String)> {
    volumes(service)
        .into_iter()
        // A source without a slash is a named volume.
        .filter(|(source, _, _)| source.contains('/'))
        .map(|(host, target, _)| {
            assert!(
                host.starts_with("./"),
                "bind mounts are relative to deploy/: {host}"
            );
            (repo().join("deploy").join(host), target)
        })
        .collect()
}

/// `(volume, target, read-only)` of the named volumes a compose service mounts.
fn named_volumes(service: &Value) -> Vec<(String, String, bool)> {
    volumes(service)
        .into_iter()
        .filter(|(source, _, _)| !source.contains('/'))
        .map(|(name, target, mode)| (name, target, mode.as_deref() == Some("ro")))
        .collect()
}

/// The condition a compose service waits for before it starts after `other`.
fn start_condition<'a>(service: &'a Value, other: &str) -> Option<&'a str> {
    service
        .get("depends_on")?
        .get(other)?
        .get("condition")?
        .as_str()
}

/// `[host_ip:]host:container` port mappings of a compose service: (host, container).
fn published(service: &Value) -> Vec<(u16, u16)> {
    service
        .get("ports")
        .and_then(Value::as_sequence)
        .into_iter()
        .flatten()
        .map(|p| {
            let spec = p.as_str().expect("ports as strings");
            let parts: Vec<&str> = spec.rsplitn(3, ':').collect();
            (parts[1].parse().unwrap(), parts[0].parse().unwrap())
        })
        .collect()
}

#[test]
fn compose_stack_is_consistent_and_its_config_passes_check() {
    let docs = yaml_docs(&repo().join("deploy/docker-compose.yml"));
    assert_eq!(docs.len(), 1);
    let compose = &docs[0];
    let services = at(compose, "services").as_mapping().expect("services");
    let names: BTreeSet<&str> = services.keys().map(|k| k.as_str().unwrap()).collect();
    let expected = [
        "redis",
        "orders-api",
        "gateway-1",
        "gateway-2",
        "lb",
        "prometheus",
    ];
    for name in expected {
        assert!(names.contains(name), "no service {name}");
    }
    let service = |name: &str| at(compose, &format!("services.{name}"));

    // Every service has an image; those built here build deploy/Dockerfile from the root.
    for (name, svc) in services {
        assert!(svc.get("image").is_some(), "{name:?} has no image");
        if let Some(build) = svc.get("build") {
            let context = repo().join("deploy").join(text(build, "context"));
            assert_eq!(
                context.canonicalize().unwrap(),
                repo().canonicalize().unwrap()
            );
            assert!(context.join(text(build, "dockerfile")).is_file());
        }
        // depends_on names services that exist.
        if let Some(deps) = svc.get("depends_on") {
            let deps: Vec<&str> = match deps {
                Value::Sequence(s) => s.iter().map(|d| d.as_str().unwrap()).collect(),
                Value::Mapping(m) => m.keys().map(|d| d.as_str().unwrap()).collect(),
                other => panic!("depends_on: {other:?}"),
            };
            for d in deps {
                assert!(names.contains(d), "{name:?} depends on unknown {d}");
            }
        }
        // Every bind-mounted file exists.
        for (host, _) in binds(svc) {
            assert!(host.is_file(), "{name:?} mounts missing {}", host.display());
        }
    }
    assert_eq!(
        text(service("gateway-1"), "image"),
        text(service("orders-api"), "image")
    );
    let redis_cmd: Vec<&str> = seq(service("redis"), "command")
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert!(redis_cmd
        .windows(2)
        .any(|w| w == ["--maxmemory-policy", "noeviction"]));
    assert!(text(service("redis"), "image").starts_with("redis:7"));
    let orders_cmd: Vec<&str> = seq(service("orders-api"), "command")
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    let orders_listen: SocketAddr = orders_cmd
        [orders_cmd.iter().position(|a| *a == "--listen").unwrap() + 1]
        .parse()
        .unwrap();

    // Both gateways mount the same config read-only at the documented path.
    let config_path = repo().join("deploy/compose/gateway.toml");
    for gw in ["gateway-1", "gateway-2"] {
        let mounts = binds(service(gw));
        assert!(
            mounts
                .iter()
                .any(|(host, target)| *host == config_path
                    && target == "/etc/floodgate/gateway.toml"),
            "{gw} does not mount compose/gateway.toml at /etc/floodgate/gateway.toml"
        );
        let spec = seq(service(gw), "volumes")[0].as_str().unwrap();
        assert!(spec.ends_with(":ro"), "{gw}: {spec} is not read-only");
    }
    let config = read(&config_path);
    let f = facts(&config);
    assert_eq!(f.store_backend, "redis");

    // The admin API is open to the compose network, so it needs a token, and the stack makes
    // its own: none is in the repository, no two stacks share one.
    let token_file = token_file(&config).expect("admin_listen is not loopback: admin_token_file");
    let token_in_gateways = Path::new("/etc/floodgate").join(&token_file);
    let maker = service("admin-token");
    let made = match &named_volumes(maker)[..] {
        [(volume, dir, false)] => (volume.clone(), Path::new(dir).join("admin-token")),
        other => panic!("admin-token mounts one volume, writable: {other:?}"),
    };
    let script: Vec<&str> = seq(maker, "command")
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    let script = script.join(" ");
    let made_path = made.1.display().to_string();
    assert!(
        script.contains("/dev/urandom") && script.contains(&format!("> {made_path}")),
        "admin-token writes a random token to {made_path}: {script}"
    );
    assert!(
        script.contains(&format!("test -s {made_path} ||")),
        "a volume that holds a token keeps it: {script}"
    );
    assert!(
        at(compose, "volumes").get(made.0.as_str()).is_some(),
        "volume {} is not declared",
        made.0
    );
    for gw in ["gateway-1", "gateway-2"] {
        let svc = service(gw);
        let (_, target, read_only) = named_volumes(svc)
            .into_iter()
            .find(|(v, _, _)| *v == made.0)
            .unwrap_or_else(|| panic!("{gw} does not mount volume {}", made.0));
        assert!(read_only, "{gw} mounts the token volume writable");
        assert_eq!(
            Path::new(&target).join("admin-token"),
            token_in_gateways,
            "{gw}: admin_token_file names no file of the token volume"
        );
        assert_eq!(
            start_condition(svc, "admin-token"),
            Some("service_completed_successfully"),
            "{gw} may start before its token exists"
        );
    }
    // Health checks need no token: they run /healthz.
    for (name, svc) in services {
        if let Some(hc) = svc.get("healthcheck") {
            let hc = serde_yaml::to_string(hc).unwrap();
            assert!(!hc.contains("Authorization"), "{name:?}: {hc}");
        }
    }
    assert!(
        names.contains(f.store_host.as_str()),
        "store.url names no service"
    );
    for (host, port) in &f.upstream_hosts {
        assert!(
            names.contains(host.as_str()),
            "upstream {host} is no service"
        );
        assert_eq!(
            *port,
            orders_listen.port(),
            "upstream port vs orders-api --listen"
        );
    }
    assert!(
        !f.admin.ip().is_loopback(),
        "admin_listen must be reachable in the network"
    );

    // stop_grace_period outlasts grace_period.
    for gw in ["gateway-1", "gateway-2"] {
        let stop = parse_duration(text(service(gw), "stop_grace_period")).unwrap();
        assert!(
            stop > f.grace,
            "{gw}: stop_grace_period {stop:?} <= grace_period"
        );
        for (_, container) in published(service(gw)) {
            assert_eq!(
                container,
                f.admin.port(),
                "{gw} publishes a port that is not admin"
            );
        }
    }

    // The load balancer: its pinned address is the one trusted proxy, its upstreams are the two
    // gateways on the listen port, and its listen port is the one compose publishes.
    let lb = service("lb");
    let lb_ip: std::net::IpAddr = text(lb, "networks.floodgate.ipv4_address").parse().unwrap();
    assert!(
        f.trusted.iter().any(|n| n.contains(&lb_ip)),
        "lb {lb_ip} is not trusted"
    );
    let subnet: ipnet::IpNet = text(compose, "networks.floodgate.ipam.config.0.subnet")
        .parse()
        .unwrap();
    assert!(subnet.contains(&lb_ip));
    let nginx_conf = binds(lb)
        .into_iter()
        .find(|(_, t)| t == "/etc/nginx/nginx.conf")
        .expect("lb mounts nginx.conf")
        .0;
    let nginx = read(&nginx_conf);
    let upstream_block = nginx
        .split_once("upstream gateways {")
        .expect("an upstream gateways block")
        .1
        .split_once('}')
        .unwrap()
        .0;
    let servers: Vec<&str> = upstream_block
        .lines()
        .filter_map(|l| l.trim().strip_prefix("server "))
        .map(|s| s.split_whitespace().next().unwrap().trim_end_matches(';'))
        .collect();
    assert_eq!(
        servers,
        [
            format!("gateway-1:{}", f.listen_port),
            format!("gateway-2:{}", f.listen_port)
        ]
    );
    assert!(nginx.contains("proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;"));
    let nginx_listen: u16 = nginx
        .lines()
        .find_map(|l| l.trim().strip_prefix("listen "))
        .unwrap()
        .trim_end_matches(';')
        .parse()
        .unwrap();
    assert_eq!(published(lb), [(8080, nginx_listen)]);

    // Prometheus scrapes both gateways' admin ports at /metrics.
    let prom_path = binds(service("prometheus"))
        .into_iter()
        .find(|(_, t)| t == "/etc/prometheus/prometheus.yml")
        .expect("prometheus mounts prometheus.yml")
        .0;
    let prom = &yaml_docs(&prom_path)[0];
    // Every rule file it loads is mounted into it.
    let prom_mounts = binds(service("prometheus"));
    for rule_file in seq(prom, "rule_files") {
        let rule_file = rule_file.as_str().unwrap();
        assert!(
            prom_mounts.iter().any(|(_, target)| target == rule_file),
            "prometheus loads {rule_file}, which is not mounted"
        );
    }
    let job = &seq(prom, "scrape_configs")[0];
    assert_eq!(text(job, "metrics_path"), "/metrics");
    let targets: BTreeSet<&str> = seq(job, "static_configs.0.targets")
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    let admin = f.admin.port();
    assert_eq!(
        targets,
        BTreeSet::from([
            format!("gateway-1:{admin}").as_str(),
            format!("gateway-2:{admin}").as_str()
        ])
    );
    // It scrapes with the token, from the same volume, by names the gateways answer for.
    let auth = at(job, "authorization");
    assert_eq!(text(auth, "type"), "Bearer");
    let (_, prom_target, read_only) = named_volumes(service("prometheus"))
        .into_iter()
        .find(|(v, _, _)| *v == made.0)
        .expect("prometheus mounts the token volume");
    assert!(read_only);
    assert_eq!(
        Path::new(text(auth, "credentials_file")),
        Path::new(&prom_target).join("admin-token")
    );
    let admin_hosts = admin_hosts(&config);
    for t in &targets {
        let host = t.rsplit_once(':').unwrap().0;
        assert!(
            admin_hosts.iter().any(|h| h == host),
            "prometheus scrapes {t}, whose Host the gateways refuse (admin_hosts = {admin_hosts:?})"
        );
    }

    let all: Vec<&str> = names.iter().copied().collect();
    check_with_local_hosts(
        "deploy/compose/gateway.toml",
        &config,
        &[(&token_file, "compose-test-token")],
        &all,
    );
}

/// `[server] admin_token_file` of a gateway.toml, if set (and no inline `admin_token`, which
/// would put the secret in git).
fn token_file(config: &str) -> Option<String> {
    let t: toml::Table = config.parse().unwrap();
    let server = t["server"].as_table().unwrap();
    assert!(
        server.get("admin_token").is_none(),
        "a shipped config holds an inline admin_token"
    );
    server
        .get("admin_token_file")
        .map(|f| f.as_str().unwrap().to_string())
}

/// `[server] admin_hosts` of a gateway.toml.
fn admin_hosts(config: &str) -> Vec<String> {
    let t: toml::Table = config.parse().unwrap();
    t["server"]
        .get("admin_hosts")
        .and_then(toml::Value::as_array)
        .into_iter()
        .flatten()
        .map(|h| h.as_str().unwrap().to_string())
        .collect()
}

/// Every gateway.toml the repository ships, by where it is.
fn shipped_configs() -> Vec<(String, String)> {
    let mut out = vec![
        (
            "gateway.toml".to_string(),
            read(&repo().join("gateway.toml")),
        ),
        (
            "deploy/compose/gateway.toml".to_string(),
            read(&repo().join("deploy/compose/gateway.toml")),
        ),
    ];
    for e in std::fs::read_dir(repo().join("examples")).unwrap() {
        let path = e.unwrap().path();
        if path.extension().is_some_and(|x| x == "toml") {
            out.push((
                path.strip_prefix(repo()).unwrap().display().to_string(),
                read(&path),
            ));
        }
    }
    let cm = &yaml_docs(&repo().join("deploy/k8s/configmap.yaml"))[0];
    out.push((
        "deploy/k8s/configmap.yaml".to_string(),
        at(cm, "data")["gateway.toml"].as_str().unwrap().to_string(),
    ));
    out
}

#[test]
fn every_shipped_admin_listener_open_to_other_hosts_needs_a_token_from_a_file() {
    for (name, config) in shipped_configs() {
        let t: toml::Table = config.parse().unwrap();
        let admin: SocketAddr = t
            .get("server")
            .and_then(|s| s.get("admin_listen"))
            .and_then(toml::Value::as_str)
            .unwrap_or("127.0.0.1:9901")
            .parse()
            .unwrap();
        let token = token_file(&config);
        println!("{name}: admin_listen {admin}, admin_token_file {token:?}");
        if !admin.ip().is_loopback() {
            assert!(
                token.is_some(),
                "{name}: admin_listen {admin} is reachable from other hosts without a token"
            );
        }
    }
}

// ---- Kubernetes -------------------------------------------------------------------------------

/// Every manifest of deploy/k8s by (kind, name).
fn k8s_objects() -> BTreeMap<(String, String), Value> {
    let dir = repo().join("deploy/k8s");
    let kustomization = &yaml_docs(&dir.join("kustomization.yaml"))[0];
    let listed: BTreeSet<String> = seq(kustomization, "resources")
        .iter()
        .map(|r| r.as_str().unwrap().to_string())
        .collect();
    let present: BTreeSet<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| (n.ends_with(".yaml") || n.ends_with(".yml")) && n != "kustomization.yaml")
        .collect();
    assert_eq!(
        listed, present,
        "kustomization.yaml must list every manifest, and only those"
    );

    let mut objects = BTreeMap::new();
    for file in &listed {
        for doc in yaml_docs(&dir.join(file)) {
            let kind = text(&doc, "kind").to_string();
            let name = text(&doc, "metadata.name").to_string();
            assert!(text(&doc, "apiVersion").contains('v'), "{file}: apiVersion");
            assert!(
                doc["metadata"].get("namespace").is_none(),
                "{file}: {kind}/{name} sets a namespace; the manifests are namespace-agnostic"
            );
            let previous = objects.insert((kind.clone(), name.clone()), doc);
            assert!(previous.is_none(), "{kind}/{name} is defined twice");
        }
    }
    objects
}

fn object<'a>(objects: &'a BTreeMap<(String, String), Value>, kind: &str, name: &str) -> &'a Value {
    objects
        .get(&(kind.to_string(), name.to_string()))
        .unwrap_or_else(|| panic!("no {kind}/{name} in deploy/k8s"))
}

/// The named container ports of a pod template's first container.
fn container_ports(container: &Value) -> BTreeMap<String, u64> {
    seq(container, "ports")
        .iter()
        .map(|p| (text(p, "name").to_string(), int(p, "containerPort")))
        .collect()
}

/// A probe's or Service's port, by number or by name.
fn port_of(v: &Value, ports: &BTreeMap<String, u64>) -> u64 {
    match v {
        Value::Number(n) => n.as_u64().unwrap(),
        Value::String(name) => *ports.get(name).unwrap_or_else(|| panic!("no port {name}")),
        other => panic!("port {other:?}"),
    }
}

/// The pod labels of every Deployment and StatefulSet, with its first container.
fn workloads(objects: &BTreeMap<(String, String), Value>) -> Vec<(String, &Value, &Value)> {
    objects
        .iter()
        .filter(|((kind, _), _)| kind == "Deployment" || kind == "StatefulSet")
        .map(|((kind, name), w)| {
            (
                format!("{kind}/{name}"),
                at(w, "spec.template.metadata.labels"),
                &seq(w, "spec.template.spec.containers")[0],
            )
        })
        .collect()
}

/// Whether every `key: value` of `selector` is in `labels`.
fn selects(selector: &Value, labels: &Value) -> bool {
    selector
        .as_mapping()
        .unwrap()
        .iter()
        .all(|(k, v)| labels.get(k) == Some(v))
}

#[test]
fn kubernetes_manifests_are_consistent_and_the_configmap_passes_check() {
    let dir = repo().join("deploy/k8s");
    let objects = k8s_objects();
    let workloads = workloads(&objects);

    // Every Service selects exactly one workload and targets one of its container ports.
    let mut service_ports: BTreeMap<String, BTreeSet<u64>> = BTreeMap::new();
    for ((kind, name), svc) in &objects {
        if kind != "Service" {
            continue;
        }
        let selector = at(svc, "spec.selector");
        let matched: Vec<_> = workloads
            .iter()
            .filter(|(_, labels, _)| selects(selector, labels))
            .collect();
        assert_eq!(
            matched.len(),
            1,
            "Service/{name} must select exactly one workload"
        );
        let ports = container_ports(matched[0].2);
        for p in seq(svc, "spec.ports") {
            let target = p.get("targetPort").unwrap_or(at(p, "port"));
            let target = port_of(target, &ports);
            assert!(
                ports.values().any(|&c| c == target),
                "Service/{name}: port {target}"
            );
            service_ports
                .entry(name.clone())
                .or_default()
                .insert(int(p, "port"));
        }
    }

    // The gateway config, with its keys file from the Secret.
    let config_map = object(&objects, "ConfigMap", "floodgate-config");
    let config = at(config_map, "data")
        .get("gateway.toml")
        .and_then(Value::as_str)
        .expect("ConfigMap data gateway.toml");
    let secret = object(&objects, "Secret", "floodgate-keys");
    let keys = at(secret, "stringData")
        .get("keys.toml")
        .and_then(Value::as_str)
        .expect("Secret stringData keys.toml");
    let keys_table: toml::Table = keys.parse().expect("keys.toml is TOML");
    let key_list = keys_table["keys"].as_array().expect("[[keys]]");
    assert!(!key_list.is_empty());
    for k in key_list {
        let k = k.as_table().unwrap();
        assert!(
            !k.contains_key("secret"),
            "the Secret holds a plaintext secret: {k:?}"
        );
        let sha = k["sha256"].as_str().expect("sha256");
        assert!(sha.len() == 64 && sha.bytes().all(|b| b.is_ascii_hexdigit()));
    }
    let table: toml::Table = config.parse().unwrap();
    assert_eq!(
        table["auth"]["keys_file"].as_str(),
        Some("keys.toml"),
        "keys_file is the Secret's file, projected next to gateway.toml"
    );
    // The admin listener is on the pod IP: it needs a token, from a Secret that kustomize makes
    // from a file each operator writes and git never holds.
    let token_file =
        token_file(config).expect("admin_listen is not loopback: admin_token_file is needed");
    let kustomization = &yaml_docs(&dir.join("kustomization.yaml"))[0];
    let generated: BTreeMap<String, Vec<String>> = kustomization
        .get("secretGenerator")
        .and_then(Value::as_sequence)
        .into_iter()
        .flatten()
        .map(|g| {
            let files = seq(g, "files")
                .iter()
                .map(|f| f.as_str().unwrap().to_string())
                .collect();
            (text(g, "name").to_string(), files)
        })
        .collect();
    let ignored = read(&dir.join(".gitignore"));
    for (name, files) in &generated {
        for f in files {
            assert!(
                ignored.lines().any(|l| l.trim() == f),
                "Secret {name} is made from {f}, which deploy/k8s/.gitignore does not keep out of git"
            );
        }
    }
    let f = facts(config);
    assert_eq!(f.store_backend, "redis");
    assert!(
        !f.admin.ip().is_loopback(),
        "the kubelet probes admin on the pod IP"
    );
    let store_url = table["store"]["url"].as_str().unwrap();
    assert!(
        service_ports
            .get(&f.store_host)
            .is_some_and(|p| p.iter().any(|p| store_url.contains(&format!(":{p}")))),
        "store.url {store_url} is no Service of the manifests"
    );
    for (host, port) in &f.upstream_hosts {
        assert!(
            service_ports
                .get(host)
                .is_some_and(|p| p.contains(&u64::from(*port))),
            "upstream {host}:{port} is no Service of the manifests"
        );
    }

    // The Deployment.
    let deployment = object(&objects, "Deployment", "floodgate");
    let spec = at(deployment, "spec");
    assert!(int(spec, "replicas") >= 2);
    let pod_labels = at(spec, "template.metadata.labels");
    assert!(selects(at(spec, "selector.matchLabels"), pod_labels));
    let pod = at(spec, "template.spec");
    assert_eq!(
        at(pod, "securityContext.runAsNonRoot").as_bool(),
        Some(true)
    );
    assert!(int(pod, "securityContext.runAsUser") > 0);
    let c = &seq(pod, "containers")[0];
    assert!(text(c, "image").starts_with("floodgate:"));
    let args: Vec<&str> = seq(c, "args").iter().map(|a| a.as_str().unwrap()).collect();
    assert_eq!(args, ["-c", "/etc/floodgate/gateway.toml"]);
    let ports = container_ports(c);
    assert_eq!(ports.get("http"), Some(&u64::from(f.listen_port)));
    assert_eq!(ports.get("admin"), Some(&u64::from(f.admin.port())));
    for (probe, path) in [("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")] {
        let get = at(c, &format!("{probe}.httpGet"));
        assert_eq!(text(get, "path"), path);
        assert_eq!(port_of(at(get, "port"), &ports), u64::from(f.admin.port()));
        // The kubelet sends the pod IP as Host and no token: both endpoints answer that.
        assert!(get.get("httpHeaders").is_none(), "{probe} sends headers");
        assert!(get.get("host").is_none(), "{probe} names a host");
    }
    for r in [
        "requests.cpu",
        "requests.memory",
        "limits.cpu",
        "limits.memory",
    ] {
        at(c, &format!("resources.{r}"));
    }
    let pre_stop: Vec<&str> = seq(c, "lifecycle.preStop.exec.command")
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(pre_stop[0], "sleep");
    let pre_stop = Duration::from_secs(pre_stop[1].parse().unwrap());
    let termination = Duration::from_secs(int(pod, "terminationGracePeriodSeconds"));
    assert!(
        termination > pre_stop + f.grace,
        "terminationGracePeriodSeconds {termination:?} <= preStop {pre_stop:?} + grace_period {:?}",
        f.grace
    );
    // The config is a directory mount (no subPath: the kubelet's symlink swap must reach it)
    // of a projected volume holding the ConfigMap's gateway.toml and the Secret's keys.toml.
    let mount = seq(c, "volumeMounts")
        .iter()
        .find(|m| text(m, "mountPath").trim_end_matches('/') == "/etc/floodgate")
        .expect("a volume mounted at /etc/floodgate");
    assert!(mount.get("subPath").is_none());
    let volume = seq(pod, "volumes")
        .iter()
        .find(|v| text(v, "name") == text(mount, "name"))
        .expect("the config volume");
    let mut projected = BTreeMap::new();
    for source in seq(volume, "projected.sources") {
        let (kind, src) = if let Some(cm) = source.get("configMap") {
            ("ConfigMap", cm)
        } else {
            ("Secret", at(source, "secret"))
        };
        let name = text(src, "name");
        match generated.get(name) {
            Some(files) => {
                for item in seq(src, "items") {
                    assert!(
                        files.iter().any(|f| f == text(item, "key")),
                        "Secret {name} (generated) has no key {}",
                        text(item, "key")
                    );
                }
            }
            None => {
                object(&objects, kind, name);
            }
        }
        for item in seq(src, "items") {
            projected.insert(
                text(item, "path").to_string(),
                (kind, text(item, "key").to_string()),
            );
        }
    }
    assert_eq!(
        projected["gateway.toml"],
        ("ConfigMap", "gateway.toml".to_string())
    );
    assert_eq!(projected["keys.toml"], ("Secret", "keys.toml".to_string()));
    let (kind, key) = &projected[&token_file];
    assert_eq!(*kind, "Secret", "the admin token comes from a Secret");
    assert!(
        generated.values().flatten().any(|f| f == key),
        "the admin token's Secret is not generated from an operator's file"
    );

    // PodDisruptionBudget and HorizontalPodAutoscaler aim at the gateways.
    let pdb = object(&objects, "PodDisruptionBudget", "floodgate");
    assert_eq!(text(pdb, "apiVersion"), "policy/v1");
    assert!(selects(at(pdb, "spec.selector.matchLabels"), pod_labels));
    let hpa = object(&objects, "HorizontalPodAutoscaler", "floodgate");
    assert_eq!(text(hpa, "apiVersion"), "autoscaling/v2");
    assert_eq!(text(hpa, "spec.scaleTargetRef.kind"), "Deployment");
    assert_eq!(text(hpa, "spec.scaleTargetRef.name"), "floodgate");
    assert!(int(hpa, "spec.minReplicas") >= 2);
    assert!(seq(hpa, "spec.metrics")
        .iter()
        .any(|m| text(m, "resource.name") == "cpu"));

    // The Redis for trying it out: a StatefulSet behind its governing Service, never evicting.
    let redis = object(&objects, "StatefulSet", "redis");
    object(&objects, "Service", text(redis, "spec.serviceName"));
    let redis_args: Vec<&str> = seq(redis, "spec.template.spec.containers.0.args")
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert!(redis_args
        .windows(2)
        .any(|w| w == ["--maxmemory-policy", "noeviction"]));
    assert!(read(&dir.join("redis.yaml")).contains("Redis Cluster"));

    // Every floodgate image is the one kustomize rewrites.
    let kustomization = &yaml_docs(&dir.join("kustomization.yaml"))[0];
    let image = text(&seq(kustomization, "images")[0], "name");
    for (name, _, container) in &workloads {
        let img = text(container, "image");
        if !img.starts_with("redis:") {
            assert!(img.starts_with(&format!("{image}:")), "{name}: image {img}");
        }
    }

    let services: Vec<&str> = service_ports.keys().map(String::as_str).collect();
    check_with_local_hosts(
        "deploy/k8s ConfigMap gateway.toml",
        config,
        &[("keys.toml", keys), (&token_file, "k8s-test-token\n")],
        &services,
    );
}

// ---- The two gateway configs, running ---------------------------------------------------------

/// `config` made runnable on loopback: `replacements` (each must occur: a shipped file that
/// drifted from what this test knows fails loudly) applied in order.
fn rewritten(what: &str, config: &str, replacements: &[(&str, String)]) -> String {
    let mut out = config.to_string();
    for (from, to) in replacements {
        assert!(out.contains(from), "{what} no longer holds {from}");
        out = out.replace(from, to);
    }
    out
}

/// One shipped gateway config running on loopback with its token file, stopped on drop.
struct Running {
    _process: common::Spawned,
    _dir: tempfile::TempDir,
    admin: SocketAddr,
}

fn run(what: &str, config: &str, files: &[(&str, &str)]) -> Running {
    let dir = tempfile::tempdir().unwrap();
    write_files(dir.path(), &[&[("gateway.toml", config)], files].concat());
    let log = dir.path().join("floodgate.log");
    let mut process =
        common::spawn_floodgate_with(&dir.path().join("gateway.toml"), dir.path(), &log, &[]);
    let admin: SocketAddr = {
        let t: toml::Table = config.parse().unwrap();
        t["server"]["admin_listen"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap()
    };
    common::wait_for_port(admin, Duration::from_secs(30), &mut process.child, what);
    Running {
        _process: process,
        _dir: dir,
        admin,
    }
}

async fn status(c: &reqwest::Client, url: &str, token: Option<&str>) -> u16 {
    let mut req = c.get(url);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    req.send().await.unwrap().status().as_u16()
}

/// What every open admin listener of a shipped stack must do: probes answered without a token,
/// the data only with it, and no answer for a foreign Host.
async fn admin_api_is_guarded(what: &str, gw: &Running, probes: &[&str], token: &str) {
    let c = reqwest::Client::builder()
        .no_proxy()
        .resolve("rebind.example", gw.admin)
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    let base = format!("http://{}", gw.admin);
    for probe in probes {
        // Readiness waits for the store (connected, scripts loaded) after the admin port opens:
        // the probe is asked again, as an orchestrator asks it, within a generous bound.
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        let mut got = status(&c, &format!("{base}{probe}"), None).await;
        while got != 200 && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
            got = status(&c, &format!("{base}{probe}"), None).await;
        }
        assert_eq!(got, 200, "{what}: probe {probe}");
    }
    for path in ["/metrics", "/stats", "/rules", "/upstreams"] {
        let url = format!("{base}{path}");
        assert_eq!(
            status(&c, &url, None).await,
            401,
            "{what}: {path} without the token"
        );
        assert_eq!(
            status(&c, &url, Some(token)).await,
            200,
            "{what}: {path} with it"
        );
    }
    let foreign = format!("http://rebind.example:{}/stats", gw.admin.port());
    assert_eq!(
        status(&c, &foreign, Some(token)).await,
        421,
        "{what}: foreign Host"
    );
}

#[tokio::test]
async fn the_shipped_stacks_answer_their_probes_and_keep_the_admin_api_behind_the_token() {
    let api = common::OrdersApi::start("orders-api");
    let redis = common::redis::RedisServer::start();
    let loopback = |config: &str, what: &str, listen: SocketAddr, admin: SocketAddr| {
        rewritten(
            what,
            config,
            &[
                (
                    "listen = [\"0.0.0.0:8080\"]",
                    format!("listen = [\"{listen}\"]"),
                ),
                (
                    "admin_listen = \"0.0.0.0:9901\"",
                    format!("admin_listen = \"{admin}\""),
                ),
                ("redis://redis:6379/0", redis.url()),
                ("\"orders-api:9000\"", format!("\"{}\"", api.addr)),
            ],
        )
    };

    // Kubernetes: the probes exactly as the Deployment declares them.
    let objects = k8s_objects();
    let cm = object(&objects, "ConfigMap", "floodgate-config");
    let k8s = at(cm, "data")["gateway.toml"].as_str().unwrap();
    let keys = at(object(&objects, "Secret", "floodgate-keys"), "stringData")["keys.toml"]
        .as_str()
        .unwrap();
    let container = &seq(
        object(&objects, "Deployment", "floodgate"),
        "spec.template.spec.containers",
    )[0];
    let probes: Vec<&str> = ["readinessProbe", "livenessProbe"]
        .iter()
        .map(|p| text(container, &format!("{p}.httpGet.path")))
        .collect();
    let what = "deploy/k8s ConfigMap gateway.toml";
    let config = loopback(k8s, what, common::free_addr(), common::free_addr());
    let token = "k8s-live-token-7d1";
    let gw = run(
        what,
        &config,
        &[
            ("keys.toml", keys),
            (&token_file(k8s).unwrap(), &format!("{token}\n")),
        ],
    );
    admin_api_is_guarded(what, &gw, &probes, token).await;

    // Compose: the image's HEALTHCHECK, and Prometheus' scrape by service name with the token.
    let compose = read(&repo().join("deploy/compose/gateway.toml"));
    let what = "deploy/compose/gateway.toml";
    let config = loopback(&compose, what, common::free_addr(), common::free_addr());
    let token = "compose-live-token-2b9";
    let gw = run(what, &config, &[(&token_file(&compose).unwrap(), token)]);
    admin_api_is_guarded(what, &gw, &["/healthz"], token).await;
    let prom = &yaml_docs(&repo().join("deploy/compose/prometheus.yml"))[0];
    let job = &seq(prom, "scrape_configs")[0];
    for target in seq(job, "static_configs.0.targets") {
        let host = target.as_str().unwrap().rsplit_once(':').unwrap().0;
        let c = reqwest::Client::builder()
            .no_proxy()
            .resolve(host, gw.admin)
            .build()
            .unwrap();
        let url = format!(
            "http://{host}:{}{}",
            gw.admin.port(),
            text(job, "metrics_path")
        );
        assert_eq!(
            status(&c, &url, Some(token)).await,
            200,
            "Prometheus scraping {url}"
        );
        assert_eq!(status(&c, &url, None).await, 401, "{url} without the token");
    }
}

/// `promtool check config` on the compose stack's prometheus.yml, its mounted paths (the alert
/// rules, the admin token) pointed at local copies. Skips without promtool, except under CI.
#[test]
fn the_compose_prometheus_config_passes_promtool() {
    let found = std::process::Command::new("promtool")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        assert!(
            std::env::var_os("CI").is_none(),
            "promtool is missing (CI is set, so this fails rather than skips): run `make deps`"
        );
        eprintln!("SKIPPED: promtool is not installed (`make deps` installs it)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let local = |p: &str| dir.path().join(Path::new(p).file_name().unwrap());
    let prom_path = repo().join("deploy/compose/prometheus.yml");
    let mut config = read(&prom_path);
    let prom = &yaml_docs(&prom_path)[0];
    let job = &seq(prom, "scrape_configs")[0];
    let token = text(at(job, "authorization"), "credentials_file");
    std::fs::write(local(token), "promtool-token").unwrap();
    config = config.replace(token, &local(token).display().to_string());
    for rules in seq(prom, "rule_files") {
        let rules = rules.as_str().unwrap();
        std::fs::copy(repo().join("deploy/prometheus/alerts.yml"), local(rules)).unwrap();
        config = config.replace(rules, &local(rules).display().to_string());
    }
    let path = dir.path().join("prometheus.yml");
    std::fs::write(&path, config).unwrap();
    let out = std::process::Command::new("promtool")
        .args(["check", "config"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
