//! A broker restart (`rabbitmqctl stop_app` / `start_app` on a private node): the publisher
//! and a worker come back on their own, and nothing reported confirmed is missing.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lapin::types::FieldTable;
use rabbitkit_core::extract::Body;
use rabbitkit_core::{
    BoxError, ConnectionConfig, Envelope, Publisher, PublisherConfig, Subscriber, Worker,
};
use rabbitkit_tests::{Broker, wait_until};

const WAIT: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn publisher_and_worker_recover_after_a_broker_restart() {
    let broker = Broker::private(3);
    let vh = broker.vhost("restart");
    vh.declare_queue("sink", FieldTable::default()).await;
    let seen = Arc::new(Mutex::new(HashSet::new()));
    let s2 = seen.clone();
    let sub = Subscriber::new("orders", move |Body(b): Body| {
        let seen = s2.clone();
        async move {
            seen.lock().unwrap().insert(b.to_vec());
            Ok::<_, BoxError>(())
        }
    });
    let mut conn = ConnectionConfig::new(vh.url());
    conn.max_backoff = Duration::from_secs(1);
    let w = Worker::new(conn.clone())
        .shutdown_deadline(Duration::from_secs(5))
        .subscribe(sub)
        .start()
        .await
        .unwrap();
    let p = Publisher::new(
        conn,
        PublisherConfig {
            confirm_timeout: Duration::from_secs(3),
            ..Default::default()
        },
    )
    .unwrap();
    let mut confirmed = 0u32;
    let publish = |p: &Publisher, rk: &'static str, body: String| {
        let p = p.clone();
        async move { p.publish(Envelope::new("", rk, body)).await.unwrap() }
    };
    for i in 0..5 {
        assert!(publish(&p, "sink", format!("s{i}")).await.is_confirmed());
        confirmed += 1;
        assert!(publish(&p, "orders", format!("o{i}")).await.is_confirmed());
    }
    wait_until(WAIT, "5 orders handled", || async {
        seen.lock().unwrap().len() == 5
    })
    .await;

    broker.ctl(&["stop_app"]);
    let down = publish(&p, "sink", "while down".into()).await;
    assert!(
        !down.is_confirmed(),
        "nothing is confirmed while the broker is down: {down}"
    );
    wait_until(WAIT, "the worker notices it is not consuming", || async {
        !w.is_ready()
    })
    .await;
    broker.ctl(&["start_app"]);

    // Publishing resumes without a new publisher.
    let mut resumed = false;
    for _ in 0..30 {
        if publish(&p, "sink", "after".into()).await.is_confirmed() {
            confirmed += 1;
            resumed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(resumed, "publisher did not recover after the restart");
    // The worker consumes again without a restart of its own.
    wait_until(WAIT, "worker ready again", || async { w.is_ready() }).await;
    for i in 5..10 {
        assert!(publish(&p, "orders", format!("o{i}")).await.is_confirmed());
    }
    wait_until(WAIT, "10 distinct orders handled", || async {
        seen.lock().unwrap().len() == 10
    })
    .await;
    let st = w.shutdown().await.subscribers["orders"];
    assert!(st.acked >= 10, "{st:?}");
    // Durable queue, persistent messages: every confirmed publish survived the restart.
    let depth = vh.depth("sink").await;
    assert!(
        depth >= confirmed,
        "{confirmed} confirmed but only {depth} in the queue"
    );
}
