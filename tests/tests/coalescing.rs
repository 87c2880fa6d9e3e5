//! Ack coalescing against a real broker: a multiple ack never covers a failure, a requeue or
//! a delivery still being handled; held acks are flushed by count, by time and at shutdown;
//! held acks lost with their connection come back as redeliveries.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lapin::BasicProperties;
use rabbitkit_core::extract::{Json, Redelivered};
use rabbitkit_core::headers::Attempt;
use rabbitkit_core::{ConnectionConfig, Outcome, QueueType, RetryPolicy, Subscriber, Worker};
use rabbitkit_tests::proxy::{Mode, Proxy};
use rabbitkit_tests::{Broker, Vhost, publish_confirmed, wait_until};

const WAIT: Duration = Duration::from_secs(30);

#[derive(serde::Deserialize)]
struct Order {
    id: u32,
}

/// Publishes `{"id":N}` (message id `id-N`, persistent, confirmed) for every id on one
/// connection.
async fn publish_ids(vh: &Vhost, queue: &str, ids: impl IntoIterator<Item = u32>) {
    let messages = ids.into_iter().map(|id| {
        (
            format!(r#"{{"id":{id}}}"#).into_bytes(),
            BasicProperties::default()
                .with_content_type("application/json".into())
                .with_message_id(format!("id-{id}").into()),
        )
    });
    publish_confirmed(&vh.url(), "", queue, messages).await;
}

/// A worker for `s` on `url` (shutdown deadline 5 s).
async fn start(url: String, s: Subscriber) -> rabbitkit_core::WorkerHandle {
    Worker::new(ConnectionConfig::new(url))
        .shutdown_deadline(Duration::from_secs(5))
        .subscribe(s)
        .start()
        .await
        .unwrap_or_else(|e| panic!("worker start: {e}"))
}

/// What the mixed workload does with an id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    /// Parked on its first run.
    Park,
    /// Fails its first attempt (a retry copy), succeeds from the tier.
    RetryOnce,
    /// Requeued on its first run, succeeds on the redelivery.
    RequeueOnce,
    Succeed,
}

fn fate(id: u32) -> Fate {
    if id.is_multiple_of(13) {
        Fate::Park
    } else if id.is_multiple_of(7) {
        Fate::RetryOnce
    } else if id.is_multiple_of(11) {
        Fate::RequeueOnce
    } else {
        Fate::Succeed
    }
}

