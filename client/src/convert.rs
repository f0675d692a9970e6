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

/// Converts a proto duration; `None` when it is negative or malformed
/// (`nanos` outside 0 to 999,999,999, or of another sign than `seconds`),
/// as the server refuses such a duration in a request.
pub fn duration_from_proto(duration: prost_types::Duration) -> Option<Duration> {
    // prost's own conversion normalizes first, which would turn malformed
    // values (1 s - 0.5 s, 0 s + 1.5 s) into valid ones.
    let seconds = u64::try_from(duration.seconds).ok()?;
    let nanos = u32::try_from(duration.nanos)
        .ok()
        .filter(|nanos| *nanos < 1_000_000_000)?;
    Some(Duration::new(seconds, nanos))
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

    #[test]
    fn malformed_durations_are_rejected_as_the_server_rejects_them() {
        let malformed = [(0, 1_500_000_000), (1, -500_000_000), (-1, 500_000_000)];
        for (seconds, nanos) in malformed {
            assert_eq!(
                duration_from_proto(prost_types::Duration { seconds, nanos }),
                None,
                "{seconds}s {nanos}ns"
            );
        }
        assert_eq!(
            duration_from_proto(prost_types::Duration {
                seconds: 2,
                nanos: 999_999_999
            }),
            Some(Duration::new(2, 999_999_999))
        );
    }
}
