//! Manual ack mode and hostile input against a real broker: poison, panics and requeue loops
//! end parked (never looping, never acked unprocessed), and rabbitkit's own headers are
//! believed only when rabbitkit wrote them (signed, or an unsigned copy of a previous
//! release that left one of the queue's tiers).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lapin::BasicProperties;
use lapin::types::AMQPValue;
use rabbitkit_core::extract::{Json, RoutingKey};
use rabbitkit_core::headers::{self, Attempt};
use rabbitkit_core::{
    AckPolicy, BoxError, ConnectionConfig, HeaderKeys, HeaderTrust, ManualFallback, Outcome,
    Parking, QueueType, RetryPolicy, Settle, Subscriber, Worker, WorkerHandle,
};
use rabbitkit_tests::{Broker, Vhost, table, wait_until};

const TIER: Duration = Duration::from_millis(200);
const WAIT: Duration = Duration::from_secs(20);

#[derive(serde::Deserialize)]
struct Deposit {
    id: u64,
}

fn key() -> HeaderTrust {
    HeaderTrust::signed(HeaderKeys::new("hostile-test-key-0123456789").unwrap())
}

async fn start(vh: &Vhost, s: Subscriber, trust: HeaderTrust) -> WorkerHandle {
    Worker::new(ConnectionConfig::new(vh.url()))
        .shutdown_deadline(Duration::from_secs(5))
        .header_trust(trust)
        .subscribe(s)
        .start()
        .await
        .unwrap_or_else(|e| panic!("worker start: {e}"))
}

/// The parking queue's messages with their park reason and error kind.
async fn parked(vh: &Vhost, queue: &str) -> Vec<(Option<String>, Option<String>)> {
    vh.get_all(&format!("{queue}.parking"), 100)
        .await
        .iter()
        .map(|g| {
            (
                g.header_str(headers::PARK_REASON),
                g.header_str(headers::ERROR_KIND),
            )
        })
        .collect()
}

