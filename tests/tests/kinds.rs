//! Error kinds and retry policy by kind, against a real broker: kinds written as evidence,
//! a kind parked at once, a kind on its own schedule, a typed error enum, tower's timeout
//! and load-shedding errors, and a handler that takes its own decode rejection.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::borrow::Cow;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use lapin::BasicProperties;
use rabbitkit_core::extract::{Body, Json, JsonRejection};
use rabbitkit_core::headers::{self, Attempt};
use rabbitkit_core::kind::{ErrorKind, KindPolicy, Kinded, ResultExt};
use rabbitkit_core::{BoxError, Outcome, RetryPolicy, Subscriber};
use rabbitkit_tests::{Broker, Got, Vhost, wait_until};

const WAIT: Duration = Duration::from_secs(20);
const SHORT: Duration = Duration::from_millis(200);

async fn publish(vh: &Vhost, id: &str, body: &[u8]) {
    let props = BasicProperties::default().with_message_id(id.to_owned().into());
    vh.publish_raw("", "orders", body, props).await;
}

async fn parked(vh: &Vhost, n: u32) -> Vec<Got> {
    wait_until(WAIT, "messages parked", || async {
        vh.depth("orders.parking").await >= n
    })
    .await;
    vh.get_all("orders.parking", 100).await
}

fn by_id<'a>(got: &'a [Got], id: &str) -> &'a Got {
    got.iter()
        .find(|g| g.properties.message_id().as_ref().map(|m| m.as_str()) == Some(id))
        .unwrap_or_else(|| panic!("{id} not parked"))
}

#[derive(Debug, thiserror::Error)]
enum ShopError {
    #[error("out of stock")]
    OutOfStock,
    #[error("card declined")]
    Declined,
}

