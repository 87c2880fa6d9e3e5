//! The subscriber runtime against a real broker: one test per row of the guarantee table.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable};
use rabbitkit_core::extract::{Json, Redelivered, RoutingKey};
use rabbitkit_core::headers::{self, Attempt};
use rabbitkit_core::{
    AckPolicy, BoxError, ConnectionConfig, Error, Outcome, Permanent, QueueType, RetryPolicy,
    Settle, Subscriber, Worker,
};
use rabbitkit_tests::{Broker, Vhost, table, wait_until};

const TIER: Duration = Duration::from_millis(200);
const WAIT: Duration = Duration::from_secs(20);

/// Publishes `{"id":N}` JSON for every id in `ids`.
async fn publish_orders(vh: &Vhost, exchange: &str, key: &str, ids: impl IntoIterator<Item = u64>) {
    for id in ids {
        vh.publish_raw(
            exchange,
            key,
            format!(r#"{{"id":{id}}}"#).as_bytes(),
            props_json(),
        )
        .await;
    }
}

fn props_json() -> BasicProperties {
    BasicProperties::default()
        .with_content_type("application/json".into())
        .with_message_id("m-1".into())
}

#[derive(serde::Deserialize)]
struct Order {
    id: u32,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn success_is_acked_after_the_handler_returns() {
    let vh = Broker::from_env().vhost("sub-ok");
    let seen = Arc::new(AtomicU32::new(0));
    let s2 = seen.clone();
    let sub = Subscriber::new("orders", move |Json(o): Json<Order>| {
        let seen = s2.clone();
        async move {
            seen.fetch_add(o.id, Ordering::SeqCst);
            Ok::<_, BoxError>(())
        }
    })
    .bind("shop", "order.*");
    let w = vh.start_worker(sub).await;
    publish_orders(&vh, "shop", "order.created", 1..=10).await;
    wait_until(WAIT, "10 acks", || async {
        w.stats("orders").unwrap().acked == 10
    })
    .await;
    assert_eq!(seen.load(Ordering::SeqCst), 55);
    let r = w.shutdown().await;
    assert_eq!(vh.depth("orders").await, 0);
    assert_eq!(vh.depth("orders.parking").await, 0);
    assert_eq!(r.subscribers["orders"].retried, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn transient_failure_is_retried_through_the_tier_then_succeeds_keeping_the_routing_key() {
    let vh = Broker::from_env().vhost("sub-retry");
    let keys = Arc::new(Mutex::new(Vec::new()));
    let k2 = keys.clone();
    let sub = Subscriber::new("orders", move |RoutingKey(rk): RoutingKey, a: Attempt| {
        let keys = k2.clone();
        async move {
            keys.lock().unwrap().push((rk, a.number));
            if a.number <= 3 {
                Err::<(), BoxError>("transient".into())
            } else {
                Ok(())
            }
        }
    })
    .bind("shop", "order.#")
    .retry(RetryPolicy::new([TIER]).max_attempts(5));
    let w = vh.start_worker(sub).await;
    vh.publish_raw("shop", "order.created.eu", b"{}", props_json())
        .await;
    wait_until(WAIT, "success on attempt 4", || async {
        w.stats("orders").unwrap().acked == 4
    })
    .await;
    let st = w.shutdown().await.subscribers["orders"];
    assert_eq!(st.retried, 3);
    assert_eq!(st.parked, 0);
    let keys = keys.lock().unwrap().clone();
    assert_eq!(
        keys,
        (1..=4)
            .map(|n| ("order.created.eu".to_owned(), n))
            .collect::<Vec<_>>(),
        "routing key preserved through 3 retries, attempts counted 1..4"
    );
    assert_eq!(vh.depth("orders.delay.200ms").await, 0);
    assert_eq!(vh.depth("orders.parking").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn max_attempts_parks_with_body_routing_key_error_and_attempts() {
    let broker = Broker::from_env();
    let vh = broker.vhost("sub-park");
    let sub = Subscriber::new("orders", || async {
        Err::<(), BoxError>("db unavailable".into())
    })
    .bind("shop", "order.*")
    .retry(RetryPolicy::new([TIER]).max_attempts(3));
    let w = vh.start_worker(sub).await;
    vh.publish_raw("shop", "order.paid", br#"{"id":7}"#, props_json())
        .await;
    wait_until(WAIT, "parked", || async {
        vh.depth("orders.parking").await == 1
    })
    .await;
    let st = w.shutdown().await.subscribers["orders"];
    assert_eq!((st.retried, st.parked, st.acked), (2, 1, 3));
    let parked = vh.get_all("orders.parking", 10).await;
    assert_eq!(parked.len(), 1);
    let m = &parked[0];
    assert_eq!(m.body, br#"{"id":7}"#);
    assert_eq!(
        m.header_str(headers::ORIGINAL_ROUTING_KEY).as_deref(),
        Some("order.paid")
    );
    assert_eq!(
        m.header_str(headers::ORIGINAL_EXCHANGE).as_deref(),
        Some("shop")
    );
    assert_eq!(
        m.header_str(headers::ERROR_MESSAGE).as_deref(),
        Some("db unavailable")
    );
    assert_eq!(
        m.header_str(headers::PARK_REASON).as_deref(),
        Some("max-attempts")
    );
    assert_eq!(
        m.header_int(headers::ATTEMPT),
        Some(3),
        "attempts counted on RabbitMQ {}",
        broker.version
    );
    assert_eq!(
        m.properties.message_id().as_ref().map(|s| s.as_str()),
        Some("m-1")
    );
    assert_eq!(*m.properties.delivery_mode(), Some(2));
    assert_eq!(vh.depth("orders").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn poison_payload_is_parked_at_once_with_the_decode_error() {
    let vh = Broker::from_env().vhost("sub-poison");
    let runs = Arc::new(AtomicU32::new(0));
    let r2 = runs.clone();
    let sub = Subscriber::new("orders", move |Json(_o): Json<Order>| {
        let runs = r2.clone();
        async move {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, BoxError>(())
        }
    })
    .retry(RetryPolicy::new([TIER]));
    let w = vh.start_worker(sub).await;
    vh.publish_raw("", "orders", b"{not json", props_json())
        .await;
    wait_until(WAIT, "parked", || async {
        vh.depth("orders.parking").await == 1
    })
    .await;
    let st = w.shutdown().await.subscribers["orders"];
    assert_eq!((st.retried, st.parked), (0, 1));
    assert_eq!(runs.load(Ordering::SeqCst), 0, "handler body never ran");
    let m = &vh.get_all("orders.parking", 1).await[0];
    assert_eq!(m.header_str(headers::ERROR_KIND).as_deref(), Some("decode"));
    assert_eq!(
        m.header_str(headers::PARK_REASON).as_deref(),
        Some("decode")
    );
    assert_eq!(m.body, b"{not json");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn permanent_error_parks_without_retrying() {
    let vh = Broker::from_env().vhost("sub-perm");
    let sub = Subscriber::new("orders", || async {
        Err::<(), _>(Permanent::new("unknown sku"))
    })
    .retry(RetryPolicy::new([TIER]));
    let w = vh.start_worker(sub).await;
    vh.publish_raw("", "orders", b"x", props_json()).await;
    wait_until(WAIT, "parked", || async {
        vh.depth("orders.parking").await == 1
    })
    .await;
    let st = w.shutdown().await.subscribers["orders"];
    assert_eq!((st.retried, st.parked), (0, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn retry_publish_returned_leaves_original_unacked_then_redeclares_and_retries() {
    let vh = Broker::from_env().vhost("sub-returned");
    let runs = Arc::new(AtomicU32::new(0));
    let r2 = runs.clone();
    let sub = Subscriber::new("orders", move |Redelivered(again): Redelivered| {
        let runs = r2.clone();
        async move {
            runs.fetch_add(1, Ordering::SeqCst);
            Err::<(), BoxError>(if again { "fail again" } else { "fail" }.into())
        }
    })
    .retry(RetryPolicy::new([Duration::from_secs(60)]).max_attempts(10));
    let w = vh.start_worker(sub).await;
    // Break the tier: the retry copy is now unroutable (mandatory → returned).
    vh.unbind("orders.retry", "orders.delay.1m", "orders.delay.1m")
        .await;
    vh.publish_raw("", "orders", b"keep me", props_json()).await;
    // The returned copy leaves the original unacked (requeued), and the subscriber declares
    // its topology again: the redelivery's copy is routed and confirmed.
    wait_until(WAIT, "the redelivery's copy confirmed", || async {
        w.stats("orders").unwrap().retried == 1
    })
    .await;
    let st = w.shutdown().await.subscribers["orders"];
    assert_eq!(st.settlement_failures, 1, "{st:?}");
    assert!(st.requeued >= 1, "{st:?}");
    assert_eq!(
        st.acked, 1,
        "acked once: after the confirmed copy, never after the returned one"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2, "handled, then redelivered");
    assert_eq!(vh.depth("orders").await, 0);
    let copies = vh.get_all("orders.delay.1m", 1).await;
    assert_eq!(copies.len(), 1);
    assert_eq!(copies[0].body, b"keep me");
    assert_eq!(
        copies[0].header_str(headers::ERROR_MESSAGE).as_deref(),
        Some("fail again"),
        "the copy is the redelivery's"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn retry_publish_nacked_leaves_original_unacked() {
    let vh = Broker::from_env().vhost("sub-nacked");
    let sub = Subscriber::new("orders", || async { Err::<(), BoxError>("fail".into()) })
        .retry(RetryPolicy::new([Duration::from_secs(60)]).max_attempts(10));
    let w = vh.start_worker(sub).await;
    // The consuming task declares the topology once more before it consumes: until it is
    // ready it may put the deleted tier back (or meet the replacement's other arguments).
    wait_until(WAIT, "consuming", || async { w.is_ready() }).await;
    // Replace the tier with a queue that refuses every publish (nack).
    vh.delete_queue("orders.delay.1m").await;
    vh.declare_queue(
        "orders.delay.1m",
        table(&[
            ("x-max-length", AMQPValue::LongInt(0)),
            ("x-overflow", AMQPValue::LongString("reject-publish".into())),
        ]),
    )
    .await;
    let c = vh.connect().await;
    let ch = c.create_channel().await.unwrap();
    ch.queue_bind(
        "orders.delay.1m".into(),
        "orders.retry".into(),
        "orders.delay.1m".into(),
        Default::default(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    vh.publish_raw("", "orders", b"keep me", props_json()).await;
    wait_until(WAIT, "a failed settlement", || async {
        w.stats("orders").unwrap().settlement_failures >= 1
    })
    .await;
    let st = w.shutdown().await.subscribers["orders"];
    assert_eq!(st.acked, 0, "nacked copy: original not acked");
    wait_until(WAIT, "original back in the queue", || async {
        vh.depth("orders").await == 1
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn connection_closed_mid_handler_redelivers_and_loses_nothing() {
    let vh = Arc::new(Broker::from_env().vhost("sub-cut"));
    let done = Arc::new(Mutex::new(std::collections::HashSet::new()));
    let cut = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (d2, c2) = (done.clone(), cut.clone());
    let sub = Subscriber::new("orders", move |Json(o): Json<Order>| {
        let (done, cut) = (d2.clone(), c2.clone());
        async move {
            tokio::time::sleep(Duration::from_millis(500)).await;
            // Past the first 10, handlers hold their delivery until the cut is made, so
            // some are in flight when it lands whatever rabbitmqctl's start-up time (about
            // 1 s on 3.10 and 4.0, 4 s on 4.3, longer than this whole workload).
            let first = done.lock().unwrap().len() < 10;
            let t = std::time::Instant::now();
            while !first && !cut.load(Ordering::SeqCst) && t.elapsed() < Duration::from_secs(30) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            done.lock().unwrap().insert(o.id);
            Ok::<_, BoxError>(())
        }
    })
    .prefetch(10);
    vh.declare_queue(
        "orders",
        Subscriber::new("orders", || async { Outcome::Ack })
            .topology()
            .work_arguments(),
    )
    .await;
    publish_orders(&vh, "", "orders", 0..60).await;
    let w = vh.start_worker(sub).await;
    wait_until(WAIT, "10 handled", || async {
        done.lock().unwrap().len() >= 10
    })
    .await;
    let v2 = vh.clone();
    tokio::task::spawn_blocking(move || v2.close_connections())
        .await
        .unwrap();
    cut.store(true, Ordering::SeqCst);
    wait_until(
        Duration::from_secs(40),
        "all 60 handled and the queue empty",
        || async { done.lock().unwrap().len() == 60 && vh.depth("orders").await == 0 },
    )
    .await;
    // Acked-by-us counts may include duplicates; what matters is nothing is left behind.
    let st = w.shutdown().await.subscribers["orders"];
    assert!(st.acked >= 60 - st.ack_lost.min(60), "{st:?}");
    assert!(
        st.ack_lost >= 1,
        "the cut poisoned in-flight ackers: {st:?}"
    );
    assert_eq!(vh.depth("orders").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn manual_handler_that_forgets_to_settle_gets_the_fallback() {
    let vh = Broker::from_env().vhost("sub-manual");
    let runs = Arc::new(AtomicU32::new(0));
    let r2 = runs.clone();
    let sub = Subscriber::new("orders", move |settle: Settle| {
        let runs = r2.clone();
        async move {
            // First run forgets; the second settles.
            if runs.fetch_add(1, Ordering::SeqCst) > 0 {
                settle.ack().await;
            }
            Ok::<_, BoxError>(())
        }
    })
    .ack_policy(AckPolicy::Manual);
    let w = vh.start_worker(sub).await;
    vh.publish_raw("", "orders", b"x", props_json()).await;
    wait_until(WAIT, "settled by the second run", || async {
        w.stats("orders").unwrap().acked == 1
    })
    .await;
    let st = w.shutdown().await.subscribers["orders"];
    assert_eq!(st.unsettled, 1);
    assert_eq!(st.requeued, 1, "fallback is nack-requeue");
    assert_eq!(vh.depth("orders").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn manual_retry_goes_through_the_confirmed_path() {
    let vh = Broker::from_env().vhost("sub-manual-retry");
    let sub = Subscriber::new("orders", |settle: Settle, a: Attempt| async move {
        if a.number == 1 {
            settle.retry("later").await;
        } else {
            settle.ack().await;
        }
    })
    .ack_policy(AckPolicy::Manual)
    .retry(RetryPolicy::new([TIER]));
    let w = vh.start_worker(sub).await;
    vh.publish_raw("", "orders", b"x", props_json()).await;
    wait_until(WAIT, "acked after one retry", || async {
        w.stats("orders").unwrap().acked == 2
    })
    .await;
    let st = w.shutdown().await.subscribers["orders"];
    assert_eq!((st.retried, st.unsettled), (1, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shutdown_settles_in_flight_handlers_and_requeues_stragglers() {
    let vh = Broker::from_env().vhost("sub-shutdown");
    let sub = Subscriber::new("orders", |Json(o): Json<Order>| async move {
        // Even ids finish within the deadline, odd ids never do.
        let d = if o.id % 2 == 0 { 300 } else { 60_000 };
        tokio::time::sleep(Duration::from_millis(d)).await;
        Ok::<_, BoxError>(())
    })
    .prefetch(10);
    let w = Worker::new(ConnectionConfig::new(vh.url()))
        .shutdown_deadline(Duration::from_secs(2))
        .subscribe(sub)
        .start()
        .await
        .unwrap();
    publish_orders(&vh, "", "orders", 0..10).await;
    wait_until(WAIT, "10 in flight", || async {
        w.stats("orders").unwrap().consumed == 10
    })
    .await;
    let st = w.shutdown().await.subscribers["orders"];
    assert_eq!(st.acked, 5, "finished handlers settled: {st:?}");
    assert_eq!(st.requeued, 5, "stragglers requeued: {st:?}");
    wait_until(WAIT, "stragglers back in the queue", || async {
        vh.depth("orders").await == 5
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn panics_and_deadlines_become_retries_and_the_worker_keeps_running() {
    let vh = Broker::from_env().vhost("sub-panic");
    let sub = Subscriber::new(
        "orders",
        |a: Attempt, rabbitkit_core::extract::Body(b): rabbitkit_core::extract::Body| async move {
            if a.number == 1 && b.as_ref() == b"panic" {
                panic!("boom");
            }
            if a.number == 1 && b.as_ref() == b"slow" {
                tokio::time::sleep(Duration::from_secs(30)).await;
            }
            Ok::<_, BoxError>(())
        },
    )
    .deadline(Duration::from_millis(300))
    .retry(RetryPolicy::new([TIER]));
    let w = vh.start_worker(sub).await;
    vh.publish_raw("", "orders", b"panic", props_json()).await;
    vh.publish_raw("", "orders", b"slow", props_json()).await;
    wait_until(WAIT, "both succeed on attempt 2", || async {
        w.stats("orders").unwrap().acked == 4
    })
    .await;
    let st = w.shutdown().await.subscribers["orders"];
    assert_eq!((st.panics, st.timeouts, st.retried), (1, 1, 2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn quorum_work_queue_retries_and_parks() {
    let vh = Broker::from_env().vhost("sub-quorum");
    let sub = Subscriber::new("orders", || async { Err::<(), BoxError>("nope".into()) })
        .queue_type(QueueType::Quorum)
        .retry(RetryPolicy::new([TIER]).max_attempts(2));
    let w = vh.start_worker(sub).await;
    vh.publish_raw("", "orders", b"q", props_json()).await;
    wait_until(WAIT, "parked", || async {
        vh.depth("orders.parking").await == 1
    })
    .await;
    let st = w.shutdown().await.subscribers["orders"];
    assert_eq!((st.retried, st.parked), (1, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letter_cycle_topology_is_refused_before_declaring() {
    let vh = Broker::from_env().vhost("sub-cycle");
    let sub = Subscriber::new("orders", || async { Outcome::Ack })
        .queue_type(QueueType::Quorum)
        .queue_argument(
            "x-dead-letter-exchange",
            AMQPValue::LongString("orders.retry".into()),
        )
        .queue_argument(
            "x-dead-letter-routing-key",
            AMQPValue::LongString("orders.delay.200ms".into()),
        )
        .retry(RetryPolicy::new([TIER]));
    let err = Worker::new(ConnectionConfig::new(vh.url()))
        .subscribe(sub)
        .start()
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Topology(_)), "{err}");
    assert_eq!(vh.try_depth("orders").await, None, "nothing was declared");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inequivalent_existing_queue_is_a_clear_startup_error() {
    let vh = Broker::from_env().vhost("sub-406");
    vh.declare_queue("orders", table(&[("x-max-length", AMQPValue::LongInt(5))]))
        .await;
    let sub = Subscriber::new("orders", || async { Outcome::Ack });
    let err = Worker::new(ConnectionConfig::new(vh.url()))
        .subscribe(sub)
        .start()
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Declare { .. }), "{err}");
    // Names the queue and carries the broker's own words (406 and its reason).
    let text = err.to_string();
    assert!(text.contains("work queue \"orders\""), "{text}");
    assert!(text.contains("PRECONDITION_FAILED"), "{text}");
    assert!(text.contains("inequivalent arg"), "{text}");
}

#[tokio::test]
async fn settled_outcome_without_a_settlement_is_requeued_not_leaked() {
    let vh = Broker::from_env().vhost("sub-settled-lie");
    let sub = Subscriber::new(
        "orders",
        |rabbitkit_core::extract::Redelivered(again): rabbitkit_core::extract::Redelivered| async move {
            // Auto mode: claiming to have settled would leave the delivery unacked.
            if again {
                Outcome::Ack
            } else {
                Outcome::Settled
            }
        },
    );
    let w = vh.start_worker(sub).await;
    publish_orders(&vh, "", "orders", [1]).await;
    wait_until(WAIT, "acked after requeue", || async {
        w.stats("orders").unwrap().acked == 1
    })
    .await;
    let st = w.shutdown().await.subscribers["orders"];
    assert_eq!((st.consumed, st.requeued, st.acked), (2, 1, 1), "{st:?}");
    assert_eq!(vh.depth("orders").await, 0);
}

/// A handler that asks for a requeue every time must not spin: from the second requeue in
/// a row the settler waits (100 ms, doubling, capped at 5 s) before nacking.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn repeated_requeues_back_off_instead_of_spinning() {
    let vh = Broker::from_env().vhost("sub-requeue-backoff");
    let runs = Arc::new(AtomicU32::new(0));
    let r2 = runs.clone();
    let sub = Subscriber::new("orders", move || {
        let runs = r2.clone();
        async move {
            runs.fetch_add(1, Ordering::SeqCst);
            Outcome::Requeue
        }
    });
    let w = vh.start_worker(sub).await;
    vh.publish_raw("", "orders", b"again", props_json()).await;
    wait_until(WAIT, "first run", || async {
        runs.load(Ordering::SeqCst) >= 1
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let n = runs.load(Ordering::SeqCst);
    // Pauses 0, 0.1, 0.2, 0.4, 0.8, 1.6 s: about 6 runs in 2 s. An unpaced requeue loop runs
    // the handler thousands of times in that span.
    assert!(
        (3..=12).contains(&n),
        "{n} runs in 2 s: requeues are not paced"
    );
    let st = w.shutdown().await.subscribers["orders"];
    assert_eq!(st.acked, 0);
    wait_until(WAIT, "message still in the queue", || async {
        vh.depth("orders").await == 1
    })
    .await;
}

/// Past a quorum queue's delivery limit the broker dead-letters to the parking queue (with
/// x-death reason `delivery_limit`): nothing is dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn quorum_delivery_limit_dead_letters_into_parking() {
    let vh = Broker::from_env().vhost("sub-quorum-limit");
    let sub = Subscriber::new("orders", || async { Outcome::Requeue })
        .queue_type(QueueType::Quorum)
        .delivery_limit(2);
    let w = vh.start_worker(sub).await;
    vh.publish_raw("", "orders", b"limited", props_json()).await;
    wait_until(WAIT, "dead-lettered into parking", || async {
        vh.depth("orders.parking").await == 1
    })
    .await;
    let st = w.shutdown().await.subscribers["orders"];
    assert_eq!(st.acked, 0);
    assert!(st.requeued >= 2, "{st:?}");
    let m = &vh.get_all("orders.parking", 1).await[0];
    assert_eq!(m.body, b"limited");
    let Some(AMQPValue::FieldArray(deaths)) = m.header("x-death") else {
        panic!(
            "no x-death on the dead-lettered message: {:?}",
            m.properties.headers()
        );
    };
    let AMQPValue::FieldTable(first) = &deaths.as_slice()[0] else {
        panic!("x-death entry is not a table");
    };
    let reason = match first.inner().get("reason") {
        Some(AMQPValue::LongString(r)) => r.to_string(),
        other => panic!("x-death reason: {other:?}"),
    };
    assert_eq!(reason, "delivery_limit");
}

/// The retry copy's channel is closed by the broker (its exchange was deleted: 404): the
/// copy is `Failed`, the original is not acked and comes back; once the exchange is back,
/// the retry goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn retry_copy_channel_lost_leaves_original_unacked_then_recovers() {
    let vh = Broker::from_env().vhost("sub-copy-channel");
    let sub = Subscriber::new("orders", || async { Err::<(), BoxError>("fail".into()) })
        .retry(RetryPolicy::new([Duration::from_secs(60)]).max_attempts(10));
    let w = vh.start_worker(sub).await;
    let c = vh.connect().await;
    let ch = c.create_channel().await.unwrap();
    ch.exchange_delete("orders.retry".into(), Default::default())
        .await
        .unwrap();
    vh.publish_raw("", "orders", b"keep me", props_json()).await;
    wait_until(WAIT, "a failed settlement", || async {
        w.stats("orders").unwrap().settlement_failures >= 1
    })
    .await;
    let st = w.stats("orders").unwrap();
    assert_eq!(st.acked, 0, "copy on a lost channel: original not acked");
    assert_eq!(st.retried, 0);
    ch.exchange_declare(
        "orders.retry".into(),
        lapin::ExchangeKind::Direct,
        lapin::options::ExchangeDeclareOptions {
            durable: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await
    .unwrap();
    ch.queue_bind(
        "orders.delay.1m".into(),
        "orders.retry".into(),
        "orders.delay.1m".into(),
        Default::default(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    wait_until(WAIT, "retried once the exchange is back", || async {
        let s = w.stats("orders").unwrap();
        s.retried == 1 && s.acked == 1
    })
    .await;
    w.shutdown().await;
    assert_eq!(vh.depth("orders").await, 0);
    let copies = vh.get_all("orders.delay.1m", 10).await;
    assert_eq!(copies.len(), 1, "exactly the confirmed copy is in the tier");
    assert_eq!(copies[0].body, b"keep me");
}

/// A resource alarm blocks the publishing connection: the retry copy times out
/// (`TimedOut { blocked: true }`), the original is not acked, and once the alarm clears the
/// retry goes through. Copies whose outcome was unknown may arrive too (at-least-once), so
/// the tier holds at least one copy and the work queue none.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn retry_copy_timed_out_under_an_alarm_leaves_original_unacked() {
    use std::sync::atomic::AtomicBool;
    let broker = Broker::private(2);
    broker.ctl(&["set_vm_memory_high_watermark", "0.4"]);
    let vh = broker.vhost("sub-copy-alarm");
    let alarm = Arc::new(AtomicBool::new(false));
    let a2 = alarm.clone();
    let sub = Subscriber::new("orders", move || {
        let alarm = a2.clone();
        async move {
            // Fail only once the alarm is on, so the first copy meets a blocked connection.
            for _ in 0..400 {
                if alarm.load(Ordering::SeqCst) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err::<(), BoxError>("fail".into())
        }
    })
    .retry(RetryPolicy::new([Duration::from_secs(60)]).max_attempts(10));
    let w = rabbitkit_core::Worker::new(ConnectionConfig::new(vh.url()))
        .shutdown_deadline(Duration::from_secs(5))
        .publisher_config(rabbitkit_core::PublisherConfig {
            confirm_timeout: Duration::from_secs(1),
            ..Default::default()
        })
        .subscribe(sub)
        .start()
        .await
        .unwrap();
    vh.publish_raw("", "orders", b"keep me", props_json()).await;
    broker.ctl(&["set_vm_memory_high_watermark", "0"]);
    alarm.store(true, Ordering::SeqCst);
    wait_until(WAIT, "a settlement failure under the alarm", || async {
        w.stats("orders").unwrap().settlement_failures >= 1
    })
    .await;
    let st = w.stats("orders").unwrap();
    broker.ctl(&["set_vm_memory_high_watermark", "0.4"]);
    assert_eq!(st.acked, 0, "copy timed out: original not acked");
    assert_eq!(st.retried, 0);
    assert!(
        w.publisher().stats().timed_out >= 1,
        "{:?}",
        w.publisher().stats()
    );
    wait_until(WAIT, "retried after the alarm cleared", || async {
        let s = w.stats("orders").unwrap();
        s.retried >= 1 && s.acked == 1
    })
    .await;
    w.shutdown().await;
    assert_eq!(vh.depth("orders").await, 0);
    wait_until(WAIT, "the confirmed copy is in the tier", || async {
        vh.depth("orders.delay.1m").await >= 1
    })
    .await;
}

/// The parking copy is returned (the parking queue is gone): the original is not acked and
/// stays recoverable; once the parking queue is back, it is parked.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn parking_copy_returned_leaves_original_unacked_then_parks() {
    let vh = Broker::from_env().vhost("sub-park-returned");
    let sub = Subscriber::new("orders", || async {
        Err::<(), _>(Permanent::new("unknown sku"))
    });
    let w = vh.start_worker(sub).await;
    // `start` returns before the consuming task has opened its channel, and that task
    // declares the topology again, parking queue included: deleted before then, the queue
    // came back, the copy was confirmed and parked, and no settlement ever failed.
    wait_until(WAIT, "consuming", || async { w.is_ready() }).await;
    vh.delete_queue("orders.parking").await;
    vh.publish_raw("", "orders", b"park me", props_json()).await;
    wait_until(WAIT, "a failed settlement", || async {
        w.stats("orders").unwrap().settlement_failures >= 1
    })
    .await;
    let st = w.stats("orders").unwrap();
    assert_eq!((st.acked, st.parked), (0, 0), "{st:?}");
    // As the worker declares it (it may have done so already, after the returned copy).
    let parking = rabbitkit_core::Topology::new("orders").parking_arguments();
    vh.declare_queue("orders.parking", parking).await;
    wait_until(WAIT, "parked once the queue is back", || async {
        w.stats("orders").unwrap().parked == 1
    })
    .await;
    let st = w.shutdown().await.subscribers["orders"];
    assert_eq!(st.acked, 1);
    assert_eq!(vh.depth("orders").await, 0);
    let parked = vh.get_all("orders.parking", 10).await;
    assert_eq!(parked.len(), 1);
    assert_eq!(parked[0].body, b"park me");
}

/// A handler that requeues every time must not loop for ever (a classic queue never counts
/// requeues): past the requeue limit the message is parked with reason `requeue-limit`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn requeue_forever_ends_parked_after_the_requeue_limit() {
    let vh = Broker::from_env().vhost("sub-requeue-limit");
    let runs = Arc::new(AtomicU32::new(0));
    let r2 = runs.clone();
    let sub = Subscriber::new("orders", move || {
        let runs = r2.clone();
        async move {
            runs.fetch_add(1, Ordering::SeqCst);
            Outcome::Requeue
        }
    })
    .requeue_limit(3);
    let w = vh.start_worker(sub).await;
    vh.publish_raw("", "orders", b"again", props_json()).await;
    wait_until(WAIT, "parked after the requeue limit", || async {
        vh.depth("orders.parking").await == 1
    })
    .await;
    let st = w.shutdown().await.subscribers["orders"];
    // Three requeues, then the fourth run's requeue is the one past the limit.
    assert_eq!(runs.load(Ordering::SeqCst), 4);
    assert_eq!((st.requeued, st.parked, st.acked), (3, 1, 1), "{st:?}");
    assert_eq!(vh.depth("orders").await, 0);
    let m = &vh.get_all("orders.parking", 1).await[0];
    assert_eq!(m.body, b"again");
    assert_eq!(
        m.header_str(headers::PARK_REASON).as_deref(),
        Some("requeue-limit")
    );
    assert_eq!(m.header_int(headers::REQUEUES), Some(3));
}

#[derive(Clone)]
struct NeverRegistered;

/// A handler asking for state nobody registered would park every delivery: refused at
/// start, naming the type, before anything is consumed.
#[tokio::test]
async fn missing_state_is_refused_at_start_naming_the_type() {
    let vh = Broker::from_env().vhost("sub-missing-state");
    let sub = Subscriber::new(
        "orders",
        |_s: rabbitkit_core::extract::State<NeverRegistered>| async { Outcome::Ack },
    );
    let err = Worker::new(ConnectionConfig::new(vh.url()))
        .subscribe(sub)
        .start()
        .await
        .expect_err("a worker whose handler needs unregistered state must not start");
    assert!(matches!(err, Error::MissingState { .. }), "{err}");
    assert!(err.to_string().contains("NeverRegistered"), "{err}");
    assert_eq!(vh.try_depth("orders").await, None, "nothing declared");
    // Registered on the worker or the subscriber, it starts.
    let sub = Subscriber::new(
        "orders",
        |_s: rabbitkit_core::extract::State<NeverRegistered>| async { Outcome::Ack },
    );
    let w = Worker::new(ConnectionConfig::new(vh.url()))
        .state(NeverRegistered)
        .subscribe(sub)
        .start()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    w.shutdown().await;
}

/// A `Settle` argument outside manual ack mode would requeue every delivery for ever:
/// refused at start.
#[tokio::test]
async fn settle_outside_manual_mode_is_refused_at_start() {
    let vh = Broker::from_env().vhost("sub-not-manual");
    let sub = Subscriber::new("orders", |s: Settle| async move {
        let _ = s.ack().await;
        Outcome::Settled
    });
    let err = Worker::new(ConnectionConfig::new(vh.url()))
        .subscribe(sub)
        .start()
        .await
        .expect_err("a Settle handler in auto mode must not start");
    assert!(matches!(err, Error::SettleOutsideManual { .. }), "{err}");
    assert_eq!(vh.try_depth("orders").await, None, "nothing declared");
}

/// A parking copy the publisher refuses before sending (its body is over the publisher's
/// `max-body`, which the broker itself accepted) can never be published: parked as a
/// trimmed copy (body dropped, its size and digest kept), never requeued in a loop.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_copy_whose_body_is_over_max_body_parks_the_whole_message_without_a_loop() {
    let vh = Broker::from_env().vhost("sub-unpublishable");
    let runs = Arc::new(AtomicU32::new(0));
    let r2 = runs.clone();
    let sub = Subscriber::new("orders", move || {
        let runs = r2.clone();
        async move {
            runs.fetch_add(1, Ordering::SeqCst);
            Err::<(), BoxError>(Permanent::new("bad order").into())
        }
    });
    let w = Worker::new(ConnectionConfig::new(vh.url()))
        .publisher_config(rabbitkit_core::PublisherConfig {
            max_body: 1000,
            ..Default::default()
        })
        .subscribe(sub)
        .start()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    vh.publish_raw("", "orders", &[b'x'; 2000], props_json())
        .await;
    wait_until(WAIT, "the message parked", || async {
        vh.depth("orders.parking").await == 1
    })
    .await;
    let st = w.shutdown().await.subscribers["orders"];
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the handler ran once: no loop"
    );
    assert_eq!((st.rejected, st.acked, st.requeued), (1, 0, 0), "{st:?}");
    assert_eq!(vh.depth("orders").await, 0);
    let m = &vh.get_all("orders.parking", 1).await[0];
    assert_eq!(m.body.len(), 2000, "the payload is kept whole");
    assert_eq!(
        m.properties.message_id().as_ref().map(|s| s.as_str()),
        Some("m-1")
    );
    assert!(m.header("x-death").is_some(), "dead-lettered by the broker");
}

/// A retry copy whose properties go over the publisher's budget once the evidence headers
/// are added can never be published: a trimmed copy is parked instead. The retry copy
/// carried its tier's delay as its expiration; the parked copy must not, or it would expire
/// in the parking queue (which has no dead-letter target) and the message would be gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unpublishable_retry_copy_is_parked_trimmed_and_stays_parked() {
    let vh = Broker::from_env().vhost("sub-trimmed");
    // Over 600 bytes of evidence headers with this error message.
    let sub = Subscriber::new("orders", || async {
        Err::<(), BoxError>(format!("downstream timed out: {}", "x".repeat(600)).into())
    })
    .retry(RetryPolicy::new([Duration::from_millis(200)]));
    let w = vh.start_worker(sub).await;
    // Fits the broker's default 128 KiB frame on its own (delivered to the consumer); not
    // with the evidence headers on top (the publisher's budget is that frame).
    let big = table(&[(
        "big",
        AMQPValue::LongString("b".repeat(128 * 1024 - 500).into()),
    )]);
    vh.publish_raw(
        "",
        "orders",
        b"{}",
        BasicProperties::default()
            .with_message_id("m-big".into())
            .with_headers(big),
    )
    .await;
    wait_until(WAIT, "the trimmed copy parked", || async {
        vh.depth("orders.parking").await == 1
    })
    .await;
    // Five times the tier's delay: an expiring copy would be gone by now.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let st = w.shutdown().await.subscribers["orders"];
    assert_eq!((st.parked, st.retried, st.requeued), (1, 0, 0), "{st:?}");
    assert_eq!(vh.depth("orders").await, 0);
    let parked = vh.get_all("orders.parking", 2).await;
    assert_eq!(parked.len(), 1, "the parked copy is still there");
    let m = &parked[0];
    assert!(m.properties.expiration().is_none(), "{:?}", m.properties);
    assert_eq!(
        m.header_str(headers::PARK_REASON).as_deref(),
        Some("unpublishable")
    );
    assert!(
        m.header("big").is_none(),
        "the oversized header was dropped"
    );
    assert_eq!(
        m.properties.message_id().as_ref().map(|s| s.as_str()),
        Some("m-big")
    );
}

/// The original's channel died while the handler ran: its copy is not published (the
/// broker redelivers the original, which does the work again); publishing it anyway would
/// leave a copy and a redelivery, a sure duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_copy_is_published_when_the_originals_channel_is_gone() {
    let vh = Arc::new(Broker::from_env().vhost("sub-skip-copy"));
    let started = Arc::new(tokio::sync::Notify::new());
    let release = Arc::new(tokio::sync::Notify::new());
    let runs = Arc::new(AtomicU32::new(0));
    let (s2, r2, n2) = (started.clone(), release.clone(), runs.clone());
    let sub = Subscriber::new(
        "orders",
        move |rabbitkit_core::extract::Redelivered(again): rabbitkit_core::extract::Redelivered| {
            let (started, release, runs) = (s2.clone(), r2.clone(), n2.clone());
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                if again {
                    return Ok(());
                }
                started.notify_one();
                release.notified().await;
                Err::<(), BoxError>("failed after its channel was cut".into())
            }
        },
    )
    .retry(RetryPolicy::new([Duration::from_secs(60)]));
    let w = vh.start_worker(sub).await;
    vh.publish_raw("", "orders", b"once", props_json()).await;
    started.notified().await;
    let v2 = vh.clone();
    tokio::task::spawn_blocking(move || v2.close_connections())
        .await
        .unwrap();
    // lapin notices the closed connection and poisons the acker.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    release.notify_one();
    wait_until(WAIT, "redelivered and acked", || async {
        runs.load(Ordering::SeqCst) == 2 && vh.depth("orders").await == 0
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let st = w.shutdown().await.subscribers["orders"];
    assert_eq!(vh.depth("orders.delay.1m").await, 0, "no copy: {st:?}");
    assert_eq!(st.retried, 0, "{st:?}");
    assert_eq!(vh.depth("orders").await, 0);
}
