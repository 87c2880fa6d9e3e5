//! What every example shares: the broker URL, logging, and waiting for a subscriber's
//! counters. Not part of rabbitkit.

use std::time::{Duration, Instant};

use rabbitkit::{BoxError, SubscriberStats, WorkerHandle};

/// The broker URL: `RABBITKIT_URL`, else a local broker on the default port.
pub fn url() -> String {
    std::env::var("RABBITKIT_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}

/// Logs to stderr at `info` (`debug` with `RABBITKIT_EXAMPLE_DEBUG=1`), in colour only on a
/// terminal (scripts/examples writes it to log files).
pub fn init_logging() {
    let level = if std::env::var_os("RABBITKIT_EXAMPLE_DEBUG").is_some() {
        tracing::Level::DEBUG
    } else {
        tracing::Level::INFO
    };
    tracing_subscriber::fmt()
        .with_max_level(level)
        .with_target(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .init();
}

/// Waits until `done` holds for subscriber `name`'s counters, or fails after `timeout`
/// with the last counters seen.
pub async fn wait_for(
    worker: &WorkerHandle,
    name: &str,
    timeout: Duration,
    done: impl Fn(&SubscriberStats) -> bool,
) -> Result<SubscriberStats, BoxError> {
    let start = Instant::now();
    loop {
        let stats = worker
            .stats(name)
            .ok_or_else(|| format!("no subscriber named {name}"))?;
        if done(&stats) {
            return Ok(stats);
        }
        if start.elapsed() > timeout {
            return Err(format!("{name}: gave up after {timeout:?}; counters: {stats:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Fails with `what` unless `ok`.
pub fn check(ok: bool, what: &str) -> Result<(), BoxError> {
    if ok {
        println!("ok: {what}");
        Ok(())
    } else {
        Err(format!("check failed: {what}").into())
    }
}
