//! Who should serve each tenant: rendezvous (highest random weight)
//! hashing of the tenant's internal id over the ids of the live replicas.
//!
//! A pure function of its inputs: every replica that sees the same member
//! set computes the same owner for every tenant, without talking to the
//! others. Each (replica, tenant) pair gets a pseudo-random weight; the
//! replica with the highest weight wins. So tenants spread evenly, and when
//! a replica joins only the tenants it now wins move (to it), and when one
//! leaves only its own tenants move (spread over the others): about 1/N of
//! the fleet either way, the least any placement can move.

use sha2::{Digest as _, Sha256};

/// The weight of replica `replica` for tenant `tenant_id`: the first 8
/// bytes of SHA-256 over the replica id, a separator and the tenant id.
/// Stable across processes, versions and platforms (it decides where
/// tenants live while replicas of different builds run side by side).
pub fn weight(replica: &str, tenant_id: u64) -> u64 {
    let mut hasher = Sha256::new();
    hasher.update(replica.as_bytes());
    hasher.update([0u8]);
    hasher.update(tenant_id.to_be_bytes());
    let digest = hasher.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(first)
}

/// The replica among `replicas` that should serve tenant `tenant_id`, or
/// `None` if there is no replica. Ties (of 64-bit weights) go to the
/// smaller replica id, so the answer never depends on the order given.
pub fn owner_of<'a>(
    tenant_id: u64,
    replicas: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    replicas
        .into_iter()
        .map(|replica| (weight(replica, tenant_id), replica))
        .max_by(|(a, ra), (b, rb)| a.cmp(b).then_with(|| rb.cmp(ra)))
        .map(|(_, replica)| replica)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    const TENANTS: u64 = 6_000;

    fn placement(replicas: &[&'static str]) -> HashMap<u64, &'static str> {
        (1..=TENANTS)
            .map(|id| {
                (
                    id,
                    owner_of(id, replicas.iter().copied()).expect("a replica"),
                )
            })
            .collect()
    }

    #[test]
    fn tenants_spread_evenly_over_the_replicas() {
        for replicas in [
            &["a", "b"][..],
            &["r-0", "r-1", "r-2"],
            &[
                "10.0.0.1:50051",
                "10.0.0.2:50051",
                "10.0.0.3:50051",
                "10.0.0.4:50051",
            ],
        ] {
            let placed = placement(replicas);
            let fair = TENANTS as f64 / replicas.len() as f64;
            for replica in replicas {
                let count = placed.values().filter(|owner| *owner == replica).count() as f64;
                assert!(
                    (count - fair).abs() < fair * 0.1,
                    "{replica} serves {count} of {TENANTS} tenants; a fair share is {fair}"
                );
            }
        }
    }

    #[test]
    fn a_joining_replica_takes_only_the_tenants_it_wins() {
        let before = placement(&["r-0", "r-1", "r-2"]);
        let after = placement(&["r-0", "r-1", "r-2", "r-3"]);
        let moved: Vec<u64> = (1..=TENANTS).filter(|id| before[id] != after[id]).collect();
        assert!(
            moved.iter().all(|id| after[id] == "r-3"),
            "every moved tenant moves to the new replica"
        );
        let share = moved.len() as f64 / TENANTS as f64;
        assert!((share - 0.25).abs() < 0.03, "{share} of the tenants moved");
    }

    #[test]
    fn a_leaving_replica_hands_on_only_its_own_tenants() {
        let before = placement(&["r-0", "r-1", "r-2"]);
        let after = placement(&["r-0", "r-2"]);
        for id in 1..=TENANTS {
            if before[&id] != "r-1" {
                assert_eq!(before[&id], after[&id], "tenant {id} stays where it was");
            }
        }
    }

    #[test]
    fn the_answer_does_not_depend_on_the_order_of_the_replicas() {
        for id in 1..200 {
            assert_eq!(owner_of(id, ["a", "b", "c"]), owner_of(id, ["c", "a", "b"]),);
        }
        assert_eq!(owner_of(1, std::iter::empty()), None);
    }

    #[test]
    fn weights_are_stable_across_builds() {
        // Replicas of different builds must agree on where tenants live.
        assert_eq!(weight("r-0", 1), 0x13ae_b3a1_3add_265f);
    }
}
