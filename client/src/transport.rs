//! The [`Client`](crate::Client)'s channel, with transport failures
//! reported as `UNAVAILABLE`.
//!
//! tonic reports a connection that ends under a call or a stream by how
//! hyper noticed: a Watch whose connection the HTTP/2 keepalive gave up on
//! ends with `UNKNOWN` ("h2 protocol error: error reading a body from
//! connection"), a call in flight on it with what hyper said ("http2
//! error"), one on a connection that closed may be `CANCELLED`
//! ("operation was canceled: connection closed"). None says what a
//! controller must do; gRPC's own answer for a lost connection
//! is `UNAVAILABLE` (retry, or resume the stream), and that is what
//! docs/controllers.md tells a controller to resume on. This layer maps
//! them once, for every call and stream of the client.
//!
//! Only errors of the transport pass through here: a status the server
//! sent (in headers or trailers) is decoded by tonic above this layer and
//! reaches the caller unchanged.

use std::error::Error as StdError;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http_body_util::BodyExt as _;
use tonic::body::Body;
use tonic::codegen::{Service, http};
use tonic::transport::Channel;
use tonic::{Code, ConnectError, Status, TimeoutExpired};

/// The start of the message of every status this layer makes.
pub(crate) const CONNECTION_LOST: &str = "the connection to the server was lost";

/// A [`Channel`] whose failures are `tonic::Status`es, with a lost
/// connection reported as `UNAVAILABLE` (see the module documentation).
#[derive(Debug, Clone)]
pub(crate) struct Transport(Channel);

impl Transport {
    /// Wraps `channel`.
    pub(crate) fn new(channel: Channel) -> Self {
        Self(channel)
    }
}

impl Service<http::Request<Body>> for Transport {
    type Response = http::Response<Body>;
    type Error = Status;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Status>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Status>> {
        self.0.poll_ready(cx).map_err(call_failed)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let response = self.0.call(request);
        Box::pin(async move {
            let response = response.await.map_err(call_failed)?;
            // tonic takes a `Status` found as the body's error as it is.
            Ok(response.map(|body| Body::new(body.map_err(body_failed))))
        })
    }
}

/// A call that failed before its response arrived. A timeout set on the
/// channel (`Endpoint::timeout`) stays what tonic makes of it, and a
/// connection that could not be made stays `UNAVAILABLE` saying so.
fn call_failed(error: tonic::transport::Error) -> Status {
    let timed_out = caused_by::<TimeoutExpired>(&error);
    let not_connected = caused_by::<ConnectError>(&error);
    let status = Status::from_error(Box::new(error));
    match status.code() {
        Code::Cancelled if timed_out => status,
        Code::Unavailable if not_connected => status,
        Code::Unknown | Code::Cancelled | Code::Unavailable => lost(status),
        _ => status,
    }
}

/// Whether `error` or one of its sources is a `T`.
fn caused_by<T: StdError + 'static>(error: &(dyn StdError + 'static)) -> bool {
    let mut source = Some(error);
    while let Some(error) = source {
        if error.is::<T>() {
            return true;
        }
        source = error.source();
    }
    false
}

/// A response body (a stream's messages, or a call's reply) that broke
/// off: the connection under it ended.
fn body_failed(status: Status) -> Status {
    match status.code() {
        Code::Unknown | Code::Cancelled | Code::Unavailable => lost(status),
        _ => status,
    }
}

/// `UNAVAILABLE`, saying the connection was lost and what tonic said.
fn lost(status: Status) -> Status {
    if status.code() == Code::Unavailable && status.message().starts_with(CONNECTION_LOST) {
        return status;
    }
    Status::unavailable(format!(
        "{CONNECTION_LOST} ({}); retry, or resume a stream from its last revision",
        status.message()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_broken_stream_is_unavailable_and_says_the_connection_was_lost() {
        let status = body_failed(Status::unknown("h2 protocol error: broken pipe"));
        assert_eq!(status.code(), Code::Unavailable);
        assert!(status.message().starts_with(CONNECTION_LOST), "{status:?}");
        assert!(status.message().contains("broken pipe"), "{status:?}");
    }

    #[test]
    fn other_codes_are_left_as_they_are() {
        for code in [
            Code::Internal,
            Code::ResourceExhausted,
            Code::PermissionDenied,
        ] {
            let status = body_failed(Status::new(code, "reset by the peer"));
            assert_eq!(status.code(), code);
            assert_eq!(status.message(), "reset by the peer");
        }
    }
}
