//! The publisher's size check against the negotiated `frame_max`: a copy is measured as it
//! will be sent (publish token, trace headers, message id) against one content-header
//! frame of the connection, never against a fixed budget. A copy that passed the check and
//! failed on send would be requeued uncounted (for ever on a classic queue), and each
//! attempt would close the publisher's connection and fail every other copy in flight.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::time::Duration;

use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable};
use rabbitkit_core::headers;
use rabbitkit_core::{
    BoxError, ConnectionConfig, Envelope, Error, Publisher, PublisherConfig, RetryPolicy,
    Subscriber, Worker,
};
use rabbitkit_tests::{Broker, table, wait_until};

const WAIT: Duration = Duration::from_secs(20);

/// An envelope for `queue` whose one header holds `len` bytes.
fn with_header(queue: &str, len: usize) -> Envelope {
    let mut t = FieldTable::default();
    t.insert("big".into(), AMQPValue::LongString("b".repeat(len).into()));
    Envelope::new("", queue, "x").properties(
        BasicProperties::default()
            .with_message_id("m-1".into())
            .with_headers(t),
    )
}

/// With 8 KiB frames negotiated, the publisher's budget is that frame, and a publish over
/// it is refused before it is sent: the connection stays up and the next publish is
/// confirmed on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_over_the_negotiated_frame_is_refused_unsent_and_the_connection_stays() {
    let vh = Broker::from_env().vhost("frame-pub");
    vh.declare_queue("q", FieldTable::default()).await;
    let url = format!("{}?frame_max=8192", vh.url());
    let p = Publisher::new(ConnectionConfig::new(url), PublisherConfig::default()).unwrap();
    p.connect().await.unwrap();
    let budget = p.properties_budget();
    assert!(
        (8000..8192).contains(&budget),
        "one 8 KiB content-header frame, less its fields and the token's room: {budget}"
    );
    // Fits the old fixed 120 KiB budget by far; not this connection's frame.
    let big = with_header("q", 9000);
    assert!(matches!(p.check(&big), Err(Error::InvalidHeader { .. })));
    assert!(matches!(
        p.publish(big).await,
        Err(Error::InvalidHeader { .. })
    ));
    let ok = p.publish(with_header("q", 4000)).await.unwrap();
    assert!(ok.is_confirmed(), "{ok}");
    let st = p.stats();
    assert_eq!((st.failed, st.confirmed), (0, 1), "{st:?}");
    assert_eq!(vh.depth("q").await, 1);
    p.close(Duration::from_secs(5)).await;
}

/// A failing message that fits the 8 KiB frame as delivered, but not once the retry
/// copy's evidence headers are added: the copy is refused by the check, so a trimmed copy
/// is parked (reason `unpublishable`, the oversized producer header dropped), never an
/// endless requeue through a publisher connection that the broker closes on every attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_copy_over_the_negotiated_frame_is_parked_trimmed_not_requeued_for_ever() {
    let vh = Broker::from_env().vhost("frame-copy");
    // A 1000-byte error message: the copy's evidence headers take over 1 KiB.
    let sub = Subscriber::new("orders", || async {
        Err::<(), BoxError>("e".repeat(1000).into())
    })
    .retry(RetryPolicy::new([Duration::from_millis(200)]));
    let url = format!("{}?frame_max=8192", vh.url());
    let w = Worker::new(ConnectionConfig::new(url))
        .shutdown_deadline(Duration::from_secs(5))
        .subscribe(sub)
        .start()
        .await
        .unwrap();
    // About 7.3 KiB of properties: delivered within the consumer's 8 KiB frames.
    vh.publish_raw(
        "",
        "orders",
        b"{}",
        BasicProperties::default()
            .with_message_id("m-big".into())
            .with_headers(table(&[(
                "big",
                AMQPValue::LongString("b".repeat(7200).into()),
            )])),
    )
    .await;
    wait_until(WAIT, "the trimmed copy parked", || async {
        vh.depth("orders.parking").await == 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let st = w.shutdown().await.subscribers["orders"];
    assert_eq!(
        (st.parked, st.retried, st.requeued, st.settlement_failures),
        (1, 0, 0, 0),
        "{st:?}"
    );
    assert_eq!(vh.depth("orders").await, 0);
    let parked = vh.get_all("orders.parking", 2).await;
    assert_eq!(parked.len(), 1);
    let m = &parked[0];
    assert_eq!(
        m.header_str(headers::PARK_REASON).as_deref(),
        Some("unpublishable")
    );
    assert!(
        m.header("big").is_none(),
        "the oversized header was dropped"
    );
    assert_eq!(m.header_int(headers::HEADERS_DROPPED), Some(1));
    assert_eq!(m.body, b"{}", "the body is kept");
    assert_eq!(
        m.properties.message_id().as_ref().map(|s| s.as_str()),
        Some("m-big")
    );
}
