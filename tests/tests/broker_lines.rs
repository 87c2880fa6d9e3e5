//! Behaviour that differs between the broker lines (3.10, 4.0, 4.3) and how rabbitkit
//! handles it: broker-cancelled consumers, quorum queue delivery counters, arguments 4.3
//! refuses. Each test runs on every line; where a line behaves differently the test says
//! which and why (docs/BROKER-VERSIONS.md has the table).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lapin::BasicProperties;
use lapin::types::AMQPValue;
use rabbitkit_core::extract::{Body, Redelivered};
use rabbitkit_core::headers::Attempt;
use rabbitkit_core::{ConnectionConfig, Error, Outcome, QueueType, Subscriber, Worker};
use rabbitkit_tests::{Broker, Vhost, http, wait_until};

const WAIT: Duration = Duration::from_secs(20);

fn queue_json(vh: &Vhost, q: &str) -> serde_json::Value {
    let (status, body) = http(
        &vh.broker.mgmt,
        "GET",
        &format!("/api/queues/{}/{q}", vh.name),
        None,
    );
    assert_eq!(status, 200, "queue {q}: {body}");
    serde_json::from_str(&body).unwrap()
}

fn consumers(vh: &Vhost, q: &str) -> u64 {
    queue_json(vh, q)["consumers"].as_u64().unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_queue_under_a_running_worker_is_redeclared_and_consumed_again() {
    let broker = Broker::from_env();
    let vh = broker.vhost("lines-deleted");
    let effects = Arc::new(AtomicU32::new(0));
    let e = effects.clone();
    let sub = Subscriber::new("orders", move || {
        e.fetch_add(1, Ordering::SeqCst);
        async { Outcome::Ack }
    });
    let w = vh.start_worker(sub).await;
    vh.publish_raw("", "orders", b"one", BasicProperties::default())
        .await;
    wait_until(WAIT, "the first message handled", || {
        std::future::ready(effects.load(Ordering::SeqCst) == 1)
    })
    .await;

    // The broker cancels the consumer (basic.cancel) when its queue goes.
    let deleted = Instant::now();
    vh.delete_queue("orders").await;
    wait_until(
        Duration::from_secs(10),
        "the queue declared again",
        || async { vh.try_depth("orders").await.is_some() },
    )
    .await;
    vh.publish_raw("", "orders", b"two", BasicProperties::default())
        .await;
    wait_until(WAIT, "the message on the new queue handled", || {
        std::future::ready(effects.load(Ordering::SeqCst) == 2)
    })
    .await;
    let resubscribed = deleted.elapsed();
    assert!(
        resubscribed < Duration::from_secs(5),
        "consuming again only {resubscribed:?} after the queue was deleted"
    );
    let stats = w.stats("orders").unwrap();
    assert_eq!((stats.consumed, stats.acked, stats.ack_lost), (2, 2, 0));
    w.shutdown().await;
    eprintln!(
        "RabbitMQ {}: a message on the re-declared queue handled {resubscribed:?} after the delete",
        broker.version
    );
}

/// 4.3 cancels a quorum queue's consumer whose delivery outlives `x-consumer-timeout`.
/// The delivery in flight then settles on its own (still open) channel, the worker
/// subscribes again on a new channel within seconds, and nothing is left unacked.
/// 4.0 checks consumer timeouts only once a minute (and closes the channel instead), 3.10
/// ignores the argument: on those lines the test checks that the argument is accepted and
/// work flows, without a slow handler.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_cancelled_by_a_quorum_consumer_timeout_resubscribes_without_a_stale_ack() {
    let broker = Broker::from_env();
    let on_43 = broker.version == "4.3";
    let vh = broker.vhost("lines-timeout");
    let runs = Arc::new(Mutex::new(Vec::<(String, bool, Instant)>::new()));
    let slow_done = Arc::new(AtomicBool::new(false));
    let (r, done) = (runs.clone(), slow_done.clone());
    let sub = Subscriber::new(
        "jobs",
        move |Body(body): Body, Redelivered(again): Redelivered| {
            let (r, done) = (r.clone(), done.clone());
            async move {
                let body = String::from_utf8_lossy(&body).into_owned();
                r.lock()
                    .unwrap()
                    .push((body.clone(), again, Instant::now()));
                if body == "slow" && !again && on_43 {
                    // Outlives the 1 s consumer timeout.
                    tokio::time::sleep(Duration::from_secs(4)).await;
                    done.store(true, Ordering::SeqCst);
                }
                Outcome::Ack
            }
        },
    )
    .queue_type(QueueType::Quorum)
    .prefetch(4)
    .consumer_timeout(Duration::from_secs(1))
    // The default deadline (half the consumer timeout) would cut the slow handler before
    // the broker's timeout: this case needs a handler that outlives it.
    .no_deadline();
    let w = vh.start_worker(sub).await;
    let started = Instant::now();
    vh.publish_raw("", "jobs", b"slow", BasicProperties::default())
        .await;
    if on_43 {
        // Cancelled after ~1 s; a new consumer must take new work while "slow" still runs.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        vh.publish_raw("", "jobs", b"fast", BasicProperties::default())
            .await;
        wait_until(Duration::from_secs(10), "fast handled", || {
            std::future::ready(runs.lock().unwrap().iter().any(|(b, ..)| b == "fast"))
        })
        .await;
        assert!(
            !slow_done.load(Ordering::SeqCst),
            "fast was handled only after the slow handler finished: no re-subscribe while it ran"
        );
    } else {
        vh.publish_raw("", "jobs", b"fast", BasicProperties::default())
            .await;
    }
    wait_until(WAIT, "every message settled", || {
        let q = queue_json(&vh, "jobs");
        let settled =
            q["messages"].as_u64() == Some(0) && q["messages_unacknowledged"].as_u64() == Some(0);
        let seen = runs.lock().unwrap().iter().any(|(b, ..)| b == "fast");
        std::future::ready(settled && seen && (!on_43 || slow_done.load(Ordering::SeqCst)))
    })
    .await;
    wait_until(Duration::from_secs(10), "one consumer on the queue", || {
        std::future::ready(consumers(&vh, "jobs") == 1)
    })
    .await;
    let stats = w.stats("jobs").unwrap();
    let runs = runs.lock().unwrap().clone();
    let slow_runs = runs.iter().filter(|(b, ..)| b == "slow").count();
    // Every ack found its channel: the timed-out delivery was acked on the channel it
    // came from, which was kept open until it settled.
    assert_eq!(stats.ack_lost, 0, "{stats:?}");
    assert_eq!(stats.acked, stats.consumed, "{stats:?}");
    if on_43 {
        // 4.3 returns the timed-out message to the queue, so the new consumer may get it
        // again (at-least-once: a visible redelivery) while the first run still holds it.
        assert!((1..=2).contains(&slow_runs), "{runs:?}");
    } else {
        assert_eq!(slow_runs, 1, "{runs:?}");
    }
    w.shutdown().await;
    eprintln!(
        "RabbitMQ {}: slow ran {slow_runs}x, {stats:?}, {:?} in all",
        broker.version,
        started.elapsed()
    );
}

