//! `[upstreams.protect]` at run time: an adaptive concurrency limit per upstream ([`limit`])
//! and, in front of it, a weighted fair queue of tenants ([`queue`]).
//!
//! Below the limit a request takes a slot with one compare-and-swap and goes on: no lock, no
//! tenant lookup, no allocation. At the limit it waits in the fair queue; a slot given back
//! goes straight to the next waiter in fair order. A request that waits past `queue_timeout`,
//! or is shed from a full queue, is answered 503 `upstream-overloaded` by the proxy. The slot
//! ([`Permit`]) is held for the whole exchange, retries on other targets included, and is
//! given back when dropped, however the exchange ends.
//!
//! The limit learns from floodgate's own exchanges with the upstream (time to the response
//! header, [`Permit::sample`]). Each gateway instance learns its own: each sees the latency
//! its traffic causes, and instances behind one balancer settle on shares of the upstream's
//! capacity without talking (as TCP flows share a link). Coordinating would buy fairness
//! between tenants across instances (a tenant pinned to one instance competes only there),
//! at a store round trip per request; it is not done.
//!
//! A [`Guard`] lives as long as its upstream stays configured: a reload keeps the learned
//! limit and the waiting requests, and applies the new bounds.

pub mod limit;
pub mod metrics;
pub mod queue;

use std::collections::{BTreeSet, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::oneshot;

use super::settings::Protect;
use crate::rules::RequestView;
use limit::Gradient;
use queue::{FairQueue, Pushed};

/// Why a request was refused a turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shed {
    /// It waited `queue_timeout` for a turn.
    Timeout,
    /// The queue was full and its tenant was the furthest over its due.
    QueueFull,
}

impl Shed {
    /// The `reason` label of `floodgate_upstream_shed_total`.
    pub fn as_str(self) -> &'static str {
        match self {
            Shed::Timeout => "queue_timeout",
            Shed::QueueFull => "queue_full",
        }
    }
}

/// Buckets of the per-tenant counts of requests in flight: a tenant's bucket is its hash
/// modulo this. Two tenants in one bucket share a count, which only makes each look busier
/// than it is.
const BUCKETS: usize = 1024;

/// The tenant health checks count as: their own, of weight 1.
pub const HEALTH_CHECKS: (u64, u32) = (u64::MAX, 1);

/// The bucket of `tenant` (a hash already).
fn bucket_of(tenant: u64) -> u32 {
    (tenant % BUCKETS as u64) as u32
}

/// The slots a tenant over its weighted share leaves free while others are active: an eighth
/// of the limit, at least one. What a newcomer of another tenant finds free at once, so that a
/// tenant's long or stuck requests delay only itself.
pub fn headroom(limit: u32) -> u32 {
    limit.div_ceil(8).max(1)
}

/// Whether a tenant of `weight` holding `held` slots is below its weighted share of `limit`
/// among active tenants of `total` weight (its own included): at least one slot.
fn under_share(held: u32, weight: u32, limit: u32, total: u64) -> bool {
    let share = (u64::from(limit) * u64::from(weight) / total.max(1)).max(1);
    u64::from(held) < share
}

/// A request waiting for a turn: where its answer goes, and whose it is.
struct Waiter {
    tx: oneshot::Sender<Turn>,
    tenant: u64,
    weight: u32,
}

/// What a waiter is told.
enum Turn {
    Go,
    Shed(Shed),
}

/// The locked part: the controller and the queue.
struct Inner {
    gradient: Gradient,
    queue: FairQueue<Waiter>,
    queue_timeout: Duration,
}

/// The guard of one upstream.
pub struct Guard {
    name: Arc<str>,
    limit: AtomicU32,
    in_flight: AtomicU32,
    queued: AtomicU32,
    /// Requests refused, by reason (also counted in the metric).
    shed: [AtomicU64; 2],
    /// Waiters whose client left (also counted in the metric).
    left: AtomicU64,
    /// Per tenant bucket: requests in flight (low 32 bits) and the weight the tenant entered
    /// with (high 32 bits), in one word so that the weight added to `active_weight` when the
    /// count leaves 0 is the one taken away when it comes back to 0.
    buckets: Box<[AtomicU64]>,
    /// The weights of the tenants with requests in flight, summed (signed: a leave may be
    /// counted an instant before the enter it follows; read as at least 0).
    active_weight: AtomicI64,
    inner: Mutex<Inner>,
}

