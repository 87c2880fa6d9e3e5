//! The parking queue is a quorum queue (replicated) whose delivery limit browsing never
//! reaches, and the classic parking queue of an earlier release keeps working until
//! `rabbitkit parking migrate` moves every parked message into the quorum one, unchanged.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::time::Duration;

use lapin::BasicProperties;
use lapin::options::{BasicGetOptions, BasicNackOptions};
use lapin::types::{AMQPValue, FieldArray, FieldTable, LongString};
use rabbitkit::cli::EXIT_OK;
use rabbitkit_core::{BoxError, ConnectionConfig, Parking, RetryPolicy, Subscriber};
use rabbitkit_tests::logs::{capture, lines_with};
use rabbitkit_tests::{Broker, Got, Vhost, table, wait_until};

const WAIT: Duration = Duration::from_secs(20);

/// A subscriber on `queue` whose handler always fails, with no retries: every message is
/// parked at once (default topology: classic work queue, quorum tiers).
fn failing(queue: &str) -> Subscriber {
    Subscriber::new(queue, || async {
        Err::<(), BoxError>("ledger offline".into())
    })
    .retry(RetryPolicy::none())
}

/// The queue as the management API describes it.
fn described(vh: &Vhost, queue: &str) -> serde_json::Value {
    let (status, body) = rabbitkit_tests::http(
        &vh.broker.mgmt,
        "GET",
        &format!("/api/queues/{}/{queue}", vh.name),
        None,
    );
    assert_eq!(status, 200, "GET queue {queue}: {body}");
    serde_json::from_str(&body).unwrap()
}

