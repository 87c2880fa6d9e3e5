//! A worker on a real 3-node cluster whose node is killed (kill -9) under it, with a quorum
//! work queue and a classic parking queue on the killed node (an earlier release's, used as
//! it is until migrated; the parking queue rabbitkit declares now is quorum, see
//! `cluster_parking.rs`): the worker fails over to
//! another node, consumes everything published after the kill although its parking queue is
//! unavailable (its declaration is bounded, then given up: RabbitMQ 4.3 answers it only
//! after 75 s), and the messages it must park meanwhile are nacked by the broker, requeued,
//! and parked once the node is back: nothing lost. Runs on the cluster line only (`cluster_`).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rabbitkit_core::extract::Body;
use rabbitkit_core::{BoxError, ConnectionConfig, RetryPolicy, Subscriber, Worker};
use rabbitkit_tests::{Broker, wait_until};

const WAIT: Duration = Duration::from_secs(30);

/// Runs `undo` when dropped, also when the test fails: a killed node is started again.
struct Undo<F: FnMut()>(F);

impl<F: FnMut()> Drop for Undo<F> {
    fn drop(&mut self) {
        (self.0)();
    }
}

/// The erlang node (`rkc4-1@localhost`) a connection named `name` is on, in `vhost`.
fn connection_node(b: &Broker, vhost: &str, name: &str) -> Option<String> {
    let (status, body) = rabbitkit_tests::http(
        &b.mgmt,
        "GET",
        &format!("/api/vhosts/{vhost}/connections"),
        None,
    );
    if status != 200 {
        return None;
    }
    let v: serde_json::Value = serde_json::from_str(&body).ok()?;
    v.as_array()?
        .iter()
        .find(|c| c["client_properties"]["connection_name"].as_str() == Some(name))
        .and_then(|c| c["node"].as_str().map(str::to_owned))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cluster_worker_survives_the_kill_of_its_node_and_of_its_parking_queue() {
    let cluster = rabbitkit_tests::Cluster::ensure(3);
    let vh = cluster.vhost("nodes-cluster");
    // The classic parking queue of an earlier release, on node 1 (declared through it).
    let vh1 = rabbitkit_tests::Vhost {
        broker: cluster.node(1).clone(),
        name: vh.name.clone(),
    };
    vh1.declare_queue("orders.parking", Default::default())
        .await;
    let urls = rabbitkit_core::connection::split_url_list(&cluster.urls(&vh.name));
    let mut cfg = ConnectionConfig::nodes(urls);
    cfg.max_backoff = Duration::from_millis(500);
    cfg.connect_timeout = Duration::from_secs(3);
    let seen = Arc::new(Mutex::new(std::collections::HashSet::new()));
    let s2 = seen.clone();
    let sub = Subscriber::new("orders", move |Body(b): Body| {
        let seen = s2.clone();
        async move {
            let id = String::from_utf8_lossy(&b).into_owned();
            if id.starts_with("bad-") {
                return Err(BoxError::from("bad message"));
            }
            seen.lock().unwrap().insert(id);
            Ok::<_, BoxError>(())
        }
    })
    .queue_type(rabbitkit_core::QueueType::Quorum)
    .retry(RetryPolicy::new([Duration::from_millis(200)]).max_attempts(2));
    let w = Worker::new(cfg)
        .shutdown_deadline(Duration::from_secs(5))
        .subscribe(sub)
        .start()
        .await
        .unwrap_or_else(|e| panic!("start: {e}"));
    wait_until(WAIT, "ready", || async { w.is_ready() }).await;
    // In order: the worker is on node 1 (the management API lists connections after its
    // next stats round, up to 5 s).
    wait_until(WAIT, "the consumer listed on node 1", || async {
        connection_node(cluster.node(2), &vh.name, "rabbitkit-consumer")
            .is_some_and(|n| n.contains("-1@"))
    })
    .await;
    let vh2 = rabbitkit_tests::Vhost {
        broker: cluster.node(2).clone(),
        name: vh.name.clone(),
    };
    for i in 0..20 {
        vh2.publish_raw(
            "",
            "orders",
            format!("id-{i}").as_bytes(),
            Default::default(),
        )
        .await;
    }
    wait_until(WAIT, "20 handled on node 1", || async {
        seen.lock().unwrap().len() == 20
    })
    .await;
    let killer = cluster.clone();
    tokio::task::spawn_blocking(move || killer.kill_node(1))
        .await
        .unwrap();
    let starter = cluster.clone();
    let mut guard = Some(Undo(move || starter.start_node(1)));
    {
        for i in 20..40 {
            vh2.publish_raw(
                "",
                "orders",
                format!("id-{i}").as_bytes(),
                Default::default(),
            )
            .await;
        }
        // To be parked while the parking queue is down: the broker nacks their copies.
        for i in 0..3 {
            vh2.publish_raw(
                "",
                "orders",
                format!("bad-{i}").as_bytes(),
                Default::default(),
            )
            .await;
        }
        let t0 = Instant::now();
        while seen.lock().unwrap().len() < 40 && t0.elapsed() < Duration::from_secs(45) {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let handled = seen.lock().unwrap().len();
        assert_eq!(
            handled,
            40,
            "after the kill: ready {}, stats {:?}, queue {:?}, consumer on {:?}",
            w.is_ready(),
            w.stats("orders"),
            vh2.try_depth("orders").await,
            connection_node(cluster.node(2), &vh.name, "rabbitkit-consumer")
        );
        assert!(w.is_ready());
        wait_until(WAIT, "the consumer listed on another node", || async {
            connection_node(cluster.node(2), &vh.name, "rabbitkit-consumer")
                .is_some_and(|n| !n.contains("-1@"))
        })
        .await;
        wait_until(
            WAIT,
            "a parking copy refused while its node is down",
            || async { w.stats("orders").is_some_and(|s| s.settlement_failures > 0) },
        )
        .await;
        assert_eq!(w.stats("orders").unwrap().parked, 0);
    }
    let guard = guard.take();
    tokio::task::spawn_blocking(move || drop(guard))
        .await
        .unwrap();
    wait_until(
        Duration::from_secs(60),
        "the 3 bad messages parked once the node is back",
        || async { vh2.try_depth("orders.parking").await == Some(3) },
    )
    .await;
    wait_until(WAIT, "work queue empty", || async {
        vh2.try_depth("orders").await == Some(0)
    })
    .await;
    assert_eq!(seen.lock().unwrap().len(), 40, "every good id handled");
    let r = w.shutdown().await;
    eprintln!("cluster failover: {:?}", r.subscribers["orders"]);
}
