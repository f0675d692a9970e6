//! The revision floor a deleted tenant leaves for its name.
//!
//! A tenant's revisions start past a floor from the wall clock
//! ([`first_revision`]), so that a watcher holding a revision of an earlier
//! tenant of the same name is refused as compacted instead of resuming
//! into different changes that carry the same numbers (docs/watch.md). A
//! clock set back between the deletion and the new creation would weaken
//! that floor by as much. So deleting a tenant also stores, under its
//! name, a floor past every revision the tenant gave out (and past the
//! clock's floor at the deletion); a tenant created again under the name
//! starts past it, whatever the clock says then, and clears it in its
//! creation commit (its own record carries the floor on).
//!
//! A name that is never used again keeps its floor until the clock has
//! passed it by [`KEPT_PAST_CLOCK_MS`]; after that the clock's own floor
//! is past it again, and only a clock set back by more than that could
//! weaken a creation. Each deletion's purge sweeps a page of floors for
//! such expired ones ([`sweep`]), going round the names from where the
//! last sweep stopped, so the floors kept stay about one day of deletions.

use tracing::{info, warn};

use crate::store::{Store, WriteBatch, keys};

use super::error::TenantError;
use super::record::first_revision;

/// How long a floor is kept after the clock's own floor has passed it.
pub const KEPT_PAST_CLOCK_MS: u64 = 24 * 60 * 60 * 1000;

/// Floors examined by one [`sweep`].
const SWEEP_PAGE: usize = 64;

/// The floor tenant `name`'s deletion leaves: past its last revision
/// (`None` when its record could not be read) and past the clock's floor
/// at `now_ms`.
fn left_at_deletion(last_revision: Option<u64>, now_ms: u64) -> u64 {
    let past_last = last_revision.map_or(0, |revision| revision.saturating_add(1));
    past_last.max(first_revision(now_ms))
}

/// Adds to `batch`, a deletion of tenant `name`, the floor it leaves the
/// name ([`left_at_deletion`]).
pub fn leave(batch: &mut WriteBatch, name: &str, last_revision: Option<u64>, now_ms: u64) {
    put(batch, name, left_at_deletion(last_revision, now_ms));
}

/// Adds to `batch`, a creation of tenant `name` that read `floor`
/// ([`read`]), the removal of that floor: the new record carries it on.
pub fn clear(batch: &mut WriteBatch, name: &str, floor: Option<u64>) {
    if floor.is_some() {
        batch.delete(keys::revision_floor_key(name));
    }
}

fn put(batch: &mut WriteBatch, name: &str, floor: u64) {
    batch.put(keys::revision_floor_key(name), floor.to_be_bytes().to_vec());
}

/// The floor a deleted tenant left for `name`, if any. An unreadable one
/// is reported and reads as 0 (the clock's floor alone then applies):
/// refusing the creation would keep the name from ever being used again.
pub fn read(store: &dyn Store, name: &str) -> Result<Option<u64>, TenantError> {
    let Some(value) = store.get(&keys::revision_floor_key(name))? else {
        return Ok(None);
    };
    Ok(Some(decode(&value).unwrap_or_else(|| {
        warn!(
            tenant = name,
            "The revision floor a deleted tenant left for this name is unreadable; the new tenant's revisions start from the clock's floor alone."
        );
        0
    })))
}

/// Where a tenant created under a name at `now_ms` starts counting: past
/// the clock's floor and past `floor`, what a deleted tenant of the name
/// left ([`read`]).
pub fn first_revision_past(now_ms: u64, floor: Option<u64>) -> u64 {
    first_revision(now_ms).max(floor.unwrap_or(0))
}

/// Sweeps expired floors a page at a time, going round the names from
/// where its last sweep stopped (one per purged tenant, see the module
/// docs).
#[derive(Debug, Default)]
pub struct Sweeper {
    resume_after: std::sync::Mutex<Vec<u8>>,
}

impl Sweeper {
    /// Sweeps the next page ([`sweep`]). A failure is only reported: the
    /// next sweep tries again.
    pub async fn sweep_next(&self, store: &dyn Store, now_ms: u64) {
        let after = self.cursor().clone();
        match sweep(store, &after, now_ms).await {
            Ok(swept) => {
                if swept.removed > 0 {
                    info!(
                        removed = swept.removed,
                        "Expired revision floors of deleted tenants removed."
                    );
                }
                *self.cursor() = swept.resume_after;
            }
            Err(error) => {
                warn!(%error, "Sweeping expired revision floors failed; the next purge tries again.")
            }
        }
    }

    fn cursor(&self) -> std::sync::MutexGuard<'_, Vec<u8>> {
        self.resume_after
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// What one [`sweep`] did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Swept {
    /// Expired floors deleted.
    pub removed: usize,
    /// Where the next sweep starts: the last key examined, or empty to
    /// start again from the first name.
    pub resume_after: Vec<u8>,
}

