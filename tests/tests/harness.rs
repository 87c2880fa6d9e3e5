//! Proves the harness: fresh vhost, durable queue, confirmed persistent publish, consume,
//! ack, and the broker version the run expects.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use futures_util::StreamExt;
use lapin::BasicProperties;
use lapin::options::{BasicAckOptions, BasicConsumeOptions};
use lapin::types::FieldTable;
use rabbitkit_tests::Broker;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn harness_publishes_consumes_and_acks_on_the_expected_broker() {
    let broker = Broker::from_env();
    let version = broker.server_version();
    // Each line is one Debian package: 3 is 3.10 (bookworm), 4 is 4.0 (trixie), 4.3 (forky).
    let expected = match broker.version.as_str() {
        "3" => "3.10.",
        "4" => "4.0.",
        "4.3" => "4.3.",
        other => panic!("RABBITKIT_TEST_VERSION={other}: expected 3, 4 or 4.3"),
    };
    assert!(
        version.starts_with(expected),
        "expected RabbitMQ {expected}x for line {}, the broker says {version}",
        broker.version
    );
    let vh = broker.vhost("harness");
    vh.declare_queue("harness", FieldTable::default()).await;
    vh.publish_raw("", "harness", b"hello", BasicProperties::default())
        .await;
    assert_eq!(vh.depth("harness").await, 1);

    let c = vh.connect().await;
    let ch = c.create_channel().await.unwrap();
    let mut consumer = ch
        .basic_consume(
            "harness".into(),
            "t".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let d = tokio::time::timeout(std::time::Duration::from_secs(10), consumer.next())
        .await
        .expect("a delivery within 10 s")
        .expect("stream open")
        .expect("delivery ok");
    assert_eq!(d.data, b"hello");
    assert_eq!(*d.properties.delivery_mode(), Some(2));
    assert!(d.acker.ack(BasicAckOptions::default()).await.unwrap());
    drop(consumer);
    let _ = c.close(200, "".into()).await;
    assert_eq!(vh.depth("harness").await, 0);
}
