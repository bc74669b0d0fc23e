//! The adaptive concurrency limit: a gradient controller on the upstream's latency, pure and
//! clock-injected (every method takes `now`).
//!
//! Two measurements, as in Envoy's gradient controller:
//! - `min_rtt`, the upstream's latency when it is not queueing, is measured every
//!   [`PROBE_INTERVAL`] (and first thing): the limit is halved (never below `min_limit`) until
//!   [`PROBE_SAMPLES`] exchanges have completed under it, after skipping those that were in
//!   flight when the probe began; `min_rtt` is their typical latency (below). Halving rather
//!   than Envoy's drop to `min_concurrency` costs less throughput (and keeps the quiet
//!   tenants' turns coming during the probe). If half the limit still queues (the capacity
//!   just fell), the probe comes out more than [`REPROBE_ABOVE`] above the `min_rtt` before
//!   it and is repeated at half its own level, for as long as each halving lowers the latency
//!   that much again: a halved capacity is measured within a few hundred milliseconds, where
//!   a `min_rtt` measured in its backlog let the limit settle high until the next probe.
//! - Every [`WINDOW`] (extended until it holds [`MIN_SAMPLES`] exchanges) the typical latency
//!   of the window's exchanges, `sample`, updates the limit:
//!
//! ```text
//! gradient  = clamp(min_rtt * (1 + BUFFER) / sample, 0.5, 2.0)
//! limit     = clamp((1 - SMOOTHING) * limit + SMOOTHING * limit * gradient, min_limit, max_limit)
//! ```
//!
//! The typical latency is a mean without the highest and lowest sixteenth of the latencies:
//! a small backlog delays only the exchanges that find every slot taken, which a median does
//! not see until they are half of them (on the median the limit drifted to 1.5 C while most
//! exchanges still found a free slot), and the trimming keeps one exchange stalled by the host
//! or one cached answer from dragging it.
//!
//! Why these constants: an upstream of capacity C and service time S holding L > C requests
//! answers in S * L / C, so the fixed point is `L = C * (1 + BUFFER)`: 1.1 C, within the 1.25 C
//! the benchmark holds the gateway to, with room for a `min_rtt` measured a little high (the
//! upstream's own overhead grows with its load: at 20% the limit settled near 1.5 C after the
//! capacity halved, and the quiet tenants' p99 missed its target). Below the capacity the
//! gradient is 1 + BUFFER, which is the growth (2% per window after smoothing), so no `sqrt`
//! headroom is added (Envoy's settles at 1.36 C); slow start (below) covers a cold start. The
//! limit only grows while the window used more than half of it, so an idle upstream does not
//! drift to `max_limit` and then flood when traffic returns.
//!
//! A new guard starts in *slow start*, as TCP does: from `min_limit` the limit grows by
//! [`SLOW_START_GROWTH`] as soon as a whole turn of it (as many exchanges as the limit, at
//! least [`MIN_SAMPLES`]) that began a `min_rtt` after it took effect (once a backlog would
//! have formed) has come back within `min_rtt * (1 + BUFFER / 2)`, by half that step within
//! `min_rtt * (1 + BUFFER)` (the backlog may be starting: part of the permits are held inside
//! the gateway, not at the upstream), and it was half used: two or three round trips per step,
//! so 4 to 16 takes 12 steps, well under a second, where 2% a window would take 70 windows.
//! A whole turn, because the first exchanges back after a step are those that found a free
//! slot. Two judgments in a row that queue end slow start for good (one slowed by the host
//! does not), and the limit goes back two steps (the one before may already sit in the
//! buffer), below the capacity, for the gradient to approach it from there. The growth is
//! small because the overshoot is the growth: a step just within the buffer (1.1 C) is
//! followed by one at 1.1 C * 1.06 = 1.17 C, within the 1.25 C the benchmark allows (doubling,
//! as TCP does, held 2 C for a window).

//!
//! A failed exchange (`fail`: a `5xx`, a connect error, a reset, a timeout) is not a latency.
//! An upstream that sheds what is above its capacity with fast `503`s would otherwise look
//! fast, and the limit would climb to `max_limit`. A failure faster than `min_rtt` is the
//! upstream turning away what was above its capacity: the limit drops at once below the
//! requests that were in flight, and slow start ends (as TCP halves its window on a loss, but
//! to what was carried rather than half: the gradient then grows it back slowly, so a
//! shedding upstream sees a rare probe above its capacity, not a failure per round trip). A
//! window with any failure does not raise the limit; a window (or probe) where at least half
//! failed is an outage, and the limit restarts from `min_limit` in slow start, so a recovering
//! upstream gets its traffic back as it proves it can serve it.

