//! The operator CLI against a real broker, every command run in-process through
//! `rabbitkit::cli::run` with what it printed and its exit code checked, and the queues
//! inspected afterwards. Messages are parked by the real runtime.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable};
use rabbitkit::cli::{EXIT_FAILED, EXIT_OK, EXIT_USAGE};
use rabbitkit_core::delivery::Delivery;
use rabbitkit_core::extract::Body;
use rabbitkit_core::headers;
use rabbitkit_core::idempotency::{IdempotentLayer, MemoryStore};
use rabbitkit_core::subscriber::BoxDeliveryService;
use rabbitkit_core::{Failure, Outcome, RetryPolicy, Subscriber};
use rabbitkit_tests::{Broker, Got, Vhost, counting_handler, table, wait_until};
use tower::ServiceExt;

const WAIT: Duration = Duration::from_secs(20);

/// What one command did.
struct Run {
    code: u8,
    out: String,
    err: String,
}

/// Runs `rabbitkit ARGS --url <vhost>`.
async fn cli(vh: &Vhost, args: &[&str]) -> Run {
    let url = vh.url();
    let mut all = vec!["rabbitkit"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--url", &url]);
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = rabbitkit::cli::run(all, &mut out, &mut err).await;
    let run = Run {
        code,
        out: String::from_utf8_lossy(&out).into_owned(),
        err: String::from_utf8_lossy(&err).into_owned(),
    };
    assert!(!run.out.contains("guest:guest") && !run.err.contains("guest:guest"));
    run
}

impl std::fmt::Debug for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "exit {}\n{}\n{}", self.code, self.out, self.err)
    }
}

/// Parks one message per body with the real runtime: bodies starting with `card` park at
/// once with error kind `card-declined`, the others run out of attempts (kind `error`).
/// Published to `shop` / `order.paid` with message ids `m-0`, `m-1`, ...; an `audit`
/// queue is bound to the same exchange and key, and emptied afterwards.
async fn park(vh: &Vhost, bodies: &[&str]) {
    let failing = Subscriber::new("orders", |Body(b): Body| async move {
        if b.starts_with(b"card") {
            Outcome::park(Failure::new("card-declined", "bad card"))
        } else {
            Outcome::error("ledger offline")
        }
    })
    .bind("shop", "order.*")
    .retry(RetryPolicy::none());
    let w = vh.start_worker(failing).await;
    vh.declare_queue("audit", FieldTable::default()).await;
    vh.bind("shop", "audit", "order.*").await;
    for (i, body) in bodies.iter().enumerate() {
        let props = BasicProperties::default().with_message_id(format!("m-{i}").into());
        vh.publish_raw("shop", "order.paid", body.as_bytes(), props)
            .await;
    }
    let n = u32::try_from(bodies.len()).unwrap();
    wait_until(WAIT, "all parked", || async {
        vh.depth("orders.parking").await == n
    })
    .await;
    w.shutdown().await;
    vh.purge("audit").await;
}

fn assert_replayed_copy(g: &Got) {
    assert_eq!(g.exchange, "", "sent through the default exchange");
    assert_eq!(g.routing_key, "orders", "to the work queue only");
    for h in [
        headers::ERROR_KIND,
        headers::ERROR_MESSAGE,
        headers::PARK_REASON,
        headers::ATTEMPT,
        headers::LAST_FAILURE_AT,
    ] {
        assert!(g.header(h).is_none(), "{h} stripped");
    }
    assert_eq!(g.header_int(headers::REPLAYED), Some(1), "replay mark");
    assert!(
        g.header_str(headers::REPLAY_ID)
            .is_some_and(|id| id.ends_with(".1"))
    );
    assert_eq!(
        g.header_str(headers::ORIGINAL_ROUTING_KEY).as_deref(),
        Some("order.paid")
    );
}

fn message_ids(got: &[Got]) -> Vec<String> {
    got.iter()
        .map(|g| {
            g.properties
                .message_id()
                .as_ref()
                .map(|s| s.to_string())
                .unwrap_or_default()
        })
        .collect()
}

#[tokio::test]
async fn list_and_show_describe_parked_messages_and_leave_them_parked() {
    let vh = Broker::from_env().vhost("cli-list");
    park(&vh, &["body-0", "card-1", "body-2"]).await;

    let r = cli(&vh, &["parking", "list", "orders"]).await;
    assert_eq!(r.code, EXIT_OK, "{r:?}");
    assert!(r.out.starts_with("orders.parking: 3 parked\n"), "{r:?}");
    let lines: Vec<_> = r.out.lines().skip(1).collect();
    assert_eq!(lines.len(), 3, "{r:?}");
    assert!(
        lines[0].starts_with("m-0  reason=max-attempts kind=error attempts=1 age="),
        "{r:?}"
    );
    assert!(
        lines[1].starts_with("m-1  reason=handler kind=card-declined attempts=1 age="),
        "{r:?}"
    );
    assert!(
        lines.iter().all(|l| l.ends_with("routing-key=order.paid")),
        "{r:?}"
    );

    let r = cli(&vh, &["parking", "list", "orders", "--limit", "1"]).await;
    assert!(r.out.contains("... 2 more not shown"), "{r:?}");

    let r = cli(&vh, &["parking", "show", "orders", "--message-id", "m-1"]).await;
    assert_eq!(r.code, EXIT_OK, "{r:?}");
    assert!(
        r.out.contains("header x-rabbitkit-error-message: bad card"),
        "{r:?}"
    );
    assert!(r.out.contains("header x-rabbitkit-attempt: 1"), "{r:?}");
    assert!(r.out.contains("property message-id: m-1"), "{r:?}");
    assert!(r.out.contains("body (6 bytes): card-1"), "{r:?}");
    assert!(!r.out.contains("body-0"), "only the asked message: {r:?}");

    let r = cli(&vh, &["parking", "show", "orders", "--body-bytes", "4"]).await;
    assert!(
        r.out.starts_with("orders.parking: 3 parked, 3 shown\n"),
        "{r:?}"
    );
    assert_eq!(r.out.matches("--- orders.parking #").count(), 3, "{r:?}");
    assert!(
        r.out.contains("body (6 bytes): body ...(2 more bytes)"),
        "{r:?}"
    );

    let r = cli(&vh, &["parking", "show", "orders", "--message-id", "nope"]).await;
    assert_eq!(r.code, EXIT_FAILED, "{r:?}");
    assert!(
        r.err.contains("no message with id \"nope\" among the 3"),
        "{r:?}"
    );

    assert_eq!(
        vh.depth("orders.parking").await,
        3,
        "reading removed nothing"
    );
    // `list --limit 1` read only m-0: the quorum parking queue requeued it behind the
    // others (quorum queues requeue at the back, on 3.10, 4.0 and 4.3). Nothing is lost;
    // the order of a partly browsed parking queue is not kept.
    let bodies: Vec<_> = vh.get_all("orders.parking", 10).await;
    assert_eq!(message_ids(&bodies), ["m-1", "m-2", "m-0"], "m-0 behind");

    let r = cli(&vh, &["parking", "list", "missing"]).await;
    assert_eq!(r.code, EXIT_FAILED, "{r:?}");
    assert!(r.err.contains("missing.parking is not there"), "{r:?}");
    assert!(r.err.contains("guest:***@"), "redacted URL: {r:?}");
}

