//! The chaos soak (`scripts/soak`): N ids (default 50 000; 20 % transient failures, 5 %
//! poison, 2 % always failing) through two worker processes (`audit_worker`) on a private
//! node, while the connections of the vhost are closed every few seconds, the node is
//! killed (`kill -9`) and restarted once, and one worker is killed (`kill -9`) and
//! restarted. Then the audit of `rabbitkit_tests::audit`: lost (must be 0), misrouted (must
//! be 0), duplicates, throughput, peak RSS of the workers. Exits 1 when anything is lost.
//!
//! Environment: what `scripts/test` sets for the broker (`RABBITKIT_TEST_*`), `SOAK_N`,
//! `SOAK_INSTANCE` (private node instance, default 9), `SOAK_CLUSTER=1` (the project's 3-node
//! cluster instead: quorum work queue led by node 2, workers on node 1, node 1 killed). The
//! `audit_worker` binary must sit next to this one.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rabbitkit_core::QueueType;
use rabbitkit_tests::audit::{Audit, Mix, Recorder};
use rabbitkit_tests::{Broker, Cluster};

/// How long after the workers start (and declare the topology) the node may be killed.
const TOPOLOGY_SETTLE: Duration = Duration::from_secs(5);

fn worker_bin() -> PathBuf {
    let me = std::env::current_exe().expect("current exe");
    me.with_file_name("audit_worker")
}

fn spawn_worker(a: &Audit, record: &Path) -> Child {
    let queue_type = match a.queue_type {
        QueueType::Quorum => "quorum",
        _ => "classic",
    };
    let mut c = Command::new(worker_bin())
        .env("AUDIT_URL", &a.url)
        .env("AUDIT_QUEUE", &a.queue)
        .env("AUDIT_QUEUE_TYPE", queue_type)
        .env("AUDIT_RECORD", record)
        .env("AUDIT_PREFETCH", "100")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn audit_worker (build it: cargo build -p rabbitkit-tests --bins)");
    let mut out = std::io::BufReader::new(c.stdout.take().expect("stdout"));
    let mut line = String::new();
    out.read_line(&mut line).expect("read audit_worker");
    assert_eq!(line.trim(), "ready", "audit_worker did not start");
    c
}

/// Peak resident set of a process, in MiB (`VmHWM`).
fn peak_rss_mib(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map(|kb| kb / 1024.0)
        .unwrap_or(0.0)
}

