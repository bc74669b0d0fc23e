//! The true-up of a reservation, as a pure state transition (the response-aware rules:
//! `count`, `cost_from`; see [`super::reservation`]).
//!
//! A request reserved its rule's cost when it was admitted; once its response is known the
//! reservation is trued up: part or all of it is refunded (a `count` rule whose status does
//! not match, a true cost below the reservation) or more is charged (a true cost above it).
//! Like a quota lease's give-back, a true-up names the window it was charged in
//! (`charged_at_ns`), so that it never lands in another window: a refund of an ended window is
//! worth nothing and is dropped, an extra charge of an ended window is owed to nobody.
//!
//! An extra charge is never refused: it may put the counter past the limit (the following
//! requests wait until it has drained). That overshoot is bounded by one request's true cost
//! minus its reservation, per request in flight.

use super::algorithm::{interval_ns, sat, window_ns, State};
use super::Limit;

/// How much to give back or charge on top of a reservation (at most one is non-zero).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Adjust {
    /// Units of the reservation given back.
    pub refund: u64,
    /// Units charged beyond the reservation.
    pub extra: u64,
}

impl Adjust {
    /// The adjustment that takes a reservation of `reserved` to a true cost of `cost`.
    pub fn between(reserved: u64, cost: u64) -> Adjust {
        Adjust {
            refund: reserved.saturating_sub(cost),
            extra: cost.saturating_sub(reserved),
        }
    }

    /// Whether there is nothing to do.
    pub fn is_none(self) -> bool {
        self.refund == 0 && self.extra == 0
    }
}

