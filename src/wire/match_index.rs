//! Which routes or rules can match a request, found without testing them all.
//!
//! Routes are tried in file order until one matches, and every rule whose `match` fits
//! applies; tested one by one, a request pays for every route before its own and for every
//! rule of the file. A business with a route or a rule per customer or endpoint would pay for
//! all of them on every request. The index files each item at load under one field its match
//! fixes (its *anchor*: a route name, an exact path, a path prefix, a host, a plan or its
//! methods); a request then looks up the few buckets its own route, path, host, plan and
//! method can fall in, and only those items are tested, in file order, by their own matcher.
//! An item is left out only when the field it was filed under cannot fit the request, so the
//! result is the linear scan's.
//!
//! Buckets are keyed by a hash of the (ASCII case-folded) path, seeded per index: the
//! request's path is hashed once, each segment boundary giving the key of the prefix that ends
//! there. Two keys that collide only add candidates, which their matcher then refuses; the
//! seed is secret to the process, so a client cannot aim its paths at a large bucket.
//!
//! Small lists are not indexed: below [`MIN_INDEXED`] items, testing them all is cheaper than
//! hashing the path.

use http::Method;
use smallvec::SmallVec;

use super::matching::RequestMatch;

/// Lists shorter than this are tested whole (hashing a path costs about what testing a few
/// matches does).
pub const MIN_INDEXED: usize = 8;

