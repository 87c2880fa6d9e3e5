//! The idempotency layer on a real broker: a message processed and marked, whose ack is
//! lost to a forced connection close, is redelivered and acked without a second effect.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lapin::BasicProperties;
use rabbitkit_core::delivery::Delivery;
use rabbitkit_core::idempotency::{IdempotencyStore, IdempotentLayer, KeyBy, MemoryStore};
use rabbitkit_core::subscriber::BoxDeliveryService;
use rabbitkit_core::{BoxError, Subscriber};
use rabbitkit_tests::{Broker, Vhost, counting_handler, http, wait_until};
use tokio::sync::Notify;
use tower::ServiceExt;

const WAIT: Duration = Duration::from_secs(30);

/// Force-closes every connection of the vhost through the management API (works from any
/// checkout, unlike rabbitmqctl, which needs the node's cookie) once the worker's two are
/// listed; returns how many.
fn connection_names(vh: &Vhost) -> Vec<String> {
    let path = format!("/api/vhosts/{}/connections", vh.name);
    let (status, body) = http(&vh.broker.mgmt, "GET", &path, None);
    assert_eq!(status, 200, "list connections: {body}");
    let list: Vec<serde_json::Value> = serde_json::from_str(&body).unwrap();
    list.iter()
        .map(|c| c["name"].as_str().unwrap().to_owned())
        .collect()
}

/// Closes every connection of `vh`; returns their names.
fn close_connections(vh: &Vhost) -> Vec<String> {
    let mgmt = &vh.broker.mgmt;
    // The management API lists a connection only once its stats arrive (seconds).
    let started = std::time::Instant::now();
    let list = loop {
        let list = connection_names(vh);
        if list.len() >= 2 || started.elapsed() > WAIT {
            break list;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    for name in &list {
        let encoded: String = name
            .bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' => {
                    char::from(b).to_string()
                }
                _ => format!("%{b:02X}"),
            })
            .collect();
        let (status, body) = http(mgmt, "DELETE", &format!("/api/connections/{encoded}"), None);
        assert!(
            status == 204 || status == 200,
            "close {name}: {status} {body}"
        );
    }
    list
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn duplicate_after_a_lost_ack_is_acked_without_a_second_effect() {
    let vh = Arc::new(Broker::from_env().vhost("dedup-cut"));
    let store = Arc::new(MemoryStore::new(1000, Duration::from_secs(600)));
    let effects = Arc::new(AtomicU32::new(0));
    // Redelivered flags of every delivery that reached the layers.
    let seen = Arc::new(Mutex::new(Vec::new()));
    // Holds the first delivery's ack back until the connection has been closed.
    let release = Arc::new(Notify::new());

    let handler = counting_handler(effects.clone());
    let (seen2, release2) = (seen.clone(), release.clone());
    // Outermost layer: runs after the idempotency layer has marked the key, before the
    // runtime acks; the first delivery waits there while the test cuts the connection.
    let hold_first_ack = tower::layer::layer_fn(move |inner: BoxDeliveryService| {
        let (seen, release) = (seen2.clone(), release2.clone());
        tower::service_fn(move |d: Delivery| {
            let (inner, seen, release) = (inner.clone(), seen.clone(), release.clone());
            async move {
                let redelivered = d.redelivered();
                seen.lock().unwrap().push(redelivered);
                let outcome = inner.oneshot(d).await?;
                if !redelivered {
                    release.notified().await;
                }
                Ok::<_, BoxError>(outcome)
            }
        })
    });
    let sub = Subscriber::new("deposits", handler)
        .layer(IdempotentLayer::new(store.clone()))
        .layer(hold_first_ack);
    let w = vh.start_worker(sub).await;
    vh.publish_raw(
        "",
        "deposits",
        b"{\"cents\":500}",
        BasicProperties::default().with_message_id("dep-1".into()),
    )
    .await;

    wait_until(WAIT, "the effect done and the key marked", || async {
        store
            .seen(&KeyBy::MessageIdAndBody.key_of("dep-1", b"{\"cents\":500}"))
            .await
            .unwrap_or(false)
    })
    .await;
    assert_eq!(effects.load(Ordering::SeqCst), 1);
    let v2 = vh.clone();
    let closed = tokio::task::spawn_blocking(move || close_connections(&v2))
        .await
        .unwrap();
    assert!(
        closed.len() >= 2,
        "consumer and publisher connections closed: {closed:?}"
    );
    // The close is asked of the broker; the worker sees it later. Release the held ack
    // only once the worker has connected again, so it certainly goes to the dead channel.
    wait_until(WAIT, "the worker connected again", || {
        let (v, closed) = (vh.clone(), closed.clone());
        async move {
            tokio::task::spawn_blocking(move || connection_names(&v))
                .await
                .unwrap()
                .iter()
                .any(|n| !closed.contains(n))
        }
    })
    .await;
    release.notify_one();

    wait_until(WAIT, "the redelivery acked and the queue empty", || async {
        w.stats("deposits").unwrap().acked >= 1 && vh.depth("deposits").await == 0
    })
    .await;
    let st = w.shutdown().await.subscribers["deposits"];
    assert!(
        st.ack_lost >= 1,
        "the first ack was lost to the cut: {st:?}"
    );
    assert_eq!(
        *seen.lock().unwrap(),
        vec![false, true],
        "delivered once, redelivered once"
    );
    assert_eq!(
        effects.load(Ordering::SeqCst),
        1,
        "the duplicate had no second effect"
    );
    assert_eq!(st.acked, 1, "only the redelivery's ack reached the broker");
    assert_eq!((st.retried, st.parked, st.requeued), (0, 0, 0));
    assert_eq!(vh.depth("deposits").await, 0);
    assert_eq!(vh.depth("deposits.parking").await, 0);
}
