//! No delivery is ever stranded (left unacked on a live channel): panics outside the
//! handler, dropped settle futures, a dropped worker handle, shutdown edges.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldArray, FieldTable};
use rabbitkit_core::{
    AckPolicy, BoxError, ConnectionConfig, Envelope, Error, Publisher, PublisherConfig, Settle,
    Subscriber, Worker,
};
use rabbitkit_tests::proxy::{Mode, Proxy};
use rabbitkit_tests::{Broker, Vhost, http, table, wait_until};

const WAIT: Duration = Duration::from_secs(20);

fn props() -> BasicProperties {
    BasicProperties::default().with_message_id("m-1".into())
}

/// Messages the broker holds delivered but unacknowledged in `queue` (management API; its
/// figures lag by up to the stats interval, so callers poll).
fn unacked(vh: &Vhost, queue: &str) -> Option<u64> {
    let (status, body) = http(
        &vh.broker.mgmt,
        "GET",
        &format!("/api/queues/{}/{queue}", vh.name),
        None,
    );
    if status != 200 {
        return None;
    }
    let v: serde_json::Value = serde_json::from_str(&body).ok()?;
    v["messages_unacknowledged"].as_u64()
}

/// Open client connections of the vhost (management API).
fn connections(vh: &Vhost) -> usize {
    let (status, body) = http(
        &vh.broker.mgmt,
        "GET",
        &format!("/api/vhosts/{}/connections", vh.name),
        None,
    );
    assert_eq!(status, 200, "connections: {body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    v.as_array().map_or(0, Vec::len)
}

/// An error whose `Display` panics the first time it is shown.
#[derive(Debug)]
struct TrapError(Arc<AtomicBool>);

impl std::fmt::Display for TrapError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if !self.0.swap(true, Ordering::SeqCst) {
            panic!("Display of a handler error panicked");
        }
        f.write_str("trap")
    }
}

