//! Drift: items changed behind the server's back (DESIGN 4), and what the
//! server has not seen of it yet.
//!
//! A drift changes one property an applied item sets to another value, or
//! makes the item go, on an item of a type that supports `READ` (the only
//! way the server can see it). Until the server has learned of it (its
//! applied value took the drift, or the item left its current state) or an
//! operation has overwritten it, the server cannot know: the checks that
//! compare operations with the world then look at the world as the server
//! believes it ([`Drifts::believed`]). A READ shows every property the
//! world holds, so nothing is hidden from the checks once a READ has
//! told it. Once it has learned,
//! the plain world is what the server must act on: a dependent's Create
//! waits for the Modify that corrects its dependency, or for the Create of
//! a dependency that went.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use reconciled::graph::{Item, ItemRef, ItemState, Properties};

use reconciled::tenant::TenantSnapshot;

use super::intents::{Scenario, random_properties};
use super::world::{World, WorldItem};

/// What drifted.
#[derive(Clone, Debug)]
enum Change {
    /// These properties took other values.
    Properties(BTreeSet<String>),
    /// The item is gone (a device reset, a resource deleted by hand).
    Vanished,
}

/// A drift the server has not seen.
#[derive(Clone, Debug)]
struct Unseen {
    /// The item as it was before it drifted: what the server believes.
    before: WorldItem,
    /// The world's value since (`None`: gone), until an operation
    /// replaces it.
    now: Option<Arc<Item>>,
    /// What drifted.
    change: Change,
    /// The properties of the server's applied value when it drifted, or
    /// last seen since (for an item gone: or when it first held one
    /// since).
    applied_then: Option<Properties>,
    /// For drifted properties: the server's applied value changed since
    /// the drift, at some step the checks looked (seed 49262: it took a
    /// lost Modify's value, then a READ's, the one it held when the item
    /// drifted). A value taken and left again between two looks goes
    /// unseen: the checks then keep the value from before the drift.
    applied_changed: bool,
    /// For an item gone: the operations the server had running on it when
    /// it went (the one in flight, and the lost one a READ resolves).
    ops_then: BTreeSet<String>,
}

/// The drifts of a run the server has not seen yet.
#[derive(Clone, Debug, Default)]
pub struct Drifts {
    unseen: BTreeMap<ItemRef, Unseen>,
}

impl Drifts {
    /// Makes the `pick`th item that can drift (applied, not external, of
    /// a type that supports `READ`) drift as `luck` draws: one property
    /// takes another value, or (one time in four) the item is gone.
    /// Returns the item and what changed, or `None` when no item can drift
    /// or the draw found no other value.
    pub fn inject(
        &mut self,
        world: &mut World,
        snapshot: &TenantSnapshot,
        scenario: &Scenario,
        pick: u64,
        luck: u64,
    ) -> Option<(ItemRef, String)> {
        let mut rng = StdRng::seed_from_u64(luck);
        let readable: Vec<&ItemRef> = world
            .items
            .iter()
            .filter(|(key, existing)| {
                !existing.value.external
                    && scenario
                        .spec(key.item_type())
                        .is_some_and(|spec| spec.supports_read)
            })
            .map(|(key, _)| key)
            .collect();
        // Mostly an item the server holds settled (CREATED, idle, with
        // nothing planned), which the next resync reads; drift on an item
        // an operation is about to overwrite tests less.
        let settled: Vec<&ItemRef> = readable
            .iter()
            .copied()
            .filter(|key| {
                !snapshot.waiting.contains_key(*key)
                    && snapshot.current.get(*key).is_some_and(|current| {
                        current.state == ItemState::Created && current.in_flight.is_none()
                    })
            })
            .collect();
        let candidates = if !settled.is_empty() && rng.random_bool(0.75) {
            settled
        } else {
            readable
        };
        let index = usize::try_from(pick % u64::try_from(candidates.len()).ok()?.max(1)).ok()?;
        let key = (*candidates.get(index)?).clone();
        let before = world.items[&key].clone();
        let applied_then = snapshot
            .current
            .get(&key)
            .and_then(|current| current.applied.as_ref())
            .map(|applied| applied.properties.clone());
        if rng.random_bool(0.25) {
            world.delete(&key);
            let ops_then: BTreeSet<String> = snapshot
                .current
                .get(&key)
                .and_then(|current| current.in_flight.as_deref())
                .into_iter()
                .flat_map(|running| std::iter::once(running).chain(running.resolves.as_deref()))
                .map(|operation| operation.op_id.clone())
                .collect();
            let entry = self.unseen.entry(key.clone()).or_insert(Unseen {
                before,
                now: None,
                change: Change::Vanished,
                applied_then,
                applied_changed: false,
                ops_then: BTreeSet::new(),
            });
            entry.now = None;
            entry.change = Change::Vanished;
            entry.ops_then = ops_then;
            return Some((key, "gone".into()));
        }
        let keys: Vec<&str> = before
            .value
            .properties
            .iter()
            .map(|(name, _)| name)
            .collect();
        let property = (*keys.get(rng.random_range(0..keys.len().max(1)))?).to_owned();
        let old = before.value.properties.get(&property)?.clone();
        let new = (0..16)
            .filter_map(|_| random_properties(&mut rng).get(&property).cloned())
            .find(|candidate| *candidate != old)?;
        let mut properties: Properties = before.value.properties.clone();
        properties.insert(property.clone(), new.clone());
        let now = world.drift(&key, properties)?;
        let entry = self.unseen.entry(key.clone()).or_insert(Unseen {
            before,
            now: None,
            change: Change::Properties(BTreeSet::new()),
            applied_then,
            applied_changed: false,
            ops_then: BTreeSet::new(),
        });
        entry.now = Some(now.clone());
        if let Change::Properties(drifted) = &mut entry.change {
            drifted.insert(property.clone());
        }
        if now.properties == entry.before.value.properties {
            // Drifted back to what the server believes: nothing to see.
            self.unseen.remove(&key);
        }
        Some((key, format!("/{property} {old} -> {new}")))
    }

