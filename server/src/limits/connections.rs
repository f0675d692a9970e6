//! The connection limit: slots taken by a connection's first call and
//! freed when it closes.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::codegen::http::Request;
use tonic::transport::server::{Connected, TlsConnectInfo};

use super::lock;

/// The server's connection slots. A connection takes a slot with its first
/// call and keeps it until it closes; calls on a connection that finds no
/// free slot are refused (and it tries again with its next call), so a
/// client refused under a burst recovers without reconnecting.
#[derive(Clone, Debug)]
pub struct ConnectionSlots {
    semaphore: Arc<Semaphore>,
}

impl ConnectionSlots {
    /// `max` slots.
    pub fn new(max: usize) -> Self {
        Self {
            semaphore: Arc::new(Semaphore::new(max)),
        }
    }

    /// Wraps an accepted connection so that it can hold a slot.
    pub fn wrap<T>(&self, io: T) -> LimitedConnection<T> {
        LimitedConnection {
            inner: io,
            slot: ConnectionSlot {
                semaphore: self.semaphore.clone(),
                permit: Arc::default(),
            },
        }
    }
}

/// One connection's claim on a slot (shared with its calls' extensions).
#[derive(Clone, Debug)]
pub struct ConnectionSlot {
    semaphore: Arc<Semaphore>,
    permit: Arc<Mutex<Option<OwnedSemaphorePermit>>>,
}

impl ConnectionSlot {
    /// Whether the connection holds a slot, taking a free one if it has none.
    pub(super) fn admit(&self) -> bool {
        let mut permit = lock(&self.permit);
        if permit.is_none() {
            *permit = self.semaphore.clone().try_acquire_owned().ok();
        }
        permit.is_some()
    }

    fn release(&self) {
        lock(&self.permit).take();
    }
}

/// An accepted connection that may hold one of the [`ConnectionSlots`];
/// the slot is freed when the connection is dropped.
#[derive(Debug)]
pub struct LimitedConnection<T> {
    inner: T,
    slot: ConnectionSlot,
}

impl<T> Drop for LimitedConnection<T> {
    fn drop(&mut self) {
        self.slot.release();
    }
}

/// What calls on a [`LimitedConnection`] see of it: the transport's own
/// connection info and the connection's slot.
#[derive(Clone, Debug)]
pub struct LimitedConnectInfo<C> {
    /// The transport's connection info (addresses).
    pub inner: C,
    slot: ConnectionSlot,
}

impl<T: Connected> Connected for LimitedConnection<T> {
    type ConnectInfo = LimitedConnectInfo<T::ConnectInfo>;

    fn connect_info(&self) -> Self::ConnectInfo {
        LimitedConnectInfo {
            inner: self.inner.connect_info(),
            slot: self.slot.clone(),
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for LimitedConnection<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for LimitedConnection<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// The slot of the connection a call came on (plain or TLS), if any.
pub(super) fn connection_slot<B>(request: &Request<B>) -> Option<&ConnectionSlot> {
    type Tcp = tonic::transport::server::TcpConnectInfo;
    let extensions = request.extensions();
    extensions
        .get::<LimitedConnectInfo<Tcp>>()
        .map(|info| &info.slot)
        .or_else(|| {
            extensions
                .get::<TlsConnectInfo<LimitedConnectInfo<Tcp>>>()
                .map(|info| &info.get_ref().slot)
        })
}