/// Deletes the expired floors among the [`SWEEP_PAGE`] that follow key
/// `after` (empty: from the first): those the clock's floor at `now_ms`
/// has passed by [`KEPT_PAST_CLOCK_MS`].
pub async fn sweep(store: &dyn Store, after: &[u8], now_ms: u64) -> Result<Swept, TenantError> {
    let start = (!after.is_empty()).then_some(after);
    let page = store.scan(keys::revision_floors_prefix(), start, SWEEP_PAGE)?;
    let expired_below = first_revision(now_ms.saturating_sub(KEPT_PAST_CLOCK_MS));
    let mut batch = WriteBatch::new();
    for (key, value) in &page {
        // An unreadable floor protects nothing (creation reads it as 0).
        if decode(value).is_none_or(|floor| floor <= expired_below) {
            batch.delete(key.clone());
        }
    }
    let removed = batch.len();
    if removed > 0 {
        store.commit(batch).await?;
    }
    let resume_after = match page.last() {
        Some((key, _)) if page.len() == SWEEP_PAGE => key.clone(),
        _ => Vec::new(),
    };
    Ok(Swept {
        removed,
        resume_after,
    })
}

fn decode(value: &[u8]) -> Option<u64> {
    let bytes: [u8; 8] = value.try_into().ok()?;
    Some(u64::from_be_bytes(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::InMemoryStore;

    const NOW_MS: u64 = 1_800_000_000_000;

    #[test]
    fn a_name_created_again_starts_past_its_deleted_tenant_even_with_the_clock_set_back() {
        let store = InMemoryStore::new();
        // The first tenant counted far past its creation's floor.
        let last_revision = first_revision(NOW_MS) + 5_000;
        let mut batch = WriteBatch::new();
        put(
            &mut batch,
            "acme",
            left_at_deletion(Some(last_revision), NOW_MS),
        );
        store.commit_blocking(batch).expect("stored");

        let clock_set_back_ms = NOW_MS - 60 * 60 * 1000;
        let floor = read(&store, "acme").expect("read");
        assert!(first_revision_past(clock_set_back_ms, floor) > last_revision);
        assert_eq!(read(&store, "other").expect("read"), None);
        assert_eq!(
            first_revision_past(clock_set_back_ms, None),
            first_revision(clock_set_back_ms),
            "a name no deleted tenant left a floor for starts from the clock"
        );
    }

    #[test]
    fn a_deletion_leaves_a_floor_past_the_clock_even_for_an_unreadable_record() {
        assert_eq!(left_at_deletion(None, NOW_MS), first_revision(NOW_MS));
        assert_eq!(
            left_at_deletion(Some(first_revision(NOW_MS) + 7), NOW_MS),
            first_revision(NOW_MS) + 8
        );
    }

    #[test]
    fn an_unreadable_floor_reads_as_none_of_its_own() {
        let store = InMemoryStore::new();
        let mut batch = WriteBatch::new();
        batch.put(keys::revision_floor_key("acme"), b"torn".to_vec());
        store.commit_blocking(batch).expect("stored");
        assert_eq!(read(&store, "acme").expect("read"), Some(0));
        assert_eq!(first_revision_past(NOW_MS, Some(0)), first_revision(NOW_MS));
    }

    #[tokio::test]
    async fn sweeps_go_round_the_names_and_drop_only_floors_the_clock_passed_long_ago() {
        let store = InMemoryStore::new();
        let day_ago = NOW_MS - KEPT_PAST_CLOCK_MS - 1;
        let mut batch = WriteBatch::new();
        let names: Vec<String> = (0..150).map(|index| format!("t{index:03}")).collect();
        for (index, name) in names.iter().enumerate() {
            // Every third floor is recent; the others expired a day ago.
            let deleted_at = if index % 3 == 0 { NOW_MS } else { day_ago };
            put(&mut batch, name, left_at_deletion(None, deleted_at));
        }
        batch.put(keys::revision_floor_key("u-torn"), b"x".to_vec());
        store.commit_blocking(batch).expect("stored");

        let mut after = Vec::new();
        let mut removed = 0;
        let mut sweeps = 0;
        loop {
            let swept = sweep(&store, &after, NOW_MS).await.expect("swept");
            removed += swept.removed;
            sweeps += 1;
            after = swept.resume_after;
            if after.is_empty() {
                break;
            }
        }
        assert_eq!(sweeps, 3, "151 floors, 64 per sweep, then round again");
        assert_eq!(removed, 101, "100 expired floors and the unreadable one");
        for (index, name) in names.iter().enumerate() {
            assert_eq!(
                read(&store, name).expect("read").is_some(),
                index % 3 == 0,
                "{name}"
            );
        }
        let again = sweep(&store, &[], NOW_MS).await.expect("swept");
        assert_eq!(again, Swept::default(), "the 50 recent floors stay");
    }
}
