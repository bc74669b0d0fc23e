//! What `[upstreams.protect]` costs the request path, counted by a counting global allocator
//! (this test binary's own): a route without `protect` gets no allocation from the new hook,
//! and one with it allocates nothing to take and give back a slot below the limit.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::path::Path;

use floodgate::config::Config;
use floodgate::request::forwarding::{enter, Entry};

struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: every call is passed to the system allocator unchanged; the count is a thread-local
// `Cell` with a const initializer, which allocates nothing itself.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Allocations `f` makes on this thread.
fn allocations<T>(f: impl FnOnce() -> T) -> (T, u64) {
    let before = ALLOCATIONS.with(Cell::get);
    let out = f();
    (out, ALLOCATIONS.with(Cell::get) - before)
}

fn config(protect: &str) -> Config {
    let text = format!(
        "[[upstreams]]\nname = \"alloc-{}\"\ntargets = [\"127.0.0.1:9\"]\n{protect}\n\
         [[routes]]\nname = \"r\"\nupstream = \"alloc-{}\"\nauth = \"none\"\n",
        protect.len(),
        protect.len()
    );
    Config::from_str(Path::new("/tmp/protect-alloc/gateway.toml"), &text).expect("valid config")
}

#[test]
fn a_route_without_protect_allocates_nothing_more() {
    let cfg = config("");
    let upstream = &cfg.upstreams[0];
    for _ in 0..3 {
        let (entry, n) = allocations(|| enter(upstream, (7, 1)));
        assert!(matches!(entry, Entry::Unguarded));
        assert_eq!(n, 0, "the protect hook allocated on an unprotected route");
    }
}

#[test]
fn below_the_limit_a_slot_costs_no_allocation() {
    let cfg = config("[upstreams.protect]\nmin_limit = 8\n");
    let guard = cfg.upstreams[0].pool().protect.clone().expect("a guard");
    for _ in 0..3 {
        let (permit, n) = allocations(|| guard.try_enter((7, 1)));
        assert!(permit.is_some());
        assert_eq!(n, 0, "taking a slot allocated");
        let ((), n) = allocations(|| drop(permit));
        assert_eq!(n, 0, "giving a slot back allocated");
    }
    assert_eq!(guard.in_flight(), 0);
}
