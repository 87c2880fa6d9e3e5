//! The fault suite: each scenario sends N unique ids through the audited mixed workload
//! (`rabbitkit_tests::audit`), injects its fault while they flow and retry copies wait in
//! the tiers, then audits the broker: every id processed or parked with its reason, lost = 0,
//! misrouted = 0, work queue and tiers empty; duplicates are counted and printed (one
//! `AUDIT ...` line per scenario, collected in docs/RELIABILITY.md).
//!
//! Scenarios that need a node of their own use the private instances 6 (restarts, kills) and
//! 9 (alarms), one scenario at a time per instance.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rabbitkit_core::QueueType;
use rabbitkit_tests::audit::{Audit, Mix, Recorder};
use rabbitkit_tests::{Broker, Cluster, Vhost};
use tokio::sync::Mutex;

/// Restarts and kills (instance 6) and alarms (instance 9) never overlap on one node.
static NODE6: Mutex<()> = Mutex::const_new(());
static NODE9: Mutex<()> = Mutex::const_new(());
/// The cluster scenarios kill nodes of the project's cluster: one at a time.
static CLUSTER: Mutex<()> = Mutex::const_new(());

const SETTLE: Duration = Duration::from_secs(120);
const PUBLISH: Duration = Duration::from_secs(120);

fn audit(scenario: &str, vh: &Vhost, queue_type: QueueType, n: usize) -> Audit {
    Audit::new(
        scenario,
        &vh.url(),
        &vh.broker.mgmt,
        "work",
        queue_type,
        n,
        Mix::SCENARIO,
    )
}

/// A small xorshift, seeded from the clock and printed, for the random moments.
struct Rng(u64);
impl Rng {
    fn new(scenario: &str) -> Self {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
            | 1;
        println!("{scenario}: seed {seed}");
        Self(seed)
    }
    fn ms(&mut self, lo: u64, hi: u64) -> Duration {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        Duration::from_millis(lo + self.0 % (hi - lo))
    }
}