#[tokio::test]
async fn list_and_show_take_the_filters_of_replay() {
    let vh = Broker::from_env().vhost("cli-list-filters");
    park(&vh, &["body-0", "card-1", "body-2"]).await;

    let r = cli(
        &vh,
        &["parking", "list", "orders", "--error-kind", "card-declined"],
    )
    .await;
    assert_eq!(r.code, EXIT_OK, "{r:?}");
    assert!(
        r.out.starts_with("orders.parking: 3 parked, 1 matching\n"),
        "{r:?}"
    );
    let lines: Vec<_> = r.out.lines().skip(1).collect();
    assert_eq!(lines.len(), 1, "{r:?}");
    assert!(lines[0].starts_with("m-1  reason=handler"), "{r:?}");

    // `--reason` is `--park-reason`, as on replay; JSON says how many match.
    let r = cli(
        &vh,
        &[
            "parking",
            "list",
            "orders",
            "--reason",
            "max-attempts",
            "--json",
        ],
    )
    .await;
    assert_eq!(r.code, EXIT_OK, "{r:?}");
    let doc: serde_json::Value = serde_json::from_str(&r.out).expect("list --json is JSON");
    assert_eq!(doc["parked"], 3);
    assert_eq!(doc["matching"], 2);
    let ids: Vec<_> = doc["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["message_id"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(ids, ["m-0", "m-2"], "{r:?}");

    // Ages: all were parked within the hour, none over an hour ago.
    let r = cli(&vh, &["parking", "list", "orders", "--older-than", "1h"]).await;
    assert!(
        r.out.starts_with("orders.parking: 3 parked, 0 matching\n"),
        "{r:?}"
    );
    let r = cli(
        &vh,
        &["parking", "list", "orders", "--since", "1h", "--limit", "1"],
    )
    .await;
    assert!(
        r.out.starts_with("orders.parking: 3 parked, 3 matching\n"),
        "{r:?}"
    );
    assert!(r.out.contains("... 2 more not shown"), "{r:?}");

    let r = cli(
        &vh,
        &["parking", "show", "orders", "--error-kind", "card-declined"],
    )
    .await;
    assert_eq!(r.code, EXIT_OK, "{r:?}");
    assert!(
        r.out.starts_with("orders.parking: 3 parked, 1 shown\n"),
        "{r:?}"
    );
    assert!(r.out.contains("property message-id: m-1"), "{r:?}");
    assert!(!r.out.contains("message-id: m-0"), "{r:?}");

    // An id the other filters rule out is not found.
    let r = cli(
        &vh,
        &[
            "parking",
            "show",
            "orders",
            "--message-id",
            "m-0",
            "--error-kind",
            "card-declined",
        ],
    )
    .await;
    assert_eq!(r.code, EXIT_FAILED, "{r:?}");
    assert!(r.err.contains("that the other filters pick"), "{r:?}");

    assert_eq!(
        vh.depth("orders.parking").await,
        3,
        "reading removed nothing"
    );
}

#[tokio::test]
async fn replay_filters_move_only_matching_messages_and_only_to_the_work_queue() {
    let vh = Broker::from_env().vhost("cli-replay");
    park(&vh, &["body-0", "card-1", "body-2", "card-3"]).await;

    let r = cli(
        &vh,
        &[
            "parking",
            "replay",
            "orders",
            "--error-kind",
            "card-declined",
        ],
    )
    .await;
    assert_eq!(r.code, EXIT_OK, "{r:?}");
    assert!(
        r.out.starts_with(
            "2 replayed into orders, 0 duplicates removed, 2 passed over, 2 still parked"
        ),
        "{r:?}"
    );
    let copies = vh.get_all("orders", 10).await;
    assert_eq!(message_ids(&copies), ["m-1", "m-3"]);
    copies.iter().for_each(assert_replayed_copy);
    assert_eq!(
        vh.depth("audit").await,
        0,
        "not fanned out to other bound queues"
    );

    // By id, with a limit.
    let r = cli(
        &vh,
        &[
            "parking",
            "replay",
            "orders",
            "--message-id",
            "m-2",
            "--limit",
            "5",
        ],
    )
    .await;
    assert!(r.out.starts_with("1 replayed"), "{r:?}");
    assert_eq!(message_ids(&vh.get_all("orders", 10).await), ["m-2"]);

    // Nothing is that old: a truthful 0, exit 0, and the message stays.
    let r = cli(&vh, &["parking", "replay", "orders", "--older-than", "1h"]).await;
    assert_eq!(r.code, EXIT_OK, "{r:?}");
    assert!(r.out.starts_with("0 replayed"), "{r:?}");
    let r = cli(&vh, &["parking", "replay", "orders", "--older-than", "1ms"]).await;
    assert!(r.out.starts_with("1 replayed"), "{r:?}");
    assert_eq!(message_ids(&vh.get_all("orders", 10).await), ["m-0"]);
    assert_eq!(vh.depth("orders.parking").await, 0);
    assert_eq!(vh.depth("audit").await, 0);
}

/// The headers of a delivered message without those the queue adds on delivery.
fn stored_headers(p: &BasicProperties) -> FieldTable {
    let mut kept = FieldTable::default();
    for (k, v) in p.headers().clone().unwrap_or_default().inner() {
        if !headers::BROKER_COUNT_HEADERS.contains(&k.as_str()) {
            kept.insert(k.clone(), v.clone());
        }
    }
    kept
}

#[tokio::test]
async fn passed_over_messages_stay_parked_unchanged_and_in_order() {
    let vh = Broker::from_env().vhost("cli-keep");
    park(&vh, &["body-0", "card-1", "body-2"]).await;
    let before = vh.get_all("orders.parking", 10).await;
    for g in &before {
        vh.publish_raw("", "orders.parking", &g.body, g.properties.clone())
            .await;
    }
    let r = cli(&vh, &["parking", "replay", "orders", "--message-id", "m-1"]).await;
    assert!(r.out.starts_with("1 replayed"), "{r:?}");
    let after = vh.get_all("orders.parking", 10).await;
    assert_eq!(message_ids(&after), ["m-0", "m-2"], "in order");
    for (a, b) in after
        .iter()
        .zip(before.iter().filter(|g| g.body != b"card-1"))
    {
        assert_eq!(a.body, b.body);
        // A quorum parking queue adds its own delivery counts to what it delivers (each
        // browse one more): the message it stores is what is compared.
        assert_eq!(
            stored_headers(&a.properties),
            stored_headers(&b.properties),
            "untouched"
        );
    }
}

#[tokio::test]
async fn replay_is_idempotent_and_skips_parked_twins() {
    let vh = Broker::from_env().vhost("cli-twice");
    park(&vh, &["body-0", "body-1"]).await;
    // A twin of m-0, as the runtime leaves when the ack of a confirmed parking copy is
    // lost and the message fails again.
    let parked = vh.get_all("orders.parking", 10).await;
    for g in parked.iter().chain(parked.iter().take(1)) {
        vh.publish_raw("", "orders.parking", &g.body, g.properties.clone())
            .await;
    }
    assert_eq!(vh.depth("orders.parking").await, 3);

    let r = cli(&vh, &["parking", "replay", "orders"]).await;
    assert_eq!(r.code, EXIT_OK, "{r:?}");
    assert!(
        r.out
            .starts_with("2 replayed into orders, 1 duplicates removed"),
        "{r:?}"
    );
    let r = cli(&vh, &["parking", "replay", "orders"]).await;
    assert_eq!(r.code, EXIT_OK, "{r:?}");
    assert!(r.out.starts_with("0 replayed"), "{r:?}");

    let copies = vh.get_all("orders", 10).await;
    assert_eq!(message_ids(&copies), ["m-0", "m-1"], "one copy each");
    let ids: Vec<_> = copies
        .iter()
        .map(|g| g.header_str(headers::REPLAY_ID).unwrap())
        .collect();
    assert_ne!(ids[0], ids[1]);
    assert_eq!(vh.depth("orders.parking").await, 0);
}

/// The gap replay cannot close alone: a crash between a copy's confirm and the ack leaves
/// the message parked too. The next replay's copy carries the same message id and replay
/// id, and a worker with the `Idempotent` layer acks it without a second effect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_copy_after_a_lost_replay_ack_is_recognised_and_skipped() {
    let vh = Broker::from_env().vhost("cli-lost-ack");
    park(&vh, &["body-0"]).await;
    // What a crash after the confirm would leave parked: the message as it was.
    let stale = vh.get_all("orders.parking", 1).await.remove(0);
    vh.publish_raw("", "orders.parking", &stale.body, stale.properties.clone())
        .await;

    let effects = Arc::new(AtomicU32::new(0));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let handler = counting_handler(effects.clone());
    let s2 = seen.clone();
    let record = tower::layer::layer_fn(move |inner: BoxDeliveryService| {
        let seen = s2.clone();
        tower::service_fn(move |d: Delivery| {
            let (inner, seen) = (inner.clone(), seen.clone());
            async move {
                let id = d.header(headers::REPLAY_ID).and_then(headers::string);
                seen.lock()
                    .unwrap()
                    .push((d.message_id().map(str::to_owned), id));
                inner.oneshot(d).await
            }
        })
    });
    let store = MemoryStore::new(100, Duration::from_secs(600));
    let sub = Subscriber::new("orders", handler)
        .bind("shop", "order.*")
        .layer(IdempotentLayer::new(store))
        .layer(record);
    let w = vh.start_worker(sub).await;

    let r = cli(&vh, &["parking", "replay", "orders"]).await;
    assert!(r.out.starts_with("1 replayed"), "{r:?}");
    wait_until(WAIT, "first copy handled", || async {
        w.stats("orders").unwrap().acked == 1
    })
    .await;
    vh.publish_raw("", "orders.parking", &stale.body, stale.properties.clone())
        .await;
    let r = cli(&vh, &["parking", "replay", "orders"]).await;
    assert!(r.out.starts_with("1 replayed"), "{r:?}");
    wait_until(WAIT, "second copy acked", || async {
        w.stats("orders").unwrap().acked == 2
    })
    .await;
    w.shutdown().await;
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!(seen[0], seen[1], "same message id and replay id: {seen:?}");
    assert_eq!(seen[0].0.as_deref(), Some("m-0"));
    assert!(seen[0].1.as_deref().is_some_and(|id| id.ends_with(".1")));
    assert_eq!(effects.load(Ordering::SeqCst), 1, "no second effect");
}

