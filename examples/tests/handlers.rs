//! Handler tests without a broker, written the way a service team would: copy this file
//! next to your subscribers and replace `charge` and `refund` with yours.
//!
//! Needs, in your `Cargo.toml`:
//!
//! ```toml
//! [dev-dependencies]
//! rabbitkit = { version = "0.1", features = ["test-util"] }
//! ```
//!
//! Each test builds a delivery as the broker would hand it over, runs it through the whole
//! subscriber definition (extractors, ack policy, classifier, retry policy, layers) and
//! asserts on the settlement. The kit runs the worker's own decision code, so a settlement
//! asserted here is the one production carries out.
//!
//! Run with:
//!
//! ```sh
//! cargo test -p rabbitkit-examples --test handlers
//! ```

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rabbitkit::headers;
use rabbitkit::idempotency::{IdempotentLayer, MemoryStore};
use rabbitkit::prelude::*;
use rabbitkit::testing::{ParkReason, SettledBy, Settlement, TestDelivery, TestKit};
use serde::Deserialize;

#[derive(Deserialize)]
struct Payment {
    id: u32,
    cents: i64,
}

/// A fake of the service's database, given to the handler as state.
#[derive(Clone, Default)]
struct Ledger {
    charged: Arc<Mutex<Vec<u32>>>,
    down: bool,
}

impl Ledger {
    fn down() -> Self {
        Self {
            down: true,
            ..Self::default()
        }
    }

    fn charge(&self, id: u32) -> Result<(), BoxError> {
        if self.down {
            return Err("ledger unavailable".into());
        }
        self.charged.lock().map_err(|_| "ledger poisoned")?.push(id);
        Ok(())
    }

    fn charged(&self) -> Vec<u32> {
        self.charged.lock().map(|c| c.clone()).unwrap_or_default()
    }
}

/// The handler under test: retried after 1 s and 30 s, parked on the third failure.
#[subscriber(queue = "payments", exchange = "shop", routing_key = "payment.*",
             retry = ["1s", "30s"], max_attempts = 3)]
async fn charge(Json(p): Json<Payment>, State(ledger): State<Ledger>) -> Result<(), BoxError> {
    if p.cents <= 0 {
        return Err(Permanent::new(format!("payment {}: {} cents", p.id, p.cents)).into());
    }
    ledger.charge(p.id)
}

/// A manual-ack handler: settles through its handle.
#[subscriber(queue = "refunds", ack = "manual")]
async fn refund(settle: Settle, Json(p): Json<Payment>) {
    if p.cents > 10_000 {
        settle
            .park(Failure::new(
                "needs-approval",
                "refunds over 100.00 need a human",
            ))
            .await;
    } else {
        settle.ack().await;
    }
}

/// Runs one delivery through `charge`, with `ledger` as its database.
async fn charge_with(ledger: &Ledger, delivery: TestDelivery) -> Settlement {
    TestKit::new(charge)
        .state(ledger.clone())
        .run(delivery)
        .await
}

fn payment(id: u32, cents: i64) -> Result<TestDelivery, BoxError> {
    Ok(
        TestDelivery::json(&serde_json::json!({ "id": id, "cents": cents }))?
            .route("shop", "payment.created")
            .message_id(format!("pay-{id}")),
    )
}

#[tokio::test]
async fn a_payment_is_charged_and_acked() -> Result<(), BoxError> {
    let ledger = Ledger::default();
    let s = charge_with(&ledger, payment(1, 500)?).await;
    assert!(s.is_ack(), "{s}");
    assert_eq!(s.settled_by(), SettledBy::Policy);
    assert_eq!(ledger.charged(), [1]);
    Ok(())
}

#[tokio::test]
async fn a_ledger_outage_is_retried_in_the_first_tier_as_attempt_two() -> Result<(), BoxError> {
    let s = charge_with(&Ledger::down(), payment(2, 500)?).await;
    assert!(s.is_retry_after(Duration::from_secs(1)), "{s}");
    assert_eq!(s.next_attempt(), Some(2));
    let copy = s.copy().ok_or("no retry copy")?;
    assert_eq!(copy.routing_key(), "payments.delay.1s");
    assert_eq!(
        s.header_str(headers::ERROR_MESSAGE).as_deref(),
        Some("ledger unavailable")
    );
    // The retry copy remembers where the original came from.
    assert_eq!(
        s.header_str(headers::ORIGINAL_ROUTING_KEY).as_deref(),
        Some("payment.created")
    );
    Ok(())
}

#[tokio::test]
async fn the_second_attempt_takes_the_second_tier_and_the_third_parks() -> Result<(), BoxError> {
    let kit = TestKit::new(charge).state(Ledger::down());
    let second = kit.run(payment(3, 500)?.attempt(2)).await;
    assert!(second.is_retry_after(Duration::from_secs(30)), "{second}");
    let third = kit.run(payment(3, 500)?.attempt(3)).await;
    assert!(third.is_parked_with(ParkReason::MaxAttempts), "{third}");
    assert_eq!(
        third.copy().map(|c| c.routing_key()),
        Some("payments.parking")
    );
    assert_eq!(third.header_int(headers::ATTEMPT), Some(3));
    Ok(())
}

#[tokio::test]
async fn a_non_positive_amount_is_parked_at_once_as_permanent() -> Result<(), BoxError> {
    let ledger = Ledger::default();
    let s = charge_with(&ledger, payment(4, 0)?).await;
    assert!(s.is_parked_with(ParkReason::Permanent), "{s}");
    assert_eq!(
        s.failure().map(|f| f.message.as_str()),
        Some("payment 4: 0 cents")
    );
    assert!(ledger.charged().is_empty());
    Ok(())
}

#[tokio::test]
async fn a_body_that_is_not_a_payment_is_parked_as_poison() -> Result<(), BoxError> {
    let ledger = Ledger::default();
    let s = charge_with(
        &ledger,
        TestDelivery::new("{not json").route("shop", "payment.created"),
    )
    .await;
    assert!(s.is_parked_with(ParkReason::Decode), "{s}");
    assert_eq!(s.header_str(headers::ERROR_KIND).as_deref(), Some("decode"));
    assert_eq!(s.copy().map(|c| c.body().as_ref()), Some(&b"{not json"[..]));
    assert!(ledger.charged().is_empty());
    Ok(())
}

#[tokio::test]
async fn a_redelivered_duplicate_is_acked_without_charging_twice() -> Result<(), BoxError> {
    let ledger = Ledger::default();
    let store = MemoryStore::new(10_000, Duration::from_secs(3600));
    let kit =
        TestKit::new(charge::subscriber().layer(IdempotentLayer::new(store))).state(ledger.clone());
    let first = kit.run(payment(5, 500)?).await;
    assert!(first.is_ack(), "{first}");
    // The ack was lost (a connection closed before it reached the broker): the broker
    // delivers the same message again.
    let again = kit.run(payment(5, 500)?.redelivered(true)).await;
    assert!(again.is_ack(), "{again}");
    assert_eq!(ledger.charged(), [5], "charged once");
    Ok(())
}

#[tokio::test]
async fn a_manual_handler_settles_through_its_handle() -> Result<(), BoxError> {
    let kit = TestKit::new(refund);
    let small = kit.run(payment(6, 500)?).await;
    assert!(small.is_ack(), "{small}");
    assert_eq!(small.settled_by(), SettledBy::Handler);
    let large = kit.run(payment(7, 50_000)?).await;
    assert!(large.is_parked_with(ParkReason::Handler), "{large}");
    assert_eq!(
        large.header_str(headers::ERROR_KIND).as_deref(),
        Some("needs-approval")
    );
    Ok(())
}
