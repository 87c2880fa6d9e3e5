//! Parked messages survive the loss of a node: a classic parking queue of an earlier release,
//! on one node of a real 3-node cluster, is migrated into the quorum parking queue; the node
//! leading it is then killed (kill -9) and kept down, and every parked message is still
//! listed and replayed from the other nodes, and parking goes on. Runs on the cluster line
//! only (`cluster_`).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::time::Duration;

use lapin::BasicProperties;
use lapin::types::FieldTable;
use rabbitkit::cli::EXIT_OK;
use rabbitkit_core::{
    BoxError, ConnectionConfig, Parking, QueueType, RetryPolicy, Subscriber, Worker,
};
use rabbitkit_tests::{Vhost, wait_until};

const WAIT: Duration = Duration::from_secs(60);
const PARKED: u32 = 12;

/// Runs `undo` when dropped, also when the test fails: a killed node is started again.
struct Undo<F: FnMut()>(F);

impl<F: FnMut()> Drop for Undo<F> {
    fn drop(&mut self) {
        (self.0)();
    }
}

/// A quorum work queue whose handler always fails, with no retries: every message parked.
fn failing() -> Subscriber {
    Subscriber::new("orders", || async {
        Err::<(), BoxError>("ledger offline".into())
    })
    .queue_type(QueueType::Quorum)
    .retry(RetryPolicy::none())
}

/// The erlang node a queue is on (a classic queue's node, a quorum queue's leader).
fn queue_node(vh: &Vhost, queue: &str) -> Option<String> {
    let (status, body) = rabbitkit_tests::http(
        &vh.broker.mgmt,
        "GET",
        &format!("/api/queues/{}/{queue}", vh.name),
        None,
    );
    if status != 200 {
        return None;
    }
    let v: serde_json::Value = serde_json::from_str(&body).ok()?;
    v["node"].as_str().map(str::to_owned)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cluster_parked_messages_survive_the_loss_of_the_parking_queues_leader() {
    let cluster = rabbitkit_tests::Cluster::ensure(3);
    let vh = cluster.vhost("park-leader");
    // Everything before the kill goes through node 1: the classic parking queue of the
    // earlier release lives there (a classic queue is on the node that declared it).
    let vh1 = Vhost {
        broker: cluster.node(1).clone(),
        name: vh.name.clone(),
    };
    vh1.declare_queue("orders.parking", FieldTable::default())
        .await;
    let classic_node = queue_node(&vh1, "orders.parking").expect("classic parking queue");
    // The new release parks into it (it is used as it is until migrated).
    let w = Worker::new(ConnectionConfig::new(vh1.url()))
        .shutdown_deadline(Duration::from_secs(5))
        .subscribe(failing())
        .start()
        .await
        .unwrap_or_else(|e| panic!("start: {e}"));
    for i in 0..PARKED {
        let props = BasicProperties::default().with_message_id(format!("m-{i}").into());
        vh1.publish_raw("", "orders", format!("body-{i}").as_bytes(), props)
            .await;
    }
    wait_until(WAIT, "all parked in the classic queue", || async {
        vh1.depth("orders.parking").await == PARKED
    })
    .await;
    w.shutdown().await;

    let url = vh1.url();
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let args = ["rabbitkit", "parking", "migrate", "orders", "--url", &url];
    let code = rabbitkit::cli::run(args, &mut out, &mut err).await;
    let out = String::from_utf8_lossy(&out).into_owned();
    assert_eq!(code, EXIT_OK, "{out}\n{}", String::from_utf8_lossy(&err));
    // The quorum parking queue is led by the node that held the classic one (declared
    // through it, where the leader is placed by default).
    let t0 = std::time::Instant::now();
    let mut leader = cluster.quorum_leader(&vh.name, "orders.parking");
    while leader.is_none() && t0.elapsed() < WAIT {
        tokio::time::sleep(Duration::from_millis(200)).await;
        leader = cluster.quorum_leader(&vh.name, "orders.parking");
    }
    let leader = leader.expect("a leader");
    assert!(
        classic_node.contains(&format!("-{leader}@")),
        "leader {leader}, classic queue was on {classic_node}"
    );
    assert_eq!(
        cluster.quorum_online(&vh.name, "orders.parking"),
        vec![1, 2, 3],
        "replicated on every node"
    );

    let killer = cluster.clone();
    tokio::task::spawn_blocking(move || killer.kill_node(leader))
        .await
        .unwrap();
    let starter = cluster.clone();
    let guard = Undo(move || starter.start_node(leader));
    let other = (1..=3).find(|n| *n != leader).unwrap();
    let vho = Vhost {
        broker: cluster.node(other).clone(),
        name: vh.name.clone(),
    };
    wait_until(
        WAIT,
        "the parking queue available on another node",
        || async { vho.try_depth("orders.parking").await == Some(PARKED) },
    )
    .await;
    // Listed from another node: every parked message.
    let parking = Parking::new(ConnectionConfig::new(vho.url()), "orders").unwrap();
    assert_eq!(parking.count().await.unwrap(), PARKED);
    let listed = parking.peek(100).await.unwrap();
    let mut ids: Vec<String> = listed
        .iter()
        .filter_map(|m| m.message_id().map(str::to_owned))
        .collect();
    ids.sort();
    let mut want: Vec<String> = (0..PARKED).map(|i| format!("m-{i}")).collect();
    want.sort();
    assert_eq!(ids, want, "every parked message listed");
    assert!(
        listed
            .iter()
            .all(|m| m.reason.as_deref() == Some("max-attempts"))
    );
    // Parking goes on while the node is down.
    let w = Worker::new(ConnectionConfig::new(vho.url()))
        .shutdown_deadline(Duration::from_secs(5))
        .subscribe(failing())
        .start()
        .await
        .unwrap_or_else(|e| panic!("start on node {other}: {e}"));
    vho.publish_raw(
        "",
        "orders",
        b"parked meanwhile",
        BasicProperties::default(),
    )
    .await;
    wait_until(WAIT, "parked while the leader is down", || async {
        vho.depth("orders.parking").await == PARKED + 1
    })
    .await;
    let st = w.shutdown().await.subscribers["orders"];
    assert_eq!((st.parked, st.settlement_failures), (1, 0), "{st:?}");
    // Replayed from another node: every one of them, into the (quorum) work queue.
    let r = parking.replay(1000).await.unwrap();
    assert!(r.stopped.is_none(), "{r:?}");
    assert_eq!(
        (r.replayed, r.remaining),
        (u64::from(PARKED) + 1, 0),
        "{r:?}"
    );
    parking.close().await;
    assert_eq!(vho.depth("orders").await, PARKED + 1);
    let back = vho.get_all("orders", 100).await;
    let mut bodies: Vec<String> = back
        .iter()
        .map(|g| String::from_utf8_lossy(&g.body).into_owned())
        .collect();
    bodies.sort();
    let mut want: Vec<String> = (0..PARKED).map(|i| format!("body-{i}")).collect();
    want.push("parked meanwhile".into());
    want.sort();
    assert_eq!(bodies, want);
    tokio::task::spawn_blocking(move || drop(guard))
        .await
        .unwrap();
}