#[tokio::test]
async fn replay_leaves_messages_parked_from_another_work_queue() {
    let vh = Broker::from_env().vhost("cli-other");
    park(&vh, &["body-0"]).await;
    // A message another queue's custom dead-letter arguments sent here.
    let mut h = FieldTable::default();
    h.insert(
        headers::SOURCE_QUEUE.into(),
        AMQPValue::LongString("billing".into()),
    );
    let props = BasicProperties::default()
        .with_message_id("b-1".into())
        .with_headers(h);
    vh.publish_raw("", "orders.parking", b"invoice", props)
        .await;
    let r = cli(&vh, &["parking", "replay", "orders"]).await;
    assert_eq!(r.code, EXIT_OK, "{r:?}");
    assert!(r.out.starts_with("1 replayed"), "{r:?}");
    assert!(
        r.out
            .contains("1 left parked: parked from another work queue"),
        "{r:?}"
    );
    assert_eq!(message_ids(&vh.get_all("orders", 10).await), ["m-0"]);
    let kept = vh.get_all("orders.parking", 10).await;
    assert_eq!(message_ids(&kept), ["b-1"]);
    assert_eq!(
        kept[0].header_str(headers::SOURCE_QUEUE).as_deref(),
        Some("billing")
    );
}

#[tokio::test]
async fn replay_rate_limit_spaces_the_copies() {
    let vh = Broker::from_env().vhost("cli-rate");
    park(&vh, &["a", "b", "c", "d", "e"]).await;
    let start = Instant::now();
    let r = cli(&vh, &["parking", "replay", "orders", "--rate", "10/s"]).await;
    let elapsed = start.elapsed();
    assert!(r.out.starts_with("5 replayed"), "{r:?}");
    // 5 copies at 10/s: the first at once, then one every 100 ms.
    assert!(elapsed >= Duration::from_millis(400), "{elapsed:?}");
    assert_eq!(vh.depth("orders").await, 5);
}

