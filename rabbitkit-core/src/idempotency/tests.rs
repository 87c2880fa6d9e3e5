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

/// The default key of a message with `id` and `body`.
fn key(id: &str, body: &str) -> String {
    KeyBy::MessageIdAndBody.key_of(id, body.as_bytes())
}

/// Captures the WARN events (their fields, `name=value` joined) emitted on this thread.
#[derive(Default, Clone)]
struct Warnings(Arc<std::sync::Mutex<Vec<String>>>);

impl Warnings {
    fn all(&self) -> Vec<String> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl tracing::Subscriber for Warnings {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        if *event.metadata().level() != tracing::Level::WARN {
            return;
        }
        struct Fields(String);
        impl tracing::field::Visit for Fields {
            fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
                self.0.push_str(&format!("{}={v:?} ", f.name()));
            }
        }
        let mut fields = Fields(String::new());
        event.record(&mut fields);
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(fields.0);
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
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
    // Per keyed message: its key and the mark of its id.
    assert_eq!(s.len(), 4);
    assert!(s.seen(&key("m-1", "x")).await.unwrap_or(false));
    assert!(s.seen("m-1#sha256").await.unwrap_or(false));
}

#[tokio::test]
async fn a_reused_id_with_another_body_runs_the_handler_and_warns() {
    let effects = Arc::new(AtomicU32::new(0));
    let fail = Arc::new(AtomicBool::new(false));
    let s = store();
    let kit = TestKit::new(counting(&effects, &fail).layer(IdempotentLayer::new(s.clone())));
    let warnings = Warnings::default();
    let _guard = tracing::subscriber::set_default(warnings.clone());
    let first = kit
        .run(TestDelivery::new(r#"{"cents":500}"#).message_id("dep-1"))
        .await;
    assert!(first.is_ack(), "{first}");
    assert!(warnings.all().is_empty(), "{:?}", warnings.all());
    // Another message under the same id (a producer's counter reset, or a guess): it is
    // not a duplicate, and acking it unprocessed would lose it.
    let other = kit
        .run(TestDelivery::new(r#"{"cents":90000}"#).message_id("dep-1"))
        .await;
    assert!(other.is_ack(), "{other}");
    assert_eq!(
        effects.load(Ordering::SeqCst),
        2,
        "the handler ran for both"
    );
    let warned = warnings.all();
    assert!(
        warned
            .iter()
            .any(|w| w.contains("message_id=dep-1") && w.contains("another body")),
        "{warned:?}"
    );
    // The same id and body again is a duplicate, skipped without a warning.
    let n = warnings.all().len();
    let dup = kit
        .run(
            TestDelivery::new(r#"{"cents":90000}"#)
                .message_id("dep-1")
                .redelivered(true),
        )
        .await;
    assert!(dup.is_ack(), "{dup}");
    assert_eq!(
        effects.load(Ordering::SeqCst),
        2,
        "the duplicate was skipped"
    );
    assert_eq!(warnings.all().len(), n, "{:?}", warnings.all());
}

#[tokio::test]
async fn marks_of_the_bare_id_from_the_previous_release_are_not_matched() {
    // A store filled by 0.1.0 holds bare message ids. The default key does not match them:
    // at worst a duplicate runs once more; matching would let a reused id through.
    let effects = Arc::new(AtomicU32::new(0));
    let fail = Arc::new(AtomicBool::new(false));
    let s = store();
    s.mark("m-1").await.unwrap_or_else(|e| panic!("{e}"));
    let kit = TestKit::new(counting(&effects, &fail).layer(IdempotentLayer::new(s.clone())));
    assert!(
        kit.run(TestDelivery::new("x").message_id("m-1"))
            .await
            .is_ack()
    );
    assert_eq!(effects.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn keyed_by_message_id_alone_any_body_under_a_processed_id_is_skipped() {
    // The explicit choice for producers that resend an id with a re-serialised body: the
    // key is the bare id (so the previous release's marks match too), and every producer
    // must keep ids unique.
    let effects = Arc::new(AtomicU32::new(0));
    let fail = Arc::new(AtomicBool::new(false));
    let s = store();
    s.mark("old-1").await.unwrap_or_else(|e| panic!("{e}"));
    let layer = IdempotentLayer::new(s.clone()).key_by(KeyBy::MessageId);
    let kit = TestKit::new(counting(&effects, &fail).layer(layer));
    for body in [r#"{"a":1,"b":2}"#, r#"{"b":2,"a":1}"#] {
        assert!(
            kit.run(TestDelivery::new(body).message_id("m-1"))
                .await
                .is_ack()
        );
    }
    assert!(
        kit.run(TestDelivery::new("y").message_id("old-1"))
            .await
            .is_ack()
    );
    assert_eq!(
        effects.load(Ordering::SeqCst),
        1,
        "one run for m-1, none for old-1"
    );
    assert!(s.seen("m-1").await.unwrap_or(false));
    assert_eq!(s.len(), 2, "bare ids only");
}

#[test]
fn the_default_key_is_stable_and_names_id_and_body() {
    // Stable across processes and releases (a shared store outlives both): SHA-256.
    assert_eq!(
        key("m-1", "x"),
        "m-1#sha256:2d711642b726b04401627ca9fbac32f5"
    );
    assert_ne!(key("m-1", "x"), key("m-1", "y"));
    assert_ne!(key("m-1", "x"), key("m-2", "x"));
    assert_eq!(KeyBy::MessageId.key_of("m-1", b"x"), "m-1");
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
    assert!(s.is_empty(), "nothing marked");
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
    assert!(s.seen(&key("m-1", "x")).await.unwrap_or(false));
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
