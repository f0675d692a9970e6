//! The thread that runs the etcd client, and how calls reach it.
//!
//! [`Store`](crate::store::Store)'s reads are synchronous, and they are
//! called from async code (tenant owners, RPC handlers) as well as from
//! start-up code and tools. Blocking on an async etcd call from inside a
//! tokio runtime needs `block_in_place`, which panics on a current-thread
//! runtime, or `Handle::block_on`, which panics on any runtime thread. So
//! the client lives on a thread of its own with its own current-thread
//! runtime: a call is a job sent over a channel and spawned there, and its
//! caller waits for the answer on a plain channel (a synchronous call) or a
//! oneshot (an async one). The caller's runtime, whatever its flavour,
//! never drives etcd I/O, so nothing can panic or deadlock on it; a
//! synchronous call blocks its thread for one etcd round trip, as a sled
//! read blocks it for a disk read. The commit writer runs on the same
//! thread, so that commits queue without any caller's runtime.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::mpsc::sync_channel;
use std::thread::JoinHandle;

use tokio::sync::{mpsc, oneshot};
use tracing::error;

use crate::store::StoreError;
use crate::store::etcd::EtcdOptions;
use crate::store::etcd::connect::Shared;
use crate::store::etcd::staged;
use crate::store::etcd::writer::{self, CommitRequest};

/// A unit of work for the etcd thread.
type Job = Box<dyn FnOnce(Arc<Shared>) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send>;

/// The etcd thread: its job queue and its commit queue. Dropping it lets
/// the commit writer finish what is queued, then joins the thread.
pub(crate) struct EtcdThread {
    jobs: Option<mpsc::UnboundedSender<Job>>,
    commits: Option<mpsc::UnboundedSender<CommitRequest>>,
    thread: Option<JoinHandle<()>>,
}

impl EtcdThread {
    /// Starts the thread, connects to etcd and starts the commit writer;
    /// returns once connected (or failed to).
    pub(crate) fn start(options: EtcdOptions) -> Result<Self, StoreError> {
        let (jobs, mut job_queue) = mpsc::unbounded_channel::<Job>();
        let (commits, commit_queue) = mpsc::unbounded_channel();
        let (connected, connection) = sync_channel(1);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| StoreError::Etcd {
                operation: "start the etcd client's runtime",
                message: e.to_string(),
            })?;
        let thread = std::thread::Builder::new()
            .name("store-etcd".to_owned())
            .spawn(move || {
                runtime.block_on(async move {
                    let shared = match crate::store::etcd::connect::connect(options).await {
                        Ok(shared) => Arc::new(shared),
                        Err(error) => {
                            let _ = connected.send(Err(error));
                            return;
                        }
                    };
                    let _ = connected.send(Ok(()));
                    let writer = tokio::spawn(writer::run(shared.clone(), commit_queue));
                    // Ends with the runtime, when the store closes.
                    tokio::spawn(staged::sweep_abandoned(shared.clone()));
                    while let Some(job) = job_queue.recv().await {
                        tokio::spawn(job(shared.clone()));
                    }
                    if writer.await.is_err() {
                        error!("The etcd store's commit writer panicked.");
                    }
                });
            })
            .map_err(|e| StoreError::Etcd {
                operation: "start the etcd client's thread",
                message: e.to_string(),
            })?;
        let mut started = Self {
            jobs: Some(jobs),
            commits: Some(commits),
            thread: Some(thread),
        };
        match connection.recv() {
            Ok(Ok(())) => Ok(started),
            Ok(Err(error)) => Err(error),
            Err(_) => {
                started.jobs = None;
                Err(StoreError::Closed)
            }
        }
    }

    /// Queues a commit.
    pub(crate) fn queue_commit(&self, request: CommitRequest) {
        // If the writer has stopped, the request (and its reply sender) is
        // dropped and the caller sees `StoreError::Closed`.
        if let Some(commits) = &self.commits {
            let _ = commits.send(request);
        }
    }

    fn send(&self, job: Job) -> Result<(), StoreError> {
        match &self.jobs {
            Some(jobs) => jobs.send(job).map_err(|_| StoreError::Closed),
            None => Err(StoreError::Closed),
        }
    }

    /// Runs `call` on the etcd thread and blocks this thread until it
    /// answers. Safe on any thread but the etcd thread itself.
    pub(crate) fn call_blocking<T, F, Fut>(&self, call: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(Arc<Shared>) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, StoreError>> + Send + 'static,
    {
        let (answer, answered) = sync_channel(1);
        self.send(Box::new(move |shared| {
            Box::pin(async move {
                let _ = answer.send(call(shared).await);
            })
        }))?;
        answered.recv().unwrap_or(Err(StoreError::Closed))
    }

    /// Runs `call` on the etcd thread and awaits its answer.
    pub(crate) async fn call<T, F, Fut>(&self, call: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(Arc<Shared>) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, StoreError>> + Send + 'static,
    {
        let (answer, answered) = oneshot::channel();
        self.send(Box::new(move |shared| {
            Box::pin(async move {
                let _ = answer.send(call(shared).await);
            })
        }))?;
        answered.await.unwrap_or(Err(StoreError::Closed))
    }
}

impl Drop for EtcdThread {
    fn drop(&mut self) {
        drop(self.commits.take());
        drop(self.jobs.take());
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            error!("The etcd store's thread panicked.");
        }
    }
}
