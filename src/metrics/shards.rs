//! Counters and histograms that the request path writes without sharing a cache line between
//! threads.
//!
//! A Prometheus counter or histogram is one set of atomics. With two or more runtime threads,
//! every request's increment has to take the line from the thread that wrote it last, and a
//! proxied request writes several (its route's request count, its upstream's and its target's
//! histograms, its target's response class, a rule's decision count). These keep one set of
//! atomics per shard, a thread writing only its own shard, and add the shards up when
//! `/metrics` is read: the same families, in the same text, at the cost of reading every shard
//! at a scrape and of memory: a cache line per shard for a counter series, three for a latency
//! histogram's (its bucket counts and its sum), with twice as many shards as CPUs (at most 32):
//! on two CPUs 256 bytes a counter series and 768 a histogram series, on 16 or more 2 and
//! 6 KiB. Only the families every request writes are sharded; a rule's own series (a config
//! may hold thousands of rules) are not.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock};

use prometheus::core::{
    Atomic, Collector, Desc, Describer, GenericCounter, GenericCounterVec, Metric, MetricVec,
    MetricVecBuilder,
};
use prometheus::proto;
use prometheus::HistogramOpts;

/// Shards per metric: twice the CPUs, as a power of two between 2 and 32. Threads are given
/// shards in turn as they first write, so a runtime thread per CPU (and the odd background
/// thread) each have one of their own.
static SHARDS: LazyLock<usize> = LazyLock::new(|| {
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    (cpus * 2).next_power_of_two().clamp(2, 32)
});

/// The next thread's number.
static NEXT_THREAD: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// This thread's number (its shard is the number modulo the shard count).
    static THREAD: Cell<usize> = const { Cell::new(usize::MAX) };
}

/// This thread's number, given on its first call.
#[inline]
fn thread_number() -> usize {
    THREAD.with(|t| {
        let n = t.get();
        if n != usize::MAX {
            return n;
        }
        let n = NEXT_THREAD.fetch_add(1, Ordering::Relaxed);
        t.set(n);
        n
    })
}

/// One shard's cache line.
#[repr(align(64))]
#[derive(Debug, Default)]
struct Line([AtomicU64; 8]);

/// A shard per [`SHARDS`], `words` atomics each (a whole number of cache lines).
#[derive(Debug)]
struct Shards {
    lines: Box<[Line]>,
    /// Lines per shard.
    per_shard: usize,
    /// The shard count minus one (a power of two's mask).
    mask: usize,
}

impl Shards {
    fn new(words: usize) -> Shards {
        let per_shard = words.div_ceil(8).max(1);
        let shards = *SHARDS;
        Shards {
            lines: (0..shards * per_shard).map(|_| Line::default()).collect(),
            per_shard,
            mask: shards - 1,
        }
    }

    /// Word `i` of shard `s`.
    #[inline]
    fn word(&self, s: usize, i: usize) -> &AtomicU64 {
        &self.lines[s * self.per_shard + i / 8].0[i % 8]
    }

    /// The calling thread's shard.
    #[inline]
    fn my_shard(&self) -> usize {
        thread_number() & self.mask
    }

    /// Word `i` of the calling thread's shard.
    #[inline]
    fn mine(&self, i: usize) -> &AtomicU64 {
        self.word(self.my_shard(), i)
    }

    /// Word `i` summed over the shards (wrapping: a shard may hold a negative share of a count
    /// that went up on one thread and down on another).
    fn sum(&self, i: usize) -> u64 {
        (0..=self.mask).fold(0u64, |acc, s| {
            acc.wrapping_add(self.word(s, i).load(Ordering::Relaxed))
        })
    }
}

/// A count in per-thread shards: the value type of [`Counter`], and of in-flight counts that
/// many threads move and few read ([`ShardedU64::get`] adds the shards up).
#[derive(Debug)]
pub struct ShardedU64(Shards);

impl ShardedU64 {
    /// The count: every shard's share added up.
    pub fn get(&self) -> u64 {
        self.0.sum(0)
    }

    /// Adds `delta` in the calling thread's shard.
    #[inline]
    pub fn inc_by(&self, delta: u64) {
        self.0.mine(0).fetch_add(delta, Ordering::Relaxed);
    }

    /// Takes `delta` off in the calling thread's shard (which may then hold a negative share).
    #[inline]
    pub fn dec_by(&self, delta: u64) {
        self.0.mine(0).fetch_sub(delta, Ordering::Relaxed);
    }
}

impl Default for ShardedU64 {
    fn default() -> Self {
        <ShardedU64 as Atomic>::new(0)
    }
}

impl Atomic for ShardedU64 {
    type T = u64;

    fn new(val: u64) -> Self {
        let shards = Shards::new(1);
        shards.word(0, 0).store(val, Ordering::Relaxed);
        ShardedU64(shards)
    }

