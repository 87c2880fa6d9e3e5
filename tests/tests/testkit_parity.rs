//! The broker-free test kit against the real runtime: every case of the table is run
//! through `TestKit` and through a worker on the broker, and the settlements must be the
//! same (same decision, same copy: exchange, routing key, body, properties, headers apart
//! from the failure timestamps).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::collections::BTreeMap;
use std::time::Duration;

use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable, ShortString};
use rabbitkit_core::extract::Json;
use rabbitkit_core::headers;
use rabbitkit_core::testing::{Settlement, TestDelivery, TestKit};
use rabbitkit_core::{
    AckPolicy, BoxError, ConnectionConfig, HeaderKeys, HeaderTrust, Permanent, RetryPolicy, Settle,
    Subscriber, SubscriberStats, Worker,
};
use rabbitkit_tests::{Broker, Got, Vhost, table, wait_until};

/// Long enough that a retry copy is still in its tier when the test reads it back.
const TIER: Duration = Duration::from_secs(60);
const WAIT: Duration = Duration::from_secs(30);

#[derive(serde::Deserialize)]
struct Order {
    #[allow(dead_code)]
    id: u64,
}

struct Case {
    name: &'static str,
    body: &'static [u8],
    /// The attempt header the published message carries.
    attempt: Option<u32>,
    subscriber: fn(&str) -> Subscriber,
    /// The decision label both sides must reach.
    expect: &'static str,
}

fn policy() -> RetryPolicy {
    RetryPolicy::new([TIER]).max_attempts(3)
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "success",
            body: br#"{"id":1}"#,
            attempt: None,
            subscriber: |q| {
                Subscriber::new(q, |Json(_o): Json<Order>| async { Ok::<_, BoxError>(()) })
                    .retry(policy())
            },
            expect: "ack",
        },
        Case {
            name: "transient",
            body: br#"{"id":2}"#,
            attempt: None,
            subscriber: |q| {
                Subscriber::new(q, |Json(_o): Json<Order>| async {
                    Err::<(), BoxError>("db down".into())
                })
                .retry(policy())
            },
            expect: "retry",
        },
        Case {
            name: "permanent",
            body: br#"{"id":3}"#,
            attempt: None,
            subscriber: |q| {
                Subscriber::new(q, |Json(_o): Json<Order>| async {
                    Err::<(), _>(Permanent::new("unknown sku"))
                })
                .retry(policy())
            },
            expect: "park",
        },
        Case {
            name: "poison",
            body: b"{not json",
            attempt: None,
            subscriber: |q| {
                Subscriber::new(q, |Json(_o): Json<Order>| async { Ok::<_, BoxError>(()) })
                    .retry(policy())
            },
            expect: "park",
        },
        Case {
            name: "max-attempts",
            body: br#"{"id":5}"#,
            attempt: Some(3),
            subscriber: |q| {
                Subscriber::new(q, |Json(_o): Json<Order>| async {
                    Err::<(), BoxError>("still down".into())
                })
                .retry(policy())
            },
            expect: "park",
        },
        Case {
            name: "manual-settle",
            body: br#"{"id":6}"#,
            attempt: None,
            subscriber: |q| {
                Subscriber::new(q, |settle: Settle| async move {
                    settle.retry("call me later").await;
                })
                .ack_policy(AckPolicy::Manual)
                .retry(policy())
            },
            expect: "retry",
        },
        Case {
            name: "manual-forgot",
            body: br#"{"id":7}"#,
            attempt: None,
            subscriber: |q| {
                Subscriber::new(q, |_settle: Settle| async {})
                    .ack_policy(AckPolicy::Manual)
                    .retry(policy())
            },
            expect: "requeue",
        },
        Case {
            name: "panic",
            body: br#"{"id":8}"#,
            attempt: None,
            subscriber: |q| {
                Subscriber::new(q, |Json(o): Json<Order>| async move {
                    if o.id == 8 {
                        panic!("handler bug");
                    }
                })
                .retry(policy())
            },
            expect: "retry",
        },
        Case {
            name: "deadline",
            body: br#"{"id":9}"#,
            attempt: None,
            subscriber: |q| {
                Subscriber::new(q, || async {
                    tokio::time::sleep(Duration::from_secs(30)).await;
                })
                .deadline(Duration::from_millis(100))
                .retry(policy())
            },
            expect: "retry",
        },
    ]
}

fn queue(c: &Case) -> String {
    format!("parity.{}", c.name)
}

fn routing_key(c: &Case) -> String {
    format!("order.{}", c.name)
}

fn properties(c: &Case) -> BasicProperties {
    let mut p = BasicProperties::default()
        .with_content_type("application/json".into())
        .with_correlation_id("corr-1".into())
        .with_message_id(format!("m-{}", c.name).into());
    if let Some(n) = c.attempt {
        // As a retry copy carries it: signed, or the runtime would not believe it.
        let mut h = table(&[(headers::ATTEMPT, AMQPValue::LongLongInt(i64::from(n)))]);
        trust().sign(&mut h, c.body);
        p = p.with_headers(h);
    }
    p
}

/// The key both the kit and the worker sign with.
fn trust() -> HeaderTrust {
    HeaderTrust::signed(HeaderKeys::new("parity-test-key-0123456789").unwrap())
}

fn subscriber(c: &Case) -> Subscriber {
    (c.subscriber)(&queue(c)).bind("shop", routing_key(c))
}

