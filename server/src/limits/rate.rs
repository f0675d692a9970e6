//! The global request rate: a token bucket.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::lock;

/// A token bucket: `rate` calls per second, bursts of up to `rate`.
#[derive(Debug)]
pub(super) struct RateLimiter {
    rate: f64,
    bucket: Mutex<(f64, Instant)>,
}

impl RateLimiter {
    pub(super) fn new(rate: u64) -> Self {
        let rate = rate.max(1) as f64;
        Self {
            rate,
            bucket: Mutex::new((rate, Instant::now())),
        }
    }

    /// Takes a token, or says how long until one is available.
    pub(super) fn try_acquire(&self) -> Result<(), Duration> {
        let mut bucket = lock(&self.bucket);
        let now = Instant::now();
        let refilled = bucket.0 + now.duration_since(bucket.1).as_secs_f64() * self.rate;
        *bucket = (refilled.min(self.rate), now);
        if bucket.0 >= 1.0 {
            bucket.0 -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - bucket.0) / self.rate))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rate_limiter_allows_a_burst_then_names_the_wait() {
        let limiter = RateLimiter::new(2);
        assert!(limiter.try_acquire().is_ok());
        assert!(limiter.try_acquire().is_ok());
        let wait = limiter.try_acquire().expect_err("bucket empty");
        assert!(wait > Duration::ZERO && wait <= Duration::from_millis(500));
    }
}
