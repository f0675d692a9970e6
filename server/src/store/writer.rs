//! The group-commit writer: one thread that makes every commit durable.
//!
//! It takes every request waiting in its channel (up to `max_commit_items`
//! writes; a single larger batch is applied whole on its own), applies them
//! with one `apply_batch`, flushes, fsyncs the log file and then answers all
//! waiters. While it flushes, new requests queue up and form the next group,
//! so one fsync serves many commits. Being the only writer, it also takes
//! consistent backups between two groups.

use std::fs::File;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, Sender, SyncSender, channel};
use std::thread::JoinHandle;

use tokio::sync::oneshot;
use tracing::error;

use crate::store::sled_files::{OpenedDb, write_new_store};
use crate::store::{StoreError, Write, WriteBatch};

/// Counters of the group-commit writer, for metrics and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CommitStats {
    /// Batches acknowledged as durable.
    pub commits: u64,
    /// Writes (puts and deletes) made durable.
    pub writes: u64,
    /// Flush + fsync rounds; each one served one or more commits.
    pub flushes: u64,
}

#[derive(Default)]
struct Counters {
    commits: AtomicU64,
    writes: AtomicU64,
    flushes: AtomicU64,
}

/// Where the answer to one request goes.
pub(crate) enum Reply {
    /// An awaited [`CommitHandle`](crate::store::CommitHandle).
    Async(oneshot::Sender<Result<(), StoreError>>),
    /// A thread blocked in `commit_blocking` or `backup_to`.
    Blocking(SyncSender<Result<(), StoreError>>),
}

impl Reply {
    fn send(self, result: Result<(), StoreError>) {
        // A waiter that has gone away no longer needs the answer.
        match self {
            Reply::Async(sender) => {
                let _ = sender.send(result);
            }
            Reply::Blocking(sender) => {
                let _ = sender.send(result);
            }
        }
    }
}

/// Work for the writer thread.
pub(crate) enum Request {
    /// Apply and make durable a validated batch.
    Commit { batch: WriteBatch, reply: Reply },
    /// Copy the whole store into a new store at `path`.
    Backup { path: PathBuf, reply: Reply },
}

/// The owner's side of the writer thread; dropping it drains the queue and
/// joins the thread.
pub(crate) struct Writer {
    sender: Option<Sender<Request>>,
    thread: Option<JoinHandle<()>>,
    counters: Arc<Counters>,
}

impl Writer {
    /// Starts the writer thread over `opened`.
    pub(crate) fn spawn(
        opened: OpenedDb,
        max_commit_items: usize,
        fsync: bool,
    ) -> std::io::Result<Self> {
        let (sender, receiver) = channel();
        let counters = Arc::new(Counters::default());
        let state = WriterThread {
            db: opened.db,
            log_file: opened.log_file,
            max_commit_items: max_commit_items.max(1),
            fsync,
            counters: Arc::clone(&counters),
        };
        let thread = std::thread::Builder::new()
            .name("store-commit".to_owned())
            .spawn(move || state.run(receiver))?;
        Ok(Self {
            sender: Some(sender),
            thread: Some(thread),
            counters,
        })
    }

    /// Queues a request; gives it back if the writer has stopped.
    pub(crate) fn send(&self, request: Request) -> Result<(), Request> {
        match &self.sender {
            Some(sender) => sender.send(request).map_err(|e| e.0),
            None => Err(request),
        }
    }

    /// A snapshot of the counters.
    pub(crate) fn stats(&self) -> CommitStats {
        CommitStats {
            commits: self.counters.commits.load(Ordering::Relaxed),
            writes: self.counters.writes.load(Ordering::Relaxed),
            flushes: self.counters.flushes.load(Ordering::Relaxed),
        }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        // Closing the channel lets the thread finish what is queued and exit.
        drop(self.sender.take());
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            error!("The store's commit writer panicked.");
        }
    }
}

struct WriterThread {
    db: sled::Db,
    log_file: File,
    max_commit_items: usize,
    fsync: bool,
    counters: Arc<Counters>,
}

impl WriterThread {
    fn run(self, requests: Receiver<Request>) {
        let mut carried: Option<Request> = None;
        loop {
            let first = match carried.take() {
                Some(request) => request,
                None => match requests.recv() {
                    Ok(request) => request,
                    Err(_) => return,
                },
            };
            match first {
                Request::Backup { path, reply } => reply.send(self.backup(path)),
                Request::Commit { batch, reply } => {
                    let mut items = batch.len();
                    let mut group = vec![(batch, reply)];
                    while let Ok(next) = requests.try_recv() {
                        match next {
                            Request::Commit { batch, reply }
                                if items + batch.len() <= self.max_commit_items =>
                            {
                                items += batch.len();
                                group.push((batch, reply));
                            }
                            other => {
                                carried = Some(other);
                                break;
                            }
                        }
                    }
                    self.commit_group(group, items);
                }
            }
        }
    }

    fn commit_group(&self, group: Vec<(WriteBatch, Reply)>, items: usize) {
        let result = if items == 0 {
            Ok(())
        } else {
            self.apply_durably(&group)
        };
        if result.is_ok() {
            self.counters
                .commits
                .fetch_add(group.len() as u64, Ordering::Relaxed);
            self.counters
                .writes
                .fetch_add(items as u64, Ordering::Relaxed);
        }
        for (_, reply) in group {
            reply.send(result.clone());
        }
    }

    fn apply_durably(&self, group: &[(WriteBatch, Reply)]) -> Result<(), StoreError> {
        let mut merged = sled::Batch::default();
        for write in group.iter().flat_map(|(batch, _)| batch.writes()) {
            match write {
                Write::Put { key, value } => merged.insert(key.as_slice(), value.as_slice()),
                Write::Delete { key } => merged.remove(key.as_slice()),
            }
        }
        self.db
            .apply_batch(merged)
            .map_err(|e| StoreError::Backend {
                operation: "apply a batch",
                message: e.to_string(),
            })?;
        // The batch is now visible to readers; if it cannot be made durable we
        // can neither take it back nor tell what the disk holds: stop.
        if let Err(e) = self.db.flush() {
            stop_process("flush", &e.to_string());
        }
        if self.fsync
            && let Err(e) = self.log_file.sync_all()
        {
            stop_process("fsync", &e.to_string());
        }
        self.counters.flushes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn backup(&self, path: PathBuf) -> Result<(), StoreError> {
        let records = self.db.iter().map(|record| {
            record
                .map(|(key, value)| (key.to_vec(), value.to_vec()))
                .map_err(|e| format!("reading the store: {e}"))
        });
        write_new_store(&path, records).map_err(|message| StoreError::Backup { path, message })
    }
}

/// After a failed flush or fsync the page cache's state is unknowable
/// (a retried fsync may report success for lost writes), so the only safe
/// recovery is a restart from what the disk holds.
fn stop_process(operation: &str, message: &str) -> ! {
    error!(
        operation,
        error = message,
        "The store could not make a commit durable; stopping the process to recover from disk on restart."
    );
    std::process::abort()
}