#[tokio::test]
async fn replay_that_cannot_be_confirmed_exits_non_zero_and_keeps_the_messages() {
    let vh = Broker::from_env().vhost("cli-refused");
    park(&vh, &["body-0", "body-1"]).await;
    vh.delete_queue("orders").await;
    let r = cli(&vh, &["parking", "replay", "orders"]).await;
    assert_eq!(r.code, EXIT_FAILED, "{r:?}");
    assert!(r.out.starts_with("0 replayed"), "{r:?}");
    assert!(r.err.contains("Returned"), "{r:?}");
    assert_eq!(vh.depth("orders.parking").await, 2, "nothing lost");

    let r = cli(&vh, &["parking", "replay", "nothing-here"]).await;
    assert_eq!(
        r.code, EXIT_FAILED,
        "a missing parking queue is an error: {r:?}"
    );
}

#[tokio::test]
async fn purge_is_refused_without_yes_and_done_with_it() {
    let vh = Broker::from_env().vhost("cli-purge");
    park(&vh, &["body-0", "body-1"]).await;
    let r = cli(&vh, &["parking", "purge", "orders"]).await;
    assert_eq!(r.code, EXIT_USAGE, "{r:?}");
    assert!(
        r.err.contains("without --yes; nothing was removed"),
        "{r:?}"
    );
    assert_eq!(vh.depth("orders.parking").await, 2);
    let r = cli(&vh, &["parking", "purge", "orders", "--yes"]).await;
    assert_eq!(r.code, EXIT_OK, "{r:?}");
    assert_eq!(r.out, "purged 2 from orders.parking\n");
    assert_eq!(vh.depth("orders.parking").await, 0);
}

#[tokio::test]
async fn topology_check_reports_what_is_missing_declares_nothing_and_passes_after_apply() {
    let vh = Broker::from_env().vhost("cli-topology");
    let args = ["orders", "--tiers", "1s,10s", "--bind", "shop=order.*"];
    let with = |cmd: &'static str| {
        let mut a = vec!["topology", cmd];
        a.extend_from_slice(&args);
        a
    };
    let r = cli(&vh, &with("check")).await;
    assert_eq!(r.code, EXIT_FAILED, "{r:?}");
    for missing in [
        "MISSING    exchange \"shop\" (topic)",
        "MISSING    parking queue \"orders.parking\"",
        "MISSING    work queue \"orders\"",
        "MISSING    retry exchange \"orders.retry\" (direct)",
        "MISSING    retry tier \"orders.delay.1s\"",
        "MISSING    retry tier \"orders.delay.10s\"",
    ] {
        assert!(r.out.contains(missing), "{missing}: {r:?}");
    }
    assert!(r.err.contains("6 missing or different"), "{r:?}");
    assert_eq!(vh.try_depth("orders").await, None, "check declared nothing");
    assert_eq!(vh.try_depth("orders.parking").await, None);

    let r = cli(&vh, &with("apply")).await;
    assert_eq!(r.code, EXIT_OK, "{r:?}");
    let r = cli(&vh, &with("check")).await;
    assert_eq!(r.code, EXIT_OK, "{r:?}");
    assert!(r.out.contains("ok         work queue \"orders\""), "{r:?}");
    assert!(r.out.contains("unchecked  binding \"shop\""), "{r:?}");

    // The same queue as quorum: the broker's 406 names the difference.
    let r = cli(&vh, &["topology", "check", "orders", "--quorum"]).await;
    assert_eq!(r.code, EXIT_FAILED, "{r:?}");
    assert!(r.out.contains("DIFFERENT  work queue \"orders\""), "{r:?}");
    assert!(r.out.contains("ok         parking queue"), "{r:?}");
}

