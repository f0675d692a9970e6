//! [`shutdown_signal`]: the usual shutdown future for [`Agent::run`](super::Agent::run).

use std::future::Future;

/// Completes on Ctrl-C (SIGINT) or, on Unix, SIGTERM (what systemd,
/// Kubernetes and `docker stop` send): pass it to
/// [`Agent::run`](super::Agent::run) so the agent drains its operations and
/// exits cleanly.
///
/// The handlers are installed when this is called, not when the future is
/// first polled: a signal that arrives in between is kept, not taken by the
/// default action (which ends the process without a drain). Call it within
/// a tokio runtime.
///
/// ```no_run
/// # async fn example(agent: reconciled_client::agent::Agent) -> Result<(), reconciled_client::agent::AgentError> {
/// agent.run(reconciled_client::agent::shutdown_signal()).await
/// # }
/// ```
pub fn shutdown_signal() -> impl Future<Output = ()> + Send + 'static {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let installed = |kind: SignalKind, name: &str| match signal(kind) {
            Ok(handler) => Some(handler),
            Err(error) => {
                tracing::warn!(%error, "Cannot listen for {name}; it will not stop the agent cleanly.");
                None
            }
        };
        let terminate = installed(SignalKind::terminate(), "SIGTERM");
        let interrupt = installed(SignalKind::interrupt(), "SIGINT");
        async move {
            tokio::select! {
                () = received(terminate) => {}
                () = received(interrupt) => {}
            }
        }
    }
    #[cfg(not(unix))]
    {
        async {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// Completes when `handler` receives its signal; never without a handler.
#[cfg(unix)]
async fn received(handler: Option<tokio::signal::unix::Signal>) {
    match handler {
        Some(mut handler) => {
            handler.recv().await;
        }
        None => std::future::pending::<()>().await,
    }
}
