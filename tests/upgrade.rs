//! Zero-downtime binary upgrade through the real binary: a second floodgate started with
//! `--upgrade` takes the listening sockets over from the running one (Pingora's hand-off on
//! SIGQUIT) while clients keep sending requests, and not one request fails.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::upgrade::{self, HandedOver};
use common::*;

/// One `GET path` on a fresh connection: the status, or what went wrong.
///
/// Every request opens its own connection on purpose: what an upgrade must not break is
/// accepting connections. (A client that reuses an idle keep-alive connection can always race
/// the server closing it, upgrade or not; HTTP clients retry that case for idempotent requests.)
fn status_of(addr: SocketAddr, path: &str) -> Result<u16, String> {
    http_get(addr, path, Duration::from_secs(30)).map(|(status, _)| status)
}

/// Client load: one thread per path, each sending requests back to back until dropped (or for
/// at most two minutes), counting successes and recording every failure.
struct Load {
    stop: Arc<AtomicBool>,
    ok: Arc<AtomicUsize>,
    failures: Arc<Mutex<Vec<String>>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Load {
    fn start(addr: SocketAddr, paths: &[&'static str]) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let ok = Arc::new(AtomicUsize::new(0));
        let failures = Arc::new(Mutex::new(Vec::new()));
        let threads = paths
            .iter()
            .map(|&path| {
                let (stop, ok, failures) = (stop.clone(), ok.clone(), failures.clone());
                std::thread::spawn(move || {
                    let deadline = Instant::now() + Duration::from_secs(120);
                    while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                        match status_of(addr, path) {
                            Ok(200) => {
                                ok.fetch_add(1, Ordering::Relaxed);
                            }
                            Ok(status) => failures.lock().unwrap().push(format!("status {status}")),
                            Err(e) => failures.lock().unwrap().push(e),
                        }
                    }
                })
            })
            .collect();
        Load {
            stop,
            ok,
            failures,
            threads,
        }
    }

    fn ok(&self) -> usize {
        self.ok.load(Ordering::Relaxed)
    }

    /// Waits until `n` requests have succeeded in all; panics after `limit`.
    fn wait_ok(&self, n: usize, limit: Duration, what: &str) {
        let start = Instant::now();
        while self.ok() < n {
            assert!(
                start.elapsed() < limit,
                "{what}: {} of {n} requests succeeded within {limit:?}; failures: {:?}",
                self.ok(),
                self.failures.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Stops the load and returns the failures.
    fn finish(mut self) -> Vec<String> {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            t.join().expect("load thread");
        }
        std::mem::take(&mut *self.failures.lock().unwrap())
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

#[test]
fn upgrade_hands_the_listeners_over_without_failing_a_request() {
    let api = OrdersApi::start("orders-1");
    let body = format!(
        r#"
[[upstreams]]
name = "orders"
targets = ["{}"]
connect_timeout = "1s"
read_timeout = "10s"

[[routes]]
name = "orders"
match = {{ path_prefix = "/orders" }}
upstream = "orders"
auth = "none"
"#,
        api.addr
    );
    let mut old = Gateway::start_custom(
        |addr, admin| {
            format!(
                "[server]\nlisten = [\"{addr}\"]\nadmin_listen = \"{admin}\"\nthreads = 2\n\
                 grace_period = \"20s\"\n"
            )
        },
        &body,
        &[],
    );
    let dir = old.dir.path().to_path_buf();

    // Quick requests, and one slow one after the other, which is in flight nearly all the time:
    // also when the old process stops accepting, so it has to wait for it.
    let load = Load::start(
        old.addr,
        &[
            "/orders?delay_ms=20",
            "/orders?delay_ms=20",
            "/orders?delay_ms=20",
            "/orders?delay_ms=1000",
        ],
    );
    load.wait_ok(20, Duration::from_secs(20), "before the upgrade");

    // The new process binds the upgrade socket and waits there for the listeners; SIGQUIT:
    // the old process sends its listeners over, serves alongside the new one for a few
    // seconds, then drains and exits.
    let config = old.config_path();
    let HandedOver {
        mut new,
        new_log,
        old_status: status,
    } = upgrade::hand_over_blocking(&mut old, &config, &dir);
    assert!(status.success(), "old exit status {status}\n{}", old.logs());

    // Only the new process is left, and it serves, on the same port and admin port.
    let after = load.ok();
    load.wait_ok(after + 40, Duration::from_secs(20), "after the upgrade");
    assert!(
        new.child.try_wait().unwrap().is_none(),
        "the new process exited: {}",
        std::fs::read_to_string(&new_log).unwrap_or_default()
    );
    assert_eq!(status_of(old.admin, "/healthz"), Ok(200));

    let served = load.ok();
    let failures = load.finish();
    println!(
        "{served} requests served, {} of them after the old process exited; {} failed",
        served - after,
        failures.len()
    );
    assert!(
        failures.is_empty(),
        "{} of {} requests failed during the upgrade: {:?}\nold:\n{}\nnew:\n{}",
        failures.len(),
        served + failures.len(),
        failures,
        old.logs(),
        std::fs::read_to_string(&new_log).unwrap_or_default()
    );
}