use std::time::{Duration, Instant};

/// How long one measurement window lasts at least.
pub const WINDOW: Duration = Duration::from_millis(100);
/// Fewest exchanges a window needs before it updates the limit.
pub const MIN_SAMPLES: u32 = 8;
/// How often `min_rtt` is measured again.
pub const PROBE_INTERVAL: Duration = Duration::from_secs(10);
/// Exchanges a `min_rtt` measurement averages.
pub const PROBE_SAMPLES: u32 = 25;
/// Latency above `min_rtt` that still counts as "not queueing" (10%).
pub const BUFFER: f64 = 0.10;
/// A probe this much above the `min_rtt` before it is repeated at half its level (see
/// `Gradient::probe_done`): what the buffer allows, as a probe is cheap (a quarter of the
/// limit for a few round trips) and a `min_rtt` measured high lets the limit settle high.
pub const REPROBE_ABOVE: f64 = 1.0 + BUFFER;
/// Latencies a window or a probe keeps (the latest; their typical value, `Kept::typical`, is
/// its latency).
const KEPT: usize = 64;
/// Growth of the limit per slow-start step (see the module's doc for why 12.5%).
pub const SLOW_START_GROWTH: f64 = 1.125;
/// Weight of the new value in each update.
pub const SMOOTHING: f64 = 0.2;
/// How long the limit stays at or below what it was cut to by a fast failure (see
/// `Gradient::fail`): growing back at once probed the capacity of an upstream that sheds
/// every few windows, each probe a `503` to some client; after this the limit may grow again,
/// in case the capacity did.
pub const SHED_HOLD: Duration = Duration::from_secs(5);
/// Windows in a row that lower the limit, after which `min_rtt` is measured again at once
/// rather than at the next [`PROBE_INTERVAL`] (a second of windows): an upstream that became
/// slower per request keeps answering slower however low the limit goes, and only a new
/// `min_rtt` tells it from one that queues.
pub const EARLY_PROBE_AFTER: u32 = 10;

/// A `min_rtt` measurement under way.
#[derive(Debug, Clone)]
struct Probe {
    /// Exchanges still to skip: in flight under the old limit when the probe began.
    skip: u32,
    kept: Kept,
    /// The limit while it lasts.
    level: u32,
    /// What the probe before it in this round measured (see [`Gradient::probe_done`]).
    previous: Option<Duration>,
    /// Exchanges that failed during it (not latencies).
    failed: u32,
}

/// The latest [`KEPT`] latencies of a window, in a fixed array (no allocation per exchange).
#[derive(Debug, Clone)]
struct Kept {
    micros: [u32; KEPT],
    count: u32,
}

impl Kept {
    fn new() -> Kept {
        Kept {
            micros: [0; KEPT],
            count: 0,
        }
    }

    fn push(&mut self, rtt: Duration) {
        let us = rtt.as_micros().min(u32::MAX as u128) as u32;
        self.micros[self.count as usize % KEPT] = us;
        self.count += 1;
    }

    /// The typical latency: the mean without the highest and lowest sixteenth. A mean, not a
    /// median, because a small backlog delays only some exchanges (those that find every slot
    /// taken), which a median does not see until they are half of them: on the median the
    /// limit drifted to 1.5 C while most exchanges still found a free slot. Trimmed, because
    /// one exchange stalled by a busy host (a page fault, a full run queue) or one cached
    /// answer would drag a plain mean.
    fn typical(&self) -> Duration {
        let n = (self.count as usize).min(KEPT);
        if n == 0 {
            return Duration::ZERO;
        }
        let mut v = self.micros;
        let v = &mut v[..n];
        v.sort_unstable();
        let cut = n / 16;
        let kept = &v[cut..n - cut];
        let sum: u64 = kept.iter().map(|&us| u64::from(us)).sum();
        Duration::from_micros(sum / kept.len() as u64)
    }
}

