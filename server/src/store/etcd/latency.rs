//! How long etcd takes to answer the store: one histogram for commit
//! transactions and one for reads, kept in atomics and read by the
//! metrics endpoint (`cluster/metrics.rs`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds (seconds) of the latency buckets: from a loopback etcd to
/// a leader election.
pub const LATENCY_BUCKETS: [f64; 12] = [
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0,
];

/// One latency histogram over [`LATENCY_BUCKETS`].
#[derive(Debug, Default)]
pub struct LatencyHistogram {
    buckets: [AtomicU64; LATENCY_BUCKETS.len()],
    count: AtomicU64,
    sum_micros: AtomicU64,
}

/// A histogram's counts as read at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LatencyCounts {
    /// Cumulative counts per bucket of [`LATENCY_BUCKETS`].
    pub buckets: Vec<u64>,
    /// Observations.
    pub count: u64,
    /// Their sum, in microseconds.
    pub sum_micros: u64,
}

impl LatencyHistogram {
    /// Records one request that took `elapsed`.
    pub fn observe(&self, elapsed: Duration) {
        let seconds = elapsed.as_secs_f64();
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_micros.fetch_add(
            u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        for (bound, bucket) in LATENCY_BUCKETS.iter().zip(&self.buckets) {
            if seconds <= *bound {
                bucket.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// The counts now.
    pub fn counts(&self) -> LatencyCounts {
        LatencyCounts {
            buckets: self
                .buckets
                .iter()
                .map(|bucket| bucket.load(Ordering::Relaxed))
                .collect(),
            count: self.count.load(Ordering::Relaxed),
            sum_micros: self.sum_micros.load(Ordering::Relaxed),
        }
    }
}

/// The latencies of one etcd store.
#[derive(Debug, Default)]
pub struct EtcdLatency {
    /// Commit transactions (one per group of merged commits, and each
    /// step of a staged commit's marker).
    pub commits: LatencyHistogram,
    /// Reads (gets and scan pages).
    pub reads: LatencyHistogram,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_fall_into_every_bucket_at_or_above_them() {
        let histogram = LatencyHistogram::default();
        histogram.observe(Duration::from_millis(3));
        histogram.observe(Duration::from_secs(10));
        let counts = histogram.counts();
        assert_eq!(counts.count, 2);
        assert_eq!(counts.buckets[2], 0, "2 ms");
        assert_eq!(counts.buckets[3], 1, "5 ms");
        assert_eq!(counts.buckets[LATENCY_BUCKETS.len() - 1], 1, "5 s");
        assert_eq!(counts.sum_micros, 10_003_000);
    }
}