impl std::fmt::Debug for Guard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guard")
            .field("name", &self.name)
            .field("limit", &self.limit())
            .finish()
    }
}

/// A request in the queue. Dropped before its answer is read (its client left), it leaves the
/// queue, or gives back the slot it was handed.
struct Waiting {
    guard: Arc<Guard>,
    bucket: u32,
    ticket: queue::Ticket,
    rx: oneshot::Receiver<Turn>,
    done: bool,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut inner = self.guard.inner.lock();
        if inner.queue.remove(self.ticket).is_some() {
            self.guard
                .queued
                .store(inner.queue.len() as u32, Ordering::SeqCst);
            return;
        }
        drop(inner);
        if let Ok(Turn::Go) = self.rx.try_recv() {
            self.guard.release(self.bucket);
        }
    }
}

/// One request's slot at the upstream; dropping it gives the slot back (to the next waiter).
pub struct Permit {
    guard: Arc<Guard>,
    /// Its tenant's bucket, counted in while the slot is held.
    bucket: u32,
    /// The exchange's outcome has fed the limit (once per exchange: a response that fails
    /// in its body after its header was sampled is not counted twice).
    recorded: bool,
}

impl std::fmt::Debug for Permit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Permit")
    }
}

impl Permit {
    /// Feeds the limit one exchange's latency (request sent to response header).
    pub fn sample(&mut self, took: Duration) {
        if !std::mem::replace(&mut self.recorded, true) {
            self.guard.sample(Ok(took), Instant::now());
        }
    }

    /// Feeds the limit one failed exchange, `took` after it was sent when known: a `5xx`
    /// answer, a connect error, a reset or a timeout. Not a latency: what an upstream answers
    /// fast while failing is not spare capacity, it is the upstream turning away what was
    /// above its capacity (`limit::Gradient::fail`).
    pub fn fail(&mut self, took: Option<Duration>) {
        if !std::mem::replace(&mut self.recorded, true) {
            self.guard.sample(Err(took), Instant::now());
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.guard.release(self.bucket);
    }
}

impl Guard {
    fn new(name: Arc<str>, p: &Protect, now: Instant) -> Guard {
        let gradient = Gradient::new(p.min_limit, p.max_limit, now);
        Guard {
            name,
            limit: AtomicU32::new(gradient.limit()),
            in_flight: AtomicU32::new(0),
            queued: AtomicU32::new(0),
            shed: [AtomicU64::new(0), AtomicU64::new(0)],
            left: AtomicU64::new(0),
            buckets: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            active_weight: AtomicI64::new(0),
            inner: Mutex::new(Inner {
                gradient,
                queue: FairQueue::new(p.max_queue),
                queue_timeout: p.queue_timeout,
            }),
        }
    }

    fn configure(&self, p: &Protect) {
        let mut inner = self.inner.lock();
        inner.gradient.set_bounds(p.min_limit, p.max_limit);
        inner.queue.set_max_len(p.max_queue);
        inner.queue_timeout = p.queue_timeout;
        self.limit.store(inner.gradient.limit(), Ordering::SeqCst);
        self.dispatch(&mut inner, Instant::now());
    }

    /// The limit now.
    pub fn limit(&self) -> u32 {
        self.limit.load(Ordering::Relaxed)
    }

    /// Requests holding a slot.
    pub fn in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Requests waiting for one.
    pub fn queued(&self) -> u32 {
        self.queued.load(Ordering::Relaxed)
    }