async fn through_the_kit(c: &Case) -> Settlement {
    let d = TestDelivery::new(c.body)
        .route("shop", routing_key(c))
        // `publish_raw` sends persistent messages.
        .properties(properties(c).with_delivery_mode(2));
    TestKit::new(subscriber(c))
        .header_trust(trust())
        .run(d)
        .await
}

/// What the runtime did with the case's message, read back from the broker.
struct Observed {
    label: &'static str,
    copy: Option<Got>,
}

async fn observe(vh: &Vhost, c: &Case, st: &SubscriberStats) -> Observed {
    let q = queue(c);
    let mut retried = vh.get_all(&format!("{q}.delay.1m"), 10).await;
    let mut parked = vh.get_all(&format!("{q}.parking"), 10).await;
    assert!(
        retried.len() + parked.len() <= 1,
        "{}: one copy at most, got {} retry and {} parking copies",
        c.name,
        retried.len(),
        parked.len()
    );
    if let Some(g) = retried.pop() {
        assert_eq!(st.retried, 1, "{}: {st:?}", c.name);
        return Observed {
            label: "retry",
            copy: Some(g),
        };
    }
    if let Some(g) = parked.pop() {
        assert_eq!(st.parked, 1, "{}: {st:?}", c.name);
        return Observed {
            label: "park",
            copy: Some(g),
        };
    }
    let label = if st.requeued >= 1 {
        "requeue"
    } else if st.rejected >= 1 {
        "reject"
    } else if st.acked == 1 {
        "ack"
    } else {
        panic!("{}: no settlement observed: {st:?}", c.name)
    };
    Observed { label, copy: None }
}

/// Headers without the failure timestamps (the only values that differ between two runs).
fn comparable(h: &Option<FieldTable>, case: &str) -> BTreeMap<ShortString, AMQPValue> {
    let mut m = h.clone().unwrap_or_default().inner().clone();
    for t in [headers::FIRST_FAILURE_AT, headers::LAST_FAILURE_AT] {
        assert!(
            matches!(m.remove(t), Some(AMQPValue::LongLongInt(ms)) if ms > 0),
            "{case}: {t} missing"
        );
    }
    // Written by the broker when the copy is read back from a quorum tier (3.10 writes 0),
    // not part of the copy rabbitkit published.
    m.remove("x-delivery-count");
    m
}

fn assert_same(c: &Case, kit: &Settlement, rt: &Observed) {
    assert_eq!(kit.label(), c.expect, "{}: kit decided {kit}", c.name);
    assert_eq!(
        rt.label, c.expect,
        "{}: runtime decided {}",
        c.name, rt.label
    );
    match (kit.copy(), &rt.copy) {
        (None, None) => {}
        (Some(k), Some(r)) => {
            assert_eq!(k.exchange_name(), r.exchange, "{}: exchange", c.name);
            assert_eq!(k.routing_key(), r.routing_key, "{}: routing key", c.name);
            assert_eq!(k.body().as_ref(), r.body.as_slice(), "{}: body", c.name);
            let (kp, rp) = (k.basic_properties(), &r.properties);
            assert_eq!(kp.message_id(), rp.message_id(), "{}", c.name);
            assert_eq!(kp.correlation_id(), rp.correlation_id(), "{}", c.name);
            assert_eq!(kp.content_type(), rp.content_type(), "{}", c.name);
            assert_eq!(kp.delivery_mode(), rp.delivery_mode(), "{}", c.name);
            assert_eq!(kp.expiration(), rp.expiration(), "{}", c.name);
            assert_eq!(
                comparable(kp.headers(), c.name),
                comparable(rp.headers(), c.name),
                "{}: headers",
                c.name
            );
        }
        (k, r) => panic!(
            "{}: kit copy {:?}, runtime copy {:?}",
            c.name,
            k.map(|e| e.routing_key()),
            r.as_ref().map(|g| &g.routing_key)
        ),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kit_and_runtime_settle_every_case_the_same_way() {
    let broker = Broker::from_env();
    let vh = broker.vhost("parity");
    let cases = cases();
    let mut worker = Worker::new(ConnectionConfig::new(vh.url()))
        .shutdown_deadline(WAIT)
        .header_trust(trust());
    for c in &cases {
        worker = worker.subscribe(subscriber(c));
    }
    let w = worker
        .start()
        .await
        .unwrap_or_else(|e| panic!("worker start: {e}"));
    for c in &cases {
        vh.publish_raw("shop", &routing_key(c), c.body, properties(c))
            .await;
    }
    wait_until(WAIT, "every case settled", || async {
        cases.iter().all(|c| {
            let st = w.stats(&queue(c)).unwrap();
            st.acked + st.requeued + st.rejected >= 1
        })
    })
    .await;
    let report = w.shutdown().await;
    for c in &cases {
        let st = report.subscribers[&queue(c)];
        let rt = observe(&vh, c, &st).await;
        let kit = through_the_kit(c).await;
        assert_same(c, &kit, &rt);
    }
    // Spot checks that the comparison compared something real.
    let kit = through_the_kit(&cases[4]).await;
    assert_eq!(
        kit.header_str(headers::PARK_REASON).as_deref(),
        Some("max-attempts")
    );
    assert_eq!(kit.header_int(headers::ATTEMPT), Some(3));
    let kit = through_the_kit(&cases[8]).await;
    assert_eq!(
        kit.header_str(headers::ERROR_KIND).as_deref(),
        Some("timeout"),
        "on RabbitMQ {}",
        broker.version
    );
}
