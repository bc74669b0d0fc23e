//! The connection caps: open connections in all and per client IP, within the process's
//! open-file budget. A leaf (it knows no gateway), shared by the proxy's listeners and the
//! rate-limit service's.

use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use hashbrown::HashMap;
use parking_lot::Mutex;

use crate::config::Connections;
use crate::metrics::metrics;

/// Open connections, in all and per client IP.
#[derive(Debug, Default)]
pub struct ConnectionTable {
    open: AtomicUsize,
    per_ip: Mutex<HashMap<IpAddr, usize>>,
    /// Not counted in `floodgate_connections_open` and `floodgate_connections_total` (the
    /// rate-limit service's table: those are the proxy's client connections).
    uncounted: bool,
}

/// Why a connection was refused at accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// `server.max_connections` reached.
    MaxConnections,
    /// `server.max_connections_per_ip` reached for the client's IP.
    MaxPerIp,
}

impl Refusal {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::MaxConnections => "max_connections",
            Refusal::MaxPerIp => "max_connections_per_ip",
        }
    }

    /// The metric label of a refusal by the rate-limit service's listener (`[rls]`'s caps).
    pub fn rls_label(self) -> &'static str {
        match self {
            Refusal::MaxConnections => "rls_max_connections",
            Refusal::MaxPerIp => "rls_max_connections_per_ip",
        }
    }
}

/// Descriptors kept out of the client connections' budget: listeners, admin connections, the
/// store's connections, config and log files.
const RESERVED_DESCRIPTORS: u64 = 64;

/// Client connections the open-file limit allows (see [`set_open_file_limit`]); unbounded
/// until it is set.
static CLIENT_BUDGET: AtomicUsize = AtomicUsize::new(usize::MAX);

/// Rate-limit service connections the open-file limit allows (see [`set_open_file_limit`]).
static RLS_BUDGET: AtomicUsize = AtomicUsize::new(usize::MAX);

/// What the open-file limit leaves each port: see [`set_open_file_limit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// Proxy client connections (each may hold an upstream connection too).
    pub clients: usize,
    /// Rate-limit service connections (one descriptor each).
    pub rls: usize,
}

/// Bounds connections by the process's open-file limit `nofile`, whatever the ports'
/// `max_connections` say, so that both ports together never run out of descriptors and the
/// admin listener keeps accepting. Of what is left after [`RESERVED_DESCRIPTORS`]: the
/// rate-limit service (`rls_max`: its `[rls] max_connections`, 0 without `[rls]`) takes
/// at most a quarter, one descriptor per connection; the proxy's client connections half of
/// the rest, since a client connection with a request in flight also holds an upstream
/// connection. Past its bound a port closes new connections at once (as past its
/// `max_connections`). Returns the bounds.
pub fn set_open_file_limit(nofile: u64, rls_max: usize) -> Budget {
    let left = usize::try_from(nofile.saturating_sub(RESERVED_DESCRIPTORS)).unwrap_or(usize::MAX);
    let rls = rls_max.min(left / 4).max(1);
    let clients = (left.saturating_sub(if rls_max == 0 { 0 } else { rls }) / 2).max(1);
    CLIENT_BUDGET.store(clients, Ordering::Relaxed);
    RLS_BUDGET.store(rls, Ordering::Relaxed);
    Budget { clients, rls }
}

/// The rate-limit service's connections at most by the open-file limit.
pub fn rls_budget() -> usize {
    RLS_BUDGET.load(Ordering::Relaxed)
}

impl ConnectionTable {
    /// Takes a slot for a connection from `ip`, or says which cap refuses it.
    pub fn admit(self: &Arc<Self>, ip: IpAddr, limits: &Connections) -> Result<Slot, Refusal> {
        let max = limits
            .max_connections
            .min(CLIENT_BUDGET.load(Ordering::Relaxed));
        self.admit_within(ip, max, limits.max_per_ip)
    }

    /// A table not counted in `floodgate_connections_open` and `_total` (the rate-limit
    /// service's).
    pub fn uncounted() -> Arc<Self> {
        Arc::new(ConnectionTable {
            uncounted: true,
            ..Default::default()
        })
    }

    /// Takes a slot for a connection from `ip` if fewer than `max` are open in all and fewer
    /// than `max_per_ip` from `ip`, or says which cap refuses it.
    pub fn admit_within(
        self: &Arc<Self>,
        ip: IpAddr,
        max: usize,
        max_per_ip: usize,
    ) -> Result<Slot, Refusal> {
        if self.open.fetch_add(1, Ordering::AcqRel) >= max {
            self.open.fetch_sub(1, Ordering::AcqRel);
            return Err(Refusal::MaxConnections);
        }
        let mut per_ip = self.per_ip.lock();
        let n = per_ip.entry(ip).or_insert(0);
        if *n >= max_per_ip {
            drop(per_ip);
            self.open.fetch_sub(1, Ordering::AcqRel);
            return Err(Refusal::MaxPerIp);
        }
        *n += 1;
        drop(per_ip);
        if !self.uncounted {
            let m = metrics();
            m.connections_total.inc();
            m.connections_open.inc();
        }
        Ok(Slot {
            table: self.clone(),
            ip,
        })
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }
}

/// One admitted connection; dropping it gives the slot back.
#[derive(Debug)]
pub struct Slot {
    table: Arc<ConnectionTable>,
    ip: IpAddr,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut per_ip = self.table.per_ip.lock();
        if let Some(n) = per_ip.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                per_ip.remove(&self.ip);
            }
        }
        drop(per_ip);
        self.table.open.fetch_sub(1, Ordering::AcqRel);
        if !self.table.uncounted {
            metrics().connections_open.dec();
        }
    }
}
