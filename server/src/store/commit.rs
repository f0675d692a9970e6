//! The future a caller awaits for its commit to become durable.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::sync::oneshot;

use crate::store::StoreError;

/// Resolves once the batch is durable (flushed and fsynced) or has failed.
///
/// Dropping it does not cancel the commit; it only discards the answer.
#[must_use = "a commit is durable only once its handle resolves"]
#[derive(Debug)]
pub struct CommitHandle(oneshot::Receiver<Result<(), StoreError>>);

impl CommitHandle {
    /// A handle that resolves at once with `result` (a rejected batch, or a
    /// store that commits synchronously).
    pub fn ready(result: Result<(), StoreError>) -> Self {
        let (sender, handle) = Self::pending();
        // The receiver is alive in `handle`, so the send cannot fail.
        let _ = sender.send(result);
        handle
    }

    /// A handle and the sender that resolves it.
    pub(crate) fn pending() -> (oneshot::Sender<Result<(), StoreError>>, Self) {
        let (sender, receiver) = oneshot::channel();
        (sender, Self(receiver))
    }
}

impl Future for CommitHandle {
    type Output = Result<(), StoreError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // A dropped sender means the writer stopped before answering.
        Pin::new(&mut self.0)
            .poll(cx)
            .map(|answer| answer.unwrap_or(Err(StoreError::Closed)))
    }
}
