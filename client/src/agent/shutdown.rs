//! [`shutdown_signal`]: the usual shutdown future for [`Agent::run`](super::Agent::run).

/// Completes on Ctrl-C (SIGINT) or, on Unix, SIGTERM (what systemd,
/// Kubernetes and `docker stop` send): pass it to
/// [`Agent::run`](super::Agent::run) so the agent drains its operations and
/// exits cleanly.
///
/// ```no_run
/// # async fn example(agent: reconciled_client::agent::Agent) -> Result<(), reconciled_client::agent::AgentError> {
/// agent.run(reconciled_client::agent::shutdown_signal()).await
/// # }
/// ```
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut terminate) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = terminate.recv() => {}
                }
            }
            Err(error) => {
                tracing::warn!(%error, "Cannot listen for SIGTERM; only Ctrl-C stops the agent.");
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