/// Successes, retry copies, requeues and parked messages interleaved on one channel with 8
/// handlers finishing out of order: every id succeeds exactly once or is parked, exactly as
/// without coalescing. A multiple ack covering a requeue or a failure in progress would ack
/// it (the id never succeeds, or is missing from parking); a stale or doubled ack would close
/// the channel (`ack_lost`, redeliveries, ids run twice).
async fn mixed_outcomes_settle_as_without_coalescing(queue_type: QueueType, hint: &str) {
    const N: u32 = 300;
    let vh = Broker::from_env().vhost(hint);
    let successes: Arc<Mutex<HashMap<u32, u32>>> = Arc::default();
    let requeued: Arc<Mutex<HashSet<u32>>> = Arc::default();
    let (s2, r2) = (successes.clone(), requeued.clone());
    let sub = Subscriber::new("orders", move |Json(o): Json<Order>, attempt: Attempt| {
        let (successes, requeued) = (s2.clone(), r2.clone());
        async move {
            // Handlers finish out of order.
            tokio::time::sleep(Duration::from_millis(u64::from(o.id * 7 % 5))).await;
            match fate(o.id) {
                Fate::Park => return Outcome::Park("never valid".into()),
                Fate::RetryOnce if attempt.number == 1 => return Outcome::retry("flaky"),
                Fate::RequeueOnce if requeued.lock().unwrap().insert(o.id) => {
                    return Outcome::Requeue;
                }
                _ => {}
            }
            *successes.lock().unwrap().entry(o.id).or_default() += 1;
            Outcome::Ack
        }
    })
    .queue_type(queue_type)
    .retry(RetryPolicy::new([Duration::from_millis(200)]).max_attempts(3))
    .prefetch(40)
    .concurrency(8)
    .ack_coalescing(16, Duration::from_millis(20));
    let w = start(vh.url(), sub).await;
    publish_ids(&vh, "orders", 0..N).await;
    let count = |f: Fate| u64::try_from((0..N).filter(|id| fate(*id) == f).count()).unwrap();
    let (parks, retries, requeues) = (
        count(Fate::Park),
        count(Fate::RetryOnce),
        count(Fate::RequeueOnce),
    );
    let succeeding = u64::from(N) - parks;
    wait_until(WAIT, "every id succeeded or parked", || async {
        successes.lock().unwrap().len() as u64 == succeeding
            && u64::from(vh.depth("orders.parking").await) == parks
    })
    .await;
    let st = w.shutdown().await.subscribers["orders"];
    let ran_twice: Vec<_> = successes
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, n)| **n != 1)
        .map(|(id, n)| (*id, *n))
        .collect();
    assert!(
        ran_twice.is_empty(),
        "ids that succeeded twice: {ran_twice:?}"
    );
    assert_eq!(st.ack_lost, 0, "{st:?}");
    assert_eq!(st.retried, retries, "{st:?}");
    assert_eq!(st.parked, parks, "{st:?}");
    assert_eq!(st.requeued, requeues, "{st:?}");
    // Every original acked exactly once, per message: successes, originals of retry copies,
    // originals of parked copies.
    assert_eq!(st.acked, succeeding + retries + parks, "{st:?}");
    assert!(
        st.ack_frames < st.acked,
        "acks were coalesced: {} frames for {} acks",
        st.ack_frames,
        st.acked
    );
    assert_eq!(
        vh.depth("orders").await,
        0,
        "nothing came back after the stop"
    );
    let mut parked: Vec<String> = vh
        .get_all("orders.parking", 100)
        .await
        .iter()
        .filter_map(|m| m.properties.message_id().as_ref().map(|s| s.to_string()))
        .collect();
    parked.sort();
    let mut want: Vec<String> = (0..N)
        .filter(|id| fate(*id) == Fate::Park)
        .map(|id| format!("id-{id}"))
        .collect();
    want.sort();
    assert_eq!(parked, want);
    eprintln!(
        "{hint}: {} acks in {} frames ({:.1} per frame)",
        st.acked,
        st.ack_frames,
        st.acked as f64 / st.ack_frames as f64
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mixed_outcomes_on_a_classic_queue_settle_as_without_coalescing() {
    mixed_outcomes_settle_as_without_coalescing(QueueType::Classic, "coalesce-mixed-classic").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mixed_outcomes_on_a_quorum_queue_settle_as_without_coalescing() {
    mixed_outcomes_settle_as_without_coalescing(QueueType::Quorum, "coalesce-mixed-quorum").await;
}

/// A handler that counts its runs.
fn counting(runs: Arc<AtomicU32>) -> Subscriber {
    Subscriber::new("orders", move |Json(_o): Json<Order>| {
        let runs = runs.clone();
        async move {
            runs.fetch_add(1, Ordering::SeqCst);
            Outcome::Ack
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lone_held_ack_is_flushed_after_the_delay() {
    let vh = Broker::from_env().vhost("coalesce-time");
    let runs = Arc::new(AtomicU32::new(0));
    let sub = counting(runs.clone()).ack_coalescing(10, Duration::from_millis(300));
    let w = start(vh.url(), sub).await;
    publish_ids(&vh, "orders", [1]).await;
    wait_until(WAIT, "handled", || async {
        runs.load(Ordering::SeqCst) == 1
    })
    .await;
    let handled = Instant::now();
    assert_eq!(w.stats("orders").unwrap().acked, 0, "the ack is held");
    wait_until(WAIT, "acked", || async {
        w.stats("orders").unwrap().acked == 1
    })
    .await;
    let took = handled.elapsed();
    assert!(
        took >= Duration::from_millis(200) && took < Duration::from_secs(2),
        "flushed by the 300 ms delay, {took:?} after the handler"
    );
    let st = w.shutdown().await.subscribers["orders"];
    assert_eq!((st.acked, st.ack_frames, st.ack_lost), (1, 1, 0), "{st:?}");
    assert_eq!(vh.depth("orders").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn held_acks_are_flushed_when_the_batch_fills() {
    let vh = Broker::from_env().vhost("coalesce-count");
    let runs = Arc::new(AtomicU32::new(0));
    // One handler at a time: the 5 tags are contiguous, one multiple ack covers them.
    let sub = counting(runs.clone())
        .prefetch(10)
        .concurrency(1)
        .ack_coalescing(5, Duration::from_secs(1));
    // Declared by a first start, then filled while nothing consumes.
    start(vh.url(), counting(Arc::default()))
        .await
        .shutdown()
        .await;
    publish_ids(&vh, "orders", 1..=5).await;
    let w = start(vh.url(), sub).await;
    wait_until(WAIT, "5 handled", || async {
        runs.load(Ordering::SeqCst) == 5
    })
    .await;
    let handled = Instant::now();
    wait_until(WAIT, "5 acked", || async {
        w.stats("orders").unwrap().acked == 5
    })
    .await;
    // The first ack was held moments before the fifth run; the delay would flush ~1 s later.
    let took = handled.elapsed();
    assert!(
        took < Duration::from_millis(500),
        "flushed by count, not by the 1 s delay: {took:?} after the fifth run"
    );
    assert_eq!(w.stats("orders").unwrap().ack_frames, 1, "one multiple ack");
    // Fewer than a batch waits for the delay.
    publish_ids(&vh, "orders", 6..=7).await;
    wait_until(WAIT, "7 handled", || async {
        runs.load(Ordering::SeqCst) == 7
    })
    .await;
    let handled = Instant::now();
    assert_eq!(w.stats("orders").unwrap().acked, 5, "2 acks held");
    wait_until(WAIT, "7 acked", || async {
        w.stats("orders").unwrap().acked == 7
    })
    .await;
    assert!(
        handled.elapsed() >= Duration::from_millis(700),
        "held until the delay: {:?}",
        handled.elapsed()
    );
    let st = w.shutdown().await.subscribers["orders"];
    assert_eq!((st.acked, st.ack_frames, st.ack_lost), (7, 2, 0), "{st:?}");
    assert_eq!(vh.depth("orders").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_graceful_shutdown_writes_the_held_acks() {
    let vh = Broker::from_env().vhost("coalesce-stop");
    let runs = Arc::new(AtomicU32::new(0));
    let sub = counting(runs.clone()).ack_coalescing(50, Duration::from_secs(1));
    let w = start(vh.url(), sub).await;
    publish_ids(&vh, "orders", 0..20).await;
    wait_until(WAIT, "20 handled", || async {
        runs.load(Ordering::SeqCst) == 20
    })
    .await;
    assert_eq!(w.stats("orders").unwrap().acked, 0, "all 20 acks held");
    let st = w.shutdown().await.subscribers["orders"];
    assert_eq!((st.acked, st.ack_lost), (20, 0), "{st:?}");
    assert!(st.ack_frames < 20, "coalesced: {st:?}");
    // Unacked messages would be back in the queue now that the connection is closed.
    assert_eq!(vh.depth("orders").await, 0, "nothing redelivered");
    let again = Arc::new(AtomicU32::new(0));
    let w = start(vh.url(), counting(again.clone())).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    w.shutdown().await;
    assert_eq!(again.load(Ordering::SeqCst), 0, "nothing redelivered");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn held_acks_lost_with_the_connection_are_redelivered() {
    let vh = Broker::from_env().vhost("coalesce-cut");
    let proxy = Proxy::start(&vh.hostport(), Mode::Forward).await;
    let runs: Arc<Mutex<Vec<(u32, bool)>>> = Arc::default();
    let r2 = runs.clone();
    let sub = Subscriber::new(
        "orders",
        move |Json(o): Json<Order>, Redelivered(again): Redelivered| {
            let runs = r2.clone();
            async move {
                runs.lock().unwrap().push((o.id, again));
                Outcome::Ack
            }
        },
    )
    .ack_coalescing(50, Duration::from_secs(1));
    let w = start(proxy.url("guest:guest", &vh.name), sub).await;
    publish_ids(&vh, "orders", 0..10).await;
    wait_until(WAIT, "10 handled", || async {
        runs.lock().unwrap().len() == 10
    })
    .await;
    assert_eq!(w.stats("orders").unwrap().acked, 0, "all 10 acks held");
    proxy.cut();
    wait_until(WAIT, "all 10 redelivered and handled again", || async {
        let runs = runs.lock().unwrap();
        (0..10).all(|id| runs.iter().any(|(i, again)| *i == id && *again))
    })
    .await;
    wait_until(WAIT, "the redeliveries acked", || async {
        w.stats("orders").unwrap().acked == 10
    })
    .await;
    let st = w.shutdown().await.subscribers["orders"];
    assert_eq!(
        st.ack_lost, 10,
        "the held acks found their channel gone: {st:?}"
    );
    assert_eq!(st.acked, 10, "{st:?}");
    assert_eq!(vh.depth("orders").await, 0, "nothing lost, nothing left");
}
