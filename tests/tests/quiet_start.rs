//! A healthy start logs nothing above INFO: no lapin `ERROR Channel closed` from a probe for
//! the classic tiers of an earlier release, no `WARN connection error` for a channel the
//! broker closed. Log-based alerts must not fire on every deploy. Its own test binary: the
//! capture is global, and other tests log warnings on purpose.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable};
use rabbitkit_core::extract::Body;
use rabbitkit_core::{
    BoxError, ConnectionConfig, HeaderKeys, HeaderTrust, RetryPolicy, Subscriber, Worker,
};
use rabbitkit_tests::logs::{capture, take};
use rabbitkit_tests::{Broker, Vhost, wait_until};

const WAIT: Duration = Duration::from_secs(20);

/// Starts a worker on `orders` (quorum tiers of 200 ms and 1 s, headers signed so the
/// unsigned-headers warning does not apply), handles one message, shuts down; returns
/// what was logged at WARN and above meanwhile.
async fn run_once(vh: &Vhost, management: Option<String>) -> String {
    take();
    let handled = Arc::new(AtomicU32::new(0));
    let h = handled.clone();
    let mut sub = Subscriber::new("orders", move |Body(_b): Body| {
        let h = h.clone();
        async move {
            h.fetch_add(1, Ordering::SeqCst);
            Ok::<(), BoxError>(())
        }
    })
    .retry(RetryPolicy::new([
        Duration::from_millis(200),
        Duration::from_secs(1),
    ]));
    if let Some(m) = management {
        sub = sub.management_url(m);
    }
    let keys = HeaderKeys::new("quiet-start-test-key-0123456789").unwrap();
    let w = Worker::new(ConnectionConfig::new(vh.url()))
        .header_trust(HeaderTrust::signed(keys))
        .shutdown_deadline(Duration::from_secs(5))
        .subscribe(sub)
        .start()
        .await
        .unwrap();
    vh.publish_raw("", "orders", b"hello", BasicProperties::default())
        .await;
    wait_until(WAIT, "the message handled", || async {
        handled.load(Ordering::SeqCst) == 1
    })
    .await;
    // lapin logs a channel the broker closed from its I/O loop, after the call returned.
    tokio::time::sleep(Duration::from_millis(500)).await;
    w.shutdown().await;
    take()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_healthy_start_logs_nothing_above_info() {
    capture(tracing::Level::WARN);
    let broker = Broker::from_env();

    // No management URL: the classic tiers of an earlier release are not probed over AMQP.
    let vh = broker.vhost("quiet-start");
    let first = run_once(&vh, None).await;
    assert_eq!(first, "", "first start (topology declared)");
    let again = run_once(&vh, None).await;
    assert_eq!(again, "", "second start (topology exists)");

    // With one, they are asked for through the API, which answers 404 without closing any
    // channel.
    let vh = broker.vhost("quiet-start-mgmt");
    let with_api = run_once(&vh, Some(broker.mgmt.clone())).await;
    assert_eq!(with_api, "", "start with a management URL");

    // Through the API a classic tier of an earlier release is still warned about, once
    // (the same test: the capture is shared, and a parallel test would see this warning).
    let vh = broker.vhost("quiet-start-legacy");
    // The classic 200 ms tier an earlier release declared.
    let mut args = FieldTable::default();
    args.insert("x-message-ttl".into(), AMQPValue::LongUInt(200));
    vh.declare_queue("orders.retry.200ms", args).await;
    let logged = run_once(&vh, Some(broker.mgmt.clone())).await;
    let warns: Vec<&str> = logged
        .lines()
        .filter(|l| l.contains("orders.retry.200ms"))
        .collect();
    assert_eq!(warns.len(), 1, "{logged}");
    assert!(
        warns[0].contains(" WARN ") && warns[0].contains("rabbitkit topology migrate orders"),
        "{logged}"
    );
    assert!(!logged.contains("ERROR"), "{logged}");
}