#[tokio::test]
async fn topology_migrate_moves_classic_tiers_into_quorum_tiers_and_deletes_them() {
    let vh = Broker::from_env().vhost("cli-migrate");
    // The topology of an earlier release: classic tiers `orders.retry.{delay}`.
    let r = cli(
        &vh,
        &[
            "topology",
            "apply",
            "orders",
            "--tiers",
            "20s,1m",
            "--classic-tiers",
        ],
    )
    .await;
    assert_eq!(r.code, EXIT_OK, "{r:?}");
    let props = || {
        BasicProperties::default()
            .with_message_id("m-1".into())
            .with_headers(rabbitkit_tests::table(&[(
                headers::ATTEMPT,
                AMQPValue::LongLongInt(2),
            )]))
    };
    for _ in 0..3 {
        vh.publish_raw("orders.retry", "orders.retry.20s", b"copy", props())
            .await;
    }
    vh.publish_raw("orders.retry", "orders.retry.1m", b"copy", props())
        .await;
    let r = cli(&vh, &["topology", "check", "orders", "--tiers", "20s,1m"]).await;
    assert_eq!(r.code, EXIT_FAILED, "quorum tiers not there yet: {r:?}");
    assert!(
        r.out.contains("MISSING    retry tier \"orders.delay.20s\""),
        "{r:?}"
    );

    let r = cli(&vh, &["topology", "migrate", "orders", "--tiers", "20s,1m"]).await;
    assert_eq!(r.code, EXIT_OK, "{r:?}");
    assert!(
        r.out.contains(
            "migrated   20s: 3 moved from \"orders.retry.20s\" into \"orders.delay.20s\"; \"orders.retry.20s\" deleted"
        ),
        "{r:?}"
    );
    assert!(r.out.contains("migrated   1m: 1 moved"), "{r:?}");
    assert!(
        r.out
            .ends_with("4 moved; no classic delay tier of \"orders\" left\n"),
        "{r:?}"
    );
    assert_eq!(vh.try_depth("orders.retry.20s").await, None);
    assert_eq!(vh.try_depth("orders.retry.1m").await, None);
    assert_eq!(vh.depth("orders.delay.20s").await, 3);
    assert_eq!(vh.depth("orders.delay.1m").await, 1);
    // The quorum topology is now complete; the classic one is gone.
    let r = cli(&vh, &["topology", "check", "orders", "--tiers", "20s,1m"]).await;
    assert_eq!(r.code, EXIT_OK, "{r:?}");
    let r = cli(
        &vh,
        &[
            "topology",
            "check",
            "orders",
            "--tiers",
            "20s",
            "--classic-tiers",
        ],
    )
    .await;
    assert!(
        r.out.contains("MISSING    retry tier \"orders.retry.20s\""),
        "{r:?}"
    );

    let r = cli(&vh, &["topology", "migrate", "orders", "--tiers", "20s,1m"]).await;
    assert_eq!(r.code, EXIT_OK, "{r:?}");
    assert!(r.out.contains("absent     20s"), "{r:?}");
    assert!(r.out.starts_with("absent"), "nothing to do twice: {r:?}");

    let r = cli(
        &vh,
        &["topology", "migrate", "nothing-here", "--tiers", "1s"],
    )
    .await;
    assert_eq!(
        r.code, EXIT_FAILED,
        "a missing work queue is an error: {r:?}"
    );
    let r = cli(&vh, &["topology", "migrate", "orders"]).await;
    assert_eq!(r.code, EXIT_USAGE, "--tiers is required: {r:?}");
}

/// `rabbitkit publish --exchange "" --routing-key KEY EXTRA...`.
async fn publish(vh: &Vhost, key: &str, extra: &[&str]) -> Run {
    let mut args = vec!["publish", "--exchange", "", "--routing-key", key];
    args.extend_from_slice(extra);
    cli(vh, &args).await
}

#[tokio::test]
async fn publish_exits_zero_only_when_confirmed() {
    let vh = Broker::from_env().vhost("cli-publish");
    vh.declare_queue("inbox", FieldTable::default()).await;
    let json = [
        "--body",
        r#"{"n":1}"#,
        "--json",
        "--header",
        "tenant=acme",
        "--message-id",
        "p-1",
    ];
    let r = publish(&vh, "inbox", &json).await;
    assert_eq!(r.code, EXIT_OK, "{r:?}");
    assert!(r.out.starts_with("confirmed: confirmed in"), "{r:?}");
    assert!(r.out.contains("message id p-1"), "{r:?}");

    let file = std::env::temp_dir().join(format!("rabbitkit-cli-{}.bin", std::process::id()));
    std::fs::write(&file, b"from a file").unwrap();
    let path = file.to_string_lossy().into_owned();
    let r = publish(&vh, "inbox", &["--file", &path]).await;
    std::fs::remove_file(&file).unwrap();
    assert_eq!(r.code, EXIT_OK, "{r:?}");

    let got = vh.get_all("inbox", 10).await;
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].body, br#"{"n":1}"#);
    assert_eq!(got[0].header_str("tenant").as_deref(), Some("acme"));
    assert_eq!(
        got[0]
            .properties
            .content_type()
            .as_ref()
            .map(|c| c.as_str()),
        Some("application/json")
    );
    assert_eq!(got[1].body, b"from a file");
    assert_eq!(*got[1].properties.delivery_mode(), Some(2), "persistent");

    let r = publish(&vh, "nowhere", &[]).await;
    assert_eq!(r.code, EXIT_FAILED, "{r:?}");
    assert!(r.err.contains("not confirmed: returned"), "{r:?}");

    let r = publish(&vh, "inbox", &["--body", "{", "--json"]).await;
    assert_eq!(r.code, EXIT_USAGE, "{r:?}");
    assert_eq!(vh.depth("inbox").await, 0, "nothing sent");
}