/// `x-delivery-count` and `x-acquired-count` after two requeues of a message in a quorum
/// queue. rabbitkit requeues with `basic.reject`, which every line counts in
/// `x-delivery-count` (4.3 leaves `basic.nack` requeues out of it, and out of the delivery
/// limit); only 4.3 adds `x-acquired-count`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quorum_delivery_and_acquired_counts_are_exposed_after_requeues() {
    let broker = Broker::from_env();
    let vh = broker.vhost("lines-counts");
    let seen = Arc::new(Mutex::new(Vec::<(Option<i64>, Option<i64>)>::new()));
    let s = seen.clone();
    let sub = Subscriber::new("counted", move |a: Attempt| {
        let s = s.clone();
        async move {
            let n = {
                let mut s = s.lock().unwrap();
                s.push((a.delivery_count, a.acquired_count));
                s.len()
            };
            if n < 3 {
                Outcome::Requeue
            } else {
                Outcome::Ack
            }
        }
    })
    .queue_type(QueueType::Quorum);
    let w = vh.start_worker(sub).await;
    vh.publish_raw("", "counted", b"x", BasicProperties::default())
        .await;
    wait_until(WAIT, "three runs", || {
        std::future::ready(seen.lock().unwrap().len() == 3)
    })
    .await;
    w.shutdown().await;
    let seen = seen.lock().unwrap().clone();
    eprintln!(
        "RabbitMQ {}: (x-delivery-count, x-acquired-count) per run: {seen:?}",
        broker.version
    );
    let delivery: Vec<_> = seen.iter().map(|c| c.0.unwrap_or(0)).collect();
    let acquired: Vec<_> = seen.iter().map(|c| c.1).collect();
    assert_eq!(delivery, [0, 1, 2], "every requeue counts: {seen:?}");
    if broker.version == "4.3" {
        assert_eq!(acquired, [None, Some(1), Some(2)], "{seen:?}");
    } else {
        assert_eq!(acquired, [None, None, None], "{seen:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn classic_queue_v1_arguments_are_refused_at_start_naming_the_argument() {
    let vh = Broker::from_env().vhost("lines-cqv1");
    for (k, v) in [
        ("x-queue-mode", AMQPValue::LongString("lazy".into())),
        ("x-queue-version", AMQPValue::LongInt(1)),
    ] {
        let sub = Subscriber::new("orders", || async { Outcome::Ack }).queue_argument(k, v);
        let err = Worker::new(ConnectionConfig::new(vh.url()))
            .subscribe(sub)
            .start()
            .await
            .unwrap_err();
        match &err {
            Error::QueueArgument {
                queue, argument, ..
            } => assert_eq!((queue.as_str(), argument.as_str()), ("orders", k)),
            other => panic!("{k}: expected QueueArgument, got {other}"),
        }
        assert!(err.to_string().contains(k), "{err}");
        assert_eq!(vh.try_depth("orders").await, None, "nothing was declared");
    }
}
