//! `floodgate check` and start-up validation: good files print routes and rules in order, bad
//! files name file, line and column and exit non-zero.

mod common;

use common::check;

const GOOD: &str = r#"
[[upstreams]]
name = "orders"
targets = ["127.0.0.1:9000"]

[[routes]]
name = "orders"
match = { path_prefix = "/orders" }
upstream = "orders"

[[rules]]
name = "first"
key = ["ip"]
algorithm = "token_bucket"
limit = 10
window = "1s"

[[rules]]
name = "second"
match = { route = "orders" }
key = ["api_key", "header:x-tenant"]
algorithm = "sliding_window_log"
limit = 5
window = "1m"
"#;

#[test]
fn shipped_config_is_valid() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_floodgate"))
        .args([
            "check",
            "-c",
            concat!(env!("CARGO_MANIFEST_DIR"), "/gateway.toml"),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    for rule in [
        "per-ip-flood",
        "orders-per-key",
        "login",
        "exports",
        "partner-smoothing",
    ] {
        assert!(text.contains(rule), "{rule} missing from:\n{text}");
    }
}

#[test]
fn every_example_config_is_valid() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/examples");
    let mut checked = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            let out = std::process::Command::new(env!("CARGO_BIN_EXE_floodgate"))
                .arg("check")
                .arg("-c")
                .arg(&path)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}: {}",
                path.display(),
                String::from_utf8_lossy(&out.stderr)
            );
            checked += 1;
        }
    }
    assert!(
        checked >= 2,
        "examples/ should hold the Redis and cluster configs"
    );
}

#[test]
fn good_file_lists_rules_in_order() {
    let (ok, out, err) = check(GOOD, &[]);
    assert!(ok, "{err}");
    let first = out.find("1. first").expect("first rule listed");
    let second = out.find("2. second").expect("second rule listed");
    assert!(first < second);
    assert!(out.contains("key [api_key, header:x-tenant]"));
    assert!(out.contains("1. orders: path_prefix=/orders -> upstream orders"));
}

/// `check` counts the rules each route can reach and warns of a route an earlier one takes
/// every request of, and of rules that can never match, saying why.
#[test]
fn check_counts_what_each_route_reaches_and_warns_of_dead_rules() {
    let config = r#"
[[upstreams]]
name = "orders"
targets = ["127.0.0.1:9000"]

[[routes]]
name = "orders"
match = { path_prefix = "/orders" }
upstream = "orders"

[[routes]]
name = "order-items"
match = { path_prefix = "/orders/items" }
upstream = "orders"

[[routes]]
name = "login"
match = { path = "/login", methods = ["POST"] }
upstream = "orders"
auth = "none"

[[rules]]
name = "everyone"
key = ["ip"]
algorithm = "fixed_window"
limit = 10
window = "1s"

[[rules]]
name = "orders-typo"
match = { route = "orders", path_prefix = "/order/1" }
key = ["ip"]
algorithm = "fixed_window"
limit = 10
window = "1s"

[[rules]]
name = "login-gets"
match = { route = "login", methods = ["GET"] }
key = ["ip"]
algorithm = "fixed_window"
limit = 10
window = "1s"

[[rules]]
name = "login-pro"
match = { path = "/login", plan = "pro" }
key = ["ip"]
algorithm = "fixed_window"
limit = 10
window = "1s"

[[rules]]
name = "items"
match = { route = "order-items" }
key = ["ip"]
algorithm = "fixed_window"
limit = 10
window = "1s"

[[rules]]
name = "one-order"
match = { path = "/orders/7" }
key = ["ip"]
algorithm = "fixed_window"
limit = 10
window = "1s"
"#;
    let (ok, out, err) = check(config, &[]);
    assert!(ok, "{err}");
    for line in [
        "warning: route \"order-items\" never sees a request: route \"orders\" before it takes them all",
        "warning: rule \"orders-typo\" can never match: its path is not under the route's",
        "warning: rule \"login-gets\" can never match: its methods are not the route's",
        "warning: rule \"login-pro\" can never match: no route's requests can meet it",
        "warning: rule \"items\" can never match: its route never sees a request",
        "1. orders: path_prefix=/orders -> upstream orders (auth required) | 2 rules",
        "3. login: path=/login methods=POST -> upstream orders (auth none) | 1 rule",
    ] {
        assert!(out.contains(line), "{line:?} missing from:\n{out}");
    }
    assert!(!out.contains("\"everyone\" can never"), "{out}");
    assert!(!out.contains("\"one-order\" can never"), "{out}");
}

