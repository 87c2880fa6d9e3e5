//! The project cluster (`scripts/broker cluster ...`) and its test handle: a 3-node cluster
//! forms, a quorum queue keeps its confirmed messages when its leader's VM is killed, another
//! node takes the lead, and the killed node rejoins with its data.
//!
//! The cluster is started through the script when it is not running (about 25-45 s); the test
//! itself takes seconds after that. `scripts/test` runs it on one broker line (see
//! docs/BROKER-VERSIONS.md); by hand, it uses the version in `RABBITKIT_TEST_VERSION`.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::time::{Duration, Instant};

use lapin::BasicProperties;
use lapin::options::QueueDeclareOptions;
use lapin::types::AMQPValue;
use rabbitkit_tests::{Cluster, http, table, wait_until};

async fn publish_confirmed(url: &str, queue: &str, bodies: impl Iterator<Item = String>) {
    let messages = bodies.map(|b| (b.into_bytes(), BasicProperties::default()));
    rabbitkit_tests::publish_confirmed(url, "", queue, messages).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_forms_and_a_quorum_queue_fails_over() {
    let cluster = Cluster::ensure(3);
    let t0 = Instant::now();

    // Every node sees three running members.
    for b in &cluster.nodes {
        let (status, body) = http(&b.mgmt, "GET", "/api/nodes", None);
        assert_eq!(status, 200, "nodes on {}: {body}", b.mgmt);
        let nodes: serde_json::Value = serde_json::from_str(&body).unwrap();
        let running = nodes
            .as_array()
            .unwrap()
            .iter()
            .filter(|n| n["running"].as_bool() == Some(true))
            .count();
        assert_eq!(
            running, 3,
            "{} sees {running} running nodes: {body}",
            b.mgmt
        );
    }

    let mut vhost = cluster.vhost("cluster");
    let q = "failover.qq";
    let c = vhost.connect().await;
    let ch = c.create_channel().await.unwrap();
    ch.queue_declare(
        q.into(),
        QueueDeclareOptions {
            durable: true,
            ..Default::default()
        },
        table(&[("x-queue-type", AMQPValue::LongString("quorum".into()))]),
    )
    .await
    .unwrap();
    let _ = c.close(200, "".into()).await;

    let mut leader = None;
    wait_until(
        Duration::from_secs(20),
        "a leader for the quorum queue",
        || {
            leader = cluster.quorum_leader(&vhost.name, q);
            std::future::ready(leader.is_some())
        },
    )
    .await;
    let old = leader.unwrap();
    wait_until(Duration::from_secs(20), "all three members online", || {
        std::future::ready(cluster.quorum_online(&vhost.name, q) == vec![1, 2, 3])
    })
    .await;

    // Confirmed before the kill: a quorum confirm means a majority has it.
    let other = old % 3 + 1;
    let other_url = format!("{}/{}", cluster.node(other).amqp, vhost.name);
    publish_confirmed(&other_url, q, (0..20).map(|i| format!("before-{i}"))).await;

    let killed_at = Instant::now();
    cluster.kill_node(old);
    vhost.use_node(cluster.node(other));
    let mut new_leader = None;
    wait_until(
        Duration::from_secs(30),
        "a new leader on a surviving node",
        || {
            new_leader = cluster.quorum_leader(&vhost.name, q);
            std::future::ready(matches!(new_leader, Some(n) if n != old))
        },
    )
    .await;
    let failover = killed_at.elapsed();

    // The queue takes new work on the new majority, and nothing confirmed was lost.
    publish_confirmed(&other_url, q, (0..5).map(|i| format!("after-{i}"))).await;
    let got = vhost.get_all(q, 100).await;
    let mut bodies: Vec<String> = got
        .iter()
        .map(|g| String::from_utf8_lossy(&g.body).into_owned())
        .collect();
    bodies.sort();
    let mut want: Vec<String> = (0..20)
        .map(|i| format!("before-{i}"))
        .chain((0..5).map(|i| format!("after-{i}")))
        .collect();
    want.sort();
    assert_eq!(bodies, want, "messages after the leader's node was killed");

    // The killed node boots with its data and its member catches up.
    cluster.start_node(old);
    wait_until(
        Duration::from_secs(30),
        "the restarted member back online",
        || std::future::ready(cluster.quorum_online(&vhost.name, q) == vec![1, 2, 3]),
    )
    .await;
    eprintln!(
        "cluster {}: leader {old} killed, node {} leads after {failover:?}; test took {:?}",
        cluster.version,
        new_leader.unwrap(),
        t0.elapsed()
    );
}