#[tokio::test]
async fn read_commands_print_json_with_rfc3339_times() {
    let vh = Broker::from_env().vhost("cli-json");
    park(&vh, &["body-0", "card-1"]).await;

    let r = cli(&vh, &["parking", "list", "orders", "--json"]).await;
    assert_eq!(r.code, EXIT_OK, "{r:?}");
    let doc: serde_json::Value = serde_json::from_str(&r.out).expect("list --json is JSON");
    assert_eq!(doc["queue"], "orders.parking");
    assert_eq!(doc["parked"], 2);
    let msgs = doc["messages"].as_array().expect("messages");
    assert_eq!(msgs.len(), 2, "{r:?}");
    assert_eq!(msgs[0]["message_id"], "m-0");
    assert_eq!(msgs[0]["reason"], "max-attempts");
    assert_eq!(msgs[1]["reason"], "handler");
    assert_eq!(msgs[1]["error_kind"], "card-declined");
    assert_eq!(msgs[1]["error_message"], "bad card");
    let parked_at = msgs[0]["parked_at"].as_str().expect("parked_at");
    assert!(humantime::parse_rfc3339(parked_at).is_ok(), "{parked_at}");

    let r = cli(
        &vh,
        &["parking", "show", "orders", "--message-id", "m-1", "--json"],
    )
    .await;
    assert_eq!(r.code, EXIT_OK, "{r:?}");
    let doc: serde_json::Value = serde_json::from_str(&r.out).expect("show --json is JSON");
    let m = &doc["messages"][0];
    assert_eq!(m["body"], "card-1");
    assert_eq!(m["body_truncated"], false);
    assert_eq!(m["headers"][headers::ERROR_KIND], "card-declined");
    assert_eq!(m["headers"][headers::ATTEMPT], 1);
    let last = m["headers"][headers::LAST_FAILURE_AT]
        .as_str()
        .expect("failure time as a string");
    assert!(humantime::parse_rfc3339(last).is_ok(), "{last}");

    // Text output shows the same times readably, with the raw milliseconds kept.
    let r = cli(&vh, &["parking", "show", "orders", "--message-id", "m-1"]).await;
    let line = r
        .out
        .lines()
        .find(|l| l.starts_with(&format!("header {}: ", headers::LAST_FAILURE_AT)))
        .expect("last-failure header shown");
    let value = line.split_once(": ").unwrap().1;
    let (time, raw) = value.split_once(' ').expect("time then raw value");
    assert!(humantime::parse_rfc3339(time).is_ok(), "{line}");
    assert!(raw.starts_with('(') && raw.ends_with(')'), "{line}");
    assert_eq!(vh.depth("orders.parking").await, 2, "reads removed nothing");
}

#[tokio::test]
async fn replay_by_park_reason_and_dry_run_moves_nothing() {
    let vh = Broker::from_env().vhost("cli-reason");
    park(&vh, &["body-0", "card-1", "card-2"]).await;

    let r = cli(
        &vh,
        &[
            "parking",
            "replay",
            "orders",
            "--park-reason",
            "handler",
            "--dry-run",
        ],
    )
    .await;
    assert_eq!(r.code, EXIT_OK, "{r:?}");
    assert_eq!(r.out.matches("would replay ").count(), 2, "{r:?}");
    assert!(r.out.contains("would replay m-1"), "{r:?}");
    assert!(!r.out.contains("would replay m-0"), "{r:?}");
    assert!(r.out.contains("nothing was moved"), "{r:?}");
    assert_eq!(vh.depth("orders.parking").await, 3, "dry run moved nothing");
    assert_eq!(vh.depth("orders").await, 0);

    let r = cli(
        &vh,
        &[
            "parking",
            "replay",
            "orders",
            "--park-reason",
            "max-attempts",
            "--json",
        ],
    )
    .await;
    assert_eq!(r.code, EXIT_OK, "{r:?}");
    let doc: serde_json::Value = serde_json::from_str(&r.out).expect("replay --json is JSON");
    assert_eq!(doc["replayed"], 1, "{r:?}");
    assert_eq!(doc["passed_over"], 2, "{r:?}");
    assert_eq!(vh.depth("orders").await, 1);
    let left = vh.get_all("orders.parking", 10).await;
    assert_eq!(
        message_ids(&left),
        ["m-1", "m-2"],
        "the other reason stays parked"
    );
}

/// A worker config file for `vh` with these `[[subscribers]]`: its path, and as a string.
fn config_file(vh: &Vhost, hint: &str, subscribers: &str) -> (std::path::PathBuf, String) {
    let file =
        std::env::temp_dir().join(format!("rabbitkit-cli-{hint}-{}.toml", std::process::id()));
    let doc = format!("[connection]\nurl = \"{}\"\n{subscribers}", vh.url());
    std::fs::write(&file, doc).unwrap();
    let path = file.to_string_lossy().into_owned();
    (file, path)
}

#[tokio::test]
async fn topology_check_reads_a_worker_config_file() {
    let vh = Broker::from_env().vhost("cli-topology-config");
    let (file, path) = config_file(
        &vh,
        "topology",
        r#"
[[subscribers]]
handler = "charge"
queue = "payments"
queue-type = "quorum"
bindings = [{ exchange = "shop", routing-key = "payment.*" }]
retry = { tiers = ["2s"], max-attempts = 2 }

[[subscribers]]
handler = "ship"
queue = "shipping"
"#,
    );

    let r = cli(&vh, &["topology", "check", "--config", &path]).await;
    assert_eq!(r.code, EXIT_FAILED, "{r:?}");
    assert!(
        r.out.contains("MISSING    work queue \"payments\""),
        "{r:?}"
    );
    assert!(
        r.out.contains("MISSING    work queue \"shipping\""),
        "{r:?}"
    );
    assert!(r.out.contains("MISSING    exchange \"shop\""), "{r:?}");
    assert_eq!(
        vh.try_depth("payments").await,
        None,
        "check declared nothing"
    );

    // Only one subscriber's queue, applied from the file, then checked as JSON.
    let r = cli(&vh, &["topology", "apply", "payments", "--config", &path]).await;
    assert_eq!(r.code, EXIT_OK, "{r:?}");
    let r = cli(
        &vh,
        &["topology", "check", "payments", "--config", &path, "--json"],
    )
    .await;
    assert_eq!(r.code, EXIT_OK, "{r:?}");
    let doc: serde_json::Value = serde_json::from_str(&r.out).expect("check --json is JSON");
    assert_eq!(doc.as_array().map(Vec::len), Some(1), "{r:?}");
    assert_eq!(doc[0]["work_queue"], "payments");
    assert_eq!(doc[0]["ok"], true);
    // The file said quorum: a classic check of the same queue differs.
    let r = cli(&vh, &["topology", "check", "payments"]).await;
    assert_eq!(r.code, EXIT_FAILED, "{r:?}");
    assert!(
        r.out.contains("DIFFERENT  work queue \"payments\""),
        "{r:?}"
    );

    // Flags and --config do not mix; an unknown queue is a usage error.
    let r = cli(&vh, &["topology", "check", "--config", &path, "--quorum"]).await;
    assert_eq!(r.code, EXIT_USAGE, "{r:?}");
    let r = cli(&vh, &["topology", "check", "nope", "--config", &path]).await;
    assert_eq!(r.code, EXIT_USAGE, "{r:?}");
    std::fs::remove_file(&file).unwrap();
}

