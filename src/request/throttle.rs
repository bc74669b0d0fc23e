//! `mode = "slow"`: a request a rule would reject is forwarded, and its bodies go at the
//! rule's `slow_rate` bytes per second, each way.
//!
//! Nothing here sleeps on a thread or buffers. The proxy asks [`Pace::wait`] before each body
//! piece goes on, and awaits what it answers: Pingora's `response_body_filter` returns it as
//! the delay before the piece is written to the client (while it waits, the upstream side
//! fills Pingora's four-piece channel and then stops reading: the upstream is read no faster
//! than the client is served), and `request_body_filter` awaits it before the piece goes
//! upstream (the client's next piece is not read meanwhile). A request's memory is then
//! what Pingora holds anyway: the channel's pieces and the batch the client side has taken
//! from it, and the socket buffers. Each piece is one read of the upstream, up to 64 KiB; so a
//! slowed exchange's upstream connection gets a receive window of a sixteenth of a second at
//! its rate ([`upstream_window`], 4 to 64 KiB) in a pool of its own ([`narrow`]), which sizes
//! the reads, and with them the pieces, by the rate.
//!
//! A piece is sent whole: Pingora's filters cannot split it. The wait is counted per byte
//! (a piece goes when every byte sent so far, itself included, is due at `slow_rate`), so the
//! average rate is exact and the client sees at most one piece at a time ahead of the pace.
//! [`MIN_SLOW_RATE`] keeps the gap before one 64 KiB piece to a minute at most.
//!
//! Timeouts still apply: a wait never runs past the upstream's total `timeout` (the exchange
//! is cut there, see [`Pace::wait`]), `read_timeout` still times every upstream read, and an
//! upload still has to arrive within `body_timeout`.

use std::time::{Duration, Instant};

pub use crate::text::rate::{parse_rate, show_rate, MAX_SLOW_RATE, MIN_SLOW_RATE};

/// The upstream receive buffer of a slowed exchange: a sixteenth of a second at its rate,
/// between 4 and 64 KiB. The kernel then holds at most about that much of the body on
/// floodgate's side, so each read of the upstream yields a piece of about that size, and the
/// pieces Pingora keeps queued for the client while the pace holds them (its channel of four,
/// and the batch in hand) stay a few of those small ones instead of 64 KiB each.
pub fn upstream_window(rate: u64) -> usize {
    (rate / 16).clamp(4 * 1024, 64 * 1024) as usize
}

/// Gives a slowed exchange's upstream connection its narrow receive window
/// ([`upstream_window`]) and a pool of its own: a connection with a window that small must
/// not go on to serve requests that are not slowed (nor one slowed at another rate).
pub fn narrow(peer: &mut pingora::upstreams::peer::HttpPeer, rate: u64) {
    let window = upstream_window(rate);
    peer.options.tcp_recv_buf = Some(window);
    peer.group_key = peer
        .group_key
        .rotate_left(17)
        .wrapping_add(0x5105_ed00_0000_0000 | window as u64);
}

/// What slowed a request: the rate and the rules, for the proxy and the access log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slowed {
    /// Bytes per second, each way.
    pub rate: u64,
    /// The rules that slowed it, comma-separated (the access log's `slowed_by`).
    pub rules: String,
}

/// One slowed request's state across the proxy's phases: what slowed it and the pace of each
/// direction.
#[derive(Debug, Clone)]
pub struct Throttle {
    /// The rate and the rules.
    pub slowed: Slowed,
    /// The request body's pace (what goes upstream).
    pub request: Pace,
    /// The response body's pace (what goes to the client).
    pub response: Pace,
    /// When the request body is due (`body_timeout` after its head): an upload's wait never
    /// runs past it.
    pub body_deadline: Option<Instant>,
}

impl Throttle {
    /// A throttle at the rate `slowed` names, each direction paced on its own.
    pub fn new(slowed: Slowed) -> Throttle {
        Throttle {
            request: Pace::new(slowed.rate),
            response: Pace::new(slowed.rate),
            body_deadline: None,
            slowed,
        }
    }
}

/// The pace of one direction of one slowed request.
#[derive(Debug, Clone)]
pub struct Pace {
    rate: u64,
    /// When the first piece came: the pace counts from there.
    start: Option<Instant>,
    /// Bytes let through so far.
    sent: u64,
}

/// What to do with the next piece.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// Send it after this long.
    For(Duration),
    /// The deadline comes before the piece is due: send it at the deadline, where the
    /// exchange will be cut (the next piece finds the deadline past).
    UntilDeadline(Duration),
    /// The deadline has passed, or the last piece would be due after it: cut the exchange now.
    Cut,
}

impl Pace {
    /// A pace of `rate` bytes per second (at least 1).
    pub fn new(rate: u64) -> Pace {
        Pace {
            rate: rate.max(1),
            start: None,
            sent: 0,
        }
    }