/// The field an item is filed under: one its match fixes, so that a request that does not
/// have it cannot match the item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Anchor<'a> {
    /// Rules: the route, by its position in the file.
    Route(usize),
    /// An exact path, and the host when the match fixes one too.
    Path {
        /// The host, when fixed.
        host: Option<&'a str>,
        /// The normalized path.
        path: &'a str,
    },
    /// A path prefix other than `/`, and the host when the match fixes one too.
    Prefix {
        /// The host, when fixed.
        host: Option<&'a str>,
        /// The normalized prefix.
        prefix: &'a str,
    },
    /// A host alone.
    Host(&'a str),
    /// Rules: the caller's plan.
    Plan(&'a str),
    /// Methods alone (filed under each).
    Methods(&'a [Method]),
    /// Nothing fixed: tested for every request.
    Any,
}

impl<'a> Anchor<'a> {
    /// The most selective anchor a request match offers: an exact path, else a prefix (each
    /// with its host), else the host, else the methods, else none.
    pub fn of(m: &'a RequestMatch) -> Anchor<'a> {
        let host = m.host.as_deref();
        if let Some(path) = m.path.as_deref() {
            return Anchor::Path { host, path };
        }
        if let Some(prefix) = m.path_prefix.as_deref() {
            let prefix = prefix.strip_suffix('/').unwrap_or(prefix);
            if !prefix.is_empty() {
                return Anchor::Prefix { host, prefix };
            }
        }
        if let Some(host) = host {
            return Anchor::Host(host);
        }
        match m.methods.as_deref() {
            Some(methods) => Anchor::Methods(methods),
            None => Anchor::Any,
        }
    }

    /// Whether this anchor is weaker than a plan (a rule fixing a plan is better filed under
    /// it than under its methods, or under nothing).
    pub fn weaker_than_plan(&self) -> bool {
        matches!(self, Anchor::Methods(_) | Anchor::Any)
    }
}

/// What a request offers the index: the fields items are filed under.
#[derive(Debug, Clone, Copy)]
pub struct Probe<'a> {
    /// The matched route's position (rules only).
    pub route: Option<usize>,
    /// The normalized host.
    pub host: Option<&'a str>,
    /// The normalized path, without query.
    pub path: &'a str,
    /// The caller's plan (rules only).
    pub plan: Option<&'a str>,
    /// The method.
    pub method: &'a Method,
}

/// The items (positions in file order) a request can match.
pub enum Candidates {
    /// Every item: the list is not indexed.
    All(std::ops::Range<u32>),
    /// These, ascending.
    Some(SmallVec<[u32; 16]>),
}

impl Iterator for Candidates {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        match self {
            Candidates::All(range) => range.next().map(|i| i as usize),
            Candidates::Some(list) => {
                // Ascending and consumed from the front: kept reversed once (see `collect`).
                list.pop().map(|i| i as usize)
            }
        }
    }
}

#[derive(Clone, Copy)]
#[repr(u8)]
enum Kind {
    Route = 1,
    Path,
    PathHost,
    Prefix,
    PrefixHost,
    Host,
    Plan,
    Method,
}

/// The index of one list (the routes, or the rules).
#[derive(Debug)]
pub struct MatchIndex {
    len: u32,
    table: Option<Box<Table>>,
}

#[derive(Debug)]
struct Table {
    seed: Seed,
    buckets: hashbrown::HashMap<u64, Box<[u32]>, ahash::RandomState>,
    any: Box<[u32]>,
    /// The longest prefix filed (bytes): a request's path is hashed this far for prefixes.
    longest_prefix: usize,
    /// Which kinds hold anything: a request looks up only those.
    kinds: u16,
}

#[derive(Debug, Clone, Copy)]
struct Seed {
    base: u64,
    mix: [u64; 2],
}

/// The Mersenne prime 2^61 - 1: path hashes are polynomials modulo it, with a secret base, so
/// two different paths collide with a chance of about their length in 2^61 whatever they are.
const P: u64 = (1 << 61) - 1;

fn mul_mod(a: u64, b: u64) -> u64 {
    let product = (a as u128) * (b as u128);
    let folded = (product as u64 & P) + (product >> 61) as u64;
    let folded = (folded & P) + (folded >> 61);
    if folded >= P {
        folded - P
    } else {
        folded
    }
}

impl Seed {
    fn new() -> Seed {
        let below_p = || fastrand::u64(1 << 32..P);
        Seed {
            base: below_p(),
            mix: [below_p(), below_p()],
        }
    }

    fn step(&self, h: u64, byte: u8) -> u64 {
        let h = mul_mod(h, self.base) + u64::from(byte.to_ascii_lowercase()) + 1;
        if h >= P {
            h - P
        } else {
            h
        }
    }

    fn text(&self, text: &str) -> u64 {
        text.bytes().fold(0, |h, b| self.step(h, b))
    }

    /// The bucket key of a kind, a host hash (0 for none) and a text hash.
    fn key(&self, kind: Kind, host: u64, text: u64) -> u64 {
        let k = mul_mod(kind as u64 + 1, self.mix[0]) + host;
        let k = mul_mod(k % P, self.mix[1]) + text;
        k % P
    }
}

impl MatchIndex {
    /// Files each item under its anchor. Fewer than [`MIN_INDEXED`] items are not indexed.
    pub fn build<'a>(anchors: impl ExactSizeIterator<Item = Anchor<'a>>) -> MatchIndex {
        let len = anchors.len();
        Self::build_from(anchors, len >= MIN_INDEXED)
    }

    /// [`Self::build`], indexed whatever the length (the tests hold both ways to one result).
    pub fn build_from<'a>(anchors: impl Iterator<Item = Anchor<'a>>, index: bool) -> MatchIndex {
        if !index {
            return MatchIndex {
                len: anchors.count() as u32,
                table: None,
            };
        }
        let seed = Seed::new();
        let mut buckets: hashbrown::HashMap<u64, Vec<u32>> = hashbrown::HashMap::new();
        let mut any = Vec::new();
        let mut longest_prefix = 0;
        let mut kinds = 0u16;
        let mut len = 0u32;
        for (i, anchor) in anchors.enumerate() {
            let i = i as u32;
            len = i + 1;
            let mut file = |kind: Kind, host: Option<&str>, text: u64| {
                let host = host.map_or(0, |h| seed.text(h));
                kinds |= 1 << kind as u16;
                buckets
                    .entry(seed.key(kind, host, text))
                    .or_default()
                    .push(i);
            };
            match anchor {
                Anchor::Route(r) => file(Kind::Route, None, r as u64),
                Anchor::Path { host, path } => {
                    let kind = if host.is_some() {
                        Kind::PathHost
                    } else {
                        Kind::Path
                    };
                    file(kind, host, seed.text(path));
                }
                Anchor::Prefix { host, prefix } => {
                    longest_prefix = longest_prefix.max(prefix.len());
                    let kind = if host.is_some() {
                        Kind::PrefixHost
                    } else {
                        Kind::Prefix
                    };
                    file(kind, host, seed.text(prefix));
                }
                Anchor::Host(host) => file(Kind::Host, None, seed.text(host)),
                Anchor::Plan(plan) => file(Kind::Plan, None, seed.text(plan)),
                Anchor::Methods(methods) => {
                    let mut seen: SmallVec<[&Method; 4]> = SmallVec::new();
                    for m in methods {
                        if seen.contains(&m) {
                            continue;
                        }
                        seen.push(m);
                        file(Kind::Method, None, seed.text(m.as_str()));
                    }
                }
                Anchor::Any => any.push(i),
            }
        }
        let mut map =
            hashbrown::HashMap::with_capacity_and_hasher(buckets.len(), ahash::RandomState::new());
        map.extend(buckets.into_iter().map(|(k, v)| (k, v.into_boxed_slice())));
        MatchIndex {
            len,
            table: Some(Box::new(Table {
                seed,
                buckets: map,
                any: any.into_boxed_slice(),
                longest_prefix,
                kinds,
            })),
        }
    }

    /// How many items the index covers.
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// Whether it covers none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether the items are indexed (else every request tests them all).
    pub fn is_indexed(&self) -> bool {
        self.table.is_some()
    }

    /// The items a request can match, ascending: a superset of those that do.
    pub fn candidates(&self, probe: &Probe<'_>) -> Candidates {
        let Some(t) = &self.table else {
            return Candidates::All(0..self.len);
        };
        let has = |k: Kind| t.has(k);
        let seed = &t.seed;
        let mut out: SmallVec<[&[u32]; 8]> = SmallVec::new();
        if !t.any.is_empty() {
            out.push(&t.any);
        }
        let host = probe.host.map(|h| seed.text(h));
        if has(Kind::Route) {
            if let Some(r) = probe.route {
                out.push(t.bucket(Kind::Route, 0, r as u64));
            }
        }
        if has(Kind::Host) {
            if let Some(h) = probe.host {
                out.push(t.bucket(Kind::Host, 0, seed.text(h)));
            }
        }
        if has(Kind::Plan) {
            if let Some(p) = probe.plan {
                out.push(t.bucket(Kind::Plan, 0, seed.text(p)));
            }
        }
        if has(Kind::Method) {
            out.push(t.bucket(Kind::Method, 0, seed.text(probe.method.as_str())));
            if *probe.method == Method::HEAD {
                // A match naming GET covers HEAD.
                out.push(t.bucket(Kind::Method, 0, seed.text(Method::GET.as_str())));
            }
        }
        let prefixes = has(Kind::Prefix) || has(Kind::PrefixHost);
        let exact = has(Kind::Path) || has(Kind::PathHost);
        if prefixes || exact {
            let path = probe.path.as_bytes();
            let last_slash = path.iter().rposition(|&b| b == b'/').unwrap_or(0);
            let mut h = 0;
            let mut hashed = 0;
            for (i, &b) in path.iter().enumerate() {
                if prefixes && i > 0 && i <= t.longest_prefix {
                    // A prefix ends before each `/`, and before each `.` of the last segment
                    // (`/orders` covers `/orders.json`).
                    if b == b'/' || (b == b'.' && i > last_slash) {
                        t.prefix_buckets(host, h, &mut out);
                    }
                }
                if !exact && i >= t.longest_prefix {
                    break;
                }
                h = seed.step(h, b);
                hashed = i + 1;
            }
            if hashed == path.len() {
                if prefixes && path.len() <= t.longest_prefix {
                    t.prefix_buckets(host, h, &mut out);
                }
                if has(Kind::Path) {
                    out.push(t.bucket(Kind::Path, 0, h));
                }
                if let (true, Some(host)) = (has(Kind::PathHost), host) {
                    out.push(t.bucket(Kind::PathHost, host, h));
                }
            }
        }
        Candidates::Some(collect(&out))
    }
}

