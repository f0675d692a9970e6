//! Where the agent dials: its endpoints (the replicas of one deployment,
//! tried in turn when one cannot be reached), and the replica a server
//! redirected it to.
//!
//! With replicas on etcd, an agent's session lives on the replica that
//! serves its tenant. Any other replica refuses `Connect` with
//! `UNAVAILABLE` and `ErrorInfo{reason: "NOT_OWNER", metadata: {owner}}`
//! naming the owner's address: the agent dials that address at once (same
//! scheme and TLS settings), without a backoff. When the owner goes away
//! (its process died, the tenant moved), the agent goes back to its own
//! endpoints, each of which redirects it again.

use std::time::Duration;

use tonic::Code;
use tonic::transport::Endpoint;
use tonic_types::StatusExt as _;

use crate::tls::ClientTls;

/// The `ErrorInfo.reason` of a `Connect` refused by a replica that does not
/// serve the tenant.
pub const REASON_NOT_OWNER: &str = "NOT_OWNER";

/// What the agent does after a failed session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Next {
    /// Dial the redirect target now.
    Now,
    /// Dial the next target after the backoff.
    AfterBackoff,
}

/// The agent's targets.
#[derive(Debug)]
pub(crate) struct Targets {
    endpoints: Vec<Endpoint>,
    next: usize,
    redirect: Option<Endpoint>,
    scheme: String,
    tls: Option<ClientTls>,
    connect_timeout: Duration,
}

impl Targets {
    /// Targets over `endpoints` (at least one), dialled with `tls`; a
    /// redirect uses the scheme of the first.
    pub(crate) fn new(
        endpoints: Vec<Endpoint>,
        tls: Option<ClientTls>,
        connect_timeout: Duration,
    ) -> Self {
        let scheme = endpoints
            .first()
            .and_then(|endpoint| endpoint.uri().scheme_str().map(str::to_owned))
            .unwrap_or_else(|| "http".to_owned());
        Self {
            endpoints,
            next: 0,
            redirect: None,
            scheme,
            tls,
            connect_timeout,
        }
    }

    /// The endpoint to dial now.
    pub(crate) fn current(&self) -> Option<Endpoint> {
        self.redirect
            .clone()
            .or_else(|| self.endpoints.get(self.next).cloned())
    }

    /// Takes note of a failed session (or attempt) that ended with
    /// `status` (`None`: no status, e.g. the connection failed).
    pub(crate) fn failed(&mut self, status: Option<&tonic::Status>) -> Next {
        if let Some(owner) = status.and_then(redirect_target)
            && let Some(endpoint) = self.endpoint_for(&owner)
        {
            tracing::info!(%owner, "The tenant is served by another replica; connecting there.");
            self.redirect = Some(endpoint);
            return Next::Now;
        }
        if status.is_some_and(|status| not_owner(status).is_some()) {
            // Moving between replicas: ask the same one again after the
            // backoff (it waited for an owner before answering).
            return Next::AfterBackoff;
        }
        // Unreachable, or gone: go back to the configured endpoints, on to
        // the next one unless the failed one was a redirect.
        if self.redirect.take().is_none() && !self.endpoints.is_empty() {
            self.next = (self.next + 1) % self.endpoints.len();
        }
        Next::AfterBackoff
    }

    fn endpoint_for(&self, address: &str) -> Option<Endpoint> {
        let endpoint = Endpoint::from_shared(format!("{}://{address}", self.scheme))
            .ok()?
            .connect_timeout(self.connect_timeout);
        match &self.tls {
            Some(tls) => tls.apply(endpoint).ok(),
            None => Some(endpoint),
        }
    }
}

/// The `owner` of a `NOT_OWNER` refusal (empty: nobody serves the tenant
/// right now), if `status` is one.
fn not_owner(status: &tonic::Status) -> Option<String> {
    if status.code() != Code::Unavailable {
        return None;
    }
    let info = status.get_details_error_info()?;
    (info.reason == REASON_NOT_OWNER)
        .then(|| info.metadata.get("owner").cloned().unwrap_or_default())
}

/// The address a `NOT_OWNER` refusal sends the agent to, if it names one.
fn redirect_target(status: &tonic::Status) -> Option<String> {
    not_owner(status).filter(|owner| !owner.is_empty())
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use tonic_types::ErrorDetails;

    use super::*;

    fn targets(addresses: &[&str]) -> Targets {
        let endpoints = addresses
            .iter()
            .map(|address| Endpoint::from_shared(format!("http://{address}")).expect("valid"))
            .collect();
        Targets::new(endpoints, None, Duration::from_secs(1))
    }

    fn not_owner_status(owner: &str) -> tonic::Status {
        tonic::Status::with_error_details(
            Code::Unavailable,
            "served elsewhere",
            ErrorDetails::with_error_info(
                REASON_NOT_OWNER,
                "reconciled.dev",
                HashMap::from([("owner".to_owned(), owner.to_owned())]),
            ),
        )
    }

    fn dialled(targets: &Targets) -> String {
        targets.current().expect("a target").uri().to_string()
    }

    #[test]
    fn a_redirect_is_followed_at_once_and_dropped_when_the_owner_goes() {
        let mut targets = targets(&["10.0.0.1:1", "10.0.0.2:1"]);
        assert_eq!(dialled(&targets), "http://10.0.0.1:1/");
        assert_eq!(
            targets.failed(Some(&not_owner_status("10.0.0.3:1"))),
            Next::Now
        );
        assert_eq!(dialled(&targets), "http://10.0.0.3:1/");
        // The owner died: back to the configured endpoints.
        assert_eq!(targets.failed(None), Next::AfterBackoff);
        assert_eq!(dialled(&targets), "http://10.0.0.1:1/");
    }

    #[test]
    fn unreachable_endpoints_are_tried_in_turn() {
        let mut targets = targets(&["a:1", "b:1"]);
        targets.failed(None);
        assert_eq!(dialled(&targets), "http://b:1/");
        targets.failed(Some(&tonic::Status::unavailable("shutting down")));
        assert_eq!(dialled(&targets), "http://a:1/");
    }

    #[test]
    fn a_tenant_on_the_move_is_asked_for_again_where_it_was() {
        let mut targets = targets(&["a:1", "b:1"]);
        assert_eq!(
            targets.failed(Some(&not_owner_status(""))),
            Next::AfterBackoff
        );
        assert_eq!(dialled(&targets), "http://a:1/");
    }
}