impl ErrorKind for ShopError {
    const KINDS: &'static [&'static str] = &["inventory", "card"];
    fn kind(&self) -> Cow<'static, str> {
        match self {
            ShopError::OutOfStock => "inventory".into(),
            ShopError::Declined => "card".into(),
        }
    }
    fn is_permanent(&self) -> bool {
        matches!(self, ShopError::Declined)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kinds_route_failures_to_their_own_policy_and_are_written_as_evidence() {
    let vh = Broker::from_env().vhost("kinds-policy");
    // Default: 3 attempts through a 1 h tier (never reached in this test, so a message on
    // the default schedule would stay in the tier and fail the count below).
    let policy = RetryPolicy::new([Duration::from_secs(3600)])
        .max_attempts(3)
        .on_kind("validation", KindPolicy::park())
        .on_kind("inventory", KindPolicy::tiers([SHORT]).max_attempts(2));
    let runs = Arc::new(AtomicU32::new(0));
    let r2 = runs.clone();
    let sub = Subscriber::new("orders", move |Body(b): Body, a: Attempt| {
        let runs = r2.clone();
        async move {
            runs.fetch_add(1, Ordering::SeqCst);
            match &b[..] {
                b"invalid" => Err::<(), BoxError>(Kinded::new("validation", "no sku").into()),
                b"stock" => Err(ShopError::OutOfStock.into()),
                b"card" => Err(ShopError::Declined.into()),
                b"io" => Err::<(), std::io::Error>(std::io::Error::other("disk"))
                    .kind("inventory")
                    .map_err(Into::into),
                _ => panic!("unexpected body at attempt {}", a.number),
            }
        }
    })
    .retry(policy)
    .error_kind::<ShopError>()
    .kinds(["validation"]);
    let w = vh.start_worker(sub).await;
    publish(&vh, "v-1", b"invalid").await;
    publish(&vh, "s-1", b"stock").await;
    publish(&vh, "c-1", b"card").await;
    publish(&vh, "i-1", b"io").await;
    let got = parked(&vh, 4).await;
    assert_eq!(got.len(), 4, "all four parked");

    let v = by_id(&got, "v-1");
    assert_eq!(
        v.header_str(headers::ERROR_KIND).as_deref(),
        Some("validation")
    );
    assert_eq!(
        v.header_str(headers::PARK_REASON).as_deref(),
        Some("permanent")
    );
    assert_eq!(v.header_int(headers::ATTEMPT), Some(1), "parked at once");
    assert_eq!(
        v.header_str(headers::ERROR_MESSAGE).as_deref(),
        Some("no sku")
    );

    // The typed enum's variant kind, on the kind's own 200 ms tier and 2-attempt limit.
    let s = by_id(&got, "s-1");
    assert_eq!(
        s.header_str(headers::ERROR_KIND).as_deref(),
        Some("inventory")
    );
    assert_eq!(
        s.header_str(headers::PARK_REASON).as_deref(),
        Some("max-attempts")
    );
    assert_eq!(s.header_int(headers::ATTEMPT), Some(2));

    // The enum says `Declined` is permanent.
    let c = by_id(&got, "c-1");
    assert_eq!(c.header_str(headers::ERROR_KIND).as_deref(), Some("card"));
    assert_eq!(
        c.header_str(headers::PARK_REASON).as_deref(),
        Some("permanent")
    );
    assert_eq!(c.header_int(headers::ATTEMPT), Some(1));

    // `.kind(..)?` on any error.
    let i = by_id(&got, "i-1");
    assert_eq!(
        i.header_str(headers::ERROR_KIND).as_deref(),
        Some("inventory")
    );
    assert_eq!(i.header_int(headers::ATTEMPT), Some(2));

    let st = w.shutdown().await.subscribers["orders"];
    assert_eq!(st.parked, 4);
    assert_eq!(
        st.retried, 2,
        "only the inventory kinds were retried, once each"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 6);
    assert_eq!(vh.depth("orders").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tower_timeout_is_a_timeout_and_overload_requeues_without_an_attempt() {
    let vh = Broker::from_env().vhost("kinds-tower");
    let calls = Arc::new(AtomicU32::new(0));
    let c2 = calls.clone();
    let svc = tower::service_fn(move |d: rabbitkit_core::Delivery| {
        let calls = c2.clone();
        async move {
            let n = calls.fetch_add(1, Ordering::SeqCst);
            match &d.body()[..] {
                b"slow" => {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    Ok::<_, BoxError>(Outcome::Ack)
                }
                // The first two runs are refused as a load-shedding layer would.
                b"busy" if n < 3 => Err(tower::load_shed::error::Overloaded::new().into()),
                _ => {
                    assert_eq!(d.attempt().number, 1, "overload spent no attempt");
                    Ok(Outcome::Ack)
                }
            }
        }
    });
    let sub = Subscriber::service("orders", svc)
        .layer(tower::timeout::TimeoutLayer::new(Duration::from_millis(
            100,
        )))
        .retry(RetryPolicy::none())
        .concurrency(1);
    let w = vh.start_worker(sub).await;
    publish(&vh, "slow-1", b"slow").await;
    let got = parked(&vh, 1).await;
    let p = by_id(&got, "slow-1");
    assert_eq!(
        p.header_str(headers::ERROR_KIND).as_deref(),
        Some("timeout")
    );
    publish(&vh, "busy-1", b"busy").await;
    wait_until(WAIT, "busy acked", || async {
        w.stats("orders").unwrap().acked == 2
    })
    .await;
    let st = w.shutdown().await.subscribers["orders"];
    assert_eq!(
        st.timeouts, 1,
        "the layer's timeout is counted as a timeout"
    );
    assert!(st.requeued >= 1, "overload requeued: {st:?}");
    assert_eq!(st.parked, 1);
    assert_eq!(vh.depth("orders").await, 0);
}

#[derive(Debug, serde::Deserialize)]
#[allow(dead_code)]
struct Order {
    id: u32,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_handler_taking_the_json_result_decides_about_bad_payloads_itself() {
    let vh = Broker::from_env().vhost("kinds-json");
    let bad = Arc::new(AtomicU32::new(0));
    let b2 = bad.clone();
    let sub = Subscriber::new(
        "orders",
        move |order: Result<Json<Order>, JsonRejection>| {
            let bad = b2.clone();
            async move {
                if order.is_err() {
                    // E.g. log and drop a legacy format: acked, not parked.
                    bad.fetch_add(1, Ordering::SeqCst);
                }
                Ok::<_, BoxError>(())
            }
        },
    );
    let w = vh.start_worker(sub).await;
    publish(&vh, "ok", br#"{"id":1}"#).await;
    publish(&vh, "bad", b"not json").await;
    wait_until(WAIT, "both acked", || async {
        w.stats("orders").unwrap().acked == 2
    })
    .await;
    let st = w.shutdown().await.subscribers["orders"];
    assert_eq!(st.parked, 0);
    assert_eq!(bad.load(Ordering::SeqCst), 1);
    assert_eq!(vh.depth("orders.parking").await, 0);
}
