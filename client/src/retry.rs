//! When to try a failed call again, and after how long.
//!
//! The server says when waiting helps: a call refused by a rate limit, the
//! tenant's byte budget, the unary concurrency limit or the connection
//! limit, and a Watch ended for a slow consumer, fail with
//! `RESOURCE_EXHAUSTED` and a `RetryInfo` holding the wait. A lost or
//! refused connection (the server stopped or restarts) is `UNAVAILABLE`.
//! [`retry_after`] reads both, so a controller's retry loop needs no
//! knowledge of the error details.

use std::time::Duration;

use tonic::{Code, Status};
use tonic_types::StatusExt as _;

/// How long [`retry_after`] waits after an `UNAVAILABLE` without a
/// `RetryInfo` (a lost connection, a server restarting).
pub const UNAVAILABLE_RETRY_DELAY: Duration = Duration::from_secs(1);

/// How long to wait before sending the same call again after it failed
/// with `status`, or `None` when sending it again as it is cannot succeed.
///
/// - A `RetryInfo` (rate limits, byte budget, a server at its limits, a
///   Watch too slow for the tenant): its delay, whatever the code.
/// - `UNAVAILABLE` without one (the connection was lost or could not be
///   made, the server is shutting down): [`UNAVAILABLE_RETRY_DELAY`].
/// - Anything else: `None`. That includes `RESOURCE_EXHAUSTED` with a
///   `QuotaFailure` only (a tenant's limit, such as `max_items` or
///   `max_watchers`: only using less helps), `ABORTED` from a paged
///   listing (start over from the first page), `FAILED_PRECONDITION`
///   (`GENERATION_MISMATCH`: read, merge, then submit), `OUT_OF_RANGE`
///   (a Watch resumes from another revision), `NOT_FOUND`,
///   `UNAUTHENTICATED` and `INVALID_ARGUMENT`.
///
/// Whether a retry is safe is the caller's to know: every call of the
/// `Reconciler` service can be sent again, but a `CreateTenant` whose reply
/// was lost has created the tenant, and its retry fails with
/// `ALREADY_EXISTS` (get a token with `RotateToken`).
///
/// ```no_run
/// # async fn example(client: reconciled_client::Client) -> Result<(), reconciled_client::tonic::Status> {
/// use reconciled_client::{proto, retry_after};
///
/// let request = proto::GetStatusRequest { tenant: "acme".into() };
/// let status = loop {
///     match client.get_status(request.clone()).await {
///         Ok(reply) => break reply,
///         Err(status) => match retry_after(&status) {
///             Some(delay) => reconciled_client::tokio::time::sleep(delay).await,
///             None => return Err(status),
///         },
///     }
/// };
/// # let _ = status;
/// # Ok(())
/// # }
/// ```
pub fn retry_after(status: &Status) -> Option<Duration> {
    let delay = status
        .get_error_details()
        .retry_info()
        .and_then(|retry| retry.retry_delay);
    match delay {
        Some(delay) => Some(delay),
        None if status.code() == Code::Unavailable => Some(UNAVAILABLE_RETRY_DELAY),
        None => None,
    }
}

#[cfg(test)]
mod tests {
    use tonic_types::ErrorDetails;

    use super::*;

    #[test]
    fn a_retry_info_gives_its_delay_and_other_refusals_none() {
        let limited = Status::with_error_details(
            Code::ResourceExhausted,
            "rate limit",
            ErrorDetails::with_retry_info(Some(Duration::from_millis(250))),
        );
        assert_eq!(retry_after(&limited), Some(Duration::from_millis(250)));
        assert_eq!(
            retry_after(&Status::unavailable("connection lost")),
            Some(UNAVAILABLE_RETRY_DELAY)
        );
        let quota = Status::with_error_details(
            Code::ResourceExhausted,
            "max_items",
            ErrorDetails::with_quota_failure_violation("max_items", "too many"),
        );
        for status in [
            quota,
            Status::aborted("page token expired"),
            Status::failed_precondition("generation"),
            Status::invalid_argument("bad"),
            Status::not_found("gone"),
        ] {
            assert_eq!(retry_after(&status), None, "{status:?}");
        }
    }
}