/// Trues up `state` at `now_ns` for a reservation charged at `charged_at_ns` under `limit`.
/// Returns false when the state does not hold that charge any more (its window ended, the
/// rule's algorithm or rate changed on reload): then nothing is changed.
pub fn true_up(
    state: &mut State,
    limit: &Limit,
    now_ns: u64,
    charged_at_ns: u64,
    adjust: Adjust,
) -> bool {
    let window = window_ns(limit);
    let start = charged_at_ns - charged_at_ns % window;
    let end = start.saturating_add(window);
    match state {
        State::FixedWindow { window_end, count }
            if *window_end == limit.window_at(charged_at_ns).1 && now_ns < *window_end =>
        {
            // A refund takes back only what was charged: never below zero, nor below a count
            // a usage grant already took there (calendar and grants).
            let signed = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
            *count = count
                .saturating_sub(signed(adjust.refund))
                .max((*count).min(0))
                .saturating_add(signed(adjust.extra));
            true
        }
        State::SlidingWindowCounter {
            expires,
            previous,
            current,
        } if now_ns < end.saturating_add(window) => {
            // The charge is in the current window, or (one window on) in the previous one.
            let counted = if *expires == start.saturating_add(window.saturating_mul(2)) {
                current
            } else if *expires == start.saturating_add(window.saturating_mul(3)) {
                previous
            } else {
                return false;
            };
            *counted = counted
                .saturating_sub(adjust.refund)
                .saturating_add(adjust.extra);
            true
        }
        State::SlidingWindowLog(log) => {
            // The reservation's entries expire at `charged_at + window` at the latest (the
            // instant is read just after the charge): a refund gives back the newest live
            // entries up to then, while they still count (an entry of a request charged in
            // that instant instead of this one is worth the same unit). An extra charge is
            // owed until then, as a debt rather than entries (see `Log`).
            let expires = charged_at_ns.saturating_add(window);
            if now_ns >= expires {
                return false;
            }
            let entries = &mut log.entries;
            let live = entries.partition_point(|&e| e <= now_ns);
            let to = entries.partition_point(|&e| e <= expires);
            let n = usize::try_from(adjust.refund)
                .unwrap_or(usize::MAX)
                .min(to.saturating_sub(live));
            entries.drain(to - n..to);
            if adjust.extra > 0 {
                log.owe(now_ns, adjust.extra, expires);
            }
            n > 0 || adjust.extra > 0
        }
        State::TokenBucket { full_at, interval }
        | State::LeakyBucket {
            tat: full_at,
            interval,
        } if *interval == interval_ns(limit) => {
            let step = u128::from(*interval);
            let at = u128::from((*full_at).max(now_ns));
            let moved = at
                .saturating_sub(u128::from(adjust.refund) * step)
                .max(u128::from(now_ns))
                .saturating_add(u128::from(adjust.extra) * step);
            *full_at = sat(moved);
            true
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::limiter::algorithm::{decide, Log, MAX_SLIDING_LOG_DEBT};
    use crate::limiter::Algorithm;

    const S: u64 = 1_000_000_000;

    fn charge(limit: &Limit, state: Option<State>, now: u64, cost: u64) -> Option<State> {
        let (d, update) = decide(state.as_ref(), limit, now, cost);
        assert!(d.allowed, "admitted");
        match state {
            Some(mut s) => {
                update.apply(&mut s);
                Some(s)
            }
            None => update.into_state(),
        }
    }

    #[test]
    fn a_refund_gives_the_reservation_back_in_its_window_only() {
        for algorithm in [
            Algorithm::FixedWindow,
            Algorithm::SlidingWindowCounter,
            Algorithm::SlidingWindowLog,
            Algorithm::TokenBucket,
            Algorithm::LeakyBucket,
        ] {
            let limit = Limit::police(algorithm, 2, Duration::from_secs(10), 2);
            let at = 100 * S;
            let mut state = charge(&limit, None, at, 1);
            state = charge(&limit, state, at, 1);
            let mut s = state.expect("charged");
            assert!(
                !decide(Some(&s), &limit, at, 1).0.allowed,
                "{algorithm:?} full"
            );
            let refund = Adjust::between(1, 0);
            assert!(true_up(&mut s, &limit, at + 1, at, refund), "{algorithm:?}");
            assert!(
                decide(Some(&s), &limit, at + 1, 1).0.allowed,
                "{algorithm:?} refunded"
            );
        }
        // Fixed window: a refund of an ended window does not touch the next one.
        let limit = Limit::police(Algorithm::FixedWindow, 2, Duration::from_secs(10), 2);
        let mut s = charge(&limit, None, 111 * S, 2).expect("charged");
        assert!(!true_up(
            &mut s,
            &limit,
            111 * S,
            105 * S,
            Adjust::between(1, 0)
        ));
        assert!(!decide(Some(&s), &limit, 111 * S, 1).0.allowed);
    }

    #[test]
    fn an_extra_charge_may_pass_the_limit_and_is_waited_out() {
        let limit = Limit::police(Algorithm::TokenBucket, 10, Duration::from_secs(10), 10);
        let at = 100 * S;
        let mut s = charge(&limit, None, at, 1).expect("charged");
        assert!(true_up(&mut s, &limit, at, at, Adjust::between(1, 15)));
        let d = decide(Some(&s), &limit, at, 1).0;
        assert!(!d.allowed);
        // 15 tokens owed on a bucket of 10 at 1/s: 6 s until one is free.
        assert_eq!(d.retry_after, Duration::from_secs(6));
        let limit = Limit::police(Algorithm::FixedWindow, 10, Duration::from_secs(10), 10);
        let mut s = charge(&limit, None, at, 1).expect("charged");
        assert!(true_up(&mut s, &limit, at, at, Adjust::between(1, 12)));
        assert!(!decide(Some(&s), &limit, at, 1).0.allowed);
        assert!(decide(Some(&s), &limit, at + 10 * S, 1).0.allowed);
    }

    #[test]
    fn a_log_refund_removes_only_the_reservations_entries() {
        let limit = Limit::police(Algorithm::SlidingWindowLog, 5, Duration::from_secs(10), 5);
        let mut s = State::SlidingWindowLog(Box::new(Log::of([105 * S, 110 * S])));
        assert!(!true_up(
            &mut s,
            &limit,
            101 * S,
            94 * S,
            Adjust::between(1, 0)
        ));
        assert!(true_up(
            &mut s,
            &limit,
            101 * S,
            100 * S,
            Adjust::between(1, 0)
        ));
        assert_eq!(s, State::SlidingWindowLog(Box::new(Log::of([105 * S]))));
    }

    #[test]
    fn a_log_owes_an_extra_charge_until_the_reservation_stops_counting() {
        let limit = Limit::police(Algorithm::SlidingWindowLog, 10, Duration::from_secs(10), 10);
        let at = 100 * S;
        let mut s = charge(&limit, None, at, 2).expect("charged");
        // True cost 7 of a reservation of 2: 5 more, owed until 110 s.
        assert!(true_up(&mut s, &limit, at + S, at, Adjust::between(2, 7)));
        let mut state = Some(s);
        for _ in 0..3 {
            state = charge(&limit, state, at + S, 1);
        }
        let s = state.expect("charged");
        let d = decide(Some(&s), &limit, at + S, 1).0;
        assert!(!d.allowed, "2 + 5 + 3 of 10");
        assert_eq!(d.retry_after, Duration::from_secs(9));
        assert!(!decide(Some(&s), &limit, 110 * S - 1, 1).0.allowed);
        // The reservation's entries and its debt end together: 3 of 10 left counting.
        let d = decide(Some(&s), &limit, 110 * S, 7).0;
        assert!(d.allowed && d.remaining == 0, "{d:?}");
        // An extra charge of a reservation whose window has ended is owed to nobody.
        let mut s = charge(&limit, None, at, 1).expect("charged");
        assert!(!true_up(
            &mut s,
            &limit,
            at + 10 * S,
            at,
            Adjust::between(1, 9)
        ));
        assert_eq!(s, State::SlidingWindowLog(Box::new(Log::of([at + 10 * S]))));
    }

    #[test]
    fn a_hostile_cost_on_a_log_is_a_bounded_debt() {
        let limit = Limit::police(Algorithm::SlidingWindowLog, 5, Duration::from_secs(10), 5);
        let at = 100 * S;
        let mut s = charge(&limit, None, at, 1).expect("charged");
        let huge = Adjust::between(1, u64::MAX);
        assert!(true_up(&mut s, &limit, at, at, huge));
        assert!(true_up(&mut s, &limit, at, at, huge), "merged, not added");
        let State::SlidingWindowLog(log) = &s else {
            panic!("{s:?}")
        };
        assert_eq!((log.entries.len(), log.debt), (1, MAX_SLIDING_LOG_DEBT));
        // Refused until the window of the reservation ends, then whole again.
        let d = decide(Some(&s), &limit, at + 9 * S, 0).0;
        assert!(!d.allowed);
        assert_eq!(d.retry_after, Duration::from_secs(1));
        assert_eq!(
            crate::limiter::algorithm::expires_at(&s),
            at + 10 * S,
            "the key is dropped when the debt ends"
        );
        let d = decide(Some(&s), &limit, at + 10 * S, 5).0;
        assert!(d.allowed, "{d:?}");
    }
}