/// The controller of one upstream.
#[derive(Debug, Clone)]
pub struct Gradient {
    min_limit: u32,
    max_limit: u32,
    limit: f64,
    window_start: Instant,
    kept: Kept,
    /// The most requests in flight seen during the window.
    peak_in_flight: u32,
    /// Exchanges of the window that failed (`fail`): no latency, and no growth.
    failed: u32,
    /// Windows in a row that lowered the limit (see [`EARLY_PROBE_AFTER`]).
    lowered: u32,
    min_rtt: Option<Duration>,
    probe: Option<Probe>,
    next_probe: Instant,
    /// Growing by [`SLOW_START_GROWTH`] each step until two judgments in a row queue (see the
    /// module's doc).
    slow_start: bool,
    /// Slow start's last judgment said "queued": one more ends it (a single window slowed by
    /// the host, not the upstream, does not).
    queued_once: bool,
    /// What a fast failure cut the limit to, and until when it may not grow past it
    /// ([`SHED_HOLD`]).
    shed_ceiling: Option<(f64, Instant)>,
}

impl Gradient {
    /// A controller starting at `min_limit`; its first exchanges measure `min_rtt`.
    pub fn new(min_limit: u32, max_limit: u32, now: Instant) -> Gradient {
        let min_limit = min_limit.max(1);
        Gradient {
            min_limit,
            max_limit: max_limit.max(min_limit),
            limit: min_limit as f64,
            window_start: now,
            kept: Kept::new(),
            peak_in_flight: 0,
            failed: 0,
            lowered: 0,
            min_rtt: None,
            probe: None,
            next_probe: now,
            slow_start: true,
            queued_once: false,
            shed_ceiling: None,
        }
    }

    /// The limit in force now (halved, or less, while `min_rtt` is measured).
    pub fn limit(&self) -> u32 {
        match &self.probe {
            Some(p) => p.level,
            None => self.learned(),
        }
    }

    /// The limit learned (what a probe returns to).
    pub fn learned(&self) -> u32 {
        self.limit.round() as u32
    }

    /// Whether `min_rtt` is being measured.
    pub fn probing(&self) -> bool {
        self.probe.is_some()
    }

    /// Changes the bounds (a reload), keeping what was learned within them.
    pub fn set_bounds(&mut self, min_limit: u32, max_limit: u32) {
        self.min_limit = min_limit.max(1);
        self.max_limit = max_limit.max(self.min_limit);
        self.limit = self
            .limit
            .clamp(self.min_limit as f64, self.max_limit as f64);
    }

    /// The upstream's latency when not queueing, as last measured.
    pub fn min_rtt(&self) -> Option<Duration> {
        self.min_rtt
    }

    fn reset_window(&mut self, now: Instant) {
        self.window_start = now;
        self.kept = Kept::new();
        self.peak_in_flight = 0;
        self.failed = 0;
    }

    /// Back to `min_limit` in slow start (an outage, or an upstream failing half of what it
    /// is sent): the limit comes back step by step as exchanges succeed within `min_rtt`.
    fn restart(&mut self, now: Instant) {
        self.limit = self.min_limit as f64;
        self.shed_ceiling = None;
        self.slow_start = true;
        self.queued_once = false;
        self.reset_window(now);
    }

    /// Records one exchange that failed after `took` (when it is known) while `in_flight`
    /// requests were out, itself included (a `5xx` answer, a connect error, a reset, a
    /// timeout); returns the limit in force when it changed. A failure is not a latency: an
    /// upstream that answers `503` at once above its capacity would otherwise look fast and
    /// the limit would climb. One faster than `min_rtt` lowers the limit below `in_flight` at
    /// once and ends slow start. A window (or a `min_rtt` probe) in which at least half the
    /// exchanges failed restarts the limit from `min_limit` in slow start; a window with any
    /// failure does not raise the limit (`sample`).
    pub fn fail(&mut self, took: Option<Duration>, in_flight: u32, now: Instant) -> Option<u32> {
        if let Some(p) = &mut self.probe {
            if p.skip > 0 {
                p.skip -= 1;
                return None;
            }
            p.failed += 1;
            if p.failed * 2 < PROBE_SAMPLES.max(p.kept.count + p.failed) {
                return None;
            }
            // The probe is mostly failures: no `min_rtt` to measure now.
            self.probe = None;
            self.next_probe = now + PROBE_INTERVAL;
            self.restart(now);
            return Some(self.limit());
        }
        self.failed += 1;
        self.peak_in_flight = self.peak_in_flight.max(in_flight);
        // Turned away faster than the upstream serves a request: it was over its capacity.
        let fast = matches!((took, self.min_rtt), (Some(t), Some(m)) if t < m);
        let below = in_flight.saturating_sub(1).max(self.min_limit) as f64;
        let cut = fast && below < self.limit;
        if cut {
            self.limit = below;
            self.slow_start = false;
            self.queued_once = false;
            // Held only for an upstream that serves some of what it is sent (it sheds its
            // overload); one that fails everything is down, and comes back by slow start.
            if self.kept.count > 0 {
                self.shed_ceiling = Some((below, now + SHED_HOLD));
            }
        }
        if self.kept.count + self.failed >= MIN_SAMPLES
            && now.saturating_duration_since(self.window_start) >= WINDOW
            && self.outage()
        {
            self.restart(now);
            return Some(self.limit());
        }
        cut.then(|| self.limit())
    }

