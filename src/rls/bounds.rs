//! What a `ShouldRateLimit` request may hold before anything is matched or charged. Envoy's
//! own requests are a few descriptors of a few short entries; anything far beyond that is a
//! broken or hostile client, refused whole with `INVALID_ARGUMENT` (nothing charged).
//!
//! The message as a whole is bounded earlier, by tonic's decoder: [`MAX_MESSAGE_BYTES`].

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use tonic::Status;

/// The largest request message decoded (tonic's `max_decoding_message_size`; its default is
/// 4 MiB). 64 KiB is hundreds of times what Envoy sends and keeps a flood of large messages
/// from costing more than small ones; a larger one is refused with `RESOURCE_EXHAUSTED`
/// before it is decoded.
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024;

/// Most descriptors one request may carry.
pub const MAX_DESCRIPTORS: usize = 64;

/// Most entries one descriptor may carry (as many as a limit may name).
pub use super::limits::MAX_ENTRIES;

/// Refuses a request no limit could sensibly answer: no domain, no descriptors, too many of
/// them, an entry without a key, or refunds (`is_negative_hits`, which floodgate does not do).
pub fn check(req: &RateLimitRequest) -> Result<(), Status> {
    if req.domain.is_empty() {
        return Err(Status::invalid_argument(
            "the rate limit domain must not be empty",
        ));
    }
    if req.descriptors.is_empty() {
        return Err(Status::invalid_argument(
            "the request has no descriptors: nothing to rate limit",
        ));
    }
    if req.descriptors.len() > MAX_DESCRIPTORS {
        return Err(Status::invalid_argument(format!(
            "the request has {} descriptors; at most {MAX_DESCRIPTORS} are taken",
            req.descriptors.len()
        )));
    }
    for (i, d) in req.descriptors.iter().enumerate() {
        if d.entries.is_empty() {
            return Err(Status::invalid_argument(format!(
                "descriptor {i} has no entries"
            )));
        }
        if d.entries.len() > MAX_ENTRIES {
            return Err(Status::invalid_argument(format!(
                "descriptor {i} has {} entries; at most {MAX_ENTRIES} are taken",
                d.entries.len()
            )));
        }
        if let Some(j) = d.entries.iter().position(|e| e.key.is_empty()) {
            return Err(Status::invalid_argument(format!(
                "descriptor {i}: entry {j} has an empty key"
            )));
        }
        if d.is_negative_hits {
            return Err(Status::invalid_argument(format!(
                "descriptor {i}: is_negative_hits (giving quota back) is not supported"
            )));
        }
    }
    Ok(())
}