    /// Takes a slot if one is free below the limit with `reserve` more left free: the one
    /// atomic of the uncontended path.
    fn try_take(&self, limit: u32, reserve: u32) -> bool {
        self.in_flight
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n.saturating_add(reserve) < limit).then_some(n + 1)
            })
            .is_ok()
    }

    /// Slots held by the tenants of bucket `b`.
    fn held(&self, b: u32) -> u32 {
        self.buckets[b as usize].load(Ordering::SeqCst) as u32
    }

    /// The weights of the tenants with requests in flight.
    fn active_weight(&self) -> u64 {
        self.active_weight.load(Ordering::SeqCst).max(0) as u64
    }

    /// Counts a slot taken by a tenant of bucket `b` and `weight`.
    fn enter_bucket(&self, b: u32, weight: u32) {
        let cell = &self.buckets[b as usize];
        let update = cell.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| {
            Some(if v as u32 == 0 {
                (u64::from(weight) << 32) | 1
            } else {
                v + 1
            })
        });
        let old = update.unwrap_or_else(|v| v);
        if old as u32 == 0 {
            self.active_weight
                .fetch_add(i64::from(weight), Ordering::SeqCst);
        }
    }

    /// Counts a slot of bucket `b` given back.
    fn leave_bucket(&self, b: u32) {
        let cell = &self.buckets[b as usize];
        let update = cell.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| {
            (v as u32 > 0).then(|| v - 1)
        });
        if let Ok(old) = update {
            if old as u32 == 1 {
                self.active_weight
                    .fetch_sub((old >> 32) as i64, Ordering::SeqCst);
            }
        }
    }

    /// A slot at once for `tenant` of `weight` when nobody waits (a newcomer does not pass
    /// those who wait) and the upstream is below its limit; a tenant above its weighted share
    /// of the limit among the tenants in flight must leave [`headroom`] slots free. No lock,
    /// no allocation: a few atomics.
    pub fn try_enter(self: &Arc<Self>, (tenant, weight): (u64, u32)) -> Option<Permit> {
        if self.queued.load(Ordering::SeqCst) != 0 {
            return None;
        }
        let (b, weight) = (bucket_of(tenant), weight.max(1));
        let limit = self.limit.load(Ordering::SeqCst);
        let held = self.held(b);
        let total = self.active_weight() + if held == 0 { u64::from(weight) } else { 0 };
        let reserve = if under_share(held, weight, limit, total) {
            0
        } else {
            headroom(limit)
        };
        if !self.try_take(limit, reserve) {
            return None;
        }
        self.enter_bucket(b, weight);
        Some(Permit {
            guard: self.clone(),
            bucket: b,
            recorded: false,
        })
    }

    /// Waits for a turn as `tenant` of `weight`, at most the queue timeout, or until `gone`
    /// (the client went away) completes first: then the request leaves the queue at once,
    /// is never forwarded, and `None` is returned.
    pub async fn wait_unless(
        self: &Arc<Self>,
        tenant: u64,
        weight: u32,
        gone: impl std::future::Future<Output = ()>,
    ) -> Option<Result<Permit, Shed>> {
        tokio::select! {
            biased;
            turn = self.wait(tenant, weight) => Some(turn),
            () = gone => {
                // The wait's future is dropped here: `Waiting`'s drop takes it out of the queue
                // (or gives back a slot handed to it in between).
                self.left.fetch_add(1, Ordering::Relaxed);
                metrics::left(&self.name);
                None
            }
        }
    }

    /// Waits for a turn as `tenant` of `weight`, at most the queue timeout.
    pub async fn wait(self: &Arc<Self>, tenant: u64, weight: u32) -> Result<Permit, Shed> {
        let (tx, rx) = oneshot::channel();
        let now = Instant::now();
        let weight = weight.max(1);
        let waiter = Waiter { tx, tenant, weight };
        let (ticket, timeout) = {
            let mut inner = self.inner.lock();
            let ticket = match inner.queue.push(tenant, weight, waiter, now) {
                Pushed::Refused(_) => {
                    drop(inner);
                    return Err(self.count_shed(Shed::QueueFull));
                }
                Pushed::Queued { ticket, evicted } => {
                    if let Some(e) = evicted {
                        let _ = e.tx.send(Turn::Shed(Shed::QueueFull));
                    }
                    ticket
                }
            };
            self.queued
                .store(inner.queue.len() as u32, Ordering::SeqCst);
            // A slot may have come free between the fast path and the lock.
            self.dispatch(&mut inner, now);
            (ticket, inner.queue_timeout)
        };
        let mut waiting = Waiting {
            guard: self.clone(),
            bucket: bucket_of(tenant),
            ticket,
            rx,
            done: false,
        };
        let turn = match tokio::time::timeout(timeout, &mut waiting.rx).await {
            Ok(Ok(turn)) => turn,
            // The sender goes only with the guard's queue, which lives as long as we do.
            Ok(Err(_)) => Turn::Shed(Shed::Timeout),
            Err(_) => {
                let mut inner = self.inner.lock();
                if inner.queue.remove(ticket).is_some() {
                    self.queued
                        .store(inner.queue.len() as u32, Ordering::SeqCst);
                    Turn::Shed(Shed::Timeout)
                } else {
                    // Served or shed (under the lock) as the timer fired: the answer is there.
                    drop(inner);
                    waiting.rx.try_recv().unwrap_or(Turn::Shed(Shed::Timeout))
                }
            }
        };
        waiting.done = true;
        match turn {
            Turn::Go => Ok(Permit {
                guard: self.clone(),
                bucket: bucket_of(tenant),
                recorded: false,
            }),
            Turn::Shed(why) => Err(self.count_shed(why)),
        }
    }

    fn count_shed(&self, why: Shed) -> Shed {
        self.shed[why as usize].fetch_add(1, Ordering::Relaxed);
        metrics::shed(&self.name, why);
        why
    }

    /// Hands free slots to waiters in fair order. A waiting tenant that holds its weighted share
    /// of the limit or more (among the tenants in flight or waiting) is passed over while
    /// fewer than [`headroom`] slots would stay free: its long or stuck requests then delay
    /// itself, not the others. A slot nobody eligible waits for stays free.
    fn dispatch(&self, inner: &mut Inner, now: Instant) {
        if !inner.queue.is_empty() {
            // Waiting tenants with nothing in flight are active too.
            let waiting: u64 = inner
                .queue
                .waiting()
                .filter(|(t, _)| self.held(bucket_of(*t)) == 0)
                .map(|(_, w)| u64::from(w))
                .sum();
            loop {
                let limit = self.limit.load(Ordering::SeqCst);
                if inner.queue.is_empty() || !self.try_take(limit, 0) {
                    break;
                }
                let room = limit.saturating_sub(self.in_flight()) >= headroom(limit);
                let total = self.active_weight() + waiting;
                let timeout = inner.queue_timeout;
                let next = inner.queue.pop_where(
                    now,
                    timeout,
                    |late| {
                        let _ = late.tx.send(Turn::Shed(Shed::Timeout));
                    },
                    |tenant, weight| {
                        room || under_share(self.held(bucket_of(tenant)), weight, limit, total)
                    },
                );
                let Some(w) = next else {
                    self.in_flight.fetch_sub(1, Ordering::SeqCst);
                    break;
                };
                let b = bucket_of(w.tenant);
                self.enter_bucket(b, w.weight);
                if w.tx.send(Turn::Go).is_err() {
                    // Its client left while it waited: the slot goes to the next.
                    self.in_flight.fetch_sub(1, Ordering::SeqCst);
                    self.leave_bucket(b);
                }
            }
        }
        self.queued
            .store(inner.queue.len() as u32, Ordering::SeqCst);
    }

    fn release(&self, bucket: u32) {
        self.leave_bucket(bucket);
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        if self.queued.load(Ordering::SeqCst) > 0 {
            let mut inner = self.inner.lock();
            self.dispatch(&mut inner, Instant::now());
        }
    }

    /// One exchange's latency, or a failed one's (`Err`, with how long it took when known).
    fn sample(&self, took: Result<Duration, Option<Duration>>, now: Instant) {
        let in_flight = self.in_flight.load(Ordering::Relaxed);
        let mut inner = self.inner.lock();
        let changed = match took {
            Ok(took) => inner.gradient.sample(took, in_flight, now),
            Err(took) => inner.gradient.fail(took, in_flight, now),
        };
        if let Some(limit) = changed {
            // A lower limit takes effect as slots come back: none is taken from a request.
            let grew = limit > self.limit.swap(limit, Ordering::SeqCst);
            if grew {
                self.dispatch(&mut inner, now);
            }
        }
    }

    /// Requests refused for `why` since the guard was made.
    pub fn shed_count(&self, why: Shed) -> u64 {
        self.shed[why as usize].load(Ordering::Relaxed)
    }

    /// The guard's state for `/upstreams`, `/stats` and the dashboard.
    pub fn status_json(&self) -> serde_json::Value {
        let (min_rtt, tenants, probing) = {
            let inner = self.inner.lock();
            (
                inner.gradient.min_rtt(),
                inner.queue.tenants(),
                inner.gradient.probing(),
            )
        };
        serde_json::json!({
            "limit": self.limit(),
            "probing": probing,
            "in_flight": self.in_flight(),
            "queued": self.queued(),
            "queued_tenants": tenants,
            "min_rtt_ms": min_rtt.map(|d| d.as_secs_f64() * 1000.0),
            "shed": {
                "queue_timeout": self.shed_count(Shed::Timeout),
                "queue_full": self.shed_count(Shed::QueueFull),
            },
            "left": self.left.load(Ordering::Relaxed),
        })
    }
}

