//! The embedded sled backend of [`Store`].

use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::mpsc::sync_channel;

use crate::store::sled_files::open_db;
use crate::store::writer::{Reply, Request, Writer};
use crate::store::{CommitHandle, CommitStats, Record, Store, StoreError, WriteBatch};

/// Settings of a [`SledStore`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SledOptions {
    /// sled's page cache size. The working set should fit: reads from a too
    /// small cache are several times slower.
    pub cache_capacity_bytes: u64,
    /// The most writes merged into one group commit (0 counts as 1). A single
    /// larger batch is still applied whole, as a commit of its own.
    pub max_commit_items: usize,
    /// Whether commits fsync the log file. Without it a commit survives a
    /// killed process but not a power loss: turn it off only for tests and
    /// throw-away data.
    pub fsync: bool,
}

impl Default for SledOptions {
    fn default() -> Self {
        Self {
            cache_capacity_bytes: 1 << 30,
            max_commit_items: 10_000,
            fsync: true,
        }
    }
}

/// A [`Store`] in one sled database (one tree) with a group-commit writer.
///
/// Reads go straight to sled and may see a commit a moment before its handle
/// resolves (applied, not yet fsynced); only acknowledged commits are
/// promised to survive a crash. Dropping the store finishes the queued
/// commits and waits for the writer thread.
pub struct SledStore {
    db: sled::Db,
    dir: PathBuf,
    writer: Writer,
}

impl SledStore {
    /// Opens (or creates) the store in `dir`; sled's files go in `<dir>/db`.
    pub fn open(dir: &Path, options: SledOptions) -> Result<Self, StoreError> {
        let open_error = |message: String| StoreError::Open {
            path: dir.to_path_buf(),
            message,
        };
        let opened = open_db(dir, options.cache_capacity_bytes, false).map_err(open_error)?;
        let db = opened.db.clone();
        let writer = Writer::spawn(opened, options.max_commit_items, options.fsync)
            .map_err(|e| open_error(format!("starting the commit writer thread: {e}")))?;
        Ok(Self {
            db,
            dir: dir.to_path_buf(),
            writer,
        })
    }

    /// The store directory given to [`open`](Self::open).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Counters of the group-commit writer (commits, writes, flushes).
    pub fn commit_stats(&self) -> CommitStats {
        self.writer.stats()
    }

    /// Runs a request on the writer thread and waits for its answer.
    fn ask_writer(&self, request: impl FnOnce(Reply) -> Request) -> Result<(), StoreError> {
        let (sender, receiver) = sync_channel(1);
        self.writer
            .send(request(Reply::Blocking(sender)))
            .map_err(|_| StoreError::Closed)?;
        receiver.recv().unwrap_or(Err(StoreError::Closed))
    }
}

impl std::fmt::Debug for SledStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SledStore")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

fn read_error(operation: &'static str) -> impl Fn(sled::Error) -> StoreError {
    move |e| StoreError::Backend {
        operation,
        message: e.to_string(),
    }
}

impl Store for SledStore {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        let value = self.db.get(key).map_err(read_error("read a key"))?;
        Ok(value.map(|v| v.to_vec()))
    }

    fn scan(
        &self,
        prefix: &[u8],
        start_after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        let lower = super::scan_start(prefix, start_after);
        let mut found = Vec::new();
        for record in self
            .db
            .range::<&[u8], _>((lower, Bound::Unbounded))
            .take(limit)
        {
            let (key, value) = record.map_err(read_error("scan keys"))?;
            if !key.starts_with(prefix) {
                break;
            }
            found.push((key.to_vec(), value.to_vec()));
        }
        Ok(found)
    }

    fn commit(&self, batch: WriteBatch) -> CommitHandle {
        if let Err(e) = batch.validate() {
            return CommitHandle::ready(Err(e));
        }
        let (sender, handle) = CommitHandle::pending();
        // If the writer has stopped, the request (and the sender in it) is
        // dropped, and the handle resolves to `StoreError::Closed`.
        let _ = self.writer.send(Request::Commit {
            batch,
            reply: Reply::Async(sender),
        });
        handle
    }

    fn commit_blocking(&self, batch: WriteBatch) -> Result<(), StoreError> {
        batch.validate()?;
        self.ask_writer(|reply| Request::Commit { batch, reply })
    }

    /// Copies every record, on the writer thread between two group commits
    /// (so the copy is consistent: nothing else writes), into a new store at
    /// `path`, then fsyncs it. Commits wait meanwhile. This is what
    /// `sled::Db::export` + `import` would do, but it reports I/O errors
    /// instead of panicking on them.
    fn backup_to(&self, path: &Path) -> Result<(), StoreError> {
        let path = path.to_path_buf();
        self.ask_writer(|reply| Request::Backup { path, reply })
    }

    fn size_on_disk(&self) -> Result<u64, StoreError> {
        self.db
            .size_on_disk()
            .map_err(read_error("measure its size on disk"))
    }
}

#[cfg(test)]
mod tests;