/// Each bad file, with the line:column the error must name and a phrase of its sentence.
#[test]
fn bad_files_name_line_and_column() {
    let cases: &[(&str, &str, &str)] = &[
        ("[server]\nlisten = [\"0.0.0.0:8080\"\n", "gateway.toml:", "expected"),
        ("[server]\nlisten = [\"0.0.0.0:8080\"]\nthreds = 2\n", "gateway.toml:3:1", "unknown field `threds`"),
        (
            "[[upstreams]]\nname = \"orders\"\ntargets = [\"127.0.0.1:9000\"]\n\n[[routes]]\nname = \"r\"\nupstream = \"order\"\n",
            "gateway.toml:7:12",
            "not defined",
        ),
        (
            "[[rules]]\nname = \"a\"\nkey = [\"ip\"]\nalgorithm = \"token_bucket\"\nlimit = 1\nwindow = \"1 minute\"\n",
            "gateway.toml:6:10",
            "duration",
        ),
        (
            "[[rules]]\nname = \"a\"\nkey = [\"ip\"]\nalgorithm = \"fixed_window\"\nlimit = 1\nwindow = \"1s\"\n\n[[rules]]\nname = \"a\"\nkey = [\"ip\"]\nalgorithm = \"fixed_window\"\nlimit = 1\nwindow = \"1s\"\n",
            "gateway.toml:9:8",
            "defined twice",
        ),
        (
            "[[rules]]\nname = \"a\"\nkey = [\"ipp\"]\nalgorithm = \"fixed_window\"\nlimit = 1\nwindow = \"1s\"\n",
            "gateway.toml:3:8",
            "unknown key part",
        ),
        (
            "[[rules]]\nname = \"a\"\nkey = [\"ip\"]\nalgorithm = \"token_bucket\"\nlimit = 0\nwindow = \"1s\"\n",
            "gateway.toml:5:9",
            "at least 1",
        ),
        (
            "[[rules]]\nname = \"a\"\nkey = [\"ip\"]\nalgorithm = \"token_bucket\"\nlimit = 5\nwindow = \"1s\"\nlimt = 9\n",
            "gateway.toml:7:1",
            "unknown field `limt`",
        ),
        ("[store]\nbackend = \"redis\"\n", "gateway.toml:2:11", "needs store.url"),
        (
            "[[auth.keys]]\nid = \"k\"\nsha256 = \"abc\"\n",
            "gateway.toml:3:10",
            "64 hex digits",
        ),
    ];
    for (config, location, phrase) in cases {
        let (ok, _out, err) = check(config, &[]);
        assert!(!ok, "accepted a bad file:\n{config}");
        assert!(err.contains(location), "expected {location} in: {err}");
        assert!(err.contains(phrase), "expected \"{phrase}\" in: {err}");
    }
}

#[test]
fn keys_file_errors_name_the_keys_file() {
    // A route too: a config without one is invalid (an empty or truncated file).
    let config = "[auth]\nkeys_file = \"keys.toml\"\n\n[[upstreams]]\nname = \"u\"\ntargets = [\"127.0.0.1:9000\"]\n\n[[routes]]\nname = \"r\"\nupstream = \"u\"\n";
    let (ok, out, err) = check(
        config,
        &[("keys.toml", "[[keys]]\nid = \"k\"\nsecret = \"s\"\n")],
    );
    assert!(ok, "{err}");
    assert!(out.contains("warning: key \"k\" uses a plaintext `secret`"));
    let (ok, _, err) = check(
        config,
        &[(
            "keys.toml",
            "[[keys]]\nid = \"k\"\nsecret = \"s\"\nplna = \"x\"\n",
        )],
    );
    assert!(!ok);
    assert!(err.contains("keys.toml:4:1"), "{err}");
}

