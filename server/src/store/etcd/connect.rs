//! Connecting to etcd: endpoints, TLS, authentication, what every job on
//! the etcd thread shares, and the errors etcd calls end with.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

use etcd_client::{Certificate, Client, ConnectOptions, Identity, KvClient, TlsOptions};
use tracing::{error, warn};

use crate::store::batch::printable_key;
use crate::store::etcd::EtcdOptions;
use crate::store::etcd::latency::EtcdLatency;
use crate::store::etcd::layout::Layout;
use crate::store::{Fence, StoreError};

/// Connects to the endpoints of `options` and checks that etcd answers.
pub(crate) async fn connect(options: EtcdOptions) -> Result<Shared, StoreError> {
    let mut connect = ConnectOptions::new()
        .with_connect_timeout(options.connect_timeout)
        .with_keep_alive(Duration::from_secs(10), Duration::from_secs(10))
        .with_require_leader(true);
    if let Some(tls) = &options.tls {
        connect = connect.with_tls(tls_options(tls)?);
    }
    if let Some(auth) = &options.auth {
        connect = connect
            .with_user(auth.user.clone(), auth.password.clone())
            .with_auto_token_refresh(true);
    }
    let client = tokio::time::timeout(
        options.connect_timeout,
        Client::connect(options.endpoints.clone(), Some(connect)),
    )
    .await
    .map_err(|_| timed_out(&options))?
    .map_err(etcd_error("connect"))?;
    let shared = shared(client, options);
    // A cheap read proves the endpoints, credentials and TLS work.
    let mut kv = shared.kv.clone();
    let probe = shared.layout.marker_prefix();
    let probed = tokio::time::timeout(shared.options.connect_timeout, kv.get(probe, None))
        .await
        .map_err(|_| timed_out(&shared.options))?
        .map_err(etcd_error("read from etcd"))?;
    // Every record written before this store opened lies at or below it.
    shared.saw(probed.header());
    Ok(shared)
}

fn timed_out(options: &EtcdOptions) -> StoreError {
    StoreError::Etcd {
        operation: "connect",
        message: format!(
            "no answer from {} within {:?}",
            options.endpoints.join(","),
            options.connect_timeout
        ),
    }
}

fn tls_options(tls: &crate::store::etcd::EtcdTls) -> Result<TlsOptions, StoreError> {
    let read = |path: &std::path::Path| {
        std::fs::read(path).map_err(|e| StoreError::Etcd {
            operation: "read the etcd TLS files",
            message: format!("{}: {e}", path.display()),
        })
    };
    let mut options = TlsOptions::new();
    if let Some(ca) = &tls.ca {
        options = options.ca_certificate(Certificate::from_pem(read(ca)?));
    }
    match (&tls.cert, &tls.key) {
        (Some(cert), Some(key)) => {
            options = options.identity(Identity::from_pem(read(cert)?, read(key)?));
        }
        (None, None) => {}
        _ => {
            return Err(StoreError::Etcd {
                operation: "read the etcd TLS files",
                message: "a client certificate needs its key and a key its certificate".to_owned(),
            });
        }
    }
    Ok(options)
}

/// Maps an etcd client error to a [`StoreError`] while doing `operation`.
pub(crate) fn etcd_error(operation: &'static str) -> impl Fn(etcd_client::Error) -> StoreError {
    move |error| StoreError::Etcd {
        operation,
        message: error.to_string(),
    }
}

/// True if etcd certainly did not apply a request that failed with
/// `error` and retrying cannot help (a refused request: too large, too
/// many operations, no permission, out of space).
pub(crate) fn is_refusal(error: &etcd_client::Error) -> bool {
    use tonic::Code;
    match error {
        // "too many requests": etcd's apply lags its commits (load); the
        // request was not proposed and a moment later it is taken.
        etcd_client::Error::GRpcStatus(status)
            if status.code() == Code::ResourceExhausted
                && status.message().contains("too many requests") =>
        {
            false
        }
        etcd_client::Error::GRpcStatus(status) => matches!(
            status.code(),
            Code::InvalidArgument
                | Code::PermissionDenied
                | Code::Unauthenticated
                | Code::ResourceExhausted
                | Code::FailedPrecondition
                | Code::OutOfRange
                | Code::Unimplemented
        ),
        etcd_client::Error::InvalidArgs(_)
        | etcd_client::Error::InvalidUri(_)
        | etcd_client::Error::InvalidMetadataValue(_) => true,
        _ => false,
    }
}

