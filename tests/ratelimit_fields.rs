//! What clients back off by, read through a structured-field parser
//! as a client would: on a rejection, a rule's `t` is its `Retry-After`, for every algorithm;
//! and a rule that did not reject a refused request shows what it really has left (the
//! request charged it nothing).

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::*;

/// The `RateLimit` field's members: rule name → (r, t).
fn fields(head: &str) -> HashMap<String, (i64, i64)> {
    let line = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("ratelimit")
                .then(|| v.trim().to_string())
        })
        .unwrap_or_else(|| panic!("no RateLimit field in {head}"));
    let list = sfv::Parser::parse_list(line.as_bytes()).expect("RateLimit is an sf-list");
    let mut out = HashMap::new();
    for entry in list {
        let sfv::ListEntry::Item(item) = entry else {
            panic!("inner list in {line}")
        };
        let sfv::BareItem::String(name) = item.bare_item else {
            panic!("member not a string in {line}")
        };
        let int = |k: &str| match item.params.get(k) {
            Some(sfv::BareItem::Integer(n)) => *n,
            other => panic!("{k} = {other:?} in {line}"),
        };
        out.insert(name.to_string(), (int("r"), int("t")));
    }
    out
}

fn retry_after(head: &str) -> i64 {
    head.lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("retry-after")
                .then(|| v.trim().parse().unwrap())
        })
        .unwrap_or_else(|| panic!("no Retry-After in {head}"))
}

fn rule(name: &str, path: &str, algorithm: &str, rest: &str) -> String {
    format!(
        "[[rules]]\nname = \"{name}\"\nmatch = {{ path = \"{path}\" }}\nkey = [\"ip\"]\n\
         algorithm = \"{algorithm}\"\nscope = \"local\"\n{rest}\n"
    )
}

#[test]
fn t_on_a_rejection_is_retry_after_for_every_algorithm() {
    let api = OrdersApi::start("orders-1");
    let cases = [
        ("fixed", "fixed_window", "limit = 2\nwindow = \"20s\""),
        ("log", "sliding_window_log", "limit = 2\nwindow = \"20s\""),
        (
            "counter",
            "sliding_window_counter",
            "limit = 2\nwindow = \"20s\"",
        ),
        (
            "bucket",
            "token_bucket",
            "limit = 1\nwindow = \"10s\"\nburst = 3",
        ),
        (
            "leaky",
            "leaky_bucket",
            "limit = 1\nwindow = \"10s\"\nburst = 2",
        ),
    ];
    let mut body = format!(
        "{}\n[[routes]]\nname = \"debug\"\nmatch = {{ path_prefix = \"/debug\" }}\nupstream = \"orders\"\nauth = \"none\"\n",
        orders_upstream(&[api.addr])
    );
    for (name, algorithm, rest) in cases {
        body.push_str(&rule(name, &format!("/debug/{name}"), algorithm, rest));
    }
    let gw = Gateway::start(&body);
    for (name, algorithm, _) in cases {
        let path = format!("/debug/{name}");
        let mut rejected = None;
        for _ in 0..10 {
            let answer = http_get_raw(gw.addr, &path, Duration::from_secs(10)).unwrap();
            if answer.starts_with("HTTP/1.1 429") {
                rejected = Some(answer);
                break;
            }
        }
        let head = rejected.unwrap_or_else(|| panic!("{algorithm}: never rejected"));
        let (r, t) = fields(&head)[name];
        assert_eq!(r, 0, "{algorithm}: {head}");
        assert_eq!(
            t,
            retry_after(&head),
            "{algorithm}: t must be Retry-After\n{head}"
        );
    }
}

#[test]
fn a_rule_that_did_not_reject_shows_what_it_really_has_left() {
    let api = OrdersApi::start("orders-1");
    let body = format!(
        "{}\n[[routes]]\nname = \"debug\"\nmatch = {{ path_prefix = \"/debug\" }}\nupstream = \"orders\"\nauth = \"none\"\n\
         [[rules]]\nname = \"bucket\"\nkey = [\"ip\"]\nalgorithm = \"token_bucket\"\nlimit = 10\nwindow = \"1h\"\nscope = \"local\"\n\
         {}",
        orders_upstream(&[api.addr]),
        rule("once", "/debug/once", "fixed_window", "limit = 1\nwindow = \"1h\"")
    );
    let gw = Gateway::start(&body);
    let get = |path: &str| http_get_raw(gw.addr, path, Duration::from_secs(10)).unwrap();
    let first = get("/debug/once");
    assert!(first.starts_with("HTTP/1.1 200"), "{first}");
    assert_eq!(fields(&first)["bucket"].0, 9);
    // Refused by "once": nothing is charged, so the bucket still has 9.
    let refused = get("/debug/once");
    assert!(refused.starts_with("HTTP/1.1 429"), "{refused}");
    assert_eq!(fields(&refused)["bucket"].0, 9, "{refused}");
    // And the next admitted request proves it: 8 after it, not 7.
    let next = get("/debug/other");
    assert!(next.starts_with("HTTP/1.1 200"), "{next}");
    assert_eq!(fields(&next)["bucket"].0, 8, "{next}");
}

/// An upstream that answers every request on its connections with `103 Early Hints` and then
/// `200`.
fn early_hints_upstream() -> std::net::SocketAddr {
    raw_upstream(|mut conn| {
        use std::io::Write;
        while read_head(&mut conn).is_some() {
            let answer = "HTTP/1.1 103 Early Hints\r\nlink: </a.css>; rel=preload\r\n\r\n\
                          HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
            if conn.write_all(answer.as_bytes()).is_err() {
                return;
            }
        }
    })
}

/// The final response after an informational one still carries the RateLimit fields (the
/// informational one, where it is passed on, gets them too): the fields are handed to the
/// final response, and copied onto any before it.
#[test]
fn a_response_after_early_hints_keeps_the_ratelimit_fields() {
    let upstream = early_hints_upstream();
    let body = format!(
        "{}\n[[routes]]\nname = \"hints\"\nmatch = {{ path_prefix = \"/hints\" }}\nupstream = \"orders\"\nauth = \"none\"\n{}",
        orders_upstream(&[upstream]),
        rule("hinted", "/hints", "fixed_window", "limit = 100\nwindow = \"60s\""),
    );
    let gw = Gateway::start(&body);
    for n in 1..=2i64 {
        let answer = http_get_raw(gw.addr, "/hints", Duration::from_secs(10)).unwrap();
        let last = answer
            .rfind("HTTP/1.1 ")
            .unwrap_or_else(|| panic!("no status line in {answer}"));
        let (before, fin) = answer.split_at(last);
        assert!(fin.starts_with("HTTP/1.1 200"), "{answer}");
        assert_eq!(fields(fin)["hinted"].0, 100 - n, "{answer}");
        if before.starts_with("HTTP/1.1 103") {
            assert_eq!(fields(before)["hinted"].0, 100 - n, "{answer}");
        }
    }
}