#[tokio::test]
async fn topology_prune_lists_then_deletes_only_empty_tiers_no_subscriber_uses() {
    let vh = Broker::from_env().vhost("cli-prune");
    let (file, path) = config_file(
        &vh,
        "prune",
        r#"
[[subscribers]]
handler = "charge"
queue = "payments"
retry = { tiers = ["1s", "30s"] }

[[subscribers]]
handler = "ship"
queue = "shipping"
"#,
    );
    let mgmt = vh.broker.mgmt.clone();
    // The current schedule (1s, 30s, quorum tiers), a dropped delay (5s), the classic tier
    // of a delay now on quorum tiers holding a message (30s), an unrelated queue, and a
    // tier of a subscriber whose schedule the file does not give.
    let r = cli(&vh, &["topology", "apply", "payments", "--config", &path]).await;
    assert_eq!(r.code, EXIT_OK, "{r:?}");
    for q in ["payments.retry.30s", "payments.audit", "shipping.delay.7s"] {
        vh.declare_queue(q, FieldTable::default()).await;
    }
    // Dropped delays of a quorum schedule: quorum tiers bound to the retry exchange, one
    // empty (5s), one holding a copy (10s). RabbitMQ refuses `if-empty` for quorum queues.
    let quorum = || table(&[("x-queue-type", AMQPValue::LongString("quorum".into()))]);
    for q in ["payments.delay.5s", "payments.delay.10s"] {
        vh.declare_queue(q, quorum()).await;
        vh.bind("payments.retry", q, q).await;
    }
    vh.publish_raw(
        "",
        "payments.retry.30s",
        b"waiting",
        BasicProperties::default(),
    )
    .await;
    vh.publish_raw(
        "payments.retry",
        "payments.delay.10s",
        b"waiting too",
        BasicProperties::default(),
    )
    .await;
    wait_until(WAIT, "the management API counts the tiers", || async {
        [
            ("payments.retry.30s", 1),
            ("payments.delay.10s", 1),
            ("payments.delay.5s", 0),
        ]
        .iter()
        .all(|(q, n)| {
            let (_, body) =
                rabbitkit_tests::http(&mgmt, "GET", &format!("/api/queues/{}/{q}", vh.name), None);
            serde_json::from_str::<serde_json::Value>(&body)
                .ok()
                .and_then(|v| v["messages"].as_u64())
                == Some(*n)
        })
    })
    .await;
    let prune = |extra: &'static [&'static str]| {
        let mut args = vec!["topology", "prune", "--config", &path, "--mgmt-url", &mgmt];
        args.extend_from_slice(extra);
        let vh = &vh;
        async move { cli(vh, &args).await }
    };

    let r = prune(&[]).await;
    assert_eq!(r.code, EXIT_OK, "{r:?}");
    assert!(
        r.out.contains("unused     payments.delay.5s (0 messages)"),
        "{r:?}"
    );
    assert!(
        r.out.contains("unused     payments.retry.30s (1 messages)"),
        "{r:?}"
    );
    assert!(r.out.contains("skipped    \"shipping\""), "{r:?}");
    for in_use in [
        "payments.delay.1s",
        "payments.delay.30s",
        "payments.audit",
        "shipping.delay.7s",
    ] {
        assert!(
            !r.out.contains(&format!(" {in_use} ")),
            "{in_use} listed: {r:?}"
        );
    }
    assert_eq!(
        vh.try_depth("payments.delay.5s").await,
        Some(0),
        "listing deletes nothing"
    );

    let r = prune(&["--json"]).await;
    assert_eq!(r.code, EXIT_OK, "{r:?}");
    let doc: serde_json::Value = serde_json::from_str(&r.out).expect("prune --json is JSON");
    let names: Vec<_> = doc["unused"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| (u["queue"].as_str().unwrap().to_owned(), u["state"].clone()))
        .collect();
    assert_eq!(
        names,
        [
            ("payments.delay.10s".to_owned(), "unused".into()),
            ("payments.delay.5s".to_owned(), "unused".into()),
            ("payments.retry.30s".to_owned(), "unused".into())
        ]
    );
    assert_eq!(doc["skipped"][0]["work_queue"], "shipping");

    // --yes deletes the empty one, keeps the one holding a message, and says so (exit 1).
    let r = prune(&["--yes"]).await;
    assert_eq!(r.code, EXIT_FAILED, "{r:?}");
    assert!(r.out.contains("deleted    payments.delay.5s"), "{r:?}");
    assert!(r.out.contains("KEPT       payments.retry.30s"), "{r:?}");
    assert!(r.out.contains("KEPT       payments.delay.10s"), "{r:?}");
    assert_eq!(vh.try_depth("payments.delay.5s").await, None);
    assert_eq!(
        vh.depth("payments.retry.30s").await,
        1,
        "the message is still there"
    );
    assert_eq!(
        vh.depth("payments.delay.10s").await,
        1,
        "the copy is still there"
    );
    // Bound again: a copy routed to it still arrives.
    vh.publish_raw(
        "payments.retry",
        "payments.delay.10s",
        b"routed after the prune",
        BasicProperties::default(),
    )
    .await;
    wait_until(WAIT, "the kept quorum tier is bound again", || async {
        vh.depth("payments.delay.10s").await == 2
    })
    .await;
    for in_use in [
        "payments.delay.1s",
        "payments.delay.30s",
        "shipping.delay.7s",
    ] {
        assert!(vh.try_depth(in_use).await.is_some(), "{in_use} deleted");
    }
    // Once they drained, they go too.
    vh.purge("payments.retry.30s").await;
    vh.purge("payments.delay.10s").await;
    let r = prune(&["payments", "--yes"]).await;
    assert_eq!(r.code, EXIT_OK, "{r:?}");
    assert!(r.out.contains("deleted    payments.retry.30s"), "{r:?}");
    assert!(r.out.contains("deleted    payments.delay.10s"), "{r:?}");
    assert_eq!(vh.try_depth("payments.retry.30s").await, None);
    assert_eq!(vh.try_depth("payments.delay.10s").await, None);

    // A management API that refuses the user is an error, not an empty list.
    let bad = mgmt.replace("http://", "http://nobody:wrong@");
    let r = cli(
        &vh,
        &["topology", "prune", "--config", &path, "--mgmt-url", &bad],
    )
    .await;
    assert_eq!(r.code, EXIT_FAILED, "{r:?}");
    assert!(r.err.contains("401"), "{r:?}");
    std::fs::remove_file(&file).unwrap();
}