    /// How long the next piece of `bytes` waits at `now`: until every byte let through,
    /// these included, is due at the rate. `deadline`: when the exchange must be over;
    /// `last`: this piece ends the body (it must then be due in time itself).
    pub fn wait(
        &mut self,
        bytes: usize,
        now: Instant,
        deadline: Option<Instant>,
        last: bool,
    ) -> Wait {
        if deadline.is_some_and(|d| now >= d) {
            return Wait::Cut;
        }
        let start = *self.start.get_or_insert(now);
        self.sent = self.sent.saturating_add(bytes as u64);
        let due = start + due_after(self.sent, self.rate);
        let wait = due.saturating_duration_since(now);
        match deadline {
            Some(d) if due > d && last => Wait::Cut,
            Some(d) if due > d => Wait::UntilDeadline(d.saturating_duration_since(now)),
            _ => Wait::For(wait),
        }
    }
}

/// What Pingora's `response_body_filter` answers for a slowed response's next piece of
/// `len` bytes: the delay before it is written, or the error that cuts the exchange at the
/// upstream's total `deadline`.
pub fn response_delay(
    pace: &mut Pace,
    len: usize,
    deadline: Option<Instant>,
    last: bool,
) -> pingora::Result<Option<Duration>> {
    match pace.wait(len, Instant::now(), deadline, last) {
        Wait::For(d) | Wait::UntilDeadline(d) if d.is_zero() => Ok(None),
        Wait::For(d) | Wait::UntilDeadline(d) => Ok(Some(d)),
        Wait::Cut => Err(pingora::Error::explain(
            pingora::ErrorType::ReadTimedout,
            "the upstream's total timeout ran out while the response was slowed",
        )),
    }
}

/// How long after the start `sent` bytes are due at `rate` bytes per second.
fn due_after(sent: u64, rate: u64) -> Duration {
    let nanos = u128::from(sent) * 1_000_000_000 / u128::from(rate);
    Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slowed_exchange_reads_its_upstream_through_a_narrow_window_of_its_own() {
        assert_eq!(upstream_window(64 * 1024), 4 * 1024);
        assert_eq!(upstream_window(MIN_SLOW_RATE), 4 * 1024);
        assert_eq!(upstream_window(512 * 1024), 32 * 1024);
        assert_eq!(upstream_window(MAX_SLOW_RATE), 64 * 1024);
        let addr: std::net::SocketAddr = "127.0.0.1:9000".parse().unwrap();
        let plain = pingora::upstreams::peer::HttpPeer::new(addr, false, String::new());
        let mut slowed = plain.clone();
        narrow(&mut slowed, 64 * 1024);
        assert_eq!(slowed.options.tcp_recv_buf, Some(4 * 1024));
        let mut faster = plain.clone();
        narrow(&mut faster, 1024 * 1024);
        // Three pools: a narrow connection never serves an unslowed request, nor one slowed
        // at another rate.
        use pingora::upstreams::peer::Peer;
        assert_ne!(slowed.reuse_hash(), plain.reuse_hash());
        assert_ne!(slowed.reuse_hash(), faster.reuse_hash());
    }

    #[test]
    fn rates_take_b_kib_and_mib_within_bounds() {
        assert_eq!(parse_rate("64KiB"), Ok(64 * 1024));
        assert_eq!(parse_rate("1MiB"), Ok(1024 * 1024));
        assert_eq!(parse_rate("2048B"), Ok(2048));
        assert_eq!(parse_rate("1024MiB"), Ok(MAX_SLOW_RATE));
        for bad in [
            "64", "KiB", "64kb", "64 KiB", "1.5MiB", "100B", "1025MiB", "0KiB",
        ] {
            assert!(parse_rate(bad).is_err(), "{bad} should be refused");
        }
        assert!(parse_rate("99999999999999999999MiB").is_err());
        for shown in ["64KiB", "1MiB", "1500B", "1536KiB"] {
            assert_eq!(show_rate(parse_rate(shown).unwrap()), shown);
        }
    }

    #[test]
    fn bytes_go_at_the_rate_counted_per_byte() {
        let t0 = Instant::now();
        let mut p = Pace::new(50 * 1024);
        // 150 KiB in three 50 KiB pieces arriving at once: due at 1 s, 2 s, 3 s.
        assert_eq!(
            p.wait(50 * 1024, t0, None, false),
            Wait::For(Duration::from_secs(1))
        );
        let t1 = t0 + Duration::from_secs(1);
        assert_eq!(
            p.wait(50 * 1024, t1, None, false),
            Wait::For(Duration::from_secs(1))
        );
        // A piece that comes late goes at once, and the pace is not reset by it.
        let late = t0 + Duration::from_secs(10);
        assert_eq!(
            p.wait(50 * 1024, late, None, true),
            Wait::For(Duration::ZERO)
        );
    }

    #[test]
    fn a_wait_never_runs_past_the_deadline() {
        let t0 = Instant::now();
        let deadline = Some(t0 + Duration::from_millis(500));
        let mut p = Pace::new(1024);
        assert_eq!(
            p.wait(1024, t0, deadline, false),
            Wait::UntilDeadline(Duration::from_millis(500))
        );
        assert_eq!(
            p.wait(1, t0 + Duration::from_millis(500), deadline, false),
            Wait::Cut
        );
        let mut last = Pace::new(1024);
        assert_eq!(last.wait(4096, t0, deadline, true), Wait::Cut);
    }
}
