//! A worker process for the audits that kill a worker (`kill -9`): the audited subscriber
//! of `rabbitkit_tests::audit`, recording processed ids to a file.
//!
//! Environment: `AUDIT_URL` (vhost URL; several comma-separated for a cluster), `AUDIT_QUEUE`, `AUDIT_QUEUE_TYPE` (`classic` |
//! `quorum`), `AUDIT_RECORD` (file the processed ids are appended to), `AUDIT_PREFETCH`
//! (default 50), `AUDIT_WORK_MS` (handler time per delivery, default 0). Prints `ready`
//! once consuming; shuts down gracefully when its stdin closes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Read;
use std::path::PathBuf;
use std::time::Duration;

use rabbitkit_core::{QueueType, Worker};
use rabbitkit_tests::audit::{Recorder, subscriber};

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set"))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let queue_type = match env("AUDIT_QUEUE_TYPE").as_str() {
        "quorum" => QueueType::Quorum,
        _ => QueueType::Classic,
    };
    let prefetch = std::env::var("AUDIT_PREFETCH")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50);
    let mut rec = Recorder::to_file(&PathBuf::from(env("AUDIT_RECORD"))).expect("record file");
    rec.work = Duration::from_millis(
        std::env::var("AUDIT_WORK_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0),
    );
    let mut conn = rabbitkit_core::ConnectionConfig::nodes(
        rabbitkit_core::connection::split_url_list(&env("AUDIT_URL")),
    );
    conn.max_backoff = Duration::from_secs(1);
    conn.connect_timeout = Duration::from_secs(5);
    let w = Worker::new(conn)
        .shutdown_deadline(Duration::from_secs(10))
        .subscribe(subscriber(&env("AUDIT_QUEUE"), queue_type, prefetch, rec))
        .start()
        .await
        .unwrap_or_else(|e| panic!("worker start: {e}"));
    while !w.is_ready() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!("ready");
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    std::thread::spawn(move || {
        let mut sink = Vec::new();
        let _ = std::io::stdin().read_to_end(&mut sink);
        let _ = tx.send(());
    });
    let _ = rx.await;
    let report = w.shutdown().await;
    eprintln!("audit_worker stopped: {:?}", report.subscribers);
}
