//! The group-commit writer: one thread that makes every commit durable.
//!
//! It takes the requests waiting in its channel (up to `max_commit_items`
//! writes; a single larger batch is applied whole on its own; small commits
//! ahead of large ones, see [`next_work`]), applies them with one
//! `apply_batch`, flushes, fsyncs the log file and then answers all
//! waiters. While it flushes, new requests queue up and form the next group,
//! so one fsync serves many commits. Being the only writer, it also takes
//! consistent backups between two groups.

use std::collections::VecDeque;
use std::fs::File;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, Sender, SyncSender, channel};
use std::thread::JoinHandle;

use tokio::sync::oneshot;
use tracing::error;

use crate::store::sled_files::{OpenHere, OpenedDb, write_new_store};
use crate::store::sled_garbage;
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
            _open_here: opened.open_here,
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

/// A request waiting in the writer, with how many groups were formed
/// without it.
struct Queued {
    request: Request,
    passed_over: u32,
}

impl From<Request> for Queued {
    fn from(request: Request) -> Self {
        Self {
            request,
            passed_over: 0,
        }
    }
}

/// What the writer does next.
enum Work {
    Backup { path: PathBuf, reply: Reply },
    Group(Vec<(WriteBatch, Reply)>),
}

/// A commit of at most this share of `max_commit_items` is small: it joins
/// the next group ahead of larger commits that arrived before it.
const SMALL_SHARE: usize = 10;

/// Groups a large commit may be passed over before it goes first.
const MAX_PASSED_OVER: u32 = 2;

/// Takes the next work off `pending` (not empty). A backup runs when every
/// commit queued before it is done. A group holds the small commits
/// waiting (in order, up to `max_items` writes), so that a tenant's small
/// commit waits for at most one group of other tenants' large ones; a
/// large commit joins when no small one waits, or first once it has been
/// passed over [`MAX_PASSED_OVER`] times, so it cannot starve. A large
/// commit over `max_items` forms a group of its own.
fn next_work(pending: &mut VecDeque<Queued>, max_items: usize) -> Work {
    let sizes: Vec<Option<usize>> = pending
        .iter()
        .map(|queued| match &queued.request {
            Request::Commit { batch, .. } => Some(batch.len()),
            Request::Backup { .. } => None,
        })
        .collect();
    let front_due = pending
        .front()
        .is_some_and(|front| front.passed_over >= MAX_PASSED_OVER);
    let chosen = pick_group(&sizes, front_due, max_items);
    if chosen.is_empty() {
        match pending.pop_front().map(|queued| queued.request) {
            Some(Request::Backup { path, reply }) => return Work::Backup { path, reply },
            Some(Request::Commit { batch, reply }) => return Work::Group(vec![(batch, reply)]),
            None => return Work::Group(Vec::new()),
        }
    }
    if chosen[0] != 0
        && let Some(front) = pending.front_mut()
    {
        front.passed_over += 1;
    }
    let mut group = Vec::with_capacity(chosen.len());
    for index in chosen.into_iter().rev() {
        if let Some(Queued {
            request: Request::Commit { batch, reply },
            ..
        }) = pending.remove(index)
        {
            group.push((batch, reply));
        }
    }
    group.reverse();
    Work::Group(group)
}

/// The indices (ascending) of the commits of the next group, given the
/// sizes of what is pending (`None`: a backup, which nothing after it may
/// pass). Empty when the front is a backup.
fn pick_group(sizes: &[Option<usize>], front_due: bool, max_items: usize) -> Vec<usize> {
    let eligible = sizes.iter().take_while(|size| size.is_some()).count();
    if eligible == 0 {
        return Vec::new();
    }
    let small = (max_items / SMALL_SHARE).max(1);
    let size = |index: usize| sizes[index].unwrap_or(0);
    let mut chosen = Vec::new();
    let mut items = 0;
    if front_due {
        chosen.push(0);
        items = size(0);
    }
    for index in 0..eligible {
        if !chosen.contains(&index) && size(index) <= small && items + size(index) <= max_items {
            chosen.push(index);
            items += size(index);
        }
    }
    if chosen.is_empty() {
        // No small commit waits: large ones in order, as many as fit (the
        // first whole, whatever its size).
        for index in 0..eligible {
            if chosen.is_empty() || items + size(index) <= max_items {
                chosen.push(index);
                items += size(index);
            } else {
                break;
            }
        }
    }
    chosen.sort_unstable();
    chosen
}

struct WriterThread {
    db: sled::Db,
    log_file: File,
    /// Keeps the store marked open in this process while the thread runs.
    _open_here: OpenHere,
    max_commit_items: usize,
    fsync: bool,
    counters: Arc<Counters>,
}

impl WriterThread {
    fn run(self, requests: Receiver<Request>) {
        let mut pending: VecDeque<Queued> = VecDeque::new();
        loop {
            if pending.is_empty() {
                match requests.recv() {
                    Ok(request) => pending.push_back(Queued::from(request)),
                    Err(_) => return,
                }
            }
            while let Ok(request) = requests.try_recv() {
                pending.push_back(Queued::from(request));
            }
            match next_work(&mut pending, self.max_commit_items) {
                Work::Backup { path, reply } => reply.send(self.backup(path)),
                Work::Group(group) => {
                    let items = group.iter().map(|(batch, _)| batch.len()).sum();
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
        sled_garbage::collect_after(items);
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

#[cfg(test)]
mod tests {
    use super::pick_group;

    #[test]
    fn small_commits_go_ahead_of_large_ones() {
        let sizes = [Some(5_000), Some(3), Some(8_000), Some(10)];
        assert_eq!(pick_group(&sizes, false, 10_000), vec![1, 3]);
    }

    #[test]
    fn a_large_commit_goes_when_no_small_one_waits_or_once_it_is_due() {
        let sizes = [Some(5_000), Some(4_000), Some(3_000)];
        assert_eq!(pick_group(&sizes, false, 10_000), vec![0, 1]);
        let sizes = [Some(5_000), Some(3), Some(6_000)];
        assert_eq!(pick_group(&sizes, true, 10_000), vec![0, 1]);
        assert_eq!(pick_group(&[Some(25_000), Some(3)], true, 10_000), vec![0]);
        assert_eq!(pick_group(&[Some(25_000)], false, 10_000), vec![0]);
    }

    #[test]
    fn nothing_passes_a_backup() {
        assert!(pick_group(&[None, Some(3)], false, 10_000).is_empty());
        assert_eq!(
            pick_group(&[Some(5_000), None, Some(3)], false, 10_000),
            vec![0]
        );
    }
}