#[test]
fn the_gateway_refuses_to_start_on_a_bad_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.toml");
    std::fs::write(&path, "[server]\nthreads = 0\n").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_floodgate"))
        .arg("-c")
        .arg(&path)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("gateway.toml:2:11"), "{err}");
}

/// An upstream and a route: what every valid file needs besides the part a test is about.
const ROUTE: &str = "\n[[upstreams]]\nname = \"u\"\ntargets = [\"127.0.0.1:9000\"]\n\n[[routes]]\nname = \"r\"\nupstream = \"u\"\n";

/// Redis URLs are judged by the store's own parser and client construction, so a URL
/// the store would refuse at run time fails `check` at its line and column, without ever
/// printing the URL (it may hold a password).
#[test]
fn redis_urls_the_store_cannot_use_fail_check() {
    let cases: &[(&str, &str)] = &[
        (
            "[store]\nbackend = \"redis\"\nurl = \"redis://:s3cret@host:notaport\"\n",
            "gateway.toml:3:7",
        ),
        (
            "[store]\nbackend = \"redis\"\nurl = \"redis://[::1\"\n",
            "gateway.toml:3:7",
        ),
        (
            "[store]\nbackend = \"redis\"\nurl = \"redis://:@:0/x\"\n",
            "gateway.toml:3:7",
        ),
        (
            "[store]\nbackend = \"redis\"\nurl = \"redis://127.0.0.1:6379/-1\"\n",
            "gateway.toml:3:7",
        ),
        (
            "[store]\nbackend = \"redis-cluster\"\nurls = [\"redis://127.0.0.1:7000\", \"redis://:s3cret@host:notaport\"]\n",
            "gateway.toml:3:35",
        ),
        // Each seed parses, but redis-rs cannot build a cluster client from seeds that
        // disagree on the password: the whole list is at fault.
        (
            "[store]\nbackend = \"redis-cluster\"\nurls = [\"redis://:s3cret@127.0.0.1:7000\", \"redis://:other@127.0.0.1:7001\"]\n",
            "gateway.toml:3:8",
        ),
    ];
    for (store, location) in cases {
        let config = format!("{store}{ROUTE}");
        let (ok, _out, err) = check(&config, &[]);
        assert!(!ok, "accepted a URL the store cannot use:\n{config}");
        assert!(err.contains(location), "expected {location} in: {err}");
        assert!(err.contains("URL") || err.contains("url"), "{err}");
        assert!(!err.contains("s3cret"), "the password leaked: {err}");
    }
    let good =
        format!("[store]\nbackend = \"redis\"\nurl = \"redis://:pw@127.0.0.1:6379/2\"\n{ROUTE}");
    let (ok, _, err) = check(&good, &[]);
    assert!(ok, "{err}");
}

/// Key ids, users and plans are sent upstream as headers: a value with CR/LF or
/// another byte no header value may hold is refused at load, inline and in the keys file.
#[test]
fn identity_values_that_cannot_be_headers_fail_check() {
    let inline: &[(&str, &str)] = &[
        (
            "id = \"k\\r\\nx-admin: 1\"\nsecret = \"s\"\n",
            "gateway.toml:3:6",
        ),
        (
            "id = \"k\"\nsecret = \"s\"\nuser = \"acme\\nx: y\"\n",
            "gateway.toml:5:8",
        ),
        (
            "id = \"k\"\nsecret = \"s\"\nplan = \"pro\\u0000\"\n",
            "gateway.toml:5:8",
        ),
        (
            "id = \"k\"\nsecret = \"s\"\nplan = \"pro\\u007f\"\n",
            "gateway.toml:5:8",
        ),
    ];
    for (key, location) in inline {
        let config = format!("\n[[auth.keys]]\n{key}{ROUTE}");
        let (ok, _out, err) = check(&config, &[]);
        assert!(!ok, "accepted:\n{config}");
        assert!(err.contains(location), "expected {location} in: {err}");
        assert!(err.contains("header"), "{err}");
    }
    let config = format!("[auth]\nkeys_file = \"keys.toml\"\n{ROUTE}");
    let (ok, _, err) = check(
        &config,
        &[(
            "keys.toml",
            "[[keys]]\nid = \"k\"\nsecret = \"s\"\nuser = \"a\\rb\"\n",
        )],
    );
    assert!(!ok);
    assert!(err.contains("keys.toml:4:8"), "{err}");
    // Printable text, spaces and non-ASCII are fine.
    let (ok, _, err) = check(
        &config,
        &[(
            "keys.toml",
            "[[keys]]\nid = \"k 1\"\nsecret = \"s\"\nuser = \"Zoë & co\"\nplan = \"pro\"\n",
        )],
    );
    assert!(ok, "{err}");
}

