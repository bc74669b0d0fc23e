//! The cluster's slot map as floodgate sees it: which master holds each hash slot, so that
//! every call is guarded by the breaker of the master it goes to (see `nodes`). Read with
//! `CLUSTER SLOTS` when the store connects, every [`REFRESH_EVERY`], and at once when a
//! master's breaker opens (a failover may have moved its slots). redis-rs routes the calls by
//! its own map and follows `MOVED`/`ASK`; this one only says whose breaker guards a call, so a
//! stale entry costs at most a failure counted against the wrong master until the next read.

use std::sync::{Arc, Weak};
use std::time::Duration;

use redis::Value;

use super::conn::Conn;
use super::nodes::Node;
use super::Inner;

/// How often the slot map is read again while nothing fails.
pub(super) const REFRESH_EVERY: Duration = Duration::from_secs(5);

/// Budget of one read of the slot map from one node.
const READ_TIMEOUT: Duration = Duration::from_secs(1);

/// Reads the map at most this often, however many breakers open.
const MIN_GAP: Duration = Duration::from_millis(500);

/// A slot range and the `host:port` of its master.
pub(super) type Range = (u16, u16, String);

/// Which master holds which slots: none until read (and none for a standalone server, whose
/// one node is the fallback).
pub(super) struct Topology {
    /// `(first, last, index into nodes)`, sorted by first slot, not overlapping.
    ranges: Vec<(u16, u16, usize)>,
    nodes: Vec<Arc<Node>>,
    /// Guards the calls to slots whose master is not known: the store as a whole.
    fallback: Arc<Node>,
}

impl Topology {
    /// No master known: every call is guarded by `fallback`.
    pub(super) fn new(fallback: Arc<Node>) -> Topology {
        Topology {
            ranges: Vec::new(),
            nodes: Vec::new(),
            fallback,
        }
    }

    /// The node that guards calls to `slot`: its master, or the fallback when not known.
    pub(super) fn guard(&self, slot: u16) -> &Arc<Node> {
        self.node_for(slot).unwrap_or(&self.fallback)
    }

    /// The master holding `slot`, if known.
    fn node_for(&self, slot: u16) -> Option<&Arc<Node>> {
        let at = self.ranges.partition_point(|&(first, _, _)| first <= slot);
        let &(_, last, node) = self.ranges.get(at.checked_sub(1)?)?;
        (slot <= last).then(|| &self.nodes[node])
    }

    /// The node that guards calls whose master is not known.
    #[cfg(test)]
    pub(super) fn fallback(&self) -> &Arc<Node> {
        &self.fallback
    }

    /// Every master.
    pub(super) fn nodes(&self) -> &[Arc<Node>] {
        &self.nodes
    }

    /// Whether some slot has no known master.
    pub(super) fn has_holes(&self) -> bool {
        let mut next = 0u32;
        for &(first, last, _) in &self.ranges {
            if u32::from(first) > next {
                return true;
            }
            next = next.max(u32::from(last) + 1);
        }
        next < u32::from(super::cluster::SLOTS)
    }

    /// The topology of `ranges`, keeping the nodes (so their breakers' state) of the masters
    /// that are still masters; `make` builds the others (`None`: a fresh fallback, when every
    /// slot has a master now: the fallback's failures were those of not knowing them). Masters
    /// that are gone are dropped.
    pub(super) fn next(
        &self,
        mut ranges: Vec<Range>,
        mut make: impl FnMut(Option<&str>) -> Arc<Node>,
    ) -> Topology {
        ranges.sort_by_key(|r| r.0);
        let mut nodes: Vec<Arc<Node>> = Vec::new();
        let mut out = Vec::with_capacity(ranges.len());
        for (first, last, endpoint) in ranges {
            let index = match nodes.iter().position(|n| n.endpoint() == Some(&endpoint)) {
                Some(i) => i,
                None => {
                    let node = self
                        .nodes
                        .iter()
                        .find(|n| n.endpoint() == Some(&endpoint))
                        .cloned()
                        .unwrap_or_else(|| make(Some(&endpoint)));
                    nodes.push(node);
                    nodes.len() - 1
                }
            };
            out.push((first, last, index));
        }
        let mut next = Topology {
            ranges: out,
            nodes,
            fallback: self.fallback.clone(),
        };
        if !next.has_holes() {
            next.fallback = make(None);
        }
        next
    }
}

/// The slot ranges of a `CLUSTER SLOTS` reply with the `host:port` of each one's master. An
/// empty host is the answering node's (`answered_by`, as the Redis documentation says); ranges
/// with an unknown master (`?`) or a malformed entry are left out.
pub(super) fn parse_slots(reply: &Value, answered_by: &str) -> Vec<Range> {
    let Value::Array(items) = reply else {
        return Vec::new();
    };
    let text = |v: &Value| match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Nil => Some(String::new()),
        _ => None,
    };
    let number = |v: &Value| match v {
        Value::Int(n) => u16::try_from(*n).ok(),
        _ => None,
    };
    items
        .iter()
        .filter_map(|item| {
            let Value::Array(fields) = item else {
                return None;
            };
            let (first, last) = (number(fields.first()?)?, number(fields.get(1)?)?);
            let Value::Array(master) = fields.get(2)? else {
                return None;
            };
            let host = text(master.first()?)?;
            let port = number(master.get(1)?)?;
            let host = match host.as_str() {
                "?" => return None,
                "" => answered_by.to_string(),
                _ => host,
            };
            (first <= last && last < super::cluster::SLOTS)
                .then(|| (first, last, format!("{host}:{port}")))
        })
        .collect()
}