/// What a request that kept failing leaves behind.
pub(crate) enum Failure {
    /// etcd refused it: nothing was applied.
    Refused(etcd_client::Error),
    /// It kept failing until the deadline; its outcome is unknown.
    Unknown(etcd_client::Error),
}

impl Failure {
    /// The failure as a [`StoreError`] while doing `operation`.
    pub(crate) fn into_store_error(self, operation: &'static str) -> StoreError {
        match self {
            Failure::Refused(error) | Failure::Unknown(error) => etcd_error(operation)(error),
        }
    }
}

/// How long one attempt of a request may take before it is sent again.
///
/// A write that a follower forwarded to a leader that then died is
/// answered only by etcd's own request timeout (7 s with the default
/// election timeout), long after a new leader took over (about a second).
/// Sending it again sooner keeps a leader's loss from stalling the store
/// for longer than an election. Sending again is safe: every request the
/// store retries either writes the same values again or is a read.
pub(crate) const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(2);

/// Runs `attempt` until it succeeds, etcd refuses it, or `timeout` has
/// passed, backing off between attempts (etcd without a leader, an
/// endpoint restarting); an attempt unanswered after [`ATTEMPT_TIMEOUT`]
/// counts as failed.
pub(crate) async fn retry<T, F, Fut>(
    operation: &'static str,
    timeout: Duration,
    mut attempt: F,
) -> Result<T, Failure>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, etcd_client::Error>>,
{
    let deadline = Instant::now() + timeout;
    let mut pause = Duration::from_millis(20);
    // An earlier attempt failed without a definite answer: it may still
    // land, so a later refusal no longer means nothing was applied.
    let mut uncertain = false;
    loop {
        let answered = tokio::time::timeout(ATTEMPT_TIMEOUT, attempt())
            .await
            .unwrap_or_else(|_| {
                Err(etcd_client::Error::IoError(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("etcd did not answer within {ATTEMPT_TIMEOUT:?}"),
                )))
            });
        match answered {
            Ok(value) => return Ok(value),
            Err(error) if is_refusal(&error) && uncertain => return Err(Failure::Unknown(error)),
            Err(error) if is_refusal(&error) => return Err(Failure::Refused(error)),
            Err(error) => {
                uncertain = true;
                if Instant::now() + pause > deadline {
                    return Err(Failure::Unknown(error));
                }
                warn!(operation, %error, "An etcd request failed; retrying.");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(1));
            }
        }
    }
}

/// Largest reply the store accepts from etcd (a page of scanned values).
const MAX_REPLY_BYTES: usize = 64 * 1024 * 1024;

/// What every job on the etcd thread shares.
pub(crate) struct Shared {
    /// The etcd client (leases, locks, watches).
    pub(crate) client: Client,
    /// Its KV client, allowed large replies.
    pub(crate) kv: KvClient,
    /// Where the store's keys live.
    pub(crate) layout: Layout,
    /// The store's settings.
    pub(crate) options: EtcdOptions,
    /// How long commits and reads take.
    pub(crate) latency: Arc<EtcdLatency>,
    /// The highest etcd revision this store has seen in an answer: every
    /// write this process knows of happened at or below it (what a commit
    /// compares its keys against, see [`writer`](super::writer)).
    pub(crate) seen_revision: AtomicI64,
}

impl Shared {
    /// Takes note of the revision an answer from etcd carried.
    pub(crate) fn saw(&self, header: Option<&etcd_client::ResponseHeader>) {
        if let Some(header) = header {
            self.saw_revision(header.revision());
        }
    }

