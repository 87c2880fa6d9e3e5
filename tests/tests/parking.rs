//! Parking-queue tooling against a real broker: inspect without loss, replay with the
//! parked original acked only after its copy is confirmed, a refused replay loses nothing.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use lapin::BasicProperties;
use rabbitkit_core::extract::{Body, RoutingKey};
use rabbitkit_core::headers::{self, Attempt};
use rabbitkit_core::{
    BoxError, ConnectionConfig, Delivery, Error, Parking, Permanent, RetryPolicy, Subscriber,
};
use rabbitkit_tests::{Broker, Vhost, wait_until};

const WAIT: Duration = Duration::from_secs(20);

/// Parks `n` messages published to `shop` / `order.paid` with a handler that always fails.
async fn park(vh: &Vhost, n: u32) {
    let failing = Subscriber::new("orders", || async {
        Err::<(), BoxError>("ledger offline".into())
    })
    .bind("shop", "order.*")
    .retry(RetryPolicy::none());
    let w = vh.start_worker(failing).await;
    for i in 0..n {
        let props = BasicProperties::default().with_message_id(format!("m-{i}").into());
        vh.publish_raw("shop", "order.paid", format!("body-{i}").as_bytes(), props)
            .await;
    }
    wait_until(WAIT, "all parked", || async {
        vh.depth("orders.parking").await == n
    })
    .await;
    let st = w.shutdown().await.subscribers["orders"];
    assert_eq!(st.parked, u64::from(n));
}

#[tokio::test]
async fn peek_reads_evidence_and_leaves_every_message_parked() {
    let vh = Broker::from_env().vhost("park-peek");
    park(&vh, 3).await;
    let parking = Parking::new(ConnectionConfig::new(vh.url()), "orders").unwrap();
    assert_eq!(parking.queue(), "orders.parking");
    assert_eq!(parking.count().await.unwrap(), 3);
    let msgs = parking.peek(10).await.unwrap();
    assert_eq!(msgs.len(), 3);
    let bodies: Vec<_> = msgs.iter().map(|m| m.body.to_vec()).collect();
    assert_eq!(
        bodies,
        vec![b"body-0".to_vec(), b"body-1".to_vec(), b"body-2".to_vec()]
    );
    let m = &msgs[0];
    assert_eq!(m.reason.as_deref(), Some("max-attempts"));
    assert_eq!(m.error_message.as_deref(), Some("ledger offline"));
    assert_eq!(m.attempts, Some(1));
    assert_eq!(m.original_routing_key.as_deref(), Some("order.paid"));
    assert_eq!(m.original_exchange.as_deref(), Some("shop"));
    assert_eq!(m.handler.as_deref(), Some("orders"));
    // Peeking twice sees the same messages: nothing was consumed.
    assert_eq!(parking.peek(2).await.unwrap().len(), 2);
    assert_eq!(parking.count().await.unwrap(), 3);
    assert_eq!(vh.depth("orders.parking").await, 3);
    parking.close().await;
}

#[tokio::test]
async fn replay_moves_messages_back_with_fresh_attempts_and_their_route() {
    let vh = Broker::from_env().vhost("park-replay");
    park(&vh, 4).await;
    let parking = Parking::new(ConnectionConfig::new(vh.url()), "orders").unwrap();
    // Replay two, then the rest.
    let first = parking.replay(2).await.unwrap();
    assert_eq!((first.replayed, first.remaining), (2, 2));
    assert!(first.stopped.is_none());
    assert_eq!(vh.depth("orders").await, 2);

    let seen = Arc::new(Mutex::new(Vec::new()));
    let s2 = seen.clone();
    let fixed = Subscriber::new(
        "orders",
        move |RoutingKey(key): RoutingKey, attempt: Attempt, d: Delivery| {
            let seen = s2.clone();
            async move {
                let replayed = d
                    .header(headers::REPLAYED)
                    .and_then(|v| v.as_long_long_int());
                let stripped = d.header(headers::ERROR_MESSAGE).is_none()
                    && d.header(headers::PARK_REASON).is_none();
                seen.lock()
                    .unwrap()
                    .push((key, attempt.number, replayed, stripped));
                Ok::<_, BoxError>(())
            }
        },
    )
    .bind("shop", "order.*")
    .retry(RetryPolicy::none());
    let w = vh.start_worker(fixed).await;
    let rest = parking.replay(usize::MAX).await.unwrap();
    assert_eq!((rest.replayed, rest.remaining), (2, 0));
    wait_until(WAIT, "4 replayed handled", || async {
        w.stats("orders").unwrap().acked == 4
    })
    .await;
    w.shutdown().await;
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 4);
    for (key, attempt, replayed, stripped) in seen {
        assert_eq!(key, "order.paid", "original routing key restored");
        assert_eq!(attempt, 1, "a replay starts again at attempt 1");
        assert_eq!(replayed, Some(1));
        assert!(stripped, "failure evidence stripped from the replayed copy");
    }
    assert_eq!(parking.count().await.unwrap(), 0);
    parking.close().await;
}

