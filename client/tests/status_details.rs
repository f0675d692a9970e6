//! A controller decodes the details of the server's errors (DESIGN
//! §errors: `ErrorInfo`, `RetryInfo`, `BadRequest`, `QuotaFailure`) with
//! the `tonic-types` this crate was built with, through its re-export,
//! without a version-matched dependency of its own.

use std::time::Duration;

use reconciled_client::tonic::{Code, Status};
use reconciled_client::tonic_types::{ErrorDetails, StatusExt as _};

#[test]
fn status_details_decode_through_the_reexported_tonic_types() {
    let mut details = ErrorDetails::with_error_info(
        "GENERATION_MISMATCH",
        "reconciled",
        [
            ("expected".to_owned(), "0".to_owned()),
            ("actual".to_owned(), "1".to_owned()),
        ],
    );
    details.set_retry_info(Some(Duration::from_secs(2)));
    let status = Status::with_error_details(Code::FailedPrecondition, "stale", details);

    let decoded = status.get_error_details();
    let info = decoded.error_info().expect("ErrorInfo");
    assert_eq!(info.reason, "GENERATION_MISMATCH");
    assert_eq!(info.metadata.get("actual").map(String::as_str), Some("1"));
    assert_eq!(
        decoded.retry_info().and_then(|retry| retry.retry_delay),
        Some(Duration::from_secs(2))
    );
}