async fn connections_closed(queue_type: QueueType, name: &str) {
    let broker = Broker::from_env();
    let vh = broker.vhost(name);
    let a = audit(name, &vh, queue_type, 600);
    // A little work per delivery keeps deliveries in flight when a connection is closed.
    let mut rec = Recorder::new();
    rec.work = Duration::from_millis(5);
    let w = a.start_worker(&rec).await;
    let p = a.publisher();
    let mut rng = Rng::new(name);
    let faults = async {
        for _ in 0..5 {
            tokio::time::sleep(rng.ms(150, 1200)).await;
            vh.close_connections();
        }
    };
    tokio::join!(
        async {
            a.publish(&p, 0..300, PUBLISH).await;
            tokio::time::sleep(Duration::from_millis(500)).await;
            a.publish(&p, 300..600, PUBLISH).await;
        },
        faults
    );
    p.close(Duration::from_secs(5)).await;
    a.finish(w, &rec, SETTLE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn connections_closed_at_random_moments_lose_nothing_classic() {
    connections_closed(QueueType::Classic, "conn-close-classic").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn connections_closed_at_random_moments_lose_nothing_quorum() {
    connections_closed(QueueType::Quorum, "conn-close-quorum").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn broker_restart_with_copies_in_tiers_loses_nothing_classic() {
    let _node = NODE6.lock().await;
    let broker = Broker::private(6);
    let vh = broker.vhost("restart-classic");
    let a = audit("restart-classic", &vh, QueueType::Classic, 400);
    let rec = Recorder::new();
    let w = a.start_worker(&rec).await;
    let p = a.publisher();
    a.publish(&p, 0..400, PUBLISH).await;
    a.copies_in_tiers().await;
    broker.ctl(&["stop_app"]);
    // Down longer than the longest tier: every waiting copy is due when the node returns.
    tokio::time::sleep(Duration::from_secs(2)).await;
    broker.ctl(&["start_app"]);
    p.close(Duration::from_secs(5)).await;
    a.finish(w, &rec, SETTLE).await;
}

/// `kill -9` of the node while copies wait in the tiers, then a restart.
///
/// The topology is declared and the node restarted gracefully first. RabbitMQ registers a
/// new quorum queue's Raft member in a table it writes to disk lazily: a node killed
/// seconds after a quorum tier was declared restarts that member empty ("configured member
/// ... was not found on this node. Starting member as a new one"), and the copies in it are
/// gone (measured without this step: 72-84 of 400 lost on 3.10.8 and 4.0.5). A graceful
/// stop writes the table; in production the tiers are declared long before any crash. The
/// limit is stated in GUARANTEES.md.
async fn kill9_scenario(name: &str, queue_type: QueueType) {
    let _node = NODE6.lock().await;
    let broker = Broker::private(6);
    let vh = broker.vhost(name);
    let a = audit(name, &vh, queue_type, 400);
    a.topology()
        .declare(&a.connection())
        .await
        .unwrap_or_else(|e| panic!("declare: {e}"));
    broker.ctl(&["stop_app"]);
    broker.ctl(&["start_app"]);
    let rec = Recorder::new();
    let w = a.start_worker(&rec).await;
    let p = a.publisher();
    a.publish(&p, 0..400, PUBLISH).await;
    a.copies_in_tiers().await;
    broker.kill9();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let _ = Broker::private(6);
    p.close(Duration::from_secs(5)).await;
    a.finish(w, &rec, SETTLE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn node_killed_and_restarted_loses_nothing_classic() {
    kill9_scenario("kill9-classic", QueueType::Classic).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn node_killed_and_restarted_loses_nothing_quorum() {
    kill9_scenario("kill9-quorum", QueueType::Quorum).await;
}

/// A tier and the parking queue deleted under the running worker (an operator, a policy, a
/// broker reset): the first copies are `Returned`, their originals requeued, and the worker
/// declares its topology again, so every id is still accounted for.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tier_and_parking_deleted_while_running_are_redeclared() {
    let broker = Broker::from_env();
    let vh = broker.vhost("deleted-tier");
    let a = audit("deleted-tier-parking", &vh, QueueType::Classic, 400);
    let rec = Recorder::new();
    let w = a.start_worker(&rec).await;
    // Deleted once the consuming task has declared the topology (it does before consuming),
    // so that the worker meets them missing.
    rabbitkit_tests::wait_until(Duration::from_secs(20), "consuming", || async {
        w.is_ready()
    })
    .await;
    let t = a.topology();
    vh.delete_queue(&t.tier_queues()[0]).await;
    vh.delete_queue(&t.parking_queue()).await;
    let p = a.publisher();
    a.publish(&p, 0..400, PUBLISH).await;
    p.close(Duration::from_secs(5)).await;
    a.finish(w, &rec, SETTLE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn broker_restart_with_copies_in_tiers_loses_nothing_quorum() {
    let _node = NODE6.lock().await;
    let broker = Broker::private(6);
    let vh = broker.vhost("restart-quorum");
    let a = audit("restart-quorum", &vh, QueueType::Quorum, 400);
    let rec = Recorder::new();
    let w = a.start_worker(&rec).await;
    let p = a.publisher();
    a.publish(&p, 0..400, PUBLISH).await;
    a.copies_in_tiers().await;
    broker.ctl(&["stop_app"]);
    // The copies expire while the work queue has no leader yet: the quorum tiers
    // dead-letter at-least-once and keep them until it has one.
    tokio::time::sleep(Duration::from_secs(2)).await;
    broker.ctl(&["start_app"]);
    p.close(Duration::from_secs(5)).await;
    a.finish(w, &rec, SETTLE).await;
}

async fn alarm(name: &str, raise: &[&str], clear: &[&str]) {
    let _node = NODE9.lock().await;
    let broker = Broker::private(9);
    let vh = broker.vhost(name);
    let a = audit(name, &vh, QueueType::Classic, 400);
    let rec = Recorder::new();
    let w = a.start_worker(&rec).await;
    let p = a.publisher();
    a.publish(&p, 0..400, PUBLISH).await;
    a.copies_in_tiers().await;
    broker.ctl(raise);
    // Retry and parking publishes block: their originals must stay unacked, not be lost.
    tokio::time::sleep(Duration::from_secs(4)).await;
    broker.ctl(clear);
    p.close(Duration::from_secs(5)).await;
    a.finish(w, &rec, SETTLE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn memory_alarm_during_retry_traffic_loses_nothing() {
    alarm(
        "memory-alarm",
        &["set_vm_memory_high_watermark", "0"],
        &["set_vm_memory_high_watermark", "0.4"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn disk_alarm_during_retry_traffic_loses_nothing() {
    alarm(
        "disk-alarm",
        &["set_disk_free_limit", "1000GB"],
        &["set_disk_free_limit", "50MB"],
    )
    .await;
}

/// A worker process (`audit_worker`), recording to `record`.
fn spawn_worker(a: &Audit, record: &std::path::Path, work_ms: u64) -> Child {
    let mut c = Command::new(env!("CARGO_BIN_EXE_audit_worker"))
        .env("AUDIT_URL", &a.url)
        .env("AUDIT_QUEUE", &a.queue)
        .env(
            "AUDIT_QUEUE_TYPE",
            match a.queue_type {
                QueueType::Quorum => "quorum",
                _ => "classic",
            },
        )
        .env("AUDIT_RECORD", record)
        .env("AUDIT_PREFETCH", "50")
        .env("AUDIT_WORK_MS", work_ms.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn audit_worker");
    // Wait for its "ready" line.
    let mut out = std::io::BufReader::new(c.stdout.take().expect("stdout"));
    let mut line = String::new();
    std::io::BufRead::read_line(&mut out, &mut line).expect("read audit_worker");
    assert_eq!(line.trim(), "ready", "audit_worker did not start");
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn worker_process_killed_with_full_prefetch_window_loses_nothing() {
    let broker = Broker::from_env();
    let vh = broker.vhost("worker-kill");
    let a = audit("worker-kill9", &vh, QueueType::Classic, 600);
    let record = std::env::temp_dir().join(format!("{}.record", vh.name));
    let _ = std::fs::remove_file(&record);
    let mut first = spawn_worker(&a, &record, 50);
    let p = a.publisher();
    // Killed mid-flow: the 50-message window is full (50 ms each, 1000/s at most), copies
    // wait in the tiers and publishing still goes on.
    tokio::join!(a.publish(&p, 0..600, PUBLISH), async {
        let start = Instant::now();
        while Recorder::read_file(&record).len() < 150 {
            assert!(start.elapsed() < Duration::from_secs(60), "worker too slow");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        first.kill().expect("kill -9 the worker");
        let _ = first.wait();
    });
    let done_at_kill = Recorder::read_file(&record).len();
    let mut second = spawn_worker(&a, &record, 0);
    let quiet = a
        .wait_quiet(SETTLE, || Recorder::read_file(&record).len())
        .await;
    drop(second.stdin.take());
    let status = second.wait().expect("worker exit");
    assert!(status.success(), "the restarted worker failed: {status}");
    p.close(Duration::from_secs(5)).await;
    let report = a.audit(&Recorder::read_file(&record)).await;
    println!("worker-kill9: {done_at_kill} ids processed when the worker was killed");
    let _ = std::fs::remove_file(&record);
    report.assert_clean();
    assert!(quiet, "{report}\nthe run did not settle within {SETTLE:?}");
}

/// A cluster audit: the worker and the publisher talk to node 1, or, with `failover`, get
/// every node (node 1 first, the next one when it is lost); the quorum work queue is
/// declared through node `leader_on` first, so its leader starts there (`client-local`
/// placement).
async fn cluster_audit(
    cluster: &Cluster,
    name: &str,
    leader_on: u32,
    failover: bool,
) -> (Vhost, Audit) {
    let vh = cluster.vhost(name);
    let url = if failover {
        cluster.urls(&vh.name)
    } else {
        format!("{}/{}", cluster.node(1).amqp, vh.name)
    };
    let a = Audit::new(
        name,
        &url,
        &cluster.node(1).mgmt,
        "work",
        QueueType::Quorum,
        400,
        Mix::SCENARIO,
    );
    let via = format!("{}/{}", cluster.node(leader_on).amqp, vh.name);
    let c = lapin::Connection::connect(&via, Default::default())
        .await
        .unwrap_or_else(|e| panic!("connect to node {leader_on}: {e}"));
    let ch = c.create_channel().await.unwrap();
    rabbitkit_tests::declare_durable(&ch, "work", a.topology().work_arguments()).await;
    let _ = c.close(200, "".into()).await;
    (vh, a)
}

/// Runs on the line `scripts/test` gives the cluster to (the others skip `cluster_*`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cluster_node_killed_with_copies_in_tiers_loses_nothing() {
    let _c = CLUSTER.lock().await;
    let cluster = Cluster::ensure(3);
    // Node 1 holds the worker's connections, the tiers' leaders and the classic parking
    // queue; the work queue leads on 2. The worker is given node 1 only: the parking queue
    // lives on the node killed here, so it waits for that node rather than failing over.
    let (_vh, a) = cluster_audit(&cluster, "tier-node-kill", 2, false).await;
    let rec = Recorder::new();
    let w = a.start_worker(&rec).await;
    let p = a.publisher();
    a.publish(&p, 0..400, PUBLISH).await;
    a.copies_in_tiers().await;
    cluster.kill_node(1);
    tokio::time::sleep(Duration::from_secs(3)).await;
    cluster.start_node(1);
    p.close(Duration::from_secs(5)).await;
    a.finish(w, &rec, SETTLE).await;
}

/// Runs on the cluster line only, like the scenario above.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cluster_quorum_work_queue_leader_killed_loses_nothing() {
    let _c = CLUSTER.lock().await;
    let cluster = Cluster::ensure(3);
    // The worker holds every node's URL and connects to node 1, which also holds the
    // classic parking queue (declared there): only the work queue's leader, node 2, is
    // killed.
    let (vh, a) = cluster_audit(&cluster, "leader-kill", 2, true).await;
    let rec = Recorder::new();
    let w = a.start_worker(&rec).await;
    let leader = cluster
        .quorum_leader(&vh.name, "work")
        .expect("the work queue has a leader");
    assert_ne!(leader, 1, "the leader must not be the worker's node");
    let p = a.publisher();
    a.publish(&p, 0..400, PUBLISH).await;
    a.copies_in_tiers().await;
    cluster.kill_node(leader);
    rabbitkit_tests::wait_until(Duration::from_secs(60), "a new leader", || async {
        cluster
            .quorum_leader(&vh.name, "work")
            .is_some_and(|l| l != leader)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    cluster.start_node(leader);
    p.close(Duration::from_secs(5)).await;
    a.finish(w, &rec, SETTLE).await;
}