#[tokio::test]
async fn replay_matching_replays_only_the_selected_and_keeps_the_rest_in_order() {
    let vh = Broker::from_env().vhost("park-select");
    // Odd bodies fail permanently, even ones run out of attempts.
    let failing = Subscriber::new("orders", |Body(b): Body| async move {
        let n: u32 = String::from_utf8_lossy(&b).parse().unwrap_or(0);
        if n % 2 == 1 {
            Err::<(), BoxError>(Permanent::new("bad card").into())
        } else {
            Err("ledger offline".into())
        }
    })
    .retry(RetryPolicy::none());
    let w = vh.start_worker(failing).await;
    for n in 0..6u32 {
        vh.publish_raw(
            "",
            "orders",
            n.to_string().as_bytes(),
            BasicProperties::default(),
        )
        .await;
    }
    wait_until(WAIT, "6 parked", || async {
        vh.depth("orders.parking").await == 6
    })
    .await;
    w.shutdown().await;
    let parking = Parking::new(ConnectionConfig::new(vh.url()), "orders").unwrap();
    let r = parking
        .replay_matching(usize::MAX, |m| m.reason.as_deref() == Some("max-attempts"))
        .await
        .unwrap();
    assert_eq!((r.replayed, r.remaining), (3, 3));
    assert!(r.stopped.is_none());
    let mut replayed: Vec<_> = vh
        .get_all("orders", 10)
        .await
        .into_iter()
        .map(|g| g.body)
        .collect();
    replayed.sort();
    assert_eq!(replayed, vec![b"0".to_vec(), b"2".to_vec(), b"4".to_vec()]);
    let kept: Vec<_> = parking.peek(10).await.unwrap();
    let kept_bodies: Vec<_> = kept.iter().map(|m| m.body.to_vec()).collect();
    assert_eq!(
        kept_bodies,
        vec![b"1".to_vec(), b"3".to_vec(), b"5".to_vec()],
        "passed over, in order"
    );
    assert!(
        kept.iter()
            .all(|m| m.reason.as_deref() == Some("permanent"))
    );
    assert!(
        kept.iter()
            .all(|m| m.error_message.as_deref() == Some("bad card")),
        "message not repeated"
    );
    parking.close().await;
}

#[tokio::test]
async fn replay_that_cannot_be_confirmed_stops_and_keeps_the_message_parked() {
    let vh = Broker::from_env().vhost("park-refused");
    park(&vh, 2).await;
    // Without the work queue the replayed copy is unroutable: returned, not confirmed.
    vh.delete_queue("orders").await;
    let parking = Parking::new(ConnectionConfig::new(vh.url()), "orders").unwrap();
    let r = parking.replay(10).await.unwrap();
    assert_eq!(r.replayed, 0);
    assert_eq!(r.remaining, 2);
    let why = r.stopped.expect("stopped");
    assert!(why.contains("Returned"), "{why}");
    assert_eq!(vh.depth("orders.parking").await, 2, "nothing lost");
    parking.close().await;
}

#[tokio::test]
async fn missing_parking_queue_is_a_typed_error_and_bad_names_are_refused() {
    let vh = Broker::from_env().vhost("park-missing");
    let parking = Parking::new(ConnectionConfig::new(vh.url()), "nothing-here").unwrap();
    assert!(matches!(parking.count().await, Err(Error::Topology(_))));
    assert!(matches!(parking.replay(1).await, Err(Error::Topology(_))));
    parking.close().await;
    let long = "q".repeat(250);
    assert!(matches!(
        Parking::new(ConnectionConfig::new(vh.url()), long),
        Err(Error::InvalidName { .. })
    ));
}
