use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use super::*;
use crate::extract::{Json, RoutingKey, State};
use crate::headers::{self, Attempt};
use crate::outcome::{Failure, Permanent};
use crate::policy::ManualFallback;
use crate::retry::RetryPolicy;
use crate::{BoxError, Settle};

const FIVE: Duration = Duration::from_secs(5);
const THIRTY: Duration = Duration::from_secs(30);

#[derive(serde::Deserialize)]
struct Order {
    id: u64,
}

async fn order(Json(o): Json<Order>) -> Result<(), BoxError> {
    match o.id {
        0 => Err(Permanent::new("no such order").into()),
        1 => Err("db down".into()),
        _ => Ok(()),
    }
}

fn orders() -> Subscriber {
    Subscriber::new("orders", order)
        .name("handle_order")
        .retry(RetryPolicy::new([FIVE, THIRTY]).max_attempts(3))
}

fn json(id: u64) -> TestDelivery {
    TestDelivery::json(&serde_json::json!({ "id": id }))
        .unwrap_or_else(|e| panic!("{e}"))
        .route("shop", "order.created")
        .message_id("m-1")
}

#[tokio::test]
async fn success_is_an_ack_by_the_policy() {
    let s = TestKit::new(orders()).run(json(2)).await;
    assert!(s.is_ack(), "{s}");
    assert_eq!(s.settled_by(), SettledBy::Policy);
    assert_eq!(s.runs(), 1);
    assert!(s.copy().is_none());
}