/// The tenant a request belongs to under `p` (a hash of its `fair_by` parts) and its weight.
pub fn tenant(p: &Protect, view: &RequestView<'_>) -> (u64, u32) {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    if p.fair_by.is_empty() {
        customer(view).hash(&mut h);
    }
    for part in &p.fair_by {
        match crate::rules::key::read(part, view) {
            Some(v) => {
                1u8.hash(&mut h);
                v.as_bytes().hash(&mut h);
            }
            None => 0u8.hash(&mut h),
        }
    }
    let weight = p
        .weights
        .iter()
        .filter_map(|(part, table)| {
            let v = crate::rules::key::read(part, view)?;
            let v = v.as_bytes();
            table
                .iter()
                .find(|(name, _)| name.as_bytes() == v)
                .map(|(_, w)| *w)
        })
        .max()
        .unwrap_or(1);
    (h.finish(), weight)
}

/// The customer a request comes from, `fair_by`'s default: the `user` of its key (several
/// keys of one customer are one tenant, so minting keys buys no share), else the network of
/// its client IP, a /24 for IPv4 and a /64 for IPv6 (one host, or one customer's block of
/// addresses, is one tenant, so spreading over addresses of a block buys none either).
#[derive(Hash)]
enum Customer<'a> {
    User(&'a str),
    V4([u8; 3]),
    V6([u16; 4]),
}

