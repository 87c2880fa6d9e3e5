//! A worker process for the SIGTERM test (`tests/tests/signals.rs`): consumes `drain` at
//! `RABBITKIT_URL` with 4 handlers at once, each taking 1.5 s, and runs until SIGINT or
//! SIGTERM (`Worker::run_until_signal`). Logs go to stderr; the final report to stdout.
//!
//! Run with: `RABBITKIT_URL=amqp://guest:guest@127.0.0.1:5680/%2f cargo run -p rabbitkit-tests --bin drain_worker`

use std::process::ExitCode;
use std::time::Duration;

use rabbitkit_core::{BoxError, ConnectionConfig, Subscriber, Worker};

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_ansi(false)
        .with_writer(std::io::stderr)
        .init();
    let Ok(url) = std::env::var("RABBITKIT_URL") else {
        eprintln!("drain_worker: RABBITKIT_URL is not set");
        return ExitCode::from(2);
    };
    let sub = Subscriber::new("drain", || async {
        println!("handler started");
        tokio::time::sleep(Duration::from_millis(1500)).await;
        println!("handler finished");
        Ok::<_, BoxError>(())
    })
    .prefetch(4)
    .concurrency(4);
    let report = Worker::new(ConnectionConfig::new(url))
        .shutdown_deadline(Duration::from_secs(10))
        .subscribe(sub)
        .run_until_signal()
        .await;
    match report {
        Ok(r) => {
            let s = r.subscribers["drain"];
            println!(
                "report consumed={} acked={} requeued={}",
                s.consumed, s.acked, s.requeued
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("drain_worker: {e}");
            ExitCode::FAILURE
        }
    }
}
