//! The process signals a worker stops on.

/// Resolves on the first SIGINT (Ctrl-C) or SIGTERM (what systemd, Docker and Kubernetes
/// send to stop a service), and logs which one arrived. On platforms without SIGTERM, on
/// Ctrl-C only.
///
/// ```no_run
/// # async fn run(worker: rabbitkit_core::Worker) -> rabbitkit_core::Result<()> {
/// let report = worker.run_until(rabbitkit_core::shutdown_signal()).await?;
/// # Ok(()) }
/// ```
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                let name = tokio::select! {
                    _ = term.recv() => "SIGTERM",
                    r = tokio::signal::ctrl_c() => ctrl_c_result(r),
                };
                tracing::info!(signal = name, "shutdown signal received");
                return;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM; stopping on Ctrl-C only");
            }
        }
    }
    let name = ctrl_c_result(tokio::signal::ctrl_c().await);
    tracing::info!(signal = name, "shutdown signal received");
}

fn ctrl_c_result(r: std::io::Result<()>) -> &'static str {
    match r {
        Ok(()) => "SIGINT",
        Err(e) => {
            // Without a handler the future would never resolve: stop now rather than never.
            tracing::warn!(error = %e, "cannot listen for Ctrl-C; shutting down");
            "none (listener failed)"
        }
    }
}
