//! A bounded log of a tenant's operations, for `Reconcile` answers: what
//! ran, when, and how it ended.

use std::collections::VecDeque;
use std::sync::Mutex;

use crate::graph::{ItemRef, OperationError, OperationKind};

/// Entries kept per tenant.
const KEPT_ENTRIES: usize = 10_000;

/// One operation in the log.
#[derive(Clone, Debug, PartialEq)]
pub struct LogEntry {
    /// Position in the log (grows by one per entry, never reused).
    pub sequence: u64,
    /// The item.
    pub item: ItemRef,
    /// The operation.
    pub kind: OperationKind,
    /// The operation id.
    pub op_id: String,
    /// The attempt.
    pub attempt: u32,
    /// When it was dispatched (unix ms).
    pub started_ms: u64,
    /// When it ended (unix ms), if it did.
    pub ended_ms: Option<u64>,
    /// Its error, if it failed.
    pub error: Option<OperationError>,
    /// The error of the attempt before, if any.
    pub previous_error: Option<OperationError>,
}

/// The log: appended by the owner, read by RPC handlers.
#[derive(Debug, Default)]
pub struct OperationLog {
    entries: Mutex<VecDeque<LogEntry>>,
}

impl OperationLog {
    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<LogEntry>> {
        self.entries
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The sequence the next entry will get.
    pub fn next_sequence(&self) -> u64 {
        self.lock().back().map_or(0, |last| last.sequence + 1)
    }

    /// Records a dispatched operation.
    pub fn started(
        &self,
        item: ItemRef,
        kind: OperationKind,
        op_id: String,
        attempt: u32,
        started_ms: u64,
        previous_error: Option<OperationError>,
    ) {
        let mut entries = self.lock();
        let sequence = entries.back().map_or(0, |last| last.sequence + 1);
        entries.push_back(LogEntry {
            sequence,
            item,
            kind,
            op_id,
            attempt,
            started_ms,
            ended_ms: None,
            error: None,
            previous_error,
        });
        while entries.len() > KEPT_ENTRIES {
            entries.pop_front();
        }
    }

    /// Records the end of an operation.
    pub fn ended(&self, op_id: &str, attempt: u32, ended_ms: u64, error: Option<OperationError>) {
        let mut entries = self.lock();
        if let Some(entry) = entries
            .iter_mut()
            .rev()
            .find(|entry| entry.op_id == op_id && entry.attempt == attempt)
        {
            entry.ended_ms = Some(ended_ms);
            entry.error = error;
        }
    }

    /// Entries from `sequence` on.
    pub fn since(&self, sequence: u64) -> Vec<LogEntry> {
        self.lock()
            .iter()
            .filter(|entry| entry.sequence >= sequence)
            .cloned()
            .collect()
    }
}
