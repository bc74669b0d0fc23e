//! What the proxy hands the limiter from the upstream's response: its status, for the
//! reservations of `count` rules (see [`crate::limiter::reservation`]). Settled when the
//! upstream's response head arrives, before it is sent on, so that the client's next request
//! already sees a refund. An exchange that never gets an upstream response (the client left,
//! the upstream failed) keeps its reservations charged.

use crate::limiter::engine::Slots;

/// Settles the request's reservations on the upstream's `status` (informational 1xx heads
/// are not the answer, and wait for the final one).
pub async fn settle_on_status(slots: Option<&mut Slots>, status: http::StatusCode) {
    if status.is_informational() && status != http::StatusCode::SWITCHING_PROTOCOLS {
        return;
    }
    if let Some(slots) = slots {
        let reservations = slots.reservations();
        if !reservations.is_empty() {
            reservations.settle(status.as_u16()).await;
        }
    }
}