    /// Takes note that etcd has reached `revision`.
    pub(crate) fn saw_revision(&self, revision: i64) {
        self.seen_revision.fetch_max(revision, Ordering::AcqRel);
    }
}

/// The KV client of `client`, allowed replies of [`MAX_REPLY_BYTES`].
pub(crate) fn kv_client(client: &Client) -> KvClient {
    client
        .kv_client()
        .max_decoding_message_size(MAX_REPLY_BYTES)
}

/// Shared settings for tests that build a [`Shared`] by hand.
pub(crate) fn shared(client: Client, options: EtcdOptions) -> Shared {
    Shared {
        kv: kv_client(&client),
        layout: Layout::new(&options.prefix),
        client,
        options,
        latency: Arc::default(),
        seen_revision: AtomicI64::new(0),
    }
}

/// The error of a commit whose `fence` no longer holds (`now`: the key's
/// revision, 0 if it is gone).
pub(crate) fn fenced(fence: &Fence, now: i64) -> StoreError {
    StoreError::Fenced {
        key: printable_key(&fence.key),
        expected: fence.mod_revision,
        actual: now,
    }
}

/// The error of a fence whose key lies among the store's own records.
pub(crate) fn invalid_fence(fence: &Fence) -> StoreError {
    StoreError::Etcd {
        operation: "check a fence",
        message: format!(
            "fence key {} lies under store/, the store's own records; fence on a cluster key",
            printable_key(&fence.key)
        ),
    }
}

/// After a commit kept failing for `commit_timeout`, whether etcd applied
/// it is unknown, and so is what this process's memory should hold: the
/// only safe recovery is a restart that reloads from etcd (as when sled
/// cannot fsync).
pub(crate) fn stop_process(message: &str) -> ! {
    error!(
        error = message,
        "etcd did not confirm a commit in time; stopping the process to reload from etcd on restart."
    );
    std::process::abort()
}

#[cfg(test)]
mod retry_tests {
    use super::*;

    fn status(status: tonic::Status) -> etcd_client::Error {
        etcd_client::Error::GRpcStatus(status)
    }

    /// An attempt that went unanswered may still land; a refusal of a later
    /// attempt says nothing of it, so the outcome is unknown, not "nothing
    /// was applied" (docs/storage.md: "A refused request ... fails the
    /// commit with nothing written"; an unknown one stops the process).
    #[tokio::test(start_paused = true)]
    async fn a_refusal_after_an_unanswered_attempt_leaves_the_outcome_unknown() {
        let mut attempts = 0;
        let outcome = retry("commit a batch", Duration::from_secs(60), || {
            attempts += 1;
            let first = attempts == 1;
            async move {
                if first {
                    // Held back by etcd: never answered here.
                    std::future::pending::<Result<(), etcd_client::Error>>().await
                } else {
                    Err(status(tonic::Status::permission_denied(
                        "etcdserver: permission denied",
                    )))
                }
            }
        })
        .await;
        assert_eq!(attempts, 2);
        assert!(
            matches!(outcome, Err(Failure::Unknown(_))),
            "a refusal after an unanswered attempt was taken as a definite failure"
        );
    }

    /// etcd answers "too many requests" (RESOURCE_EXHAUSTED) before it
    /// proposes anything when its apply lags its commits (load): the
    /// request is not applied and a moment later it would be. It is a
    /// failure without a definite answer about the commit's fate under
    /// load, to be retried, not a refusal that fails the commit.
    #[test]
    fn too_many_requests_is_retried_not_a_refusal() {
        assert!(!is_refusal(&status(tonic::Status::resource_exhausted(
            "etcdserver: too many requests"
        ))));
        // Out of space stays a refusal.
        assert!(is_refusal(&status(tonic::Status::resource_exhausted(
            "etcdserver: mvcc: database space exceeded"
        ))));
    }
}
