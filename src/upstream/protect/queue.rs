//! The weighted fair queue of the requests waiting for a turn at an upstream, pure and
//! clock-injected.
//!
//! Start-time fair queueing (Goyal et al., 1996): each request gets a virtual start tag, the
//! later of the queue's virtual time and its tenant's previous finish tag, and a finish tag
//! `start + 1/weight`; the request with the smallest start tag is served next and the virtual
//! time moves to it. So among tenants that keep requests waiting, turns go in proportion to
//! their weights, whatever each sends; a tenant that waits for nothing is owed nothing (its tag
//! starts at the virtual time: no credit is saved while idle), and a turn is never left unused
//! while anyone waits (work conserving).
//!
//! When the queue is full, the tenant furthest over its due (the most waiting requests per unit
//! of weight, counting the newcomer) loses its most recent request: a newcomer of the busiest
//! tenant is refused, otherwise that tenant's last waiter makes room for it.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::{Duration, Instant};

/// Virtual time of one turn at weight 1.
const SCALE: u64 = 1 << 20;

/// The most waiting requests [`FairQueue::pop_where`] looks at for one turn.
pub const MAX_SCAN: usize = 1024;

/// Where a request waits: its start tag and arrival order (the key of its entry).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Ticket {
    start: u64,
    seq: u64,
}

struct Entry<T> {
    tenant: u64,
    since: Instant,
    value: T,
}

struct Tenant {
    weight: u32,
    /// The finish tag of its last queued request.
    finish: u64,
    /// Its waiting requests, in order.
    tickets: VecDeque<Ticket>,
}

/// What [`FairQueue::push`] did.
pub enum Pushed<T> {
    /// The request waits; `evicted` is the waiter of the tenant furthest over its due that made
    /// room for it.
    Queued {
        /// Where it waits.
        ticket: Ticket,
        /// Shed to make room.
        evicted: Option<T>,
    },
    /// The queue is full and the request's own tenant is furthest over its due: refused.
    Refused(T),
}

/// Requests waiting per tenant, in weighted fair order.
pub struct FairQueue<T> {
    entries: BTreeMap<Ticket, Entry<T>>,
    tenants: HashMap<u64, Tenant>,
    vtime: u64,
    seq: u64,
    max_len: usize,
}

impl<T> FairQueue<T> {
    /// An empty queue holding at most `max_len` requests (at least 1).
    pub fn new(max_len: usize) -> FairQueue<T> {
        FairQueue {
            entries: BTreeMap::new(),
            tenants: HashMap::new(),
            vtime: 0,
            seq: 0,
            max_len: max_len.max(1),
        }
    }

    /// Changes the bound (a reload); requests already waiting stay.
    pub fn set_max_len(&mut self, max_len: usize) {
        self.max_len = max_len.max(1);
    }

    /// Requests waiting.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether none waits.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Tenants with a request waiting.
    pub fn tenants(&self) -> usize {
        self.tenants.len()
    }

    /// Queues `value` of `tenant` (of `weight`, at least 1) arriving `now`.
    pub fn push(&mut self, tenant: u64, weight: u32, value: T, now: Instant) -> Pushed<T> {
        let weight = weight.max(1);
        let mut evicted = None;
        if self.entries.len() >= self.max_len {
            let own = self
                .tenants
                .get(&tenant)
                .map_or(1, |t| t.tickets.len() as u64 + 1);
            // Furthest over its due: the most waiting per unit of weight (cross-multiplied).
            let busiest = self
                .tenants
                .iter()
                .filter(|(id, _)| **id != tenant)
                .max_by_key(|(_, t)| (t.tickets.len() as u128 * SCALE as u128) / t.weight as u128)
                .map(|(id, t)| (*id, t.tickets.len() as u64, t.weight));
            match busiest {
                Some((victim, n, w)) if n as u128 * weight as u128 > own as u128 * w as u128 => {
                    let last = self
                        .tenants
                        .get(&victim)
                        .and_then(|t| t.tickets.back().copied());
                    evicted = last.and_then(|ticket| self.remove(ticket));
                }
                _ => return Pushed::Refused(value),
            }
        }
        let vtime = self.vtime;
        let t = self.tenants.entry(tenant).or_insert(Tenant {
            weight,
            finish: 0,
            tickets: VecDeque::new(),
        });
        t.weight = weight;
        let start = t.finish.max(vtime);
        t.finish = start + SCALE / weight as u64;
        self.seq += 1;
        let ticket = Ticket {
            start,
            seq: self.seq,
        };
        t.tickets.push_back(ticket);
        self.entries.insert(
            ticket,
            Entry {
                tenant,
                since: now,
                value,
            },
        );
        Pushed::Queued { ticket, evicted }
    }