/// `host:port` split at its last colon (IPv6 hosts keep theirs).
fn host_port(endpoint: &str) -> Option<(&str, u16)> {
    let (host, port) = endpoint.rsplit_once(':')?;
    Some((
        host.trim_start_matches('[').trim_end_matches(']'),
        port.parse().ok()?,
    ))
}

/// Reads the slot map from the first of `candidates` (`host:port`) that answers.
pub(super) async fn read(conn: &Conn, candidates: &[String]) -> Option<Vec<Range>> {
    for endpoint in candidates {
        let Some((host, port)) = host_port(endpoint) else {
            continue;
        };
        let mut cmd = redis::cmd("CLUSTER");
        cmd.arg("SLOTS");
        if let Ok(Ok(reply)) =
            tokio::time::timeout(READ_TIMEOUT, conn.on_node(cmd, host, port)).await
        {
            let ranges = parse_slots(&reply, host);
            if !ranges.is_empty() {
                return Some(ranges);
            }
        }
    }
    None
}

/// Reads the slot map again every [`REFRESH_EVERY`] and whenever asked (a master's breaker
/// opened), for as long as the store exists.
pub(super) async fn refresh_loop(store: Weak<Inner>) {
    let Some(wake) = store.upgrade().map(|inner| inner.refresh.clone()) else {
        return;
    };
    loop {
        // MIN_GAP of the period was slept after the last read.
        let _ = tokio::time::timeout(REFRESH_EVERY - MIN_GAP, wake.notified()).await;
        let Some(inner) = store.upgrade() else {
            return;
        };
        inner.refresh_topology().await;
        drop(inner);
        tokio::time::sleep(MIN_GAP).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::redis::nodes::Census;
    use crate::limiter::redis::Options;

    fn master(host: &str, port: i64) -> Value {
        Value::Array(vec![
            Value::BulkString(host.as_bytes().to_vec()),
            Value::Int(port),
            Value::BulkString(b"0123456789abcdef".to_vec()),
        ])
    }

    fn range(first: i64, last: i64, master: Value) -> Value {
        Value::Array(vec![Value::Int(first), Value::Int(last), master])
    }

    #[test]
    fn slots_map_to_their_masters_and_nodes_survive_a_refresh() {
        let reply = Value::Array(vec![
            range(5461, 10922, master("10.0.0.2", 7000)),
            range(0, 5460, master("", 7000)),
            range(10923, 16383, master("?", 7000)),
            Value::Int(3),
        ]);
        let ranges = parse_slots(&reply, "10.0.0.1");
        assert_eq!(
            ranges,
            [
                (5461, 10922, "10.0.0.2:7000".to_string()),
                (0, 5460, "10.0.0.1:7000".to_string()),
            ]
        );
        let census = Arc::new(Census::default());
        let options = Options::default();
        let make = |e: Option<&str>| match e {
            Some(e) => Node::master(e, &options, &census),
            None => Node::store("seeds", &options, &census),
        };
        let t = Topology::new(make(None)).next(ranges.clone(), make);
        let at = |slot| t.guard(slot).endpoint();
        assert_eq!(at(0), Some("10.0.0.1:7000"));
        assert_eq!(at(5460), Some("10.0.0.1:7000"));
        assert_eq!(at(5461), Some("10.0.0.2:7000"));
        assert_eq!(at(10923), None, "unknown master: the fallback guards it");
        assert!(Arc::ptr_eq(t.guard(16383), t.fallback()));
        assert!(t.has_holes());
        let again = t.next(ranges, |_| panic!("nothing new to build"));
        assert!(
            Arc::ptr_eq(&t.nodes()[0], &again.nodes()[0]),
            "same node, same breaker"
        );
        assert!(
            Arc::ptr_eq(t.fallback(), again.fallback()),
            "holes: same fallback"
        );
        let whole = vec![(0, 16383, "10.0.0.3:7000".to_string())];
        let mut built = Vec::new();
        let full = again.next(whole, |e| {
            built.push(e.map(str::to_string));
            Node::store("seeds", &options, &census)
        });
        assert!(!full.has_holes());
        assert_eq!(
            built,
            [Some("10.0.0.3:7000".to_string()), None],
            "a fresh fallback"
        );
        assert_eq!(host_port("::1:7000"), Some(("::1", 7000)));
        assert_eq!(host_port("[::1]:7000"), Some(("::1", 7000)));
    }
}