    /// Not atomic against concurrent increments (no counter sets its value on the request
    /// path; [`GenericCounter::reset`] is for tests).
    fn set(&self, val: u64) {
        for s in 1..=self.0.mask {
            self.0.word(s, 0).store(0, Ordering::Relaxed);
        }
        self.0.word(0, 0).store(val, Ordering::Relaxed);
    }

    fn get(&self) -> u64 {
        ShardedU64::get(self)
    }

    #[inline]
    fn inc_by(&self, delta: u64) {
        ShardedU64::inc_by(self, delta);
    }

    #[inline]
    fn dec_by(&self, delta: u64) {
        ShardedU64::dec_by(self, delta);
    }
}

/// An integer counter whose increments stay in the writing thread's shard.
pub type Counter = GenericCounter<ShardedU64>;

/// A family of [`Counter`]s by label values.
pub type CounterVec = GenericCounterVec<ShardedU64>;

/// A histogram whose observations stay in the writing thread's shard: per shard, the sum of
/// the observations (an `f64`'s bits) and a count per bucket, the last for values above every
/// bound. The total count is the buckets' sum, so `_count` always equals the `+Inf` bucket.
#[derive(Clone, Debug)]
pub struct Histogram(Arc<HistogramCore>);

#[derive(Debug)]
struct HistogramCore {
    /// The buckets' upper bounds, increasing, without `+Inf`.
    bounds: Box<[f64]>,
    /// Word 0: the sum's bits; word `1 + b`: bucket `b`'s count.
    shards: Shards,
    /// The series' labels, sorted by name (as Prometheus' own histograms have them).
    labels: Vec<proto::LabelPair>,
    /// The family's description (read by the registry for an unlabelled histogram).
    desc: Desc,
}

impl Histogram {
    /// An unlabelled histogram (register it as a [`Collector`]).
    pub fn with_opts(opts: HistogramOpts) -> prometheus::Result<Histogram> {
        Histogram::with_label_values(&opts, &[] as &[&str])
    }

    fn with_label_values<V: AsRef<str>>(
        opts: &HistogramOpts,
        values: &[V],
    ) -> prometheus::Result<Histogram> {
        let desc = opts.describe()?;
        let names = &opts.common_opts.variable_labels;
        if names.len() != values.len() {
            return Err(prometheus::Error::InconsistentCardinality {
                expect: names.len(),
                got: values.len(),
            });
        }
        let mut bounds = opts.buckets.clone();
        if bounds.last().is_some_and(|b| b.is_infinite()) {
            bounds.pop();
        }
        if bounds.is_empty() || bounds.windows(2).any(|w| w[0] >= w[1]) {
            return Err(prometheus::Error::Msg(
                "histogram buckets must be increasing".into(),
            ));
        }
        let mut labels: Vec<proto::LabelPair> = names
            .iter()
            .zip(values)
            .map(|(name, value)| {
                let mut pair = proto::LabelPair::default();
                pair.set_name(name.clone());
                pair.set_value(value.as_ref().to_string());
                pair
            })
            .collect();
        labels.sort_by(|a, b| a.name().cmp(b.name()));
        Ok(Histogram(Arc::new(HistogramCore {
            shards: Shards::new(bounds.len() + 2),
            bounds: bounds.into_boxed_slice(),
            labels,
            desc,
        })))
    }

    /// Counts one observation.
    #[inline]
    pub fn observe(&self, v: f64) {
        let core = &*self.0;
        let bucket = core
            .bounds
            .iter()
            .position(|&upper| v <= upper)
            .unwrap_or(core.bounds.len());
        // One lookup of the thread's shard for both words it writes.
        let s = core.shards.my_shard();
        core.shards
            .word(s, 1 + bucket)
            .fetch_add(1, Ordering::Relaxed);
        // The shard is this thread's: the exchange succeeds at once unless another thread
        // was given the same shard.
        let sum = core.shards.word(s, 0);
        let mut current = sum.load(Ordering::Relaxed);
        loop {
            let next = (f64::from_bits(current) + v).to_bits();
            match sum.compare_exchange_weak(current, next, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => break,
                Err(actual) => current = actual,
            }
        }
    }

    /// The observations so far: (count, sum, each bound with its cumulative count).
    fn snapshot(&self) -> (u64, f64, Vec<(f64, u64)>) {
        let core = &*self.0;
        let shards = &core.shards;
        let sum = (0..=shards.mask)
            .map(|s| f64::from_bits(shards.word(s, 0).load(Ordering::Relaxed)))
            .sum();
        let mut cumulative = 0u64;
        let buckets = core
            .bounds
            .iter()
            .enumerate()
            .map(|(b, &upper)| {
                cumulative += shards.sum(1 + b);
                (upper, cumulative)
            })
            .collect();
        let count = cumulative + shards.sum(1 + core.bounds.len());
        (count, sum, buckets)
    }
}

