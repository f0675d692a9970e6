//! The CPU time a thread has used (`CLOCK_THREAD_CPUTIME_ID`): how long a
//! piece of work ran, without the time the operating system gave its core
//! to others. Tenants' small work is charged by it, and the benchmarks
//! time their runs with it.

use std::time::{Duration, Instant};

/// The CPU time the calling thread has used: what a piece of work took,
/// without the time the operating system gave its core to others (on a
/// busy machine the wall time of a 30 µs call can be milliseconds). Wall
/// time where the platform has no such clock.
#[derive(Clone, Copy, Debug)]
pub enum ThreadCpuTime {
    /// The thread's CPU clock read then.
    Cpu(Duration),
    /// The wall clock read then (no CPU clock on this platform).
    Wall(Instant),
}

impl ThreadCpuTime {
    /// Reads the calling thread's CPU clock (the wall clock without one).
    pub fn now() -> Self {
        match thread_cpu_time() {
            Some(used) => Self::Cpu(used),
            None => Self::Wall(Instant::now()),
        }
    }

    /// The CPU time used since `self` (for work that stays on one thread).
    pub fn elapsed(self) -> Duration {
        match self {
            Self::Cpu(before) => {
                thread_cpu_time().map_or(Duration::ZERO, |now| now.saturating_sub(before))
            }
            Self::Wall(before) => before.elapsed(),
        }
    }

    /// Whether this reads the thread's CPU clock, not the wall clock.
    pub fn is_cpu_time(self) -> bool {
        matches!(self, Self::Cpu(_))
    }
}

#[cfg(any(target_os = "linux", target_os = "android", target_os = "macos"))]
fn thread_cpu_time() -> Option<Duration> {
    use nix::time::{ClockId, clock_gettime};
    clock_gettime(ClockId::CLOCK_THREAD_CPUTIME_ID)
        .ok()
        .map(Duration::from)
}

#[cfg(not(any(target_os = "linux", target_os = "android", target_os = "macos")))]
fn thread_cpu_time() -> Option<Duration> {
    None
}
