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
use std::sync::Arc;
use std::task::{Context, Poll};

use http_body_util::BodyExt as _;
use tonic::body::Body;
use tonic::codegen::{Service, http};
use tonic::transport::Channel;
use tonic::{Code, ConnectError, Status, TimeoutExpired};

use crate::chain::error_chain;

/// The start of the message of a status for a connection lost under a
/// call or a stream.
pub(crate) const CONNECTION_LOST: &str = "the connection to the server was lost";

/// The start of the message of a status for a call that could not
/// connect.
pub(crate) const NOT_CONNECTED: &str = "could not connect to the server";

/// A [`Channel`] whose failures are `tonic::Status`es, with a lost
/// connection reported as `UNAVAILABLE` (see the module documentation).
#[derive(Debug, Clone)]
pub(crate) struct Transport {
    channel: Channel,
    /// The address the channel dials, when known, for the message of a
    /// call that could not connect.
    endpoint: Option<Arc<str>>,
}

impl Transport {
    /// Wraps `channel`, which dials `endpoint` (if known).
    pub(crate) fn new(channel: Channel, endpoint: Option<&str>) -> Self {
        Self {
            channel,
            endpoint: endpoint.map(Arc::from),
        }
    }
}

impl Service<http::Request<Body>> for Transport {
    type Response = http::Response<Body>;
    type Error = Status;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Status>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Status>> {
        let endpoint = self.endpoint.as_deref();
        self.channel
            .poll_ready(cx)
            .map_err(|error| call_failed(error, endpoint))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let response = self.channel.call(request);
        let endpoint = self.endpoint.clone();
        Box::pin(async move {
            let response = response
                .await
                .map_err(|error| call_failed(error, endpoint.as_deref()))?;
            // tonic takes a `Status` found as the body's error as it is.
            Ok(response.map(|body| Body::new(body.map_err(body_failed))))
        })
    }
}

/// A call that failed before its response arrived. A timeout set on the
/// channel (`Endpoint::timeout`) stays what tonic makes of it, and a
/// connection that could not be made is `UNAVAILABLE` saying so, where
/// to and why ([`not_connected`]).
fn call_failed(error: tonic::transport::Error, endpoint: Option<&str>) -> Status {
    let timed_out = caused_by::<TimeoutExpired>(&error);
    if caused_by::<ConnectError>(&error) {
        return not_connected(&error, endpoint);
    }
    let status = Status::from_error(Box::new(error));
    match status.code() {
        Code::Cancelled if timed_out => status,
        Code::Unknown | Code::Cancelled | Code::Unavailable => lost(status),
        _ => status,
    }
}

/// `UNAVAILABLE` for a call that found no connection and could not make
/// one (the server is down, restarting, or not listening there). tonic
/// would say only "tcp connect error"; this names the address and the
/// operating system's reason (e.g. "Connection refused").
fn not_connected(error: &(dyn StdError + 'static), endpoint: Option<&str>) -> Status {
    let reasons = error.source().map(error_chain).unwrap_or_default();
    let at = endpoint
        .map(|endpoint| format!(" at {endpoint}"))
        .unwrap_or_default();
    Status::unavailable(format!(
        "{NOT_CONNECTED}{at} ({reasons}); check that it runs and listens there, then retry"
    ))
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
