//! A broker restart (`rabbitmqctl stop_app` / `start_app` on a private node): the publisher
//! and a worker come back on their own, and nothing reported confirmed is missing.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lapin::types::FieldTable;
use rabbitkit_core::extract::Body;
use rabbitkit_core::{
    BoxError, ConnectionConfig, Envelope, Publisher, PublisherConfig, QueueType, RetryPolicy,
    Subscriber, Worker,
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

/// Retry copies waiting in the delay tiers of a quorum work queue across a broker restart
/// (`stop_app`, longer than the tier delay, `start_app`), through a real worker: how many of
/// the `n` ids (each failing once, then succeeding from the tier) are never processed.
///
/// The copies are all due when the node starts. A classic tier expires them at once, before
/// the quorum work queue has elected its leader, and dead-letters at-most-once: the broker
/// logs `leader cast - leader not known. Command is dropped` and the copy is gone, its
/// original long acked. A quorum tier dead-letters at-least-once and keeps each copy until
/// the work queue has confirmed it.
async fn lost_across_a_restart(broker: &Broker, tier_type: QueueType, n: usize) -> usize {
    let vh = broker.vhost("restart-tiers");
    let tier = Duration::from_secs(3);
    let failed = Arc::new(Mutex::new(HashSet::new()));
    let done = Arc::new(Mutex::new(HashSet::new()));
    let (f2, d2) = (failed.clone(), done.clone());
    let sub = Subscriber::new("orders", move |Body(b): Body| {
        let (failed, done) = (f2.clone(), d2.clone());
        async move {
            if failed.lock().unwrap().insert(b.to_vec()) {
                return Err::<(), BoxError>("first attempt fails".into());
            }
            done.lock().unwrap().insert(b.to_vec());
            Ok(())
        }
    })
    .queue_type(QueueType::Quorum)
    .tier_queue_type(tier_type)
    .retry(RetryPolicy::new([tier]).max_attempts(10));
    let mut conn = ConnectionConfig::new(vh.url());
    conn.max_backoff = Duration::from_secs(1);
    let w = Worker::new(conn.clone())
        .shutdown_deadline(Duration::from_secs(5))
        .subscribe(sub)
        .start()
        .await
        .unwrap();
    let p = Publisher::new(conn, PublisherConfig::default()).unwrap();
    for i in 0..n {
        let c = p
            .publish(Envelope::new("", "orders", format!("id-{i}")))
            .await
            .unwrap();
        assert!(c.is_confirmed(), "{c}");
    }
    // Every original acked after its retry copy was confirmed into the tier.
    wait_until(
        WAIT,
        "every id failed once, its copy in the tier",
        || async { w.stats("orders").unwrap().retried >= n as u64 },
    )
    .await;
    assert!(done.lock().unwrap().is_empty(), "the tier delay ran out");
    broker.ctl(&["stop_app"]);
    // Down longer than the delay: every copy is due when the node starts.
    tokio::time::sleep(tier + Duration::from_secs(1)).await;
    broker.ctl(&["start_app"]);
    wait_until(WAIT, "worker ready again", || async { w.is_ready() }).await;
    // Whatever survived comes through within a few delays.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while done.lock().unwrap().len() < n && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    p.close(Duration::from_secs(5)).await;
    w.shutdown().await;
    n - done.lock().unwrap().len()
}

/// The regression behind quorum tiers (issue 14).
///
/// The same run with the classic opt-in (`lost_across_a_restart(&broker, QueueType::Classic,
/// 200)`), measured on 2026-12-04 on this harness: RabbitMQ 3.10.8 lost 44, 63 and 169 of
/// 200; 4.0.5 lost 200, 195 and 0 of 200. The loss depends on whether the classic tier expires
/// its copies before the work queue's leader is elected, so it is not deterministic and is
/// not kept as a test; the risk is documented with the opt-in (docs/RETRY-AND-PARKING.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn quorum_tiers_lose_nothing_across_a_restart_of_a_quorum_work_queue() {
    let broker = Broker::private(4);
    let lost = lost_across_a_restart(&broker, QueueType::Quorum, 200).await;
    assert_eq!(lost, 0, "{lost} of 200 retry copies lost");
}
