//! What `[tracing]` costs a request, counted in allocations on the request's thread: without
//! the section the request path builds nothing (no span, no context, no allocation, no export
//! thread); with it, the numbers a traced request adds are printed (`--nocapture`).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::path::Path;

use floodgate::config::Config;
use floodgate::limiter::engine::Limiter;
use floodgate::request::admission::{admit, Request};
use floodgate::telemetry::RequestTrace;
use http::{HeaderMap, Method, Uri};

/// Counts the allocations of the current thread (other test threads do not disturb it).
struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: every call is forwarded to the system allocator unchanged; the counter is a
// thread-local `Cell` without a destructor, so touching it never allocates or reenters.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.with(|a| a.set(a.get() + 1));
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.with(|a| a.set(a.get() + 1));
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

const BASE: &str = r#"
[[upstreams]]
name = "orders"
targets = ["127.0.0.1:9"]

[[routes]]
name = "orders"
match = { path_prefix = "/orders" }
upstream = "orders"
auth = "none"

[[rules]]
name = "per-ip"
key = ["ip"]
algorithm = "token_bucket"
limit = 1000000
window = "1s"
"#;

/// What `n` requests (after a warm-up) allocated.
struct Counted {
    /// For tracing (`RequestTrace::start`, the decision's record, the spans' end), per request.
    tracing: f64,
    /// In admission itself, per request.
    admission: f64,
    /// For tracing, the most any unsampled request allocated (0 when none was unsampled).
    unsampled_most: u64,
    /// Requests that were sampled.
    sampled: u64,
}

/// Allocations of what the proxy does for tracing around admission and of admission itself,
/// over `n` requests after a warm-up.
fn per_request(cfg: &Config, limiter: &Limiter, n: u64) -> Counted {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let uri: Uri = "/orders/1".parse().unwrap();
    let mut headers = HeaderMap::new();
    headers.insert(
        "traceparent",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
            .parse()
            .unwrap(),
    );
    let peer = "192.0.2.7".parse().unwrap();
    let (mut tracing, mut admission) = (0u64, 0u64);
    let (mut unsampled_most, mut sampled) = (0u64, 0u64);
    for i in 0..n + 100 {
        let before = allocations();
        // As `proxy::request_filter` does: nothing unless the config has `[tracing]`.
        let mut trace = cfg.tracing.as_ref().and_then(|s| {
            RequestTrace::start(s, &[], peer, &Method::GET, uri.path(), &headers, false)
        });
        let started = allocations();
        let request = Request {
            method: &Method::GET,
            uri: &uri,
            raw_target: b"/orders/1",
            headers: &headers,
            peer,
            request_id: "req-1",
            traced: trace.as_ref().is_some_and(|t| t.is_recording()),
        };
        let admitted = rt.block_on(admit(cfg, limiter, &request));
        let decided = allocations();
        let traced = request.traced;
        if let (Some(t), Some(d)) = (&mut trace, &admitted.decision) {
            t.admission(d);
        }
        drop(admitted);
        if let Some(t) = trace {
            t.finish(200, None);
        }
        let after = allocations();
        if i >= 100 {
            let for_tracing = (started - before) + (after - decided);
            tracing += for_tracing;
            admission += decided - started;
            if traced {
                sampled += 1;
            } else {
                unsampled_most = unsampled_most.max(for_tracing);
            }
        }
    }
    Counted {
        tracing: tracing as f64 / n as f64,
        admission: admission as f64 / n as f64,
        unsampled_most,
        sampled,
    }
}

fn export_thread_running() -> bool {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(Result::ok)
        .any(|t| {
            std::fs::read_to_string(t.path().join("comm"))
                .is_ok_and(|c| c.trim() == "floodgate-otlp")
        })
}

#[test]
fn without_tracing_the_request_path_builds_nothing() {
    let path = Path::new("/nonexistent/gateway.toml");
    let off = Config::from_str(path, BASE).unwrap();
    let limiter = Limiter::new(&off.store);
    let off_counted = per_request(&off, &limiter, 1000);
    let admission = off_counted.admission;
    eprintln!(
        "no [tracing]: {} allocations for tracing, {admission} in admission per request",
        off_counted.tracing
    );
    assert_eq!(
        off_counted.tracing, 0.0,
        "no [tracing]: nothing allocated for tracing"
    );
    assert!(!export_thread_running(), "no [tracing]: no export thread");

    // With it, an unsampled request (the peer is untrusted: its sampled traceparent is not
    // continued, and the ratio decides) allocates nothing for tracing either, and admission
    // records nothing for it; a sampled one does (so the zeros are measurements, not a counter
    // that counts nothing). Nothing listens on port 9: the exporter's failures are only
    // counted.
    for ratio in ["0.0", "0.01", "1.0"] {
        let text = format!(
            "{BASE}\n[tracing]\notlp_endpoint = \"http://127.0.0.1:9\"\nsample_ratio = {ratio}\n"
        );
        let on = Config::from_str(path, &text).unwrap();
        // The tracer starts once; a reload's ratio reaches it this way.
        floodgate::telemetry::reconfigure(on.tracing.as_ref());
        let c = per_request(&on, &limiter, 1000);
        eprintln!(
            "[tracing] sample_ratio {ratio}: {} allocations for tracing, {} in admission per request; {} sampled, an unsampled one allocated at most {}",
            c.tracing, c.admission, c.sampled, c.unsampled_most
        );
        assert_eq!(
            c.unsampled_most, 0,
            "sample_ratio {ratio}: an unsampled request allocated for tracing"
        );
        match ratio {
            "1.0" => {
                assert_eq!(c.sampled, 1000);
                assert!(
                    c.tracing > 0.0 && c.admission > admission,
                    "the decision is recorded"
                );
            }
            "0.0" => {
                assert_eq!((c.sampled, c.tracing), (0, 0.0));
                assert_eq!(
                    c.admission, admission,
                    "nothing recorded for an unsampled request"
                );
            }
            // About 10 of 1000 sampled (the ratio's draw): some, far from all.
            _ => assert!(
                (1..100).contains(&c.sampled),
                "{} sampled at 0.01",
                c.sampled
            ),
        }
    }
    assert!(export_thread_running());
}