    /// Whether at least half the window's exchanges failed.
    fn outage(&self) -> bool {
        self.failed * 2 >= self.kept.count + self.failed
    }

    /// Records one exchange that took `rtt` while `in_flight` requests were out; returns the
    /// limit in force when it changed (a window closed, a probe began or ended).
    pub fn sample(&mut self, rtt: Duration, in_flight: u32, now: Instant) -> Option<u32> {
        if let Some(p) = &mut self.probe {
            if p.skip > 0 {
                p.skip -= 1;
                return None;
            }
            p.kept.push(rtt);
            if p.kept.count < PROBE_SAMPLES {
                return None;
            }
            let (measured, level, previous) = (p.kept.typical(), p.level, p.previous);
            self.probe_done(measured, level, previous, in_flight, now);
            return Some(self.limit());
        }
        if now >= self.next_probe {
            let level = ((self.limit / 2.0).round() as u32).max(self.min_limit);
            self.start_probe(level, None, in_flight);
            return Some(self.limit());
        }
        if self.slow_start
            && self
                .min_rtt
                .is_some_and(|m| began_before(now, rtt, self.window_start + m))
        {
            // Slow start judges each limit by the exchanges that began a round trip after it
            // took effect (when the backlog of a limit too high has formed), as soon as
            // enough have come back: a window of two or three round trips, not WINDOW, so a
            // growth that queues is taken back before the next.
            return None;
        }
        self.kept.push(rtt);
        self.peak_in_flight = self.peak_in_flight.max(in_flight);
        // Slow start waits for as many exchanges as the limit, a whole turn of it: the first
        // few to come back after a step are those that found a free slot, and judged on them
        // alone a step into the backlog looked fine (the limit passed 1.5 C).
        let enough = if self.slow_start {
            MIN_SAMPLES.max(self.learned()).min(KEPT as u32)
        } else {
            MIN_SAMPLES
        };
        if self.kept.count < enough
            || (!self.slow_start && now.saturating_duration_since(self.window_start) < WINDOW)
        {
            return None;
        }
        let latency = self.kept.typical().as_secs_f64().max(1e-6);
        let used = self.peak_in_flight as f64;
        if self.outage() {
            self.restart(now);
            return Some(self.limit());
        }
        let failed = self.failed > 0;
        self.reset_window(now);
        let min_rtt = self.min_rtt?.as_secs_f64();
        let before = self.limit;
        self.judge(latency, used, min_rtt);
        match self.shed_ceiling {
            Some((ceiling, until)) if now < until => self.limit = self.limit.min(ceiling),
            _ => self.shed_ceiling = None,
        }
        if failed {
            // Some exchanges failed: whatever the latency of the others, no growth.
            self.limit = self.limit.min(before);
            return Some(self.limit());
        }
        self.lowered = if self.limit < before {
            self.lowered + 1
        } else {
            0
        };
        if self.lowered >= EARLY_PROBE_AFTER {
            self.lowered = 0;
            self.next_probe = now;
        }
        Some(self.limit())
    }