    /// The next request to serve. Requests that have waited `timeout` or longer by `now` are
    /// handed to `expired` instead (their turn would come too late).
    pub fn pop(&mut self, now: Instant, timeout: Duration, expired: impl FnMut(T)) -> Option<T> {
        self.pop_where(now, timeout, expired, |_, _| true)
    }

    /// The next request to serve among the tenants `eligible(tenant, weight)` accepts (a tenant
    /// that already holds more than its share of the upstream is passed over while others
    /// wait); `None` if no waiting tenant is eligible. At most [`MAX_SCAN`] waiting requests
    /// are looked at, so that a tenant with thousands waiting costs a turn a bounded time.
    /// Late requests found on the way are handed to `expired`.
    pub fn pop_where(
        &mut self,
        now: Instant,
        timeout: Duration,
        mut expired: impl FnMut(T),
        mut eligible: impl FnMut(u64, u32) -> bool,
    ) -> Option<T> {
        let mut passed: smallvec::SmallVec<[u64; 8]> = smallvec::SmallVec::new();
        let mut late = Vec::new();
        let mut found = None;
        for (&ticket, entry) in self.entries.iter().take(MAX_SCAN) {
            if now.saturating_duration_since(entry.since) >= timeout {
                late.push(ticket);
                continue;
            }
            if passed.contains(&entry.tenant) {
                continue;
            }
            let weight = self.tenants.get(&entry.tenant).map_or(1, |t| t.weight);
            if eligible(entry.tenant, weight) {
                found = Some(ticket);
                break;
            }
            passed.push(entry.tenant);
        }
        for ticket in late {
            if let Some(value) = self.remove(ticket) {
                expired(value);
            }
        }
        let ticket = found?;
        let value = self.remove(ticket)?;
        self.vtime = self.vtime.max(ticket.start);
        Some(value)
    }

    /// Each waiting tenant and its weight.
    pub fn waiting(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.tenants.iter().map(|(id, t)| (*id, t.weight))
    }

    /// Takes a waiting request out (it timed out or its client left); `None` if it was served
    /// or shed already.
    pub fn remove(&mut self, ticket: Ticket) -> Option<T> {
        let entry = self.entries.remove(&ticket)?;
        self.forget(entry.tenant, ticket);
        Some(entry.value)
    }