#[tokio::test]
async fn transient_error_retries_through_the_first_tier_with_evidence() {
    let s = TestKit::new(orders()).run(json(1)).await;
    assert!(s.is_retry_after(FIVE), "{s}");
    assert!(!s.is_retry_after(THIRTY));
    assert_eq!(s.next_attempt(), Some(2));
    let copy = s.copy().unwrap_or_else(|| panic!("no copy: {s}"));
    assert_eq!(copy.exchange_name(), "orders.retry");
    assert_eq!(copy.routing_key(), "orders.delay.5s");
    assert_eq!(copy.body().as_ref(), br#"{"id":1}"#);
    assert_eq!(s.header_int(headers::ATTEMPT), Some(2));
    assert_eq!(
        s.header_str(headers::ERROR_MESSAGE).as_deref(),
        Some("db down")
    );
    assert_eq!(
        s.header_str(headers::HANDLER).as_deref(),
        Some("handle_order")
    );
    assert_eq!(
        s.header_str(headers::ORIGINAL_ROUTING_KEY).as_deref(),
        Some("order.created")
    );
    assert_eq!(s.header_str(headers::RETRY_TIER).as_deref(), Some("5s"));
    assert!(s.header_int(headers::LAST_FAILURE_AT).is_some());
    assert_eq!(s.failure().map(|f| f.kind.as_ref()), Some("error"));
}

#[tokio::test]
async fn second_attempt_takes_the_second_tier_and_the_last_parks() {
    let kit = TestKit::new(orders());
    let s = kit.run(json(1).attempt(2)).await;
    assert!(s.is_retry_after(THIRTY), "{s}");
    assert_eq!(s.next_attempt(), Some(3));
    let s = kit.run(json(1).attempt(3)).await;
    assert!(s.is_parked_with(ParkReason::MaxAttempts), "{s}");
    assert_eq!(s.copy().map(|c| c.routing_key()), Some("orders.parking"));
    assert_eq!(s.copy().map(|c| c.exchange_name()), Some(""));
    assert_eq!(s.header_int(headers::ATTEMPT), Some(3));
    assert_eq!(s.next_attempt(), None);
}

#[tokio::test]
async fn x_death_expiries_count_as_attempts_where_the_broker_counts() {
    // 3.10 keeps counting x-death across republishes: two expiries out of this queue's tiers
    // make this attempt 3 even without the own header.
    let s = TestKit::new(orders())
        .run(json(1).x_death("orders.delay.5s", "expired", 2))
        .await;
    assert!(s.is_parked_with(ParkReason::MaxAttempts), "{s}");
}

#[tokio::test]
async fn permanent_error_and_poison_json_park_at_once() {
    let kit = TestKit::new(orders());
    let s = kit.run(json(0)).await;
    assert!(s.is_parked_with(ParkReason::Permanent), "{s}");
    assert_eq!(
        s.header_str(headers::PARK_REASON).as_deref(),
        Some("permanent")
    );
    let s = kit.run(TestDelivery::new("{not json")).await;
    assert!(s.is_parked_with(ParkReason::Decode), "{s}");
    assert_eq!(s.header_str(headers::ERROR_KIND).as_deref(), Some("decode"));
}

#[tokio::test(start_paused = true)]
async fn immediate_retries_rerun_the_handler_before_a_tier() {
    let runs = Arc::new(AtomicU32::new(0));
    let r = runs.clone();
    let sub = Subscriber::new("orders", move || {
        let r = r.clone();
        async move {
            if r.fetch_add(1, Ordering::SeqCst) < 2 {
                Err::<(), BoxError>("flaky".into())
            } else {
                Ok(())
            }
        }
    })
    .retry(RetryPolicy::new([FIVE]).immediate_retries(2));
    let s = TestKit::new(sub).run(TestDelivery::new("x")).await;
    assert!(s.is_ack(), "{s}");
    assert_eq!(s.runs(), 3);
    assert_eq!(runs.load(Ordering::SeqCst), 3);
}

#[tokio::test(start_paused = true)]
async fn deadline_overrun_and_panic_are_retries() {
    let slow = Subscriber::new("orders", || async {
        tokio::time::sleep(Duration::from_secs(60)).await;
    })
    .deadline(Duration::from_secs(1));
    let s = TestKit::new(slow).run(TestDelivery::new("x")).await;
    assert!(s.is_retry(), "{s}");
    assert_eq!(s.failure().map(|f| f.kind.as_ref()), Some("timeout"));
    assert_eq!(s.stats().timeouts, 1);

    let boom = Subscriber::new("orders", |RoutingKey(k): RoutingKey| async move {
        if k.is_empty() {
            panic!("boom");
        }
    });
    let s = TestKit::new(boom).run(TestDelivery::new("x")).await;
    assert!(s.is_retry(), "{s}");
    assert_eq!(
        s.header_str(headers::ERROR_MESSAGE).as_deref(),
        Some("boom")
    );
    assert_eq!(s.stats().panics, 1);
}

#[tokio::test]
async fn manual_settle_is_recorded_and_unsettled_gets_the_fallback() {
    let sub = |queue: &str| {
        Subscriber::new(queue, |settle: Settle, a: Attempt| async move {
            if a.number == 1 {
                let report = settle.retry(Failure::error("later")).await;
                assert_eq!(report, SettleReport::Retried);
            }
        })
        .ack_policy(AckPolicy::Manual)
    };
    let s = TestKit::new(sub("orders"))
        .run(TestDelivery::new("x"))
        .await;
    assert_eq!(s.settled_by(), SettledBy::Handler);
    assert!(s.is_retry_after(Duration::from_secs(1)), "{s}");
    assert_eq!(s.stats().unsettled, 0);

    let s = TestKit::new(sub("orders"))
        .run(TestDelivery::new("x").attempt(2))
        .await;
    assert_eq!(s.settled_by(), SettledBy::Fallback);
    assert!(s.is_requeue(), "{s}");
    assert_eq!(s.stats().unsettled, 1);

    let s = TestKit::new(sub("orders").manual_fallback(ManualFallback::Reject))
        .run(TestDelivery::new("x").attempt(2))
        .await;
    assert!(s.is_reject(), "{s}");
}

/// A manual-mode handler that never settles: what reaches the policy is how it failed.
fn manual_unsettled(fallback: ManualFallback) -> Subscriber {
    Subscriber::new(
        "ledger",
        |_settle: Settle, Json(o): Json<Order>| async move {
            match o.id {
                0 => Err(Permanent::new("no such account").into()),
                1 => Err::<(), BoxError>("db down".into()),
                7 => panic!("ledger invariant broken"),
                9 => {
                    tokio::time::sleep(Duration::from_secs(60)).await;
                    Ok(())
                }
                _ => Ok(()),
            }
        },
    )
    .ack_policy(AckPolicy::Manual)
    .manual_fallback(fallback)
    .deadline(Duration::from_secs(1))
    .retry(RetryPolicy::new([FIVE, THIRTY]).max_attempts(3))
}

#[tokio::test(start_paused = true)]
async fn manual_mode_parks_poison_and_retries_panics_whatever_the_fallback() {
    for fallback in [
        ManualFallback::NackRequeue,
        ManualFallback::Ack,
        ManualFallback::Auto,
        ManualFallback::Reject,
    ] {
        let kit = TestKit::new(manual_unsettled(fallback));
        let poison = kit.run(TestDelivery::new("not json")).await;
        assert!(
            poison.is_parked_with(ParkReason::Decode),
            "{fallback:?}: poison must park as decode: {poison}"
        );
        let panicked = kit.run(json(7)).await;
        assert!(panicked.is_retry_after(FIVE), "{fallback:?}: {panicked}");
        assert_eq!(panicked.failure().map(|f| f.kind.as_ref()), Some("panic"));
        let last_panic = kit.run(json(7).attempt(3)).await;
        assert!(
            last_panic.is_parked_with(ParkReason::MaxAttempts),
            "{fallback:?}: {last_panic}"
        );
        let overran = kit.run(json(9)).await;
        assert!(overran.is_retry(), "{fallback:?}: {overran}");
        assert_eq!(overran.failure().map(|f| f.kind.as_ref()), Some("timeout"));
        let failed = kit.run(json(1)).await;
        assert!(failed.is_retry_after(FIVE), "{fallback:?}: {failed}");
        let permanent = kit.run(json(0)).await;
        assert!(
            permanent.is_parked_with(ParkReason::Permanent),
            "{fallback:?}: {permanent}"
        );
        for s in [&poison, &panicked, &overran, &failed, &permanent] {
            assert!(
                !s.is_ack(),
                "{fallback:?}: a failure must never be acked: {s}"
            );
            assert_eq!(s.settled_by(), SettledBy::Policy);
            assert_eq!(
                s.stats().unsettled,
                0,
                "a failure is not an unsettled return"
            );
        }
    }
}

#[tokio::test]
async fn manual_mode_fallback_applies_to_a_clean_return_only() {
    let clean = |f| async move { TestKit::new(manual_unsettled(f)).run(json(2)).await };
    assert!(clean(ManualFallback::NackRequeue).await.is_requeue());
    assert!(clean(ManualFallback::Ack).await.is_ack());
    assert!(clean(ManualFallback::Auto).await.is_ack());
    assert!(clean(ManualFallback::Reject).await.is_reject());
}

#[tokio::test]
async fn other_policies_and_a_tower_service() {
    let failing = || Subscriber::new("orders", || async { Err::<(), BoxError>("x".into()) });
    let s = TestKit::new(failing().ack_policy(AckPolicy::NackOnError))
        .run(TestDelivery::new("x"))
        .await;
    assert!(s.is_reject(), "{s}");
    let s = TestKit::new(failing().ack_policy(AckPolicy::AckFirst))
        .run(TestDelivery::new("x"))
        .await;
    assert!(s.is_ack(), "{s}");
    assert_eq!(s.settled_by(), SettledBy::Receipt);

    let svc = tower::service_fn(|d: Delivery| async move {
        Ok::<_, BoxError>(if d.redelivered() {
            Outcome::Requeue
        } else {
            Outcome::Ack
        })
    });
    let kit = TestKit::service("orders", svc);
    assert!(kit.run(TestDelivery::new("x")).await.is_ack());
    assert!(
        kit.run(TestDelivery::new("x").redelivered(true))
            .await
            .is_requeue()
    );
}

#[tokio::test]
async fn state_comes_from_the_kit_and_the_subscriber() {
    #[derive(Clone)]
    struct Limit(u64);
    let sub = Subscriber::new(
        "orders",
        |Json(o): Json<Order>, State(Limit(max)): State<Limit>| async move {
            if o.id > max {
                Outcome::park(Failure::new("limit", "too big"))
            } else {
                Outcome::Ack
            }
        },
    );
    let kit = TestKit::new(sub).state(Limit(10));
    assert!(kit.run(json(5)).await.is_ack());
    let s = kit.run(json(50)).await;
    assert!(s.is_parked_with(ParkReason::Handler), "{s}");
    // Without the state: a wiring error, parked, as in the worker.
    let s = TestKit::handler("orders", |State(_): State<Limit>| async {})
        .run(TestDelivery::new("x"))
        .await;
    assert_eq!(s.failure().map(|f| f.kind.as_ref()), Some("wiring"));
}

#[tokio::test]
async fn original_route_is_restored_from_a_retry_copy() {
    let seen = Arc::new(std::sync::Mutex::new(String::new()));
    let s2 = seen.clone();
    let kit = TestKit::handler("orders", move |RoutingKey(k): RoutingKey| {
        let seen = s2.clone();
        async move {
            *seen.lock().unwrap_or_else(|p| p.into_inner()) = k;
        }
    });
    let d = TestDelivery::new("x")
        .route("", "orders")
        .header(headers::ORIGINAL_ROUTING_KEY, "order.paid")
        .attempt(2);
    assert!(kit.run(d).await.is_ack());
    assert_eq!(
        *seen.lock().unwrap_or_else(|p| p.into_inner()),
        "order.paid"
    );
}

#[test]
#[should_panic(expected = "Worker::start would refuse this subscriber")]
fn a_kit_refuses_what_the_worker_would_refuse() {
    // A classic work queue has no delivery limit: the worker refuses it at start, so a test
    // of it would pass for nothing.
    let _ = TestKit::new(Subscriber::new("orders", order).delivery_limit(5));
}

#[test]
#[should_panic(expected = "Settle")]
fn a_kit_refuses_a_settle_argument_outside_manual_mode() {
    async fn settles(_s: Settle) {}
    let _ = TestKit::new(Subscriber::new("orders", settles));
}
