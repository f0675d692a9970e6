//! The cluster's metrics, appended to `/metrics`: tenants owned here,
//! hand-offs, adoptions, fenced commits, forwarded calls, lease renewals,
//! and how long etcd takes to answer the store. No per-tenant labels.

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::store::EtcdStore;
use crate::store::etcd::latency::{LATENCY_BUCKETS, LatencyCounts};

/// Counters of the cluster room.
#[derive(Debug, Default)]
pub struct ClusterMetrics {
    owned: AtomicU64,
    adopted: AtomicU64,
    handed_off: AtomicU64,
    dropped: AtomicU64,
    lease_renewals: AtomicU64,
    lease_renewal_failures: AtomicU64,
    leases_lost: AtomicU64,
    forwarded: AtomicU64,
}

impl ClusterMetrics {
    /// Sets how many tenants this replica serves.
    pub fn set_owned(&self, owned: usize) {
        self.owned.store(owned as u64, Ordering::Relaxed);
    }

    /// A tenant was claimed and loaded here.
    pub fn adopted(&self) {
        self.adopted.fetch_add(1, Ordering::Relaxed);
    }

    /// A tenant was handed off to the replica that should serve it.
    pub fn handed_off(&self) {
        self.handed_off.fetch_add(1, Ordering::Relaxed);
    }

    /// A tenant was dropped without a hand-off (its commit was fenced out,
    /// or the lease was lost).
    pub fn dropped(&self, tenants: usize) {
        self.dropped.fetch_add(tenants as u64, Ordering::Relaxed);
    }

    /// The lease was renewed.
    pub fn lease_renewed(&self) {
        self.lease_renewals.fetch_add(1, Ordering::Relaxed);
    }

    /// A renewal of the lease failed (it may still succeed in time).
    pub fn lease_renewal_failed(&self) {
        self.lease_renewal_failures.fetch_add(1, Ordering::Relaxed);
    }

    /// The lease was lost.
    pub fn lease_lost(&self) {
        self.leases_lost.fetch_add(1, Ordering::Relaxed);
    }

    /// A call was forwarded to the replica that serves its tenant.
    pub fn forwarded(&self) {
        self.forwarded.fetch_add(1, Ordering::Relaxed);
    }

    /// The exposition text of these counters and of `store`'s latencies.
    pub fn render(&self, out: &mut String, store: &EtcdStore) {
        let get = |value: &AtomicU64| value.load(Ordering::Relaxed);
        let counters = [
            (
                "reconciled_cluster_tenants_owned",
                "gauge",
                "Tenants this replica serves.",
                get(&self.owned),
            ),
            (
                "reconciled_cluster_adoptions_total",
                "counter",
                "Tenants claimed and loaded by this replica.",
                get(&self.adopted),
            ),
            (
                "reconciled_cluster_handoffs_total",
                "counter",
                "Tenants this replica handed off to the replica that should serve them.",
                get(&self.handed_off),
            ),
            (
                "reconciled_cluster_dropped_tenants_total",
                "counter",
                "Tenants this replica stopped serving without a hand-off (lease lost, commit fenced out).",
                get(&self.dropped),
            ),
            (
                "reconciled_cluster_lease_renewals_total",
                "counter",
                "Renewals of this replica's etcd lease.",
                get(&self.lease_renewals),
            ),
            (
                "reconciled_cluster_lease_renewal_failures_total",
                "counter",
                "Renewals of this replica's etcd lease that failed (retried until the lease runs out).",
                get(&self.lease_renewal_failures),
            ),
            (
                "reconciled_cluster_leases_lost_total",
                "counter",
                "Times this replica lost its etcd lease and joined again.",
                get(&self.leases_lost),
            ),
            (
                "reconciled_cluster_forwarded_calls_total",
                "counter",
                "Calls forwarded to the replica that serves their tenant.",
                get(&self.forwarded),
            ),
        ];
        for (name, kind, help, value) in counters {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
            );
        }
        let name = "reconciled_etcd_request_seconds";
        let _ = writeln!(
            out,
            "# HELP {name} How long etcd takes to answer the store's requests, by kind (commit, read).\n# TYPE {name} histogram"
        );
        let latency = store.latency();
        render_latency(out, name, "commit", &latency.commits.counts());
        render_latency(out, name, "read", &latency.reads.counts());
    }
}

fn render_latency(out: &mut String, name: &str, kind: &str, counts: &LatencyCounts) {
    for (bound, count) in LATENCY_BUCKETS.iter().zip(&counts.buckets) {
        let _ = writeln!(
            out,
            "{name}_bucket{{kind=\"{kind}\",le=\"{bound}\"}} {count}"
        );
    }
    let _ = writeln!(
        out,
        "{name}_bucket{{kind=\"{kind}\",le=\"+Inf\"}} {count}\n{name}_sum{{kind=\"{kind}\"}} {sum}\n{name}_count{{kind=\"{kind}\"}} {count}",
        count = counts.count,
        sum = counts.sum_micros as f64 / 1e6,
    );
}

/// A section renderer for [`Metrics::append_section`](crate::metrics::Metrics::append_section).
pub fn section(
    metrics: Arc<ClusterMetrics>,
    store: Arc<EtcdStore>,
) -> impl Fn(&mut String) + Send + Sync + 'static {
    move |out| metrics.render(out, &store)
}