    /// Forgets the drifts an operation overwrote (the item's world value
    /// is another one now), and those the server learned: its applied
    /// value changed since the drift (seen at this look or an earlier one:
    /// a drift READ, or a READ settling a lost operation, which takes what
    /// it observes), and now has every drifted property as the world has
    /// it; or, for an item gone, it no longer holds the value it held (a
    /// READ or a Modify answered `NOT_FOUND`), or held none and expects no
    /// result that could bring one. Returns how many the server learned.
    /// (A READ shows the server every property the world holds: one that
    /// its applied value does not set stays visible to the checks, since
    /// the server does not take a lost Modify as applied while the READ
    /// shows a property the Modify removes.)
    pub fn forget_overwritten_or_learned(
        &mut self,
        world: &World,
        snapshot: &TenantSnapshot,
    ) -> usize {
        let mut learned_count = 0;
        self.unseen.retain(|key, unseen| {
            let overwritten = match (&unseen.now, world.items.get(key)) {
                (Some(now), Some(existing)) => !Arc::ptr_eq(&existing.value, now),
                (None, None) => false,
                _ => true,
            };
            if overwritten {
                return false;
            }
            let current = snapshot.current.get(key);
            let applied = current.and_then(|current| current.applied.as_ref());
            let learned = match (&unseen.change, applied, &unseen.now) {
                (Change::Vanished, Some(applied), _) => {
                    // (Held no value when the item went, and holds one now:
                    // a result the item's agent sent before it went.)
                    unseen
                        .applied_then
                        .get_or_insert_with(|| applied.properties.clone());
                    false
                }
                // Gone for the server too: it held a value and holds none
                // now (it may be creating it again), or it held none and
                // expects no result that could bring one, but at most that
                // of an operation it started since the item went, on an
                // item it takes for gone (seed 58966: a READ resolving a
                // lost Create found nothing, and the server created the
                // item afresh for an intent that no longer relied on what
                // the old value relied on).
                (Change::Vanished, None, _) => {
                    unseen.applied_then.is_some()
                        || current.is_none_or(|current| match current.in_flight.as_deref() {
                            None => true,
                            Some(running) => {
                                !unseen.ops_then.contains(&running.op_id)
                                    && running.resolves.is_none()
                                    && !current.existence_uncertain
                                    && current.rare.maybe_applied.is_empty()
                            }
                        })
                }
                (Change::Properties(drifted), Some(applied), Some(now)) => {
                    if unseen.applied_then.as_ref() != Some(&applied.properties) {
                        unseen.applied_changed = true;
                        unseen.applied_then = Some(applied.properties.clone());
                    }
                    unseen.applied_changed
                        && drifted.iter().all(|property| {
                            applied
                                .properties
                                .get(property)
                                .is_some_and(|value| now.properties.get(property) == Some(value))
                        })
                }
                _ => false,
            };
            learned_count += usize::from(learned);
            !learned
        });
        learned_count
    }

    /// The world as the server believes it: drifted items it has not seen
    /// with the values they had before.
    pub fn believed<'a>(&self, world: &'a World) -> Cow<'a, World> {
        if self.unseen.is_empty() {
            return Cow::Borrowed(world);
        }
        let mut believed = world.clone();
        for (key, unseen) in &self.unseen {
            // (An operation that overwrote the drift since is the world's
            // value, and the server's.)
            match (&unseen.now, believed.items.get_mut(key)) {
                (Some(now), Some(existing)) if Arc::ptr_eq(&existing.value, now) => {
                    existing.value = unseen.before.value.clone();
                }
                (None, None) => {
                    believed.items.insert(key.clone(), unseen.before.clone());
                }
                _ => {}
            }
        }
        Cow::Owned(believed)
    }

    /// Items gone from `world` by a drift the server has not seen whose
    /// value, as the server holds it, is auto-deleted by `external`: for
    /// the server they go with it.
    pub fn gone_unseen_relying_on(&self, external: &ItemRef, world: &World) -> Vec<ItemRef> {
        self.unseen
            .iter()
            .filter(|(key, unseen)| unseen.now.is_none() && !world.items.contains_key(*key))
            .filter(|(_, unseen)| {
                unseen
                    .before
                    .value
                    .dependency_on(external)
                    .is_some_and(|d| d.auto_deleted_by_external())
            })
            .map(|(key, _)| key.clone())
            .collect()
    }

    /// Items with a drift the server has not seen.
    pub fn unseen(&self) -> impl Iterator<Item = &ItemRef> {
        self.unseen.keys()
    }
}