/// A zero-byte file, or one cut short before its routes, is not a gateway.
#[test]
fn files_without_routes_fail_check() {
    for config in [
        "",
        "\n\n",
        "[server]\nthreads = 1\n[[upstreams]]\nname = \"u\"\ntargets = [\"127.0.0.1:9000\"]\n",
    ] {
        let (ok, _out, err) = check(config, &[]);
        assert!(!ok, "accepted a file without routes: {config:?}");
        assert!(err.contains("gateway.toml: "), "{err}");
        assert!(err.contains("[[routes]]"), "{err}");
    }
}

/// A shaping rule's max_delay is bounded: every held request holds a connection.
#[test]
fn unbounded_shaping_delays_fail_check() {
    let rule = |max_delay: &str| {
        format!("{ROUTE}\n[[rules]]\nname = \"s\"\nkey = [\"ip\"]\nalgorithm = \"leaky_bucket\"\nlimit = 1\nwindow = \"1h\"\nmode = \"shape\"\n{max_delay}")
    };
    let (ok, _, err) = check(&rule("max_delay = \"999999d\"\n"), &[]);
    assert!(!ok);
    assert!(
        err.contains("gateway.toml:17:13") && err.contains("60s"),
        "{err}"
    );
    let (ok, _, err) = check(&rule("max_delay = \"61s\"\n"), &[]);
    assert!(!ok, "61s accepted");
    assert!(err.contains("60s"), "{err}");
    let (ok, out, err) = check(&rule("max_delay = \"60s\"\n"), &[]);
    assert!(ok, "{err}");
    assert!(out.contains("max_delay 1m"), "{out}");
    // Without max_delay the default (the window, here 1h) is capped to the bound.
    let (ok, out, err) = check(&rule(""), &[]);
    assert!(ok, "{err}");
    assert!(out.contains("max_delay 1m"), "{out}");
}

/// `[upstreams.protect]` reading a header or query parameter for `fair_by` or `weights` is
/// accepted with a warning: the client sets those, so it can mint tenants or name its weight.
/// The default (the customer) and key parts from the key or the connection warn of nothing.
#[test]
fn protect_parts_a_client_sets_are_warned_of() {
    let upstream = |protect: &str| {
        format!(
            "[[upstreams]]\nname = \"u\"\ntargets = [\"127.0.0.1:9000\"]\n[upstreams.protect]\n{protect}\n\n[[routes]]\nname = \"r\"\nupstream = \"u\"\n"
        )
    };
    let (ok, out, err) = check(
        &upstream("fair_by = [\"header:x-tenant\"]\nweights = { \"query:plan\" = { gold = 4 } }"),
        &[],
    );
    assert!(ok, "{err}");
    assert!(
        out.contains("warning: upstream \"u\": protect's fair_by reads \"header:x-tenant\", which the client sets"),
        "{out}"
    );
    assert!(
        out.contains(
            "warning: upstream \"u\": protect's weights read \"query:plan\", which the client sets"
        ),
        "{out}"
    );
    for quiet in [
        "",
        "fair_by = [\"user\", \"ip\"]\nweights = { plan = { pro = 4 } }",
    ] {
        let (ok, out, err) = check(&upstream(quiet), &[]);
        assert!(ok, "{err}");
        assert!(!out.contains("protect's"), "{quiet}: {out}");
    }
}