fn customer<'a>(view: &RequestView<'a>) -> Customer<'a> {
    if let Some(id) = view.identity {
        return Customer::User(id.user.as_str());
    }
    // A mapped IPv4 address is its IPv4 address.
    match view.ip.to_canonical() {
        std::net::IpAddr::V4(ip) => {
            let [a, b, c, _] = ip.octets();
            Customer::V4([a, b, c])
        }
        std::net::IpAddr::V6(ip) => {
            let s = ip.segments();
            Customer::V6([s[0], s[1], s[2], s[3]])
        }
    }
}

/// Every upstream's guard by name: what a reload keeps.
fn guards() -> &'static Mutex<HashMap<Arc<str>, Arc<Guard>>> {
    static G: LazyLock<Mutex<HashMap<Arc<str>, Arc<Guard>>>> = LazyLock::new(|| {
        metrics::register();
        Mutex::new(HashMap::new())
    });
    &G
}

/// The guard of upstream `name` for settings `p`: the one in force, with the new bounds, or
/// a new one starting at `min_limit`.
pub fn attach(name: &Arc<str>, p: &Protect) -> Arc<Guard> {
    let mut map = guards().lock();
    if let Some(g) = map.get(name) {
        g.configure(p);
        return g.clone();
    }
    let g = Arc::new(Guard::new(name.clone(), p, Instant::now()));
    metrics::export(name);
    map.insert(name.clone(), g.clone());
    g
}

/// The guard of upstream `name` in force now, if it has `protect` (what a health check of a
/// registry kept across reloads asks at each check).
pub fn current(name: &str) -> Option<Arc<Guard>> {
    guards().lock().get(name).cloned()
}

/// Forgets the guard of upstream `name` (it no longer has `protect`).
pub fn forget(name: &str) {
    guards().lock().remove(name);
}