    fn forget(&mut self, tenant: u64, ticket: Ticket) {
        if let Some(t) = self.tenants.get_mut(&tenant) {
            if let Some(i) = t.tickets.iter().position(|k| *k == ticket) {
                t.tickets.remove(i);
            }
            if t.tickets.is_empty() {
                // Owed nothing once it waits for nothing: its next request starts at the
                // virtual time, like a newcomer's.
                self.tenants.remove(&tenant);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LONG: Duration = Duration::from_secs(3600);

    fn drain(q: &mut FairQueue<u64>, n: usize, now: Instant) -> Vec<u64> {
        (0..n).filter_map(|_| q.pop(now, LONG, |_| {})).collect()
    }

    #[test]
    fn an_ineligible_tenant_is_passed_over_and_keeps_its_place() {
        let now = Instant::now();
        let mut q = FairQueue::new(100);
        for _ in 0..5 {
            q.push(1, 1, 1, now);
        }
        q.push(2, 4, 2, now);
        let not_1 = |t: u64, _: u32| t != 1;
        assert_eq!(q.pop_where(now, LONG, |_| {}, not_1), Some(2));
        assert_eq!(
            q.pop_where(now, LONG, |_| {}, not_1),
            None,
            "only tenant 1 waits"
        );
        assert_eq!(q.len(), 5);
        assert_eq!(drain(&mut q, 5, now), vec![1; 5]);
    }

    #[test]
    fn turns_follow_the_weights_among_busy_tenants() {
        let now = Instant::now();
        let mut q = FairQueue::new(10_000);
        // Tenant 1 (weight 4) and tenant 2 (weight 1) both keep far more waiting than served.
        for _ in 0..1000 {
            q.push(1, 4, 1, now);
            q.push(2, 1, 2, now);
        }
        let served = drain(&mut q, 500, now);
        let ones = served.iter().filter(|t| **t == 1).count();
        assert_eq!(ones, 400, "4:1 of 500 turns");
    }

    #[test]
    fn a_quiet_tenant_goes_ahead_of_a_flood() {
        let now = Instant::now();
        let mut q = FairQueue::new(10_000);
        for _ in 0..128 {
            q.push(1, 1, 1, now);
        }
        // Some of the flood is served; then the quiet tenant's request arrives.
        assert_eq!(drain(&mut q, 10, now), vec![1; 10]);
        q.push(2, 1, 2, now);
        let next = drain(&mut q, 2, now);
        assert!(next.contains(&2), "served within two turns: {next:?}");
    }

    #[test]
    fn work_conserving_an_idle_tenant_leaves_its_share_to_the_busy_one() {
        let now = Instant::now();
        let mut q = FairQueue::new(10_000);
        for _ in 0..100 {
            q.push(1, 1, 1, now);
        }
        // Tenant 2 (weight 100) sends nothing: tenant 1 gets every turn, none is left unused.
        assert_eq!(drain(&mut q, 100, now), vec![1; 100]);
        assert!(q.is_empty());
        // And idling earned tenant 1 no credit over a tenant that arrives later.
        for _ in 0..10 {
            q.push(1, 1, 1, now);
            q.push(2, 1, 2, now);
        }
        let served = drain(&mut q, 10, now);
        assert_eq!(served.iter().filter(|t| **t == 1).count(), 5);
    }

    #[test]
    fn requests_past_the_timeout_are_expired_not_served() {
        let t0 = Instant::now();
        let mut q = FairQueue::new(100);
        q.push(1, 1, 10, t0);
        q.push(1, 1, 11, t0 + Duration::from_millis(400));
        let mut expired = Vec::new();
        let timeout = Duration::from_millis(500);
        let next = q.pop(t0 + Duration::from_millis(600), timeout, |v| {
            expired.push(v)
        });
        assert_eq!(next, Some(11));
        assert_eq!(expired, vec![10]);
        assert!(q.is_empty());
    }

    #[test]
    fn a_full_queue_sheds_the_tenant_furthest_over_its_due() {
        let now = Instant::now();
        let mut q = FairQueue::new(10);
        for i in 0..8 {
            assert!(matches!(
                q.push(1, 1, 100 + i, now),
                Pushed::Queued { evicted: None, .. }
            ));
        }
        q.push(2, 4, 200, now);
        q.push(3, 1, 300, now);
        // Full. The flood's own newcomer is refused.
        assert!(matches!(q.push(1, 1, 108, now), Pushed::Refused(108)));
        // A quiet tenant's newcomer takes the flood's last place.
        match q.push(3, 1, 301, now) {
            Pushed::Queued { evicted, .. } => assert_eq!(evicted, Some(107)),
            Pushed::Refused(_) => panic!("the quiet tenant was refused"),
        }
        // Weight counts: tenant 2 (weight 4) with 2 waiting is under tenant 1's 7 per 1.
        match q.push(2, 4, 201, now) {
            Pushed::Queued { evicted, .. } => assert_eq!(evicted, Some(106)),
            Pushed::Refused(_) => panic!("the weighted tenant was refused"),
        }
        assert_eq!(q.len(), 10);
    }

    #[test]
    fn removed_waiters_are_gone_and_tenants_are_forgotten() {
        let now = Instant::now();
        let mut q = FairQueue::new(10);
        let Pushed::Queued { ticket, .. } = q.push(1, 1, 1, now) else {
            panic!()
        };
        assert_eq!(q.tenants(), 1);
        assert_eq!(q.remove(ticket), Some(1));
        assert_eq!(q.remove(ticket), None);
        assert_eq!(q.tenants(), 0);
        assert!(q.pop(now, LONG, |_| {}).is_none());
    }
}
