//! Timestamps and durations: unix milliseconds <-> `google.protobuf`
//! `Timestamp` / `Duration`.

use crate::graph::validate::FieldViolation;

const MILLIS_PER_SECOND: u64 = 1000;
const NANOS_PER_MILLI: u64 = 1_000_000;
const NANOS_PER_SECOND: i32 = 1_000_000_000;

/// Converts unix milliseconds to a `Timestamp`.
pub fn timestamp_from_ms(unix_ms: u64) -> prost_types::Timestamp {
    let (seconds, nanos) = split_millis(unix_ms);
    prost_types::Timestamp { seconds, nanos }
}

/// Converts milliseconds to a `Duration`.
pub fn duration_from_ms(ms: u64) -> prost_types::Duration {
    let (seconds, nanos) = split_millis(ms);
    prost_types::Duration { seconds, nanos }
}

/// Whole seconds and the remaining nanoseconds of `ms`. Both always fit:
/// u64::MAX / 1000 < i64::MAX, and the remainder is below 10^9.
fn split_millis(ms: u64) -> (i64, i32) {
    let seconds = i64::try_from(ms / MILLIS_PER_SECOND).unwrap_or(i64::MAX);
    let nanos = i32::try_from((ms % MILLIS_PER_SECOND) * NANOS_PER_MILLI).unwrap_or(0);
    (seconds, nanos)
}

/// Converts a `Duration` received at field `field` to milliseconds, rounding
/// a partial millisecond up (so a non-zero duration never becomes zero).
/// Negative durations, `nanos` outside `0..1e9` and durations that overflow
/// u64 milliseconds are rejected.
pub fn duration_to_ms(
    duration: &prost_types::Duration,
    field: &str,
) -> Result<u64, FieldViolation> {
    let invalid = |problem: String| FieldViolation::new(field, problem);
    if duration.seconds < 0 || duration.nanos < 0 {
        return Err(invalid(format!(
            "is negative ({}s {}ns); give a duration of zero or more",
            duration.seconds, duration.nanos
        )));
    }
    if duration.nanos >= NANOS_PER_SECOND {
        return Err(invalid(format!(
            "has nanos {} outside 0 to 999,999,999; carry whole seconds into `seconds`",
            duration.nanos
        )));
    }
    let seconds = u64::try_from(duration.seconds).unwrap_or(u64::MAX);
    let nanos = u64::try_from(duration.nanos).unwrap_or(0);
    seconds
        .checked_mul(MILLIS_PER_SECOND)
        .and_then(|ms| ms.checked_add(nanos.div_ceil(NANOS_PER_MILLI)))
        .ok_or_else(|| {
            invalid(format!(
                "is {} seconds, too long to represent in milliseconds; give a shorter duration",
                duration.seconds
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn milliseconds_become_timestamps_and_durations() {
        let stamp = timestamp_from_ms(1_700_000_000_123);
        assert_eq!((stamp.seconds, stamp.nanos), (1_700_000_000, 123_000_000));
        let duration = duration_from_ms(u64::MAX);
        assert_eq!(duration_to_ms(&duration, "timeout"), Ok(u64::MAX));
        assert_eq!(duration_to_ms(&duration_from_ms(1500), "timeout"), Ok(1500));
    }

    #[test]
    fn partial_milliseconds_round_up() {
        let duration = prost_types::Duration {
            seconds: 0,
            nanos: 1,
        };
        assert_eq!(duration_to_ms(&duration, "timeout"), Ok(1));
    }

    #[test]
    fn negative_malformed_and_overflowing_durations_are_rejected() {
        let cases = [
            (-1, 0, "negative"),
            (0, -5, "negative"),
            (1, 1_000_000_000, "nanos"),
            (i64::MAX, 0, "too long"),
        ];
        for (seconds, nanos, words) in cases {
            let duration = prost_types::Duration { seconds, nanos };
            let violation = duration_to_ms(&duration, "timeout").err();
            assert_eq!(
                violation.as_ref().map(|v| v.field.as_str()),
                Some("timeout")
            );
            assert!(
                violation.is_some_and(|v| v.description.contains(words)),
                "{seconds}s {nanos}ns should be rejected as {words}"
            );
        }
    }
}