impl Table {
    fn has(&self, kind: Kind) -> bool {
        self.kinds & (1 << kind as u16) != 0
    }

    /// The buckets of the prefixes (without and with the request's host) hashing to `h`.
    fn prefix_buckets<'t>(&'t self, host: Option<u64>, h: u64, out: &mut SmallVec<[&'t [u32]; 8]>) {
        if self.has(Kind::Prefix) {
            out.push(self.bucket(Kind::Prefix, 0, h));
        }
        if let (true, Some(host)) = (self.has(Kind::PrefixHost), host) {
            out.push(self.bucket(Kind::PrefixHost, host, h));
        }
    }

    fn bucket(&self, kind: Kind, host: u64, text: u64) -> &[u32] {
        self.buckets
            .get(&self.seed.key(kind, host, text))
            .map_or(&[][..], |b| &b[..])
    }
}

/// The union of ascending lists, kept descending so that [`Candidates`] pops them in order.
fn collect(lists: &[&[u32]]) -> SmallVec<[u32; 16]> {
    let mut all: SmallVec<[u32; 16]> = SmallVec::new();
    let mut nonempty = lists.iter().filter(|l| !l.is_empty());
    match (nonempty.next(), nonempty.next()) {
        (None, _) => {}
        (Some(one), None) => all.extend(one.iter().rev().copied()),
        _ => {
            for l in lists {
                all.extend_from_slice(l);
            }
            all.sort_unstable_by(|a, b| b.cmp(a));
            all.dedup();
        }
    }
    all
}
