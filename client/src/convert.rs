//! Conversions between JSON values (`serde_json`) and the well-known proto
//! types the API uses for properties and times (`google.protobuf.Struct`,
//! `Value`, `Duration`). Pure functions, no I/O.
//!
//! Numbers follow the server's rules (DESIGN section 2): `Struct` numbers are
//! doubles, so an integer whose magnitude exceeds 2^53 travels as a decimal
//! string; coming in, an integral number within ±2^53 becomes a JSON integer
//! and any other finite number a JSON float.

use std::time::Duration;

pub use reconciled_proto::json::{
    json_to_value, properties_from_struct, properties_to_struct, value_to_json,
};

/// Converts a duration to its proto form, saturating at the largest
/// `google.protobuf.Duration`.
pub fn duration_to_proto(duration: Duration) -> prost_types::Duration {
    prost_types::Duration::try_from(duration).unwrap_or(prost_types::Duration {
        seconds: i64::MAX,
        nanos: 999_999_999,
    })
}

/// Converts a proto duration; `None` when it is negative or malformed.
pub fn duration_from_proto(duration: prost_types::Duration) -> Option<Duration> {
    Duration::try_from(duration).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_convert_both_ways_and_negative_ones_are_rejected() {
        let wire = duration_to_proto(Duration::from_millis(1500));
        assert_eq!(wire.seconds, 1);
        assert_eq!(wire.nanos, 500_000_000);
        assert_eq!(duration_from_proto(wire), Some(Duration::from_millis(1500)));
        assert_eq!(
            duration_from_proto(prost_types::Duration {
                seconds: -1,
                nanos: 0
            }),
            None
        );
    }
}
