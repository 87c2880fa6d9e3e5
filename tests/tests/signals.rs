//! SIGTERM drains a real worker process: `drain_worker` (`tests/src/bin/`) runs
//! `Worker::run_until_signal`; the test sends it SIGTERM with four handlers in flight.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lapin::BasicProperties;
use rabbitkit_tests::Broker;

/// Generous: the machine running the suite may be loaded.
const WAIT: Duration = Duration::from_secs(60);

type Lines = Arc<Mutex<Vec<String>>>;

/// The worker process, killed if the test fails before it exits.
struct Worker(std::process::Child);

impl Drop for Worker {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

fn collect(stream: impl std::io::Read + Send + 'static) -> Lines {
    let lines: Lines = Arc::default();
    let l = lines.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stream).lines().map_while(Result::ok) {
            l.lock().unwrap().push(line);
        }
    });
    lines
}

fn count(lines: &Lines, needle: &str) -> usize {
    lines
        .lock()
        .unwrap()
        .iter()
        .filter(|l| l.contains(needle))
        .count()
}

/// Waits until `lines` holds `n` lines containing `needle`; the panic shows both streams.
async fn wait_for(lines: &Lines, needle: &str, n: usize, out: &Lines, err: &Lines) {
    let start = Instant::now();
    while count(lines, needle) < n {
        assert!(
            start.elapsed() < WAIT,
            "timed out waiting for {n} x {needle:?}\nstdout:\n{}\nstderr:\n{}",
            out.lock().unwrap().join("\n"),
            err.lock().unwrap().join("\n")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_in_flight_handlers_and_exits_cleanly() {
    let vh = Broker::from_env().vhost("sig-drain");
    let mut worker = Worker(
        Command::new(env!("CARGO_BIN_EXE_drain_worker"))
            .env("RABBITKIT_URL", vh.url())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let child = &mut worker.0;
    let out = collect(child.stdout.take().unwrap());
    let err = collect(child.stderr.take().unwrap());
    wait_for(&err, "consuming queue=drain", 1, &out, &err).await;
    for i in 0..6 {
        vh.publish_raw(
            "",
            "drain",
            format!("m{i}").as_bytes(),
            BasicProperties::default(),
        )
        .await;
    }
    // prefetch 4: four handlers run, two messages wait in the queue.
    wait_for(&out, "handler started", 4, &out, &err).await;
    let kill = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let started = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            started.elapsed() < WAIT,
            "the worker did not exit after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // Let the reader threads take the last lines.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let stderr = err.lock().unwrap().join("\n");
    let stdout = out.lock().unwrap().join("\n");
    // Shown with --nocapture (docs/OBSERVABILITY.md quotes it).
    println!("{stderr}\n{stdout}");
    assert!(status.success(), "exit status {status}\n{stderr}");
    assert_eq!(count(&out, "handler finished"), 4, "{stdout}");
    assert!(
        stdout.contains("report consumed=4 acked=4 requeued=0"),
        "{stdout}"
    );
    for part in [
        "shutdown signal received signal=\"SIGTERM\"",
        "draining in-flight handlers in_flight=4 deadline=10s",
        "shutdown complete drained=4 stragglers_requeued=0",
    ] {
        assert!(stderr.contains(part), "{part:?} missing in:\n{stderr}");
    }
    // The connection is closed: anything unacked would be back. Only the two never
    // delivered are there.
    assert_eq!(vh.depth("drain").await, 2, "{stderr}");
}
