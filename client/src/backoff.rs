//! Reconnect delays: exponential with jitter, capped (agents' sessions
//! and resuming watches).

use std::time::Duration;

/// Exponential reconnect backoff: the base delay starts at `initial`,
/// doubles after every failed attempt up to `max`, and each delay is drawn
/// uniformly from the upper half of the base ("equal jitter") so that many
/// clients that lost the same server do not reconnect in lockstep.
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    initial: Duration,
    max: Duration,
    base: Duration,
}

impl Backoff {
    /// A backoff from `initial` to `max` (`max` is raised to `initial` if
    /// smaller).
    pub(crate) fn new(initial: Duration, max: Duration) -> Self {
        let initial = initial.max(Duration::from_millis(1));
        Self {
            initial,
            max: max.max(initial),
            base: initial,
        }
    }

    /// The next delay, given `random` in `[0, 1)`.
    pub(crate) fn next_with(&mut self, random: f64) -> Duration {
        let base = self.base;
        self.base = base.saturating_mul(2).min(self.max);
        base.mul_f64(0.5 + 0.5 * random.clamp(0.0, 1.0))
    }

    /// The next delay with a random jitter.
    pub(crate) fn next_delay(&mut self) -> Duration {
        self.next_with(rand::random::<f64>())
    }

    /// Back to `initial` (after a registration, or a message, came through).
    pub(crate) fn reset(&mut self) {
        self.base = self.initial;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_up_to_the_cap_and_reset() {
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
        let upper: Vec<Duration> = (0..9).map(|_| backoff.next_with(1.0)).collect();
        assert_eq!(upper[0], Duration::from_millis(100));
        assert_eq!(upper[1], Duration::from_millis(200));
        assert_eq!(upper[5], Duration::from_millis(3200));
        assert_eq!(upper[6], Duration::from_secs(5));
        assert_eq!(upper[8], Duration::from_secs(5));
        backoff.reset();
        assert_eq!(backoff.next_with(0.0), Duration::from_millis(50));
    }

    #[test]
    fn jittered_delays_stay_within_half_and_all_of_the_base() {
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
        for _ in 0..100 {
            let delay = backoff.next_delay();
            assert!(delay >= Duration::from_millis(50) && delay <= Duration::from_secs(5));
        }
    }
}