/// Reads every message of `queue` without removing any (held unacked, then nacked with
/// requeue), in queue order.
async fn browse(vh: &Vhost, queue: &str) -> Vec<Got> {
    let c = vh.connect().await;
    let ch = c.create_channel().await.unwrap();
    let mut out = Vec::new();
    let mut last = None;
    while let Some(m) = ch
        .basic_get(queue.into(), BasicGetOptions { no_ack: false })
        .await
        .unwrap()
    {
        let d = m.delivery;
        last = Some(d.delivery_tag);
        out.push(Got {
            body: d.data,
            routing_key: d.routing_key.to_string(),
            exchange: d.exchange.to_string(),
            redelivered: d.redelivered,
            properties: d.properties,
        });
    }
    if let Some(tag) = last {
        ch.basic_nack(
            tag,
            BasicNackOptions {
                multiple: true,
                requeue: true,
            },
        )
        .await
        .unwrap();
    }
    let _ = c.close(200, "".into()).await;
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parking_queue_is_quorum_and_browsing_does_not_drop_parked_messages() {
    let vh = Broker::from_env().vhost("park-quorum");
    let w = vh.start_worker(failing("invoices")).await;
    vh.publish_raw("", "invoices", b"park me", BasicProperties::default())
        .await;
    wait_until(WAIT, "parked", || async {
        vh.depth("invoices.parking").await == 1
    })
    .await;
    w.shutdown().await;
    let q = described(&vh, "invoices.parking");
    assert_eq!(q["type"], "quorum", "{q}");
    assert_eq!(
        q["arguments"]["x-delivery-limit"],
        i64::from(i32::MAX),
        "{q}"
    );
    assert!(
        q["arguments"].get("x-dead-letter-exchange").is_none(),
        "{q}"
    );
    // Each peek takes the message unacked and requeues it; on 3.10-4.2 each requeue counts
    // toward a quorum queue's delivery limit (20 by default on 4.0, where a message past it
    // is dropped).
    let parking = Parking::new(ConnectionConfig::new(vh.url()), "invoices").unwrap();
    for i in 0..30 {
        let seen = parking.peek(10).await.unwrap();
        assert_eq!(seen.len(), 1, "peek {i}");
        assert_eq!(&seen[0].body[..], b"park me", "peek {i}");
    }
    // A replay that passes the message over holds it until its channel closes: a requeue too.
    for _ in 0..5 {
        let r = parking.replay_matching(10, |_| false).await.unwrap();
        assert_eq!(r.replayed, 0);
    }
    assert_eq!(parking.count().await.unwrap(), 1, "still parked");
    let r = parking.replay(10).await.unwrap();
    assert_eq!((r.replayed, r.remaining), (1, 0), "{r:?}");
    parking.close().await;
    let back = vh.get_all("invoices", 10).await;
    assert_eq!(back.len(), 1);
    assert_eq!(back[0].body, b"park me");
}

/// The messages a classic parking queue of the previous release holds: headers of many
/// types (evidence, a signature-like header, a nested table and an array), binary bodies,
/// every property rabbitkit copies.
fn previous_release_messages(n: usize) -> Vec<(Vec<u8>, BasicProperties)> {
    (0..n)
        .map(|i| {
            let mut nested = FieldTable::default();
            nested.insert("reason".into(), AMQPValue::LongString("rejected".into()));
            nested.insert("count".into(), AMQPValue::LongLongInt(i as i64 + 1));
            let headers = table(&[
                (
                    "x-rabbitkit-park-reason",
                    AMQPValue::LongString(LongString::from("max-attempts")),
                ),
                ("x-rabbitkit-attempt", AMQPValue::LongLongInt(3)),
                (
                    "x-rabbitkit-error-message",
                    AMQPValue::LongString(LongString::from(format!("boom {i} ✓"))),
                ),
                (
                    "x-rabbitkit-signature",
                    AMQPValue::LongString(LongString::from(format!("v1:{i:064x}"))),
                ),
                ("x-small", AMQPValue::ShortShortInt(-7)),
                ("x-flag", AMQPValue::Boolean(true)),
                ("x-table", AMQPValue::FieldTable(nested.clone())),
                (
                    "x-array",
                    AMQPValue::FieldArray(FieldArray::from(vec![
                        AMQPValue::FieldTable(nested),
                        AMQPValue::LongInt(5),
                    ])),
                ),
            ]);
            let props = BasicProperties::default()
                .with_message_id(format!("old-{i}").into())
                .with_correlation_id(format!("corr-{i}").into())
                .with_content_type("application/octet-stream".into())
                .with_timestamp(1_700_000_000 + i as u64)
                .with_headers(headers);
            let body = vec![0u8, 255, i as u8, b'\n', 0xC3, 0x28];
            (body, props)
        })
        .collect()
}

/// `g` without the headers a quorum queue adds on delivery.
fn without_delivery_counts(mut g: Got) -> Got {
    if let Some(h) = g.properties.headers().clone() {
        let mut kept = FieldTable::default();
        for (k, v) in h.inner() {
            if !matches!(k.as_str(), "x-delivery-count" | "x-acquired-count") {
                kept.insert(k.clone(), v.clone());
            }
        }
        g.properties = g.properties.with_headers(kept);
    }
    g
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn classic_parking_queue_of_the_previous_release_keeps_working_then_migrates_without_loss() {
    capture(tracing::Level::INFO);
    let vh = Broker::from_env().vhost("park-migrate");
    // As the previous release declared it: classic, no arguments; holding what it parked.
    vh.declare_queue("orders.parking", FieldTable::default())
        .await;
    let old = previous_release_messages(5);
    rabbitkit_tests::publish_confirmed(&vh.url(), "", "orders.parking", old.clone()).await;
    // The new release starts on it, and parks into it.
    let w = vh.start_worker(failing("orders")).await;
    wait_until(WAIT, "consuming", || async { w.is_ready() }).await;
    vh.publish_raw(
        "",
        "orders",
        b"parked by the new release",
        BasicProperties::default().with_message_id("new-0".into()),
    )
    .await;
    wait_until(WAIT, "parked into the classic queue", || async {
        vh.depth("orders.parking").await == 6
    })
    .await;
    let st = w.shutdown().await.subscribers["orders"];
    assert_eq!((st.parked, st.settlement_failures), (1, 0), "{st:?}");
    assert_eq!(described(&vh, "orders.parking")["type"], "classic");
    let warned = lines_with("rabbitkit parking migrate orders");
    assert_eq!(warned.len(), 1, "one warning at start: {warned:?}");
    assert!(
        warned[0].contains("WARN") && warned[0].contains("parking_queue=orders.parking"),
        "{warned:?}"
    );
    // What it holds, byte for byte, before the migration.
    let before = browse(&vh, "orders.parking").await;
    assert_eq!(before.len(), 6);

    let url = vh.url();
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let args = ["rabbitkit", "parking", "migrate", "orders", "--url", &url];
    let code = rabbitkit::cli::run(args, &mut out, &mut err).await;
    let (out, err) = (
        String::from_utf8_lossy(&out).into_owned(),
        String::from_utf8_lossy(&err).into_owned(),
    );
    assert_eq!(code, EXIT_OK, "{out}\n{err}");
    assert!(out.contains("6 moved out"), "{out}");
    assert!(out.contains("migrated"), "{out}");

    let q = described(&vh, "orders.parking");
    assert_eq!(q["type"], "quorum", "{q}");
    assert_eq!(
        q["arguments"]["x-delivery-limit"],
        i64::from(i32::MAX),
        "{q}"
    );
    assert_eq!(vh.try_depth("orders.parking.migrating").await, None);
    // A quorum queue adds its own delivery counts to what it delivers (3.10: always), not
    // to what it stores: they are left out of the comparison.
    let after: Vec<Got> = vh
        .get_all("orders.parking", 100)
        .await
        .into_iter()
        .map(without_delivery_counts)
        .collect();
    assert_eq!(after.len(), 6, "every parked message moved");
    for (a, b) in after.iter().zip(&before) {
        assert_eq!(a.body, b.body);
        assert_eq!(a.properties.headers(), b.properties.headers());
        assert_eq!(a.properties.message_id(), b.properties.message_id());
        assert_eq!(a.properties.correlation_id(), b.properties.correlation_id());
        assert_eq!(a.properties.content_type(), b.properties.content_type());
        assert_eq!(a.properties.timestamp(), b.properties.timestamp());
        assert_eq!(a.properties.delivery_mode(), b.properties.delivery_mode());
    }
    for ((body, props), a) in old.iter().zip(&after) {
        assert_eq!(&a.body, body);
        assert_eq!(a.properties.headers(), props.headers(), "headers unchanged");
    }
    assert_eq!(
        after[5]
            .properties
            .message_id()
            .as_ref()
            .map(|s| s.as_str()),
        Some("new-0")
    );
    // Put back (they were taken to be read), then a worker parks into the quorum queue.
    rabbitkit_tests::publish_confirmed(
        &vh.url(),
        "",
        "orders.parking",
        after.iter().map(|g| (g.body.clone(), g.properties.clone())),
    )
    .await;
    let w = vh.start_worker(failing("orders")).await;
    vh.publish_raw("", "orders", b"after", BasicProperties::default())
        .await;
    wait_until(WAIT, "parked into the quorum queue", || async {
        vh.depth("orders.parking").await == 7
    })
    .await;
    w.shutdown().await;
    assert_eq!(
        lines_with("rabbitkit parking migrate orders").len(),
        1,
        "no warning once migrated"
    );
    // A second run finds the quorum queue and moves nothing.
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = rabbitkit::cli::run(args, &mut out, &mut err).await;
    let out = String::from_utf8_lossy(&out).into_owned();
    assert_eq!(code, EXIT_OK, "{out}");
    assert!(out.contains("is the quorum parking queue"), "{out}");
    assert_eq!(vh.depth("orders.parking").await, 7);
}
