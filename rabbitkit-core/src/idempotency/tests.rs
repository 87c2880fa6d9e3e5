use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use super::*;
use crate::policy::AckPolicy;
use crate::testing::{SettledBy, TestDelivery, TestKit};
use crate::{RetryPolicy, Subscriber};

fn store() -> Arc<MemoryStore> {
    Arc::new(MemoryStore::new(100, Duration::from_secs(60)))
}

/// A handler that counts its effects and fails while `fail` is set.
fn counting(effects: &Arc<AtomicU32>, fail: &Arc<AtomicBool>) -> Subscriber {
    let (e, f) = (effects.clone(), fail.clone());
    Subscriber::new("orders", move || {
        let (e, f) = (e.clone(), f.clone());
        async move {
            if f.load(Ordering::SeqCst) {
                return Err::<(), BoxError>("db down".into());
            }
            e.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
    })
    .retry(RetryPolicy::new([Duration::from_secs(1)]))
}

#[tokio::test]
async fn a_redelivered_duplicate_is_acked_without_a_second_effect() {
    let effects = Arc::new(AtomicU32::new(0));
    let fail = Arc::new(AtomicBool::new(false));
    let s = store();
    let kit = TestKit::new(counting(&effects, &fail).layer(IdempotentLayer::new(s.clone())));
    let first = kit.run(TestDelivery::new("x").message_id("m-1")).await;
    assert!(first.is_ack(), "{first}");
    let again = kit
        .run(TestDelivery::new("x").message_id("m-1").redelivered(true))
        .await;
    assert!(again.is_ack(), "{again}");
    assert_eq!(effects.load(Ordering::SeqCst), 1);
    // Another id, and no id at all, run the handler.
    assert!(
        kit.run(TestDelivery::new("x").message_id("m-2"))
            .await
            .is_ack()
    );
    assert!(kit.run(TestDelivery::new("x")).await.is_ack());
    assert!(kit.run(TestDelivery::new("x")).await.is_ack());
    assert_eq!(effects.load(Ordering::SeqCst), 4);
    assert_eq!(s.len(), 2);
}

#[tokio::test]
async fn an_empty_message_id_is_no_key() {
    // An empty id is what producers that "set" no id often send: keying on it would ack
    // every such message after the first one unprocessed.
    let effects = Arc::new(AtomicU32::new(0));
    let fail = Arc::new(AtomicBool::new(false));
    let s = store();
    let kit = TestKit::new(counting(&effects, &fail).layer(IdempotentLayer::new(s.clone())));
    for body in ["a", "b", "c"] {
        let r = kit.run(TestDelivery::new(body).message_id("")).await;
        assert!(r.is_ack(), "{r}");
    }
    assert_eq!(
        effects.load(Ordering::SeqCst),
        3,
        "each empty-id message ran"
    );
    assert_eq!(s.len(), 0, "nothing keyed on an empty id");
}

#[tokio::test]
async fn a_failed_run_is_not_marked_so_its_retry_runs_again() {
    let effects = Arc::new(AtomicU32::new(0));
    let fail = Arc::new(AtomicBool::new(true));
    let s = store();
    let kit = TestKit::new(counting(&effects, &fail).layer(IdempotentLayer::new(s.clone())));
    assert!(
        kit.run(TestDelivery::new("x").message_id("m-1"))
            .await
            .is_retry()
    );
    assert!(!s.seen("m-1").await.unwrap_or(true));
    fail.store(false, Ordering::SeqCst);
    assert!(
        kit.run(TestDelivery::new("x").message_id("m-1").attempt(2))
            .await
            .is_ack()
    );
    assert_eq!(effects.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_user_key_replaces_the_message_id() {
    let effects = Arc::new(AtomicU32::new(0));
    let fail = Arc::new(AtomicBool::new(false));
    let layer = IdempotentLayer::new(store())
        .key(|d: &Delivery| d.header("order-id").and_then(crate::headers::string));
    let kit = TestKit::new(counting(&effects, &fail).layer(layer));
    for id in ["a", "b", "a"] {
        let d = TestDelivery::new("x")
            .message_id(id)
            .header("order-id", "o-1");
        assert!(kit.run(d).await.is_ack());
    }
    assert_eq!(effects.load(Ordering::SeqCst), 1, "one key for all three");
}

struct Broken {
    seen: bool,
    mark: bool,
}

impl IdempotencyStore for Broken {
    fn seen<'a>(&'a self, _: &'a str) -> StoreFuture<'a, bool> {
        let r = if self.seen {
            Err("store down".into())
        } else {
            Ok(false)
        };
        Box::pin(std::future::ready(r))
    }
    fn mark<'a>(&'a self, _: &'a str) -> StoreFuture<'a, ()> {
        let r = if self.mark {
            Err("disk full".into())
        } else {
            Ok(())
        };
        Box::pin(std::future::ready(r))
    }
}

/// One delivery with id `m-1` through the counting handler behind `store`: the settlement
/// and the number of effects.
async fn once_through(store: Broken) -> (crate::testing::Settlement, u32) {
    let effects = Arc::new(AtomicU32::new(0));
    let fail = Arc::new(AtomicBool::new(false));
    let kit = TestKit::new(counting(&effects, &fail).layer(IdempotentLayer::new(store)));
    let s = kit.run(TestDelivery::new("x").message_id("m-1")).await;
    (s, effects.load(Ordering::SeqCst))
}

#[tokio::test]
async fn store_failures_never_ack_without_the_effect() {
    let (s, effects) = once_through(Broken {
        seen: true,
        mark: false,
    })
    .await;
    assert!(s.is_retry(), "{s}");
    assert_eq!(
        s.failure().map(|f| f.kind.as_ref()),
        Some("idempotency-store")
    );
    assert_eq!(effects, 0, "handler did not run");

    let (s, effects) = once_through(Broken {
        seen: false,
        mark: true,
    })
    .await;
    assert!(s.is_ack(), "the effect happened: {s}");
    assert_eq!(effects, 1);
}

#[tokio::test]
async fn manual_mode_marks_before_the_handle_acks_and_acks_duplicates_through_it() {
    let effects = Arc::new(AtomicU32::new(0));
    let e = effects.clone();
    let s = store();
    let sub = Subscriber::new("orders", move |settle: crate::Settle| {
        let e = e.clone();
        async move {
            e.fetch_add(1, Ordering::SeqCst);
            settle.ack().await;
        }
    })
    .ack_policy(AckPolicy::Manual)
    .layer(IdempotentLayer::new(s.clone()));
    let kit = TestKit::new(sub);
    let first = kit.run(TestDelivery::new("x").message_id("m-1")).await;
    assert_eq!(first.settled_by(), SettledBy::Handler);
    assert!(first.is_ack(), "{first}");
    assert!(s.seen("m-1").await.unwrap_or(false));
    let dup = kit
        .run(TestDelivery::new("x").message_id("m-1").redelivered(true))
        .await;
    assert_eq!(
        dup.settled_by(),
        SettledBy::Handler,
        "acked through the handle"
    );
    assert!(dup.is_ack(), "{dup}");
    assert_eq!(dup.stats().unsettled, 0);
    assert_eq!(effects.load(Ordering::SeqCst), 1);
}
