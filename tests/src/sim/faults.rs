//! Fault injection: a store that dies at a chosen commit (before or after
//! applying it, as a process killed around its fsync would), crashes
//! between commands, and wall-clock steps.
//!
//! A crash keeps nothing but the store's bytes: the simulator copies them
//! into a fresh [`InMemoryStore`] and loads the tenant from there, exactly
//! as a restarted server loads it from disk.

use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use rand::Rng;
use rand::rngs::StdRng;
use reconciled::store::{CommitHandle, InMemoryStore, Record, Store, StoreError, WriteBatch};

use super::steps::Step;

/// What the store does at its next commit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Health {
    /// Commits apply.
    Healthy,
    /// The next commit fails without applying; every later one too.
    DiesBeforeApplying,
    /// The next commit applies but is not acknowledged; later ones fail.
    DiesAfterApplying,
    /// Every commit fails: the process is gone.
    Dead,
}

/// An [`InMemoryStore`] that can be told to die at its next commit.
#[derive(Debug)]
pub struct FaultyStore {
    inner: InMemoryStore,
    health: Mutex<Health>,
}

impl FaultyStore {
    /// A healthy store holding `records`.
    pub fn with_records(records: impl IntoIterator<Item = Record>) -> Self {
        let inner = InMemoryStore::new();
        let mut batch = WriteBatch::new();
        for (key, value) in records {
            batch.put(key, value);
        }
        inner
            .commit_blocking(batch)
            .expect("copying a store's records into a new one cannot fail");
        Self {
            inner,
            health: Mutex::new(Health::Healthy),
        }
    }

    /// Every record, as a restarted process would find it on disk.
    pub fn bytes(&self) -> Vec<Record> {
        self.inner.snapshot().into_iter().collect()
    }

    /// Makes the next commit fatal.
    pub fn arm_death(&self, after_apply: bool) {
        *self.health() = if after_apply {
            Health::DiesAfterApplying
        } else {
            Health::DiesBeforeApplying
        };
    }

    /// Cancels an armed death that has not happened.
    pub fn disarm(&self) {
        let mut health = self.health();
        if *health != Health::Dead {
            *health = Health::Healthy;
        }
    }

    /// Whether a death is armed and has not happened yet.
    pub fn armed(&self) -> bool {
        matches!(
            *self.health(),
            Health::DiesAfterApplying | Health::DiesBeforeApplying
        )
    }

    /// Whether the store died (the process must restart).
    pub fn dead(&self) -> bool {
        *self.health() == Health::Dead
    }

    fn health(&self) -> std::sync::MutexGuard<'_, Health> {
        self.health.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn commit_now(&self, batch: WriteBatch) -> Result<(), StoreError> {
        let mut health = self.health();
        match *health {
            Health::Healthy => self.inner.commit_blocking(batch),
            Health::DiesBeforeApplying => {
                *health = Health::Dead;
                Err(StoreError::Closed)
            }
            Health::DiesAfterApplying => {
                *health = Health::Dead;
                let _ = self.inner.commit_blocking(batch);
                Err(StoreError::Closed)
            }
            Health::Dead => Err(StoreError::Closed),
        }
    }
}

impl Store for FaultyStore {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.inner.get(key)
    }

    fn scan(
        &self,
        prefix: &[u8],
        start_after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        self.inner.scan(prefix, start_after, limit)
    }

    fn commit(&self, batch: WriteBatch) -> CommitHandle {
        CommitHandle::ready(self.commit_now(batch))
    }

    fn commit_blocking(&self, batch: WriteBatch) -> Result<(), StoreError> {
        self.commit_now(batch)
    }

    fn backup_to(&self, path: &Path) -> Result<(), StoreError> {
        self.inner.backup_to(path)
    }

    fn size_on_disk(&self) -> Result<u64, StoreError> {
        self.inner.size_on_disk()
    }
}

/// A shared handle to the store the current owner writes to.
pub type SharedStore = Arc<FaultyStore>;

/// Draws a fault: a crash, a store death at the next commit, or a wall
/// clock step. `None` when the draw needs a state it does not have.
pub fn fault_step(rng: &mut StdRng, store_death_armed: bool) -> Option<Step> {
    match rng.random_range(0..10) {
        0..=3 => Some(Step::Crash {
            owner_seed: rng.random(),
            luck: rng.random(),
        }),
        4..=6 if !store_death_armed => Some(Step::ArmStoreDeath {
            after_apply: rng.random_bool(0.5),
            owner_seed: rng.random(),
            luck: rng.random(),
        }),
        4..=6 => None,
        // NTP steps: small ones both ways, rarely a large jump forward.
        // (Retry times are wall-clock times, so a large step back would
        // only delay retries; see docs/testing.md.)
        _ => Some(Step::ClockStep {
            ms: if rng.random_bool(0.2) {
                rng.random_range(3_600_000..=7_200_000)
            } else {
                rng.random_range(-60_000..=60_000)
            },
        }),
    }
}