#[tokio::test]
async fn a_plain_http_management_url_to_another_host_is_refused_before_connecting() {
    let vh = Broker::from_env().vhost("cli-plain-http");
    let (file, path) = config_file(
        &vh,
        "plain-http",
        "[[subscribers]]\nhandler = \"charge\"\nqueue = \"payments\"\nretry = { tiers = [\"1s\"] }\n",
    );
    // 192.0.2.1 (TEST-NET-1) routes nowhere: a connection attempt would hang until the
    // 15 s timeout, so an answer within 5 s that names plain http was refused up front.
    let remote = "http://ops:s3cret@192.0.2.1:15672";
    let runs: [&[&str]; 2] = [
        &["topology", "prune", "--config", &path, "--mgmt-url", remote],
        &[
            "topology",
            "apply",
            "payments",
            "--adopt",
            "--tiers",
            "1s",
            "--mgmt-url",
            remote,
        ],
    ];
    for args in runs {
        let started = Instant::now();
        let r = cli(&vh, args).await;
        assert!(started.elapsed() < Duration::from_secs(5), "{r:?}");
        assert_eq!(r.code, EXIT_FAILED, "{r:?}");
        assert!(r.err.contains("plain http refused"), "{r:?}");
        assert!(
            r.err.contains("--allow-plain-http") || r.err.contains("allow-plain-http"),
            "{r:?}"
        );
        assert!(
            !r.err.contains("s3cret") && !r.err.contains("did not answer"),
            "{r:?}"
        );
    }
    // Nothing was declared by the refused adopt.
    assert_eq!(vh.try_depth("payments.parking").await, None);
    // The flag is accepted, and a loopback URL is used with or without it (that it lets a
    // request go to another host is a unit test in topology/mgmt.rs: here it would wait
    // for the 15 s timeout).
    let loopback = vh.broker.mgmt.clone();
    let r = cli(
        &vh,
        &[
            "topology",
            "prune",
            "--config",
            &path,
            "--mgmt-url",
            &loopback,
            "--allow-plain-http",
        ],
    )
    .await;
    assert_eq!(r.code, EXIT_OK, "{r:?}");
    std::fs::remove_file(&file).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topology_apply_adopt_prints_the_policy_then_declares_beside_the_existing_queue() {
    let vh = Broker::from_env().vhost("cli-adopt");
    vh.declare_queue("orders", FieldTable::default()).await;
    let mgmt = vh.broker.mgmt.clone();
    let args = [
        "topology",
        "apply",
        "orders",
        "--adopt",
        "--tiers",
        "1s",
        "--mgmt-url",
        &mgmt,
    ];
    let refused = cli(&vh, &args).await;
    assert_eq!(refused.code, EXIT_FAILED, "{refused:?}");
    assert!(
        refused.err.contains("x-dead-letter-exchange")
            && refused.err.contains(&format!(
                "rabbitmqctl set_policy -p '{}' --apply-to queues",
                vh.name
            )),
        "{refused:?}"
    );
    assert_eq!(
        vh.try_depth("orders.parking").await,
        None,
        "nothing declared"
    );
    let definition = rabbitkit_core::Topology::new("orders").policy_definition();
    let (status, body) = rabbitkit_tests::http(
        &mgmt,
        "PUT",
        &format!("/api/policies/{}/rk-dlx", vh.name),
        Some(&format!(
            r#"{{"pattern":"^orders$","apply-to":"queues","definition":{definition}}}"#
        )),
    );
    assert!(status == 201 || status == 204, "{status} {body}");
    let path = format!("/api/queues/{}/orders", vh.name);
    wait_until(WAIT, "the policy applies", || {
        let (_, q) = rabbitkit_tests::http(&mgmt, "GET", &path, None);
        async move { q.contains(r#""policy":"rk-dlx""#) }
    })
    .await;
    let adopted = cli(&vh, &args).await;
    assert_eq!(adopted.code, EXIT_OK, "{adopted:?}");
    assert!(
        adopted.out.contains("adopted work queue \"orders\""),
        "{adopted:?}"
    );
    assert_eq!(vh.try_depth("orders.parking").await, Some(0));
    assert_eq!(vh.try_depth("orders.delay.1s").await, Some(0));
    let misuse = cli(&vh, &["topology", "check", "orders", "--adopt"]).await;
    assert_eq!(misuse.code, EXIT_USAGE, "{misuse:?}");
}