/// After a restart of a single node, waits up to 30 s for each quorum queue's Raft member
/// to lead, and triggers an election for the ones that do not: RabbitMQ 3.10 was seen to
/// leave a restarted single-member quorum queue a follower for ever (no election timer),
/// holding every publish to it unconfirmed. Returns what it had to repair, to be reported.
fn elect_leaderless(broker: &Broker, vhost: &str, queues: &[String]) -> Vec<String> {
    let role = |q: &str| {
        let expr = format!("element(1, sys:get_state('{vhost}_{q}', 5000)).");
        broker
            .try_ctl_output(&["eval", &expr])
            .map(|o| o.trim().to_owned())
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut leaderless: Vec<&String> = queues.iter().collect();
    while !leaderless.is_empty() && Instant::now() < deadline {
        leaderless.retain(|q| role(q).as_deref() != Some("leader"));
        std::thread::sleep(Duration::from_millis(500));
    }
    leaderless
        .into_iter()
        .map(|q| {
            let was = role(q).unwrap_or_else(|| "unknown".into());
            let expr = format!("ra:trigger_election({{'{vhost}_{q}', node()}}).");
            let _ = broker.try_ctl(&["eval", &expr]);
            std::thread::sleep(Duration::from_secs(2));
            let now = role(q).unwrap_or_else(|| "unknown".into());
            format!(
                "quorum queue {q} was still a {was} 30 s after the node restart; \
                 election triggered, now {now}"
            )
        })
        .collect()
}

fn processed_total(records: &[PathBuf]) -> usize {
    let mut all = std::collections::HashSet::new();
    for r in records {
        all.extend(Recorder::read_file(r).into_keys());
    }
    all.len()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let n: usize = std::env::var("SOAK_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50_000);
    let instance: u32 = std::env::var("SOAK_INSTANCE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(9);
    // SOAK_CLUSTER=1: on the project cluster, a quorum work queue led by node 2, the workers
    // on node 1 (one URL each), node 1 killed once: its connections and classic tiers go.
    let cluster = (std::env::var("SOAK_CLUSTER").as_deref() == Ok("1")).then(|| Cluster::ensure(3));
    let broker = match &cluster {
        Some(c) => c.node(1).clone(),
        None => Broker::private(instance),
    };
    let vh = match &cluster {
        Some(c) => c.vhost("soak"),
        None => broker.vhost("soak"),
    };
    let url = format!("{}/{}", broker.amqp, vh.name);
    let where_ = match &cluster {
        Some(_) => "3-node cluster, workers on node 1, quorum work queue led by node 2".to_owned(),
        None => format!("private node {instance}"),
    };
    let mix = Mix {
        transient: 20,
        failing: 2,
        poison: 5,
    };
    let a = Audit::new(
        "soak",
        &url,
        &broker.mgmt,
        "work",
        if cluster.is_some() {
            QueueType::Quorum
        } else {
            QueueType::Classic
        },
        n,
        mix,
    );
    let dir = std::env::temp_dir();
    let records: Vec<PathBuf> = (0..3)
        .map(|k| dir.join(format!("{}.{k}.record", vh.name)))
        .collect();
    for r in &records {
        let _ = std::fs::remove_file(r);
    }
    println!(
        "soak: {n} ids ({}% transient, {}% failing, {}% poison) on RabbitMQ {} ({where_})",
        mix.transient,
        mix.failing,
        mix.poison,
        rabbitkit_tests::audit::broker_version(&vh.broker.mgmt)
    );
    if let Some(c) = &cluster {
        // Declared through node 2 first: its leader starts there (`client-local`).
        let via = format!("{}/{}", c.node(2).amqp, vh.name);
        let conn = lapin::Connection::connect(&via, Default::default())
            .await
            .unwrap_or_else(|e| panic!("connect to node 2: {e}"));
        let ch = conn.create_channel().await.expect("channel");
        rabbitkit_tests::declare_durable(&ch, "work", a.topology().work_arguments()).await;
        let _ = conn.close(200, "".into()).await;
    }
    let mut w0 = spawn_worker(&a, &records[0]);
    let mut w1 = spawn_worker(&a, &records[1]);
    let started = Instant::now();
    let p = a.publisher();
    let publishing = Arc::new(AtomicBool::new(true));
    let mut peak_rss = 0f64;
    let mut connection_kills = 0;
    let (mut node_killed, mut worker_killed) = (false, false);
    let mut w2: Option<Child> = None;
    let mut broker_faults: Vec<String> = Vec::new();
    let topology = a.topology();
    let quorum_queues: Vec<String> = topology
        .tier_queues()
        .into_iter()
        .filter(|_| topology.tier_queue_type == QueueType::Quorum)
        .chain((a.queue_type == QueueType::Quorum).then(|| a.queue.clone()))
        .collect();

    let publish = async {
        // In slices, so faults land while publishing too.
        let step = (n / 20).max(1);
        let mut i = 0;
        while i < n {
            a.publish(&p, i..(i + step).min(n), Duration::from_secs(300))
                .await;
            i += step;
        }
        publishing.store(false, Ordering::SeqCst);
    };
    let chaos = async {
        let mut last_close = Instant::now();
        let mut published_at: Option<Instant> = None;
        loop {
            tokio::time::sleep(Duration::from_millis(250)).await;
            let done = processed_total(&records);
            if last_close.elapsed() > Duration::from_secs(5) && done < n * 9 / 10 {
                // A failed close (the node is down) is part of the chaos, not an error.
                let _ = broker.try_ctl(&["close_all_connections", "-p", &vh.name, "soak"]);
                connection_kills += 1;
                last_close = Instant::now();
            }
            if !worker_killed && done > n * 3 / 10 {
                peak_rss = peak_rss.max(peak_rss_mib(w0.id()));
                w0.kill().expect("kill -9 worker");
                let _ = w0.wait();
                println!(
                    "  t={:>5.1}s worker 0 killed (kill -9) at {done} processed; a new one starts",
                    started.elapsed().as_secs_f64()
                );
                w2 = Some(spawn_worker(&a, &records[2]));
                worker_killed = true;
            }
            // Not within the first seconds after the workers declared the topology: a node
            // killed then may come back without a durable queue it had just declared (seen on
            // RabbitMQ 4.0.5, Mnesia: the parking queue declared 0.8 s before the kill was not
            // recovered, with the copies confirmed into it). The soak is about messages, not
            // about declarations a second old.
            if !node_killed && done > n / 2 && started.elapsed() >= TOPOLOGY_SETTLE {
                println!(
                    "  t={:>5.1}s node killed (kill -9) at {done} processed",
                    started.elapsed().as_secs_f64()
                );
                match &cluster {
                    Some(c) => {
                        c.kill_node(1);
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        c.start_node(1);
                    }
                    None => {
                        broker.kill9();
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        let _ = Broker::private(instance);
                        // Off the runtime: publishing goes on while it waits.
                        let (b, name, queues) =
                            (broker.clone(), vh.name.clone(), quorum_queues.clone());
                        broker_faults = tokio::task::spawn_blocking(move || {
                            elect_leaderless(&b, &name, &queues)
                        })
                        .await
                        .expect("leader check");
                    }
                }
                println!("  t={:>5.1}s node back", started.elapsed().as_secs_f64());
                node_killed = true;
            }
            // Chaos until most ids are through (93 % can succeed), or a minute of no publishing.
            if !publishing.load(Ordering::SeqCst) {
                let since = *published_at.get_or_insert_with(Instant::now);
                if worker_killed
                    && node_killed
                    && (done >= n * 85 / 100 || since.elapsed() > Duration::from_secs(60))
                {
                    return;
                }
            }
        }
    };
    tokio::join!(publish, chaos);
    // Killed and reaped by the chaos already; this only makes it sure on every path.
    let _ = w0.kill();
    let _ = w0.wait();
    let published_in = started.elapsed();
    // Two minutes plus 10 ms per id: a soak that has not settled by then is stuck (and a
    // failed CI run should not wait ten minutes to say so).
    let settle_limit = Duration::from_secs(120) + Duration::from_millis(10 * n as u64);
    let quiet = a
        .wait_quiet(settle_limit, || processed_total(&records))
        .await;
    let settled_in = started.elapsed();
    for w in [&mut w1].into_iter().chain(w2.as_mut()) {
        peak_rss = peak_rss.max(peak_rss_mib(w.id()));
        drop(w.stdin.take());
        let _ = w.wait();
    }
    p.close(Duration::from_secs(5)).await;
    let mut processed = std::collections::HashMap::new();
    for r in &records {
        for (id, k) in Recorder::read_file(r) {
            *processed.entry(id).or_insert(0) += k;
        }
    }
    let report = a.audit(&processed).await;
    println!(
        "soak: published in {:.1}s, settled in {:.1}s, throughput {:.0} ids/s end to end; \
         connection kills {connection_kills}, node kills 1, worker kills 1; peak RSS per worker {peak_rss:.1} MiB",
        published_in.as_secs_f64(),
        settled_in.as_secs_f64(),
        n as f64 / settled_in.as_secs_f64(),
    );
    for f in &broker_faults {
        println!("  broker fault (not rabbitkit's; see docs/BROKER-VERSIONS.md): {f}");
    }
    println!(
        "SOAK n={n} lost={} misrouted={} duplicates={} throughput={:.0}/s peak_rss_mib={peak_rss:.1} settled={} broker_faults={}",
        report.lost.len(),
        report.misrouted.len(),
        report.duplicates,
        n as f64 / settled_in.as_secs_f64(),
        quiet,
        broker_faults.len()
    );
    for r in &records {
        let _ = std::fs::remove_file(r);
    }
    drop(vh);
    report.assert_clean();
    assert!(
        quiet,
        "the soak did not settle within {} s",
        settle_limit.as_secs()
    );
}