impl Metric for Histogram {
    fn metric(&self) -> proto::Metric {
        let (count, sum, buckets) = self.snapshot();
        let mut h = proto::Histogram::default();
        h.set_sample_count(count);
        h.set_sample_sum(sum);
        h.set_bucket(
            buckets
                .into_iter()
                .map(|(upper, cumulative)| {
                    let mut b = proto::Bucket::default();
                    b.set_upper_bound(upper);
                    b.set_cumulative_count(cumulative);
                    b
                })
                .collect(),
        );
        let mut m = proto::Metric::from_label(self.0.labels.clone());
        m.set_histogram(h);
        m
    }
}

impl Collector for Histogram {
    fn desc(&self) -> Vec<&Desc> {
        vec![&self.0.desc]
    }

    fn collect(&self) -> Vec<proto::MetricFamily> {
        let mut family = proto::MetricFamily::default();
        family.set_name(self.0.desc.fq_name.clone());
        family.set_help(self.0.desc.help.clone());
        family.set_field_type(proto::MetricType::HISTOGRAM);
        family.set_metric(vec![self.metric()]);
        vec![family]
    }
}

/// Builds the [`Histogram`]s of a [`HistogramVec`].
#[derive(Clone, Debug)]
pub struct HistogramBuilder;

impl MetricVecBuilder for HistogramBuilder {
    type M = Histogram;
    type P = HistogramOpts;

    fn build<V: AsRef<str>>(
        &self,
        opts: &HistogramOpts,
        values: &[V],
    ) -> prometheus::Result<Histogram> {
        Histogram::with_label_values(opts, values)
    }
}

/// A family of [`Histogram`]s by label values.
pub type HistogramVec = MetricVec<HistogramBuilder>;

/// A [`HistogramVec`] with `labels`.
pub fn histogram_vec(opts: HistogramOpts, labels: &[&str]) -> prometheus::Result<HistogramVec> {
    let opts = opts.variable_labels(labels.iter().map(|l| l.to_string()).collect());
    MetricVec::create(proto::MetricType::HISTOGRAM, HistogramBuilder, opts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus::{Encoder, Opts, Registry, TextEncoder};

    fn text(registry: &Registry) -> String {
        let mut out = Vec::new();
        TextEncoder::new()
            .encode(&registry.gather(), &mut out)
            .expect("encodes");
        String::from_utf8(out).expect("UTF-8")
    }

    /// The sharded families print as Prometheus' own do, with the same observations.
    #[test]
    fn sharded_families_read_as_prometheus_own() {
        let ours = Registry::new();
        let theirs = Registry::new();
        let opts = || HistogramOpts::new("t_seconds", "help").buckets(vec![0.125, 1.0, 10.0]);
        let h = histogram_vec(opts(), &["upstream", "target"]).unwrap();
        let p = prometheus::HistogramVec::new(opts(), &["upstream", "target"]).unwrap();
        ours.register(Box::new(h.clone())).unwrap();
        theirs.register(Box::new(p.clone())).unwrap();
        let c = CounterVec::new(Opts::new("t_total", "help"), &["route", "status"]).unwrap();
        let pc = prometheus::IntCounterVec::new(Opts::new("t_total", "help"), &["route", "status"])
            .unwrap();
        ours.register(Box::new(c.clone())).unwrap();
        theirs.register(Box::new(pc.clone())).unwrap();
        // Observations from several threads, on bounds and between them, and above all; each
        // a binary fraction, so that the sum is exact in whatever order the shards add it.
        std::thread::scope(|scope| {
            for t in 0..4 {
                let (h, p, c, pc) = (&h, &p, &c, &pc);
                scope.spawn(move || {
                    for v in [0.0625, 0.125, 0.5, 1.0, 7.0, 10.0, 11.0, f64::from(t)] {
                        h.with_label_values(&["orders", "b"]).observe(v);
                        p.with_label_values(&["orders", "b"]).observe(v);
                        c.with_label_values(&["all", "200"]).inc();
                        pc.with_label_values(&["all", "200"]).inc();
                    }
                });
            }
        });
        assert_eq!(text(&ours), text(&theirs));
        assert!(
            text(&ours).contains("t_seconds_bucket{target=\"b\",upstream=\"orders\",le=\"1\"} 18")
        );
    }

    /// A count moved up on one thread and down on another still adds up.
    #[test]
    fn a_count_moved_on_two_threads_adds_up() {
        let n = ShardedU64::new(0);
        n.inc_by(3);
        std::thread::scope(|s| {
            s.spawn(|| n.dec_by(2));
        });
        assert_eq!(n.get(), 1);
        n.set(7);
        assert_eq!(n.get(), 7);
    }

    #[test]
    fn unsorted_buckets_are_refused() {
        let opts = HistogramOpts::new("t", "h").buckets(vec![1.0, 0.5]);
        assert!(Histogram::with_opts(opts).is_err());
    }
}