    /// Updates the limit from a window's typical `latency`, its peak use `used` and `min_rtt`
    /// (seconds): slow start's step, or the gradient.
    fn judge(&mut self, latency: f64, used: f64, min_rtt: f64) {
        if self.slow_start {
            if latency <= min_rtt * (1.0 + BUFFER) {
                self.queued_once = false;
                if used * 2.0 >= self.limit {
                    // In the upper half of the buffer the backlog may be starting (part of the
                    // limit's permits are held inside the gateway, not at the upstream): a
                    // half step, so the step past the capacity overshoots by less.
                    let growth = if latency <= min_rtt * (1.0 + BUFFER / 2.0) {
                        SLOW_START_GROWTH
                    } else {
                        SLOW_START_GROWTH.sqrt()
                    };
                    self.limit = (self.limit * growth).min(self.max_limit as f64);
                }
                return;
            }
            if !self.queued_once {
                // Judge the same limit once more before taking it for a backlog.
                self.queued_once = true;
                return;
            }
            // It queued. The step before may have been within the buffer already (up to
            // 1.1 C): go back two steps, below the capacity, and let the gradient approach it
            // from there (from above it settled higher, as a backlog that small hardly moves
            // the latency).
            self.slow_start = false;
            self.limit =
                (self.limit / SLOW_START_GROWTH / SLOW_START_GROWTH).max(self.min_limit as f64);
            return;
        }
        let gradient = (min_rtt * (1.0 + BUFFER) / latency).clamp(0.5, 2.0);
        let mut new = self.limit * gradient;
        if new > self.limit && used * 2.0 < self.limit {
            // Not using half of it: no evidence that more would be fine.
            new = self.limit;
        }
        let next = (1.0 - SMOOTHING) * self.limit + SMOOTHING * new;
        self.limit = next.clamp(self.min_limit as f64, self.max_limit as f64);
    }

    /// Halves the limit to `level` to measure `min_rtt`; `previous` is what the probe before
    /// it in this round measured.
    fn start_probe(&mut self, level: u32, previous: Option<Duration>, in_flight: u32) {
        self.probe = Some(Probe {
            // This one and the others still out began under the old limit.
            skip: in_flight.saturating_sub(1),
            kept: Kept::new(),
            level,
            previous,
            failed: 0,
        });
    }

    /// A probe at `level` measured `measured`. A probe more than [`REPROBE_ABOVE`] above the
    /// `min_rtt` before it may have queued itself (the capacity fell below half the limit):
    /// it is repeated at half its level, as long as halving lowers the latency by that much
    /// again (an upstream that became slower per request measures the same at any level) and
    /// `min_limit` allows. So a halved capacity is found in a few hundred milliseconds, not at
    /// the next probe ten seconds later.
    fn probe_done(
        &mut self,
        measured: Duration,
        level: u32,
        previous: Option<Duration>,
        in_flight: u32,
        now: Instant,
    ) {
        let above = |a: Duration, b: Duration| a.as_secs_f64() > b.as_secs_f64() * REPROBE_ABOVE;
        let best = previous.map_or(measured, |p| p.min(measured));
        let queued = self.min_rtt.is_some_and(|m| above(measured, m))
            && previous.is_none_or(|p| above(p, measured));
        if queued && level > self.min_limit {
            let lower = (level / 2).max(self.min_limit);
            self.start_probe(lower, Some(best), in_flight);
            return;
        }
        if self.min_rtt.is_some_and(|m| above(best, m)) {
            // The upstream is slower per request than when last measured (a slow database),
            // not queueing: the limit lowered for its latency is too low for its capacity.
            // Slow start finds the capacity again in a few round trips (the gradient's 2% a
            // window took seconds) and ends as soon as it queues.
            self.slow_start = true;
            self.queued_once = false;
        }
        self.min_rtt = Some(best);
        self.probe = None;
        self.next_probe = now + PROBE_INTERVAL;
        self.lowered = 0;
        self.reset_window(now);
    }
}