impl std::error::Error for TrapError {}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_panic_while_deciding_parks_the_message_instead_of_looping() {
    let vh = Broker::from_env().vhost("strand-display");
    let shown = Arc::new(AtomicBool::new(false));
    let runs = Arc::new(AtomicU32::new(0));
    let (s2, r2) = (shown.clone(), runs.clone());
    let sub = Subscriber::new("orders", move || {
        let (shown, runs) = (s2.clone(), r2.clone());
        async move {
            // Every run: an error whose Display panics while the settlement is decided. A
            // requeue would re-run the handler and panic again, for ever.
            runs.fetch_add(1, Ordering::SeqCst);
            Err::<(), BoxError>(Box::new(TrapError(shown)))
        }
    })
    .retry(rabbitkit_core::RetryPolicy::new([Duration::from_millis(200)]).immediate_retries(0));
    let w = vh.start_worker(sub).await;
    vh.publish_raw("", "orders", b"x", props()).await;
    wait_until(WAIT, "parked after the panic", || async {
        vh.depth("orders.parking").await == 1
    })
    .await;
    assert!(shown.load(Ordering::SeqCst), "the trap was sprung");
    let st = w.shutdown().await.subscribers["orders"];
    assert_eq!(runs.load(Ordering::SeqCst), 1, "one run: no loop");
    assert_eq!((st.parked, st.requeued), (1, 0), "{st:?}");
    assert_eq!(vh.depth("orders").await, 0);
    let parked = vh.get_all("orders.parking", 1).await;
    assert_eq!(
        parked[0].header_str("x-rabbitkit-error-kind").as_deref(),
        Some("panic")
    );
    wait_until(WAIT, "nothing unacked", || async {
        unacked(&vh, "orders") == Some(0)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn forged_x_death_counts_past_i64_are_settled_not_stranded() {
    let vh = Broker::from_env().vhost("strand-xdeath");
    let runs = Arc::new(AtomicU32::new(0));
    let sub = Subscriber::new("orders", rabbitkit_tests::counting_handler(runs.clone()));
    let w = vh.start_worker(sub).await;
    let entry = |n: i64| {
        AMQPValue::FieldTable(table(&[
            ("queue", AMQPValue::LongString("orders.retry.5s".into())),
            ("reason", AMQPValue::LongString("expired".into())),
            ("count", AMQPValue::LongLongInt(n)),
        ]))
    };
    let mut h = FieldTable::default();
    h.insert(
        "x-death".into(),
        AMQPValue::FieldArray(FieldArray::from(vec![entry(i64::MAX), entry(i64::MAX)])),
    );
    vh.publish_raw("", "orders", b"x", props().with_headers(h))
        .await;
    wait_until(WAIT, "the forged delivery settled", || async {
        let st = w.stats("orders").unwrap();
        st.acked + st.parked + st.requeued >= 1
    })
    .await;
    w.shutdown().await;
    wait_until(WAIT, "nothing unacked", || async {
        unacked(&vh, "orders") == Some(0)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_manual_settlement_finishes_when_the_handler_drops_it() {
    let vh = Broker::from_env().vhost("strand-manual");
    let sub = Subscriber::new("orders", |settle: Settle| async move {
        // Start parking, then walk away (as a timeout or a select! would).
        let _ = settle.park("gave up").now_or_never();
        Ok::<_, BoxError>(())
    })
    .ack_policy(AckPolicy::Manual);
    let w = vh.start_worker(sub).await;
    vh.publish_raw("", "orders", b"x", props()).await;
    wait_until(WAIT, "parked and acked", || async {
        let st = w.stats("orders").unwrap();
        st.parked == 1 && st.acked == 1
    })
    .await;
    let st = w.shutdown().await.subscribers["orders"];
    assert_eq!((st.requeued, st.unsettled), (0, 0), "{st:?}");
    assert_eq!(vh.depth("orders.parking").await, 1);
    assert_eq!(vh.depth("orders").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_manual_settlement_cut_by_the_deadline_still_finishes() {
    let vh = Broker::from_env().vhost("strand-manual-deadline");
    let sub = Subscriber::new("orders", |settle: Settle| async move {
        let report = settle.park("gave up").await;
        // The subscriber's deadline cuts this short while the copy awaits its confirm.
        tokio::time::sleep(Duration::from_secs(60)).await;
        drop(report);
        Ok::<_, BoxError>(())
    })
    .ack_policy(AckPolicy::Manual)
    .deadline(Duration::from_millis(1));
    let w = vh.start_worker(sub).await;
    vh.publish_raw("", "orders", b"x", props()).await;
    wait_until(WAIT, "parked and acked", || async {
        let st = w.stats("orders").unwrap();
        st.parked == 1 && st.acked == 1
    })
    .await;
    let st = w.shutdown().await.subscribers["orders"];
    assert_eq!(st.requeued, 0, "{st:?}");
    assert_eq!(vh.depth("orders.parking").await, 1);
    assert_eq!(vh.depth("orders").await, 0);
}

/// A handler that never finishes on its own.
fn stuck() -> Subscriber {
    Subscriber::new("orders", || async {
        tokio::time::sleep(Duration::from_secs(3600)).await;
        Ok::<_, BoxError>(())
    })
    .prefetch(5)
}

async fn three_in_flight(vh: &Vhost) {
    for _ in 0..3 {
        vh.publish_raw("", "orders", b"x", props()).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dropping_the_worker_handle_requeues_in_flight_and_closes_connections() {
    let vh = Broker::from_env().vhost("strand-drop");
    let w = vh.start_worker(stuck()).await;
    three_in_flight(&vh).await;
    wait_until(WAIT, "3 in flight", || async {
        w.stats("orders").unwrap().consumed == 3
    })
    .await;
    // A handler's clone of the worker's publisher must not keep a connection open.
    let publisher = w.publisher().clone();
    drop(w);
    wait_until(WAIT, "in-flight requeued", || async {
        vh.depth("orders").await == 3
    })
    .await;
    wait_until(WAIT, "both connections closed", || async {
        connections(&vh) == 0
    })
    .await;
    let late = publisher.publish(Envelope::new("", "orders", "late")).await;
    assert!(matches!(late, Err(Error::Closed { .. })), "{late:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cancelling_run_until_requeues_in_flight_and_closes_connections() {
    let vh = Broker::from_env().vhost("strand-cancel");
    let worker = Worker::new(ConnectionConfig::new(vh.url()))
        .shutdown_deadline(Duration::from_secs(5))
        .subscribe(stuck());
    let run = worker.run_until(std::future::pending());
    let feed = async {
        wait_until(WAIT, "queue declared", || async {
            vh.try_depth("orders").await.is_some()
        })
        .await;
        three_in_flight(&vh).await;
        wait_until(WAIT, "3 taken", || async {
            unacked(&vh, "orders") == Some(3)
        })
        .await;
    };
    tokio::select! {
        r = run => panic!("run_until ended on its own: {r:?}"),
        () = feed => {}
    }
    wait_until(WAIT, "in-flight requeued", || async {
        vh.depth("orders").await == 3
    })
    .await;
    wait_until(WAIT, "both connections closed", || async {
        connections(&vh) == 0
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unbounded_shutdown_deadline_waits_for_in_flight_handlers() {
    let vh = Broker::from_env().vhost("strand-max");
    let w = Worker::new(ConnectionConfig::new(vh.url()))
        .shutdown_deadline(Duration::MAX)
        .subscribe(Subscriber::new("orders", || async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            Ok::<_, BoxError>(())
        }))
        .start()
        .await
        .unwrap();
    vh.publish_raw("", "orders", b"x", props()).await;
    wait_until(WAIT, "in flight", || async {
        w.stats("orders").unwrap().consumed == 1
    })
    .await;
    let report = tokio::time::timeout(Duration::from_secs(15), w.shutdown())
        .await
        .expect("shutdown returns once the handler is done");
    assert_eq!(report.subscribers["orders"].acked, 1, "{report:?}");
    assert_eq!(vh.depth("orders").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_closed_publisher_refuses_later_publishes() {
    let vh = Broker::from_env().vhost("strand-pubclose");
    vh.declare_queue("q", FieldTable::default()).await;
    let p = Publisher::new(ConnectionConfig::new(vh.url()), PublisherConfig::default()).unwrap();
    let out = p.publish(Envelope::new("", "q", "one")).await.unwrap();
    assert!(out.is_confirmed(), "{out}");
    p.close(Duration::from_secs(5)).await;
    let err = p.publish(Envelope::new("", "q", "two")).await;
    assert!(matches!(err, Err(Error::Closed { .. })), "{err:?}");
    assert_eq!(vh.depth("q").await, 1, "nothing published after close");
    wait_until(WAIT, "no connection reopened", || async {
        connections(&vh) == 0
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shutdown_does_not_wait_for_a_reconnect_while_the_broker_is_down() {
    // The broker "goes down" behind a proxy: live connections cut, new ones refused. The
    // broker itself is untouched, so the test repeats on one node.
    let vh = Broker::from_env().vhost("strand-down");
    let proxy = Proxy::start(&vh.hostport(), Mode::Forward).await;
    let mut cc = ConnectionConfig::new(proxy.url("guest:guest", &vh.name));
    cc.max_backoff = Duration::from_millis(200);
    let w = Worker::new(cc)
        .shutdown_deadline(Duration::from_secs(1))
        .subscribe(Subscriber::new(
            "orders",
            rabbitkit_tests::counting_handler(Arc::default()),
        ))
        .start()
        .await
        .unwrap();
    wait_until(WAIT, "consuming", || async { w.is_ready() }).await;
    proxy.set(Mode::Refuse);
    proxy.cut();
    let result = async {
        wait_until(WAIT, "the worker notices", || async { !w.is_ready() }).await;
        // Let the consume loop get into its reconnect attempts.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let started = Instant::now();
        w.shutdown().await;
        started.elapsed()
    }
    .await;
    assert!(
        result < Duration::from_secs(5),
        "shutdown took {result:?} with the broker down"
    );
}