/// Forgets the guards of upstreams that are gone or no longer have `protect`.
pub fn retain(names: &BTreeSet<&str>) {
    guards().lock().retain(|k, _| names.contains(&**k));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::auth::{HeaderText, Identity};
    use http::{HeaderMap, Method};

    fn protect(fair_by: Vec<crate::rules::KeyPart>) -> Protect {
        Protect {
            fair_by,
            weights: Vec::new(),
            min_limit: 4,
            max_limit: 100,
            queue_timeout: Duration::from_millis(500),
            max_queue: 100,
        }
    }

    fn identity(id: &str, user: &str) -> Identity {
        Identity {
            id: HeaderText::new(id).unwrap(),
            user: HeaderText::new(user).unwrap(),
            plan: None,
            claims: None,
        }
    }

    /// The tenant of a request from `ip` with `identity` under `p`.
    fn of(p: &Protect, ip: &str, identity: Option<&Identity>) -> u64 {
        let headers = HeaderMap::new();
        let view = RequestView {
            route: "orders",
            case_sensitive: true,
            method: &Method::GET,
            path: "/orders",
            query: None,
            host: None,
            headers: &headers,
            ip: ip.parse().unwrap(),
            identity,
        };
        tenant(p, &view).0
    }

    #[test]
    fn a_tenant_over_its_share_leaves_headroom_while_another_is_active() {
        let mut p = protect(Vec::new());
        (p.min_limit, p.max_limit) = (8, 8);
        let g = Arc::new(Guard::new("t".into(), &p, Instant::now()));
        let (hog, quiet) = ((1, 1), (2, 4));
        // Alone, a tenant may take every slot: its share is the whole limit.
        let all: Vec<_> = (0..8).filter_map(|_| g.try_enter(hog)).collect();
        assert_eq!(all.len(), 8);
        assert!(g.try_enter(quiet).is_none(), "no slot is left");
        drop(all);
        assert_eq!(g.active_weight(), 0);
        // With the quiet tenant in flight, the hog stops one slot short (headroom(8) = 1).
        let q1 = g.try_enter(quiet).expect("a free upstream");
        let hogs: Vec<_> = std::iter::from_fn(|| g.try_enter(hog)).take(10).collect();
        assert_eq!(hogs.len(), 6);
        // The slot left is the quiet tenant's next request's.
        let q2 = g.try_enter(quiet).expect("the headroom");
        assert_eq!(g.in_flight(), 8);
        drop((q1, q2, hogs));
        assert_eq!((g.in_flight(), g.active_weight()), (0, 0));
    }

    #[test]
    fn the_default_tenant_is_the_customer_not_its_keys_or_addresses() {
        let p = protect(Vec::new());
        let (a1, a2, b) = (
            identity("acme-1", "acme"),
            identity("acme-2", "acme"),
            identity("beta-1", "beta"),
        );
        // Keys of one customer are one tenant, wherever they come from.
        assert_eq!(
            of(&p, "10.0.0.1", Some(&a1)),
            of(&p, "192.0.2.7", Some(&a2))
        );
        assert_ne!(of(&p, "10.0.0.1", Some(&a1)), of(&p, "10.0.0.1", Some(&b)));
        // Without a key: the /24 of IPv4, the /64 of IPv6 (and a mapped IPv4 as IPv4).
        assert_eq!(of(&p, "198.51.100.1", None), of(&p, "198.51.100.254", None));
        assert_ne!(of(&p, "198.51.100.1", None), of(&p, "198.51.101.1", None));
        assert_eq!(
            of(&p, "2001:db8:1:2::1", None),
            of(&p, "2001:db8:1:2:ffff::9", None)
        );
        assert_ne!(
            of(&p, "2001:db8:1:2::1", None),
            of(&p, "2001:db8:1:3::1", None)
        );
        assert_eq!(
            of(&p, "::ffff:198.51.100.9", None),
            of(&p, "198.51.100.1", None)
        );
        // A customer named like an address is still a customer.
        let named = identity("k", "198.51.100.1");
        assert_ne!(
            of(&p, "10.0.0.1", Some(&named)),
            of(&p, "198.51.100.1", None)
        );
        // An explicit fair_by is kept: api_key tells the two keys of acme apart.
        let by_key = protect(vec![crate::rules::KeyPart::ApiKey]);
        assert_ne!(
            of(&by_key, "10.0.0.1", Some(&a1)),
            of(&by_key, "10.0.0.1", Some(&a2))
        );
    }
}