/// Whether an exchange that took `rtt` and ended `now` began before `at`.
fn began_before(now: Instant, rtt: Duration, at: Instant) -> bool {
    now.checked_sub(rtt).is_none_or(|began| began < at)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A model upstream: `slots` served at once in `service` each, the rest wait in its
    /// backlog, so `n` in flight answer in `service * max(1, n / slots)` on average.
    fn latency(service: Duration, slots: u32, n: u32) -> Duration {
        service.mul_f64((n as f64 / slots as f64).max(1.0))
    }

    /// Runs `secs` seconds of saturated traffic (the gateway always fills the limit in force)
    /// against the model at `service`, one exchange per millisecond; the learned limit at the
    /// end.
    fn run(g: &mut Gradient, now: &mut Instant, secs: u64, slots: u32, service: Duration) -> u32 {
        run_ms(g, now, secs * 1000, slots, service).0
    }

    /// [`run`] for `ms` milliseconds; also the most in flight meanwhile.
    fn run_ms(
        g: &mut Gradient,
        now: &mut Instant,
        ms: u64,
        slots: u32,
        service: Duration,
    ) -> (u32, u32) {
        drive(g, now, ms, |_, n| Some(latency(service, slots, n)))
    }

    /// `ms` milliseconds of one exchange each with the limit in force filled: `outcome(i, n)`
    /// of the `i`th at `n` in flight is its latency, or `None` for a failure. The learned
    /// limit at the end and the most in flight meanwhile.
    fn drive(
        g: &mut Gradient,
        now: &mut Instant,
        ms: u64,
        outcome: impl Fn(u64, u32) -> Option<Duration>,
    ) -> (u32, u32) {
        let mut most = 0;
        for i in 0..ms {
            *now += Duration::from_millis(1);
            let n = g.limit();
            most = most.max(n);
            match outcome(i, n) {
                Some(rtt) => g.sample(rtt, n, *now),
                // A failure at once (a fast 503).
                None => g.fail(Some(Duration::from_millis(1)), n, *now),
            };
        }
        (g.learned(), most)
    }

    const S: Duration = Duration::from_millis(20);

    /// Like [`run_ms`], against an upstream of `slots` that answers what is above them with a
    /// failure at once (a fast 503): of every `n` exchanges at `n` in flight, `n - slots` fail
    /// in 1 ms. The learned limit at the end and the most in flight meanwhile.
    fn run_shedding(g: &mut Gradient, now: &mut Instant, ms: u64, slots: u32) -> (u32, u32) {
        drive(g, now, ms, |i, n| {
            (i % u64::from(n) < u64::from(slots)).then_some(S)
        })
    }

    #[test]
    fn fast_failures_above_the_capacity_never_raise_the_limit() {
        let mut now = Instant::now();
        let mut g = Gradient::new(4, 1000, now);
        let (at, most) = run_shedding(&mut g, &mut now, 30_000, 16);
        assert!((14..=17).contains(&at), "limit {at} for 16 slots that shed");
        assert!(most <= 20, "{most} in flight for 16 slots: over 1.25x");
    }

    #[test]
    fn a_fast_failure_lowers_the_limit_below_what_was_in_flight() {
        let mut now = Instant::now();
        let mut g = Gradient::new(4, 1000, now);
        // Settle on an upstream of 16 slots that only queues, then let it shed instead.
        run(&mut g, &mut now, 30, 16, S);
        let before = g.learned();
        assert!(before > 16, "limit {before}: above the 16 slots");
        assert_eq!(g.fail(Some(Duration::from_millis(1)), 17, now), Some(16));
        // A slow failure (a timeout, a 500 after the work) says nothing of the capacity.
        assert_eq!(g.fail(Some(Duration::from_secs(1)), 16, now), None);
        assert_eq!(g.limit(), 16);
        // Over 30 s of an upstream that sheds above 16 slots, fewer than 1 exchange in 1,000
        // fails: the limit probes above the capacity once per SHED_HOLD at most.
        let failures = std::cell::Cell::new(0u32);
        drive(&mut g, &mut now, 30_000, |i, n| {
            let ok = i % u64::from(n) < 16;
            if !ok {
                failures.set(failures.get() + 1);
            }
            ok.then_some(S)
        });
        assert!(failures.get() < 30, "{} of 30,000 failed", failures.get());
    }

    #[test]
    fn after_an_outage_the_limit_comes_back_from_min_limit_by_slow_start() {
        let mut now = Instant::now();
        let mut g = Gradient::new(4, 1000, now);
        let at16 = run(&mut g, &mut now, 30, 16, S);
        assert!((16..=20).contains(&at16), "limit {at16} for 16 slots");
        // Two seconds of an upstream that fails everything at once.
        drive(&mut g, &mut now, 2000, |_, _| None);
        assert_eq!(g.limit(), 4, "the limit after an outage");
        // Healthy again: back near the capacity within 1.5 s, never past 1.25x.
        let (back, most) = run_ms(&mut g, &mut now, 1500, 16, S);
        assert!(
            (14..=20).contains(&back),
            "limit {back} 1.5 s after the outage"
        );
        assert!(most <= 20, "{most} in flight after the outage: over 1.25x");
    }

    #[test]
    fn converges_near_the_capacity_and_follows_it_when_it_halves() {
        let mut now = Instant::now();
        let mut g = Gradient::new(4, 1000, now);
        let at16 = run(&mut g, &mut now, 30, 16, S);
        assert!((16..=20).contains(&at16), "limit {at16} for 16 slots");
        // The window updates bring it down at once (a probe at half of a limit still above
        // the new capacity is repeated lower: `a_probe_that_queued_is_repeated_lower`).
        let first = run(&mut g, &mut now, 10, 8, S);
        assert!(
            (8..=11).contains(&first),
            "limit {first} 10 s after halving to 8 slots"
        );
        let at8 = run(&mut g, &mut now, 15, 8, S);
        assert!(
            (8..=11).contains(&at8),
            "limit {at8} 25 s after halving to 8 slots"
        );
        let back = run(&mut g, &mut now, 30, 16, S);
        assert!((16..=20).contains(&back), "limit {back} back at 16 slots");
    }

    #[test]
    fn a_cold_start_reaches_the_capacity_within_a_second_and_a_half_without_overshooting() {
        let mut now = Instant::now();
        let mut g = Gradient::new(4, 1000, now);
        let (at, most) = run_ms(&mut g, &mut now, 1500, 16, S);
        assert!(
            (16..=20).contains(&at),
            "limit {at} after 1.5 s for 16 slots"
        );
        assert!(most <= 20, "{most} in flight for 16 slots: over 1.25x");
        // And it holds there (slow start is over: no growing past it).
        let later = run(&mut g, &mut now, 5, 16, S);
        assert!((16..=20).contains(&later), "limit {later} 5 s later");
    }

    #[test]
    fn a_probe_that_queued_is_repeated_lower() {
        let mut now = Instant::now();
        let mut g = Gradient::new(4, 1000, now);
        let learned = run(&mut g, &mut now, 30, 16, S);
        assert!(learned >= 16, "{learned}");
        // The capacity halves just as a probe is due: half the learned limit is still above
        // it, so that probe measures a backlog (1.1 S or more) and is repeated at half its
        // level, which measures the service time again.
        g.next_probe = now;
        let (_, most) = run_ms(&mut g, &mut now, 1000, 8, S);
        assert_eq!(g.min_rtt(), Some(S), "min_rtt after the halving");
        assert!(!g.probing());
        assert!(most <= learned, "{most}");
        let settled = run(&mut g, &mut now, 5, 8, S);
        assert!((8..=10).contains(&settled), "limit {settled} for 8 slots");
    }

    #[test]
    fn one_slow_judgment_does_not_end_slow_start() {
        let mut now = Instant::now();
        let mut g = Gradient::new(4, 1000, now);
        run_ms(&mut g, &mut now, 100, 16, S);
        assert_eq!(g.min_rtt(), Some(S));
        // The host stalls every exchange of one slow-start step (a full run queue), not the
        // upstream: the limit waits, then grows on.
        let before = g.learned();
        for _ in 0..40 {
            now += Duration::from_millis(1);
            let n = g.limit();
            g.sample(S * 2, n, now);
        }
        assert!(g.slow_start, "slow start ended on one slow step");
        assert_eq!(g.learned(), before);
        let (at, most) = run_ms(&mut g, &mut now, 1500, 16, S);
        assert!((16..=20).contains(&at), "limit {at}");
        assert!(most <= 20, "{most}");
    }

    #[test]
    fn the_typical_latency_sees_a_small_backlog_and_not_one_stall() {
        let mut k = Kept::new();
        for _ in 0..63 {
            k.push(S);
        }
        k.push(S * 50);
        assert_eq!(k.typical(), S, "one stalled exchange of 64");
        // A quarter of the exchanges waited a whole service time for a slot: the median is
        // still S, the latency the controller sees is not.
        let mut k = Kept::new();
        for i in 0..64 {
            k.push(if i % 4 == 0 { S * 2 } else { S });
        }
        assert!(k.typical() > S.mul_f64(1.0 + BUFFER), "{:?}", k.typical());
    }

    #[test]
    fn a_slower_upstream_is_followed_after_the_next_probe() {
        let mut now = Instant::now();
        let mut g = Gradient::new(4, 1000, now);
        run(&mut g, &mut now, 30, 16, S);
        // Every exchange takes twice as long (a slow database): the capacity in requests at
        // once is the same, and after a probe the limit is back near it.
        let slower = run(&mut g, &mut now, 30, 16, S * 2);
        assert!((16..=20).contains(&slower), "limit {slower}");
        assert_eq!(g.min_rtt(), Some(S * 2));
    }

    #[test]
    fn a_slower_upstream_is_followed_within_five_seconds() {
        let mut now = Instant::now();
        let mut g = Gradient::new(4, 1000, now);
        run(&mut g, &mut now, 30, 16, S);
        // Just after a routine probe (every 10 s, one at 30 s): the next is 8.5 s away.
        run_ms(&mut g, &mut now, 1500, 16, S);
        // Every exchange takes twice as long from now on, the same 16 at once.
        let (at, most) = run_ms(&mut g, &mut now, 5000, 16, S * 2);
        assert!((16..=20).contains(&at), "limit {at} 5 s after the slowdown");
        assert!(most <= 20, "{most} in flight: over 1.25x");
        assert_eq!(g.min_rtt(), Some(S * 2));
        let later = run(&mut g, &mut now, 10, 16, S * 2);
        assert!((16..=20).contains(&later), "limit {later} 15 s after it");
    }

    #[test]
    fn a_probe_halves_the_limit_then_gives_it_back() {
        let mut now = Instant::now();
        let mut g = Gradient::new(4, 1000, now);
        let learned = run(&mut g, &mut now, 30, 16, S);
        // Run up to the next probe.
        let mut saw = false;
        for _ in 0..20_000 {
            now += Duration::from_millis(1);
            let n = g.limit();
            g.sample(latency(S, 16, n), n, now);
            if g.probing() {
                saw = true;
                assert_eq!(g.limit(), ((learned as f64 / 2.0).round() as u32).max(4));
                break;
            }
        }
        assert!(saw, "no probe within 20 s");
        for _ in 0..(learned + PROBE_SAMPLES) {
            now += Duration::from_millis(1);
            g.sample(S, 8, now);
        }
        assert!(!g.probing());
        assert_eq!(g.min_rtt(), Some(S));
    }

    #[test]
    fn stays_within_its_bounds() {
        let mut now = Instant::now();
        let mut g = Gradient::new(4, 10, now);
        assert_eq!(run(&mut g, &mut now, 10, 64, S), 10, "max_limit caps it");
        // A collapse between two probes (every exchange 50x slower than the baseline the
        // last probe measured) brings it to min_limit.
        let mut g = Gradient::new(4, 10, now);
        run(&mut g, &mut now, 1, 64, S);
        assert_eq!(g.min_rtt(), Some(S));
        for _ in 0..5_000 {
            now += Duration::from_millis(1);
            g.sample(Duration::from_secs(1), 10, now);
        }
        assert_eq!(g.learned(), 4);
        g.set_bounds(6, 8);
        assert_eq!(g.learned(), 6, "new bounds clamp the learned limit");
    }

    #[test]
    fn an_idle_upstream_does_not_drift_up() {
        let mut now = Instant::now();
        let mut g = Gradient::new(4, 1000, now);
        run(&mut g, &mut now, 10, 16, S);
        // One request at a time, at the service time: the limit is not used, so after the
        // window that still held the saturated exchanges it stays.
        let mut idle = |g: &mut Gradient, ms: u32| {
            for _ in 0..ms {
                now += Duration::from_millis(1);
                g.sample(S, 1, now);
            }
            g.learned()
        };
        let start = idle(&mut g, 1_000);
        assert!((16..=20).contains(&start), "{start}");
        let later = idle(&mut g, 20_000);
        assert!(later <= start, "{later} > {start}");
    }

    #[test]
    fn a_window_needs_enough_exchanges() {
        let t0 = Instant::now();
        let mut g = Gradient::new(4, 100, t0);
        // The first exchanges measure min_rtt.
        assert!(g.sample(S, 1, t0).is_some(), "a probe begins");
        for i in 0..PROBE_SAMPLES {
            g.sample(S, 1, t0 + Duration::from_millis(i as u64));
        }
        assert_eq!(g.min_rtt(), Some(S));
        let t1 = t0 + Duration::from_secs(1);
        for i in 1..MIN_SAMPLES {
            assert_eq!(g.sample(S, 4, t1 + WINDOW * i), None);
        }
        assert!(g.sample(S, 4, t1 + WINDOW * 10).is_some());
    }
}
