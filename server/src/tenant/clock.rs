//! The clocks a tenant's owner reads (DESIGN section 4: "deadlines run on
//! the server's monotonic clock").
//!
//! - **Wall-clock time** (unix milliseconds) for what is stored or shown:
//!   when an operation started, a retry time, event and condition times. It
//!   may jump (NTP steps, an operator fixing the date).
//! - **Monotonic time** for deadlines kept in memory: operation timeouts,
//!   cancel timeouts, the next periodic resync. It never jumps, so a clock
//!   step neither times out nor extends every operation at once.
//!
//! Production uses [`SystemClock`]. Tests and the simulator use
//! [`SimulatedClock`], which derives both from tokio's clock, so that a
//! runtime with paused time (`tokio::time::pause`, `advance`) drives them.

use std::fmt::Debug;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

/// Where a tenant's owner reads the time.
pub trait Clock: Send + Sync + Debug {
    /// Wall-clock time in unix milliseconds, for timestamps that are stored
    /// or shown. May jump in either direction.
    fn now_ms(&self) -> u64;

    /// Monotonic time, for deadlines kept in memory. Never goes back.
    /// tokio's clock, so that paused-time tests control it.
    fn monotonic(&self) -> Instant {
        Instant::now()
    }
}

/// The real clocks: the system's wall clock and tokio's monotonic clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        system_now_ms()
    }
}

/// The system's wall-clock time in unix milliseconds.
pub fn system_now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| {
            u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX)
        })
}

/// A clock for tests and simulations: the wall clock is a fixed epoch plus
/// the tokio time elapsed since the clock was made, plus whatever steps
/// [`SimulatedClock::step_wall_clock`] applied; the monotonic clock is
/// tokio's. Under paused tokio time, both only move when the test says so.
#[derive(Debug)]
pub struct SimulatedClock {
    epoch_ms: u64,
    origin: Instant,
    step_ms: AtomicI64,
}

impl SimulatedClock {
    /// A clock whose wall time is `epoch_ms` now. Must be called inside a
    /// tokio runtime (it reads tokio's clock).
    pub fn new(epoch_ms: u64) -> Self {
        Self {
            epoch_ms,
            origin: Instant::now(),
            step_ms: AtomicI64::new(0),
        }
    }

    /// Steps the wall clock by `delta_ms` (negative: back in time), the
    /// way an NTP step or an operator does. Monotonic time is not affected.
    pub fn step_wall_clock(&self, delta_ms: i64) {
        self.step_ms.fetch_add(delta_ms, Ordering::SeqCst);
    }

    /// Monotonic time elapsed since the clock was made.
    pub fn elapsed(&self) -> Duration {
        Instant::now().saturating_duration_since(self.origin)
    }
}

impl Clock for SimulatedClock {
    fn now_ms(&self) -> u64 {
        let elapsed = u64::try_from(self.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.epoch_ms
            .saturating_add(elapsed)
            .saturating_add_signed(self.step_ms.load(Ordering::SeqCst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_simulated_wall_clock_follows_paused_time_and_its_steps() {
        let clock = SimulatedClock::new(1_000_000);
        let start = clock.monotonic();
        assert_eq!(clock.now_ms(), 1_000_000);
        tokio::time::advance(Duration::from_millis(250)).await;
        assert_eq!(clock.now_ms(), 1_000_250);
        clock.step_wall_clock(-100_000);
        assert_eq!(clock.now_ms(), 900_250);
        assert_eq!(clock.monotonic() - start, Duration::from_millis(250));
    }
}