/// A manual-mode ledger handler that never settles by itself when it fails: whatever the
/// fallback, poison parks as `decode` at once and a panic is retried, then parked.
fn ledger(effects: Arc<AtomicU32>, fallback: ManualFallback) -> Subscriber {
    Subscriber::new("ledger", move |settle: Settle, Json(d): Json<Deposit>| {
        let effects = effects.clone();
        async move {
            if d.id == 7 {
                panic!("ledger invariant broken for deposit 7");
            }
            effects.fetch_add(1, Ordering::SeqCst);
            settle.ack().await;
            Ok::<_, BoxError>(())
        }
    })
    .queue_type(QueueType::Classic)
    .ack_policy(AckPolicy::Manual)
    .manual_fallback(fallback)
    .retry(RetryPolicy::new([TIER]).max_attempts(2))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn manual_mode_parks_poison_at_once_and_a_panic_after_its_retries() {
    for fallback in [ManualFallback::NackRequeue, ManualFallback::Ack] {
        let vh = Broker::from_env().vhost("hostile-manual");
        let effects = Arc::new(AtomicU32::new(0));
        let w = start(
            &vh,
            ledger(effects.clone(), fallback),
            HeaderTrust::default(),
        )
        .await;
        // No message id: nothing to count requeues by, the case that looped for ever.
        let plain = BasicProperties::default().with_content_type("application/json".into());
        vh.publish_raw("", "ledger", b"not json", plain.clone())
            .await;
        vh.publish_raw("", "ledger", br#"{"id":7}"#, plain.clone())
            .await;
        vh.publish_raw("", "ledger", br#"{"id":1}"#, plain).await;
        wait_until(WAIT, "poison and the panicking deposit parked", || async {
            vh.try_depth("ledger.parking").await == Some(2)
        })
        .await;
        let st = w.shutdown().await.subscribers["ledger"];
        let mut got = parked(&vh, "ledger").await;
        got.sort();
        assert_eq!(
            got,
            vec![
                (Some("decode".into()), Some("decode".into())),
                (Some("max-attempts".into()), Some("panic".into())),
            ],
            "{fallback:?}"
        );
        assert_eq!(effects.load(Ordering::SeqCst), 1, "only the good deposit");
        assert_eq!(
            st.requeued, 0,
            "{fallback:?}: nothing requeued in a loop: {st:?}"
        );
        assert_eq!((st.retried, st.parked, st.panics), (1, 2, 2), "{st:?}");
        assert_eq!(
            st.unsettled, 0,
            "failures are not unsettled returns: {st:?}"
        );
        assert_eq!(vh.depth("ledger").await, 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn requeue_loop_without_a_message_id_is_parked_at_the_requeue_limit() {
    let vh = Broker::from_env().vhost("hostile-requeue");
    let runs = Arc::new(AtomicU32::new(0));
    let r = runs.clone();
    let sub = Subscriber::new("pings", move || {
        r.fetch_add(1, Ordering::SeqCst);
        async { Outcome::Requeue }
    })
    .queue_type(QueueType::Classic)
    .requeue_limit(3);
    let w = start(&vh, sub, HeaderTrust::default()).await;
    vh.publish_raw("", "pings", b"ping", BasicProperties::default())
        .await;
    wait_until(WAIT, "the requeued ping parked", || async {
        vh.try_depth("pings.parking").await == Some(1)
    })
    .await;
    let st = w.shutdown().await.subscribers["pings"];
    assert_eq!(
        runs.load(Ordering::SeqCst),
        4,
        "three requeues, then parked"
    );
    assert_eq!(st.requeued, 3, "{st:?}");
    assert_eq!(
        parked(&vh, "pings").await,
        vec![(Some("requeue-limit".into()), Some("requeue-limit".into()))]
    );
}

type Seen = Arc<Mutex<Vec<(String, u32)>>>;

/// Records what the handler is told (routing key, attempt); fails on its first attempt.
fn recorder(seen: Seen, fail_first: bool) -> Subscriber {
    Subscriber::new("orders", move |RoutingKey(k): RoutingKey, a: Attempt| {
        let seen = seen.clone();
        async move {
            seen.lock().unwrap().push((k, a.number));
            if fail_first && a.number == 1 {
                return Err::<(), BoxError>("downstream down".into());
            }
            Ok(())
        }
    })
    .bind("shop", "order.*")
    .retry(RetryPolicy::new([TIER]).max_attempts(5))
}

/// How a forgery is dressed.
#[derive(Debug, Clone, Copy)]
enum Forgery {
    /// Attempt 5 and another routing key, no signature.
    Plain,
    /// Posing as a replay: a replay mark and another routing key, no attempt.
    Replay,
    /// An `x-death` claiming 50 expiries out of one of the queue's tiers, nothing else.
    XDeath,
}

fn forged_headers(how: Forgery) -> lapin::types::FieldTable {
    let route = (
        headers::ORIGINAL_ROUTING_KEY,
        AMQPValue::LongString("order.refund.approve".into()),
    );
    match how {
        Forgery::Plain => table(&[route, (headers::ATTEMPT, AMQPValue::LongLongInt(5))]),
        Forgery::Replay => table(&[route, (headers::REPLAYED, AMQPValue::LongLongInt(1))]),
        Forgery::XDeath => {
            let entry = table(&[
                ("queue", AMQPValue::LongString("orders.delay.200ms".into())),
                ("reason", AMQPValue::LongString("expired".into())),
                ("count", AMQPValue::LongLongInt(50)),
            ]);
            table(&[(
                "x-death",
                AMQPValue::FieldArray(vec![AMQPValue::FieldTable(entry)].into()),
            )])
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn forged_route_and_attempt_headers_are_ignored() {
    // With a key once the unsigned window is over, for every dress; with a key inside the
    // window, a plain forgery (not a tier copy, not a replay); without a key, too.
    let closed = || key().accept_unsigned_for(Duration::ZERO);
    for (trust, how) in [
        (closed(), Forgery::Plain),
        (closed(), Forgery::Replay),
        (closed(), Forgery::XDeath),
        (key(), Forgery::Plain),
        (HeaderTrust::default(), Forgery::Plain),
    ] {
        let vh = Broker::from_env().vhost("hostile-forged");
        let seen: Seen = Arc::default();
        let w = start(&vh, recorder(seen.clone(), true), trust.clone()).await;
        vh.publish_raw(
            "shop",
            "order.created",
            b"{}",
            BasicProperties::default().with_headers(forged_headers(how)),
        )
        .await;
        // The first run fails: a believed attempt 5 or 51 would be parked, not retried.
        wait_until(
            WAIT,
            "the forged delivery retried, then handled",
            || async { w.stats("orders").unwrap().acked == 2 },
        )
        .await;
        let st = w.shutdown().await.subscribers["orders"];
        assert_eq!(
            *seen.lock().unwrap(),
            vec![
                ("order.created".to_owned(), 1),
                ("order.created".to_owned(), 2)
            ],
            "{how:?} {trust:?}: the route it arrived by, attempt 1, then its signed retry"
        );
        assert_eq!((st.untrusted_headers, st.parked), (1, 0), "{how:?}: {st:?}");
    }
}

/// A signature that does not verify (a forgery, or workers that do not share a key) parks
/// the message without running the handler: retrying it would restart at attempt 1 on
/// every copy, for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_bad_signature_is_parked_without_running_the_handler() {
    let vh = Broker::from_env().vhost("hostile-badsig");
    let seen: Seen = Arc::default();
    let w = start(&vh, recorder(seen.clone(), false), key()).await;
    let mut h = forged_headers(Forgery::Plain);
    // Signed, but with another key.
    HeaderTrust::signed(HeaderKeys::new("another-key-0123456789").unwrap()).sign(&mut h, b"{}");
    vh.publish_raw(
        "shop",
        "order.created",
        b"{}",
        BasicProperties::default().with_headers(h),
    )
    .await;
    wait_until(WAIT, "parked", || async {
        vh.try_depth("orders.parking").await == Some(1)
    })
    .await;
    let st = w.shutdown().await.subscribers["orders"];
    assert!(seen.lock().unwrap().is_empty(), "the handler never ran");
    assert_eq!(
        parked(&vh, "orders").await,
        vec![(Some("bad-signature".into()), Some("bad-signature".into()))]
    );
    assert_eq!((st.untrusted_headers, st.parked), (1, 1), "{st:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn signed_retry_copies_keep_their_route_and_attempt() {
    let vh = Broker::from_env().vhost("hostile-signed");
    let seen: Seen = Arc::default();
    let w = start(&vh, recorder(seen.clone(), true), key()).await;
    vh.publish_raw("shop", "order.created", b"{}", BasicProperties::default())
        .await;
    wait_until(WAIT, "acked after one retry", || async {
        w.stats("orders").unwrap().acked == 2
    })
    .await;
    let st = w.shutdown().await.subscribers["orders"];
    assert_eq!(
        *seen.lock().unwrap(),
        vec![
            ("order.created".to_owned(), 1),
            ("order.created".to_owned(), 2)
        ]
    );
    assert_eq!(st.untrusted_headers, 0);
}

/// A rolling upgrade: a copy written by a worker without a key (the previous release's
/// code path, which did not sign) waits in a tier while the new worker, with a key, starts.
/// It is believed because it left the queue's own tier; with unsigned tier copies refused,
/// it is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unsigned_copies_left_in_a_tier_by_the_previous_release_keep_working() {
    for accept in [true, false] {
        let vh = Broker::from_env().vhost("hostile-upgrade");
        let slow = Duration::from_secs(2);
        let old_seen: Seen = Arc::default();
        let old = start(
            &vh,
            recorder(old_seen.clone(), true).retry(RetryPolicy::new([slow]).max_attempts(5)),
            HeaderTrust::default(),
        )
        .await;
        vh.publish_raw("shop", "order.paid", b"{}", BasicProperties::default())
            .await;
        wait_until(WAIT, "the old release wrote a retry copy", || async {
            old.stats("orders").unwrap().retried == 1
        })
        .await;
        old.shutdown().await;
        let seen: Seen = Arc::default();
        let new = start(
            &vh,
            recorder(seen.clone(), true).retry(RetryPolicy::new([slow]).max_attempts(5)),
            key().accept_unsigned_copies(accept),
        )
        .await;
        wait_until(WAIT, "the copy handled by the new release", || async {
            !seen.lock().unwrap().is_empty()
        })
        .await;
        new.shutdown().await;
        let first = seen.lock().unwrap()[0].clone();
        if accept {
            assert_eq!(first, ("order.paid".to_owned(), 2), "believed: tier copy");
        } else {
            assert_eq!(first, ("orders".to_owned(), 1), "refused: unsigned");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replayed_message_keeps_its_route_under_a_key() {
    let vh = Broker::from_env().vhost("hostile-replay");
    let seen: Seen = Arc::default();
    let parks = Subscriber::new("orders", |RoutingKey(_): RoutingKey| async {
        Outcome::park(rabbitkit_core::Failure::error("broken downstream"))
    })
    .bind("shop", "order.*");
    let w = start(&vh, parks, key()).await;
    vh.publish_raw("shop", "order.shipped", b"{}", BasicProperties::default())
        .await;
    wait_until(WAIT, "parked", || async {
        vh.try_depth("orders.parking").await == Some(1)
    })
    .await;
    w.shutdown().await;
    let report = Parking::new(ConnectionConfig::new(vh.url()), "orders")
        .unwrap()
        .header_trust(key())
        .replay(10)
        .await
        .unwrap();
    assert_eq!(report.replayed, 1, "{report:?}");
    let w = start(&vh, recorder(seen.clone(), false), key()).await;
    wait_until(WAIT, "the replayed copy handled", || async {
        !seen.lock().unwrap().is_empty()
    })
    .await;
    let st = w.shutdown().await.subscribers["orders"];
    assert_eq!(*seen.lock().unwrap(), vec![("order.shipped".to_owned(), 1)]);
    assert_eq!(st.untrusted_headers, 0);
}

/// A handler of a channel that is lost is cut off: its slot serves the new channel, so the
/// redelivered message runs again instead of waiting behind a handler whose ack can no
/// longer reach the broker.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_channel_frees_the_slots_of_its_hanging_handlers() {
    // Without a deadline the hanging handler is cut off; with one it runs on (until its
    // deadline), but its slot is given back at once.
    for deadline in [None, Some(Duration::from_secs(60))] {
        let vh = Broker::from_env().vhost("hostile-lost");
        let runs = Arc::new(AtomicU32::new(0));
        let r = runs.clone();
        let sub = Subscriber::new("orders", move || {
            let first = r.fetch_add(1, Ordering::SeqCst) == 0;
            async move {
                if first {
                    std::future::pending::<()>().await;
                }
            }
        })
        .concurrency(1);
        let sub = match deadline {
            Some(d) => sub.deadline(d),
            None => sub.no_deadline(),
        };
        let w = start(&vh, sub, HeaderTrust::default()).await;
        vh.publish_raw("", "orders", b"x", BasicProperties::default())
            .await;
        wait_until(WAIT, "the first run hangs", || async {
            runs.load(Ordering::SeqCst) == 1
        })
        .await;
        vh.close_connections();
        wait_until(WAIT, "the redelivery ran and was acked", || async {
            w.stats("orders").unwrap().acked == 1
        })
        .await;
        assert_eq!(runs.load(Ordering::SeqCst), 2, "{deadline:?}");
        w.shutdown().await;
    }
}

/// A payload that blocks its handler (no await point for the deadline to cut) leaves a
/// subscriber that consumes nothing: `is_ready` (and `/readyz`) says so, and recovers once
/// the handler returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn readiness_reports_a_subscriber_whose_slots_are_all_stuck() {
    let vh = Broker::from_env().vhost("hostile-stall");
    let sub = Subscriber::new("orders", |body: rabbitkit_core::extract::Body| async move {
        if body.0.as_ref() == b"hang" {
            std::thread::sleep(Duration::from_secs(20));
        }
    })
    .concurrency(1)
    .deadline(Duration::from_secs(1));
    // Stalled after 1 s (deadline) + 2 s (confirm timeout) + 10 s with the slot taken.
    let w = Worker::new(ConnectionConfig::new(vh.url()))
        .shutdown_deadline(Duration::from_secs(5))
        .publisher_config(rabbitkit_core::PublisherConfig {
            confirm_timeout: Duration::from_secs(2),
            ..Default::default()
        })
        .header_trust(HeaderTrust::default())
        .subscribe(sub)
        .start()
        .await
        .unwrap();
    // Idle longer than the stall limit first: an idle subscriber is not a stalled one.
    tokio::time::sleep(Duration::from_secs(14)).await;
    assert!(w.is_ready(), "idle is not stalled");
    wait_until(WAIT, "ready", || async { w.is_ready() }).await;
    vh.publish_raw("", "orders", b"hang", BasicProperties::default())
        .await;
    vh.publish_raw("", "orders", b"ok", BasicProperties::default())
        .await;
    let hung = std::time::Instant::now();
    wait_until(WAIT, "stalled: not ready", || async { !w.is_ready() }).await;
    assert!(
        hung.elapsed() >= Duration::from_secs(12),
        "unready only once the limit passed since the slot was taken: {:?}",
        hung.elapsed()
    );
    wait_until(
        Duration::from_secs(30),
        "both settled and ready again",
        || async {
            w.stats("orders").unwrap().acked + w.stats("orders").unwrap().retried >= 2
                && w.is_ready()
        },
    )
    .await;
    w.shutdown().await;
}
